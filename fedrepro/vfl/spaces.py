"""Per-party DARTS search spaces for SS-VFNAS: a convolutional space for image views, an MLP space for tables.

Every party of the vertical federation searches its own bottom network ``Net_j``; its output (batch, out_dim)
is the embedding ``N_j`` sent to the label party. Both spaces share DARTS's cell skeleton:

* a cell has two input nodes (the outputs of the previous two cells, each first mapped to the cell width by a
  "preprocess" layer) and ``nodes`` intermediate nodes; intermediate node ``i`` is the sum over every earlier
  node ``j`` (inputs included) of an edge ``MixedOp_{j->i}(h_j)``; the cell output is the concatenation of the
  intermediate nodes;
* a MixedOp is ``sum_o softmax(alpha_edge)_o * o(h)`` over the candidate operations;
* one alpha tensor of shape (edges, ops) is shared by all cells (DARTS's "normal" cell). At 8x4 or 4x4 inputs
  there is no room for DARTS's stride-2 reduction cells, so this space has normal cells only, every op has
  stride 1, and no ``alphas_reduce`` exists. Node indices follow DARTS: 0 and 1 are the cell inputs
  (c_{k-2}, c_{k-1}), ``2 + i`` is intermediate node ``i``.

Convolutional space (``ConvSupernet``; input (batch, C_in, H, W), e.g. (batch, 1, 8, 4) digit halves):
stem Conv3x3 + BN to ``stem_multiplier * width`` channels, ``cells`` cells, global average pooling, Linear to
``out_dim``. Candidate ops (``CONV_OPS``): none (zero), skip_connect (identity), max_pool_3x3, avg_pool_3x3
(padding excluded from the average), sep_conv_3x3 (twice ReLU-depthwise 3x3-pointwise 1x1-BN), dil_conv_3x3
(ReLU-depthwise 3x3 dilation 2-pointwise 1x1-BN). As in DARTS the searched network's BNs inside ops are
non-affine and pooling edges get a non-affine BN; the derived network uses affine BNs and bare pools.

MLP space (``MLPSupernet``; input (batch, in_dim) numeric features): stem Linear(in_dim, hidden) + LayerNorm,
preprocess = ReLU-Linear-LayerNorm, output Linear(nodes * hidden, out_dim). Candidate ops (``MLP_OPS``): none
(zero), identity, linear_relu (Linear(h, h)-ReLU), linear_tanh (Linear(h, h)-Tanh), bottleneck_relu
(Linear(h, h//2)-ReLU-Linear(h//2, h)). LayerNorm (per sample) instead of BatchNorm because tables are small
and the MoCo pre-search should not be able to use batch statistics as a shortcut.

The derivation follows DARTS: for every intermediate node keep the two incoming edges whose strongest non-none
softmax weight is largest (ties: lower input index first) and on each the strongest non-none op.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

CONV_OPS = ("none", "skip_connect", "max_pool_3x3", "avg_pool_3x3", "sep_conv_3x3", "dil_conv_3x3")
MLP_OPS = ("none", "identity", "linear_relu", "linear_tanh", "bottleneck_relu")
KINDS = ("conv", "mlp")
PARAMETER_FREE = frozenset({"skip_connect", "max_pool_3x3", "avg_pool_3x3", "identity"})
"""Ops without weights: useful to a supernet before its parametric ops have trained (DARTS's known early bias)."""
EDGES_PER_NODE = 2  # DARTS keeps two incoming edges per intermediate node


class Zero(nn.Module):
    """The 'none' op: a zero tensor of the input's shape (keeps the graph connected, like DARTS)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul(0.0)


def _sep_half(c: int, affine: bool) -> list[nn.Module]:
    return [
        nn.ReLU(),
        nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False),
        nn.Conv2d(c, c, 1, bias=False),
        nn.BatchNorm2d(c, affine=affine),
    ]


def conv_op(name: str, c: int, search: bool) -> nn.Module:
    """One candidate op of the conv space on ``c`` channels, stride 1 (spatial size preserved)."""
    affine = not search
    if name == "none":
        return Zero()
    if name == "skip_connect":
        return nn.Identity()
    if name in ("max_pool_3x3", "avg_pool_3x3"):
        pool = nn.MaxPool2d(3, 1, 1) if name == "max_pool_3x3" else nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        return nn.Sequential(pool, nn.BatchNorm2d(c, affine=False)) if search else pool
    if name == "sep_conv_3x3":
        return nn.Sequential(*_sep_half(c, affine), *_sep_half(c, affine))
    if name == "dil_conv_3x3":
        return nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=2, dilation=2, groups=c, bias=False),
            nn.Conv2d(c, c, 1, bias=False),
            nn.BatchNorm2d(c, affine=affine),
        )
    raise ValueError(f"unknown conv op {name!r}; allowed {list(CONV_OPS)}")


def mlp_op(name: str, h: int, search: bool) -> nn.Module:
    """One candidate op of the MLP space on width ``h`` (``search`` is unused: the MLP ops have no BN)."""
    del search
    if name == "none":
        return Zero()
    if name == "identity":
        return nn.Identity()
    if name == "linear_relu":
        return nn.Sequential(nn.Linear(h, h), nn.ReLU())
    if name == "linear_tanh":
        return nn.Sequential(nn.Linear(h, h), nn.Tanh())
    if name == "bottleneck_relu":
        mid = max(1, h // 2)
        return nn.Sequential(nn.Linear(h, mid), nn.ReLU(), nn.Linear(mid, h))
    raise ValueError(f"unknown MLP op {name!r}; allowed {list(MLP_OPS)}")


_OPS = {"conv": (CONV_OPS, conv_op), "mlp": (MLP_OPS, mlp_op)}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; allowed {list(KINDS)}")


def edge_count(nodes: int) -> int:
    """Edges of a cell with ``nodes`` intermediate nodes: node i has 2 + i inputs."""
    return sum(2 + i for i in range(nodes))


class MixedOp(nn.Module):
    """``sum_o w_o * o(x)`` over the candidate ops; ``w`` is one row of softmax(alpha)."""

    def __init__(self, kind: str, width: int, ops: tuple[str, ...]):
        super().__init__()
        build = _OPS[kind][1]
        self.names = tuple(ops)
        self.ops = nn.ModuleList(build(name, width, True) for name in ops)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = weights[0] * self.ops[0](x)
        for w, op in zip(weights[1:], self.ops[1:]):
            out = out + w * op(x)
        return out


def _preprocess(kind: str, c_in: int, c_out: int, affine: bool) -> nn.Module:
    if kind == "conv":
        return nn.Sequential(nn.ReLU(), nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out, affine=affine))
    return nn.Sequential(nn.ReLU(), nn.Linear(c_in, c_out), nn.LayerNorm(c_out, elementwise_affine=affine))


class SearchCell(nn.Module):
    """A DARTS cell whose edges are MixedOps; ``forward`` takes the (edges, ops) weight matrix."""

    def __init__(self, kind: str, c_pp: int, c_p: int, width: int, nodes: int, ops: tuple[str, ...]):
        super().__init__()
        self.nodes = nodes
        self.pre0 = _preprocess(kind, c_pp, width, affine=False)
        self.pre1 = _preprocess(kind, c_p, width, affine=False)
        self.edges = nn.ModuleList(MixedOp(kind, width, ops) for _ in range(edge_count(nodes)))

    def forward(self, s0: torch.Tensor, s1: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        states = [self.pre0(s0), self.pre1(s1)]
        offset = 0
        for _ in range(self.nodes):
            node = sum(self.edges[offset + j](h, weights[offset + j]) for j, h in enumerate(states))
            offset += len(states)
            states.append(node)
        return torch.cat(states[2:], dim=1)


class DerivedCell(nn.Module):
    """A DARTS cell with fixed ops: node i = sum of its chosen ops applied to their chosen inputs."""

    def __init__(self, kind: str, c_pp: int, c_p: int, width: int, gene: list[list[dict[str, Any]]]):
        super().__init__()
        build = _OPS[kind][1]
        self.pre0 = _preprocess(kind, c_pp, width, affine=True)
        self.pre1 = _preprocess(kind, c_p, width, affine=True)
        self.inputs = [[int(e["input"]) for e in node] for node in gene]
        self.ops = nn.ModuleList(nn.ModuleList(build(e["op"], width, False) for e in node) for node in gene)

    def forward(self, s0: torch.Tensor, s1: torch.Tensor) -> torch.Tensor:
        states = [self.pre0(s0), self.pre1(s1)]
        for inputs, ops in zip(self.inputs, self.ops):
            states.append(sum(op(states[j]) for j, op in zip(inputs, ops)))
        return torch.cat(states[2:], dim=1)


class _Skeleton(nn.Module):
    """Stem, cells and output layer shared by the supernets and the derived networks."""

    def __init__(
        self,
        kind: str,
        in_features: int,
        out_dim: int,
        width: int,
        cells: int,
        nodes: int,
        stem_multiplier: int,
        make_cell: Callable[[int, int], nn.Module],
    ):
        super().__init__()
        _check_kind(kind)
        if min(in_features, out_dim, width, cells, nodes, stem_multiplier) < 1:
            raise ValueError("in_features, out_dim, width, cells, nodes and stem_multiplier must all be >= 1")
        self.kind = kind
        self.skeleton = {
            "in_features": in_features,
            "out_dim": out_dim,
            "width": width,
            "cells": cells,
            "nodes": nodes,
            "stem_multiplier": stem_multiplier,
        }
        c_stem = stem_multiplier * width
        if kind == "conv":
            self.stem = nn.Sequential(nn.Conv2d(in_features, c_stem, 3, padding=1, bias=False), nn.BatchNorm2d(c_stem))
        else:
            self.stem = nn.Sequential(nn.Linear(in_features, c_stem), nn.LayerNorm(c_stem))
        c_pp, c_p = c_stem, c_stem
        self.cells = nn.ModuleList()
        for _ in range(cells):
            self.cells.append(make_cell(c_pp, c_p))
            c_pp, c_p = c_p, nodes * width
        self.head = nn.Linear(c_p, out_dim)

    def _finish(self, s: torch.Tensor) -> torch.Tensor:
        if self.kind == "conv":
            s = F.adaptive_avg_pool2d(s, 1).flatten(1)
        return self.head(s)

    def _check_input(self, x: torch.Tensor) -> None:
        want = 4 if self.kind == "conv" else 2
        if x.dim() != want:
            shape = "(batch, channels, height, width)" if want == 4 else "(batch, features)"
            raise ValueError(f"{type(self).__name__} ({self.kind}) expects {shape}, got shape {tuple(x.shape)}")


class Supernet(_Skeleton):
    """A party's DARTS supernet. ``forward(x) -> (batch, out_dim)``; alphas are ``self.alphas`` (edges, ops)."""

    def __init__(
        self,
        kind: str,
        in_features: int,
        out_dim: int = 16,
        width: int = 8,
        cells: int = 2,
        nodes: int = 2,
        stem_multiplier: int = 1,
        ops: tuple[str, ...] | None = None,
    ):
        _check_kind(kind)
        ops = tuple(ops) if ops is not None else _OPS[kind][0]
        unknown = [o for o in ops if o not in _OPS[kind][0]]
        if unknown or "none" not in ops or len(ops) < 2:
            raise ValueError(f"ops {list(ops)}: need 'none' plus at least one of {list(_OPS[kind][0])}")
        super().__init__(
            kind,
            in_features,
            out_dim,
            width,
            cells,
            nodes,
            stem_multiplier,
            lambda c_pp, c_p: SearchCell(kind, c_pp, c_p, width, nodes, ops),
        )
        self.ops = ops
        # DARTS initialisation: small Gaussian noise around uniform softmax weights (global torch RNG).
        self.alphas = nn.Parameter(1e-3 * torch.randn(edge_count(nodes), len(ops)))

    def edge_weights(self) -> torch.Tensor:
        """softmax(alpha) per edge: the MixedOp weights, shape (edges, ops)."""
        return F.softmax(self.alphas, dim=-1)

    def arch_entropy(self) -> float:
        """Mean over edges of the entropy (nats) of softmax(alpha): ln(ops) while the mixture is uniform, 0 once every
        edge has picked one op; tells whether the search moved alpha at all."""
        return edge_entropy(self.alphas.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        weights = self.edge_weights()
        s0 = s1 = self.stem(x)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1, weights)
        return self._finish(s1)

    def arch_parameters(self) -> list[nn.Parameter]:
        return [self.alphas]

    def weight_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p is not self.alphas]

    def genotype(self) -> dict[str, Any]:
        gene = derive_genotype(self.edge_weights().detach().cpu(), self.ops, self.skeleton["nodes"])
        return {"kind": self.kind, "ops": list(self.ops), **gene, "skeleton": dict(self.skeleton)}


def edge_entropy(alphas: torch.Tensor) -> float:
    """Mean over edges (rows) of the entropy in nats of softmax(row)."""
    logp = F.log_softmax(alphas.detach().double(), dim=-1)
    return float(-(logp.exp() * logp).sum(dim=-1).mean())


def derive_genotype(weights: torch.Tensor, ops: tuple[str, ...] | list[str], nodes: int) -> dict[str, Any]:
    """DARTS's discretisation of one cell from its softmax weights (edges, ops).

    Returns ``{"nodes": [[{"input", "op", "weight"} x 2] per intermediate node], "concat": [2..nodes+1]}``.
    Edge strength = its largest non-none weight; sort is stable, so ties keep the lower input index.
    """
    ops = list(ops)
    if weights.shape != (edge_count(nodes), len(ops)):
        raise ValueError(f"weights shape {tuple(weights.shape)} != ({edge_count(nodes)}, {len(ops)})")
    keep = [k for k, name in enumerate(ops) if name != "none"]
    gene, start = [], 0
    for i in range(nodes):
        rows = weights[start : start + 2 + i]
        best = [max(keep, key=lambda k, r=r: (float(r[k]), -k)) for r in rows]  # strongest non-none op per edge
        strength = [float(r[k]) for r, k in zip(rows, best)]
        chosen = sorted(range(2 + i), key=lambda j: -strength[j])[:EDGES_PER_NODE]
        gene.append([{"input": j, "op": ops[best[j]], "weight": round(strength[j], 6)} for j in chosen])
        start += 2 + i
    return {"nodes": gene, "concat": list(range(2, 2 + nodes))}


class DerivedNet(_Skeleton):
    """The fixed network of a genotype (no alphas), for retraining from scratch; same API as ``Supernet``."""

    def __init__(self, genotype: dict[str, Any], **overrides: int):
        skeleton = {**genotype["skeleton"], **overrides}
        kind = genotype["kind"]
        _check_kind(kind)
        gene = genotype["nodes"]
        if skeleton["nodes"] != len(gene):
            raise ValueError(f"genotype has {len(gene)} nodes; 'nodes' override {skeleton['nodes']} must match")
        for i, node in enumerate(gene):
            for e in node:
                if not 0 <= int(e["input"]) < 2 + i or e["op"] not in _OPS[kind][0] or e["op"] == "none":
                    raise ValueError(f"node {i}: invalid edge {e}")
        width = skeleton["width"]
        super().__init__(
            kind,
            skeleton["in_features"],
            skeleton["out_dim"],
            width,
            skeleton["cells"],
            skeleton["nodes"],
            skeleton["stem_multiplier"],
            lambda c_pp, c_p: DerivedCell(kind, c_pp, c_p, width, gene),
        )
        self.genotype_spec = copy.deepcopy(genotype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        s0 = s1 = self.stem(x)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return self._finish(s1)

    def arch_parameters(self) -> list[nn.Parameter]:
        return []

    def weight_parameters(self) -> list[nn.Parameter]:
        return list(self.parameters())


def supernet(kind: str, in_features: int, out_dim: int = 16, **kwargs: Any) -> Supernet:
    """``Supernet(kind, ...)``: ``in_features`` = input channels (conv) or feature count (mlp)."""
    return Supernet(kind, in_features, out_dim, **kwargs)


def build_derived(genotype: dict[str, Any], **overrides: int) -> DerivedNet:
    """The derived architecture of ``genotype`` with fresh weights; ``overrides`` may change the skeleton's
    ``width``, ``cells``, ``out_dim``, ``in_features`` or ``stem_multiplier`` (DARTS retrains wider/deeper)."""
    return DerivedNet(genotype, **overrides)


class HandDesigned(nn.Module):
    """The fixed baseline: a plain stack, no cells and no search.

    conv: [Conv3x3-BN-ReLU] x depth (first from ``in_features`` channels), global average pooling, Linear.
    mlp:  [Linear-ReLU] x depth (first from ``in_features``), Linear.
    """

    def __init__(self, kind: str, in_features: int, out_dim: int, width: int, depth: int = 3):
        super().__init__()
        _check_kind(kind)
        if min(in_features, out_dim, width, depth) < 1:
            raise ValueError("in_features, out_dim, width and depth must be >= 1")
        self.kind = kind
        self.config = {"kind": kind, "in_features": in_features, "out_dim": out_dim, "width": width, "depth": depth}
        layers: list[nn.Module] = []
        c = in_features
        for _ in range(depth):
            if kind == "conv":
                layers += [nn.Conv2d(c, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
            else:
                layers += [nn.Linear(c, width), nn.ReLU()]
            c = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.kind == "conv":
            h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.head(h)

    def arch_parameters(self) -> list[nn.Parameter]:
        return []

    def weight_parameters(self) -> list[nn.Parameter]:
        return list(self.parameters())


def hand_designed(
    kind: str,
    in_features: int,
    out_dim: int = 16,
    width: int | None = None,
    depth: int = 3,
    target_params: int | None = None,
) -> HandDesigned:
    """The baseline; give ``width`` or ``target_params`` (then the width whose parameter count is closest to the
    target, smaller width on ties, searched in 1..4096) so that it matches a derived network's size."""
    if (width is None) == (target_params is None):
        raise ValueError("give exactly one of width and target_params")
    if width is None:
        size = functools.partial(hand_designed_parameters, kind, in_features, out_dim, depth=depth)
        lo, hi = 1, 4096  # parameter count grows with width: binary search for the first width >= target
        while lo < hi:
            mid = (lo + hi) // 2
            if size(mid) < target_params:
                lo = mid + 1
            else:
                hi = mid
        width = min((w for w in (lo - 1, lo) if w >= 1), key=lambda w: (abs(size(w) - target_params), w))
    return HandDesigned(kind, in_features, out_dim, width, depth)


def hand_designed_parameters(kind: str, in_features: int, out_dim: int, width: int, depth: int = 3) -> int:
    """The baseline's parameter count at ``width``, from meta tensors: no weights allocated or initialised, so sizing
    the baseline neither costs a network per tried width (up to 2048 channels) nor draws from the random generator."""
    with torch.device("meta"):
        return count_parameters(HandDesigned(kind, in_features, out_dim, width, depth))


def count_parameters(module: nn.Module) -> int:
    """Trainable scalars of ``module`` (alphas included for a supernet)."""
    return sum(p.numel() for p in module.parameters())


def parameter_counts(**modules: nn.Module) -> dict[str, dict[str, int]]:
    """Per named module: total, weight and arch parameter counts, e.g. for a "similar size" table."""
    out = {}
    for name, module in modules.items():
        arch = sum(p.numel() for p in getattr(module, "arch_parameters", list)())
        total = count_parameters(module)
        out[name] = {"total": total, "weights": total - arch, "arch": arch}
    return out


_OP_COLOURS = {
    "skip_connect": "#4c72b0",
    "identity": "#4c72b0",
    "max_pool_3x3": "#dd8452",
    "avg_pool_3x3": "#55a868",
    "sep_conv_3x3": "#c44e52",
    "dil_conv_3x3": "#8172b3",
    "linear_relu": "#c44e52",
    "linear_tanh": "#8172b3",
    "bottleneck_relu": "#937860",
}


def draw_genotype(genotype: dict[str, Any], title: str, path: str | Path, dpi: int = 120) -> Path:
    """Draw a derived cell: inputs c_{k-2}, c_{k-1} (left), intermediate nodes, output c_{k} (right).

    Chosen edges are arrows labelled by their op; dashed grey arrows are the concatenation into the output.
    Matplotlib only (Agg canvas, no pyplot state, no graphviz); fixed dpi and no 'Software' metadata, so the
    same genotype gives the same PNG bytes.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    gene = genotype["nodes"]
    n = len(gene)
    pos = {0: (0.0, 1.4), 1: (0.0, -1.4)}
    for i in range(n):
        pos[2 + i] = (2.6 * (i + 1), 0.8 if i % 2 == 0 else -0.8)
    out_id = 2 + n
    pos[out_id] = (2.6 * (n + 1), 0.0)
    names = {0: "c_{k-2}", 1: "c_{k-1}", out_id: "c_{k}", **{2 + i: str(i) for i in range(n)}}

    fig = Figure(figsize=(2.0 + 1.9 * (n + 1), 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.02, 0.02, 0.96, 0.86))
    ax.set_xlim(-0.9, pos[out_id][0] + 0.9)
    ax.set_ylim(-2.2, 2.2)
    ax.set_aspect("equal")
    ax.axis("off")

    def arrow(src: int, dst: int, colour: str, style: str, rad: float, label: str | None) -> None:
        (x1, y1), (x2, y2) = pos[src], pos[dst]
        ax.annotate(
            "",
            xy=(x2, y2),
            xytext=(x1, y1),
            arrowprops={
                "arrowstyle": "-|>",
                "color": colour,
                "linestyle": style,
                "lw": 1.3,
                "shrinkA": 16,
                "shrinkB": 16,
                "connectionstyle": f"arc3,rad={rad}",
            },
        )
        if label:
            # midpoint of matplotlib's arc3 quadratic Bezier (aspect is equal, so data units work)
            mx, my = (x1 + x2) / 2 + rad * (y2 - y1) / 2, (y1 + y2) / 2 - rad * (x2 - x1) / 2
            ax.text(
                mx,
                my,
                label,
                fontsize=7,
                ha="center",
                va="center",
                color=colour,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.9},
            )

    for i, node in enumerate(gene):
        for e in node:
            src = int(e["input"])
            rad = 0.0 if pos[src][0] + 2.7 > pos[2 + i][0] else (0.18 if src % 2 == 0 else -0.18)
            arrow(src, 2 + i, _OP_COLOURS.get(e["op"], "#333333"), "solid", rad, e["op"])
    for node_id in genotype.get("concat", range(2, 2 + n)):
        arrow(int(node_id), out_id, "#999999", "dashed", 0.0, None)
    for node_id, (x, y) in pos.items():
        colour = "#a1c9f4" if node_id in (0, 1) else "#ffb482" if node_id == out_id else "#d0d0d0"
        ax.text(
            x,
            y,
            names[node_id],
            ha="center",
            va="center",
            fontsize=9,
            bbox={"boxstyle": "round,pad=0.35", "fc": colour, "ec": "#333333"},
        )
    fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    return path
