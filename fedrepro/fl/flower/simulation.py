"""A cell on Flower's simulation engine: the ServerApp in this process, one virtual node per client, Ray
workers running the ClientApp, everything bound to loopback.

Sized for a 2-core machine: Ray gets ``common.CPUS`` cores and each ClientApp asks for all of them, so one worker
trains one client at a time, with the same torch thread count as the engine (the cell's ``threads``).

Ray and its worker are started once per process, by the first cell, and every later cell of the stage runs on them
(``KeptRayBackend``): starting them took 7-9 s, most of a small cell's time on Flower. The worker holds no cell's
state between cells (a node's trainer is rebuilt for each run's fingerprint, its private state is on disk), and a
cell that fails drops them, so the next one starts afresh. SS-VFNAS's parties (``vertical``) start their own Ray per
cell: a process that runs them after horizontal cells calls ``KeptRayBackend.drop()`` first (no stage does both).

Ray's and Flower's usage reporting is switched off; tests also run this inside a network namespace of
their own with only loopback up, so nothing can leave the machine whatever a library does.

After the run the stage still needs each client's own model (to score it on its test data, as each silo
would score its own). The harness, which owns every node's directory on this machine, reads the final
states from there; the server never does (``FlowerServer.serve`` never touches them).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

from flwr.server.superlink.fleet.vce.backend import raybackend
from flwr.simulation import run_simulation

from fedrepro.fl.algorithm import Algorithm, FederatedTask
from fedrepro.fl.checkpoint import TrainingState
from fedrepro.fl.flower.client import NodeHandlers, client_app
from fedrepro.fl.flower.common import quiet_environment, ray_backend_config
from fedrepro.fl.flower.node_state import collect_node_states
from fedrepro.fl.flower.server import FlowerServer
from fedrepro.fl.recipe import CellRecipe

NODES = "nodes"
"""The folder, beside the server's checkpoint, that holds one directory per simulated node."""


class KeptRayBackend(raybackend.RayBackend):
    """Flower's Ray backend, kept for the process's later simulations instead of shut down after each (Ray itself
    stops at the process's exit). Flower 1.42 builds its backend from ``raybackend.RayBackend`` when a simulation
    starts; ``kept_ray_backend`` puts this class there for the length of one run."""

    kept_pool: raybackend.BasicActorPool | None = None

    def build(self, app_fn: Callable[[], Any]) -> None:
        if KeptRayBackend.kept_pool is None:
            super().build(app_fn)
            KeptRayBackend.kept_pool = self.pool
        else:
            self.pool, self.app_fn = KeptRayBackend.kept_pool, app_fn

    def terminate(self) -> None:
        """Kept for the next simulation; ``drop`` stops it."""

    @classmethod
    def drop(cls) -> None:
        """Stop the kept worker and Ray (after a failed run, whose worker may be broken or busy)."""
        if cls.kept_pool is not None:
            cls.kept_pool.terminate_all_actors()
            cls.kept_pool = None
        raybackend.ray.shutdown()


@contextlib.contextmanager
def kept_ray_backend() -> Iterator[None]:
    """Run one simulation on the process's kept Ray backend; a run that fails drops it."""
    flowers_own, raybackend.RayBackend = raybackend.RayBackend, KeptRayBackend
    try:
        yield
    except BaseException:
        KeptRayBackend.drop()
        raise
    finally:
        raybackend.RayBackend = flowers_own


class FlowerSimulation(FlowerServer):
    """``run()`` trains the cell on Flower's simulation engine and returns the same ``TrainingState`` as the engine."""

    def __init__(self, recipe: CellRecipe, task: FederatedTask, algorithm: Algorithm, checkpoint_dir: str | Path,
                 progress: bool = True, on_round_end: Callable[[dict[str, Any]], None] | None = None) -> None:
        super().__init__(recipe, task, algorithm, checkpoint_dir, progress, on_round_end)
        self.nodes_root = (self.checkpoint_dir / NODES).resolve()

    def run(self) -> TrainingState:
        if self.state.next_round < self.settings.rounds:
            quiet_environment()
            with kept_ray_backend():
                try:
                    run_simulation(server_app=self.server_app(),
                                   client_app=client_app(NodeHandlers(self.recipe, self.nodes_root)),
                                   num_supernodes=len(self.train_ids), backend_config=ray_backend_config())
                except RuntimeError:
                    if self.failure is None:
                        raise
                if self.failure is not None:  # Flower only logs what stopped the ServerApp: raise it here
                    raise self.failure
        collect_node_states(self, self.nodes_root)
        return self.state
