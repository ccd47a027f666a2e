"""The server side on Flower: the engine's own round loop, with the clients' step sent to Flower nodes.

``FlowerServer`` is an ``Engine`` whose ``_run_round`` keeps ``open_round`` and ``close_round`` (sampling,
aggregation, the record, evaluation, checkpoints: the same code) and replaces only the in-process client
loop by one message per sampled node and its reply. It never holds a client's private state: nodes keep
it. Every tensor of every message passes the channel (names and bytes) exactly as in the engine, and the
scalars beside them (a node's client id, sample counts, losses, metrics) pass its scalar log.

Nodes are told apart by the client id they answer to a first query, so sampling picks the same clients
as the engine's. The run starts once every client's node is connected, or after ``nodes_timeout`` with those that
are; a node that connects later is asked at the start of the next round and trains from then on (a client with no
node is its round's miss, ``NO_NODE``, and is sent nothing). A node that does not answer, fails (its ClientApp
raised or crashed), or uploads tensors the server must not aggregate (unknown or missing names, wrong shapes, NaN
or Inf: the check the engine makes too) is left out of that round, and so is one whose reply lacks its metrics or
claims another sample count than its client's declared training size (docs/flower.md, "Trust model"); the round's
record says which client missed and why, and the global model is built from the others only. A node whose client's
own training diverged stops the run with ``TrainingDiverged``, as in the engine: a cell that goes on without a
diverging client would hide it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedrepro.errors import FederationError, TrainingDiverged
from fedrepro.fl.algorithm import Algorithm, ClientUpdate, FederatedTask
from fedrepro.channel import SERVER, upload_problem
from fedrepro.fl.engine import FIT, GLOBAL, Engine, mean_fit_loss
from fedrepro.fl.flower import messages as m
from fedrepro.fl.flower.client import SERVES_NONE
from fedrepro.fl.flower.common import NODES_TIMEOUT, send_and_receive
from fedrepro.fl.flower.node_state import counted_round
from fedrepro.fl.recipe import CellRecipe

log = logging.getLogger(__name__)
NO_NODE = "no node serves it"
"""A sampled client's miss while no connected node has said it serves it (a silo that has not joined yet)."""


class FlowerServer(Engine):
    """The engine's loop driving Flower nodes through a ``Grid`` (see the module docstring)."""

    def __init__(
        self,
        recipe: CellRecipe,
        task: FederatedTask,
        algorithm: Algorithm,
        checkpoint_dir: str | Path,
        progress: bool = True,
        on_round_end: Callable[[dict[str, Any]], None] | None = None,
        reply_timeout: float | None = None,
        nodes_timeout: float = NODES_TIMEOUT,
    ) -> None:
        super().__init__(task, algorithm, recipe.settings, checkpoint_dir, recipe.fingerprint, progress, on_round_end)
        self.recipe = recipe
        self.reply_timeout, self.nodes_timeout = reply_timeout, nodes_timeout
        self.grid: Grid | None = None
        self.failure: BaseException | None = None
        """What stopped ``serve``, for the harness (Flower itself only reports that the ServerApp failed)."""
        self.node_of: dict[str, int] = {}
        self.spare_nodes: set[int] = set()
        """Nodes that answered they serve no client of this run (a local deployment's shared nodes past its clients)."""
        self._round = -1
        self._delivered: list[str] = []
        """The clients whose update the round being closed counts (its record is not in the history yet)."""

    # ----- what the ServerApp runs ----------------------------------------------------------------------
    def serve(self, grid: Grid) -> None:
        """Learn which node holds which client, then run the engine's rounds from where the checkpoint left off."""
        self.grid = grid
        self._wait_for_nodes()
        self._identify_new_nodes()
        if not self.node_of:
            raise FederationError(
                f"no Flower node said it serves a client of this run (nodes wait "
                f"{self.nodes_timeout:g} s; the ServerApp's log names nodes that failed to answer)"
            )
        Engine.run(self)

    def server_app(self) -> ServerApp:
        app = ServerApp()

        @app.main()
        def main(grid: Grid, context: Context) -> None:
            try:
                self.serve(grid)
            except BaseException as error:
                self.failure = error
                raise

        return app

    # ----- messages --------------------------------------------------------------------------------------
    def _exchange(
        self, message_type: str, contents: dict[str, RecordDict], round_index: int
    ) -> dict[str, Message | None]:
        """Send one message per client and wait for the replies; a client without a reply maps to None. With a reply
        timeout the messages expire with it, so a node that comes back later never works on a finished round."""
        outgoing = [
            Message(
                content=content,
                dst_node_id=self.node_of[client_id],
                message_type=message_type,
                group_id=str(round_index),
                ttl=self.reply_timeout,
            )
            for client_id, content in contents.items()
        ]
        return dict(zip(contents, send_and_receive(self.grid, outgoing, self.reply_timeout)))

    def _silence(self) -> str:
        """A miss without any reply, not even the SuperLink's for an offline node: the node stayed silent the whole
        ``train.reply_timeout``."""
        return "no reply" + (f" within train.reply_timeout ({self.reply_timeout:g} s)" if self.reply_timeout else "")

    def _config(self, round_index: int, **extra: Any) -> ConfigRecord:
        return ConfigRecord({m.ROUND: round_index, m.FINGERPRINT: self.fingerprint, **extra})

    def _counted_round(self, client_id: str) -> int:
        """The last round whose update from ``client_id`` this server counted: the node goes on from its state
        after that round (``node_state``), whatever it did in a round whose reply came late or was refused."""
        return self._round if client_id in self._delivered else counted_round(self.state.history, client_id)

    def _wait_for_nodes(self) -> None:
        """Until one node per training client is connected, or ``nodes_timeout`` s have passed."""
        deadline = time.monotonic() + self.nodes_timeout
        while len(list(self.grid.get_node_ids())) < len(self.train_ids) and time.monotonic() < deadline:
            time.sleep(0.5)

    def _identify_new_nodes(self) -> None:
        """Ask every connected node not yet known which client it serves, waiting for the answers as long as for a
        round's replies. A node restarted with its key keeps its node id, so only a node that never answered is
        asked; one that does not answer in time, or fails to, is asked again before the next round (a node that
        fails must not stop a running federation). Each training client must be served by exactly one node; a node
        that serves none (``SERVES_NONE``) is left alone for the run."""
        known = set(self.node_of.values()) | self.spare_nodes
        new = sorted(set(self.grid.get_node_ids()) - known)
        outgoing = [
            Message(
                content=RecordDict({m.CONFIG: self._config(-1)}),
                dst_node_id=node_id,
                message_type=MessageType.QUERY,
                group_id="identify",
            )
            for node_id in new
        ]
        node_of = dict(self.node_of)
        for node_id, reply in zip(new, send_and_receive(self.grid, outgoing, self.reply_timeout or self.nodes_timeout)):
            if reply is None or reply.has_error():
                log.warning(
                    "node %s did not say which client it serves: %s",
                    node_id,
                    "no reply" if reply is None else reply.error.reason,
                )
                continue
            client_id = str(reply.content[m.CONFIG][m.CLIENT_ID])
            if client_id == SERVES_NONE:
                self.spare_nodes.add(node_id)
                continue
            self.channel.send_scalars(-1, client_id, SERVER, {m.CLIENT_ID: client_id})
            if client_id in node_of:
                raise FederationError(f"nodes {node_of[client_id]} and {node_id} both serve client {client_id}")
            node_of[client_id] = node_id
        self.node_of = {client_id: node_of[client_id] for client_id in self.train_ids if client_id in node_of}
        unserved = [client_id for client_id in self.train_ids if client_id not in self.node_of]
        if unserved:
            log.warning(
                "no Flower node serves client(s) %s yet: each misses the rounds that sample it until its node joins",
                unserved,
            )

    # ----- one round -------------------------------------------------------------------------------------
    def _run_round(self, round_index: int) -> dict[str, Any]:
        self._round, self._delivered = round_index, []
        if len(self.node_of) < len(self.train_ids):
            self._identify_new_nodes()
        sampled, outgoing = self.open_round(round_index)
        reachable = [client_id for client_id in sampled if client_id in self.node_of]
        received = m.to_record(self.channel.broadcast(round_index, SERVER, reachable, outgoing))
        contents = {
            client_id: RecordDict(
                {
                    m.TENSORS: received,
                    m.CONFIG: self._config(round_index, **{m.COUNTED: self._counted_round(client_id)}),
                }
            )
            for client_id in reachable
        }
        replies = self._exchange(MessageType.TRAIN, contents, round_index)
        updates, losses, missed = [], [], {}
        for client_id in sampled:
            if client_id not in self.node_of:
                missed[client_id] = NO_NODE
                continue
            reply = replies[client_id]
            diverged = m.divergence(reply)
            if diverged is not None:
                raise TrainingDiverged(
                    f"Flower node {reply.metadata.src_node_id} of client {client_id}, round "
                    f"{round_index + 1}: {diverged}"
                )
            if reply is None or reply.has_error():
                missed[client_id] = self._silence() if reply is None else f"node error: {reply.error.reason}"
                continue
            problem = self._reply_problem(client_id, reply)
            upload = m.to_tensors(reply.content[m.TENSORS]) if problem is None else {}
            problem = problem or upload_problem(client_id, upload, self.state.global_weights, self.shared_names)
            if problem is not None:
                log.error("round %d: rejected %s", round_index + 1, problem)
                missed[client_id] = f"rejected: {problem}"
                continue
            arrived = self.channel.send(round_index, client_id, SERVER, upload)
            scalars = self.channel.send_scalars(round_index, client_id, SERVER, dict(reply.content[m.METRICS]))
            updates.append(ClientUpdate(client_id, arrived, int(scalars[m.NUM_SAMPLES])))
            losses.append(float(scalars[m.TRAIN_LOSS]) if m.TRAIN_LOSS in scalars else None)
        self._delivered = [update.client_id for update in updates]
        return self.close_round(round_index, [u.client_id for u in updates], updates, losses, missed)

    def _reply_problem(self, client_id: str, reply: Message) -> str | None:
        """Why a train reply cannot be counted before its tensors are even read, or None: a record missing, or a
        sample count other than the client's declared training size. The server checks the count because under
        ``weighting: size`` it is the client's weight N_k / N, so a silo claiming 1e9 samples would take over the
        model; the sizes are the partition's, which the server's own copy of the task declares."""
        missing = [name for name in (m.TENSORS, m.METRICS) if name not in reply.content]
        if missing:
            return f"client {client_id}: its reply holds no {' and no '.join(repr(name) for name in missing)} record"
        claimed, declared = reply.content[m.METRICS].get(m.NUM_SAMPLES), self.trainer.num_samples(client_id)
        if claimed != declared:
            return f"client {client_id}: {m.NUM_SAMPLES} {claimed} is not its declared training size {declared}"
        return None

    def evaluate(self, split: str) -> dict[str, dict[str, float]]:
        """Each node scores its client's own model (the global shared weights it is sent plus its private state)
        on its own split; a task scored on one global set is scored by the server, as in the engine, unless the
        server holds no client data (silo-local: ``silo_global_scores``)."""
        if self.evaluates_global_model():
            return {GLOBAL: self.silo_global_scores(split)} if self.recipe.silo is not None else super().evaluate(split)
        return self._client_scores(split)

    def silo_global_scores(self, split: str) -> dict[str, float]:
        """The global model scored by the clients on their shares of the global ``split`` (disjoint, their union the
        set): the server sums the counts they send and scores those, which equals the engine's score on the whole
        set bit for bit. FIT, the global model's loss on the training data, is the training-sample-weighted mean of
        the clients' mean batch losses on their own data: not the engine's number, whose batches mix every client's
        rows. A client that does not answer, or that no node serves yet (a late silo), leaves its share out of the
        scores (logged)."""
        answered = self._client_scores(split)
        if split == FIT:
            return {"loss": mean_fit_loss(answered), "samples": sum(s.get("samples", 0) for s in answered.values())}
        totals: dict[str, int] = {}
        for counts in answered.values():
            for name, count in counts.items():
                totals[name] = totals.get(name, 0) + int(count)
        return self.task.scores_from_counts(totals)

    def _client_scores(self, split: str) -> dict[str, dict[str, float]]:
        """What each connected node answers for ``split`` (scores of its client's model, or counts), by client."""
        clients = [client_id for client_id in self.task.client_ids if client_id in self.node_of]
        shared = {name: self.state.global_weights[name] for name in self.shared_names}
        sent = m.to_record(self.channel.broadcast(self._round, SERVER, clients, shared))
        contents = {
            client_id: RecordDict(
                {
                    m.TENSORS: sent,
                    m.CONFIG: self._config(self._round, **{m.SPLIT: split, m.COUNTED: self._counted_round(client_id)}),
                }
            )
            for client_id in clients
        }
        replies = self._exchange(MessageType.EVALUATE, contents, self._round)
        scores = {}
        for client_id, reply in replies.items():
            if reply is None or reply.has_error():
                log.warning(
                    "round %d: client %s did not score its model (%s)",
                    self._round + 1,
                    client_id,
                    self._silence() if reply is None else reply.error.reason,
                )
                continue
            scores[client_id] = self.channel.send_scalars(
                self._round, client_id, SERVER, dict(reply.content[m.METRICS])
            )
        return scores
