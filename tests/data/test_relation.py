"""Relation loaders on small invented files in each source format, the synthetic default (splits: test_label_skew)."""

import json
from pathlib import Path

import pytest

from fedrepro.data.relation import load_chemprot, load_i2b2, load_pgr, re_statistics, synthetic_relations
from fedrepro.errors import DataError

MIRROR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "raw"
HEADER = (
    "FILE_ID\tSENTENCE\tGENE\tPHENOTYPE\tGENE_ID\tPHENOTYPE_ID\tGENE_START_POSITION\tGENE_END_POSITION\t"
    "PHENOTYPE_START_POSITION\tPHENOTYPE_END_POSITION\tRELATION"
)


def pgr_row(doc, sentence, gene, pheno, label, gene_at=None):
    g = sentence.index(gene) if gene_at is None else gene_at
    p = sentence.index(pheno)
    return f"{doc}\t{sentence}\t{gene}\t{pheno}\t1\tHP_1\t{g}\t{g + len(gene)}\t{p}\t{p + len(pheno)}\t{label}"


def test_pgr_fixture(tmp_path):
    base = tmp_path / "pgr" / "10_12_2018_corpus"
    base.mkdir(parents=True)
    train = [
        pgr_row(
            f"d{i}", f"Loss of ZORB{i} causes blue toes in mice.", f"ZORB{i}", "blue toes", "True" if i % 2 else "False"
        )
        for i in range(20)
    ]
    train.append(pgr_row("d99", "Variants of QUUX relate to hair loss.", "QUUX", "hair loss", "False", gene_at=3))
    (base / "train.tsv").write_text("\n".join([HEADER, *train]) + "\n", encoding="utf-8")
    test = [
        pgr_row("t1", "PLIM mutations cause fever.", "PLIM", "fever", "TRUE") + "\tC",
        pgr_row("t2", "fever was not linked to PLIM.", "PLIM", "fever", "false") + "\tI",
    ]
    (base / "test.tsv").write_text("\n".join([HEADER + "\tCONFIRMATION", *test]) + "\n", encoding="utf-8")
    corpus = load_pgr(tmp_path)
    table = corpus.table
    assert corpus.classes == ["false", "true"]
    assert len(table) == 23 and set(table["split"]) == {"train", "valid", "test"}
    assert table.loc[table["split"] == "test", "text"].iloc[1] == "<e2> fever </e2> was not linked to <e1> PLIM </e1>."
    assert "<e1> QUUX </e1>" in " ".join(table["text"])  # wrong offset repaired from the entity text
    assert any("valid" in n for n in corpus.notes)
    stats = re_statistics(corpus).set_index("split")
    assert stats.loc["test", "sentences"] == 2 and stats["sentences"].sum() == 23


def test_chemprot_cpr_fixture(tmp_path):
    base = tmp_path / "chemprot" / "cpr_groups_att-chemprot"
    base.mkdir(parents=True)
    lines = [
        "CPR:4\tCHEMICAL\tGENE-Y\t4\t0\tgene is blocked by chemical .\tT2\tT1\t111",
        "NA\tCHEMICAL\tGENE-N\t0\t3\tchemical binds to gene weakly .\tT1\tT2\t222",
    ]
    for name in ("training.txt", "development.txt", "test.txt"):
        (base / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = load_chemprot(tmp_path, "cpr_groups")
    assert corpus.classes == ["CPR:4", "NA"] and len(corpus.table) == 6
    assert corpus.table["text"].iloc[0] == "<e2> gene </e2> is blocked by <e1> chemical </e1> ."
    with pytest.raises(DataError, match="version"):
        load_chemprot(tmp_path, "original")


def test_chemprot_scibert_types_from_aligned_sentence(tmp_path):
    cpr = tmp_path / "chemprot" / "cpr_groups_att-chemprot"
    sci = tmp_path / "chemprot" / "scibert"
    cpr.mkdir(parents=True)
    sci.mkdir(parents=True)
    anon = [
        "CPR:4\tCHEMICAL\tGENE-Y\t5\t0\tgene activity was reduced by chemical in zebrafish .\tT2\tT1\t1",
        "CPR:3\tCHEMICAL\tGENE-Y\t0\t4\tchemical strongly upregulated the gene receptor .\tT1\tT2\t2",
    ]
    sents = [
        {
            "text": "<< Florbin kinase >> activity was reduced by [[ tazomide ]] in zebrafish.",
            "label": "INHIBITOR",
            "metadata": [],
        },
        {
            "text": "<< Quelamine >> strongly upregulated the [[ VEX1 ]] receptor.",
            "label": "UPREGULATOR",
            "metadata": [],
        },
    ]
    for c, s in (("training.txt", "train.txt"), ("development.txt", "dev.txt"), ("test.txt", "test.txt")):
        (cpr / c).write_text("\n".join(anon) + "\n", encoding="utf-8")
        (sci / s).write_text("\n".join(json.dumps(x) for x in sents) + "\n", encoding="utf-8")
    corpus = load_chemprot(tmp_path, "scibert")
    texts = corpus.table["text"].tolist()
    assert texts[0] == "<e2> Florbin kinase </e2> activity was reduced by <e1> tazomide </e1> in zebrafish."
    assert texts[1] == "<e1> Quelamine </e1> strongly upregulated the <e2> VEX1 </e2> receptor."
    assert corpus.classes == ["INHIBITOR", "UPREGULATOR"]
    grouped = load_chemprot(tmp_path, "cpr5")
    assert grouped.classes == ["CPR:3", "CPR:4"] and grouped.table["text"].tolist()[:2] == texts[:2]
    assert grouped.table["label"].tolist()[:2] == ["CPR:4", "CPR:3"]
    sents[1]["label"] = "BINDS-TO"
    (sci / "test.txt").write_text("\n".join(json.dumps(x) for x in sents) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"scibert: field 'label' has \['BINDS-TO'\]"):
        load_chemprot(tmp_path, "cpr5")


def write_i2b2(folder: Path, name: str, lines: list[str], rels: list[str]):
    (folder / "txt").mkdir(parents=True, exist_ok=True)
    (folder / "rel").mkdir(parents=True, exist_ok=True)
    (folder / "txt" / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "rel" / f"{name}.rel").write_text("\n".join(rels) + "\n", encoding="utf-8")


def test_i2b2_fixture(tmp_path):
    lines = ["admission date :", "patient took zumorol for knee ache and it worsened the knee ache ."]
    rels = [
        'c="zumorol" 2:2 2:2||r="TrAP"||c="knee ache" 2:4 2:5',
        'c="zumorol" 2:2 2:2||r="TrWP"||c="knee ache" 2:10 2:11',
    ]
    for i in range(10):
        write_i2b2(tmp_path / "train", f"note{i}", lines, rels)
    write_i2b2(tmp_path / "test", "note_t", lines, rels[:1])
    corpus = load_i2b2(tmp_path)
    table = corpus.table
    assert len(table) == 21 and corpus.classes == ["TrAP", "TrWP"]
    assert set(table["split"]) == {"train", "valid", "test"}
    first = table[table["split"] == "test"]["text"].iloc[0]
    assert first == "patient took <e1> zumorol </e1> for <e2> knee ache </e2> and it worsened the knee ache ."
    with pytest.raises(DataError, match="not found"):
        load_i2b2(tmp_path / "absent")


def test_synthetic_deterministic_skewed_and_learnable():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    a = synthetic_relations(2000, 5, seed=3)
    b = synthetic_relations(2000, 5, seed=3)
    assert a.table.equals(b.table) and a.name == "synthetic-re"
    assert not a.table.equals(synthetic_relations(2000, 5, seed=4).table)
    counts = a.table["label"].value_counts()
    assert counts.iloc[0] > 3 * counts.iloc[-1]
    train, test = a.table[a.table["split"] == "train"], a.table[a.table["split"] != "train"]
    vec = TfidfVectorizer()
    model = LogisticRegression(max_iter=1000).fit(vec.fit_transform(train["text"]), train["label"])
    accuracy = (model.predict(vec.transform(test["text"])) == test["label"]).mean()
    majority = (test["label"] == counts.index[0]).mean()
    assert accuracy > majority + 0.2 and accuracy < 0.99


# ----------------------------------------------------------------------------- the raw-data mirror


def need_mirror(sub: str) -> Path:
    if not (MIRROR / sub).is_dir():
        pytest.skip(f"raw-data mirror not found at {MIRROR / sub}")
    return MIRROR


@pytest.mark.mirror
def test_mirror_pgr():
    corpus = load_pgr(need_mirror("pgr"))
    stats = re_statistics(corpus).set_index("split")
    assert stats.loc["train", "sentences"] + stats.loc["valid", "sentences"] == 4083 - 2  # 2 source rows broken
    assert stats.loc["test", "sentences"] == 219
    assert stats.loc["test", "true"] == 77 and stats.loc["test", "false"] == 142


@pytest.mark.mirror
def test_mirror_chemprot_cpr_groups():
    corpus = load_chemprot(need_mirror("chemprot"), "cpr_groups")
    stats = re_statistics(corpus).set_index("split")
    assert [n for n in corpus.notes if "candidate pairs" in n] == [
        "training.txt: 15492 candidate pairs",
        "development.txt: 9530 candidate pairs",
        "test.txt: 13084 candidate pairs",
    ]
    dropped = int(corpus.notes[-1].split("; ")[1].split()[0])
    assert stats["sentences"].sum() + dropped == 15492 + 9530 + 13084 and dropped < 300
    assert stats["CPR:4"].tolist() == [2041, 989, 1510] and stats["CPR:6"].tolist() == [212, 184, 270]


@pytest.mark.mirror
def test_mirror_chemprot_scibert():
    corpus = load_chemprot(need_mirror("chemprot"), "scibert")
    stats = re_statistics(corpus).set_index("split")
    assert stats["sentences"].tolist() == [4169, 2427, 3469] and len(corpus.classes) == 13
    assert stats["INHIBITOR"].tolist() == [1642, 812, 1255]


@pytest.mark.mirror
def test_mirror_chemprot_cpr5_is_the_papers_five_groups():
    corpus = load_chemprot(need_mirror("chemprot"), "cpr5")
    stats = re_statistics(corpus).set_index("split")
    assert corpus.classes == ["CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9"]
    assert stats["sentences"].tolist() == [4169, 2427, 3469]  # the paper: 10,307 sentences in all
    assert stats["CPR:4"].tolist() == [1642 + 131 + 487, 812 + 21 + 270, 1255 + 72 + 340]


@pytest.mark.mirror
def test_mirror_chemprot_scibert_is_the_same_whatever_the_hash_seed():
    """Argument typing once depended on the hash order of a set of tokens (PYTHONHASHSEED): 132 sentences flipped."""
    import os
    import subprocess
    import sys

    mirror = need_mirror("chemprot")
    script = (
        "import hashlib; from pathlib import Path; from fedrepro.data.relation import load_chemprot; "
        f"corpus = load_chemprot(Path({str(mirror)!r}), 'scibert'); "
        "print(hashlib.sha256(corpus.table.to_csv(index=False).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(digests) == 1, digests
