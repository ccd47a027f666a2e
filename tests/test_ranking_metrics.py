"""MAP/MRR against hand arithmetic, pytrec_eval vs ranx, exclusion of unjudged questions, tie rule."""

from __future__ import annotations

import itertools
import random

import pytest

from fedrepro.errors import FedreproError
from fedrepro.metrics.ranking import cross_check_ranx, per_question_metrics, random_ranking_metrics, ranking_metrics

QRELS = {
    "q1": {"d1": 1, "d3": 1, "d2": 0},
    "q2": {"d5": 1},
    "q3": {"d7": 1},
    "q4": {"d1": 0},  # no relevant answer: excluded from the means
}
RUN = {
    "q1": {"d2": 0.9, "d1": 0.8, "d3": 0.7, "d4": 0.1},  # relevant at ranks 2, 3
    "q2": {"d5": 2.0, "d6": 1.0},  # relevant at rank 1
    "q3": {"d8": 3.0, "d9": 2.0, "d10": 1.0},  # relevant never retrieved
    "q4": {"d1": 1.0},
}


def test_hand_computed_example():
    # AP(q1) = (1/2 + 2/3) / 2 = 7/12, RR(q1) = 1/2;  AP(q2) = RR(q2) = 1;  AP(q3) = RR(q3) = 0
    # MAP = (7/12 + 1 + 0) / 3 = 19/36;  MRR = (1/2 + 1 + 0) / 3 = 1/2;  q4 has no relevant answer
    per_q = per_question_metrics(QRELS, RUN)
    assert set(per_q) == {"q1", "q2", "q3"}
    assert per_q["q1"] == pytest.approx({"map": 7 / 12, "mrr": 0.5})
    assert ranking_metrics(QRELS, RUN) == pytest.approx({"map": 19 / 36, "mrr": 0.5})
    assert cross_check_ranx(QRELS, RUN) == pytest.approx({"map": 19 / 36, "mrr": 0.5})


def test_judged_question_missing_from_run_scores_zero():
    run = {q: docs for q, docs in RUN.items() if q != "q3"}
    assert per_question_metrics(QRELS, run)["q3"] == {"map": 0.0, "mrr": 0.0}
    assert ranking_metrics(QRELS, run) == pytest.approx({"map": 19 / 36, "mrr": 0.5})
    assert cross_check_ranx(QRELS, run) == pytest.approx({"map": 19 / 36, "mrr": 0.5})


def test_perfect_ranking_is_one():
    run = {q: {d: float(r) for d, r in docs.items()} for q, docs in QRELS.items()}
    assert ranking_metrics(QRELS, run) == {"map": 1.0, "mrr": 1.0}
    assert cross_check_ranx(QRELS, run) == pytest.approx({"map": 1.0, "mrr": 1.0})


def test_ties_broken_by_ascending_doc_id():
    # trec_eval alone would put "b" (relevant) first; our rule ranks "a" first, so RR = 1/2
    qrels, run = {"q": {"b": 1}}, {"q": {"a": 0.5, "b": 0.5}}
    assert ranking_metrics(qrels, run) == {"map": 0.5, "mrr": 0.5}
    assert cross_check_ranx(qrels, run) == pytest.approx({"map": 0.5, "mrr": 0.5})


def test_pytrec_eval_and_ranx_agree_on_random_runs():
    rng = random.Random(0)
    qrels, run = {}, {}
    for i in range(50):
        docs = [f"d{j}" for j in range(rng.randint(2, 15))]
        qrels[f"q{i}"] = {d: int(rng.random() < 0.3) for d in docs}
        run[f"q{i}"] = {d: float(rng.randint(0, 5)) for d in docs if rng.random() < 0.8}  # many ties
    assert ranking_metrics(qrels, run) == pytest.approx(cross_check_ranx(qrels, run), abs=1e-9)


def test_no_relevant_answer_anywhere_is_an_error():
    with pytest.raises(FedreproError, match="no question has a relevant answer"):
        ranking_metrics({"q": {"d": 0}}, {"q": {"d": 1.0}})


def _enumerated_chance(qrels, run):
    """Mean MAP/MRR over every ordering of every question's candidates (brute force, itertools)."""
    per_question = {"map": [], "mrr": []}
    for q, docs in qrels.items():
        if not any(r > 0 for r in docs.values()):
            continue
        orders = list(itertools.permutations(run.get(q, {})))
        scores = [
            ranking_metrics({q: docs}, {q: {d: float(len(o) - i) for i, d in enumerate(o)}})
            if o
            else {"map": 0.0, "mrr": 0.0}
            for o in orders
        ]
        for name in per_question:
            per_question[name].append(sum(s[name] for s in scores) / len(scores))
    return {name: sum(values) / len(values) for name, values in per_question.items()}


def test_random_ranking_is_the_exact_expectation_over_all_orderings():
    # q1: 2 relevant of 4 (+1 judged relevant never retrieved); q2: 1 of 5; q3: 3 of 3; q4: judged, not in the run;
    # q5: no relevant answer (excluded)
    qrels = {
        "q1": {"a": 1, "b": 1, "z": 1, "c": 0},
        "q2": {"e": 1},
        "q3": {"x": 1, "y": 1, "w": 1},
        "q4": {"m": 1},
        "q5": {"n": 0},
    }
    run = {
        "q1": {"a": 0, "b": 0, "c": 0, "d": 0},
        "q2": {d: 0 for d in "efghi"},
        "q3": {"x": 0, "y": 0, "w": 0},
        "q5": {"n": 0},
    }
    assert random_ranking_metrics(qrels, run) == pytest.approx(_enumerated_chance(qrels, run), abs=1e-12)


def test_random_ranking_by_hand():
    # 1 relevant of 3: E[RR] = E[AP] = (1 + 1/2 + 1/3) / 3 = 11/18.
    # 2 relevant of 3: orders (R R N) AP 1, (R N R) (1 + 2/3)/2 = 5/6, (N R R) (1/2 + 2/3)/2 = 7/12, each with
    # probability 1/3: E[AP] = (1 + 5/6 + 7/12) / 3 = 29/36; E[RR] = (1 + 1 + 1/2) / 3 = 5/6.
    assert random_ranking_metrics({"q": {"a": 1}}, {"q": {"a": 0, "b": 0, "c": 0}}) == pytest.approx(
        {"map": 11 / 18, "mrr": 11 / 18}
    )
    assert random_ranking_metrics({"q": {"a": 1, "b": 1}}, {"q": {"a": 0, "b": 0, "c": 0}}) == pytest.approx(
        {"map": 29 / 36, "mrr": 5 / 6}
    )


def test_random_ranking_of_many_gold_answers_is_near_one_half():
    # PrivacyQA-like: 20 gold answers among 40 candidates; chance MAP is 0.542, far from 1 gold in 20's 0.180.
    qrels = {"q": {f"g{i}": 1 for i in range(20)}}
    run = {"q": {**{f"g{i}": 0.0 for i in range(20)}, **{f"n{i}": 0.0 for i in range(20)}}}
    level = random_ranking_metrics(qrels, run)
    assert 0.5 < level["map"] < 0.55 and 0.65 < level["mrr"] < 0.75
