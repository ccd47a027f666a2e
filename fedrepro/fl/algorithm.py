"""The hooks an algorithm overrides around the engine's fixed round loop (in the spirit of Flower's strategies).

A new algorithm is a small subclass: it says which parameters stay private, what it adds to the local
objective, what extra state the server sends, and how the server aggregates. It never copies the loop.

Server hooks (``initial_server_state``, ``server_extras``, ``aggregate``, ``round_notes``) and client hooks
(``local_objective``, ``after_backward``, ``upload``) may run in different processes: on Flower the server
and every node build their own instance (``adapt_model`` and ``prepare_task`` run on each). So an attribute
one side sets is not seen by the other; what a client must keep goes in ``LocalContext.client_state``, what
the server sends goes in its state or ``server_extras``. ``tests/test_flower.py`` checks every algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

import torch
from torch import nn

if TYPE_CHECKING:
    from fedrepro.fl.channel import Channel
    from fedrepro.models.patches import PatchSpec


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


@dataclass(frozen=True)
class AlgorithmSettings:
    weighting: str = "uniform"
    fedprox_mu: float = 0.0
    patch: PatchSpec | None = None
    """FedMatch: the private patch injected into the backbone."""
    shared_layers: int | None = None
    """FedMatch: bottom encoder layers shared; the layers above are private too (None: all shared)."""
    fidelity: str = "paper"
    """FedMatch: ``released_code`` also keeps every LayerNorm private, as the authors' code does."""
    lg_local_layers: int | None = None
    """LG-FedAvg: bottom encoder layers (with the embeddings) kept local (None: half of them)."""
    cover_queries: int = 0
    """CoverQuery: generated cover questions sent with each real one."""
    seed: int = 0
    """Seeds an algorithm's own random choices (FedCMC's random-vector ablation)."""
    fedcmc_mu: float = 0.0
    """FedCMC: weight of the contrastive term against the major classifier vectors."""
    fedcmc_temperature: float = 1.0
    fedcmc_vectors: str = "major"
    """FedCMC ablation: which client's vector stands for each class (major | minor | random | none)."""
    moon_mu: float = 0.0
    moon_temperature: float = 0.5
    moon_projection_dim: int = 0
    """MOON: output size of the projection head on the relation features (0: no head, features used as they are)."""
    fedrs_alpha: float = 0.5
    """FedRS: logit scale of a class the client never saw (1 for its most frequent class)."""
    fedrs_mask: bool = False
    """FedRS: the binary present/absent mask instead of the author's count-scaled one."""
    fedlc_tau: float = 1.0


class Algorithm:
    """FedAvg behaviour by default: everything shared, plain task loss, (weighted) average of uploads."""

    name = "base"
    federated = True
    """False: nothing crosses the network and every parameter stays on its client."""
    pooled = False
    """True: one client trains on the pooled data of all clients (not private; an upper bound)."""

    def __init__(self, settings: AlgorithmSettings) -> None:
        self.settings = settings

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """Called once on the freshly built model, before private names are read: inject modules, read structure."""
        return model

    def prepare_task(self, task: Any, channel: Channel, seed: int) -> Any:
        """What clients send of their data before training starts (through ``channel``); by default nothing."""
        return task

    def initial_server_state(self, global_weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the server holds before round 1: the shared weights, plus any server tensors (SCAFFOLD's variate).

        Everything the server holds is checkpointed and sent to the sampled clients each round.
        """
        return global_weights

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
        """Called after each local backward pass, before clipping and the optimizer step (SCAFFOLD reads gradients here)."""

    def upload(self, shared: dict[str, torch.Tensor], context: LocalContext) -> dict[str, torch.Tensor]:
        """What a client sends after local training; by default its shared parameters.

        Runs before the client's state is stored, so it may also update ``context.client_state``.
        """
        return shared

    def round_notes(self) -> dict[str, Any]:
        """Anything this round's aggregation decided that the report should show (kept in the history)."""
        return {}

    def aggregation_weights(self, updates: list[ClientUpdate]) -> list[float]:
        if self.settings.weighting == "size":
            total = sum(u.num_samples for u in updates)
            return [u.num_samples / total for u in updates]
        return [1.0 / len(updates)] * len(updates)

    def aggregate(self, global_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
        """New global shared weights from this round's uploads: theta = sum_k p_k theta_k (fixed order)."""
        weights = self.aggregation_weights(updates)
        result = {}
        for name in global_weights:
            total = torch.zeros_like(global_weights[name])
            for weight, update in zip(weights, updates):
                total.add_(update.tensors[name], alpha=weight)
            result[name] = total
        return result
