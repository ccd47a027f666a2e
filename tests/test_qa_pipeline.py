"""FedMatch's data path: skew-preserving caps, leakage-free pools, mined triples and candidates, the hinge loss."""

import pandas as pd
import pytest
import torch

from fedrepro.data.partition import (
    QAClient,
    cap_client,
    same_text_gold,
    skew_preserving_caps,
    training_pool,
    write_clients,
)
from fedrepro.io import read_table
from fedrepro.retrieval.bm25 import top_non_gold
from fedrepro.retrieval.mining import bm25_ranking, evaluation_candidates, official_candidates, training_triples
from fedrepro.tasks.qa import qrels_and_run

WORDS = "premium policy claim deductible annuity renters auto life coverage term whole beneficiary rider".split()


class FixedScorer(torch.nn.Module):
    """A scoring model whose scores a test fixes in ``forward``. It holds one empty parameter, as a trained model
    holds its weights: the task sends each batch to the device of its model's parameters (``fedrepro.device``)."""

    def __init__(self):
        super().__init__()
        self.placement = torch.nn.Parameter(torch.zeros(0))


def toy_pairs():
    rows = []
    for i in range(12):
        split = "train" if i < 8 else ("valid" if i < 10 else "test")
        question = f"what is a {WORDS[i]} {WORDS[(i + 1) % 13]}"
        rows.append((f"q{i}", question, f"a{i}", f"a {WORDS[i]} is explained here {WORDS[(i + 1) % 13]}", split, "d"))
    return pd.DataFrame(rows, columns=["question_id", "question", "answer_id", "answer", "split", "domain"])


def pool_of(pairs):
    extra = pd.DataFrame({"answer_id": [f"x{i}" for i in range(6)], "answer": [f"{w} {w} details" for w in WORDS[:6]]})
    return pd.concat([pairs[["answer_id", "answer"]], extra], ignore_index=True)


def test_caps_keep_the_size_skew():
    caps = skew_preserving_caps({"big": 3328, "mid": 800, "small": 107}, largest=40, smallest=5)
    assert caps == {"big": 40, "mid": 10, "small": 5}
    assert skew_preserving_caps({"a": 10, "b": 3}, largest=0, smallest=1) == {"a": 10, "b": 3}


def test_a_named_client_keeps_its_own_cap_and_the_others_keep_the_skew():
    sizes = {"big": 3328, "mid": 800, "small": 107}
    assert skew_preserving_caps(sizes, largest=40, smallest=5, named={"small": 60}) == {
        "big": 40,
        "mid": 10,
        "small": 60,
    }
    assert skew_preserving_caps(sizes, largest=40, smallest=5, named={"small": 0, "mid": 5000}) == {
        "big": 40,
        "mid": 800,
        "small": 107,
    }, "0 = all it has, and never more than it has"


def test_capping_is_seeded_and_per_split():
    pairs = toy_pairs()
    first = cap_client(pairs, 3, 1, seed=0, client="c")
    assert first.groupby("split")["question_id"].nunique().to_dict() == {"test": 1, "train": 3, "valid": 1}
    assert first.equals(cap_client(pairs, 3, 1, seed=0, client="c"))


def test_training_pool_drops_answers_gold_only_for_evaluation():
    pairs = toy_pairs()
    pool = training_pool(pairs, pool_of(pairs))
    assert not set(pool["answer_id"]) & {"a8", "a9", "a10", "a11"}
    assert {"a0", "x0"} <= set(pool["answer_id"])


def test_triples_never_use_a_gold_answer_as_negative():
    pairs = toy_pairs()
    triples = training_triples(pairs, training_pool(pairs, pool_of(pairs)), k=3, backend="bm25s")
    assert len(triples) > 0 and set(triples["question_id"]) <= {f"q{i}" for i in range(8)}
    gold = dict(zip(pairs["question_id"], pairs["answer_id"]))
    assert all(row.negative_id != gold[row.question_id] for row in triples.itertuples())
    assert (triples.groupby("question_id").size() <= 3).all()


def test_candidates_hold_every_gold_answer_plus_bm25_negatives():
    pairs = toy_pairs()
    candidates = evaluation_candidates(pairs, pool_of(pairs), n=4, backend="bm25s")
    assert set(candidates["split"]) == {"valid", "test"}
    relevant = candidates[candidates.relevance == 1]
    assert sorted(relevant["question_id"]) == ["q10", "q11", "q8", "q9"]
    assert (candidates.groupby("question_id").size() <= 5).all()


def test_bm25_ranking_keeps_the_scores_that_picked_the_negatives_and_scores_the_golds():
    pairs, pool = toy_pairs(), pool_of(toy_pairs())
    candidates = evaluation_candidates(pairs, pool, n=4, backend="bm25s")
    ranking = bm25_ranking(candidates, pool, "bm25s")
    assert list(ranking.columns) == ["split", "question_id", "answer_id", "relevance", "score"]
    assert ranking[["split", "question_id", "answer_id", "relevance"]].equals(
        candidates[["split", "question_id", "answer_id", "relevance"]]
    )
    test = pairs[pairs.split == "test"]
    hits = top_non_gold(
        dict(zip(test.question_id, test.question)), {q: {a} for q, a in zip(test.question_id, test.answer_id)}, pool, 4
    )
    negatives = ranking[(ranking.split == "test") & (ranking.relevance == 0)]
    assert dict(zip(zip(negatives.question_id, negatives.answer_id), negatives.score)) == dict(
        zip(zip(hits.question_id, hits.answer_id), hits.score)
    )
    golds = ranking[ranking.relevance == 1]
    assert (golds.score > 0).all()  # each gold shares its question's words


def test_qrels_and_run_from_scored_candidates():
    scored = pd.DataFrame(
        {"question_id": ["q", "q", "r"], "answer_id": ["a", "b", "c"], "relevance": [1, 0, 0], "score": [0.2, 0.9, 0.1]}
    )
    qrels, run = qrels_and_run(scored)
    assert qrels == {"q": {"a": 1}} and run == {"q": {"a": 0.2, "b": 0.9}, "r": {"c": 0.1}}


def test_hinge_loss_of_the_task():
    from fedrepro.tasks.qa import QAMatchingTask

    class FixedScores(FixedScorer):
        def forward(self, **batch):
            return batch["input_ids"][:, 0].float(), None

    task = QAMatchingTask.__new__(QAMatchingTask)
    task.loss = "hinge"
    batch = {"input_ids": torch.tensor([[3], [0], [1], [0]])}  # positives score 3, 0; negatives score 1, 0
    loss = task.forward(FixedScores(), batch).loss
    assert loss.item() == pytest.approx((max(0, 1 - 3 + 1) + max(0, 1 - 0 + 0)) / 2)
    task.loss = "cross_entropy"  # the released code's objective: positives labelled 1, negatives 0
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.tensor([3.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 1.0, 0.0, 0.0])
    )
    assert task.forward(FixedScores(), batch).loss.item() == pytest.approx(expected.item())


def test_official_pool_candidates_add_every_gold_answer():
    pairs = toy_pairs()
    pools = pd.DataFrame(
        {
            "question_id": ["q8", "q8", "q9", "q1"],
            "answer_id": ["x0", "a8", "x1", "x2"],
            "answer": ["pool zero", "gold eight", "pool one", "train pool"],
        }
    )
    candidates = official_candidates(pairs, pools)
    assert set(candidates["question_id"]) == {"q8", "q9", "q10", "q11"}, "train questions are not evaluated"
    q8 = candidates[candidates.question_id == "q8"].set_index("answer_id")["relevance"].to_dict()
    assert q8 == {"a8": 1, "x0": 0}


def test_a_same_text_questions_gold_is_never_a_negative(tmp_path):
    # MedQuAD asks one question in several sources: a twin's gold answers the question too, even when the caps drop the
    # twin
    pairs = toy_pairs()
    q0, q8 = pairs.set_index("question_id").loc[["q0", "q8"], "question"]
    twins = pd.DataFrame(
        [("t0", q0.upper(), "ta0", f"{q0} {q0}", "train", "d"), ("t8", f"  {q8} ", "ta8", f"{q8} {q8}", "train", "d")],
        columns=pairs.columns,
    )
    collection = pd.concat([pairs, twins], ignore_index=True)
    table = same_text_gold(pairs, collection)  # the twins were capped away
    assert set(zip(table["question_id"], table["answer_id"])) == {("q0", "ta0"), ("q8", "ta8")}
    pool = pool_of(collection)

    def mined(triples):
        return set(triples.loc[triples["question_id"] == "q0", "negative_id"])

    def non_relevant(candidates):
        return set(candidates.loc[(candidates["question_id"] == "q8") & (candidates["relevance"] == 0), "answer_id"])

    assert "ta0" in mined(training_triples(pairs, pool, k=3, backend="bm25s")), (
        "without the table the twin's gold is mined"
    )
    assert "ta0" not in mined(training_triples(pairs, pool, k=3, backend="bm25s", same_text_gold=table))
    assert "ta8" in non_relevant(evaluation_candidates(pairs, pool, n=4, backend="bm25s"))
    assert "ta8" not in non_relevant(evaluation_candidates(pairs, pool, n=4, backend="bm25s", same_text_gold=table))
    pools = pd.DataFrame(
        {"question_id": ["q8", "q8"], "answer_id": ["ta8", "x0"], "answer": ["twin gold", "pool zero"]}
    )
    assert non_relevant(official_candidates(pairs, pools, table)) == {"x0"}

    write_clients(
        {"c": QAClient(collection, pool, None, pool)}, tmp_path, largest=5, smallest=1, eval_questions=2, seed=0
    )
    written, kept = read_table(tmp_path / "qa/c/same_text_gold.parquet"), read_table(tmp_path / "qa/c/pairs.parquet")
    assert written.equals(same_text_gold(kept, collection)), (
        "the fedmatch_partition stage lists what the fedmatch_mine stage excludes"
    )


def test_a_question_asked_under_several_ids_lands_in_one_split_and_the_others_keep_theirs():
    """MedQuAD asks one text under several ids: split by id alone, a twin of a training question was evaluated."""
    from fedrepro.data.qa_collections import seeded_split

    ids = [f"q{i:03d}" for i in range(300)]
    texts = {qid: f"question number {i}" for i, qid in enumerate(ids)}
    for i in range(0, 60, 2):  # 30 pairs of twins: q000/q001 ... asked with the same text (case and spaces aside)
        texts[ids[i + 1]] = "  " + texts[ids[i]].upper() + " "
    plain, grouped = seeded_split(ids, 7), seeded_split(ids, 7, texts=texts)
    assert any(plain[ids[i]] != plain[ids[i + 1]] for i in range(0, 60, 2))  # the defect the grouping removes
    assert all(grouped[ids[i]] == grouped[ids[i + 1]] == plain[ids[i]] for i in range(0, 60, 2))
    assert all(grouped[qid] == plain[qid] for qid in ids[60:])


def test_candidates_scored_in_batches_of_similar_length_keep_the_tables_order():
    """``score`` batches candidates by length (less padding); each row must still carry its own pair's score."""
    from fedrepro.tasks.qa import QAMatchingTask

    class Padder:
        def pad(self, rows, return_tensors):
            width = max(len(row["input_ids"]) for row in rows)
            return {
                key: torch.tensor([row[key] + [0] * (width - len(row[key])) for row in rows])
                for key in ("input_ids", "attention_mask")
            }

    class LengthTimesFirstToken(FixedScorer):
        def forward(self, input_ids, attention_mask):
            return attention_mask.sum(dim=1).float() * input_ids[:, 0].float(), None

    lengths = [5, 2, 7, 3, 3, 6, 1]
    task = QAMatchingTask.__new__(QAMatchingTask)
    task.tokenizer, task.eval_batch_size = Padder(), 2
    task.candidates = {
        "c": pd.DataFrame(
            {
                "question_id": list("qqqrrss"),
                "answer_id": list("abcdefg"),
                "relevance": [1, 0, 0, 1, 0, 1, 0],
                "split": ["valid"] * 6 + ["test"],
            }
        )
    }
    task.candidate_encodings = {
        "c": [{"input_ids": [10 + i] * n, "attention_mask": [1] * n} for i, n in enumerate(lengths)]
    }
    scored = task.score(LengthTimesFirstToken(), "c", "valid")
    assert scored["answer_id"].tolist() == list("abcdef")
    assert scored["score"].tolist() == [n * (10 + i) for i, n in enumerate(lengths[:6])]
