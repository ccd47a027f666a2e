"""The statistics every paper's claims are tested with: a paired t-test, an exact sign test, the paired bootstrap
of micro-F1 (test sentences resampled with replacement) and the verdict wording they share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from fedrepro.errors import DataError
from fedrepro.seeding import derive_seed

RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def paired_test(better: pd.Series, worse: pd.Series) -> tuple[float, float, int]:
    """Mean difference and two-sided paired t-test p-value over the questions both sides were scored on.

    Each side is a per-question metric (already averaged over seeds), indexed by (client, question).
    """
    joined = pd.concat([better.rename("a"), worse.rename("b")], axis=1, join="inner").dropna()
    diff = (joined["a"] - joined["b"]).to_numpy()
    if len(diff) < 2 or np.allclose(diff, diff[0]):
        return float(diff.mean()) if len(diff) else 0.0, 1.0, len(diff)
    return float(diff.mean()), float(stats.ttest_rel(joined["a"], joined["b"]).pvalue), len(diff)


def verdict(difference: float, p_value: float, alpha: float = 0.05) -> str:
    """holds / does not hold / not significant, for a claim that ``difference`` is positive."""
    if p_value < alpha:
        return "holds" if difference > 0 else "does not hold (significantly reversed)"
    return "not significant (" + ("same direction" if difference > 0 else "opposite direction") + ")"


def sign_test(ours: list[float], theirs: list[float]) -> tuple[int, int, int, float]:
    """Two-sided exact sign test that ``ours`` is lower than ``theirs`` over paired values: (wins, losses, ties, p);
    ties are left out (p = 1 when every pair ties)."""
    wins = sum(a < b for a, b in zip(ours, theirs))
    losses = sum(a > b for a, b in zip(ours, theirs))
    ties = len(ours) - wins - losses
    p = float(stats.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0
    return wins, losses, ties, p


def sentence_counts(gold, predicted, positive) -> np.ndarray:
    """Per sentence (tp, fp, fn) of micro-F1 over the ``positive`` classes, as scikit-learn counts them with
    ``labels=positive``: a hit on a positive class is a tp; a wrong positive prediction a fp; a positive gold
    label predicted wrong a fn (so a wrong positive-for-positive sentence is both)."""
    gold, predicted = np.asarray(gold, dtype=object), np.asarray(predicted, dtype=object)
    keep = set(positive)
    gold_pos = np.fromiter((g in keep for g in gold), bool, len(gold))
    pred_pos = np.fromiter((p in keep for p in predicted), bool, len(predicted))
    right = gold == predicted
    return np.stack([gold_pos & right, pred_pos & ~right, gold_pos & ~right], axis=1).astype(float)


def _f1(sums: np.ndarray) -> np.ndarray:
    """Micro-F1 from summed (tp, fp, fn) in the last axis; 0 where there is nothing to score (zero_division=0)."""
    tp, fp, fn = sums[..., 0], sums[..., 1], sums[..., 2]
    denominator = 2 * tp + fp + fn
    return np.divide(2 * tp, denominator, out=np.zeros_like(denominator, dtype=float), where=denominator > 0)


def micro_f1(gold, predicted, positive) -> float:
    """Micro-F1 over the ``positive`` classes, counted as the bootstrap counts it."""
    return float(_f1(sentence_counts(gold, predicted, positive).sum(axis=0)))


@dataclass(frozen=True)
class Bootstrap:
    """A paired bootstrap's result: the contrast, its 95% interval and what it was resampled over."""

    difference: float
    """the contrast on the full test sets (micro-F1, 0-1)."""
    low: float
    high: float
    """the 2.5% and 97.5% percentiles over the resamples."""
    sentences: int
    resamples: int
    seeds: int


def bootstrap_contrast(terms: list[tuple[float, str, list[pd.DataFrame]]], positive: dict[str, list[str]],
                       resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Bootstrap:
    """Paired bootstrap of sum_i weight_i * (micro-F1 of term i, averaged over its seeds' predictions).

    Each term is (weight, test set, [predictions of each seed]). The sentences of each test set (those every
    term on it scored, matched by sentence_id) are resampled with replacement once per resample and shared by
    all its terms and seeds, so the comparison is paired; a contrast over several test sets resamples each
    independently. A difference A − B is [(1, d, A), (−1, d, B)]; with one seed list per side of equal length
    the seed-mean of each side per resample equals the mean of the per-seed differences.
    """
    totals, point, sentences, seeds = np.zeros(resamples), 0.0, 0, 0
    for group in sorted({g for _, g, _ in terms}):
        members = [(w, frames) for w, g, frames in terms if g == group]
        ids = sorted(set.intersection(*[set(f["sentence_id"]) for _, frames in members for f in frames]))
        n = len(ids)
        if n == 0:
            raise DataError(f"bootstrap: the predictions on test set {group!r} share no sentence")
        rng = np.random.default_rng(derive_seed(seed, group))
        draws = rng.integers(0, n, size=(resamples, n))
        weights = np.bincount((draws + np.arange(resamples)[:, None] * n).ravel(), minlength=resamples * n)
        weights = weights.reshape(resamples, n).astype(float)
        for weight, frames in members:
            counts = [sentence_counts(*f.set_index("sentence_id").loc[ids, ["label", "predicted"]].to_numpy().T, positive[group])
                      for f in frames]
            stacked = np.concatenate(counts, axis=1)  # n x 3*seeds
            resampled = (weights @ stacked).reshape(resamples, len(frames), 3)
            totals += weight * _f1(resampled).mean(axis=1)
            point += weight * float(np.mean([_f1(c.sum(axis=0)) for c in counts]))
            seeds = max(seeds, len(frames))
        sentences += n
    low, high = np.percentile(totals, [2.5, 97.5])
    return Bootstrap(float(point), float(low), float(high), sentences, resamples, seeds)


def bootstrap_difference(better: list[pd.DataFrame], worse: list[pd.DataFrame], positive: list[str],
                         resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Bootstrap:
    """Micro-F1 of ``better`` minus ``worse`` on one test set (lists of per-seed predictions), paired bootstrap."""
    return bootstrap_contrast([(1.0, "test", better), (-1.0, "test", worse)], {"test": positive}, resamples, seed)


def interval_verdict(result: Bootstrap) -> str:
    """The claim 'the contrast is positive': holds if the 95% interval is above 0, reversed if below, else not
    significant (``verdict``'s wording; 'no difference' when the predictions score exactly the same)."""
    if result.low > 0 or result.high < 0:
        return verdict(result.low if result.low > 0 else result.high, 0.0)
    if result.difference == 0 and result.low == result.high == 0:
        return "not significant (no difference)"
    return verdict(result.difference, 1.0)
