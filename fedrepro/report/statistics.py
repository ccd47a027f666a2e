"""The statistics every paper's claims are tested with. The unit of replication is the seed: a contrast is tested by a
hierarchical bootstrap that resamples seeds and test items together (the same seeds on both sides when they share
them), so a difference that flips sign across seeds is not mistaken for one that holds, and its p-value reads a t
quantile whose degrees of freedom are the seeds' where they dominate (``seed_level_p``), so that at the 3 seeds a
claim needs it rejects a true null as often as it says. The report corrects its claims for their number (Holm,
``claims``) and words every verdict from ``VERDICTS``. An exact sign test serves claims over matched cells."""

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
"""a seed-level test needs this many seeds: with fewer, a contrast's numbers are shown but its verdict is
inconclusive."""

HOLDS, REVERSED, NOT_SIGNIFICANT, INCONCLUSIVE, NOT_TESTABLE = (
    "holds",
    "reversed",
    "not significant",
    "inconclusive",
    "not testable here",
)
VERDICTS = (HOLDS, REVERSED, NOT_SIGNIFICANT, INCONCLUSIVE, NOT_TESTABLE)
"""The one vocabulary of every report's verdicts; each verdict is one of these, maybe followed by ' (why)'."""


def worded(word: str, why: str | None = None) -> str:
    """A verdict of the vocabulary, with why in brackets: 'inconclusive (1 seed; a seed-level test needs 3)'."""
    if word not in VERDICTS:
        raise ValueError(f"{word!r} is not a verdict of {VERDICTS}")
    return f"{word} ({why})" if why else word


def verdict_from_p(difference: float, p_value: float, alpha: float = ALPHA) -> str:
    """The claim 'the contrast is positive', from its (adjusted) p-value and the sign of the contrast: significant at
    p <= alpha, where Holm's procedure (statsmodels' ``multipletests``) rejects."""
    if p_value <= alpha:
        return HOLDS if difference > 0 else REVERSED
    return NOT_SIGNIFICANT


def direction_verdict(holds: bool, why: str, seeds: int) -> str:
    """A claim the numbers can only show the direction of (no test): holds or reversed, saying so, when they come from
    at least ``MIN_SEEDS`` seeds; from fewer, inconclusive with the direction seen (one seed's direction is as likely
    another seed's noise)."""
    if seeds < MIN_SEEDS:
        return worded(
            INCONCLUSIVE, f"direction {'as claimed' if holds else 'against the claim'}, {why}; {too_few_seeds(seeds)}"
        )
    return worded(HOLDS if holds else REVERSED, why)


def exact_verdict(holds: bool, why: str) -> str:
    """A claim on exact counts that no seed moves (messages a step, from the channel's log): holds or reversed."""
    return worded(HOLDS if holds else REVERSED, why)


def too_few_seeds(seeds: int) -> str | None:
    """Why a contrast over ``seeds`` seeds gets no seed-level verdict, or None when it has enough."""
    if seeds >= MIN_SEEDS:
        return None
    return f"{seeds} seed{'s' if seeds != 1 else ''}; a seed-level test needs {MIN_SEEDS}"


def sign_test_pairs_needed(alpha: float = ALPHA) -> int:
    """The fewest untied pairs with which a two-sided exact sign test can reach ``alpha`` (all pairs one way:
    p = 2 / 2^n): 6 at 0.05. Fewer cannot discriminate, so a verdict on them would be the test's floor, not the data."""
    n = 1
    while 2 / 2**n > alpha:
        n += 1
    return n


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
    """two-sided, from the seeds' and the test items' variances (``seed_level_p``): a percentile p cannot go below
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


def seed_level_p(point: float, terms: list[tuple[float, np.ndarray, np.ndarray]], items: int) -> float:
    """Two-sided p of the contrast ``point`` = sum_i weight_i * (term i's mean over its seeds), from each term's
    (weight, its value at each seed in each resample of the test items (resamples x seeds), its value at each seed
    on the whole test set). Terms with the same seeds are passed as one (their weighted sum: paired by seed).

    The contrast's variance has two sources, the seeds and the test items, and they are estimated apart because
    their degrees of freedom differ: the seeds' s^2 / n (n - 1 degrees of freedom: 2 at the 3 seeds a claim needs)
    and what the items add beyond it, the variance of the seed mean over item resamples less the seed-by-item noise
    already in s^2 / n (which each seed's own item resamples measure). The p reads Student's t with the
    Welch-Satterthwaite degrees of freedom of the sum: near n - 1 where the seeds dominate (a paired t-test over
    seeds), near the items' where they do. A normal p from the hierarchical bootstrap's standard error rejected 17%
    of 2,000 simulated seed-level nulls at 3 seeds, 12% at 5 and 7% at 10 (nominal 5%); this one 5.5%, 5.3% and 4.6%
    (``tests/test_statistics.py``). A term of one seed has no seed-level variance: with one seed the p is the
    items' alone, and ``MIN_SEEDS`` keeps it from any verdict."""
    seed_parts, overlap, seed_mean = [], 0.0, 0.0
    for weight, resampled, at_seeds in terms:
        seed_mean = seed_mean + weight * resampled.mean(axis=1)
        n = len(at_seeds)
        if n > 1:
            seed_parts.append((weight * weight * float(np.var(at_seeds, ddof=1)) / n, n - 1))
            within = float(np.var(resampled, axis=0, ddof=1).mean())
            overlap += weight * weight * (within - float(np.var(resampled.mean(axis=1), ddof=1))) / (n - 1)
    item_part = max(float(np.var(seed_mean, ddof=1)) - overlap, 0.0) if len(seed_mean) > 1 else 0.0
    total = sum(variance for variance, _ in seed_parts) + item_part
    if total == 0:
        return 1.0 if point == 0 else 0.0
    spread = sum(variance * variance / df for variance, df in seed_parts) + item_part * item_part / max(items - 1, 1)
    df = total * total / spread
    return float(2 * stats.t.sf(abs(point) / np.sqrt(total), df))


def _terms(
    weights: list[float], resampled: list[np.ndarray], at_seeds: list[np.ndarray], seeds: list[tuple]
) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """``seed_level_p``'s terms: one, their weighted sum, when every term has the same seeds (paired by seed)."""
    if len(set(seeds)) == 1:
        paired = sum(w * r for w, r in zip(weights, resampled))
        return [(1.0, paired, sum(w * np.asarray(v, float) for w, v in zip(weights, at_seeds)))]
    return [(w, r, np.asarray(v, float)) for w, r, v in zip(weights, resampled, at_seeds)]


def _result(point: float, totals: np.ndarray, items: int, seeds: list[tuple], p_value: float) -> Bootstrap:
    low, high = np.percentile(totals, [2.5, 97.5])
    return Bootstrap(
        float(point),
        float(low),
        float(high),
        p_value,
        items,
        min(len(s) for s in seeds),
        len(totals),
        len(set(seeds)) == 1,
    )


def hierarchical_bootstrap(
    better: pd.DataFrame, worse: pd.DataFrame, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED, label: str = ""
) -> Bootstrap:
    """Mean per-item metric of ``better`` minus ``worse`` (each a seeds x items frame: one row per seed, one column
    per test item), resampling seeds and the items both sides scored (columns without a missing value) together."""
    items = [
        c for c in better.columns.intersection(worse.columns) if better[c].notna().all() and worse[c].notna().all()
    ]
    if not items:
        raise DataError(f"bootstrap {label!r}: the two sides share no scored item")
    rng = np.random.default_rng(derive_seed(seed, label))
    weights = _item_weights(rng, len(items), resamples) / len(items)
    sides = [better[items].to_numpy(float), worse[items].to_numpy(float)]
    labels = [tuple(better.index), tuple(worse.index)]
    resampled = [weights @ side.T for side in sides]
    a, b = _seed_means(resampled, labels, rng)
    point = sides[0].mean() - sides[1].mean()
    terms = _terms([1.0, -1.0], resampled, [side.mean(axis=1) for side in sides], labels)
    return _result(point, a - b, len(items), labels, seed_level_p(point, terms, len(items)))


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


def bootstrap_contrast(
    terms: list[tuple[float, str, Mapping[int, pd.DataFrame]]],
    positive: dict[str, list[str]],
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Bootstrap:
    """Hierarchical bootstrap of sum_i weight_i * (micro-F1 of term i, averaged over its seeds).

    Each term is (weight, test set, {seed: predictions}). Each resample draws the seeds with replacement (one draw
    shared by every term when all terms have the same seeds, so the comparison is paired by seed) and the sentences
    of each test set with replacement (those every term on it scored, matched by sentence_id; shared by all its
    terms and seeds, so it is paired by sentence too); a contrast over several test sets resamples each
    independently. A difference A - B is [(1, d, A), (-1, d, B)].
    """
    if not terms or any(not frames for _, _, frames in terms):
        raise DataError("bootstrap: a term has no predictions")
    per_seed, seeds, weights_of, point, sentences, at_seeds = [], [], [], 0.0, 0, []
    for group in sorted({g for _, g, _ in terms}):
        members = [(w, frames) for w, g, frames in terms if g == group]
        ids = sorted(set.intersection(*[set(f["sentence_id"]) for _, frames in members for f in frames.values()]))
        if not ids:
            raise DataError(f"bootstrap: the predictions on test set {group!r} share no sentence")
        rng = np.random.default_rng(derive_seed(seed, group))
        weights = _item_weights(rng, len(ids), resamples)
        for weight, frames in members:
            labels = tuple(sorted(frames))
            counts = [
                sentence_counts(
                    *frames[s].set_index("sentence_id").loc[ids, ["label", "predicted"]].to_numpy().T, positive[group]
                )
                for s in labels
            ]
            resampled = (weights @ np.concatenate(counts, axis=1)).reshape(resamples, len(labels), 3)
            per_seed.append(_f1(resampled))
            seeds.append(labels)
            weights_of.append(weight)
            at_seeds.append(np.array([_f1(c.sum(axis=0)) for c in counts]))
            point += weight * float(at_seeds[-1].mean())
        sentences += len(ids)
    means = _seed_means(per_seed, seeds, np.random.default_rng(derive_seed(seed, "seeds")))
    totals = sum(weight * mean for weight, mean in zip(weights_of, means))
    terms = _terms(weights_of, per_seed, at_seeds, seeds)
    return _result(point, totals, sentences, seeds, seed_level_p(point, terms, sentences))


def bootstrap_difference(
    better: Mapping[int, pd.DataFrame],
    worse: Mapping[int, pd.DataFrame],
    positive: list[str],
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Bootstrap:
    """Micro-F1 of ``better`` minus ``worse`` on one test set ({seed: predictions} each), hierarchical bootstrap."""
    return bootstrap_contrast([(1.0, "test", better), (-1.0, "test", worse)], {"test": positive}, resamples, seed)
