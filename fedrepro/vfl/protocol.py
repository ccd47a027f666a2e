"""The vertical split-learning exchange of SS-VFNAS, over the shared ``Channel``.

Parties 0..K-1 hold different features of the same aligned samples; each owns a bottom network Net_j. The
label party (index ``label``) also owns the labels and the top network Net_c. One pass on a batch:

1. every party computes N_j = Net_j(its own feature rows) -- nothing but its own tensor is ever read;
2. every other party j sends N_j (after the forward Gaussian mechanism) to the label party: one message,
   ``activation/party_j/<split>``; the label party's own N_K stays local (no message);
3. the label party concatenates [N_0 .. N_{K-1}] along dim 1 (in party order), applies Net_c and the loss;
   the received N_j are fresh leaf tensors on its side, so backprop stops there and yields dL/dN_j;
4. it returns dL/dN_j (after the backward mechanism) to party j: one message, ``gradient/party_j/<split>``;
5. party j backprops that gradient through its own graph into its own parameters (weights and alphas).

A pass may carry several batches at once (e.g. MiLeNAS's train and validation batch, evaluated at the same
parameters): each party then sends ONE message holding one tensor per split, so the parallel passes cost one
forward and one backward exchange. Every message of a training step is logged on ``channel`` with the step as
its round; evaluation goes to ``eval_channel``, so the per-step cost only counts the search. ``step_cost``
derives messages, bytes and sequential exchanges (maximal runs of messages in one direction) from the log.

Gradients are returned functionally (``torch.autograd.grad``, one list per party and split) rather than
accumulated into ``.grad``: the search rules need the train and validation gradients of the same parameters
separately (MiLeNAS mixes them, DARTS second order evaluates them at perturbed weights).

Randomness: DP noise comes from a generator seeded by ``derive_seed(seed, "dp", step, exchange, party,
split)``, so a run resumed at a step boundary draws exactly the noise of an uninterrupted run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedrepro.data.vertical import VerticalDataset
from fedrepro.errors import DataError
from fedrepro.channel import Channel, Message
from fedrepro.seeding import derive_seed
from fedrepro.vfl.privacy import GaussianMechanism, PrivacyLedger

ACTIVATION, GRADIENT, GRADNORM = "activation/", "gradient/", "gradnorm/"
# one mechanism for every sending party, or one per party: a length-K sequence indexed by party (the label
# party's entry is unused) or a mapping party index -> mechanism; None = no DP
MechanismSpec = GaussianMechanism | Sequence[GaussianMechanism | None] | Mapping[int, GaussianMechanism | None] | None


def party_name(index: int) -> str:
    return f"party_{index}"


def noise_generator(seed: int, key: tuple, *parts: object) -> torch.Generator:
    """The generator of one DP draw: every process that applies a mechanism (a party's node too) draws the same
    noise."""
    return torch.Generator().manual_seed(derive_seed(seed, "dp", *key, *parts))


def _arch_of(module: nn.Module | None) -> list[nn.Parameter]:
    if module is None:
        return []
    return list(module.arch_parameters()) if hasattr(module, "arch_parameters") else []


def _weights_of(module: nn.Module | None) -> list[nn.Parameter]:
    if module is None:
        return []
    if hasattr(module, "weight_parameters"):
        return list(module.weight_parameters())
    arch = {id(p) for p in _arch_of(module)}
    return [p for p in module.parameters() if id(p) not in arch]


@dataclass(eq=False)
class Party:
    """One silo: its id, its own feature rows (aligned by sample id with every other party), its bottom
    network, and -- for the label party only -- the labels and the top network."""

    index: int
    features: torch.Tensor
    bottom: nn.Module
    labels: torch.Tensor | None = None
    top: nn.Module | None = None

    @property
    def name(self) -> str:
        return party_name(self.index)

    def modules(self) -> dict[str, nn.Module]:
        return {"bottom": self.bottom} | ({"top": self.top} if self.top is not None else {})

    def arch_parameters(self) -> list[nn.Parameter]:
        return _arch_of(self.bottom) + _arch_of(self.top)

    def weight_parameters(self) -> list[nn.Parameter]:
        return _weights_of(self.bottom) + _weights_of(self.top)

    def parameters(self) -> list[nn.Parameter]:
        """Weights first, then alphas: the order of every gradient list the protocol returns."""
        return self.weight_parameters() + self.arch_parameters()


@dataclass
class PartyGrads:
    """One party's gradients for one batch, aligned with ``weight_parameters()`` and ``arch_parameters()``."""

    weights: list[torch.Tensor]
    arch: list[torch.Tensor]


@dataclass
class Pass:
    """What a forward over the network produced. ``outputs[split][j]`` is party j's own activation (with its
    graph, only party j backprops it); ``received[split][j]`` is what the label party holds: the delivered
    (noised) leaf for j != label, its own activation for j == label. ``delivered_gradients`` is filled by
    ``backward`` with what each party received."""

    batches: dict[str, torch.Tensor]
    outputs: dict[str, dict[int, torch.Tensor]]
    received: dict[str, dict[int, torch.Tensor]]
    logits: dict[str, torch.Tensor]
    losses: dict[str, torch.Tensor]
    delivered_gradients: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)


def concat_dim1(activations: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([a.reshape(a.shape[0], -1) if a.dim() != 2 else a for a in activations], dim=1)


def exchange_count(messages: Sequence[Message], hub: str) -> int:
    """Sequential exchanges: maximal runs of consecutive messages going the same way (to or from ``hub``).
    Messages of one run are sent in parallel; each new run has to wait for the previous one."""
    runs, last = 0, None
    for message in messages:
        direction = message.receiver == hub
        runs += direction != last
        last = direction
    return runs


class VerticalProtocol:
    """Parties, the channel between them, the optional DP mechanisms and the step counter.

    ``forward_mechanisms``: one mechanism for every non-label party, or a per-party sequence/mapping (None =
    no DP on that party's activations). ``backward_mechanism``: on every returned gradient. ``split_sizes``:
    samples per split ("train", "val", ...), for the sampling rate the accountant needs (a split without a
    size counts as rate 1, no amplification).
    """

    def __init__(
        self,
        parties: Sequence[Party],
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
        combine: Callable[[list[torch.Tensor]], torch.Tensor] = concat_dim1,
        forward_mechanisms: MechanismSpec = None,
        backward_mechanism: GaussianMechanism | None = None,
        seed: int = 0,
        split_sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.parties = list(parties)
        if [p.index for p in self.parties] != list(range(len(self.parties))):
            raise ValueError(f"party indices must be 0..K-1 in order, got {[p.index for p in self.parties]}")
        holders = [p.index for p in self.parties if p.labels is not None]
        if len(holders) != 1:
            raise ValueError(f"exactly one party holds the labels; got {holders}")
        self.label = holders[0]
        if self.parties[self.label].top is None or any(
            p.top is not None for p in self.parties if p.index != self.label
        ):
            raise ValueError("the top network belongs to the label party, and only to it")
        n = {len(p.features) for p in self.parties} | {len(self.parties[self.label].labels)}
        if len(n) != 1:
            raise ValueError(f"parties hold different numbers of aligned rows: {sorted(n)}")
        if isinstance(forward_mechanisms, GaussianMechanism) or forward_mechanisms is None:
            forward_mechanisms = {j: forward_mechanisms for j in self.others}
        elif not isinstance(forward_mechanisms, Mapping):
            forward_mechanisms = dict(enumerate(forward_mechanisms))
        self.forward_mechanisms: dict[int, GaussianMechanism | None] = {
            j: forward_mechanisms.get(j) for j in self.others
        }
        self.backward_mechanism = backward_mechanism
        self.loss_fn, self.combine, self.seed = loss_fn, combine, seed
        self.split_sizes = dict(split_sizes or {})
        self.channel, self.eval_channel = Channel(), Channel()
        self.ledger = PrivacyLedger()
        self.step = 0
        self.evaluations = 0
        self._exchange = 0

    # ---- roles -----------------------------------------------------------------------------------------------
    @property
    def others(self) -> list[int]:
        """The parties that send activations and receive gradients (every party but the label party)."""
        return [p.index for p in self.parties if p.index != self.label]

    @property
    def hub(self) -> str:
        return party_name(self.label)

    def _rate(self, split: str, batch: torch.Tensor) -> float:
        size = self.split_sizes.get(split)
        return min(1.0, len(batch) / size) if size else 1.0

    def _generator(self, key: tuple, *parts: object) -> torch.Generator:
        return noise_generator(self.seed, key, *parts)

    # ---- one pass --------------------------------------------------------------------------------------------
    def forward(
        self,
        batches: Mapping[str, torch.Tensor],
        *,
        grad: bool = True,
        channel: Channel | None = None,
        account: bool = True,
        noise_key: tuple | None = None,
    ) -> Pass:
        """Steps 1-3 for every batch in ``batches`` (split -> sample indices): one message per other party.
        ``noise_key`` names the draw of DP noise (default: this step's next exchange)."""
        channel = self.channel if channel is None else channel
        batches = {s: torch.as_tensor(b, dtype=torch.long) for s, b in batches.items()}
        if noise_key is None:
            self._exchange += 1
            noise_key = ("step", self.step, self._exchange)
        outputs: dict[str, dict[int, torch.Tensor]] = {s: {} for s in batches}
        received: dict[str, dict[int, torch.Tensor]] = {s: {} for s in batches}
        with torch.set_grad_enabled(grad):
            for party in self.parties:  # each party reads only its own rows
                for split, batch in batches.items():
                    outputs[split][party.index] = party.bottom(party.features[batch])
            for j in self.others:
                mechanism = self.forward_mechanisms[j]
                payload = {}
                for split, batch in batches.items():
                    out = outputs[split][j].detach()
                    if mechanism is not None:
                        out = mechanism.apply(out, self._generator(noise_key, "forward", j, split))
                    if account:
                        self.ledger.release(party_name(j), split, batch, mechanism, self._rate(split, batch))
                    payload[f"{ACTIVATION}{party_name(j)}/{split}"] = out
                delivered = channel.send(self.step, party_name(j), self.hub, payload)
                for split in batches:  # a fresh leaf on the label party's side: backprop stops here
                    received[split][j] = delivered[f"{ACTIVATION}{party_name(j)}/{split}"].requires_grad_(grad)
            top, labels = self.parties[self.label].top, self.parties[self.label].labels
            logits, losses = {}, {}
            for split, batch in batches.items():
                received[split][self.label] = outputs[split][self.label]
                logits[split] = top(self.combine([received[split][k] for k in range(len(self.parties))]))
                losses[split] = self.loss_fn(logits[split], labels[batch])
        return Pass(batches, outputs, received, logits, losses)

    def backward(self, p: Pass) -> dict[str, list[PartyGrads]]:
        """Steps 4-5: the label party differentiates each split's loss w.r.t. its own parameters and the received
        activations, returns dL/dN_j to each party j (one message carrying every split), and each party
        backprops it into its own parameters. Returns ``grads[split][party]``."""
        self._exchange += 1
        noise_key = ("step", self.step, self._exchange)
        grads: dict[str, list[PartyGrads | None]] = {s: [None] * len(self.parties) for s in p.batches}
        to_send: dict[int, dict[str, torch.Tensor]] = {j: {} for j in self.others}
        hub = self.parties[self.label]
        for split in p.batches:
            own, leaves = hub.parameters(), [p.received[split][j] for j in self.others]
            g = _grad(p.losses[split], own + leaves)
            grads[split][self.label] = _split_grads(hub, g[: len(own)])
            for j, gj in zip(self.others, g[len(own) :]):
                to_send[j][split] = gj
        mechanism = self.backward_mechanism
        for j in self.others:
            payload = {}
            for split, batch in p.batches.items():
                gj = to_send[j][split]
                if mechanism is not None:
                    gj = mechanism.apply(gj, self._generator(noise_key, "backward", j, split))
                # the gradient to party j depends on the label party's labels: its release, K-1 per pass
                self.ledger.release(self.hub, split, batch, mechanism, self._rate(split, batch))
                payload[f"{GRADIENT}{party_name(j)}/{split}"] = gj
            delivered = self.channel.send(self.step, self.hub, party_name(j), payload)
            party = self.parties[j]
            for split in p.batches:
                gj = delivered[f"{GRADIENT}{party_name(j)}/{split}"]
                p.delivered_gradients.setdefault(split, {})[j] = gj
                grads[split][j] = _split_grads(party, _grad(p.outputs[split][j], party.parameters(), gj))
        return grads  # type: ignore[return-value]

    def global_norm(self, local_squares: Mapping[int, torch.Tensor]) -> float:
        """sqrt of the sum over parties of a local squared norm: every other party sends its scalar to the label
        party, which returns the total (one scalar each way, ``gradnorm/``). DARTS second order needs it to
        scale its finite difference; nothing else crosses. These scalars are NOT noised: with DP on, they are
        outside the accounted mechanisms (``DartsSearch(global_norm=False)`` avoids them)."""
        self._exchange += 1
        total = local_squares[self.label].detach().clone()
        for j in self.others:
            delivered = self.channel.send(
                self.step,
                party_name(j),
                self.hub,
                {f"{GRADNORM}{party_name(j)}": local_squares[j].detach().reshape(())},
            )
            total = total + delivered[f"{GRADNORM}{party_name(j)}"]
        self._exchange += 1
        for j in self.others:
            self.channel.send(self.step, self.hub, party_name(j), {f"{GRADNORM}total": total})
        return float(total.sqrt())

    def end_step(self) -> None:
        """Close the step: fold the ledger's pooled releases into its history and advance the round index."""
        self.ledger.end_step()
        self.step += 1
        self._exchange = 0

    # ---- plain split training and evaluation ------------------------------------------------------------------
    def train_step(
        self,
        batch: torch.Tensor,
        optimizers: Sequence[torch.optim.Optimizer | None] = (),
        update: bool = True,
        split: str = "train",
    ) -> dict[str, float]:
        """One forward/backward pass on ``batch``; every party's ``.grad`` is set to its gradient (weights and
        alphas) and, when ``update``, every party's optimizer steps. Costs 2(K-1) messages in 2 exchanges."""
        p = self.forward({split: batch})
        grads = self.backward(p)[split]
        for party, g in zip(self.parties, grads):
            set_grads(party.weight_parameters(), g.weights)
            set_grads(party.arch_parameters(), g.arch)
        if update:
            for optimizer in optimizers:
                if optimizer is not None:
                    optimizer.step()
        self.end_step()
        labels = self.parties[self.label].labels[p.batches[split]]
        return {"loss": float(p.losses[split].detach()), **_accuracy(p.logits[split], labels)}

    def evaluate(
        self,
        indices: torch.Tensor,
        batch_size: int = 256,
        split: str = "test",
        account: bool = True,
        predictions: bool = False,
    ) -> dict[str, Any]:
        """Forward only (eval mode, the forward mechanism still applies since N_j still crosses), logged on
        ``eval_channel`` at the current step: K-1 messages per batch. Each sample crosses once per call, so
        the ledger records one release at rate 1 per party on ``split`` (and one for each of its samples)
        (``account=False`` leaves it out: an experimenter's measurement on held-out test rows, not a release of
        training data). ``predictions`` adds ``"predicted"``: the label party's argmax class per sample, in the order
        of ``indices``."""
        modules = [m for party in self.parties for m in party.modules().values()]
        result = evaluate_passes(
            self, modules, self.parties[self.label].labels, indices, batch_size, split, predictions
        )
        if account:
            account_evaluation(self.ledger, indices, split, self.forward_mechanisms)
        self.evaluations += 1
        return result

    def evaluate_label_party_alone(self, indices: torch.Tensor, batch_size: int = 256) -> float:
        """``label_party_alone_accuracy`` of this protocol's label party."""
        return label_party_alone_accuracy(
            self.parties[self.label], len(self.parties), indices, batch_size, self.combine
        )

    # ---- what it cost and what it revealed --------------------------------------------------------------------
    def step_cost(self, step: int, channel: Channel | None = None) -> dict[str, int]:
        return step_cost(self.channel if channel is None else channel, step, self.hub)

    def epsilon(self, delta: float, amplified: bool = False) -> dict[str, float]:
        return ledger_epsilons(self.ledger, [p.name for p in self.parties], delta, amplified)


def evaluate_passes(
    protocol: Any,
    modules: Sequence[nn.Module],
    labels: torch.Tensor,
    indices: torch.Tensor,
    batch_size: int,
    split: str,
    predictions: bool,
) -> dict[str, Any]:
    """Forward-only passes of ``protocol`` (a ``VerticalProtocol`` or a node protocol's hub: anything with their
    ``forward`` and ``eval_channel``) over ``indices``, every module in eval mode meanwhile: the mean loss, the
    accuracy (class labels) and, with ``predictions``, the argmax class per sample in the order of ``indices`` (on the
    CPU, wherever the networks run: they are written out)."""
    indices = torch.as_tensor(indices, dtype=torch.long)
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    total_loss, correct, count = 0.0, 0.0, 0
    predicted: list[torch.Tensor] = []
    try:
        for start in range(0, len(indices), batch_size):
            batch = indices[start : start + batch_size]
            p = protocol.forward(
                {split: batch},
                grad=False,
                channel=protocol.eval_channel,
                account=False,
                noise_key=("eval", protocol.evaluations, start),
            )
            total_loss += float(p.losses[split]) * len(batch)
            if predictions:
                predicted.append(p.logits[split].argmax(dim=1))
            correct += _accuracy(p.logits[split], labels[batch]).get("accuracy", 0.0) * len(batch)
            count += len(batch)
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)
    result: dict[str, Any] = {"loss": total_loss / max(count, 1)}
    if not torch.is_floating_point(labels):
        result["accuracy"] = correct / max(count, 1)
    if predictions:
        result["predicted"] = torch.cat(predicted).cpu() if predicted else torch.zeros(0, dtype=torch.long)
    return result


def account_evaluation(
    ledger: PrivacyLedger, indices: torch.Tensor, split: str, mechanisms: Mapping[int, GaussianMechanism | None]
) -> None:
    """An evaluation's releases: each sample once, at rate 1, by every party that sent its activations."""
    indices = torch.as_tensor(indices, dtype=torch.long)
    for j, mechanism in mechanisms.items():
        if ledger.record(party_name(j), indices, mechanism):
            ledger.add(party_name(j), split, 0.0 if mechanism is None else mechanism.sigma, 1.0)


def label_party_alone_accuracy(
    hub: Party,
    parties: int,
    indices: torch.Tensor,
    batch_size: int = 256,
    combine: Callable[[list[torch.Tensor]], torch.Tensor] = concat_dim1,
) -> float:
    """Accuracy of the label party's own decision with every other party's embedding replaced by zeros (eval mode;
    nothing crosses, nothing is released): how much of the network's accuracy the label party's features carry. With
    a linear top network this drops exactly the other parties' terms of the logits. Every party's embedding has the
    label party's shape (one embedding size for all)."""
    indices = torch.as_tensor(indices, dtype=torch.long)
    modes = [(m, m.training) for m in hub.modules().values()]
    for m, _ in modes:
        m.eval()
    correct = 0
    try:
        with torch.no_grad():
            for start in range(0, len(indices), batch_size):
                batch = indices[start : start + batch_size]
                own = hub.bottom(hub.features[batch])
                parts = [own if k == hub.index else torch.zeros_like(own) for k in range(parties)]
                correct += int((hub.top(combine(parts)).argmax(dim=1) == hub.labels[batch]).sum())
    finally:
        for m, mode in modes:
            m.train(mode)
    return correct / max(len(indices), 1)


def step_cost(channel: Channel, step: int, hub: str) -> dict[str, int]:
    """Messages, bytes and sequential exchanges of one step, from a channel's log (``hub``: the label party)."""
    messages = [m for m in channel.messages if m.round == step]
    return {
        "messages": len(messages),
        "bytes": sum(m.nbytes for m in messages),
        "exchanges": exchange_count(messages, hub),
    }


def ledger_epsilons(
    ledger: PrivacyLedger, names: Sequence[str], delta: float, amplified: bool = False
) -> dict[str, float]:
    """Each party's epsilon at ``delta`` so far (NaN: released-code mechanism, inf: no noise): without amplification
    (the headline, ``PrivacyLedger.epsilon``) or assuming Poisson subsampling (``amplified``)."""
    of = ledger.epsilon_amplified if amplified else ledger.epsilon
    return {name: of(name, delta) for name in names}


def _grad(
    output: torch.Tensor, inputs: list[torch.Tensor], grad_output: torch.Tensor | None = None
) -> list[torch.Tensor]:
    if not inputs:
        return []
    grads = torch.autograd.grad(output, inputs, grad_outputs=grad_output, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]


def _split_grads(party: Party, grads: list[torch.Tensor]) -> PartyGrads:
    n = len(party.weight_parameters())
    return PartyGrads(list(grads[:n]), list(grads[n:]))


def set_grads(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
    for p, g in zip(params, grads, strict=True):
        p.grad = g.detach().clone()


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    if torch.is_floating_point(labels):
        return {}
    return {"accuracy": float((logits.detach().argmax(dim=1) == labels).float().mean())}


def parties_from_vertical(
    ds: VerticalDataset, bottoms: Sequence[nn.Module], top: nn.Module, dtype: torch.dtype = torch.float32
) -> list[Party]:
    """Parties from a ``VerticalDataset``: party k gets its own DataFrame's feature columns (``sample_id``
    dropped after checking every party lists the same ids in the same order); only the label party gets the
    labels and the top network."""
    if len(bottoms) != len(ds.parties):
        raise ValueError(f"{len(ds.parties)} parties but {len(bottoms)} bottom networks")
    ids = ds.parties[0]["sample_id"].to_numpy()
    parties = []
    for k, (frame, bottom) in enumerate(zip(ds.parties, bottoms)):
        if not np.array_equal(frame["sample_id"].to_numpy(), ids):
            raise DataError(f"{ds.name}: party {k}'s sample ids are not aligned with party 0's")
        features = torch.tensor(frame.drop(columns=["sample_id"]).to_numpy(dtype=np.float64), dtype=dtype)
        labels = None
        if k == ds.label_party:
            labels = torch.tensor(ds.labels, dtype=torch.long if ds.task == "classification" else dtype)
        parties.append(Party(k, features, bottom, labels, top if k == ds.label_party else None))
    return parties
