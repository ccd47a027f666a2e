"""FedCMC's trivial baselines, checked against predictions scored by scikit-learn."""

import numpy as np
from sklearn.metrics import f1_score

from fedrepro.fedcmc.sanity import trivial_baselines
from tests.test_fedcmc import corpus, make_task, tokenizer  # noqa: F401 (fixtures)


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
    draws = [f1_score(gold, rng.choice(len(prior), size=len(gold), p=prior / prior.sum()), labels=task.positive,
                      average="micro") for _ in range(2000)]
    assert abs(np.mean(draws) - baselines["stratified random"]) < 0.01
    assert 0 < baselines["stratified random"] < 1
