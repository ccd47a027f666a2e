"""FedCMC's trivial baselines, checked against predictions scored by scikit-learn."""

import numpy as np
import pytest
from sklearn.metrics import f1_score

from fedrepro.fedcmc.sanity import trivial_baselines
from fedrepro.metrics.classification import trivial_scores
from fedrepro.fl.engine import GLOBAL
from tests.test_fedcmc import corpus, make_task, run_engine, tokenizer  # noqa: F401 (fixtures)


def test_trivial_baselines_match_sklearn_on_the_predictions_they_stand_for(corpus, tokenizer):  # noqa: F811
    task = make_task(corpus, tokenizer, negative=(corpus.classes[0],))
    gold = task.eval_sets["valid"][0]["label"].map({c: i for i, c in enumerate(task.classes)}).to_numpy()
    prior = sum(task.label_counts(c) for c in task.client_ids).numpy()
    baselines = trivial_baselines(task)
    commonest = max(task.positive, key=lambda c: prior[c])
    constant = f1_score(gold, np.full_like(gold, commonest), labels=task.positive, average="micro")
    assert baselines[f"always {task.classes[commonest]}"] == constant
    # stratified random: the mean over many draws approaches the expected-count formula
    rng = np.random.default_rng(0)
    draws = [
        f1_score(
            gold, rng.choice(len(prior), size=len(gold), p=prior / prior.sum()), labels=task.positive, average="micro"
        )
        for _ in range(2000)
    ]
    assert abs(np.mean(draws) - baselines["stratified random"]) < 0.01
    positive = [task.classes[i] for i in task.positive]
    scores = trivial_scores(task.eval_sets["valid"][0]["label"], dict(zip(task.classes, prior)), positive)
    named = task.eval_sets["valid"][0]["label"].to_numpy()
    macro = f1_score(named, [task.classes[commonest]] * len(named), labels=positive, average="macro")
    assert scores[f"always {task.classes[commonest]}"]["macro_f1"] == pytest.approx(macro)
    macro_draws = [
        f1_score(
            gold, rng.choice(len(prior), size=len(gold), p=prior / prior.sum()), labels=task.positive, average="macro"
        )
        for _ in range(2000)
    ]
    # per-class F1 is a ratio of small counts here (a few dozen sentences): the ratio of expectations is close, not
    # exact
    assert abs(np.mean(macro_draws) - scores["stratified random"]["macro_f1"]) < 0.02
    assert 0 < baselines["stratified random"] < 1


def test_the_pooled_reference_is_scored_as_the_global_model_every_round(corpus, tokenizer, tmp_path):  # noqa: F811
    task = make_task(corpus, tokenizer)
    engine = run_engine(task, "centralised", tmp_path)
    last = engine.state.history[-1]
    assert set(last["valid"]) == {GLOBAL}  # one global score, not one per client share
    assert last["valid"][GLOBAL] == task.evaluate(engine.global_model(), GLOBAL, "valid")
