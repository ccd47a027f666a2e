"""A cell trained by a real Flower deployment on this machine (``train.runtime: flower-deployment``).

``FlowerDeployment`` is the stage's view: it writes the cell's recipe spec and a minimal Flower App (components
``fedrepro.fl.flower.apps``), runs it with ``flwr run`` on a ``LocalFederation`` (``fedrepro.fl.flower.federation``),
then reads the server's checkpoint and, as the harness owning every node's directory on this machine, each client's
final state (the server never reads them).

The federation is the stage's, not the cell's (``shared_federation``): a SuperLink, the warm ClientApp launcher and
SuperNodes numbered 0, 1, ... (node config ``partition-id``: the n-th client of whichever run it is) are started by the
first cell and serve every later one, each a ``flwr run`` of its own, as a Flower deployment is used. Starting them
took most of a small cell's time. A cell with more clients than there are nodes starts the missing ones; a node
numbered past a cell's clients serves none in that run. A cell that fails stops the federation, so the next one starts
afresh. Outside a ``shared_federation`` (a single cell, the drills of the tests) each cell starts and stops its own.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from tqdm.auto import tqdm

from fedrepro.errors import FederationError, TrainingDiverged
from fedrepro.fl.algorithm import Algorithm, FederatedTask
from fedrepro.channel import Message
from fedrepro.fl.checkpoint import LATEST, TrainingState, load_checkpoint
from fedrepro.fl.engine import Engine
from fedrepro.fl.flower.apps import DIVERGED_FILE
from fedrepro.fl.flower.certificates import make_node_key
from fedrepro.fl.flower.common import DATA_DIR_KEY, NODES_TIMEOUT, PARTITION_ID_KEY
from fedrepro.fl.flower.federation import LocalFederation, stopped_cleanly_on_sigterm
from fedrepro.fl.flower.node_state import NODES, collect_node_states
from fedrepro.fl.recipe import CellRecipe, write_recipe_spec
from fedrepro.io import read_json


class RunningFederation:
    """A started ``LocalFederation`` with its warm ClientApp launcher, and what that launcher was started for
    (``setup``: the cells' torch threads, the modules it preloads, its slots), so a cell that needs another starts
    a federation of its own."""

    def __init__(self, folder: Path, setup: tuple[int, tuple[str, ...], int | None]) -> None:
        self.setup = setup
        self.local = LocalFederation(folder).__enter__()
        try:
            threads, preload, slots = setup
            self.local.start_launcher(threads, list(preload), slots)
        except BaseException:
            self.local.stop_all()
            raise

    def close(self) -> None:
        self.local.stop_all()


class SharedFederation:
    """The federation the deployment cells of a ``shared_federation`` block run on (class state: one per process)."""

    folder: Path | None = None
    """Where the block's federation lives (None: no block is open, each cell starts its own)."""
    running: RunningFederation | None = None

    @classmethod
    def stop(cls) -> None:
        if cls.running is not None:
            cls.running, running = None, cls.running
            running.close()


@contextlib.contextmanager
def shared_federation(folder: str | Path) -> Iterator[None]:
    """Every ``flower-deployment`` cell run inside this block runs on one federation under ``folder``, started by the
    first cell and stopped when the block ends (also on SIGTERM, as DVC or a CI timeout stops a stage)."""
    if SharedFederation.folder is not None:
        raise FederationError(f"a shared federation is already open in {SharedFederation.folder}")
    SharedFederation.folder = Path(folder).resolve()
    try:
        with stopped_cleanly_on_sigterm():
            yield
    finally:
        SharedFederation.stop()
        SharedFederation.folder = None


def rounds_checkpointed(checkpoint_dir: Path) -> int:
    """Rounds the ServerApp has checkpointed in ``checkpoint_dir`` so far (it runs in a process of its own)."""
    state = checkpoint_dir / LATEST / "state.json"
    try:
        return read_json(state).get("next_round", 0) if state.exists() else 0
    except (OSError, ValueError):  # replaced while being read
        return 0


def watch_rounds(checkpoint_dir: Path, rounds: int, bar: tqdm) -> Callable[[], bool]:
    """The run's ``looks_done`` (``wait_for_run``): moves ``bar`` to the rounds checkpointed so far, True once the last
    one is. It counts the checkpoint's rounds, not the bar's: a disabled bar (``progress=False``) never moves, and a
    run watched through the bar's count waited out Flower's status poll (``STATUS_EVERY_SECONDS``, up to 10 s) after
    its last round."""

    def last_round_checkpointed() -> bool:
        done = rounds_checkpointed(checkpoint_dir)
        if done > bar.n:
            bar.update(done - bar.n)
        return done >= rounds

    return last_round_checkpointed


class FlowerDeployment(Engine):
    """``run()`` trains the cell on a local SuperLink and SuperNodes and returns the same ``TrainingState`` as the
    engine.

    The rounds run in the SuperLink's ServerApp process, so ``on_round_end`` is not called here.
    """

    def __init__(
        self,
        recipe: CellRecipe,
        task: FederatedTask,
        algorithm: Algorithm,
        checkpoint_dir: str | Path,
        progress: bool = True,
        timeout: float = 86400,
        reply_timeout: float | None = None,
    ) -> None:
        if recipe.spec is None:
            raise FederationError("a deployment rebuilds the cell in other processes: its recipe needs a spec")
        super().__init__(task, algorithm, recipe.settings, checkpoint_dir, recipe.fingerprint, progress)
        self.recipe, self.timeout = recipe, timeout
        """Seconds the whole run may take (``train.run_timeout``): past it the stage stops; rerunning resumes."""
        self.checkpoint_dir = self.checkpoint_dir.resolve()
        self.nodes_root = self.checkpoint_dir / NODES
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
        self.data_dirs: dict[str, Path] = {}
        """On silo-local data kept elsewhere than the recipe's silos folder, each client's directory, given to its
        SuperNode as ``data-dir`` (by default a node reads ``<silos root>/<client id>``)."""
        self.on_federation_up: Callable[[LocalFederation], None] | None = None
        """Called once the SuperLink and the SuperNodes run, before ``flwr run`` (drills start extra nodes here)."""

    def node_name(self, client_id: str) -> str:
        """The federation's name for the SuperNode that serves ``client_id`` in this cell (nodes are numbered)."""
        return f"supernode-{self.train_ids.index(client_id)}"

    def start_node(self, federation: LocalFederation, client_id: str) -> subprocess.Popen:
        """The numbered SuperNode that serves ``client_id``: its key (made and registered the first time that number
        starts), its number as node config (and on silo-local data given ``data_dirs``, that client's directory)."""
        number = str(self.train_ids.index(client_id))
        keys = federation.node_keys
        if not (keys / number).exists():
            _, public = make_node_key(keys, number)
            federation.register(public)
        config = {PARTITION_ID_KEY: number}
        if client_id in self.data_dirs:
            config[DATA_DIR_KEY] = str(self.data_dirs[client_id])
        return federation.start_supernode(number, keys / number, config)

    def restart_node(
        self, federation: LocalFederation, client_id: str, within: float = 300, settle: float = 15
    ) -> None:
        """Start a crashed client's SuperNode again, as a supervisor would. The SuperLink lets the key in again only
        once it has marked the dead connection offline (after missed heartbeats); until then the node exits at
        once, so it is started again every few seconds. Alive after ``settle`` seconds counts as rejoined."""
        deadline = time.monotonic() + within
        name = self.node_name(client_id)
        while True:
            process = self.start_node(federation, client_id)
            try:
                process.wait(timeout=settle)
            except subprocess.TimeoutExpired:
                return
            if name not in federation.processes:
                raise FederationError(f"the federation stopped before the SuperNode of client {client_id} could rejoin")
            federation.stop(name)
            if time.monotonic() > deadline:
                raise FederationError(f"the SuperNode of client {client_id} could not rejoin within {within:g} s")
            time.sleep(5)

    def _lost_a_node(self, federation: LocalFederation) -> bool:
        """Whether a node this cell needs died during an earlier cell (a shared federation is then started afresh)."""
        nodes = [federation.processes.get(self.node_name(client_id)) for client_id in self.train_ids]
        return any(node is not None and node.poll() is not None for node in nodes)

    @contextlib.contextmanager
    def _federation(self) -> Iterator[LocalFederation]:
        """The federation this cell runs on, with a running node per client: the open ``shared_federation``'s (started
        now if there is none yet, or if it was started for another launcher setup or lost a node), else one of its
        own, stopped after the run. A run that fails stops either."""
        setup = (
            self.recipe.threads,
            ("fedrepro.fl.flower.apps", self.recipe.spec["factory"].partition(":")[0]),
            self.launcher_slots,
        )
        shared = SharedFederation.folder
        if shared is not None and self.data_dirs:
            raise FederationError(
                "a cell whose nodes each get a data directory of their own cannot run on a shared "
                "federation: its numbered nodes serve other cells' clients too"
            )
        running = SharedFederation.running if shared is not None else None
        if running is not None and (running.setup != setup or self._lost_a_node(running.local)):
            SharedFederation.stop()
            running = None
        if running is None:
            running = RunningFederation(shared or self.federation_dir, setup)
            if shared is not None:
                SharedFederation.running = running
        try:
            for client_id in self.train_ids:
                if self.node_name(client_id) not in running.local.processes:
                    self.start_node(running.local, client_id)
            yield running.local
        except BaseException:
            if shared is not None:
                SharedFederation.stop()
            raise
        finally:
            if shared is None:
                running.close()

    def run(self) -> TrainingState:
        if self.state.next_round < self.settings.rounds:
            spec = write_recipe_spec(
                self.checkpoint_dir / "recipe.json", {**self.recipe.spec, "fingerprint": self.fingerprint}
            )
            diverged = self.checkpoint_dir / DIVERGED_FILE
            diverged.unlink(missing_ok=True)  # a previous run's
            with stopped_cleanly_on_sigterm(), self._federation() as federation:
                if self.on_federation_up is not None:
                    self.on_federation_up(federation)
                with tqdm(
                    desc=f"{self.algorithm.name} rounds on Flower",
                    total=self.settings.rounds,
                    initial=self.state.next_round,
                    disable=not self.progress,
                ) as bar:
                    try:
                        self.wire = federation.run_app(
                            spec,
                            self.checkpoint_dir,
                            self.timeout,
                            self.reply_timeout,
                            watch_rounds(self.checkpoint_dir, self.settings.rounds, bar),
                            self.nodes_timeout,
                        )["network-traffic"]
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
