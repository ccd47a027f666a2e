"""The two VFNAS update rules over the split-learning protocol, and an exact-resume checkpoint.

Every party searches its own bottom network (a ``Searchable``: ``arch_parameters()``, ``weight_parameters()``,
``forward(x)``); the label party also trains the top network. Each party's alphas, weights and optimizers
stay with it: only activations and their gradients (and, for DARTS second order, one scalar norm per party)
cross the channel.

Messages per search step, K parties (each pass = K-1 activations up + K-1 gradients down, 2 exchanges):

* VFNAS-1, DARTS first order: alpha on a validation pass, then w on a train pass at the new alphas; the
  second pass depends on the first, so 2 passes: 4(K-1) messages, 4 sequential exchanges.
* VFNAS-1, DARTS second order (finite-difference approximation, DARTS eq. 7-8): (1) train pass for the
  virtual step w' = w - xi * grad_w L_train(w, alpha); (2) validation pass at w' for grad_alpha L_val(w') and
  dw' = grad_w' L_val(w'); (3) the global norm ||dw'|| for the finite-difference radius eps = r / ||dw'||
  (each other party sends its squared norm, the label party returns the total: 2(K-1) scalar messages);
  (4, 5) train passes at w+ = w + eps dw' and w- = w - eps dw' for grad_alpha L_train(w+-); alpha gets
  grad_alpha L_val(w') - xi (grad_alpha L_train(w+) - grad_alpha L_train(w-)) / (2 eps); (6) train pass at the
  new alphas for w. Each depends on the previous: 5 passes + the norm = 12(K-1) messages, 12 exchanges
  (10(K-1) and 10 with ``global_norm=False``, which uses the fixed radius ``r``).
* VFNAS-2, MiLeNAS: grad_alpha = grad_alpha L_train + lambda grad_alpha L_val and grad_w = grad_w L_train,
  all at the same (w, alpha), so the train and validation batches travel together: one forward exchange
  (one message per party carrying both activations) and one backward exchange: 2(K-1) messages, 2
  exchanges (4(K-1) and 4 with ``bundle=False``, the released code's two sequential passes).

So MiLeNAS needs 6x fewer sequential exchanges than second-order DARTS and 2x fewer than first order.

``SplitTraining`` trains fixed networks (derived architectures, the hand-designed baseline) over the same protocol:
one pass a step, 2(K-1) messages, and the same exact-resume checkpoint.

Optimisers as in the released code: per party SGD (lr 0.025, momentum 0.9, wd 3e-4) for w and Adam (lr 3e-4,
betas (0.5, 0.999), wd 1e-3) for alpha, each party's weight gradient clipped to norm 5 locally. A learning
rate schedule is the caller's (rebuild it from ``protocol.step`` after a resume).

Batches: ``batch_at`` draws batch ``step`` of a split from a permutation seeded by (seed, split, epoch), so
a resumed run sees the same batches without any sampler state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from fedrepro.channel import Message
from fedrepro.io import atomic_dir, read_json, write_json
from fedrepro.seeding import derive_seed
from fedrepro.vfl.protocol import Party, PartyGrads, VerticalProtocol, set_grads


@runtime_checkable
class Searchable(Protocol):
    """What a party's searchable bottom network exposes."""

    def arch_parameters(self) -> Iterable[nn.Parameter]: ...

    def weight_parameters(self) -> Iterable[nn.Parameter]: ...

    def forward(self, x: torch.Tensor) -> torch.Tensor: ...


def make_optimizers(
    protocol: VerticalProtocol,
    lr: float = 0.025,
    momentum: float = 0.9,
    weight_decay: float = 3e-4,
    arch_lr: float = 3e-4,
    arch_weight_decay: float = 1e-3,
    arch_betas: tuple[float, float] = (0.5, 0.999),
) -> tuple[list[torch.optim.Optimizer], list[torch.optim.Optimizer | None]]:
    """One SGD (weights) and one Adam (alphas; None for a party without alphas) per party, released-code defaults."""
    pairs = [
        party_optimizers(p, lr, momentum, weight_decay, arch_lr, arch_weight_decay, arch_betas)
        for p in protocol.parties
    ]
    return [weights for weights, _ in pairs], [arch for _, arch in pairs]


def party_optimizers(
    party: Party,
    lr: float = 0.025,
    momentum: float = 0.9,
    weight_decay: float = 3e-4,
    arch_lr: float = 3e-4,
    arch_weight_decay: float = 1e-3,
    arch_betas: tuple[float, float] = (0.5, 0.999),
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer | None]:
    """One party's optimizers (``make_optimizers``): what a party running on its own node builds for itself."""
    weights = torch.optim.SGD(party.weight_parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    arch = party.arch_parameters()
    return weights, torch.optim.Adam(
        arch, lr=arch_lr, betas=arch_betas, weight_decay=arch_weight_decay
    ) if arch else None


def batch_at(indices: torch.Tensor, batch_size: int, step: int, seed: int, split: str) -> torch.Tensor:
    """Batch ``step`` of ``indices``: epochs of len // batch_size full batches, each epoch a fresh permutation
    seeded by (seed, split, epoch); stateless, so resume needs nothing but the step."""
    indices = torch.as_tensor(indices, dtype=torch.long)
    per_epoch = len(indices) // batch_size
    if per_epoch == 0:
        raise ValueError(f"split {split!r}: {len(indices)} samples, fewer than one batch of {batch_size}")
    epoch, position = divmod(step, per_epoch)
    order = torch.randperm(
        len(indices), generator=torch.Generator().manual_seed(derive_seed(seed, "batches", split, epoch))
    )
    return indices[order[position * batch_size : (position + 1) * batch_size]]


def rule_cost(
    rule: str, senders: int, second_order: bool = False, global_norm: bool = True, bundle: bool = True
) -> tuple[int, int]:
    """(messages, sequential exchanges) of one step of a rule with ``senders`` parties besides the label party (the
    counts in this module's docstring)."""
    if rule == "darts":
        passes = 4 if not second_order else 12 if global_norm else 10
    elif rule == "milenas":
        passes = 2 if bundle else 4
    elif rule == "train":
        passes = 2
    else:
        raise ValueError(f"rule {rule!r}: allowed 'darts', 'milenas', 'train'")
    return passes * senders, 0 if senders == 0 else passes


class Search:
    """Shared machinery: per-party optimizers, local gradient clipping, the step loop and its history."""

    rule = "search"

    def __init__(
        self,
        protocol: VerticalProtocol,
        weight_optimizers: Sequence[torch.optim.Optimizer],
        arch_optimizers: Sequence[torch.optim.Optimizer | None],
        grad_clip: float | None = 5.0,
    ) -> None:
        if not len(weight_optimizers) == len(arch_optimizers) == len(protocol.parties):
            raise ValueError("one weight optimizer and one arch optimizer (or None) per party")
        self.protocol = protocol
        self.weight_optimizers, self.arch_optimizers = list(weight_optimizers), list(arch_optimizers)
        self.grad_clip = grad_clip
        self.history: list[dict[str, Any]] = []

    @property
    def senders(self) -> int:
        return len(self.protocol.others)

    def messages_per_step(self) -> int:
        raise NotImplementedError

    def exchanges_per_step(self) -> int:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        p = self.protocol
        return {
            "rule": self.rule,
            "parties": len(p.parties),
            "label": p.label,
            "seed": p.seed,
            "grad_clip": self.grad_clip,
        }

    def step(self, train_batch: torch.Tensor, val_batch: torch.Tensor) -> dict[str, Any]:
        raise NotImplementedError

    def run(
        self, train_indices: torch.Tensor, val_indices: torch.Tensor, batch_size: int, steps: int
    ) -> list[dict[str, Any]]:
        """Search until ``protocol.step == steps`` (continues from wherever a loaded state left off)."""
        seed = self.protocol.seed
        while self.protocol.step < steps:
            s = self.protocol.step
            self.step(
                batch_at(train_indices, batch_size, s, seed, "train"), batch_at(val_indices, batch_size, s, seed, "val")
            )
        return self.history

    def _update_weights(self, grads: list[PartyGrads]) -> None:
        for party, g, optimizer in zip(self.protocol.parties, grads, self.weight_optimizers):
            params = party.weight_parameters()
            set_grads(params, g.weights)
            if self.grad_clip is not None:
                nn.utils.clip_grad_norm_(params, self.grad_clip)
            optimizer.step()

    def _update_arch(self, arch_grads: list[list[torch.Tensor]]) -> None:
        for party, g, optimizer in zip(self.protocol.parties, arch_grads, self.arch_optimizers):
            if optimizer is not None:
                set_grads(party.arch_parameters(), g)
                optimizer.step()

    def _finish(self, record: dict[str, Any]) -> dict[str, Any]:
        record = {"step": self.protocol.step, **{k: float(v) for k, v in record.items()}}
        self.history.append(record)
        self.protocol.end_step()
        return record


class DartsSearch(Search):
    """VFNAS-1: DARTS bi-level search (alpha on the validation batch, then w on the train batch)."""

    rule = "darts"

    def __init__(
        self,
        protocol: VerticalProtocol,
        weight_optimizers: Sequence[torch.optim.Optimizer],
        arch_optimizers: Sequence[torch.optim.Optimizer | None],
        grad_clip: float | None = 5.0,
        second_order: bool = False,
        xi: float = 0.025,
        r: float = 0.01,
        global_norm: bool = True,
    ) -> None:
        super().__init__(protocol, weight_optimizers, arch_optimizers, grad_clip)
        self.second_order, self.xi, self.r, self.global_norm = second_order, xi, r, global_norm

    def messages_per_step(self) -> int:
        return rule_cost("darts", self.senders, second_order=self.second_order, global_norm=self.global_norm)[0]

    def exchanges_per_step(self) -> int:
        return rule_cost("darts", self.senders, second_order=self.second_order, global_norm=self.global_norm)[1]

    def config(self) -> dict[str, Any]:
        return super().config() | {
            "second_order": self.second_order,
            "xi": self.xi,
            "r": self.r,
            "global_norm": self.global_norm,
        }

    def step(self, train_batch: torch.Tensor, val_batch: torch.Tensor) -> dict[str, Any]:
        P = self.protocol
        if self.second_order:
            arch_grads, loss_val = self._unrolled_arch_grads(train_batch, val_batch)
        else:
            pv = P.forward({"val": val_batch})
            arch_grads, loss_val = [g.arch for g in P.backward(pv)["val"]], pv.losses["val"]
        self._update_arch(arch_grads)
        pt = P.forward({"train": train_batch})
        self._update_weights(P.backward(pt)["train"])
        return self._finish({"loss_train": pt.losses["train"].detach(), "loss_val": loss_val.detach()})

    def _unrolled_arch_grads(
        self, train_batch: torch.Tensor, val_batch: torch.Tensor
    ) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
        """DARTS's second-order alpha gradient; every party moves only its own weights, restored at the end.
        The virtual step is plain SGD (DARTS eq. 6), without the momentum and weight-decay terms that the
        DARTS code folds into it."""
        P = self.protocol
        weights = [p.weight_parameters() for p in P.parties]
        saved = [[w.detach().clone() for w in ws] for ws in weights]

        def move(direction: list[list[torch.Tensor]], scale: float) -> None:
            with torch.no_grad():
                for ws, base, d in zip(weights, saved, direction):
                    for w, b, g in zip(ws, base, d):
                        w.copy_(b + scale * g)

        g_train = P.backward(P.forward({"train": train_batch}))["train"]
        move([g.weights for g in g_train], -self.xi)  # w' = w - xi * grad_w L_train(w)
        pv = P.forward({"val": val_batch})
        g_val = P.backward(pv)["val"]  # at w': grad_alpha L_val and dw'
        dw = [g.weights for g in g_val]
        if self.global_norm:
            squares = {
                p.index: sum(((g**2).sum() for g in d), torch.zeros((), device=p.features.device))
                for p, d in zip(P.parties, dw)
            }
            eps = self.r / max(P.global_norm(squares), 1e-12)
        else:
            eps = self.r
        move(dw, eps)
        g_plus = P.backward(P.forward({"train": train_batch}))["train"]
        move(dw, -eps)
        g_minus = P.backward(P.forward({"train": train_batch}))["train"]
        move(dw, 0.0)  # restore w
        arch = [
            [v - self.xi * (a - b) / (2 * eps) for v, a, b in zip(gv.arch, gp.arch, gm.arch)]
            for gv, gp, gm in zip(g_val, g_plus, g_minus)
        ]
        return arch, pv.losses["val"]


class MiLeNASSearch(Search):
    """VFNAS-2: MiLeNAS mixed-level search; w and alpha updated together from one train + one validation pass."""

    rule = "milenas"

    def __init__(
        self,
        protocol: VerticalProtocol,
        weight_optimizers: Sequence[torch.optim.Optimizer],
        arch_optimizers: Sequence[torch.optim.Optimizer | None],
        grad_clip: float | None = 5.0,
        lam: float = 1.0,
        bundle: bool = True,
    ) -> None:
        super().__init__(protocol, weight_optimizers, arch_optimizers, grad_clip)
        self.lam, self.bundle = lam, bundle

    def messages_per_step(self) -> int:
        return rule_cost("milenas", self.senders, bundle=self.bundle)[0]

    def exchanges_per_step(self) -> int:
        return rule_cost("milenas", self.senders, bundle=self.bundle)[1]

    def config(self) -> dict[str, Any]:
        return super().config() | {"lam": self.lam, "bundle": self.bundle}

    def step(self, train_batch: torch.Tensor, val_batch: torch.Tensor) -> dict[str, Any]:
        P = self.protocol
        if self.bundle:
            p = P.forward({"train": train_batch, "val": val_batch})
            g = P.backward(p)
            g_train, g_val, loss_train, loss_val = g["train"], g["val"], p.losses["train"], p.losses["val"]
        else:
            pt = P.forward({"train": train_batch})
            g_train = P.backward(pt)["train"]
            pv = P.forward({"val": val_batch})
            g_val = P.backward(pv)["val"]
            loss_train, loss_val = pt.losses["train"], pv.losses["val"]
        self._update_arch([[t + self.lam * v for t, v in zip(gt.arch, gv.arch)] for gt, gv in zip(g_train, g_val)])
        self._update_weights(g_train)
        return self._finish({"loss_train": loss_train.detach(), "loss_val": loss_val.detach()})


class SplitTraining(Search):
    """Plain split learning of fixed networks (no alphas), e.g. retraining derived architectures from scratch:
    one train pass and a weight update per step, 2(K-1) messages in 2 exchanges. A ``Search`` so that the same
    ``save_state`` / ``load_state`` resume it exactly; ``val_batch`` is ignored."""

    rule = "train"

    def messages_per_step(self) -> int:
        return rule_cost("train", self.senders)[0]

    def exchanges_per_step(self) -> int:
        return rule_cost("train", self.senders)[1]

    def step(self, train_batch: torch.Tensor, val_batch: torch.Tensor | None = None) -> dict[str, Any]:
        P = self.protocol
        p = P.forward({"train": train_batch})
        self._update_weights(P.backward(p)["train"])
        labels = P.parties[P.label].labels[p.batches["train"]]
        record = {"loss_train": p.losses["train"].detach()}
        if not torch.is_floating_point(labels):
            record["accuracy_train"] = (p.logits["train"].detach().argmax(dim=1) == labels).float().mean()
        return self._finish(record)


# ---- checkpoint ----------------------------------------------------------------------------------------------


def _flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optimizer's state as tensors (``<param index>.<key>``) plus JSON (param groups, non-tensor state)."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{key}"] = value
            elif value is not None:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _restore_optimizer(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, value in [*tensors.items(), *meta["scalars"].items()]:
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in group.items()} for group in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _messages_json(messages: list[Message]) -> list[list[Any]]:
    return [[m.round, m.sender, m.receiver, list(m.names), m.nbytes] for m in messages]


def _messages_from_json(rows: list[list[Any]]) -> list[Message]:
    return [Message(r, s, d, tuple(names), b) for r, s, d, names, b in rows]


def save_state(directory: str | Path, search: Search) -> None:
    """Write ``directory`` atomically, between steps: one ``<party>.safetensors`` per party (its modules'
    state dicts, its optimizers' state), and ``state.json`` (config, step, history, both channel logs, the
    privacy ledger, optimizer param groups). Each party's file is what that party would keep itself."""
    P = search.protocol
    optimizers_meta: dict[str, Any] = {}
    with atomic_dir(Path(directory)) as tmp:
        for party in P.parties:
            tensors = {
                f"{name}.{k}": v for name, module in party.modules().items() for k, v in module.state_dict().items()
            }
            for kind, optimizer in (
                ("weights", search.weight_optimizers[party.index]),
                ("arch", search.arch_optimizers[party.index]),
            ):
                if optimizer is None:
                    continue
                flat, meta = _flatten_optimizer(optimizer)
                tensors |= {f"optimizer.{kind}.{k}": v for k, v in flat.items()}
                optimizers_meta[f"{party.name}/{kind}"] = meta
            save_file(
                {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()},
                str(tmp / f"{party.name}.safetensors"),
            )
        write_json(
            tmp / "state.json",
            {
                "config": search.config(),
                "step": P.step,
                "evaluations": P.evaluations,
                "history": search.history,
                "messages": _messages_json(P.channel.messages),
                "eval_messages": _messages_json(P.eval_channel.messages),
                "ledger": P.ledger.state(),
                "optimizers": optimizers_meta,
            },
        )


def load_state(directory: str | Path, search: Search) -> dict[str, Any]:
    """Restore, in place, a state written by ``save_state`` into freshly built objects of the same
    configuration (refused otherwise). Returns the JSON part."""
    directory = Path(directory)
    meta = read_json(directory / "state.json")
    if meta["config"] != search.config():
        raise ValueError(f"checkpoint {directory} was written by {meta['config']}, not {search.config()}")
    P = search.protocol
    for party in P.parties:
        tensors = load_file(str(directory / f"{party.name}.safetensors"))
        for name, module in party.modules().items():
            module.load_state_dict({k[len(name) + 1 :]: v for k, v in tensors.items() if k.startswith(f"{name}.")})
        for kind, optimizer in (
            ("weights", search.weight_optimizers[party.index]),
            ("arch", search.arch_optimizers[party.index]),
        ):
            if optimizer is None:
                continue
            prefix = f"optimizer.{kind}."
            flat = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            _restore_optimizer(optimizer, flat, meta["optimizers"][f"{party.name}/{kind}"])
    P.step, P.evaluations, P._exchange = meta["step"], meta["evaluations"], 0
    P.channel.messages = _messages_from_json(meta["messages"])
    P.eval_channel.messages = _messages_from_json(meta["eval_messages"])
    P.ledger.load(meta["ledger"])
    search.history = [dict(record) for record in meta["history"]]
    return meta
