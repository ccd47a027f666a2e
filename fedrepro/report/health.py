"""How every report shows the shared health rule (``fedrepro.fl.health``): one set of marks and one flagged-cells
table, so a diverged or unconverged cell reads the same in each paper's tables."""

from __future__ import annotations

from typing import Iterable

import pandas as pd

MARKS = {"diverged": " †", "oscillating": " ~", "not converged": " °"}
"""health label -> the mark after a table cell's number, worst first. These are the unsound labels: no verdict rests on
a cell that has one (``fedrepro.report.claims.Claim.rests_on``)."""

UNSOUND = tuple(MARKS)
"""The health labels that void a verdict resting on the cell, worst first."""

LEGEND = "† a cell diverged, ~ a cell oscillated, ° a cell had not converged"
"""The marks' legend, as every report states it before quoting the rule."""


def mark_of(labels: Iterable[str]) -> str:
    """† if any of the cells' health labels is diverged, ~ if any oscillated, ° if any is not converged, else
    nothing."""
    labels = set(labels)
    return next((mark for label, mark in MARKS.items() if label in labels), "")


def flagged_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Every cell that diverged, oscillated or had not converged, once, with the rule's reason: name, health, why.
    ``cells`` has a row per (cell, place it is reported in) with name, health and health_why."""
    flagged = cells[cells["health"].isin(list(MARKS))].drop_duplicates("name")
    return flagged[["name", "health", "health_why"]].rename(columns={"health_why": "why"}).sort_values("name")
