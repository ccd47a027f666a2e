"""The hooks an algorithm overrides around the engine's fixed round loop (in the spirit of Flower's strategies).

A new algorithm is a small subclass: it says which parameters stay private, what it adds to the local
objective, what extra state the server sends, and how the server aggregates. It never copies the loop. Its own
knobs are its nested ``Settings``, read from its entry ``algorithms.<name>`` of params.yaml.

Server hooks (``initial_server_state``, ``server_extras``, ``aggregate``, ``round_notes``) and client hooks
(``local_objective``, ``after_backward``, ``upload``) may run in different processes: on Flower the server
and every node build their own instance (``adapt_model`` and ``prepare_task`` run on each). So an attribute
one side sets is not seen by the other; what a client must keep goes in ``LocalContext.client_state``, what
the server sends goes in its state or ``server_extras``. ``tests/test_flower.py`` checks every algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Protocol, Sequence

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

if TYPE_CHECKING:
    from fedrepro.channel import Channel


@dataclass
class TaskOutput:
    """What a task's forward pass gives back: the task loss plus what algorithms may need to add terms."""

    loss: torch.Tensor
    logits: torch.Tensor | None = None
    features: torch.Tensor | None = None
    targets: torch.Tensor | None = None
    rerun: Callable[[nn.Module], "TaskOutput"] | None = None
    """The same batch through another model (MOON compares features with the global and previous models)."""


@dataclass
class LocalContext:
    """What a client knows while it trains in one round."""

    round: int
    client_id: str
    received: dict[str, torch.Tensor]
    client_state: dict[str, torch.Tensor] = field(default_factory=dict)
    """Tensors the client keeps between its rounds (e.g. SCAFFOLD's variate, MOON's previous model)."""
    steps: int = 0
    """Local optimizer steps taken this round."""
    round_sums: dict[str, torch.Tensor] = field(default_factory=dict)
    """What an algorithm accumulates over this client's round (SCAFFOLD's gradient sums); gone with the round, so
    a round trained again (a replay after a crash, a node that trained a round the server did not count) starts
    from nothing."""


@dataclass
class ClientUpdate:
    """What arrived at the server from one client (after the channel)."""

    client_id: str
    tensors: dict[str, torch.Tensor]
    num_samples: int


class FederatedTask(Protocol):
    """What the engine and the algorithms need from a task (QA matching, relation extraction, ...). A task subclasses
    it, so the members after ``evaluate``, which only some tasks have a use for, default for the others. (It sits here
    beside ``TaskOutput`` rather than in engine.py so a task module imports no more of the engine than it uses.)"""

    client_ids: list[str]
    evaluates_global_model: bool = False
    """True: scored as the server's (or the pooled) model on one global set, not as each client's model on its own."""

    def build_model(self) -> nn.Module: ...

    def num_train_samples(self, client_ids: Sequence[str]) -> int: ...

    def train_batches(self, client_ids: Sequence[str], generator: torch.Generator) -> Iterable[Any]: ...

    def forward(self, model: nn.Module, batch: Any) -> TaskOutput: ...

    def evaluate(self, model: nn.Module, client_id: str, split: str) -> dict[str, float]: ...

    def label_counts(self, client_id: str) -> torch.Tensor:
        """Training samples per class on one client (FedRS and FedLC scale logits by these)."""
        raise NotImplementedError(f"{type(self).__name__} has no class labels to count (FedRS and FedLC need them)")

    def diagnose_round(self, updates: list[ClientUpdate]) -> dict[str, Any] | None:
        """What the round's record should show about this round's uploads (before aggregation); None: nothing."""
        return None

    def evaluation_counts(self, model: nn.Module, client_id: str, split: str) -> dict[str, int]:
        """A task scored on one global set, on silo-local data: the counts its scores are computed from, of the model
        on this client's share of ``split`` (summed over the clients by ``scores_from_counts``)."""
        raise NotImplementedError(f"{type(self).__name__} is not scored from counts summed over its clients")

    def scores_from_counts(self, counts: dict[str, int]) -> dict[str, float]:
        """The scores of ``evaluate`` on the union of the shares whose ``evaluation_counts`` were summed."""
        raise NotImplementedError(f"{type(self).__name__} is not scored from counts summed over its clients")


@dataclass(frozen=True)
class CommonSettings:
    """What a paper's runs decide for whichever algorithm a cell runs (each algorithm's own knobs are its
    ``Settings``)."""

    weighting: str = "uniform"
    """How the server weights the uploads: ``uniform`` (1/K) or ``size`` (N_k / N)."""
    seed: int = 0
    """Seeds an algorithm's own random choices (FedCMC's random-vector ablation)."""


class Algorithm:
    """FedAvg behaviour by default: everything shared, plain task loss, (weighted) average of uploads."""

    name = "base"
    label = "base"
    """How reports name the algorithm."""
    federated = True
    """False: nothing crosses the network and every parameter stays on its client."""
    pooled = False
    """True: one client trains on the pooled data of all clients (not private; an upper bound)."""

    class Settings(BaseModel):
        """The algorithm's own knobs, read from params.yaml's ``algorithms.<name>`` entry; a subclass declares its
        own, validated (and frozen) like every other param, so a wrong knob stops a stage before its first cell."""

        model_config = ConfigDict(extra="forbid", frozen=True)
        set_per_cell: ClassVar[dict[str, str]] = {}
        """Knobs a paper's runs set for each cell (what a figure sweeps), with where params.yaml sets them; they are
        left out of ``algorithms.<name>``, which would otherwise give a second value that the cell overrides."""

    def __init__(self, settings: Settings, common: CommonSettings) -> None:
        if type(settings) is not self.Settings:
            raise TypeError(f"{self.name} takes {self.Settings.__qualname__}, not {type(settings).__qualname__}")
        self.settings, self.common = settings, common

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """Called once on the freshly built model, before private names are read: inject modules, read structure."""
        return model

    def prepare_task(self, task: Any, channel: Channel, seed: int) -> Any:
        """What clients send of their data before training starts (through ``channel``); by default nothing."""
        return task

    def initial_server_state(self, global_weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the server holds before round 1: the shared weights, plus any server tensors (SCAFFOLD's variate).

        Everything the server holds is checkpointed and, but for what ``is_server_only`` names, sent to the sampled
        clients each round.
        """
        return global_weights

    def is_server_only(self, name: str) -> bool:
        """Server state that never leaves the server (FedDyn's h): kept and checkpointed, never sent."""
        return False

    def is_private(self, name: str) -> bool:
        """Parameters that never leave their client; the engine keeps them per client between rounds."""
        return not self.federated

    def server_extras(self, round_index: int) -> dict[str, torch.Tensor]:
        """Extra tensors the server sends with the model this round (e.g. control variates)."""
        return {}

    def local_objective(self, model: nn.Module, output: TaskOutput, context: LocalContext) -> torch.Tensor:
        """The loss a client minimises; algorithms add terms to (or reshape) the task loss here."""
        return output.loss

    def after_backward(self, model: nn.Module, context: LocalContext) -> None:
        """Called after each local backward pass, before clipping and the optimizer step (SCAFFOLD reads gradients
        here)."""

    def upload(self, shared: dict[str, torch.Tensor], context: LocalContext) -> dict[str, torch.Tensor]:
        """What a client sends after local training; by default its shared parameters.

        Runs before the client's state is stored, so it may also update ``context.client_state``.
        """
        return shared

    def round_notes(self) -> dict[str, Any]:
        """Anything this round's aggregation decided that the report should show (kept in the history)."""
        return {}

    def aggregation_weights(self, updates: list[ClientUpdate]) -> list[float]:
        if self.common.weighting == "size":
            total = sum(u.num_samples for u in updates)
            return [u.num_samples / total for u in updates]
        return [1.0 / len(updates)] * len(updates)

    def aggregate(
        self, global_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]
    ) -> dict[str, torch.Tensor]:
        """New global shared weights from this round's uploads: theta = sum_k p_k theta_k (fixed order)."""
        weights = self.aggregation_weights(updates)
        result = {}
        for name in global_weights:
            total = torch.zeros_like(global_weights[name])
            for weight, update in zip(weights, updates):
                total.add_(update.tensors[name], alpha=weight)
            result[name] = total
        return result
