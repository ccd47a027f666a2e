"""One claims row for every paper: the finding as the paper states it, what was measured, the verdict and the test
behind it, so the three claims tables share their columns, their verdict words (``statistics.VERDICTS``) and one
correction for the number of claims (Holm's, over every claim of a report that has a p-value)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import pandas as pd
from statsmodels.stats.multitest import multipletests

from fedrepro.report.health import UNSOUND
from fedrepro.report.statistics import (
    ALPHA,
    BOOTSTRAP_SEED,
    HOLDS,
    INCONCLUSIVE,
    MIN_SEEDS,
    NOT_SIGNIFICANT,
    NOT_TESTABLE,
    RESAMPLES,
    REVERSED,
    VERDICTS,
    Bootstrap,
    verdict_from_p,
    too_few_seeds,
    worded,
)

COLUMNS = ["finding (paper)", "measured", "verdict", "test"]
"""The claims table's columns."""


@dataclass
class Claim:
    """One row of a claims table: a finding the paper states and what this run says of it."""

    finding: str
    """as the paper states it (ANCHORS.md)."""
    measured: str
    verdict: str | None = None
    """a word of ``statistics.VERDICTS`` with why; None for a tested claim, whose verdict ``claims_frame`` derives from
    its Holm-adjusted p-value."""
    test: str = "-"
    difference: float | None = None
    """the contrast the finding says is positive (its sign decides holds / reversed)."""
    p_value: float | None = None
    """the raw two-sided p-value of a tested claim; Holm's correction adjusts it across the report, whether or not the
    claim is already inconclusive (too few seeds, or voided by ``inconclusive``)."""

    @classmethod
    def tested(cls, finding: str, measured: str, test: str, difference: float, p_value: float, seeds: int) -> Claim:
        """A claim with a test: its verdict waits for Holm's correction, unless it has too few seeds for one."""
        few = too_few_seeds(seeds)
        return cls(finding, measured, worded(INCONCLUSIVE, few) if few else None, test, difference, p_value)

    @classmethod
    def from_bootstrap(cls, finding: str, measured: str, test: str, result: Bootstrap) -> Claim:
        return cls.tested(finding, measured, test, result.difference, result.p_value, result.seeds)

    @classmethod
    def not_testable(cls, finding: str, why: str, measured: str = "-") -> Claim:
        """A finding this scale's grid cannot test, and why."""
        return cls(finding, measured, worded(NOT_TESTABLE, why))

    def inconclusive(self, why: str) -> None:
        """The claim rests on something that voids its test (a diverged cell, a reference at chance): say so; a claim
        the grid cannot test stays so."""
        if not (self.verdict or "").startswith(NOT_TESTABLE):
            self.verdict = worded(INCONCLUSIVE, why)

    def rests_on(self, cells: Iterable[tuple[str, str]]) -> Claim:
        """The rule on sound cells, for every paper: a claim resting on a cell whose health label is unsound
        (``fedrepro.report.health.UNSOUND``: diverged, oscillating, not converged) is inconclusive, and its verdict
        names them, worst label first. ``cells`` is (name, health label) for every cell (or table row) it rests on."""
        names: dict[str, set[str]] = {}
        for name, label in cells:
            if label in UNSOUND:
                names.setdefault(label, set()).add(name)
        if names:
            self.inconclusive(
                "rests on "
                + "; ".join(f"{label}: {', '.join(sorted(names[label]))}" for label in UNSOUND if label in names)
            )
        return self

    def against_reference(self, reference: str, value: float, chance: float, margin: float, metric: str) -> Claim:
        """The rule on references, for every paper: a claim that a method beats a reference whose score (``value``)
        is less than ``margin`` above its trivial baseline (``chance``) is inconclusive: beating a model that learned
        nothing says nothing of the method."""
        if value - chance < margin:
            self.inconclusive(
                f"the reference {reference} is at chance: {metric} {value:.3f} vs {chance:.3f} (needs {margin:g} above)"
            )
        return self


def holm(p_values: list[float], alpha: float = ALPHA) -> list[float]:
    """Holm-adjusted p-values (statsmodels' ``multipletests``), in the given order."""
    if not p_values:
        return []
    return [float(p) for p in multipletests(p_values, alpha=alpha, method="holm")[1]]


def _p_text(p: float) -> str:
    return "< 0.0001" if p < 1e-4 else f"= {p:.3g}"


def claims_frame(claims: list[Claim]) -> pd.DataFrame:
    """The claims table, one row per claim in the given order. Holm's family is every claim with a p-value: the test
    column gives its raw and adjusted p, and a claim without a verdict yet takes the adjusted p's. A claim already
    inconclusive (too few seeds, a diverged cell) stays in the family and keeps its verdict: which claims turn out
    inconclusive depends on the run, and a family that dropped them would correct the others less than the number
    of comparisons the report made."""
    tested = [claim for claim in claims if claim.p_value is not None]
    adjusted = dict(zip(map(id, tested), holm([claim.p_value for claim in tested])))
    rows = []
    for claim in claims:
        verdict, test = claim.verdict, claim.test
        if id(claim) in adjusted:
            p = adjusted[id(claim)]
            test = (
                f"{test}; p {_p_text(claim.p_value)}, Holm-adjusted over {len(tested)} claims with a p-value: "
                f"p {_p_text(p)}"
            )
            verdict = verdict if verdict is not None else verdict_from_p(claim.difference, p)
        if verdict is None:
            raise ValueError(f"claim {claim.finding!r} has neither a verdict nor a p-value")
        rows.append([claim.finding, claim.measured, verdict, test])
    return pd.DataFrame(rows, columns=COLUMNS)


def tests_explained(claims: pd.DataFrame) -> str:
    """The sentence every claims table opens with: the unit, the test, the correction and the vocabulary."""
    family = int(claims["test"].str.contains("Holm-adjusted").sum())
    return (
        f"The unit of every test is the seed: a contrast is tested by a hierarchical bootstrap ({RESAMPLES} resamples, "
        f"seed {BOOTSTRAP_SEED}) that draws the seeds with replacement (the same seeds on both sides when they share "
        "them) and the test items with replacement together for its interval; its two-sided p adds the seeds' "
        "variance (s^2 / n over n seeds) to what the test items add beyond it and reads Student's t with "
        "Welch-Satterthwaite degrees of freedom, n - 1 where the seeds dominate, as a paired t-test over seeds would "
        f"(sign tests over matched cells where the claim is about cells). Holm's correction runs over all "
        f"{family} of this report's claims with a p-value (those already inconclusive included: they keep their "
        f"verdict), and a verdict follows the adjusted p at {ALPHA:g} (significant at p <= {ALPHA:g}). Verdicts: "
        f"**{HOLDS}**; **{REVERSED}** (significant the other way); **{NOT_SIGNIFICANT}**; **{INCONCLUSIVE}** (why: "
        f"fewer than {MIN_SEEDS} seeds, a diverged or unconverged cell it rests on, no measurable target); "
        f"**{NOT_TESTABLE}** (why). 'Direction only' marks a verdict the numbers show without a test."
    )


def verdict_counts(claims: pd.DataFrame) -> str:
    """How many claims rows got each verdict, in the vocabulary's order."""
    counts = [(int(claims["verdict"].str.startswith(word).sum()), word) for word in VERDICTS]
    return f"Of {len(claims)} claims rows: " + ", ".join(f"{n} {word}" for n, word in counts) + "."
