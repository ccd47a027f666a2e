"""The node side on Flower: a ClientApp that runs the engine's own client step (``LocalTrainer.client_round``).

A process builds one ``LocalTrainer`` per run from the recipe, on the first message it gets (as the engine
builds its one model), and serves whichever client a message is for: on Ray one worker serves the clients
in turn, as the engine does. Which client a node is comes from its node config: ``client-id`` (a
deployment) or ``partition-id`` (the simulation numbers its nodes; the n-th client id of the task).

A client's private state (``NodeState``) is kept in the node's ``Context.state`` and in its own directory
(``state-dir`` in the node config, or ``<nodes root>/<client id>`` in a simulation), written before the
reply leaves. It is never put in a message. Each message says from which round's state to go on: the last
round the server counted for this client (``node_state`` says why).

On silo-local data (``CellRecipe.silo``) a node builds its client's task from that client's directory alone
(``data-dir`` in the node config, or ``<silos root>/<client id>`` in a simulation): a process builds one trainer per
client it serves. A task scored on one global set is then scored by the clients: each scores the global model on its
share of the set and answers the counts the scores are computed from (``FederatedTask.evaluation_counts``).

A client whose own training diverges answers with ``messages.diverged_reply``, on which the server stops the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedrepro.errors import FedreproError, TrainingDiverged
from fedrepro.channel import Channel
from fedrepro.fl.engine import FIT, LocalTrainer, score_split, scoring
from fedrepro.fl.flower import messages as m
from fedrepro.fl.flower.common import CLIENT_ID_KEY, DATA_DIR_KEY, PARTITION_ID_KEY, STATE_DIR_KEY
from fedrepro.fl.flower.node_state import NodeState, NodeStateStore, decode
from fedrepro.fl.recipe import CellRecipe
from fedrepro.fl.silo import read_manifest

STATE_KEY, STATE_BYTES = "fedrepro", "node_state"
SERVES_NONE = ""
"""The client id a node answers when it serves no client of the run (a shared node numbered past its clients)."""

_trainers: dict[tuple[str, Path | None], LocalTrainer] = {}
"""This process's trainer, by run fingerprint and silo directory (one at a time: another frees the previous model)."""


def trainer_for(recipe: CellRecipe, data_dir: Path | None = None) -> LocalTrainer:
    """The trainer of the run (on silo-local data: of the client whose directory is ``data_dir``)."""
    key = (recipe.fingerprint, data_dir)
    if key not in _trainers:
        _trainers.clear()
        task, algorithm = recipe.build_node(data_dir)
        trainer = LocalTrainer(task, algorithm, recipe.settings)
        trainer.task = algorithm.prepare_task(task, Channel(), recipe.settings.seed)  # as the engine, after the model
        _trainers[key] = trainer
    return _trainers[key]


class WrongRun(FedreproError):
    """A message from a server that runs another cell than the one this node was started for."""


@dataclass(frozen=True)
class NodeHandlers:
    """What a node does with each kind of message. Module-level, so Ray ships it by reference and every
    message a worker handles finds the same trainer cache."""

    recipe: CellRecipe
    nodes_root: Path | None = None
    """Simulation: the folder holding one state directory per client."""

    def _check_run(self, config: ConfigRecord) -> None:
        if config[m.FINGERPRINT] != self.recipe.fingerprint:
            raise WrongRun(
                f"this node serves run {self.recipe.fingerprint[:12]}, the server runs "
                f"{str(config[m.FINGERPRINT])[:12]}: start the nodes with the server's recipe"
            )

    def client_id(self, context: Context) -> str | None:
        """A node on its own machine is told its client (``client-id``); a simulated node, or one of the numbered nodes
        a local deployment's cells share, its number (the task, or on silo-local data the silos' manifest, maps it).
        None: a shared node numbered past this run's clients, which serves none."""
        if CLIENT_ID_KEY in context.node_config:
            return str(context.node_config[CLIENT_ID_KEY])
        partition = int(context.node_config[PARTITION_ID_KEY])
        if self.recipe.silo is not None:
            client_ids = read_manifest(self.recipe.silo.root).client_ids
        else:
            client_ids = trainer_for(self.recipe).task.client_ids
        return client_ids[partition] if partition < len(client_ids) else None

    def served_client(self, context: Context) -> str:
        """The client this node serves in the run (a message for a node that serves none is a server's error)."""
        client_id = self.client_id(context)
        if client_id is None:
            raise FedreproError(
                f"node {context.node_config[PARTITION_ID_KEY]} serves no client of run "
                f"{self.recipe.fingerprint[:12]}, yet was sent a round"
            )
        return client_id

    def trainer(self, context: Context, client_id: str) -> LocalTrainer:
        """The trainer for ``client_id``: on silo-local data built from its directory alone, which must be its own."""
        if self.recipe.silo is None:
            return trainer_for(self.recipe)
        configured = context.node_config.get(DATA_DIR_KEY)
        data_dir = Path(str(configured)) if configured is not None else self.recipe.silo.root / client_id
        trainer = trainer_for(self.recipe, data_dir)
        if list(trainer.task.client_ids) != [client_id]:
            raise FedreproError(
                f"node of client {client_id}: its {DATA_DIR_KEY} {data_dir} holds the data of "
                f"{list(trainer.task.client_ids)}"
            )
        return trainer

    def store(self, context: Context, client_id: str) -> NodeStateStore:
        if STATE_DIR_KEY in context.node_config:
            return NodeStateStore(Path(str(context.node_config[STATE_DIR_KEY])), self.recipe.fingerprint)
        if self.nodes_root is None:
            raise FedreproError(
                f"node of client {client_id}: its node config has no {STATE_DIR_KEY!r} for its private state"
            )
        return NodeStateStore(self.nodes_root / client_id, self.recipe.fingerprint)

    def load_state(self, context: Context, store: NodeStateStore, config: ConfigRecord) -> NodeState:
        """The client's state after the last round the server counted: Context.state when it holds it, else the
        disk."""
        counted = int(config[m.COUNTED])
        on_disk = store.newest_round_until(counted)
        if STATE_KEY in context.state:
            cached, fingerprint = decode(context.state[STATE_KEY][STATE_BYTES])
            if fingerprint == self.recipe.fingerprint and on_disk is not None and cached.round_index == on_disk:
                return cached
        return store.latest_until(counted) or NodeState(-1, {})

    def identify(self, message: Message, context: Context) -> Message:
        self._check_run(message.content[m.CONFIG])
        client_id = self.client_id(context)
        return Message(RecordDict({m.CONFIG: ConfigRecord({m.CLIENT_ID: client_id or SERVES_NONE})}), reply_to=message)

    def train(self, message: Message, context: Context) -> Message:
        config = message.content[m.CONFIG]
        self._check_run(config)
        client_id, round_index = self.served_client(context), int(config[m.ROUND])
        trainer = self.trainer(context, client_id)
        store = self.store(context, client_id)
        state = self.load_state(context, store, config)
        try:
            result = trainer.client_round(
                round_index, client_id, m.to_tensors(message.content[m.TENSORS]), state.tensors
            )
        except TrainingDiverged as error:
            return m.diverged_reply(error, message)
        upload = m.to_record(result.upload)  # a copy, taken before anything else touches the model
        blob = store.save(NodeState(round_index, result.stored), started_from=state.round_index)
        context.state[STATE_KEY] = ConfigRecord({STATE_BYTES: blob})
        metrics = MetricRecord(
            {
                m.NUM_SAMPLES: result.num_samples,  # no train_loss: the client had no batch to train on
                **({} if result.train_loss is None else {m.TRAIN_LOSS: result.train_loss}),
            }
        )
        return Message(RecordDict({m.TENSORS: upload, m.METRICS: metrics}), reply_to=message)

    def evaluate(self, message: Message, context: Context) -> Message:
        """The client's own model (the global shared weights plus its private state after the last round the server
        counted) on its split; on silo-local data, a task scored on one global set: the global model on the client's
        training data (FIT) or the counts of its share of the split."""
        config = message.content[m.CONFIG]
        self._check_run(config)
        client_id, split = self.served_client(context), str(config[m.SPLIT])
        trainer = self.trainer(context, client_id)
        task = trainer.task
        if task.evaluates_global_model:  # silo-local: the global model (initial private tensors) on this client's share
            trainer.load(m.to_tensors(message.content[m.TENSORS]), {})
        else:
            state = self.load_state(context, self.store(context, client_id), config)
            trainer.load(m.to_tensors(message.content[m.TENSORS]), state.tensors)
        trainer.model.eval()
        if task.evaluates_global_model and split != FIT:
            with scoring(trainer.settings.precision, trainer.settings.device):
                scores = task.evaluation_counts(trainer.model, client_id, split)
        else:
            scores = score_split(task, trainer.model, client_id, split, trainer.settings)
        return Message(RecordDict({m.METRICS: MetricRecord(scores)}), reply_to=message)


def client_app(handlers: NodeHandlers) -> ClientApp:
    """A ClientApp whose query, train and evaluate messages go to ``handlers``."""
    app = ClientApp()

    @app.query()
    def identify(message: Message, context: Context) -> Message:
        return handlers.identify(message, context)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return handlers.train(message, context)

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        return handlers.evaluate(message, context)

    return app
