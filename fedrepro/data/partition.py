"""Carving QA clients out of prepared collections, with caps that keep the real size skew between clients."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fedrepro.seeding import derive_seed


def skew_preserving_caps(train_sizes: dict[str, int], largest: int, smallest: int) -> dict[str, int]:
    """Scale every client's train-question count so the largest has ``largest`` and the ratios stay the same.

    ``largest == 0`` keeps everything; no client is cut below ``smallest`` (or its full size if smaller).
    """
    if largest == 0:
        return dict(train_sizes)
    top = max(train_sizes.values())
    factor = min(1.0, largest / top)
    return {c: min(n, max(smallest, math.ceil(n * factor))) for c, n in train_sizes.items()}


def sample_questions(pairs: pd.DataFrame, split: str, count: int, seed: int, client: str) -> pd.DataFrame:
    """Seeded choice of ``count`` questions of ``split`` (all of them if count is 0 or larger)."""
    rows = pairs[pairs["split"] == split]
    questions = np.array(sorted(rows["question_id"].unique()))
    if count == 0 or count >= len(questions):
        return rows
    rng = np.random.default_rng(derive_seed(seed, "cap", client, split))
    keep = set(rng.choice(questions, size=count, replace=False))
    return rows[rows["question_id"].isin(keep)]


def cap_client(pairs: pd.DataFrame, train_questions: int, eval_questions: int, seed: int, client: str) -> pd.DataFrame:
    """A client's pairs with its train split cut to ``train_questions`` and valid/test to ``eval_questions`` each."""
    parts = [sample_questions(pairs, "train", train_questions, seed, client)]
    parts += [sample_questions(pairs, split, eval_questions, seed, client) for split in ("valid", "test")]
    return pd.concat(parts).sort_values(["split", "question_id", "answer_id"]).reset_index(drop=True)


def training_pool(pairs: pd.DataFrame, pool: pd.DataFrame) -> pd.DataFrame:
    """The answer pool with every answer that is gold only for valid/test questions removed (no eval leakage)."""
    train_gold = set(pairs.loc[pairs["split"] == "train", "answer_id"])
    eval_only = set(pairs.loc[pairs["split"] != "train", "answer_id"]) - train_gold
    return pool[~pool["answer_id"].isin(eval_only)].reset_index(drop=True)
