"""Which runtime trains a cell (``train.runtime``): the in-process engine, or Flower (simulation on Ray, or a real
deployment), all from the cell's ``CellRecipe`` (``fedrepro.fl.recipe``). Callers only see an ``Engine``: the Flower
runtimes are subclasses with the same evaluation methods, histories and checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ContextManager

from fedrepro.config import RUNTIMES
from fedrepro.errors import ConfigError
from fedrepro.fl.algorithms import REGISTRY
from fedrepro.fl.engine import Engine
from fedrepro.fl.flower.ray_head import simulated_stage
from fedrepro.fl.recipe import CellRecipe


def build_runtime(
    recipe: CellRecipe,
    runtime: str,
    checkpoint_dir: str | Path,
    progress: bool = True,
    on_round_end: Callable[[dict[str, Any]], None] | None = None,
    reply_timeout: float | None = None,
    run_timeout: float = 86400,
) -> Engine:
    """The runtime that trains ``recipe``; it resumes from ``checkpoint_dir`` when that holds this very run.
    ``reply_timeout`` (``train.reply_timeout``) bounds how long a deployment's server waits for a round's replies,
    ``run_timeout`` (``train.run_timeout``) how long its whole run may take.

    A method that shares nothing (individual, centralised, CoverQuery) has no federation to run, so every
    runtime trains it in process.
    """
    if runtime not in RUNTIMES:
        raise ConfigError(f"train.runtime = {runtime!r}: allowed {list(RUNTIMES)}")
    federated = recipe.algorithm not in REGISTRY or REGISTRY[recipe.algorithm].federated  # unknown: build() says so
    if runtime == "engine" or not federated:
        task, algorithm = recipe.build()
        return Engine(task, algorithm, recipe.settings, checkpoint_dir, recipe.fingerprint, progress, on_round_end)
    task, algorithm = recipe.build_server()  # on silo-local data, a view holding no client's rows
    if runtime == "flower-simulation":
        from fedrepro.fl.flower.simulation import FlowerSimulation

        return FlowerSimulation(recipe, task, algorithm, checkpoint_dir, progress, on_round_end)
    from fedrepro.fl.flower.deployment import FlowerDeployment

    return FlowerDeployment(recipe, task, algorithm, checkpoint_dir, progress, run_timeout, reply_timeout)


def stage_federation(runtime: str, folder: str | Path, cpus: int) -> ContextManager[None]:
    """Wrap a stage's cells: on flower-deployment they all run on one federation under ``folder``
    (``fedrepro.fl.flower.deployment.shared_federation``), each cell its own ``flwr run``; on flower-simulation they
    all join one Ray of ``cpus`` cores (``fedrepro.fl.flower.ray_head.stage_ray``). The engine needs nothing."""
    if runtime != "flower-deployment":
        return simulated_stage(runtime, cpus)
    from fedrepro.fl.flower.deployment import shared_federation

    return shared_federation(folder)
