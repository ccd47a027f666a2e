"""The tidy tables every loader produces, whatever the source collection.

QA collections (FedMatch):
  pairs      one row per (question, gold answer): QA_PAIR_COLUMNS
  answers    every answer text of the collection (gold or not): ANSWER_COLUMNS; the BM25 pool
  pools      optional official candidate pools for evaluation: POOL_COLUMNS
Relation extraction (FedCMC): one row per sentence with entity markers: RE_COLUMNS
Vertical FL (SS-VFNAS): one frame per party, rows aligned on ``sample_id``; the label party also
holds ``label``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedrepro.errors import DataError

SPLITS = ("train", "valid", "test")

QA_PAIR_COLUMNS = ("question_id", "question", "answer_id", "answer", "split", "domain")
ANSWER_COLUMNS = ("answer_id", "answer")
POOL_COLUMNS = ("question_id", "answer_id")
RE_COLUMNS = ("sentence_id", "text", "label", "split")
E1_OPEN, E1_CLOSE, E2_OPEN, E2_CLOSE = "<e1>", "</e1>", "<e2>", "</e2>"
ENTITY_MARKERS = (E1_OPEN, E1_CLOSE, E2_OPEN, E2_CLOSE)


def check_columns(frame: pd.DataFrame, required: tuple[str, ...], where: str) -> pd.DataFrame:
    """Fail with a message naming the table and the missing columns; return the columns in order."""
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise DataError(f"{where}: missing column(s) {missing}; expected {list(required)}")
    return frame.loc[:, list(required)]


def check_qa_pairs(pairs: pd.DataFrame, where: str) -> pd.DataFrame:
    """Validate a pairs table: schema, known splits, non-empty text, no question in two splits."""
    pairs = check_columns(pairs, QA_PAIR_COLUMNS, where)
    bad_split = sorted(set(pairs["split"]) - set(SPLITS))
    if bad_split:
        raise DataError(f"{where}: field 'split' has {bad_split}; allowed {list(SPLITS)}")
    for column in ("question", "answer"):
        empty = pairs[column].isna() | (pairs[column].astype(str).str.strip() == "")
        if empty.any():
            example = pairs.loc[empty, "question_id"].iloc[0]
            raise DataError(
                f"{where}: field '{column}' is empty for {int(empty.sum())} row(s), e.g. question_id={example}"
            )
    splits_per_question = pairs.groupby("question_id")["split"].nunique()
    leaked = splits_per_question[splits_per_question > 1]
    if len(leaked):
        raise DataError(f"{where}: {len(leaked)} question(s) appear in more than one split, e.g. {leaked.index[0]}")
    return pairs.reset_index(drop=True)


def check_re_table(table: pd.DataFrame, where: str) -> pd.DataFrame:
    """Validate a relation-extraction table: schema and both entity markers in every sentence."""
    table = check_columns(table, RE_COLUMNS, where)
    for marker in ENTITY_MARKERS:
        missing = ~table["text"].str.contains(marker, regex=False)
        if missing.any():
            example = table.loc[missing, "sentence_id"].iloc[0]
            raise DataError(
                f"{where}: {int(missing.sum())} sentence(s) lack the marker {marker}, e.g. sentence_id={example}"
            )
    return table.reset_index(drop=True)


def normalise_space(text: str) -> str:
    """Collapse runs of whitespace (InsuranceQA questions carry doubled spaces)."""
    return " ".join(str(text).split())


def bm25_tokens(text: str) -> list[str]:
    """The paper's preprocessing for BM25: whitespace tokenisation and lower-casing."""
    return str(text).lower().split()


def need_file(path: Path) -> Path:
    """A raw file a loader cannot do without: its absence names the file and how each kind of file gets there."""
    if not path.is_file():
        raise DataError(
            f"missing raw file {path}: a public one comes with acquire (data.source); one of your own must be "
            "under data.mirror and declared in data.own_files as `<path under the mirror>: <sha256>`"
        )
    return path
