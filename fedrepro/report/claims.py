"""One claims row for every paper: the finding as the paper states it, what was measured, the verdict and the test
behind it, so the three claims tables share their columns and a finding this scale does not test reads alike."""

from __future__ import annotations

from dataclasses import astuple, dataclass

import pandas as pd

NOT_RUN = "not run at this scale"
COLUMNS = ["finding (paper)", "measured", "verdict", "test"]
"""The claims table's columns, in the order of ``Claim``'s fields."""


@dataclass
class Claim:
    """One row of a claims table: a finding the paper states and what this run says of it."""

    finding: str
    """as the paper states it (ANCHORS.md)."""
    measured: str
    verdict: str
    """follows the numbers: holds / does not hold / not significant, or why there is none."""
    test: str = "-"

    @classmethod
    def not_run(cls, finding: str, why: str | None = None, *, verdict: str = NOT_RUN, lead: str = NOT_RUN) -> Claim:
        """A finding this scale's grid does not test, and no test run: 'measured' gives ``lead`` and why (after ': ').
        FedMatch's sweep rows word it their own way (no lead, verdict 'not tested here'), kept as the reports have it."""
        measured = lead if why is None else f"{lead}: {why}" if lead else why
        return cls(finding, measured, verdict)


def claims_frame(claims: list[Claim]) -> pd.DataFrame:
    """The claims table, one row per claim in the given order."""
    return pd.DataFrame([astuple(claim) for claim in claims], columns=COLUMNS)
