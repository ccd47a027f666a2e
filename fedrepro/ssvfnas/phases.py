"""The building blocks of an SS-VFNAS cell, shared by the run in one process (``fedrepro.ssvfnas.runs``), the party
processes (``fedrepro.ssvfnas.parties``) and the sanity protocol: the partition as tensors with its held-out rows, the
networks (supernets, derived and hand-designed bottoms, the top), the DP mechanisms and the vertical protocol, the
epsilon totals, the step loop with its checkpoints and curve points, and the metrics a search or a retraining records.
What a cell runs, phase by phase, is told in ``fedrepro.ssvfnas.runs``.

Epsilon (``EPSILON_ACCOUNTING``): the headline holds for what runs, without amplification: each sample's releases
over the search and the retraining (which samples train + search-valid again) composed, the worst sample's. Beside it,
the paper's amplified figure, which assumes Poisson subsampling (per split, max over the disjoint halves). Test-set
and held-out evaluations are measurements, not releases of training data, and are left out
(``evaluate(account=False)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedrepro.config import Params
from fedrepro.errors import DataError
from fedrepro.io import read_json, read_table
from fedrepro.seeding import derive_seed
from fedrepro.ssvfnas.cells import Cell, retrain_health
from fedrepro.ssvfnas.partition import stratified_splits
from fedrepro.vfl.moco import MoCo, pretrain
from fedrepro.vfl.privacy import GaussianMechanism, PrivacyLedger, compose_epsilon, epsilon_of
from fedrepro.vfl.protocol import Party, VerticalProtocol, exchange_count, party_name
from fedrepro.vfl.search import (
    DartsSearch,
    MiLeNASSearch,
    Search,
    SplitTraining,
    batch_at,
    load_state,
    make_optimizers,
    save_state,
)
from fedrepro.vfl.spaces import (
    CONV_OPS,
    MLP_OPS,
    PARAMETER_FREE,
    Supernet,
    build_derived,
    count_parameters,
    derive_genotype,
    edge_entropy,
    hand_designed,
    supernet,
)

EVAL_BATCH = 512


HELD_OUT = "held_out"


CURVE_FIELDS = (
    "test_accuracy",
    "test_loss",
    "messages",
    "bytes",
    "epsilon",
    "epsilon_amplified",
    "alpha_entropy",
    "alpha_shift",
)


EPSILON_ACCOUNTING = {
    "headline": "epsilon: no amplification. Every party knows the sample ids of each batch and batches are fixed-size "
    "draws from seeded shuffles, so each release is a Gaussian mechanism (rate 1) on the samples it holds; each "
    "sample's releases compose (search and retraining), and a party's epsilon is its most-released sample's "
    "(opacus' RDP accountant).",
    "amplified": "epsilon_amplified: the paper's accounting, assuming Poisson subsampling at rate batch / split size "
    "hidden from the adversary, every step composed at that rate (opacus' RDP accountant). It does not hold here.",
    "both": "Both treat a release as depending on a sample only through its own row; a party's weights are trained on "
    "its own un-noised rows, so later releases depend on earlier samples too, which neither covers.",
}
"""What each point of a search cell's curve records (curve.csv and metrics.json's search.curve)."""


PartyRunner = Callable[[Any, Callable[[Any], Any], Path], Any]
"""Runs one phase with the parties on their own sides: ``runner(recipe, drive, root)`` starts every party but the
label party (each with its directory under ``root``) and returns ``drive(hub)`` (``fedrepro.ssvfnas.parties``)."""


# ----- the partition as tensors ---------------------------------------------------------------------------
@dataclass
class PartitionData:
    name: str
    summary: dict[str, Any]
    features: list[torch.Tensor | None]
    """per party: (n, C, H, W) image views or (n, d) table rows, aligned by row; None for a party whose columns this
    process does not hold (``load_partition``'s ``parties``)."""
    labels: torch.Tensor
    sample_ids: np.ndarray
    splits: dict[str, torch.Tensor]
    """train / valid / test (and held_out, after ``hold_out``) -> row positions (sorted)."""

    @property
    def parties(self) -> int:
        return int(self.summary["parties"])

    @property
    def label_party(self) -> int:
        return int(self.summary["label_party"])

    @property
    def classes(self) -> int:
        return int(self.summary["classes"])

    def kind(self, party: int) -> str:
        return self.summary["kinds"][party]

    def in_features(self, party: int) -> int:
        shape = self.summary["shapes"][party]
        return int(shape[0]) if shape is not None else int(self.summary["features"][party])

    @property
    def training_rows(self) -> torch.Tensor:
        """train + search-valid: what MoCo pre-searches on and what the derived networks are retrained on."""
        return torch.cat([self.splits["train"], self.splits["valid"]]).sort().values


def hold_out(data: PartitionData, fraction: float, seed: int) -> PartitionData:
    """``data`` with a stratified share of its train split moved to ``held_out``: rows no phase trains on, which the
    retraining is validated on. Seeded by the sanity protocol's name, so the grid and the protocol hold out the same
    rows (a row-level split: rows of one ModelNet40 object may land on both sides)."""
    train = data.splits["train"]
    split = stratified_splits(
        data.labels[train].numpy(), fraction, 0.0, seed, f"{data.name}-sanity", check=("train", "test")
    )
    return replace(
        data,
        splits={
            **data.splits,
            "train": train[torch.from_numpy(split == "train")],
            HELD_OUT: train[torch.from_numpy(split == "test")],
        },
    )


def load_partition(folder: Path, label_only: bool = False) -> PartitionData:
    """The partition in ``folder``: the labels, the splits and every party's columns (``label_only``: the label
    party's alone, as the label party of a run with the parties on their own sides holds them)."""
    folder = Path(folder)
    if not (folder / "summary.json").exists():
        raise DataError(f"{folder}/summary.json is missing: run `dvc repro ssvfnas_partition`")
    summary = read_json(folder / "summary.json")
    labels = read_table(folder / "labels.parquet")
    splits = read_table(folder / "splits.parquet")
    ids = labels["sample_id"].to_numpy()
    if not np.array_equal(splits["sample_id"].to_numpy(), ids):
        raise DataError(f"{folder}: splits.parquet and labels.parquet list different sample ids")
    held = [int(summary["label_party"])] if label_only else range(int(summary["parties"]))
    features: list[torch.Tensor | None] = [None] * int(summary["parties"])
    for k in held:
        features[k] = load_party_columns(folder, summary, k, ids)
    split = splits["split"].to_numpy()
    return PartitionData(
        summary["name"],
        summary,
        features,
        torch.tensor(labels["label"].to_numpy(), dtype=torch.long),
        ids,
        {s: torch.tensor(np.flatnonzero(split == s), dtype=torch.long) for s in ("train", "valid", "test")},
    )


def load_party_columns(folder: Path, summary: dict[str, Any], k: int, ids: np.ndarray | None = None) -> torch.Tensor:
    """Party k's own columns (``party_<k>.parquet``), in row order; checked against the labels' sample ids where the
    caller holds them (a party without the labels trusts the aligned order it was given)."""
    table = read_table(Path(folder) / f"party_{k}.parquet")
    if ids is not None and not np.array_equal(table["sample_id"].to_numpy(), ids):
        raise DataError(f"{folder}/party_{k}.parquet is not aligned with labels.parquet")
    x = torch.tensor(table.drop(columns=["sample_id"]).to_numpy(dtype=np.float32))
    shape = summary["shapes"][k]
    return x.reshape(len(x), *shape) if shape is not None else x


# ----- networks, mechanisms, protocol ------------------------------------------------------------------------
def build_supernets(params: Params, data: PartitionData, seed: int) -> list[nn.Module]:
    """Every party's supernet, drawn on the CPU under the seed (the same weights whatever the device), then on
    ``train.device``, as every network built here."""
    s = params.ssvfnas.search
    torch.manual_seed(derive_seed(seed, "supernets", data.name))
    return [
        supernet(data.kind(k), data.in_features(k), s.out_dim, width=s.width, cells=s.cells, nodes=s.nodes).to(
            params.train.device
        )
        for k in range(data.parties)
    ]


def build_top(params: Params, data: PartitionData, seed: int, phase: str) -> nn.Module:
    """Net_c, the label party's top network: one linear layer on the concatenated embeddings [N_0 .. N_{K-1}]."""
    torch.manual_seed(derive_seed(seed, "top", phase, data.name))
    return nn.Linear(data.parties * params.ssvfnas.search.out_dim, data.classes).to(params.train.device)


def top_weight_norms(top: nn.Linear, parties: int) -> dict[str, float]:
    """L2 norm of the top network's weights on each party's slice of [N_0 .. N_{K-1}]: how much it listens to each party
    (under DP it learns to turn down the noisy embeddings it receives)."""
    slices = top.weight.detach().chunk(parties, dim=1)
    return {party_name(k): float(w.norm()) for k, w in enumerate(slices)}


def retrain_overrides(params: Params) -> dict[str, int]:
    r = params.ssvfnas.retrain
    return {k: v for k, v in (("width", r.width), ("cells", r.cells)) if v is not None}


def uniform_genotype(kind: str, nodes: int, op: str, skeleton: dict[str, Any]) -> dict[str, Any]:
    """A derived cell whose every kept edge is ``op``: intermediate node i fed by states i and i + 1 (DARTS's
    numbering, 0 and 1 = the cell inputs)."""
    gene = [[{"input": i, "op": op, "weight": 1.0}, {"input": i + 1, "op": op, "weight": 1.0}] for i in range(nodes)]
    return {"kind": kind, "ops": [], "nodes": gene, "concat": list(range(2, 2 + nodes)), "skeleton": dict(skeleton)}


def reference_parameters(kind: str, skeleton: dict[str, Any], overrides: dict[str, int]) -> int:
    """The expected parameter count of a derived network of this skeleton when every kept edge draws its op uniformly
    from the non-none candidates (the count is linear in the edges' op sizes, so it is the mean over ops of the
    all-one-op networks). Known before any search, so the baseline can be sized once per dataset-K."""
    ops = [o for o in (CONV_OPS if kind == "conv" else MLP_OPS) if o != "none"]
    counts = [
        count_parameters(build_derived(uniform_genotype(kind, skeleton["nodes"], o, skeleton), **overrides))
        for o in ops
    ]
    return int(round(sum(counts) / len(counts)))


def baseline_targets(params: Params, data: PartitionData) -> list[int]:
    """The parameter count each party's hand-designed network is sized to (``reference_parameters``)."""
    s, overrides = params.ssvfnas.search, retrain_overrides(params)
    targets = []
    for k in range(data.parties):
        skeleton = {
            "in_features": data.in_features(k),
            "out_dim": s.out_dim,
            "width": s.width,
            "cells": s.cells,
            "nodes": s.nodes,
            "stem_multiplier": 1,
        }
        targets.append(reference_parameters(data.kind(k), skeleton, overrides))
    return targets


def baseline_networks(params: Params, data: PartitionData, seed: int) -> tuple[list[nn.Module], list[int]]:
    """Each party's hand-designed bottom network and the parameter count it was sized to (``baseline_targets``)."""
    s, targets = params.ssvfnas.search, baseline_targets(params, data)
    torch.manual_seed(derive_seed(seed, "bottoms", "retrain", data.name))
    nets = [
        hand_designed(
            data.kind(k),
            data.in_features(k),
            s.out_dim,
            depth=params.ssvfnas.retrain.baseline_depth,
            target_params=targets[k],
        ).to(params.train.device)
        for k in range(data.parties)
    ]
    return nets, targets


class PooledBottom(nn.Module):
    """Every party's bottom network at one party: the concatenated flat features are cut back into each party's view,
    each view goes through its own bottom, and the embeddings are concatenated ([N_0 .. N_{K-1}], party order)."""

    def __init__(self, bottoms: list[nn.Module], shapes: list[tuple[int, ...]]):
        super().__init__()
        self.bottoms = nn.ModuleList(bottoms)
        self.shapes = [tuple(s) for s in shapes]
        self.sizes = [int(np.prod(s)) for s in self.shapes]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        views = torch.split(x, self.sizes, dim=1)
        return torch.cat([b(v.reshape(len(v), *s)) for b, v, s in zip(self.bottoms, views, self.shapes)], dim=1)


def pooled_features(data: PartitionData, parties: list[int]) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
    """The listed parties' features side by side at one party (flattened rows), and each party's row shape."""
    features = [data.features[k] for k in parties]
    return torch.cat([f.reshape(len(f), -1) for f in features], dim=1), [tuple(f.shape[1:]) for f in features]


def one_party(params: Params, data: PartitionData, parties: list[int], seed: int) -> VerticalProtocol:
    """The listed parties' hand-designed bottoms (the grid's baseline networks) and a fresh linear top, all at one party
    holding those parties' features and the labels: a protocol that sends nothing (the sanity protocol's pooled
    reference, and with the label party alone a trivial row of the main table)."""
    device = params.train.device
    nets, _ = baseline_networks(params, data, seed)
    features, shapes = pooled_features(data, parties)
    torch.manual_seed(derive_seed(seed, "top", "sanity", data.name, tuple(parties)))
    top = nn.Linear(len(parties) * params.ssvfnas.search.out_dim, data.classes).to(device)
    party = Party(0, features.to(device), PooledBottom([nets[k] for k in parties], shapes), data.labels.to(device), top)
    return VerticalProtocol([party], seed=derive_seed(seed, "retrain"))


def derived_networks(
    params: Params, data: PartitionData, seed: int, genotypes: list[dict[str, Any]]
) -> list[nn.Module]:
    return [derived_network(params, data, seed, k, g) for k, g in enumerate(genotypes)]


def derived_network(params: Params, data: PartitionData, seed: int, k: int, genotype: dict[str, Any]) -> nn.Module:
    """Party k's derived network, seeded by its own index, so that each party builds its own from its own genotype."""
    torch.manual_seed(derive_seed(seed, "bottoms", "retrain", data.name, k))
    return build_derived(genotype, **retrain_overrides(params)).to(params.train.device)


def mechanisms(params: Params, cell: Cell) -> tuple[GaussianMechanism | None, GaussianMechanism | None]:
    """(forward, backward) mechanisms of a cell's DP level; a zero sigma means no mechanism on that side (no
    clipping, no noise). ``fidelity: released_code``: batch-level clipping and sigma used as the noise std."""
    dp, released = params.ssvfnas.dp, params.ssvfnas.fidelity == "released_code"

    def make(clip: float, sigma: float) -> GaussianMechanism | None:
        if sigma == 0:
            return None
        return GaussianMechanism(clip, sigma, per_sample=not released, released_code=released)

    return make(dp.clip_forward, cell.sigma_forward), make(dp.clip_backward, cell.sigma_backward)


def make_protocol(
    params: Params,
    cell: Cell,
    data: PartitionData,
    bottoms: list[nn.Module],
    top: nn.Module,
    seed: int,
    split_sizes: dict[str, int],
) -> VerticalProtocol:
    """The in-process protocol over ``bottoms`` and ``top``; each party's rows (and the labels) on ``train.device``
    beside its networks, while ``data`` keeps the CPU copies the outputs are written from."""
    label, device = data.label_party, params.train.device
    parties = [
        Party(
            k,
            data.features[k].to(device),
            bottoms[k],
            data.labels.to(device) if k == label else None,
            top if k == label else None,
        )
        for k in range(data.parties)
    ]
    forward, backward = mechanisms(params, cell)
    return VerticalProtocol(
        parties, forward_mechanisms=forward, backward_mechanism=backward, seed=seed, split_sizes=split_sizes
    )


def make_search(params: Params, rule: str | None, protocol: VerticalProtocol, lr: float) -> Search:
    """The search rule of a method (``darts``: VFNAS-1, ``milenas``: VFNAS-2) or, for ``None``, plain split
    training of fixed networks; per-party SGD on weights (Adam on alphas) with the search's settings."""
    s = params.ssvfnas.search
    weights, arch = make_optimizers(
        protocol,
        lr=lr,
        momentum=s.momentum,
        weight_decay=s.weight_decay,
        arch_lr=s.arch_lr,
        arch_weight_decay=s.arch_weight_decay,
    )
    if rule is None:
        return SplitTraining(protocol, weights, arch, grad_clip=s.grad_clip)
    if rule == "darts":
        return DartsSearch(protocol, weights, arch, grad_clip=s.grad_clip, second_order=s.second_order, xi=s.lr)
    if rule == "milenas":  # the released code runs MiLeNAS's train and valid passes one after the other
        return MiLeNASSearch(
            protocol,
            weights,
            arch,
            grad_clip=s.grad_clip,
            lam=s.milenas_lambda,
            bundle=params.ssvfnas.fidelity == "paper",
        )
    raise ValueError(f"search rule {rule!r}: allowed 'darts', 'milenas' or None")


def cosine_lr(base: float, floor: float, step: int, total: int) -> float:
    return floor + 0.5 * (base - floor) * (1.0 + math.cos(math.pi * step / max(total, 1)))


# ----- epsilon ---------------------------------------------------------------------------------------------
def worst(values: dict[str, float]) -> float:
    """The largest epsilon over parties; NaN if any party's is not accountable."""
    values = list(values.values())
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values, default=0.0)


def finite(value: float) -> float | None:
    """JSON-safe: None for inf (a release without noise) and NaN (a released-code mechanism, no accountant)."""
    return float(value) if math.isfinite(value) else None


def epsilon_status(values: dict[str, float]) -> str:
    v = worst(values)
    if math.isnan(v):
        return "not accountable (released-code mechanism)"
    if math.isinf(v):
        return "unbounded (a release without noise)"
    return "accounted (RDP)"


def total_epsilon(search: PrivacyLedger | None, retrain: PrivacyLedger, party: str, delta: float) -> float:
    """The headline epsilon of the search and the retraining together, without amplification: each sample's releases in
    both runs (the retraining samples the search's train and search-valid rows again), the worst sample's."""
    return epsilon_of([ledger for ledger in (search, retrain) if ledger is not None], party, delta)


def total_epsilon_amplified(search: PrivacyLedger | None, retrain: PrivacyLedger, party: str, delta: float) -> float:
    """The same under the amplified accounting (Poisson subsampling assumed): each of the search's disjoint halves
    composed with the retraining's releases (which sample both halves), the max over the halves."""
    if party in retrain.unaccounted or (search is not None and party in search.unaccounted):
        return math.nan
    again = [tuple(e) for e in retrain.history.get(party, {}).get("train", [])]
    halves = search.history.get(party, {}) if search is not None else {}
    if not halves:
        return compose_epsilon(again, delta)
    return max(compose_epsilon([tuple(e) for e in entries] + again, delta) for entries in halves.values())


# ----- steps, curves and what a phase measured ---------------------------------------------------------------
def presearch_party(
    params: Params, seed: int, dataset: str, k: int, bottom: Supernet, rows: torch.Tensor
) -> list[float]:
    """MoCo v2 of party k's supernet (weights and alphas) on its own training rows, seeded by the party alone: what
    each party runs on its own side. The projection head (under the seed) and the queue (from the party's generator)
    are drawn on the CPU, then join the supernet and the rows on ``train.device``. Returns the loss per step."""
    m, s = params.ssvfnas.moco, params.ssvfnas.search
    generator = torch.Generator().manual_seed(derive_seed(seed, "moco", dataset, k))
    torch.manual_seed(derive_seed(seed, "moco-head", dataset, k))
    moco = MoCo(
        bottom,
        s.out_dim,
        m.projection_dim,
        m.queue_size,
        m.momentum,
        m.temperature,
        released_code=params.ssvfnas.fidelity == "released_code",
        generator=generator,
    ).to(params.train.device)
    weights = torch.optim.SGD(
        list(bottom.weight_parameters()) + list(moco.head_q.parameters()),
        lr=m.lr,
        momentum=s.momentum,
        weight_decay=s.weight_decay,
    )
    arch = torch.optim.Adam(
        bottom.arch_parameters(), lr=s.arch_lr, betas=(0.5, 0.999), weight_decay=s.arch_weight_decay
    )
    return pretrain(moco, rows.to(params.train.device), m.steps, m.batch_size, [weights, arch], generator)


class Stepper(Protocol):
    """What ``run_steps`` drives: the in-process rules (``SearchSteps``) or the label party's hub (``HubSteps``)."""

    step: int
    seed: int
    history: list[dict[str, Any]]

    def run_step(self, train_batch: torch.Tensor, val_batch: torch.Tensor | None, lr: float) -> None: ...

    def save(self, folder: Path) -> None: ...

    def load(self, folder: Path) -> None: ...


class SearchSteps:
    """A ``Search`` over the in-process protocol as a ``Stepper``."""

    def __init__(self, search: Search) -> None:
        self.search = search

    @property
    def step(self) -> int:
        return self.search.protocol.step

    @property
    def seed(self) -> int:
        return self.search.protocol.seed

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.search.history

    def run_step(self, train_batch: torch.Tensor, val_batch: torch.Tensor | None, lr: float) -> None:
        for optimizer in self.search.weight_optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        self.search.step(train_batch, val_batch)

    def save(self, folder: Path) -> None:
        save_state(folder, self.search)

    def load(self, folder: Path) -> None:
        load_state(folder, self.search)


def run_steps(
    search: Search | Stepper,
    train: torch.Tensor,
    valid: torch.Tensor | None,
    batch_size: int,
    steps: int,
    lr: float,
    lr_min: float,
    eval_every: int,
    checkpoint_every: int,
    folder: Path,
    evaluate: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Step ``search`` until ``steps`` from wherever its checkpoint in ``folder`` left off: cosine learning rate
    on the weights from the step number, an evaluation recorded into the step's history record every
    ``eval_every`` steps and at the end, a checkpoint every ``checkpoint_every`` steps and at the end."""
    stepper = SearchSteps(search) if isinstance(search, Search) else search
    if (folder / "state.json").exists():
        stepper.load(folder)
    batch = min(batch_size, len(train), len(valid) if valid is not None else len(train))
    while stepper.step < steps:
        s = stepper.step
        stepper.run_step(
            batch_at(train, batch, s, stepper.seed, "train"),
            batch_at(valid, batch, s, stepper.seed, "val") if valid is not None else None,
            cosine_lr(lr, lr_min, s, steps),
        )
        done = stepper.step
        if evaluate is not None and (done % eval_every == 0 or done == steps):
            stepper.history[-1].update(evaluate())
        if done % checkpoint_every == 0 or done == steps:
            stepper.save(folder)


def alpha_stats(supernets: list[Supernet], alpha_start: list[torch.Tensor]) -> list[dict[str, float]]:
    """Per party: the entropy of softmax(alpha) (mean over edges) and the largest |alpha - alpha at the search's
    start|."""
    return [
        {"entropy": net.arch_entropy(), "shift": float((net.alphas.detach() - a).abs().max())}
        for net, a in zip(supernets, alpha_start)
    ]


def curve_point(
    protocol: Any, test: torch.Tensor, delta: float, alphas: Callable[[], list[dict[str, float]]]
) -> Callable[[], dict[str, Any]]:
    """A curve point: the supernets' test accuracy, what crossed so far, epsilon so far, and the architecture weights
    (``alphas()``: each party's ``alpha_stats``): their entropy (mean over parties) and largest shift since the search's
    start (max over parties), so a search that leaves alpha where it started shows it. ``protocol``: the in-process
    ``VerticalProtocol`` or the label party's hub."""

    def point() -> dict[str, Any]:
        result = protocol.evaluate(test, batch_size=EVAL_BATCH, split="test", account=False)
        messages, stats = protocol.channel.messages, alphas()
        return {
            "test_accuracy": result["accuracy"],
            "test_loss": result["loss"],
            "messages": len(messages),
            "bytes": sum(m.nbytes for m in messages),
            "epsilon": finite(worst(protocol.epsilon(delta))),
            "epsilon_amplified": finite(worst(protocol.epsilon(delta, amplified=True))),
            "alpha_entropy": float(np.mean([p["entropy"] for p in stats])),
            "alpha_shift": max(p["shift"] for p in stats),
        }

    return point


def validation_point(protocol: Any, held_out: torch.Tensor) -> Callable[[], dict[str, Any]]:
    """A retraining eval point: accuracy and loss on the held-out rows (a measurement, not a release: unaccounted)."""

    def point() -> dict[str, Any]:
        result = protocol.evaluate(held_out, batch_size=EVAL_BATCH, split=HELD_OUT, account=False)
        return {"valid_accuracy": result["accuracy"], "valid_loss": result["loss"]}

    return point


def validation_curve(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per validated step: the step (1-based), the mean training loss over the steps since the previous point
    (the health rule's per-round loss, smoothed over batches) and the held-out accuracy and loss."""
    points, losses = [], []
    for record in history:
        losses.append(record["loss_train"])
        if "valid_accuracy" in record:
            points.append(
                {
                    "step": record["step"] + 1,
                    "train_loss": float(np.mean(losses)),
                    "valid_accuracy": record["valid_accuracy"],
                    "valid_loss": record["valid_loss"],
                }
            )
            losses = []
    return points


def _kept_edges(genotype: dict[str, Any]) -> list[list[tuple[int, str]]]:
    return [sorted((int(e["input"]), e["op"]) for e in node) for node in genotype["nodes"]]


def party_alpha_summary(net: Supernet, init: torch.Tensor, start: torch.Tensor) -> dict[str, Any]:
    """One party's part of ``alpha_summary``, computed where its supernet lives."""
    derived = net.genotype()
    from_start = derive_genotype(F.softmax(start, dim=-1).cpu(), net.ops, net.skeleton["nodes"])
    kept = [e["op"] for node in derived["nodes"] for e in node]
    return {
        "entropy_uniform": math.log(len(net.ops)),
        "entropy_init": edge_entropy(init),
        "entropy_start": edge_entropy(start),
        "entropy_end": net.arch_entropy(),
        "max_shift": float((net.alphas.detach() - start).abs().max()),
        "max_shift_presearch": float((start - init).abs().max()),
        "genotype_as_at_start": _kept_edges(derived) == _kept_edges(from_start),
        "parameter_free_edges": sum(op in PARAMETER_FREE for op in kept) / len(kept),
        "mean_weights": {op: float(w) for op, w in zip(net.ops, net.edge_weights().detach().mean(dim=0))},
    }


def alpha_summary(
    supernets: list[Supernet], alpha_init: list[torch.Tensor], alpha_start: list[torch.Tensor]
) -> dict[str, Any]:
    """``combine_alpha_summaries`` of every party's ``party_alpha_summary``."""
    return combine_alpha_summaries(
        [party_alpha_summary(net, init, start) for net, init, start in zip(supernets, alpha_init, alpha_start)]
    )


def combine_alpha_summaries(parties: list[dict[str, Any]]) -> dict[str, Any]:
    """How far the search (and, for ss_ methods, the pre-search) moved each party's alphas: the entropy of
    softmax(alpha) (mean over edges, nats; ``entropy_uniform`` = ln(ops) is the untouched value) when built, at the
    search's start and at its end; the largest |alpha_end - alpha_start| and |alpha_start - alpha_init|; the mean
    mixture weight of each op at the end; the share of the derived edges on parameter-free ops; and whether the derived
    genotype is the one the starting alphas alone would give (if so, the search's alpha updates changed nothing that
    the retraining sees)."""
    return {
        "entropy_uniform": float(np.mean([p["entropy_uniform"] for p in parties])),
        **{key: float(np.mean([p[key] for p in parties])) for key in ("entropy_init", "entropy_start", "entropy_end")},
        "max_shift": max(p["max_shift"] for p in parties),
        "max_shift_presearch": max(p["max_shift_presearch"] for p in parties),
        "genotype_as_at_start": all(p["genotype_as_at_start"] for p in parties),
        "parameter_free_edges": float(np.mean([p["parameter_free_edges"] for p in parties])),
        "parties": parties,
    }


def _channel(protocol: Any, messages_per_step: int, exchanges_per_step: int) -> dict[str, Any]:
    """What the channel logged: totals, the first step's bytes, sequential exchanges summed over the steps."""
    messages = protocol.channel.messages
    first = protocol.step_cost(0) if protocol.step else {"messages": 0, "bytes": 0, "exchanges": 0}
    by_step: dict[int, list] = {}
    for message in messages:
        by_step.setdefault(message.round, []).append(message)
    return {
        "steps": protocol.step,
        "messages": len(messages),
        "bytes": sum(m.nbytes for m in messages),
        "exchanges": sum(exchange_count(group, protocol.hub) for group in by_step.values()),
        "messages_per_step": messages_per_step,
        "exchanges_per_step": exchanges_per_step,
        "bytes_per_step": first["bytes"],
        "links": protocol.channel.summary(),
        "evaluation_messages": len(protocol.eval_channel.messages),
        "evaluation_bytes": sum(m.nbytes for m in protocol.eval_channel.messages),
    }


def phase_losses(history: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    values = [r[key] for r in history if key in r]
    return {"first": values[0] if values else None, "last": values[-1] if values else None}


def search_metrics(
    params: Params,
    cell: Cell,
    protocol: Any,
    history: list[dict[str, Any]],
    cost: tuple[int, int],
    presearch_losses: dict[str, list[float]] | None,
    alpha: dict[str, Any],
    genotypes: list[dict[str, Any]],
) -> dict[str, Any]:
    """metrics.json's presearch, search and genotypes, from a finished search over ``protocol`` (the in-process
    protocol or the label party's hub); ``cost``: the rule's (messages, exchanges) per step."""
    delta = params.ssvfnas.dp.delta
    epsilon, amplified = protocol.epsilon(delta), protocol.epsilon(delta, amplified=True)
    curve = [{"step": r["step"] + 1, **{k: r[k] for k in CURVE_FIELDS}} for r in history if "test_accuracy" in r]
    names = [party_name(k) for k in range(cell.parties)]
    return {
        "presearch": None
        if presearch_losses is None
        else {
            "steps": params.ssvfnas.moco.steps,
            "loss": {p: {"first": v[0], "last": v[-1]} for p, v in presearch_losses.items()},
            "losses": presearch_losses,
        },
        "search": {
            "rule": cell.rule,
            **_channel(protocol, *cost),
            "curve": curve,
            "test_accuracy": curve[-1]["test_accuracy"],
            "loss_train": phase_losses(history, "loss_train"),
            "loss_val": phase_losses(history, "loss_val"),
            "epsilon": {p: finite(v) for p, v in epsilon.items()},
            "epsilon_max": finite(worst(epsilon)),
            "epsilon_amplified": {p: finite(v) for p, v in amplified.items()},
            "epsilon_amplified_max": finite(worst(amplified)),
            "max_releases_per_sample": {p: protocol.ledger.max_releases(p) for p in names},
            "epsilon_status": epsilon_status(epsilon),
            "alpha": alpha,
        },
        "genotypes": genotypes,
    }


def retrain_metrics(
    params: Params,
    data: PartitionData,
    search_ledger: PrivacyLedger | None,
    protocol: Any,
    history: list[dict[str, Any]],
    cost: tuple[int, int],
    top: nn.Linear,
    result: dict[str, Any],
    label_alone_accuracy: float,
    parameters: dict[str, Any],
) -> dict[str, Any]:
    """metrics.json's retrain, health, test, epsilon totals and parameters, from a finished retraining over
    ``protocol`` (in process or the hub), its test ``result`` and the search's ledger (None for a baseline)."""
    delta, held_out, test = params.ssvfnas.dp.delta, data.splits[HELD_OUT], data.splits["test"]
    retrain_curve = validation_curve(history)
    names = [party_name(k) for k in range(data.parties)]
    ledger = protocol.ledger
    total = {p: total_epsilon(search_ledger, ledger, p, delta) for p in names}
    total_amplified = {p: total_epsilon_amplified(search_ledger, ledger, p, delta) for p in names}
    return {
        "retrain": {
            **_channel(protocol, *cost),
            "loss_train": phase_losses(history, "loss_train"),
            "accuracy_train": phase_losses(history, "accuracy_train"),
            "held_out_samples": len(held_out),
            "curve": retrain_curve,
            "valid_accuracy": retrain_curve[-1]["valid_accuracy"],
            "epsilon": {p: finite(total_epsilon(None, ledger, p, delta)) for p in names},
            "epsilon_amplified": {p: finite(total_epsilon_amplified(None, ledger, p, delta)) for p in names},
            "max_releases_per_sample": {p: ledger.max_releases(p) for p in names},
            "top_weight_norms": top_weight_norms(top, data.parties),
        },
        "health": retrain_health(retrain_curve).as_dict(),
        "test": {
            "accuracy": result["accuracy"],
            "loss": result["loss"],
            "samples": len(test),
            "accuracy_label_party_only": label_alone_accuracy,
        },
        "epsilon_total": {p: finite(v) for p, v in total.items()},
        "epsilon_total_max": finite(worst(total)),
        "epsilon_total_amplified": {p: finite(v) for p, v in total_amplified.items()},
        "epsilon_total_amplified_max": finite(worst(total_amplified)),
        "epsilon_accounting": EPSILON_ACCOUNTING,
        "epsilon_status": epsilon_status(total),
        "delta": delta,
        "parameters": parameters,
        "label_party": data.label_party,
    }
