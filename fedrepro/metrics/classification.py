"""What a classifier must beat: the scores of answers that need no model, in the headline metric.

Micro-F1 over the positive classes (the no-relation class left out, as FedCMC scores): always answering the most
frequent positive training class, and stratified random guessing (a class drawn from the training prior for each
sentence; its expected micro-F1 from the expected counts, so no draw and no seed is involved).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def trivial_scores(gold: Sequence[str], train_counts: Mapping[str, float], positive: Sequence[str]) -> dict[str, float]:
    """Micro-F1 over the ``positive`` classes of the two answers that need no model, given the gold labels and
    the training label counts (the prior a model that learned nothing else would know)."""
    gold = np.asarray(gold, dtype=object)
    total = sum(train_counts.values())
    prior = {c: n / total for c, n in train_counts.items()}
    gold_positive = int(np.isin(gold, list(positive)).sum())
    commonest = max(positive, key=lambda c: prior.get(c, 0.0))
    # constant answer: every sentence predicted `commonest` (a positive class), so predicted positives = N
    constant = 2 * int((gold == commonest).sum()) / (len(gold) + gold_positive)
    # stratified random: E[TP] = sum_c n_c p_c and E[predicted positives] = N sum_{c positive} p_c
    expected_tp = sum(int((gold == c).sum()) * prior.get(c, 0.0) for c in positive)
    stratified = 2 * expected_tp / (len(gold) * sum(prior.get(c, 0.0) for c in positive) + gold_positive)
    return {f"always {commonest}": float(constant), "stratified random": float(stratified)}
