"""A cell's recipe: what every side of a federation needs to rebuild the very same task, algorithm and settings
in its own process.

The engine builds a recipe once; on Flower the server and every node build it again (no model or state is
shipped to them), so an algorithm that runs in the engine runs on Flower unchanged. A process that shares
nothing with the one that made the recipe (a deployment's ServerApp and ClientApps) rebuilds it from its JSON
spec (``recipe_spec``, ``write_recipe_spec``, ``load_recipe``). Its own module, so the runtimes and the Flower
apps that all take a recipe do not import each other through it.

A recipe with a ``SiloRecipe`` runs on silo-local data on Flower (``fedrepro.fl.silo``): each node builds its
client's task from its own directory (``build_node``), the server a view that holds no client data
(``build_server``). The engine (and so the reference run) still builds the whole task.
"""

from __future__ import annotations

import functools
import importlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from fedrepro.errors import ConfigError
from fedrepro.fl.algorithm import Algorithm, CommonSettings, FederatedTask
from fedrepro.fl.algorithms import build_algorithm
from fedrepro.fl.engine import EngineSettings
from fedrepro.seeding import seed_everything


@dataclass(frozen=True)
class SiloRecipe:
    """How a silo-local run builds its tasks (both picklable, as ``CellRecipe.build_task``)."""

    root: Path
    """The silos' folder on this machine (``fedrepro.fl.silo.write_silos``): a simulated or local node finds its
    client's directory at ``<root>/<client id>``, the server the manifest in it. A node elsewhere is given its own
    directory in its node config."""

    build_client_task: Callable[[Path], FederatedTask]
    """A node's task from its client's silo directory alone: that client's training and evaluation rows."""
    build_server_task: Callable[[], FederatedTask]
    """The server's ``fedrepro.fl.silo.ServerTaskView``: the manifest's clients and sizes, and the model."""


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
    silo: SiloRecipe | None = None
    """Set: on Flower every node loads only its own client's data and the server none (module docstring)."""

    def build(self) -> tuple[FederatedTask, Algorithm]:
        """Seed this process as the engine's cells always have, then build the task and the algorithm."""
        return self._build(self.build_task)

    def build_server(self) -> tuple[FederatedTask, Algorithm]:
        """What a Flower server builds: the whole task, or on silo-local data a view holding no client's rows."""
        return self._build(self.build_task if self.silo is None else self.silo.build_server_task)

    def build_node(self, data_dir: Path | None) -> tuple[FederatedTask, Algorithm]:
        """What a Flower node builds: the whole task, or on silo-local data its client's from ``data_dir``."""
        if self.silo is None:
            return self.build()
        if data_dir is None:
            raise ConfigError(
                f"run {self.fingerprint[:12]} is silo-local: each node needs the directory of its "
                "client's data (node config 'data-dir')"
            )
        return self._build(functools.partial(self.silo.build_client_task, Path(data_dir)))

    def _build(self, build_task: Callable[[], FederatedTask]) -> tuple[FederatedTask, Algorithm]:
        seed_everything(self.settings.seed, self.threads)
        return build_task(), build_algorithm(self.algorithm, self.algorithm_settings, self.common)


def recipe_spec(factory: str, params: Any, cell: Any, folders: list[Path], inputs_digest: str) -> dict:
    """A paper's recipe as JSON: ``factory`` ("module:function") is called with the params, the cell, the
    (absolute) input folders and the inputs' digest, each as JSON, and returns the recipe again."""
    return {
        "factory": factory,
        "kwargs": {
            "params": params.model_dump(mode="json"),
            "cell": asdict(cell),
            "folders": [str(f) for f in folders],
            "inputs_digest": inputs_digest,
        },
    }


def write_recipe_spec(path: str | Path, spec: dict) -> Path:
    """The file a deployment's apps rebuild the cell from (``CellRecipe.spec``, plus the run's ``fingerprint``,
    which every process checks against the recipe it rebuilt)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, indent=1, sort_keys=True))
    return path


def load_recipe(path: str | Path) -> CellRecipe:
    spec = json.loads(Path(path).read_text())
    module, _, name = str(spec.get("factory", "")).partition(":")
    if not module or not name:
        raise ConfigError(f"{path}: factory = {spec.get('factory')!r}: expected 'module:function'")
    recipe = getattr(importlib.import_module(module), name)(**spec.get("kwargs", {}))
    if not isinstance(recipe, CellRecipe):
        raise ConfigError(f"{path}: factory {spec['factory']} returned {type(recipe).__name__}, expected a CellRecipe")
    if spec.get("fingerprint", recipe.fingerprint) != recipe.fingerprint:
        raise ConfigError(
            f"{path}: this machine rebuilds run {recipe.fingerprint[:12]}, the spec is of run "
            f"{spec['fingerprint'][:12]}: its code, params or data differ (install the same commit and data)"
        )
    return recipe
