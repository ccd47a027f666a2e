"""SS-VFNAS's split learning with every party on its own side of a transport (on Flower: each party a node).

Who holds what:

* the label party (``VerticalHub``; on Flower the ServerApp's process): its own feature columns, the labels, its
  bottom network, the top network, their optimizers, the channel logs and the privacy ledger. It drives the rule;
* every other party j (``PartyWorker``; on Flower one node each): its own feature columns, its bottom network, its
  optimizers and, between a forward and its backward, the graph of its own activations. It never sees the labels,
  another party's columns or any network but its own.

What crosses is what ``VerticalProtocol`` sends, in the same order on the same ``Channel``: party j's activations
(after the forward mechanism, which party j applies itself) to the label party, dL/dN_j (after the backward mechanism)
back, so the channel log equals the in-process one. Beside the tensors the label party sends each party a command: the
sample ids of each batch, which DP draw to use, and which update to apply after its backward (logged on the channel's
scalar log). A party's update rides on the backward message that completes its gradients, so a step takes exactly the
in-process protocol's exchanges.

A backward whose reply the label party does not wait for (every one but DARTS second order's global norm) is not sent
on its own: it travels ahead of the label party's next command to that party, in one transport message
(``SEQUENCE``), and the party carries out both in order. The party does the same work in the same order, and the
channel logs every exchange where it happens, so the run, its logs and its byte counts are unchanged; a step of
MiLeNAS or of split training takes one round trip to each party instead of two, DARTS first order two instead of four.

Rules (``VerticalRecipe.rule``): plain split training ("train"), DARTS first and second order ("darts") and MiLeNAS
("milenas", bundled or not), with the arithmetic of ``fedrepro.vfl.search``. Second order moves every party's weights
between passes: each party moves its own, on the label party's command (``OwnSide.apply``); its global norm's scalars
cross as in ``VerticalProtocol.global_norm`` (a party's squared norm rides on its backward reply).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F

from fedrepro.device import configure
from fedrepro.errors import FederationError
from fedrepro.channel import Channel, Message
from fedrepro.io import atomic_dir, read_json, write_json
from fedrepro.vfl.privacy import GaussianMechanism, PrivacyLedger
from fedrepro.vfl.protocol import (
    ACTIVATION,
    GRADIENT,
    GRADNORM,
    Party,
    PartyGrads,
    Pass,
    _accuracy,
    _grad,
    _split_grads,
    account_evaluation,
    concat_dim1,
    evaluate_passes,
    label_party_alone_accuracy,
    ledger_epsilons,
    noise_generator,
    party_name,
    set_grads,
    step_cost,
)
from fedrepro.vfl.search import _flatten_optimizer, _restore_optimizer, batch_at, party_optimizers

FORWARD, BACKWARD, UPDATE, SAVE, LOAD, LOCAL = "forward", "backward", "update", "save", "load", "local"
SEQUENCE = "sequence"
"""Several commands in one transport message, carried out in order: ``{"ops": [[op, command], ...]}``, the tensors of
the i-th named ``"<i>/<name>"``; the reply is the last command's (every earlier one must reply nothing)."""
REPORT = "report"
"""A party's reply to ``LOCAL``: its JSON report as UTF-8 bytes (logged as scalars on the hub's ``report_channel``)."""
RULES = ("train", "darts", "milenas")
NODES = "nodes"


def party_directory(root: str | Path, index: int) -> Path:
    """Where party ``index`` of a run rooted at ``root`` keeps its own files (its checkpoints, its local work)."""
    return Path(root) / NODES / party_name(index)


@dataclass(frozen=True)
class VerticalRecipe:
    """What every party's process needs to rebuild its side of one run.

    ``build_party(index)`` returns that party alone: its own columns (and, for the label party, the labels and the top
    network), seeded so that every process builds the same one. It must be picklable (a module-level function or a
    ``functools.partial`` of one): Flower's simulation ships the recipe to its workers."""

    build_party: Callable[[int], Party]
    parties: int
    label: int
    rule: str
    seed: int
    """The protocol's seed: batches (``batch_at``) and DP draws (``noise_generator``)."""
    fingerprint: str
    threads: int = 1
    optimizers: Mapping[str, Any] = field(default_factory=dict)
    """``party_optimizers``' keyword arguments, the same for every party."""
    grad_clip: float | None = 5.0
    lam: float = 1.0
    bundle: bool = True
    """MiLeNAS: the train and validation batch in one pass (the paper) or one after the other (the released code)."""
    second_order: bool = False
    xi: float = 0.025
    r: float = 0.01
    global_norm: bool = True
    """DARTS second order (``DartsSearch``'s ``second_order``, ``xi``, ``r``, ``global_norm``)."""
    forward_mechanism: GaussianMechanism | None = None
    backward_mechanism: GaussianMechanism | None = None
    split_sizes: tuple[tuple[str, int], ...] = ()
    local: Callable[[str, Party, Path | None, Mapping[str, Any]], Any] | None = None
    """Work a party does on its own side when the label party asks (``VerticalHub.local``): ``local(task, party,
    its directory, command)`` returns a JSON-able report, which is all that crosses (SS-VFNAS: its pre-search, its
    alphas' summary, its genotype). Picklable, like ``build_party``."""
    device: str = "cpu"
    """Where every party computes (a resolved ``train.device``): each party's process applies
    ``fedrepro.device.configure`` to it, ``build_party`` puts the party's networks and rows there, and what arrives
    over the transport (on the CPU, as a network delivers it) is moved there."""

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"VerticalRecipe.rule = {self.rule!r}: allowed {list(RULES)}")
        if not 0 <= self.label < self.parties:
            raise ValueError(f"VerticalRecipe.label = {self.label}: not one of the {self.parties} parties")

    @property
    def others(self) -> list[int]:
        return [j for j in range(self.parties) if j != self.label]


class OwnSide:
    """What a party does with its own gradients, on its own side: optimizer steps as ``Search._update_weights`` /
    ``_update_arch`` make them, and DARTS second order's moves of its weights. ``grads`` holds its gradients by slot
    (a split, or a name the label party gives a pass: second order backprops the train batch three times)."""

    def __init__(self, recipe: VerticalRecipe, party: Party) -> None:
        self.recipe, self.party = recipe, party
        self.weight_optimizer, self.arch_optimizer = party_optimizers(party, **recipe.optimizers)
        self.grads: dict[str, PartyGrads] = {}
        self.saved: list[torch.Tensor] = []

    def apply(self, update: Mapping[str, Any]) -> None:
        """``{"kind": "weights" | "arch", "split": slot}``: a step on that slot's gradients, with ``"plus": slot,
        "coef": c`` on grads[split] + c * grads[plus] (MiLeNAS's mix), ``"lr"`` the weights' learning rate first;
        ``{"kind": "move", "split": slot, "scale": s}``: weights = saved + s * grads (``"save"``: save them first);
        ``{"kind": "unrolled_arch", "xi": xi, "eps": eps}``: the alphas' step on DARTS's second-order gradient
        val - xi * (plus - minus) / (2 eps)."""
        kind = update["kind"]
        if kind == "move":
            self._move(update)
        elif kind == "unrolled_arch":
            xi, eps = update["xi"], update["eps"]
            arch = [
                v - xi * (a - b) / (2 * eps)
                for v, a, b in zip(self.grads["val"].arch, self.grads["plus"].arch, self.grads["minus"].arch)
            ]
            self._step_arch(arch)
        elif kind == "arch":
            self._step_arch(self._mixed(update, "arch"))
        elif kind == "weights":
            if update.get("lr") is not None:
                for group in self.weight_optimizer.param_groups:
                    group["lr"] = update["lr"]
            params = self.party.weight_parameters()
            set_grads(params, self._mixed(update, "weights"))
            if self.recipe.grad_clip is not None:
                nn.utils.clip_grad_norm_(params, self.recipe.grad_clip)
            self.weight_optimizer.step()
        else:
            raise ValueError(f"{self.party.name}: unknown update {kind!r}")

    def _mixed(self, update: Mapping[str, Any], part: str) -> list[torch.Tensor]:
        base = getattr(self.grads[update["split"]], part)
        if update.get("plus") is None:
            return base
        return [t + update["coef"] * v for t, v in zip(base, getattr(self.grads[update["plus"]], part))]

    def _step_arch(self, grads: list[torch.Tensor]) -> None:
        if self.arch_optimizer is not None:
            set_grads(self.party.arch_parameters(), grads)
            self.arch_optimizer.step()

    def _move(self, update: Mapping[str, Any]) -> None:
        weights = self.party.weight_parameters()
        if update.get("save"):
            self.saved = [w.detach().clone() for w in weights]
        with torch.no_grad():
            for w, b, g in zip(weights, self.saved, self.grads[update["split"]].weights):
                w.copy_(b + update["scale"] * g)

    def save(self, path: Path) -> None:
        """Its networks (``party_state``) and optimizers, between steps; the optimizers' JSON part in the metadata."""
        tensors, meta = party_state(self.party), {}
        for kind, optimizer in (("weights", self.weight_optimizer), ("arch", self.arch_optimizer)):
            if optimizer is not None:
                flat, meta[kind] = _flatten_optimizer(optimizer)
                tensors |= {f"optimizer.{kind}.{k}": v for k, v in flat.items()}
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in tensors.items()},
            str(path),
            metadata={"optimizers": json.dumps(meta)},
        )

    def load(self, path: Path) -> None:
        """Restore, in place, what ``save`` wrote."""
        with safe_open(str(path), "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            meta = json.loads(f.metadata()["optimizers"])
        for name, module in self.party.modules().items():
            module.load_state_dict({k[len(name) + 1 :]: v for k, v in tensors.items() if k.startswith(f"{name}.")})
        for kind, optimizer in (("weights", self.weight_optimizer), ("arch", self.arch_optimizer)):
            if optimizer is not None:
                prefix = f"optimizer.{kind}."
                flat = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
                _restore_optimizer(optimizer, flat, meta[kind])

    def squared_norm(self, slot: str) -> torch.Tensor:
        """Its share of DARTS's global gradient norm: the sum of its squared weight gradients."""
        return sum(((g**2).sum() for g in self.grads[slot].weights), torch.zeros((), device=self.recipe.device))


def party_state(party: Party) -> dict[str, torch.Tensor]:
    """A party's networks as ``save_state`` names them (``bottom.<key>``, ``top.<key>``)."""
    return {
        f"{name}.{k}": v.detach().clone()
        for name, module in party.modules().items()
        for k, v in module.state_dict().items()
    }


class PartyWorker:
    """A party other than the label party, on its own side: it answers the label party's commands (``handle``)."""

    def __init__(self, recipe: VerticalRecipe, party: Party, directory: Path | None = None) -> None:
        if party.index == recipe.label or party.labels is not None or party.top is not None:
            raise ValueError(
                f"{party.name}: a party worker holds no labels and no top network (the label party is "
                f"party_{recipe.label})"
            )
        configure(recipe.device)
        self.recipe, self.party, self.directory = recipe, party, directory
        self.own = OwnSide(recipe, party)
        self.outputs: dict[str, torch.Tensor] = {}

    def handle(
        self, op: str, command: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        if op == FORWARD:
            return self.forward(command)
        if op == BACKWARD:
            return self.backward(command, tensors)
        if op == UPDATE:
            for update in command["updates"]:
                self.own.apply(update)
        elif op == SAVE:
            self.save(int(command["step"]), command.get("keep"))
        elif op == LOAD:
            self.own.load(self.checkpoint(int(command["step"])))
        elif op == SEQUENCE:
            return self.sequence(command, tensors)
        elif op == LOCAL:
            if self.recipe.local is None:
                raise FederationError(
                    f"{self.party.name}: asked for local task {command.get('task')!r}, but its recipe has none"
                )
            report = self.recipe.local(str(command["task"]), self.party, self.directory, command)
            return {REPORT: torch.tensor(list(json.dumps(report).encode("utf-8")), dtype=torch.uint8)}
        else:
            raise ValueError(
                f"{self.party.name}: unknown command {op!r} (allowed {FORWARD}, {BACKWARD}, {UPDATE}, "
                f"{SAVE}, {LOAD}, {LOCAL}, {SEQUENCE})"
            )
        return {}

    def sequence(self, command: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``SEQUENCE``: each command in order; the last one's reply."""
        ops, reply = command["ops"], {}
        for i, (op, inner) in enumerate(ops):
            prefix = f"{i}/"
            reply = self.handle(op, inner, {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
            if reply and i < len(ops) - 1:
                raise FederationError(
                    f"{self.party.name}: command {i} ({op!r}) of a sequence replied "
                    f"{sorted(reply)}, which a command before the last may not"
                )
        return reply

    def forward(self, command: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Its bottom network on its own rows of each batch; the activations to send, after the forward mechanism."""
        batches = {split: torch.tensor(ids, dtype=torch.long) for split, ids in command["batches"].items()}
        modules = list(self.party.modules().values())
        modes = [m.training for m in modules]
        for m in modules:
            m.train(bool(command["training"]) and m.training)
        try:
            with torch.set_grad_enabled(bool(command["grad"])):
                outputs = {split: self.party.bottom(self.party.features[batch]) for split, batch in batches.items()}
        finally:
            for m, mode in zip(modules, modes):
                m.train(mode)
        self.outputs = outputs if command["grad"] else {}
        mechanism, key, payload = self.recipe.forward_mechanism, tuple(command["noise_key"]), {}
        for split, out in outputs.items():
            out = out.detach()
            if mechanism is not None:
                out = mechanism.apply(out, noise_generator(self.recipe.seed, key, "forward", self.party.index, split))
            payload[f"{ACTIVATION}{self.party.name}/{split}"] = out
        return payload

    def backward(self, command: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Backprop each received dL/dN_j through its own graph (into the slot the command names, default the split),
        then the updates the command names; replies its squared gradient norm of a slot when asked (``norm_of``)."""
        slots = command.get("slots", {})
        for split in command["splits"]:
            if split not in self.outputs:
                raise FederationError(
                    f"{self.party.name}: a gradient for split {split!r} without its forward pass "
                    "(this node lost its state since the forward)"
                )
            gradient = tensors[f"{GRADIENT}{self.party.name}/{split}"].to(self.recipe.device)
            own = _grad(self.outputs.pop(split), self.party.parameters(), gradient)
            self.own.grads[slots.get(split, split)] = _split_grads(self.party, own)
        for update in command["updates"]:
            self.own.apply(update)
        if command.get("norm_of") is None:
            return {}
        return {f"{GRADNORM}{self.party.name}": self.own.squared_norm(command["norm_of"]).detach().reshape(())}

    def checkpoint(self, step: int) -> Path:
        """Its file of the state after ``step`` steps, in its own directory, where only this party reads it."""
        if self.directory is None:
            raise FederationError(
                f"{self.party.name}: told to save or load its state, but it has no directory of its own"
            )
        return self.directory / f"step-{step:06d}" / f"{self.party.name}.safetensors"

    def save(self, step: int, keep: int | None) -> None:
        """Its networks and optimizers after ``step`` steps; of its older checkpoints only ``keep`` (the label party's
        last complete one, which a resume may still need) stays."""
        with atomic_dir(self.checkpoint(step).parent) as tmp:
            self.own.save(tmp / f"{self.party.name}.safetensors")
        for old in self.directory.glob("step-*"):
            if old.name not in {f"step-{step:06d}", f"step-{keep:06d}" if keep is not None else ""}:
                shutil.rmtree(old)


def _sequence(
    entries: list[tuple[str, dict[str, Any], dict[str, torch.Tensor]]],
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Commands as one ``SEQUENCE`` command and its tensors."""
    ops = [[op, command] for op, command, _ in entries]
    tensors = {f"{i}/{name}": tensor for i, (_, _, named) in enumerate(entries) for name, tensor in named.items()}
    return {"ops": ops}, tensors


class Transport(Protocol):
    def exchange(
        self, op: str, commands: Mapping[int, tuple[dict[str, Any], dict[str, torch.Tensor]]]
    ) -> dict[int, dict[str, torch.Tensor]]:
        """Send each party its command and tensors at once; every party's reply tensors."""


@dataclass
class LocalTransport:
    """Party workers called in this process (the node protocol without a network, for tests)."""

    workers: Mapping[int, PartyWorker]

    def exchange(
        self, op: str, commands: Mapping[int, tuple[dict[str, Any], dict[str, torch.Tensor]]]
    ) -> dict[int, dict[str, torch.Tensor]]:
        return {j: self.workers[j].handle(op, command, tensors) for j, (command, tensors) in commands.items()}


class VerticalHub:
    """The label party driving a search or a split training over a ``Transport`` to the other parties."""

    def __init__(
        self, recipe: VerticalRecipe, party: Party, transport: Transport, directory: Path | None = None
    ) -> None:
        if party.index != recipe.label or party.labels is None or party.top is None:
            raise ValueError(
                f"{party.name}: the hub is the label party party_{recipe.label}, with the labels and the top network"
            )
        configure(recipe.device)
        self.recipe, self.party, self.transport = recipe, party, transport
        self.own = OwnSide(recipe, party)
        self.others, self.hub = recipe.others, party_name(recipe.label)
        self.split_sizes = dict(recipe.split_sizes)
        self.channel, self.eval_channel, self.report_channel = Channel(), Channel(), Channel()
        """``report_channel``: the parties' reports of local work (``local``), which only the run's outputs use."""
        self.directory = directory
        """The label party's own folder, for its local work."""
        self.ledger = PrivacyLedger()
        self.history: list[dict[str, Any]] = []
        self.step = self.evaluations = self._exchange = 0
        self.checkpointed: int | None = None
        """The step of the last complete ``save_state`` (every party's file and the label party's written)."""
        self.waiting: dict[int, list[tuple[str, dict[str, Any], dict[str, torch.Tensor]]]] = {}
        """Commands (a backward's) that travel with the next message to their party (``SEQUENCE``)."""

    def _rate(self, split: str, batch: torch.Tensor) -> float:
        size = self.split_sizes.get(split)
        return min(1.0, len(batch) / size) if size else 1.0

    def _command(self, channel: Channel, op: str, command: dict[str, Any]) -> None:
        for j in self.others:
            channel.send_scalars(
                self.step, self.hub, party_name(j), {f"{op}/{key}": value for key, value in command.items()}
            )

    def _send(
        self, op: str, commands: Mapping[int, tuple[dict[str, Any], dict[str, torch.Tensor]]], wait: bool = True
    ) -> dict[int, dict[str, torch.Tensor]]:
        """Each party's command through the transport, after what waits for it (in one ``SEQUENCE`` message); the
        replies. ``wait=False``: a command that replies nothing waits for the next message to its party instead."""
        if not wait:
            for j, entry in commands.items():
                self.waiting.setdefault(j, []).append((op, *entry))
            return {}
        if not self.waiting:
            return self.transport.exchange(op, commands)
        waiting, self.waiting = self.waiting, {}
        unsent = sorted(set(waiting) - set(commands))
        if unsent:
            raise FederationError(
                f"{[party_name(j) for j in unsent]}: commands wait for them, but {op!r} is not sent to them"
            )
        return self.transport.exchange(
            SEQUENCE, {j: _sequence([*waiting.get(j, []), (op, *entry)]) for j, entry in commands.items()}
        )

    def flush(self) -> None:
        """Send what waits for the parties (``_send``), so that every party has done all it was told."""
        if self.waiting:
            waiting, self.waiting = self.waiting, {}
            self.transport.exchange(SEQUENCE, {j: _sequence(entries) for j, entries in waiting.items()})

    # ---- one pass: VerticalProtocol.forward / backward with the other parties' share done by them -----------------
    def forward(
        self,
        batches: Mapping[str, torch.Tensor],
        grad: bool = True,
        channel: Channel | None = None,
        account: bool = True,
        noise_key: tuple | None = None,
    ) -> Pass:
        channel = self.channel if channel is None else channel
        batches = {s: torch.as_tensor(b, dtype=torch.long) for s, b in batches.items()}
        if noise_key is None:
            self._exchange += 1
            noise_key = ("step", self.step, self._exchange)
        command = {
            "batches": {s: b.tolist() for s, b in batches.items()},
            "grad": grad,
            "training": self.party.bottom.training,
            "noise_key": list(noise_key),
        }
        self._command(channel, FORWARD, command)
        replies = self._send(FORWARD, {j: (command, {}) for j in self.others})
        received: dict[str, dict[int, torch.Tensor]] = {s: {} for s in batches}
        with torch.set_grad_enabled(grad):
            own = {split: self.party.bottom(self.party.features[batch]) for split, batch in batches.items()}
            for j in self.others:
                reply = self._checked(j, replies.get(j), batches)
                for split, batch in batches.items():
                    if account:
                        self.ledger.release(
                            party_name(j), split, batch, self.recipe.forward_mechanism, self._rate(split, batch)
                        )
                delivered = channel.send(self.step, party_name(j), self.hub, reply)
                for split in batches:
                    received[split][j] = (
                        delivered[f"{ACTIVATION}{party_name(j)}/{split}"].to(self.recipe.device).requires_grad_(grad)
                    )
            logits, losses = {}, {}
            for split, batch in batches.items():
                received[split][self.recipe.label] = own[split]
                logits[split] = self.party.top(concat_dim1([received[split][k] for k in range(self.recipe.parties)]))
                losses[split] = F.cross_entropy(logits[split], self.party.labels[batch])
        return Pass(batches, {s: {self.recipe.label: own[s]} for s in batches}, received, logits, losses)

    def _checked(
        self, j: int, reply: dict[str, torch.Tensor] | None, batches: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Party j's activations, or a ``FederationError`` naming the party and the field."""
        expected = {f"{ACTIVATION}{party_name(j)}/{split}": len(batch) for split, batch in batches.items()}
        if reply is None or set(reply) != set(expected):
            raise FederationError(
                f"{party_name(j)}: its forward reply holds {sorted(reply or {})}, expected {sorted(expected)}"
            )
        for name, rows in expected.items():
            tensor = reply[name]
            wrong = tensor.dim() == 0 or len(tensor) != rows or not torch.is_floating_point(tensor)
            if wrong or not bool(torch.isfinite(tensor).all()):
                raise FederationError(
                    f"{party_name(j)}: reply field {name!r} is {tuple(tensor.shape)} {tensor.dtype}, "
                    f"expected {rows} rows of finite floats"
                )
        return reply

    def backward(
        self, p: Pass, updates: list[dict[str, Any]], slots: Mapping[str, str] | None = None, norm_of: str | None = None
    ) -> dict[int, dict[str, torch.Tensor]]:
        """dL/dN_j to every party j, with ``updates`` for each party to apply after it (the label party applies them
        too); each party keeps its gradients of a split in ``slots[split]`` (default: the split) and, with ``norm_of``,
        replies its squared gradient norm of that slot. Returns the replies."""
        self._exchange += 1
        noise_key, slots = ("step", self.step, self._exchange), dict(slots or {})
        to_send: dict[int, dict[str, torch.Tensor]] = {j: {} for j in self.others}
        for split in p.batches:
            own, leaves = self.party.parameters(), [p.received[split][j] for j in self.others]
            g = _grad(p.losses[split], own + leaves)
            self.own.grads[slots.get(split, split)] = _split_grads(self.party, g[: len(own)])
            for j, gj in zip(self.others, g[len(own) :]):
                to_send[j][split] = gj
        mechanism, outgoing = self.recipe.backward_mechanism, {}
        command = {"splits": list(p.batches), "updates": updates, "slots": slots, "norm_of": norm_of}
        self._command(self.channel, BACKWARD, command)
        for j in self.others:
            payload = {}
            for split, batch in p.batches.items():
                gj = to_send[j][split]
                if mechanism is not None:
                    gj = mechanism.apply(gj, noise_generator(self.recipe.seed, noise_key, "backward", j, split))
                self.ledger.release(self.hub, split, batch, mechanism, self._rate(split, batch))
                payload[f"{GRADIENT}{party_name(j)}/{split}"] = gj
            outgoing[j] = (command, self.channel.send(self.step, self.hub, party_name(j), payload))
        replies = self._send(BACKWARD, outgoing, wait=norm_of is not None)
        for update in updates:
            self.own.apply(update)
        return replies

    def global_norm(self, slot: str, replies: Mapping[int, Mapping[str, torch.Tensor]]) -> torch.Tensor:
        """``VerticalProtocol.global_norm`` from the squared norms the parties replied: each party's scalar logged as
        sent to the label party, then the total, which the label party returns to each (``update_with_total``)."""
        self._exchange += 1
        total = self.own.squared_norm(slot).detach().clone()
        for j in self.others:
            name = f"{GRADNORM}{party_name(j)}"
            square = replies[j].get(name)
            if square is None or square.numel() != 1 or not bool(torch.isfinite(square).all()):
                raise FederationError(f"{party_name(j)}: its backward reply lacks a finite scalar {name!r}")
            total = total + self.channel.send(self.step, party_name(j), self.hub, {name: square.reshape(())})[name].to(
                total.device
            )
        self._exchange += 1
        return total

    def update_with_total(self, total: torch.Tensor, updates: list[dict[str, Any]]) -> None:
        """The global norm's total to every party, with ``updates`` for each (and the label party) to apply."""
        command = {"updates": updates}
        self._command(self.channel, UPDATE, command)
        totals = {
            j: self.channel.send(self.step, self.hub, party_name(j), {f"{GRADNORM}total": total}) for j in self.others
        }
        self._send(UPDATE, {j: (command, totals[j]) for j in self.others}, wait=False)
        for update in updates:
            self.own.apply(update)

    def _unrolled_arch(self, train_batch: torch.Tensor, val_batch: torch.Tensor) -> torch.Tensor:
        """``DartsSearch._unrolled_arch_grads`` with every party moving its own weights; the alphas' step rides on
        the last backward. Returns the validation loss."""
        xi, r = self.recipe.xi, self.recipe.r
        self.backward(
            self.forward({"train": train_batch}), [{"kind": "move", "split": "train", "scale": -xi, "save": True}]
        )
        pv = self.forward({"val": val_batch})
        if self.recipe.global_norm:
            total = self.global_norm("val", self.backward(pv, [], norm_of="val"))
            eps = r / max(float(total.sqrt()), 1e-12)
            self.update_with_total(total, [{"kind": "move", "split": "val", "scale": eps}])
        else:
            eps = r
            self.backward(pv, [{"kind": "move", "split": "val", "scale": eps}])
        self.backward(
            self.forward({"train": train_batch}),
            [{"kind": "move", "split": "val", "scale": -eps}],
            slots={"train": "plus"},
        )
        self.backward(
            self.forward({"train": train_batch}),
            [{"kind": "move", "split": "val", "scale": 0.0}, {"kind": "unrolled_arch", "xi": xi, "eps": eps}],
            slots={"train": "minus"},
        )
        return pv.losses["val"]

    # ---- the rules -------------------------------------------------------------------------------------------------
    def run_step(
        self, train_batch: torch.Tensor, val_batch: torch.Tensor | None = None, lr: float | None = None
    ) -> dict[str, Any]:
        """One step of the recipe's rule (``lr``: the weights' learning rate of this step, as ``run_steps`` sets)."""
        weights = {"kind": "weights", "split": "train", "lr": lr}
        if self.recipe.rule == "train":
            p = self.forward({"train": train_batch})
            self.backward(p, [weights])
            labels = self.party.labels[p.batches["train"]]
            return self._finish(
                {
                    "loss_train": p.losses["train"].detach(),
                    **{f"{k}_train": v for k, v in _accuracy(p.logits["train"], labels).items()},
                }
            )
        if self.recipe.rule == "darts":
            if self.recipe.second_order:
                loss_val = self._unrolled_arch(train_batch, val_batch)
            else:
                pv = self.forward({"val": val_batch})
                self.backward(pv, [{"kind": "arch", "split": "val"}])
                loss_val = pv.losses["val"]
            pt = self.forward({"train": train_batch})
            self.backward(pt, [weights])
            return self._finish({"loss_train": pt.losses["train"].detach(), "loss_val": loss_val.detach()})
        arch = {"kind": "arch", "split": "train", "plus": "val", "coef": self.recipe.lam}
        if self.recipe.bundle:
            pt = pv = self.forward({"train": train_batch, "val": val_batch})
            self.backward(pt, [arch, weights])
        else:
            pt = self.forward({"train": train_batch})
            self.backward(pt, [])
            pv = self.forward({"val": val_batch})
            self.backward(pv, [arch, weights])
        return self._finish({"loss_train": pt.losses["train"].detach(), "loss_val": pv.losses["val"].detach()})

    def _finish(self, record: dict[str, Any]) -> dict[str, Any]:
        record = {"step": self.step, **{k: float(v) for k, v in record.items()}}
        self.history.append(record)
        self.ledger.end_step()
        self.step += 1
        self._exchange = 0
        return record

    def run(self, train: torch.Tensor, val: torch.Tensor | None, batch_size: int, steps: int) -> list[dict[str, Any]]:
        """Step until ``steps`` on the batches ``Search.run`` draws."""
        while self.step < steps:
            s = self.step
            self.run_step(
                batch_at(train, batch_size, s, self.recipe.seed, "train"),
                None if val is None else batch_at(val, batch_size, s, self.recipe.seed, "val"),
            )
        self.flush()
        return self.history

    def evaluate(
        self,
        indices: torch.Tensor,
        batch_size: int = 256,
        split: str = "test",
        account: bool = True,
        predictions: bool = False,
    ) -> dict[str, Any]:
        """``VerticalProtocol.evaluate``: every party in eval mode, forward only, on ``eval_channel``."""
        result = evaluate_passes(
            self, list(self.party.modules().values()), self.party.labels, indices, batch_size, split, predictions
        )
        if account:
            account_evaluation(self.ledger, indices, split, {j: self.recipe.forward_mechanism for j in self.others})
        self.evaluations += 1
        return result

    def evaluate_label_party_alone(self, indices: torch.Tensor, batch_size: int = 256) -> float:
        return label_party_alone_accuracy(self.party, self.recipe.parties, indices, batch_size)

    def step_cost(self, step: int) -> dict[str, int]:
        return step_cost(self.channel, step, self.hub)

    def epsilon(self, delta: float, amplified: bool = False) -> dict[str, float]:
        return ledger_epsilons(self.ledger, [party_name(k) for k in range(self.recipe.parties)], delta, amplified)

    def local(self, task: str, commands: Mapping[int, dict[str, Any]]) -> dict[int, Any]:
        """Every party's ``recipe.local`` task, each on its own side (the label party's here, on its directory),
        with its command: their reports by party, each logged as crossing on ``report_channel``."""
        command_of = {j: {"task": task, **commands[j]} for j in range(self.recipe.parties)}
        for j in self.others:
            self.report_channel.send_scalars(
                self.step, self.hub, party_name(j), {f"{LOCAL}/{key}": value for key, value in command_of[j].items()}
            )
        replies = self._send(LOCAL, {j: (command_of[j], {}) for j in self.others})
        label = self.recipe.label
        reports = {label: self.recipe.local(task, self.party, self.directory, command_of[label])}
        for j in self.others:
            if REPORT not in replies.get(j, {}):
                raise FederationError(f"{party_name(j)}: its reply to local task {task!r} lacks {REPORT!r}")
            text = bytes(replies[j][REPORT].tolist()).decode("utf-8")
            self.report_channel.send_scalars(self.step, party_name(j), self.hub, {f"{task}/{REPORT}": text})
            reports[j] = json.loads(text)
        return reports

    def save_state(self, directory: str | Path) -> None:
        """Between steps: every other party saves its networks and optimizers in its own directory, then the label
        party writes ``directory`` atomically (its own file, and ``state.json``: the step, the history, the channel
        logs, the ledger). A run killed in between resumes from the previous complete state, which every party
        still keeps."""
        self._send(SAVE, {j: ({"step": self.step, "keep": self.checkpointed}, {}) for j in self.others})
        with atomic_dir(Path(directory)) as tmp:
            self.own.save(tmp / f"{self.hub}.safetensors")
            write_json(
                tmp / "state.json",
                {
                    "fingerprint": self.recipe.fingerprint,
                    "step": self.step,
                    "evaluations": self.evaluations,
                    "history": self.history,
                    "ledger": self.ledger.state(),
                    **{
                        f"{name}_{log}": [m.to_record() for m in getattr(channel, log)]
                        for name, channel in (("channel", self.channel), ("eval_channel", self.eval_channel))
                        for log in ("messages", "scalars")
                    },
                },
            )
        self.checkpointed = self.step

    def load_state(self, directory: str | Path) -> None:
        """Restore, in place, what ``save_state`` wrote, and tell every other party to load its file of that step."""
        directory = Path(directory)
        meta = read_json(directory / "state.json")
        if meta["fingerprint"] != self.recipe.fingerprint:
            raise ValueError(f"{directory}: a checkpoint of run {meta['fingerprint']}, not {self.recipe.fingerprint}")
        self.own.load(directory / f"{self.hub}.safetensors")
        self.step, self.evaluations, self._exchange = meta["step"], meta["evaluations"], 0
        self.history = [dict(record) for record in meta["history"]]
        self.ledger.load(meta["ledger"])
        for name, channel in (("channel", self.channel), ("eval_channel", self.eval_channel)):
            for log in ("messages", "scalars"):
                setattr(channel, log, [Message.from_record(r) for r in meta[f"{name}_{log}"]])
        self._send(LOAD, {j: ({"step": self.step}, {}) for j in self.others})
        self.checkpointed = self.step

    def save_parties(self) -> None:
        """Every other party saves its final networks and optimizers in its own directory (nothing crosses)."""
        self._send(SAVE, {j: ({"step": self.step, "keep": self.checkpointed}, {}) for j in self.others})
