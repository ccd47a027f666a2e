"""The cells of FedMatch's grid: one (method, seed) per table row, one (sweep point, method, seed) per figure point.

A cell sees the params with its sweep point applied (``cell_params``), so the same engine code runs every
table row and every figure point. ``history_health`` judges a finished cell by the shared health rule
(``fedrepro.fl.health``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedrepro.config import Params, check_names
from fedrepro.fedmatch.methods import FIGURE_METHOD, METHODS
from fedrepro.fl.health import Health, cell_health, training_losses

SWEEPS = {
    "shared_layers": "Fig 5: encoder layers shared (the layers above are private)",
    "patch_size": "Fig 6: patch size r",
    "aggregate_every": "Fig 7: local epochs between aggregations",
    "data_ratio": "Fig 8: share of each client's training questions used",
}


@dataclass(frozen=True)
class Cell:
    method: str
    seed: int
    sweep: str | None = None
    value: str | None = None
    """The sweep point exactly as params.yaml (and so DVC's matrix) spells it, e.g. ``64`` or ``0.2``."""

    @property
    def name(self) -> str:
        """Folder name of the cell's outputs: ``<method>-<seed>`` or ``<sweep>-<value>-<method>-<seed>``."""
        if self.sweep is None:
            return f"{self.method}-{self.seed}"
        return f"{self.sweep}-{self.value}-{self.method}-{self.seed}"


def check_methods(params: Params) -> None:
    """Every method FedMatch's params name is one of ``METHODS`` (a ConfigError names the first that is not)."""
    check_names("fedmatch.methods", params.fedmatch.methods, METHODS)
    check_names("fedmatch.sweeps.data_ratio_methods", params.fedmatch.sweeps.data_ratio_methods, METHODS)


def table_cells(params: Params) -> list[Cell]:
    check_methods(params)
    return [Cell(m, s) for m in params.fedmatch.methods for s in params.fedmatch.seeds]


def sweep_cells(params: Params) -> list[Cell]:
    check_methods(params)
    sweeps = params.fedmatch.sweeps
    cells = []
    for sweep in SWEEPS:
        methods = sweeps.data_ratio_methods if sweep == "data_ratio" else [FIGURE_METHOD]
        for value in getattr(sweeps, sweep):
            cells += [Cell(m, s, sweep, str(value)) for m in methods for s in sweeps.seeds]
    return cells


def cell_params(params: Params, cell: Cell) -> Params:
    """The params as this cell runs them: its sweep point applied (data_ratio is applied to the task instead)."""
    if cell.sweep in ("shared_layers", "patch_size"):
        settings = params.fedmatch.settings.model_copy(update={cell.sweep: int(cell.value)})
        return params.model_copy(update={"fedmatch": params.fedmatch.model_copy(update={"settings": settings})})
    if cell.sweep == "aggregate_every":
        every = int(cell.value)
        train = params.train.model_copy(update={"local_epochs": every, "rounds": aggregation_epochs(params) // every})
        return params.model_copy(update={"train": train})
    return params


def aggregation_epochs(params: Params) -> int:
    """Fig 7's budget of local epochs, the same at every point: the smallest multiple of every period E of the
    sweep that is at least ``train.rounds`` (4 rounds, E in 1-3: 6 epochs). Shrinking the rounds to ceil(rounds / E)
    instead gave E = 3 six epochs against E = 1's four, so the figure mixed the period with the training length."""
    periods = (
        math.lcm(*(int(e) for e in params.fedmatch.sweeps.aggregate_every))
        if params.fedmatch.sweeps.aggregate_every
        else 1
    )
    return periods * math.ceil(params.train.rounds / periods)


def training_weight(params: Params, cell: Cell) -> float:
    """The cell's training in table cells' worth: Fig 7's points train ``aggregation_epochs`` local epochs, Fig 8's a
    share of the questions. What a grid starts first (the longest) and a snapshot's plan counts."""
    if cell.sweep == "aggregate_every":
        return aggregation_epochs(params) / (params.train.rounds * params.train.local_epochs)
    if cell.sweep == "data_ratio":
        return float(cell.value)
    return 1.0


def history_health(history: list[dict]) -> Health:
    """A cell's health from its history: the evaluated models' loss on their training data (the round's mean local
    loss where none was evaluated), and the validation MRR averaged over the clients in the rounds that were
    evaluated (``train.eval_every``; none at 0, so convergence is unknown)."""
    valid = [float(np.mean([m["mrr"] for m in r["valid"].values()])) for r in history if r.get("valid")]
    return cell_health(training_losses(history), valid)
