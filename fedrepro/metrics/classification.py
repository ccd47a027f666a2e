"""What a classifier must beat: the scores of answers that need no model, in the headline metric.

Micro-F1 over the positive classes (the no-relation class left out, as FedCMC scores): always answering the most
frequent positive training class, and stratified random guessing (a class drawn from the training prior for each
sentence; its expected micro-F1 from the expected counts, so no draw and no seed is involved).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def trivial_scores(
    gold: Sequence[str], train_counts: Mapping[str, float], positive: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Micro- and macro-F1 over the ``positive`` classes of the two answers that need no model, given the gold
    labels and the training label counts (the prior a model that learned nothing else would know)."""
    gold = np.asarray(gold, dtype=object)
    total = sum(train_counts.values())
    prior = {c: train_counts.get(c, 0) / total for c in positive}
    n = {c: int((gold == c).sum()) for c in positive}
    gold_positive, size = sum(n.values()), len(gold)
    commonest = max(positive, key=lambda c: prior[c])
    # constant answer: every sentence predicted `commonest` (a positive class), so predicted positives = N
    constant = {
        "micro_f1": 2 * n[commonest] / (size + gold_positive),
        "macro_f1": 2 * n[commonest] / (size + n[commonest]) / len(positive),
    }
    # stratified random: E[TP_c] = n_c p_c and E[predicted c] = N p_c (ratios of expected counts)
    expected_tp = {c: n[c] * prior[c] for c in positive}
    stratified = {
        "micro_f1": 2 * sum(expected_tp.values()) / (size * sum(prior.values()) + gold_positive),
        "macro_f1": float(
            np.mean(
                [2 * expected_tp[c] / (size * prior[c] + n[c]) if size * prior[c] + n[c] else 0.0 for c in positive]
            )
        ),
    }
    return {f"always {commonest}": constant, "stratified random": stratified}
