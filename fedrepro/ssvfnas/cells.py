"""The cells of SS-VFNAS's grid. A search cell is one run of a method: (method, dataset, K, DP level, seed) ->
pre-search (ss_ methods) -> collaborative search -> derived genotypes -> retrain -> test accuracy. A baseline cell
trains the hand-designed network once per (dataset, K, DP level, seed) with the same retraining.

A dataset runs at every K of ``ssvfnas.parties`` its data allows (``fedrepro.data.vertical.vertical_views``): the
digits in halves at K = 2 and in quarters at K = 4, a FATE set at guest + its hosts. The (dataset, K) pairs it
does not allow are listed by ``skipped_partitions`` for the report. A label-alone cell trains the label party's own
network on its own features once per (dataset, K, seed), with no DP level: nothing crosses.  ``retrain_health`` judges a
finished cell by the shared health rule (``fedrepro.fl.health``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedrepro.config import Params, check_names
from fedrepro.data.vertical import vertical_views
from fedrepro.fl.health import Health, cell_health
from fedrepro.ssvfnas.methods import BASELINE, LABEL_ALONE, METHODS


@dataclass(frozen=True)
class Cell:
    method: str
    dataset: str
    parties: int
    sigma_forward: float
    sigma_backward: float
    seed: int

    @property
    def partition(self) -> str:
        """Folder of the partition this cell runs on (shared by every method, DP level and seed)."""
        return f"{self.dataset}-k{self.parties}"

    @property
    def dp(self) -> str:
        if self.sigma_forward == 0 and self.sigma_backward == 0:
            return "nodp"
        return f"dp{self.sigma_forward:g}-{self.sigma_backward:g}"

    @property
    def name(self) -> str:
        return f"{self.partition}-{self.dp}-{self.method}-s{self.seed}"

    @property
    def baseline(self) -> bool:
        return self.method == BASELINE

    @property
    def label_alone(self) -> bool:
        return self.method == LABEL_ALONE

    @property
    def rule(self) -> str | None:
        """The search rule; None for the cells that search nothing (the baseline, the label party alone)."""
        return METHODS[self.method][0] if self.method in METHODS else None

    @property
    def presearch(self) -> bool:
        return METHODS[self.method][1] if self.method in METHODS else False


def dp_name(level: list[float] | tuple[float, float]) -> str:
    return Cell("", "", 0, float(level[0]), float(level[1]), 0).dp


def partitions(params: Params) -> list[tuple[str, int, str]]:
    """(dataset, K, prepared vertical set) of every partition the grid runs on, in the params' order."""
    out = []
    for dataset in params.ssvfnas.datasets:
        views = vertical_views(dataset, params.data.vertical_sets.get(dataset))
        out += [(dataset, k, views[k]) for k in params.ssvfnas.parties if k in views]
    return out


def skipped_partitions(params: Params) -> list[tuple[str, int, list[int]]]:
    """(dataset, K, the K values it allows) for each asked K a dataset cannot run at."""
    out = []
    for dataset in params.ssvfnas.datasets:
        views = vertical_views(dataset, params.data.vertical_sets.get(dataset))
        out += [(dataset, k, sorted(views)) for k in params.ssvfnas.parties if k not in views]
    return out


def _cells(params: Params, methods: list[str]) -> list[Cell]:
    ss = params.ssvfnas
    return [
        Cell(method, dataset, k, float(level[0]), float(level[1]), seed)
        for method in methods
        for dataset, k, _ in partitions(params)
        for level in ss.dp_levels
        for seed in ss.seeds
    ]


def table_cells(params: Params) -> list[Cell]:
    """The main table: method x (dataset, K) x DP level x seed."""
    check_names("ssvfnas.methods", params.ssvfnas.methods, METHODS)
    return _cells(params, list(params.ssvfnas.methods))


def baseline_cells(params: Params) -> list[Cell]:
    """The hand-designed baseline: once per (dataset, K) x DP level x seed."""
    return _cells(params, [BASELINE])


def label_alone_cells(params: Params) -> list[Cell]:
    """The label party alone: once per (dataset, K) x seed, at no DP level (it sends nothing)."""
    return [
        Cell(LABEL_ALONE, dataset, k, 0.0, 0.0, seed)
        for dataset, k, _ in partitions(params)
        for seed in params.ssvfnas.seeds
    ]


def all_cells(params: Params) -> list[Cell]:
    return table_cells(params) + baseline_cells(params) + label_alone_cells(params)


def retrain_health(curve: list[dict]) -> Health:
    """A cell's health by the shared rule: its retraining's validation points (``retrain.curve``: mean training loss as
    the rounds, held-out accuracy as the scores). The retraining is judged because the tables report its accuracy."""
    return cell_health([p["train_loss"] for p in curve], [p["valid_accuracy"] for p in curve])
