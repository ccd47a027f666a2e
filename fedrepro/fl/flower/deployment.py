"""A cell trained by a real Flower deployment on this machine (``train.runtime: flower-deployment``).

``FlowerDeployment`` is the stage's view: it writes the cell's recipe spec and a minimal Flower App (components
``fedrepro.fl.flower.apps``), runs it on a ``LocalFederation`` (``fedrepro.fl.flower.federation``), then reads the
server's checkpoint and, as the harness owning every node's directory on this machine, each client's final state
(the server never reads them).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm

from fedrepro.errors import FederationError, TrainingDiverged
from fedrepro.fl.algorithm import Algorithm, FederatedTask
from fedrepro.fl.channel import Message
from fedrepro.fl.checkpoint import LATEST, TrainingState, load_checkpoint
from fedrepro.fl.engine import Engine
from fedrepro.fl.flower.apps import DIVERGED_FILE
from fedrepro.fl.flower.certificates import make_node_key
from fedrepro.fl.flower.common import NODES_TIMEOUT, quiet_environment
from fedrepro.fl.flower.federation import LocalFederation, stopped_cleanly_on_sigterm
from fedrepro.fl.flower.node_state import collect_node_states
from fedrepro.fl.recipe import CellRecipe, write_recipe_spec
from fedrepro.io import read_json


class FlowerDeployment(Engine):
    """``run()`` trains the cell on a local SuperLink and SuperNodes and returns the same ``TrainingState`` as the engine.

    The rounds run in the SuperLink's ServerApp process, so ``on_round_end`` is not called here.
    """

    def __init__(self, recipe: CellRecipe, task: FederatedTask, algorithm: Algorithm, checkpoint_dir: str | Path,
                 progress: bool = True, timeout: float = 86400, reply_timeout: float | None = None) -> None:
        if recipe.spec is None:
            raise FederationError("a deployment rebuilds the cell in other processes: its recipe needs a spec")
        super().__init__(task, algorithm, recipe.settings, checkpoint_dir, recipe.fingerprint, progress)
        self.recipe, self.timeout = recipe, timeout
        """Seconds the whole run may take (``train.run_timeout``): past it the stage stops; rerunning resumes."""
        self.checkpoint_dir = self.checkpoint_dir.resolve()
        self.nodes_root = self.checkpoint_dir / "nodes"
        self.federation_dir = self.checkpoint_dir / "federation"
        self.wire: dict[str, Any] = {}
        """Flower's own count of the run's traffic (``flwr ls``: inbound, outbound, total bytes)."""
        self.reply_timeout = reply_timeout
        """Seconds the server waits for a round's replies (``train.reply_timeout``); a node silent that long misses
        the round (None: wait for every node, which a crashed silo stalls forever)."""
        self.nodes_timeout = NODES_TIMEOUT
        """Seconds the server waits for one node per client before its first round; it then starts with the nodes
        connected, and a node that connects later joins at the next round."""
        self.launcher_slots: int | None = None
        """ClientApps the launcher runs at once (None: the machine's cores over the cell's threads)."""
        self.data_dirs: dict[str, Path] = {} if recipe.silo is None else {
            client_id: recipe.silo.root / client_id for client_id in self.train_ids}
        """On silo-local data, each client's data directory, given to its SuperNode as ``data-dir``."""
        self.on_federation_up: Callable[[LocalFederation], None] | None = None
        """Called once the SuperLink and the SuperNodes run, before ``flwr run`` (drills start extra nodes here)."""

    def start_node(self, federation: LocalFederation, client_id: str) -> subprocess.Popen:
        """The SuperNode of one client: its registered key, its client id, its own state directory (and on
        silo-local data its own data directory)."""
        config = {"client-id": client_id, "state-dir": str(self.nodes_root / client_id)}
        if client_id in self.data_dirs:
            config["data-dir"] = str(self.data_dirs[client_id])
        return federation.start_supernode(client_id, federation.folder / "node-keys" / client_id, config)

    def restart_node(self, federation: LocalFederation, client_id: str, within: float = 300, settle: float = 15) -> None:
        """Start a crashed client's SuperNode again, as a supervisor would. The SuperLink lets the key in again only
        once it has marked the dead connection offline (after missed heartbeats); until then the node exits at
        once, so it is started again every few seconds. Alive after ``settle`` seconds counts as rejoined."""
        deadline = time.monotonic() + within
        while True:
            process = self.start_node(federation, client_id)
            try:
                process.wait(timeout=settle)
            except subprocess.TimeoutExpired:
                return
            if f"supernode-{client_id}" not in federation.processes:
                raise FederationError(f"the federation stopped before the SuperNode of client {client_id} could rejoin")
            federation.stop(f"supernode-{client_id}")
            if time.monotonic() > deadline:
                raise FederationError(f"the SuperNode of client {client_id} could not rejoin within {within:g} s")
            time.sleep(5)

    def _rounds_checkpointed(self) -> int:
        """Rounds the ServerApp has checkpointed so far (it runs in a process of its own)."""
        state = self.checkpoint_dir / LATEST / "state.json"
        try:
            return read_json(state).get("next_round", 0) if state.exists() else 0
        except (OSError, ValueError):  # replaced while being read
            return 0

    def run(self) -> TrainingState:
        if self.state.next_round < self.settings.rounds:
            quiet_environment()
            spec = write_recipe_spec(self.checkpoint_dir / "recipe.json", {**self.recipe.spec, "fingerprint": self.fingerprint})
            diverged = self.checkpoint_dir / DIVERGED_FILE
            diverged.unlink(missing_ok=True)  # a previous run's
            with stopped_cleanly_on_sigterm(), LocalFederation(self.federation_dir) as federation:
                federation.start_launcher(self.recipe.threads,
                                          ["fedrepro.fl.flower.apps", self.recipe.spec["factory"].partition(":")[0]],
                                          self.launcher_slots)
                for client_id in self.train_ids:
                    private, public = make_node_key(federation.folder / "node-keys", client_id)
                    federation.register(public)
                    self.start_node(federation, client_id)
                if self.on_federation_up is not None:
                    self.on_federation_up(federation)
                with tqdm(desc=f"{self.algorithm.name} rounds on Flower", total=self.settings.rounds,
                          initial=self.state.next_round, disable=not self.progress) as bar:
                    def last_round_checkpointed() -> bool:
                        done = self._rounds_checkpointed()
                        if done > bar.n:
                            bar.update(done - bar.n)
                        return bar.n >= self.settings.rounds

                    try:
                        self.wire = federation.run_app(spec, self.checkpoint_dir, self.timeout, self.reply_timeout,
                                                       last_round_checkpointed, self.nodes_timeout)["network-traffic"]
                    except FederationError:
                        if diverged.exists():  # the error the engine would raise, not "the Flower run failed"
                            raise TrainingDiverged(diverged.read_text()) from None
                        raise
            state = load_checkpoint(self.checkpoint_dir, self.fingerprint)
            if state is None or state.next_round < self.settings.rounds:
                raise FederationError(f"the Flower run ended without its last checkpoint in {self.checkpoint_dir}")
            self.state = state
            self.channel.messages = [Message.from_record(record) for record in state.messages]
            self.channel.scalars = [Message.from_record(record) for record in state.scalars]
        collect_node_states(self, self.nodes_root)
        return self.state
