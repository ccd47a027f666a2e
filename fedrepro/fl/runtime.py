"""Which runtime trains a cell: the in-process engine, or Flower (simulation on Ray, or a real deployment).

A cell is described by a ``CellRecipe``: what every side of a federation needs to rebuild the very same
task, algorithm and settings in its own process. The engine builds it once; on Flower the server and every
node build it again from the recipe (no model or state is shipped to them), so an algorithm that runs in
the engine runs on Flower unchanged. Stages only see an ``Engine``: the Flower runtimes are subclasses with
the same evaluation methods, histories and checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedrepro.config import RUNTIMES
from fedrepro.errors import ConfigError
from fedrepro.fl.algorithm import Algorithm, CommonSettings, FederatedTask
from fedrepro.fl.algorithms import build_algorithm
from fedrepro.fl.engine import Engine, EngineSettings
from fedrepro.seeding import seed_everything


@dataclass(frozen=True)
class CellRecipe:
    """Everything that shapes one training run, in a form another process can rebuild it from.

    ``build_task`` must be picklable (a module-level function, or a ``functools.partial`` of one with
    picklable arguments and absolute paths): Flower's simulation sends the recipe to its Ray workers.
    """

    build_task: Callable[[], FederatedTask]
    algorithm: str
    algorithm_settings: Algorithm.Settings
    """The algorithm's own knobs (its ``Settings``)."""
    common: CommonSettings
    settings: EngineSettings
    fingerprint: str
    """Changes whenever anything that shapes the run changes; checkpoints and node states carry it."""
    threads: int
    """torch threads in every process that trains or aggregates (reduction order, and so the bits, depend on it)."""
    spec: dict | None = None
    """How a process that shares nothing with this one rebuilds the recipe: ``{"factory": "module:function",
    "kwargs": {...}}`` in JSON, ``factory(**kwargs)`` returning an equal recipe (a deployment's apps need it)."""

    def build(self) -> tuple[FederatedTask, Algorithm]:
        """Seed this process as the engine's cells always have, then build the task and the algorithm."""
        seed_everything(self.settings.seed, self.threads)
        return self.build_task(), build_algorithm(self.algorithm, self.algorithm_settings, self.common)


def build_runtime(recipe: CellRecipe, runtime: str, checkpoint_dir: str | Path, progress: bool = True,
                  on_round_end: Callable[[dict[str, Any]], None] | None = None) -> Engine:
    """The runtime that trains ``recipe``; it resumes from ``checkpoint_dir`` when that holds this very run.

    A method that shares nothing (individual, centralised, CoverQuery) has no federation to run, so every
    runtime trains it in process.
    """
    if runtime not in RUNTIMES:
        raise ConfigError(f"train.runtime = {runtime!r}: allowed {list(RUNTIMES)}")
    task, algorithm = recipe.build()
    if runtime == "engine" or not algorithm.federated:
        return Engine(task, algorithm, recipe.settings, checkpoint_dir, recipe.fingerprint, progress, on_round_end)
    if runtime == "flower-simulation":
        from fedrepro.fl.flower.simulation import FlowerSimulation

        return FlowerSimulation(recipe, task, algorithm, checkpoint_dir, progress, on_round_end)
    from fedrepro.fl.flower.deployment import FlowerDeployment

    return FlowerDeployment(recipe, task, algorithm, checkpoint_dir, progress)
