"""A cell on Flower's simulation engine: the ServerApp in this process, one virtual node per client, Ray
workers running the ClientApp, everything bound to loopback.

Sized for a 2-core machine: Ray gets ``CPUS`` cores and each ClientApp asks for all of them, so one worker
trains one client at a time, with the same torch thread count as the engine (the cell's ``threads``).
Ray's and Flower's usage reporting is switched off; tests also run this inside a network namespace of
their own with only loopback up, so nothing can leave the machine whatever a library does.

After the run the stage still needs each client's own model (to score it on its test data, as each silo
would score its own). The harness, which owns every node's directory on this machine, reads the final
states from there; the server never does (``FlowerServer.serve`` never touches them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from flwr.simulation import run_simulation

from fedrepro.fl.algorithm import Algorithm, FederatedTask
from fedrepro.fl.checkpoint import TrainingState
from fedrepro.fl.flower.client import NodeHandlers, client_app
from fedrepro.fl.flower.node_state import collect_node_states
from fedrepro.fl.flower.server import FlowerServer
from fedrepro.fl.recipe import CellRecipe

CPUS = 2
OBJECT_STORE_BYTES = 1024 * 2**20
"""Ray's shared-memory store: messages to and from the worker pass through it (a MiniLM model is ~90 MB, SCAFFOLD sends two)."""
NODES = "nodes"
"""The folder, beside the server's checkpoint, that holds one directory per simulated node."""


def quiet_environment() -> None:
    """No usage statistics or telemetry from Ray or Flower (they would try the network)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def ray_backend_config(cpus: int = CPUS) -> dict[str, Any]:
    """Flower's Ray backend on loopback only, no dashboard, one ClientApp worker using ``cpus`` cores."""
    return {
        "client_resources": {"num_cpus": cpus, "num_gpus": 0.0},
        "init_args": {"num_cpus": cpus, "num_gpus": 0, "_node_ip_address": "127.0.0.1", "include_dashboard": False,
                      "object_store_memory": OBJECT_STORE_BYTES},
    }


class FlowerSimulation(FlowerServer):
    """``run()`` trains the cell on Flower's simulation engine and returns the same ``TrainingState`` as the engine."""

    def __init__(self, recipe: CellRecipe, task: FederatedTask, algorithm: Algorithm, checkpoint_dir: str | Path,
                 progress: bool = True, on_round_end: Callable[[dict[str, Any]], None] | None = None) -> None:
        super().__init__(recipe, task, algorithm, checkpoint_dir, progress, on_round_end)
        self.nodes_root = (self.checkpoint_dir / NODES).resolve()

    def run(self) -> TrainingState:
        if self.state.next_round < self.settings.rounds:
            quiet_environment()
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
