"""A cell on Flower's simulation engine: the ServerApp in this process, one virtual node per client, Ray
workers running the ClientApp, everything bound to loopback.

Sized as the engine's cell: its one ClientApp worker asks Ray for the cell's torch threads and trains a round's clients
one after another, as the engine does, while the server's side of the round (aggregation and its evaluation) runs in
this process. A stage trains as many cells at once as the machine has cores
for their threads (``fedrepro.grid``): with two workers a cell, two cells' four workers and two servers shared the
2 cores, and the embedded ``fedcmc_table`` took 161 s against 142 s with one (2026-12-05).

A stage's cells all join one Ray the stage starts (``ray_head.stage_ray``; a cell run on its own starts a Ray of its
own), and each of the stage's processes keeps one worker for its cells (``ray_backend.kept_ray_backend``, which also
hands the worker each message as soon as the server sends it).

Ray's and Flower's usage reporting is switched off; tests also run this inside a network namespace of
their own with only loopback up, so nothing can leave the machine whatever a library does.

After the run the stage still needs each client's own model (to score it on its test data, as each silo
would score its own). The harness, which owns every node's directory on this machine, reads the final
states from there; the server never does (``FlowerServer.serve`` never touches them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from flwr.simulation import run_simulation

from fedrepro.fl.algorithm import Algorithm, FederatedTask
from fedrepro.fl.checkpoint import TrainingState
from fedrepro.fl.flower.client import NodeHandlers, client_app
from fedrepro.fl.flower.common import ray_backend_config
from fedrepro.fl.flower.node_state import NODES, collect_node_states
from fedrepro.fl.flower.ray_backend import kept_ray_backend
from fedrepro.fl.flower.server import FlowerServer
from fedrepro.fl.recipe import CellRecipe


class FlowerSimulation(FlowerServer):
    """``run()`` trains the cell on Flower's simulation engine and returns the same ``TrainingState`` as the engine."""

    def __init__(
        self,
        recipe: CellRecipe,
        task: FederatedTask,
        algorithm: Algorithm,
        checkpoint_dir: str | Path,
        progress: bool = True,
        on_round_end: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__(recipe, task, algorithm, checkpoint_dir, progress, on_round_end)
        self.nodes_root = (self.checkpoint_dir / NODES).resolve()

    def backend_config(self) -> dict[str, Any]:
        """One ClientApp worker on the cell's torch threads (the module docstring says why), on the stage's Ray if one
        runs."""
        return ray_backend_config(self.recipe.threads, self.settings.device)

    def run(self) -> TrainingState:
        if self.state.next_round < self.settings.rounds:
            with kept_ray_backend():
                try:
                    run_simulation(
                        server_app=self.server_app(),
                        client_app=client_app(NodeHandlers(self.recipe, self.nodes_root)),
                        num_supernodes=len(self.train_ids),
                        backend_config=self.backend_config(),
                    )
                except RuntimeError:
                    if self.failure is None:
                        raise
                if self.failure is not None:  # Flower only logs what stopped the ServerApp: raise it here
                    raise self.failure
        collect_node_states(self, self.nodes_root)
        return self.state
