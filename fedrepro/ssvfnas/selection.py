"""Picking cells out of ``SSVFNASResults`` and naming them: the selector, the trivial rows' names and the margin over
the majority class, the label-party-alone cells a partition has, the DP levels with noise, and how a method, a DP
level, an accuracy or a byte count is written. The tables, figures and claims select and format the same way, so
these live apart from any one of them."""

from __future__ import annotations

import math

import pandas as pd

from fedrepro.config import Params
from fedrepro.ssvfnas.cells import BASELINE
from fedrepro.ssvfnas.results import SSVFNASResults


LABELS = {
    "vfnas1": "VFNAS-1",
    "vfnas2": "VFNAS-2",
    "ss_vfnas1": "SS-VFNAS-1",
    "ss_vfnas2": "SS-VFNAS-2",
    BASELINE: "hand-designed",
}
MAJORITY, ALONE = "trivial: majority class", "trivial: label party alone"
CHANCE_MARGIN = 0.01
"""cells 'clearly beat' the majority class of their dataset-K when their seed-mean test accuracy is at least this far
above its majority rate; a claim compares no cells that do not (they learned nothing it could compare), and a target
accuracy counts on a dataset-K only when it is this far above the majority rate (below, answering the majority class
already reaches it)."""


def method_label(method: str) -> str:
    """The paper's name of a method (the hand-designed baseline named as such)."""
    return LABELS.get(method, method)


def select_cells(data: SSVFNASResults, **fields) -> pd.DataFrame:
    """The cells whose fields equal the given values."""
    frame = data.cells
    for name, value in fields.items():
        frame = frame[frame[name] == value]
    return frame.sort_values("seed", kind="stable")


def label_alone_accuracy(data: SSVFNASResults, params: Params, partition: str) -> pd.DataFrame | None:
    """The partition's label-alone cells, or None unless every seed's has run (a mean over some seeds would mislead)."""
    cells = data.label_alone[data.label_alone.partition == partition]
    return cells if len(cells) == len(params.ssvfnas.seeds) else None


def percent(value: float) -> str:
    """A 0-1 accuracy in % with two decimals; '-' where there is none."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.2f}"


def megabytes(value: float) -> str:
    return f"{value / 1e6:.3f}"


def dp_level_text(level: list[float]) -> str:
    """How the report names a DP level: 'no DP' or the two noise multipliers."""
    s1, s2 = level
    if s1 == 0 and s2 == 0:
        return "no DP"
    return f"σ1 = {s1:g}, σ2 = {s2:g}"


def noisy_levels(params: Params) -> list[list[float]]:
    """The DP levels with noise on both sides, the ones epsilon is accounted for."""
    return [lvl for lvl in params.ssvfnas.dp_levels if lvl[0] > 0 and lvl[1] > 0]
