"""The prepare step: every collection lands in the tidy layout, with statistics and honest notes."""

from pathlib import Path

import pandas as pd
import pytest

from fedrepro.data.embedded import copy_package_files
from fedrepro.data.prepare import prepare_embedded, prepare_raw

MIRROR = Path(__file__).resolve().parents[3] / "shared" / "data" / "raw"
FATE_SETS = {
    "breast": None,
    "default_credit": None,
    "ionosphere_scale": None,
    "dvisits": None,
    "motor": ["host_1", "host_2"],
    "student": None,
}


def test_embedded_default_prepares_qa_re_and_vertical(tmp_path):
    raw, out = tmp_path / "raw" / "insuranceqa_pkg", tmp_path / "out"
    raw.mkdir(parents=True)
    out.mkdir()
    copy_package_files(raw)
    stats = prepare_embedded(tmp_path / "raw", out, seed=0)
    pairs = pd.read_parquet(out / "qa" / "insuranceqa" / "pairs.parquet")
    assert pairs.groupby("split")["question_id"].nunique().to_dict() == {"train": 12889, "valid": 2000, "test": 2000}
    assert (out / "qa" / "insuranceqa" / "pools.parquet").exists()
    assert "synthetic" in " ".join(stats["notes"]["synthetic-re"])
    assert len(list((out / "vertical" / "digits-halves").glob("party_*.parquet"))) == 2
    assert len(list((out / "vertical" / "digits-quarters").glob("party_*.parquet"))) == 4
    assert stats["skipped"] == []


@pytest.mark.mirror
def test_mirror_prepares_every_available_collection(tmp_path):
    if not MIRROR.is_dir():
        pytest.skip(f"raw-data mirror not found at {MIRROR}")
    qa = ["privacyqa", "bioasq", "fiqa", "insuranceqa", "medquad"]
    re_corpora = ["pgr", "chemprot_cpr5", "chemprot_cpr_groups", "chemprot_scibert", "i2b2"]
    stats = prepare_raw(MIRROR, tmp_path, 0, qa, re_corpora, FATE_SETS, i2b2_dir=None)
    assert sorted(stats["qa"]) == sorted(qa)
    assert sorted(stats["re"]) == ["chemprot_cpr5", "chemprot_cpr_groups", "chemprot_scibert", "pgr"]
    assert len(stats["skipped"]) == 1 and stats["skipped"][0].startswith("i2b2:")
    assert sorted(stats["vertical"]) == sorted([*FATE_SETS, "digits-halves", "digits-quarters"])
    assert len(stats["vertical"]["motor"]) == 3, "guest + host_1 + host_2"
    for name in qa:
        pairs = pd.read_parquet(tmp_path / "qa" / name / "pairs.parquet")
        assert (pairs.groupby("question_id")["split"].nunique() == 1).all()
