"""The federated round loop, shared by every algorithm.

A round is three steps: the server opens it (samples clients, gathers what it sends), the sampled clients
train (``LocalTrainer.client_round``), and the server closes it (aggregates, records, evaluates). The
engine runs the middle step in process; the Flower runtime (``fedrepro/fl/flower/``) runs the very same
functions with the clients on Flower nodes, so no algorithm and no step of the loop is written twice.

Memory: one model lives in memory. The server keeps the shared weights (1x the shared part), each client
keeps only its private tensors between rounds (FedPer: a head; individual: a whole model per client, as
that method requires), and during aggregation the server holds the k uploads of the round (k x the shared
part). Optimizer moments restart every round (as in most FedAvg implementations). Each client's learning-rate
schedule (warm-up then linear decay over ``rounds`` rounds) follows the federation's clock, not the client's own
count of rounds: a client that starts round r is at step r x local_epochs x its batches per epoch, whatever rounds
it was not sampled in, so a client sampled in 2 rounds of 5 decays its rate as much as one sampled in all 5.

Determinism: every shuffle, dropout mask and client sample is seeded from (seed, round, client, epoch),
so a run restarted from its last checkpoint replays exactly what an uninterrupted run would have done.

Device: the model, its optimizer, the batches, the server's weights and every client's kept state live on
``settings.device`` (``fedrepro.device``); the model is built on the CPU under the run's seed and then moved, so it
starts from the same weights on every device, and shuffles and client samples are drawn on the CPU.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from fedrepro.device import configure, to_device
from fedrepro.errors import FederationError, TrainingDiverged
from fedrepro.fl.algorithm import Algorithm, ClientUpdate, FederatedTask, LocalContext
from fedrepro.channel import SERVER, Channel, Message, tensor_bytes, upload_problem
from fedrepro.fl.checkpoint import TrainingState, load_checkpoint, save_checkpoint
from fedrepro.seeding import derive_seed

POOLED = "pooled"
GLOBAL = "global"
FIT = "fit"
"""The pseudo-split scored with every evaluation besides ``eval_splits``: the evaluated model's task loss on the
training data it learned from. It is what the health rule reads as the training loss (``fedrepro.fl.health``), because a
round's mean local loss is not the federation's: under label skew a client fits its own classes within a few local
steps, so round 1's local loss (from scratch) is low and later rounds' (from the aggregate) are higher, even while the
aggregate's loss on the same training data falls (embedded FedAvg, alpha 0.05: local 1.09 -> 1.61 over 12 rounds,
the aggregate on the clients' data 3.50 -> 1.46)."""
PARAM, STATE = "param/", "state/"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSettings:
    rounds: int
    local_epochs: int
    clients_per_round: int
    lr: float
    batch_size: int
    warmup_fraction: float
    max_grad_norm: float
    seed: int
    eval_every: int = 1
    """Rounds between validation passes over every client (0: none; the test is scored after training anyway)."""
    precision: str = "fp32"
    """``bf16``: forward passes under bfloat16 autocast: training, the ``FIT`` loss and scoring. Weights, optimizer,
    losses and the models' scores and logits stay fp32 (see ``scoring``)."""
    fit_samples: int = 0
    """How many training samples the ``FIT`` loss of each evaluated model is measured on: the first
    ceil(fit_samples / batch_size) batches of one fixed shuffle, the same every round, so rounds compare on the same
    sample; 0: all. Scoring the whole training set each round was 18% of a CPU-scale FedMatch cell and 23% of a FedCMC
    one (issue 47, ``bench/bench_eval_share.py``), for a curve the health rule reads only for its trend."""
    steps_per_epoch: int = 0
    """0: a local epoch is one pass over the client's data. N: every client takes exactly N steps a local epoch
    (cycling over fresh shuffles of its data), so a large client's update does not outweigh the others by its step
    count as well as by its size: FedAvg's fixed point weights clients by samples x local steps (Wang et al. 2020,
    objective inconsistency), which gave one PGR client at alpha 0.05 86% of the weight for 65% of the data. That
    removes the inconsistency only; it did not make PGR's FedAvg train there (client drift remained, see
    reports/cpu/fedcmc/sanity-federated-pgr-steps7)."""
    eval_splits: tuple[str, ...] = ("valid",)
    """The splits scored every ``eval_every`` rounds: valid for the convergence rule (``fedrepro.fl.health``), and
    test where a paper plots it per round (FedCMC's Fig 3; nothing is selected on it)."""
    device: str = "cpu"
    """A resolved ``train.device`` (cpu, cuda, cuda:N): where the model, its training and its scoring run."""


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or Inf float in it (in dicts, lists, tuples) replaced by None: a round's record goes
    into the checkpoint's strict JSON, and a score with nothing to score (NaN) is no number."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(finite_or_none(item) for item in value)
    return value


def lr_factor(step: int, total: int, warmup_fraction: float) -> float:
    """Linear warm-up over the first ``warmup_fraction`` of steps, then linear decay to zero (the paper's schedule)."""
    warmup = int(total * warmup_fraction)
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


@dataclass
class ClientResult:
    """What one client's round produced: the upload for the server, and what the client keeps for itself."""

    upload: dict[str, torch.Tensor]
    """Tensors for the server (empty for a method that shares nothing); views of the live model, valid until the
    trainer's next round, so the caller sends (copies) them at once."""
    stored: dict[str, torch.Tensor]
    """The client's private parameters (``param/``) and algorithm state (``state/``): never sent anywhere."""
    train_loss: float | None
    """The mean local loss of the round; None for a client without training batches (it did not train)."""
    num_samples: int


def autocast(precision: str, device: str = "cpu") -> torch.autocast:
    """The forward passes' precision on ``device``: bfloat16 autocast for ``bf16``, plain fp32 otherwise."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")


@contextlib.contextmanager
def scoring(precision: str, device: str = "cpu") -> Iterator[None]:
    """Scoring as training runs its forward passes: without gradients, under ``precision`` (evaluation in fp32 beside
    bf16 training was most of a CPU-scale cell, issue 47). Each model computes its scores or logits from its features
    in fp32 when scoring (``fedrepro.models.heads``), so bf16's 8-bit mantissa does not tie them."""
    with torch.no_grad(), autocast(precision, device):
        yield


def fit_loss(
    task: FederatedTask, model: nn.Module, client_ids: Sequence[str], settings: EngineSettings
) -> dict[str, float]:
    """``model``'s task loss on the training data of ``client_ids``: the mean over the first batches of one fixed
    order (``settings.fit_samples``), in eval mode and without gradients (so no dropout and no weight moves); no loss
    for clients without training data. ``samples`` counts all their training data: the weight of this loss."""
    batches = task.train_batches(client_ids, torch.Generator().manual_seed(0))
    if settings.fit_samples:
        batches = itertools.islice(batches, math.ceil(settings.fit_samples / settings.batch_size))
    with scoring(settings.precision, settings.device):
        losses = [task.forward(model, batch).loss.item() for batch in batches]
    samples = {"samples": task.num_train_samples(client_ids)}
    return {"loss": float(np.mean(losses)), **samples} if losses else samples


def score_split(
    task: FederatedTask, model: nn.Module, client_id: str, split: str, settings: EngineSettings
) -> dict[str, float]:
    """One model on one client's ``split`` (or on the global sets, ``client_id`` GLOBAL); ``FIT``: on its training data.
    The engine and a Flower node both score through here, so both runtimes record the same numbers."""
    if split == FIT:
        return fit_loss(task, model, list(task.client_ids) if client_id == GLOBAL else [client_id], settings)
    with scoring(settings.precision, settings.device):
        return task.evaluate(model, client_id, split)


def mean_fit_loss(scores: dict[str, dict[str, float]]) -> float | None:
    """The training-sample-weighted mean of the ``FIT`` losses of a round's evaluated models."""
    scored = [(s["loss"], s["samples"]) for s in scores.values() if "loss" in s and s.get("samples")]
    if not scored:
        return None
    return float(sum(loss * n for loss, n in scored) / sum(n for _, n in scored))


class LocalTrainer:
    """The client side of a round on one model: load the received shared weights and a client's own stored
    state, train locally, and say what to upload and what to keep. The engine holds one for all its clients;
    a Flower node holds one for the clients it serves."""

    def __init__(self, task: FederatedTask, algorithm: Algorithm, settings: EngineSettings) -> None:
        self.task, self.algorithm, self.settings = task, algorithm, settings
        configure(settings.device)
        torch.manual_seed(derive_seed(settings.seed, "init"))
        self.model = algorithm.adapt_model(task.build_model()).to(settings.device)
        self.params = dict(self.model.named_parameters())
        self.shared_names = [n for n in self.params if not algorithm.is_private(n)]
        self.private_names = [n for n in self.params if algorithm.is_private(n)]
        self.initial_private = {n: self.params[n].detach().clone() for n in self.private_names}

    def members(self, client_id: str) -> list[str]:
        """The data owners behind a training id (the pooled trainer stands for every client)."""
        return list(self.task.client_ids) if client_id == POOLED else [client_id]

    def num_samples(self, client_id: str) -> int:
        return self.task.num_train_samples(self.members(client_id))

    def load(self, shared: dict[str, torch.Tensor], stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Put shared weights and a client's stored private tensors into the model; return its algorithm state.
        Autocast keeps its bf16 copies of the weights until its context closes, so one ``scoring`` context around
        several clients' models (``Engine.client_models``) would score them all with the first one's weights: the
        copies are dropped here, whenever the weights change under them."""
        with torch.no_grad():
            for name, value in shared.items():
                if name in self.params:
                    self.params[name].copy_(value)
            for name in self.private_names:
                self.params[name].copy_(stored.get(PARAM + name, self.initial_private[name]))
        torch.clear_autocast_cache()
        return {k[len(STATE) :]: v.to(self.settings.device) for k, v in stored.items() if k.startswith(STATE)}

    def stored_state(self, algorithm_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's private tensors and the algorithm's client state, as a client keeps them between rounds."""
        stored = {PARAM + n: self.params[n].detach().clone() for n in self.private_names}
        stored.update({STATE + k: v.detach().clone() for k, v in algorithm_state.items()})
        return stored

    def client_round(
        self, round_index: int, client_id: str, received: dict[str, torch.Tensor], stored: dict[str, torch.Tensor]
    ) -> ClientResult:
        """One client's part of a round: load, train locally, build the upload, keep the private rest."""
        received = to_device(received, self.settings.device)  # what arrived from a Flower node's wire is on the CPU
        context = LocalContext(round_index, client_id, received, self.load(received, stored))
        loss = self._train_local(client_id, round_index, context)
        upload = {}
        if self.algorithm.federated:
            upload = self.algorithm.upload({n: self.params[n] for n in self.shared_names}, context)
        return ClientResult(upload, self.stored_state(context.client_state), loss, self.num_samples(client_id))

    def steps_per_round(self, client_id: str) -> int:
        """Local steps of one round: local_epochs x (steps_per_epoch, or one pass over the client's batches)."""
        per_epoch = self.settings.steps_per_epoch or math.ceil(self.num_samples(client_id) / self.settings.batch_size)
        return self.settings.local_epochs * per_epoch

    def _epoch_batches(self, client_id: str, round_index: int, epoch: int) -> Iterator[Any]:
        """One local epoch's batches: one pass over the client's data, or with ``steps_per_epoch`` exactly that many
        batches, cycling over fresh shuffles (pass p > 0 of an epoch seeds its shuffle and dropout with p too)."""
        limit, taken, passes = self.settings.steps_per_epoch, 0, 0
        while True:
            key = (round_index, client_id, epoch) + ((passes,) if passes else ())
            generator = torch.Generator().manual_seed(derive_seed(self.settings.seed, "shuffle", *key))
            torch.manual_seed(derive_seed(self.settings.seed, "dropout", *key))
            before = taken
            for batch in self.task.train_batches(self.members(client_id), generator):
                yield batch
                taken += 1
                if taken == limit:
                    return
            passes += 1
            if not limit or taken == before:  # one pass asked for, or a client with no batch to cycle over
                return

    def _train_local(self, client_id: str, round_index: int, context: LocalContext) -> float | None:
        """Train one round; the mean task loss over its steps (None: the client has no training batch). A non-finite
        loss stops the run (``TrainingDiverged``) before its gradients reach the weights."""
        settings, model = self.settings, self.model
        model.train()
        # fused: one kernel over every tensor instead of a Python loop of small ops (issue 19: the loop was 30% of a
        # FedCMC CPU-scale step, mostly over the word embeddings); the same Adam, rounded differently.
        optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr, fused=True)
        per_round = self.steps_per_round(client_id)
        step, total = round_index * per_round, settings.rounds * per_round  # the federation's clock (module docstring)
        losses = []
        for epoch in range(settings.local_epochs):
            for batch in self._epoch_batches(client_id, round_index, epoch):
                for group in optimizer.param_groups:
                    group["lr"] = settings.lr * lr_factor(step, total, settings.warmup_fraction)
                with autocast(settings.precision, settings.device):
                    output = self.task.forward(model, batch)
                    output.rerun = functools.partial(self.task.forward, batch=batch)
                    objective = self.algorithm.local_objective(model, output, context)
                loss = output.loss.item()
                if not (math.isfinite(loss) and bool(torch.isfinite(objective.detach()))):
                    raise TrainingDiverged(
                        f"client {client_id} diverged in round {round_index + 1} at local step {context.steps + 1} "
                        f"of {per_round} (schedule step {step + 1} of {total}): training loss {loss}, objective "
                        f"{objective.item()} (lr {settings.lr:g}, max_grad_norm {settings.max_grad_norm:g})"
                    )
                optimizer.zero_grad(set_to_none=True)
                objective.backward()
                self.algorithm.after_backward(model, context)
                torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
                optimizer.step()
                losses.append(loss)
                context.steps += 1
                step += 1
        return float(np.mean(losses)) if losses else None


class Engine:
    """Runs ``settings.rounds`` rounds of: send -> local training -> upload -> aggregate -> evaluate -> checkpoint."""

    def __init__(
        self,
        task: FederatedTask,
        algorithm: Algorithm,
        settings: EngineSettings,
        checkpoint_dir: str | Path,
        fingerprint: str,
        progress: bool = True,
        on_round_end: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.task, self.algorithm, self.settings = task, algorithm, settings
        self.checkpoint_dir = Path(checkpoint_dir)
        self.fingerprint, self.progress, self.on_round_end = fingerprint, progress, on_round_end
        self.trainer = LocalTrainer(task, algorithm, settings)
        self.model, self.params = self.trainer.model, self.trainer.params
        self.shared_names, self.private_names = self.trainer.shared_names, self.trainer.private_names
        self.initial_private = self.trainer.initial_private
        self.train_ids = [POOLED] if algorithm.pooled else list(task.client_ids)
        self.channel = Channel()
        self.state = load_checkpoint(self.checkpoint_dir, fingerprint, settings.device) or TrainingState(
            fingerprint=fingerprint,
            global_weights=algorithm.initial_server_state(
                {n: self.params[n].detach().clone() for n in self.shared_names}
            )
            if algorithm.federated
            else {},
        )
        resumed = self.state.next_round > 0
        # On resume the data uploads are replayed into a scratch channel: the checkpoint's log already holds them.
        self.task = algorithm.prepare_task(task, Channel() if resumed else self.channel, settings.seed)
        self.trainer.task = self.task
        if resumed:
            self.channel.messages = [Message.from_record(record) for record in self.state.messages]
            self.channel.scalars = [Message.from_record(record) for record in self.state.scalars]

    # ----- state swapping: one model, per-client private tensors ---------------------------------------
    def load_client(self, client_id: str, shared: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Put the given shared weights and the client's private tensors into the one model; return its algorithm
        state."""
        return self.trainer.load(
            shared if shared is not None else self.state.global_weights, self.state.client_states.get(client_id, {})
        )

    def memory_bytes(self) -> dict[str, int]:
        """What the engine holds besides the one model: the server's shared weights and each client's private state."""
        per_client = [tensor_bytes(state) for state in self.state.client_states.values()]
        return {
            "model": tensor_bytes(self.params),
            "server_shared": tensor_bytes(self.state.global_weights),
            "private_per_client_max": max(per_client, default=0),
            "private_all_clients": sum(per_client),
        }

    # ----- the round loop ------------------------------------------------------------------------------
    def sample_clients(self, round_index: int) -> list[str]:
        k = self.settings.clients_per_round
        if self.algorithm.pooled or k == 0 or k >= len(self.train_ids):
            return list(self.train_ids)
        rng = np.random.default_rng(derive_seed(self.settings.seed, "sample", round_index))
        return [self.train_ids[i] for i in sorted(rng.choice(len(self.train_ids), size=k, replace=False))]

    def run(self) -> TrainingState:
        rounds = range(self.state.next_round, self.settings.rounds)
        for round_index in tqdm(
            rounds,
            desc=f"{self.algorithm.name} rounds",
            disable=not self.progress,
            initial=self.state.next_round,
            total=self.settings.rounds,
        ):
            record = self._run_round(round_index)
            self.state.history.append(record)
            self.state.next_round = round_index + 1
            self.state.messages = [m.to_record() for m in self.channel.messages]
            self.state.scalars = [m.to_record() for m in self.channel.scalars]
            save_checkpoint(self.checkpoint_dir, self.state)
            if self.on_round_end is not None:
                self.on_round_end(record)
        return self.state

    def _run_round(self, round_index: int) -> dict[str, Any]:
        sampled, outgoing = self.open_round(round_index)
        updates, losses, missed = self.train_clients(round_index, sampled, outgoing)
        return self.close_round(round_index, [c for c in sampled if c not in missed], updates, losses, missed)

    def open_round(self, round_index: int) -> tuple[list[str], dict[str, torch.Tensor]]:
        """The server's first step: which clients train this round, and what it sends each of them."""
        extras = self.algorithm.server_extras(round_index)
        sampled = self.sample_clients(round_index)
        outgoing = (
            {
                name: tensor
                for name, tensor in {**self.state.global_weights, **extras}.items()
                if not self.algorithm.is_server_only(name)
            }
            if self.algorithm.federated
            else {}
        )
        return sampled, outgoing

    def train_clients(
        self, round_index: int, sampled: list[str], outgoing: dict[str, torch.Tensor]
    ) -> tuple[list[ClientUpdate], list[float | None], dict[str, str]]:
        """In process: each sampled client trains in turn on the one model; the engine keeps its private state (as
        a Flower node keeps its own). An upload the server must not aggregate is refused and is the client's miss,
        and the client keeps the state it started the round with: a round the server did not count never happened
        for the federation (SCAFFOLD's c stays the mean of every c_k), as on a Flower node."""
        federated = self.algorithm.federated
        received = self.channel.broadcast(round_index, SERVER, sampled, outgoing) if federated else {}
        updates, losses, missed = [], [], {}
        for client_id in tqdm(sampled, desc=f"round {round_index + 1} clients", leave=False, disable=not self.progress):
            result = self.trainer.client_round(
                round_index, client_id, received, self.state.client_states.get(client_id, {})
            )
            if federated:
                problem = upload_problem(client_id, result.upload, self.state.global_weights, self.shared_names)
                if problem is not None:
                    log.error("round %d: rejected %s", round_index + 1, problem)
                    missed[client_id] = f"rejected: {problem}"
                    continue
                arrived = self.channel.send(round_index, client_id, SERVER, result.upload)
                updates.append(ClientUpdate(client_id, arrived, result.num_samples))
            self.state.client_states[client_id] = result.stored
            losses.append(result.train_loss)
        return updates, losses, missed

    def close_round(
        self,
        round_index: int,
        clients: list[str],
        updates: list[ClientUpdate],
        losses: list[float | None],
        missed: dict[str, str],
    ) -> dict[str, Any]:
        """The server's last step: aggregate the uploads that arrived, record the round, evaluate when due.

        ``clients`` are those that delivered; ``missed`` says why each other sampled client did not. The round's
        train_loss is the mean over the clients that trained (None when none had a batch)."""
        algorithm = self.algorithm
        if algorithm.federated and not updates:
            raise FederationError(f"round {round_index + 1}: no client delivered an update ({missed})")
        trained = [loss for loss in losses if loss is not None]
        record: dict[str, Any] = {
            "round": round_index + 1,
            "clients": clients,
            "train_loss": float(np.mean(trained)) if trained else None,
        }
        if missed:
            record["missed"] = missed
        if algorithm.federated:
            diagnostics = self.task.diagnose_round(updates)
            if diagnostics is not None:
                record["diagnostics"] = diagnostics
            self.state.global_weights = algorithm.aggregate(self.state.global_weights, updates)
            record.update(algorithm.round_notes())
        record.update({f"bytes_{k}": v for k, v in self.channel.round_bytes(round_index).items()})
        if self.settings.eval_every and (round_index + 1) % self.settings.eval_every == 0:
            for split in (FIT, *self.settings.eval_splits):
                record[split] = self.evaluate(split)
            record["fit_loss"] = mean_fit_loss(record[FIT])
        return finite_or_none(record)

    # ----- evaluation ----------------------------------------------------------------------------------
    def client_models(self) -> Iterator[tuple[str, nn.Module]]:
        """Each client's own model (global shared + its private tensors) in eval mode, one after the other.

        A pooled (centralised) run yields its one model for every client.
        """
        for client_id in self.task.client_ids:
            self.load_client(POOLED if self.algorithm.pooled else client_id)
            self.model.eval()
            yield client_id, self.model

    def global_model(self) -> nn.Module:
        """The server's model (shared weights, initial private ones) in eval mode: what a non-personalised method ships.
        A pooled run's one model stands in for it (a centralised reference is scored as the global model is)."""
        if self.algorithm.pooled:
            self.load_client(POOLED)
        else:
            self.trainer.load(self.state.global_weights, {})
        self.model.eval()
        return self.model

    def evaluates_global_model(self) -> bool:
        """True when the task scores the server's (or the pooled) model on one global set (no client takes part)."""
        return self.task.evaluates_global_model and (self.algorithm.federated or self.algorithm.pooled)

    def evaluate(self, split: str) -> dict[str, dict[str, float]]:
        """Each client's own model on its own ``split``; for a task scored on one global set, the global model on it."""
        settings = self.settings
        if self.evaluates_global_model():
            return {GLOBAL: score_split(self.task, self.global_model(), GLOBAL, split, settings)}
        return {
            client_id: score_split(self.task, model, client_id, split, settings)
            for client_id, model in self.client_models()
        }
