"""The statistics every paper's claims are tested with. The unit of replication is the seed: a contrast is tested by a
hierarchical bootstrap that resamples seeds and test items together (the same seeds on both sides when they share
them), so a difference that flips sign across seeds is not mistaken for one that holds, and its p-value takes a t
quantile with one degree of freedom fewer than the seeds (``seed_level_p``), so that at the 3 seeds a claim needs it
rejects a true null as often as it says. The report corrects its claims for their number (Holm, ``claims``) and words
every verdict from ``VERDICTS``. An exact sign test serves claims over matched cells."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd
from scipy import stats

from fedrepro.errors import DataError
from fedrepro.seeding import derive_seed

RESAMPLES = 1000
BOOTSTRAP_SEED = 0
ALPHA = 0.05
MIN_SEEDS = 3
"""a seed-level test needs this many seeds: with fewer, a contrast's numbers are shown but its verdict is inconclusive."""

HOLDS, REVERSED, NOT_SIGNIFICANT, INCONCLUSIVE, NOT_TESTABLE = (
    "holds", "reversed", "not significant", "inconclusive", "not testable here")
VERDICTS = (HOLDS, REVERSED, NOT_SIGNIFICANT, INCONCLUSIVE, NOT_TESTABLE)
"""The one vocabulary of every report's verdicts; each verdict is one of these, maybe followed by ' (why)'."""


def worded(word: str, why: str | None = None) -> str:
    """A verdict of the vocabulary, with why in brackets: 'inconclusive (1 seed; a seed-level test needs 3)'."""
    if word not in VERDICTS:
        raise ValueError(f"{word!r} is not a verdict of {VERDICTS}")
    return f"{word} ({why})" if why else word


def verdict_from_p(difference: float, p_value: float, alpha: float = ALPHA) -> str:
    """The claim 'the contrast is positive', from its (adjusted) p-value and the sign of the contrast."""
    if p_value < alpha:
        return HOLDS if difference > 0 else REVERSED
    return NOT_SIGNIFICANT


def direction_verdict(holds: bool, why: str) -> str:
    """A claim the numbers can only show the direction of (no test): holds or reversed, saying so."""
    return worded(HOLDS if holds else REVERSED, why)


def too_few_seeds(seeds: int) -> str | None:
    """Why a contrast over ``seeds`` seeds gets no seed-level verdict, or None when it has enough."""
    if seeds >= MIN_SEEDS:
        return None
    return f"{seeds} seed{'s' if seeds != 1 else ''}; a seed-level test needs {MIN_SEEDS}"


def sign_test(ours: list[float], theirs: list[float]) -> tuple[int, int, int, float]:
    """Two-sided exact sign test that ``ours`` is lower than ``theirs`` over paired values: (wins, losses, ties, p);
    ties are left out (p = 1 when every pair ties)."""
    wins = sum(a < b for a, b in zip(ours, theirs))
    losses = sum(a > b for a, b in zip(ours, theirs))
    ties = len(ours) - wins - losses
    p = float(stats.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0
    return wins, losses, ties, p


@dataclass(frozen=True)
class Bootstrap:
    """A hierarchical bootstrap's result: the contrast, its 95% interval, its p-value and what was resampled."""

    difference: float
    """the contrast on the full test sets, each side the mean over its seeds."""
    low: float
    high: float
    """the 2.5% and 97.5% percentiles over the resamples."""
    p_value: float
    """two-sided, from the bootstrap's standard error (``seed_level_p``): a percentile p cannot go below
    2 / (resamples + 1), which Holm's correction over a report's tens of claims could never clear."""
    items: int
    seeds: int
    """the fewest seeds of any side: the seed-level test's sample size."""
    resamples: int
    paired_seeds: bool
    """True when every side has the same seeds, so each resample draws the same seeds on every side."""


def _item_weights(rng: np.random.Generator, n: int, resamples: int) -> np.ndarray:
    """How often each of ``n`` items is drawn in each resample (resamples x n), drawing n with replacement."""
    draws = rng.integers(0, n, size=(resamples, n))
    counts = np.bincount((draws + np.arange(resamples)[:, None] * n).ravel(), minlength=resamples * n)
    return counts.reshape(resamples, n).astype(float)


def _seed_means(per_seed: list[np.ndarray], seeds: list[tuple], rng: np.random.Generator) -> list[np.ndarray]:
    """Each side's value per resample, the mean over its seeds drawn with replacement. ``per_seed[i]`` is side i's
    value of each seed in each resample (resamples x its seeds); sides with the same seeds share one draw (paired)."""
    resamples, paired = per_seed[0].shape[0], len(set(seeds)) == 1
    shared = rng.integers(0, len(seeds[0]), size=(resamples, len(seeds[0]))) if paired else None
    means = []
    for values, labels in zip(per_seed, seeds):
        draw = shared if paired else rng.integers(0, len(labels), size=(resamples, len(labels)))
        means.append(np.take_along_axis(values, draw, axis=1).mean(axis=1))
    return means


def seed_level_p(point: float, spread: float, seeds: int) -> float:
    """Two-sided p of a contrast ``point`` whose bootstrap standard error is ``spread``, over ``seeds`` seeds.

    Drawing n seeds with replacement from n gives their mean a variance (n - 1) / n of the s^2 / n that the seeds'
    sample variance s^2 says, and that error is itself estimated from n seeds: a normal p from it rejected 22% of simulated seed-level nulls
    at 3 seeds, 13% at 5 and 10% at 10 (nominal 5%). So the error is scaled back by sqrt(n / (n - 1)) and read
    against Student's t with n - 1 degrees of freedom, as a paired t-test over seeds would (the calibration test in
    ``tests/test_statistics.py``). One seed has no seed-level spread: its p is the items' alone (normal), and
    ``MIN_SEEDS`` keeps it from any verdict."""
    if spread == 0:
        return 1.0 if point == 0 else 0.0
    if seeds < 2:
        return float(2 * stats.norm.sf(abs(point) / spread))
    corrected = spread * np.sqrt(seeds / (seeds - 1))
    return float(2 * stats.t.sf(abs(point) / corrected, seeds - 1))


def _result(point: float, totals: np.ndarray, items: int, seeds: list[tuple]) -> Bootstrap:
    low, high = np.percentile(totals, [2.5, 97.5])
    spread = float(totals.std(ddof=1)) if len(totals) > 1 else 0.0
    fewest = min(len(s) for s in seeds)
    return Bootstrap(float(point), float(low), float(high), seed_level_p(point, spread, fewest), items, fewest,
                     len(totals), len(set(seeds)) == 1)


def hierarchical_bootstrap(better: pd.DataFrame, worse: pd.DataFrame, resamples: int = RESAMPLES,
                           seed: int = BOOTSTRAP_SEED, label: str = "") -> Bootstrap:
    """Mean per-item metric of ``better`` minus ``worse`` (each a seeds x items frame: one row per seed, one column
    per test item), resampling seeds and the items both sides scored (columns without a missing value) together."""
    items = [c for c in better.columns.intersection(worse.columns)
             if better[c].notna().all() and worse[c].notna().all()]
    if not items:
        raise DataError(f"bootstrap {label!r}: the two sides share no scored item")
    rng = np.random.default_rng(derive_seed(seed, label))
    weights = _item_weights(rng, len(items), resamples) / len(items)
    sides = [better[items].to_numpy(float), worse[items].to_numpy(float)]
    labels = [tuple(better.index), tuple(worse.index)]
    a, b = _seed_means([weights @ side.T for side in sides], labels, rng)
    point = sides[0].mean() - sides[1].mean()
    return _result(point, a - b, len(items), labels)


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


def bootstrap_contrast(terms: list[tuple[float, str, Mapping[int, pd.DataFrame]]], positive: dict[str, list[str]],
                       resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Bootstrap:
    """Hierarchical bootstrap of sum_i weight_i * (micro-F1 of term i, averaged over its seeds).

    Each term is (weight, test set, {seed: predictions}). Each resample draws the seeds with replacement (one draw
    shared by every term when all terms have the same seeds, so the comparison is paired by seed) and the sentences
    of each test set with replacement (those every term on it scored, matched by sentence_id; shared by all its
    terms and seeds, so it is paired by sentence too); a contrast over several test sets resamples each
    independently. A difference A - B is [(1, d, A), (-1, d, B)].
    """
    if not terms or any(not frames for _, _, frames in terms):
        raise DataError("bootstrap: a term has no predictions")
    per_seed, seeds, weights_of, point, sentences = [], [], [], 0.0, 0
    for group in sorted({g for _, g, _ in terms}):
        members = [(w, frames) for w, g, frames in terms if g == group]
        ids = sorted(set.intersection(*[set(f["sentence_id"]) for _, frames in members for f in frames.values()]))
        if not ids:
            raise DataError(f"bootstrap: the predictions on test set {group!r} share no sentence")
        rng = np.random.default_rng(derive_seed(seed, group))
        weights = _item_weights(rng, len(ids), resamples)
        for weight, frames in members:
            labels = tuple(sorted(frames))
            counts = [sentence_counts(*frames[s].set_index("sentence_id").loc[ids, ["label", "predicted"]].to_numpy().T,
                                      positive[group]) for s in labels]
            resampled = (weights @ np.concatenate(counts, axis=1)).reshape(resamples, len(labels), 3)
            per_seed.append(_f1(resampled))
            seeds.append(labels)
            weights_of.append(weight)
            point += weight * float(np.mean([_f1(c.sum(axis=0)) for c in counts]))
        sentences += len(ids)
    means = _seed_means(per_seed, seeds, np.random.default_rng(derive_seed(seed, "seeds")))
    totals = sum(weight * mean for weight, mean in zip(weights_of, means))
    return _result(point, totals, sentences, seeds)


def bootstrap_difference(better: Mapping[int, pd.DataFrame], worse: Mapping[int, pd.DataFrame], positive: list[str],
                         resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Bootstrap:
    """Micro-F1 of ``better`` minus ``worse`` on one test set ({seed: predictions} each), hierarchical bootstrap."""
    return bootstrap_contrast([(1.0, "test", better), (-1.0, "test", worse)], {"test": positive}, resamples, seed)
