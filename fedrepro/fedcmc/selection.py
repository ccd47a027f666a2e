"""Picking cells out of ``FedCMCResults`` and naming them: the selectors (by group and fields, per seed, per round),
the main-table and figure points, the health mark of a selection, and how a score, a method or a corpus is written.
Every table, figure and claim selects and formats the same way, so these live apart from any one of them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.fedcmc.paper import DATASET_LABELS
from fedrepro.fedcmc.results import FedCMCResults
from fedrepro.fl.algorithms import REGISTRY
from fedrepro.metrics.summary import mean_std
from fedrepro.report.health import mark_of


LABELS = {name: algorithm.label for name, algorithm in REGISTRY.items()}


def percent(value: float) -> str:
    """A 0-1 score as a percentage with two decimals, the unit of every FedCMC table."""
    return f"{100 * value:.2f}"


def points_text(value: float) -> str:
    return f"{100 * value:+.2f}"


def mean_std_percent(values: list[float]) -> str:
    """'mean ± std' in % over seeds (the mean alone for one seed)."""
    mean, std = mean_std(values)
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if len(values) > 1 else f"{100 * mean:.2f}"


def method_label(method: str) -> str:
    """The paper's name of a method (the params' key where it has none)."""
    return LABELS.get(method, method)


def dataset_label(dataset: str) -> str:
    """The paper's name of a corpus (the params' key for one it does not use)."""
    return DATASET_LABELS.get(dataset, dataset)


def selected(data: FedCMCResults, group: str, **fields) -> pd.DataFrame:
    frame = data.cells[data.cells.group == group]
    for name, value in fields.items():
        frame = frame[frame[name].isna()] if value is None else frame[frame[name] == value]
    return frame.sort_values("seed", kind="stable")


def values_of(data: FedCMCResults, group: str, metric: str = "micro_f1", **fields) -> list[float]:
    """The selected cells' ``metric``, one value per seed in seed order."""
    return selected(data, group, **fields)[metric].tolist()


def mean_of(data: FedCMCResults, group: str, metric: str = "micro_f1", **fields) -> float:
    """The selected cells' mean ``metric`` over seeds; NaN where the grid has none."""
    values = values_of(data, group, metric, **fields)
    return float(np.mean(values)) if values else float("nan")


def prediction_frames(data: FedCMCResults, group: str, **fields) -> dict[int, pd.DataFrame]:
    """seed -> test predictions of the selected cells: the bootstrap's terms, paired by seed."""
    chosen = selected(data, group, **fields)
    return {int(seed): data.predictions[key] for seed, key in zip(chosen["seed"], chosen["key"])}


def point_name(dataset: str, alpha: float) -> str:
    """How the report names a main-table point: dataset and α."""
    return f"{dataset} α={alpha:g}"


def main_points(params: Params) -> list[tuple[str, float]]:
    """The main table's dataset x α points, in the params' order."""
    return [(d, a) for d in params.fedcmc.datasets for a in params.fedcmc.alphas]


def figure_point(params: Params) -> tuple[str, float] | None:
    """(dataset, alpha) of Fig 3a and the communication table: the sweeps' point if the main table has it."""
    fc = params.fedcmc
    if fc.sweeps.dataset in fc.datasets and fc.sweeps.alpha in fc.alphas:
        return fc.sweeps.dataset, fc.sweeps.alpha
    return None


def curve_of(data: FedCMCResults, group: str, metric: str = "micro_f1", **fields) -> pd.Series:
    """Test ``metric`` per round, mean over the selected cells (seeds); evaluated rounds only."""
    keys = selected(data, group, **fields)["key"]
    frame = data.rounds[data.rounds.key.isin(keys)]
    return frame.groupby("round")[metric].mean().dropna()


def rounds_to_target(curve: pd.Series, target: float) -> int | None:
    """The first evaluated round (index) whose test micro-F1 reaches ``target``; None if none does."""
    curve = curve.dropna().sort_index()
    reached = curve[curve >= target]
    return int(reached.index[0]) if len(reached) else None


def rounds_text(rounds: int | None, total: int) -> str:
    return str(rounds) if rounds is not None else f"not reached in {total} rounds"


def health_mark(data: FedCMCResults, group: str, **fields) -> str:
    """The worst mark of the selected cells' health (``fedrepro.report.health.mark_of``)."""
    return mark_of(selected(data, group, **fields)["health"])
