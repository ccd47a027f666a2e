"""FedMatch's sanity protocol: the trivial baselines rank the very candidates a model ranks; the per-collection test."""

import pandas as pd
import pytest

from fedrepro.config import parse_params
from fedrepro.fedmatch.sanity import BM25, RANDOM, per_collection, trivial_baselines
from fedrepro.io import write_table
from fedrepro.report.sanity import SanityResult
from test_config import RAW

ANSWERS = {
    "g1": "file the renters claim online today",
    "n1": "renters pay a monthly premium",
    "n2": "a deductible applies to auto",
    "g2": "the annuity pays income for life",
    "n3": "life insurance term",
}


def test_trivial_baselines_score_bm25_and_the_exact_random_order_on_the_valid_candidates(tmp_path):
    rows = [
        ("valid", "q1", "how do i file a renters claim online", "g1", 1),
        ("valid", "q1", "how do i file a renters claim online", "n1", 0),
        ("valid", "q1", "how do i file a renters claim online", "n2", 0),
        ("valid", "q2", "what does an annuity pay", "g2", 1),
        ("valid", "q2", "what does an annuity pay", "n3", 0),
        ("test", "q3", "renters premium", "n1", 1),
        ("test", "q3", "renters premium", "n2", 0),
    ]
    candidates = pd.DataFrame(
        [(s, q, text, a, ANSWERS[a], r) for s, q, text, a, r in rows],
        columns=["split", "question_id", "question", "answer_id", "answer", "relevance"],
    )
    for folder in ("mined/c", "qa/c"):
        (tmp_path / folder).mkdir(parents=True)
    write_table(tmp_path / "mined/c/candidates.parquet", candidates)
    write_table(
        tmp_path / "qa/c/pool.parquet", pd.DataFrame({"answer_id": list(ANSWERS), "answer": list(ANSWERS.values())})
    )
    scores = trivial_baselines(tmp_path / "mined", tmp_path / "qa", parse_params(RAW))
    assert scores[BM25] == {"c": 1.0}  # each gold shares the most terms with its question (test split ignored)
    assert scores[RANDOM]["c"] == pytest.approx(((1 + 1 / 2 + 1 / 3) / 3 + (1 + 1 / 2) / 2) / 2)


def test_per_collection_test_is_at_the_chosen_setting_and_round():
    sweep = pd.DataFrame(
        [
            {"lr": 1e-4, "round": 1, "train_loss": 0.9, "valid": 0.40, "valid a": 0.45, "valid b": 0.35},
            {"lr": 1e-4, "round": 2, "train_loss": 0.7, "valid": 0.50, "valid a": 0.60, "valid b": 0.40},
            {"lr": 5e-4, "round": 1, "train_loss": 0.9, "valid": 0.55, "valid a": 0.70, "valid b": 0.40},
            {"lr": 5e-4, "round": 2, "train_loss": 1.2, "valid": 0.60, "valid a": 0.80, "valid b": 0.40},  # diverged
        ]
    )
    baselines = {BM25: {"a": 0.50, "b": 0.30}, RANDOM: {"a": 0.2, "b": 0.39}}  # on b random beats BM25
    result = SanityResult("FedMatch", "MAP", 0.02, sweep, ["lr"], {name: 0.0 for name in baselines})
    table = per_collection(result, baselines).set_index("collection")
    assert result.choice()["lr"] == 1e-4 and result.choice()["round"] == 2  # the diverged lr is never chosen
    assert table.loc["a", "pooled reference"] == 0.60 and bool(table.loc["a", "passed"])
    assert table.loc["b", "margin over the better"] == pytest.approx(0.01) and not bool(table.loc["b", "passed"])
