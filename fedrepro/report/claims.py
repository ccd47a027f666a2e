"""One claims row for every paper: the finding as the paper states it, what was measured, the verdict and the test
behind it, so the three claims tables share their columns, their verdict words (``statistics.VERDICTS``) and one
correction for the number of claims (Holm's, over every claim of a report whose verdict its p-value decides)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from statsmodels.stats.multitest import multipletests

from fedrepro.report.statistics import (ALPHA, BOOTSTRAP_SEED, HOLDS, INCONCLUSIVE, MIN_SEEDS, NOT_SIGNIFICANT, NOT_TESTABLE, RESAMPLES,
                                        REVERSED, VERDICTS, Bootstrap, verdict_from_p, too_few_seeds, worded)

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
    """the raw two-sided p-value of a tested claim; Holm's correction adjusts it across the report, unless the claim
    is already inconclusive (too few seeds, or voided by ``inconclusive``)."""

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


def holm(p_values: list[float], alpha: float = ALPHA) -> list[float]:
    """Holm-adjusted p-values (statsmodels' ``multipletests``), in the given order."""
    if not p_values:
        return []
    return [float(p) for p in multipletests(p_values, alpha=alpha, method="holm")[1]]


def _p_text(p: float) -> str:
    return "< 0.0001" if p < 1e-4 else f"= {p:.3g}"


def claims_frame(claims: list[Claim]) -> pd.DataFrame:
    """The claims table, one row per claim in the given order. Holm's family is the claims whose verdict their
    p-value decides (a p-value and no verdict yet): the test column gives their raw and adjusted p, and the verdict
    follows the adjusted p. A claim already inconclusive keeps its raw p, outside the family, which it would only
    enlarge (a larger adjustment of the others) without a verdict of its own to correct."""
    tested = [claim for claim in claims if claim.p_value is not None and claim.verdict is None]
    adjusted = dict(zip(map(id, tested), holm([claim.p_value for claim in tested])))
    rows = []
    for claim in claims:
        verdict, test = claim.verdict, claim.test
        if id(claim) in adjusted:
            p = adjusted[id(claim)]
            test = f"{test}; p {_p_text(claim.p_value)}, Holm-adjusted over {len(tested)} tested claims: p {_p_text(p)}"
            verdict = verdict_from_p(claim.difference, p)
        elif claim.p_value is not None:
            test = f"{test}; p {_p_text(claim.p_value)}, outside Holm's family (the claim is already {INCONCLUSIVE})"
        if verdict is None:
            raise ValueError(f"claim {claim.finding!r} has neither a verdict nor a p-value")
        rows.append([claim.finding, claim.measured, verdict, test])
    return pd.DataFrame(rows, columns=COLUMNS)


def tests_explained(claims: pd.DataFrame) -> str:
    """The sentence every claims table opens with: the unit, the test, the correction and the vocabulary."""
    family = int(claims["test"].str.contains("Holm-adjusted").sum())
    return (f"The unit of every test is the seed: a contrast is tested by a hierarchical bootstrap ({RESAMPLES} resamples, "
            f"seed {BOOTSTRAP_SEED}) that draws the seeds with replacement (the same seeds on both sides when they share "
            "them) and the test items with replacement together, with a two-sided p-value from the bootstrap's standard "
            f"error (sign tests over matched cells where the claim is about cells). Holm's correction runs over this "
            f"report's {family} tested claims (a claim already inconclusive keeps its raw p, outside the family), and a "
            f"verdict follows the adjusted p at {ALPHA:g}. Verdicts: "
            f"**{HOLDS}**; **{REVERSED}** (significant the other way); **{NOT_SIGNIFICANT}**; **{INCONCLUSIVE}** (why: "
            f"fewer than {MIN_SEEDS} seeds, a diverged or unconverged cell it rests on, no measurable target); "
            f"**{NOT_TESTABLE}** (why). 'Direction only' marks a verdict the numbers show without a test.")


def verdict_counts(claims: pd.DataFrame) -> str:
    """How many claims rows got each verdict, in the vocabulary's order."""
    counts = [(int(claims["verdict"].str.startswith(word).sum()), word) for word in VERDICTS]
    return f"Of {len(claims)} claims rows: " + ", ".join(f"{n} {word}" for n, word in counts) + "."
