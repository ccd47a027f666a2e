"""Per-client training triples and evaluation candidates from BM25, as in FedMatch.

Training negatives come from the answers of the client's own training questions (no evaluation answer is
ever shown to training); evaluation candidates are a question's gold answers plus the top-N non-gold BM25
hits from the client's whole answer pool. "Non-gold" also excludes ``same_text_gold``: answers that are gold for
another question with the same text (``fedrepro.data.partition.same_text_gold``), which answer this one too.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedrepro.retrieval.bm25 import score_candidates, top_non_gold
from fedrepro.seeding import derive_seed
from fedrepro.tasks.qa import CANDIDATE_COLUMNS, TRIPLE_COLUMNS


def _questions_and_gold(
    pairs: pd.DataFrame, same_text_gold: pd.DataFrame | None
) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Question texts, and per question the answers never to mine as negatives: its gold and its same-text gold."""
    questions = dict(zip(pairs["question_id"], pairs["question"]))
    gold = pairs.groupby("question_id")["answer_id"].agg(set).to_dict()
    if same_text_gold is not None:
        for qid, aid in zip(same_text_gold["question_id"], same_text_gold["answer_id"]):
            if qid in gold:
                gold[qid].add(aid)
    return questions, gold


def training_triples(
    pairs: pd.DataFrame,
    pool: pd.DataFrame,
    k: int,
    backend: str,
    same_text_gold: pd.DataFrame | None = None,
    **index_opts,
) -> pd.DataFrame:
    """One (question, gold answer, negative) triple per gold answer and each of the top-k non-gold hits."""
    train = pairs[pairs["split"] == "train"]
    if train.empty:
        return pd.DataFrame(columns=list(TRIPLE_COLUMNS))
    questions, gold = _questions_and_gold(train, same_text_gold)
    hits = top_non_gold(questions, gold, pool, k, backend, **index_opts)
    text = dict(zip(pool["answer_id"], pool["answer"]))
    merged = train.merge(
        hits[["question_id", "answer_id", "rank"]].rename(columns={"answer_id": "negative_id"}), on="question_id"
    )
    merged = merged.sort_values(["question_id", "answer_id", "rank"]).reset_index(drop=True)
    return pd.DataFrame(
        {
            "question_id": merged["question_id"],
            "question": merged["question"],
            "positive_id": merged["answer_id"],
            "positive": merged["answer"],
            "negative_id": merged["negative_id"],
            "negative": merged["negative_id"].map(text),
        }
    )


def evaluation_candidates(
    pairs: pd.DataFrame,
    pool: pd.DataFrame,
    n: int,
    backend: str,
    same_text_gold: pd.DataFrame | None = None,
    **index_opts,
) -> pd.DataFrame:
    """Gold answers (relevance 1) plus the top-n non-gold BM25 hits (relevance 0) for every valid/test question."""
    frames = []
    text = dict(zip(pool["answer_id"], pool["answer"]))
    for split in ("valid", "test"):
        rows = pairs[pairs["split"] == split]
        if rows.empty:
            continue
        questions, gold = _questions_and_gold(rows, same_text_gold)
        hits = top_non_gold(questions, gold, pool, n, backend, **index_opts)
        golds = rows.assign(relevance=1)[
            ["question_id", "question", "answer_id", "answer", "relevance"]
        ].drop_duplicates(["question_id", "answer_id"])
        negatives = hits.assign(
            question=hits["question_id"].map(questions), answer=hits["answer_id"].map(text), relevance=0
        )
        frame = pd.concat([golds, negatives[["question_id", "question", "answer_id", "answer", "relevance"]]])
        frames.append(frame.assign(split=split))
    if not frames:
        return pd.DataFrame(columns=list(CANDIDATE_COLUMNS))
    result = pd.concat(frames)[list(CANDIDATE_COLUMNS)]
    return result.sort_values(
        ["split", "question_id", "relevance", "answer_id"], ascending=[True, True, False, True]
    ).reset_index(drop=True)


def official_candidates(
    pairs: pd.DataFrame, pools: pd.DataFrame, same_text_gold: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Gold answers plus the collection's own candidate pool (``pools``: question_id, answer_id, answer), e.g.
    InsuranceQA's, for every valid/test question; a pooled answer that is same-text gold is left out."""
    evaluation = pairs[pairs["split"] != "train"]
    questions = evaluation.drop_duplicates("question_id").set_index("question_id")
    golds = evaluation[["question_id", "answer_id", "answer"]].drop_duplicates(["question_id", "answer_id"])
    pooled = pools[pools["question_id"].isin(questions.index)]
    if same_text_gold is not None:
        excluded = pd.MultiIndex.from_frame(same_text_gold[["question_id", "answer_id"]])
        pooled = pooled[~pd.MultiIndex.from_frame(pooled[["question_id", "answer_id"]]).isin(excluded)]
    frame = pd.concat([golds.assign(relevance=1), pooled.assign(relevance=0)]).drop_duplicates(
        ["question_id", "answer_id"]
    )
    frame = frame.assign(
        split=frame["question_id"].map(questions["split"]), question=frame["question_id"].map(questions["question"])
    )
    return (
        frame[list(CANDIDATE_COLUMNS)]
        .sort_values(["split", "question_id", "relevance", "answer_id"], ascending=[True, True, False, True])
        .reset_index(drop=True)
    )


def bm25_ranking(candidates: pd.DataFrame, pool: pd.DataFrame, backend: str, **index_opts) -> pd.DataFrame:
    """Every evaluation candidate's BM25 score (split, question_id, answer_id, relevance, score) over the client's
    answer pool, with the mining's index and settings: for BM25-mined candidates the very ranking that picked the
    negatives, kept so a report can score BM25 alone on the candidates the methods rank."""
    scored = score_candidates(candidates, pool, backend, **index_opts)
    return scored[["split", "question_id", "answer_id", "relevance", "score"]].reset_index(drop=True)


def cap_triples(triples: pd.DataFrame, cap: int, client: str) -> pd.DataFrame:
    """A seeded sample of at most ``cap`` training triples (0 = all), in their original order: a per-client
    budget on training work that, unlike a cap on questions, also bounds collections with many gold answers."""
    if cap == 0 or len(triples) <= cap:
        return triples
    rng = np.random.default_rng(derive_seed("cap_triples", client))
    keep = np.sort(rng.choice(len(triples), size=cap, replace=False))
    return triples.iloc[keep].reset_index(drop=True)
