"""Carving QA clients out of prepared collections, with caps that keep the real size skew between clients."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.data.schema import normalise_space
from fedrepro.errors import DataError
from fedrepro.io import read_table, write_table
from fedrepro.seeding import derive_seed


def skew_preserving_caps(
    train_sizes: dict[str, int], largest: int, smallest: int, named: dict[str, int] | None = None
) -> dict[str, int]:
    """Scale every client's train-question count so the largest has ``largest`` and the ratios stay the same.

    ``largest == 0`` keeps everything; no client is cut below ``smallest`` (or its full size if smaller). A client in
    ``named`` keeps its own number instead (0 = all, never more than it has): a collection the scaled caps starve of
    the data it needs (FiQA at CPU scale, reports/cpu/fedmatch/sanity-fiqa-alone).
    """
    top = max(train_sizes.values())
    factor = 1.0 if largest == 0 else min(1.0, largest / top)
    caps = {c: min(n, max(smallest, math.ceil(n * factor))) for c, n in train_sizes.items()}
    caps.update({c: min(n or train_sizes[c], train_sizes[c]) for c, n in (named or {}).items() if c in caps})
    return caps


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


def same_text_gold(capped: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """(question_id, answer_id) for every kept question and each answer that is gold for another question of ``pairs``
    (the uncapped client) with the same text up to case and whitespace.

    Such an answer answers the kept question too: MedQuAD asks one question in several sources, each with its own
    answer (1,405 question texts under 3,457 ids). Mining must not use it as a negative or a non-relevant candidate,
    and only this stage still sees the twins that the caps drop.
    """

    def texts(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(text=frame["question"].str.lower().map(normalise_space))

    kept = texts(capped.drop_duplicates("question_id")[["question_id", "question"]])
    twins = kept.merge(texts(pairs[["question_id", "question", "answer_id"]]), on="text", suffixes=("", "_twin"))
    twins = twins[twins["question_id"] != twins["question_id_twin"]]
    return (
        twins[["question_id", "answer_id"]]
        .drop_duplicates()
        .sort_values(["question_id", "answer_id"])
        .reset_index(drop=True)
    )


@dataclass
class QAClient:
    """One client's uncapped tables: its pairs, its answer pool, the collection's official candidate pools
    (or None) and the collection's answer texts (official pools may point anywhere in the collection)."""

    pairs: pd.DataFrame
    pool: pd.DataFrame
    official_pools: pd.DataFrame | None
    collection_answers: pd.DataFrame


def read_collection(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    pools = read_table(folder / "pools.parquet") if (folder / "pools.parquet").exists() else None
    return read_table(folder / "pairs.parquet"), read_table(folder / "answers.parquet"), pools


def clients_by_collection(prepared: Path, collections: list[str]) -> dict[str, QAClient]:
    """FedQA: each collection is one client, its pool is every answer of the collection."""
    clients = {}
    for name in collections:
        pairs, answers, pools = read_collection(prepared / name)
        clients[name] = QAClient(pairs, answers, pools, answers)
    return clients


def clients_by_domain(prepared: Path, collection: str, domains: list[str]) -> dict[str, QAClient]:
    """One client per domain of one collection; its pool is every answer that is gold for one of its questions."""
    pairs, answers, pools = read_collection(prepared / collection)
    clients = {}
    for domain in domains:
        own = pairs[pairs["domain"] == domain]
        if own.empty:
            raise DataError(
                f"params: partition.embedded_domains has {domain!r}, not a domain of {collection}; "
                f"allowed {sorted(pairs['domain'].unique())}"
            )
        clients[domain] = QAClient(own, answers[answers["answer_id"].isin(set(own["answer_id"]))], pools, answers)
    return clients


def write_clients(
    clients: dict[str, QAClient],
    out: Path,
    largest: int,
    smallest: int,
    eval_questions: int,
    seed: int,
    named: dict[str, int] | None = None,
) -> dict:
    """Cap every client (keeping the size skew; ``named`` clients to their own number of train questions, 0 = all)
    and write its tables under ``out/qa/<client>/``; return a summary."""
    train_sizes = {
        c: client.pairs.loc[client.pairs["split"] == "train", "question_id"].nunique() for c, client in clients.items()
    }
    caps = skew_preserving_caps(train_sizes, largest, smallest, named)
    summary = {}
    for name, client in clients.items():
        capped = cap_client(client.pairs, caps[name], eval_questions, seed, name)
        folder = out / "qa" / name
        folder.mkdir(parents=True)
        write_table(folder / "pairs.parquet", capped)
        write_table(folder / "pool.parquet", client.pool.reset_index(drop=True))
        write_table(folder / "train_pool.parquet", training_pool(client.pairs, client.pool))
        write_table(folder / "same_text_gold.parquet", same_text_gold(capped, client.pairs))
        if client.official_pools is not None:
            evaluated = set(capped.loc[capped["split"] != "train", "question_id"])
            pooled = client.official_pools[client.official_pools["question_id"].isin(evaluated)]
            write_table(folder / "official_pools.parquet", pooled.merge(client.collection_answers, on="answer_id"))
        summary[name] = {
            "train_questions_available": int(train_sizes[name]),
            "questions": capped.groupby("split")["question_id"].nunique().to_dict(),
            "answer_pool": len(client.pool),
        }
    return {"caps": caps, "clients": summary}
