"""SS-VFNAS's parties on Flower (``fedrepro.vfl.nodes``): the label party runs in the ServerApp and drives the
protocol; every other party is a node whose ClientApp holds that party's ``PartyWorker``.

Who holds what: the ServerApp's process builds only the label party (its columns, the labels, its bottom and the top
network); a node builds only its own party (its columns and bottom network) on its first message. Every activation
and gradient is one Flower message (``messages.TENSORS``, exact float32 bytes), logged by the label party's channel
as ``VerticalProtocol`` logs it; the command beside it (sample ids, the DP draw, the update to apply) is a JSON
string in ``messages.CONFIG``, logged on the channel's scalar log.

A party keeps its networks, optimizers and the graph of its last forward in its ClientApp's process memory between
messages (one ``PartyWorker`` per run and party): Flower's simulation runs the ClientApps in a long-lived Ray actor
(``ray_backend.KeptRayBackend`` starts exactly one), so that memory lasts the run
(the actor is kept for the process's later cells, ``ray_backend``; a run's first message replaces the last run's);
with more than two parties the other parties' workers share that one process (each built from, and reading, only its
own files). A node whose backward finds no forward (an actor restarted, or several actors splitting a party's messages)
says so (``FederationError``). A deployment starts one ClientApp process per message, which this does not survive:
there each party keeps its worker in a service process of its own (``vertical_deployment``).

Nodes are told apart by the party each answers to a first query: ``party-id`` in a node's config, or, in the
simulation, the ``partition-id``-th party other than the label party.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedrepro.errors import FederationError
from fedrepro.fl.flower import messages as m
from fedrepro.fl.flower.common import PARTITION_ID_KEY, STATE_DIR_KEY, ray_backend_config, send_and_receive
from fedrepro.fl.flower.ray_backend import kept_ray_backend
from fedrepro.vfl.nodes import NODES, PartyWorker, VerticalHub, VerticalRecipe, party_directory
from fedrepro.vfl.protocol import party_name

PARTY_ID_KEY = "party-id"
OP, COMMAND, PARTY = "op", "command", "party"

_workers: dict[tuple[str, int], PartyWorker] = {}
"""This process's parties, by run fingerprint and party index (a new run frees the previous one's)."""


@dataclass(frozen=True)
class PartyNodeHandlers:
    """What a party's node does with a message. Module-level, so Ray ships it by reference."""

    recipe: VerticalRecipe
    nodes_root: Path | None = None
    """Simulation: the folder holding one directory per party."""

    def party_index(self, context: Context) -> int:
        if PARTY_ID_KEY in context.node_config:
            return int(context.node_config[PARTY_ID_KEY])
        return self.recipe.others[int(context.node_config[PARTITION_ID_KEY])]

    def directory(self, context: Context, index: int) -> Path:
        if STATE_DIR_KEY in context.node_config:
            return Path(str(context.node_config[STATE_DIR_KEY]))
        if self.nodes_root is None:
            raise FederationError(f"node of {party_name(index)}: its node config has no {STATE_DIR_KEY!r}")
        return self.nodes_root / party_name(index)

    def worker(self, context: Context) -> PartyWorker:
        index = self.party_index(context)
        key = (self.recipe.fingerprint, index)
        if key not in _workers:
            if any(fingerprint != self.recipe.fingerprint for fingerprint, _ in _workers):
                _workers.clear()
            torch.set_num_threads(self.recipe.threads)
            _workers[key] = PartyWorker(self.recipe, self.recipe.build_party(index), self.directory(context, index))
        return _workers[key]

    def _check_run(self, config: ConfigRecord) -> None:
        if config[m.FINGERPRINT] != self.recipe.fingerprint:
            raise FederationError(
                f"this node serves run {self.recipe.fingerprint[:12]}, the label party runs "
                f"{str(config[m.FINGERPRINT])[:12]}: start the nodes with the label party's recipe"
            )

    def identify(self, message: Message, context: Context) -> Message:
        """Which party this node holds: the label party's first message of a run, so a worker this process kept from
        an earlier run of the same recipe is dropped (the run builds its party afresh, as a new process would)."""
        self._check_run(message.content[m.CONFIG])
        index = self.party_index(context)
        _workers.pop((self.recipe.fingerprint, index), None)
        return Message(RecordDict({m.CONFIG: ConfigRecord({PARTY: index})}), reply_to=message)

    def command(self, message: Message, context: Context) -> Message:
        config = message.content[m.CONFIG]
        self._check_run(config)
        tensors = m.to_tensors(message.content[m.TENSORS]) if m.TENSORS in message.content else {}
        reply = self.worker(context).handle(str(config[OP]), json.loads(str(config[COMMAND])), tensors)
        return Message(RecordDict({m.TENSORS: m.to_record(reply)}), reply_to=message)


def party_client_app(handlers: PartyNodeHandlers) -> ClientApp:
    app = ClientApp()

    @app.query()
    def identify(message: Message, context: Context) -> Message:
        return handlers.identify(message, context)

    @app.train()
    def command(message: Message, context: Context) -> Message:
        return handlers.command(message, context)

    return app


class FlowerTransport:
    """The label party's side: one Flower message per party and command, waiting for every reply."""

    def __init__(
        self, grid: Grid, recipe: VerticalRecipe, reply_timeout: float | None = None, nodes_timeout: float = 120.0
    ) -> None:
        self.grid, self.recipe, self.reply_timeout = grid, recipe, reply_timeout
        self.node_of = self._identify(nodes_timeout)

    def _config(self, **extra: Any) -> ConfigRecord:
        return ConfigRecord({m.FINGERPRINT: self.recipe.fingerprint, **extra})

    def _identify(self, timeout: float) -> dict[int, int]:
        """Ask every node which party it holds; each other party must be held by exactly one node."""
        deadline = time.monotonic() + timeout
        node_ids = sorted(self.grid.get_node_ids())
        while len(node_ids) < len(self.recipe.others) and time.monotonic() < deadline:
            time.sleep(0.5)
            node_ids = sorted(self.grid.get_node_ids())
        outgoing = [
            Message(
                RecordDict({m.CONFIG: self._config()}),
                dst_node_id=node_id,
                message_type=MessageType.QUERY,
                group_id="identify",
            )
            for node_id in node_ids
        ]
        node_of: dict[int, int] = {}
        for node_id, reply in zip(node_ids, send_and_receive(self.grid, outgoing, timeout)):
            if reply is None:
                continue  # said below, with the parties no node holds
            if reply.has_error():
                raise FederationError(f"node {node_id} failed to say which party it holds: {reply.error.reason}")
            index = int(reply.content[m.CONFIG][PARTY])
            if index in node_of:
                raise FederationError(f"nodes {node_of[index]} and {node_id} both hold {party_name(index)}")
            node_of[index] = node_id
        missing = [party_name(j) for j in self.recipe.others if j not in node_of]
        if missing:
            raise FederationError(
                f"no Flower node holds {missing} (within {timeout:g} s); nodes hold "
                f"{[party_name(j) for j in sorted(node_of)]}"
            )
        return node_of

    def exchange(
        self, op: str, commands: Mapping[int, tuple[dict[str, Any], dict[str, torch.Tensor]]]
    ) -> dict[int, dict[str, torch.Tensor]]:
        outgoing = []
        for j, (command, tensors) in commands.items():
            content = RecordDict(
                {m.CONFIG: self._config(**{OP: op, COMMAND: json.dumps(command)}), m.TENSORS: m.to_record(tensors)}
            )
            outgoing.append(
                Message(
                    content,
                    dst_node_id=self.node_of[j],
                    message_type=MessageType.TRAIN,
                    group_id=op,
                    ttl=self.reply_timeout,
                )
            )
        replies = {}
        for j, reply in zip(commands, send_and_receive(self.grid, outgoing, self.reply_timeout)):
            if reply is None or reply.has_error():
                raise FederationError(
                    f"{party_name(j)} (node {self.node_of[j]}) did not answer {op!r}: "
                    f"{'no reply' if reply is None else reply.error.reason}"
                )
            replies[j] = m.to_tensors(reply.content[m.TENSORS])
        return replies


class VerticalSimulation:
    """``run()`` runs ``drive(hub)`` in a ServerApp with the label party, each other party a simulated node; returns
    the hub and what ``drive`` returned. At the end every party saves its networks into its own directory
    (``party_directory``), which the harness, owning every node's directory on this machine, may read."""

    def __init__(
        self,
        recipe: VerticalRecipe,
        root: str | Path,
        drive: Callable[[VerticalHub], Any],
        nodes_timeout: float = 900.0,
    ) -> None:
        self.recipe, self.drive, self.nodes_timeout = recipe, drive, nodes_timeout
        """How long the label party waits for every node to say which party it holds: the Ray actor starts on the
        first message, which took over 120 s on the 2-core machine under a full load."""
        self.root = Path(root).resolve()
        self.nodes_root = self.root / NODES

    def party_directory(self, index: int) -> Path:
        return party_directory(self.root, index)

    def run(self) -> tuple[VerticalHub, Any]:
        done: dict[str, Any] = {}
        app = ServerApp()

        @app.main()
        def main(grid: Grid, context: Context) -> None:
            try:
                torch.set_num_threads(self.recipe.threads)
                label = self.recipe.build_party(self.recipe.label)
                transport = FlowerTransport(grid, self.recipe, nodes_timeout=self.nodes_timeout)
                hub = VerticalHub(self.recipe, label, transport, self.party_directory(self.recipe.label))
                done["result"] = self.drive(hub)
                hub.save_parties()
                done["hub"] = hub
            except BaseException as error:
                done["failure"] = error
                raise

        try:
            nodes = party_client_app(PartyNodeHandlers(self.recipe, self.nodes_root))
            with kept_ray_backend():
                run_simulation(
                    server_app=app,
                    client_app=nodes,
                    num_supernodes=len(self.recipe.others),
                    backend_config=ray_backend_config(self.recipe.threads, self.recipe.device),
                )
        except RuntimeError:
            if "failure" not in done:
                raise
        if "failure" in done:  # Flower only logs what stopped the ServerApp: raise it here
            raise done["failure"]
        return done["hub"], done["result"]
