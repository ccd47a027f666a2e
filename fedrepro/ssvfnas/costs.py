"""What SS-VFNAS's cells cost at a given scale (``SSVFNASCosts``; ``plan --scale paper`` of
``scripts/cpu_snapshot.py`` prints it), counted by the conventions and rules of ``fedrepro.costs``. SS-VFNAS's unit
is one aligned sample (a row of every party), counted as one token. Its conv and MLP networks are small and built on
the CPU: their FLOPs counted from their weights (``weight_flops``), their activations the bytes autograd saves per
sample (``saved_bytes``), times the batch.

No GPU estimate for placing a stage's cells: the networks are built from the data, so the stage places one cell a
GPU (they are small, and ``plan --scale paper`` sizes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedrepro.costs import ADAM_MOMENTS, FP32, CellCost, Memory, cap, saved_bytes, weight_flops


@dataclass(frozen=True)
class VerticalSet:
    """One (dataset, K) partition's shape: aligned rows, classes, the label party, and each party's input: (C, H, W)
    for an image view (the conv space), (features,) for a table (the MLP space)."""

    rows: int
    classes: int
    label_party: int
    inputs: list[tuple[int, ...]]


def vertical_set(params, dataset: str, k: int, mirror: Path) -> VerticalSet:
    """The digits (scikit-learn's bundled copy) or a FATE set read from the mirror with the pipeline's loaders."""
    from fedrepro.data.vertical import DIGITS, digits_halves, digits_quarters, load_fate
    from fedrepro.errors import DataError

    if dataset == DIGITS:
        data = {2: digits_halves, 4: digits_quarters}[k]()
    elif (Path(mirror) / "fate_vfl").is_dir():
        data = load_fate(Path(mirror) / "fate_vfl", dataset, params.data.vertical_sets.get(dataset))
    else:
        raise DataError(
            f"costs: the FATE set {dataset!r} is not in the mirror {mirror} (fate_vfl/): its sizes are counted there"
        )
    inputs = [
        shape if shape is not None else (frame.shape[1] - 1,)
        for frame, shape in zip(data.parties, data.shapes or [None] * len(data.parties))
    ]
    return VerticalSet(len(data.labels), len(np.unique(data.labels)), data.label_party, inputs)


SEARCH_PASSES = {("darts", False): 2, ("darts", True): 5, ("milenas", False): 2}
"""Batches a search step computes (forward and backward), by (rule, second order) (``fedrepro.vfl.search``): DARTS
first order a validation then a train pass; second order the virtual train step, the validation pass, the two
finite-difference train passes and the train pass; MiLeNAS one pass over the train and validation batches together."""
PROBE_BATCH = 2
"""Samples a network's saved bytes are measured on (then divided by it): BatchNorm in training mode wants two."""


class SSVFNASCosts:
    """Every SS-VFNAS cell's cost at ``params``' scale. Its networks train in fp32 (``ssvfnas`` has no precision knob).
    A search cell: the MoCo v2 pre-search (ss_ methods), the collaborative search of every party's supernet, and the
    retraining of the derived networks, whose size before a search is the expectation ``reference_parameters`` takes
    (each kept edge's op uniform over the non-none ops; FLOPs averaged the same way); the baseline retrains the
    hand-designed networks sized to it, the label party alone its own network."""

    precision = "fp32"

    def __init__(self, params, sets: dict[tuple[str, int], VerticalSet], source: str) -> None:
        self.params, self.sets = params, sets
        self._networks: dict[tuple, dict[str, Any]] = {}
        self.notes = [
            "vertical sets: "
            + "; ".join(f"{d} K={k} {s.rows:,} rows" for (d, k), s in sets.items())
            + f" ({source}); one sample = one token"
        ]

    @classmethod
    def from_mirror(cls, params, mirror: Path) -> "SSVFNASCosts":
        """The grid's (dataset, K) partitions: the digits from scikit-learn's copy, the FATE sets from the mirror."""
        from fedrepro.ssvfnas.cells import partitions

        sets = {(dataset, k): vertical_set(params, dataset, k, mirror) for dataset, k, _ in partitions(params)}
        return cls(params, sets, f"digits: scikit-learn's copy; FATE sets counted from {mirror}")

    def splits(self, data: VerticalSet) -> dict[str, int]:
        """Rows of each split as ``ssvfnas_partition`` and ``hold_out`` cut them (fractions of the capped rows)."""
        split = self.params.ssvfnas.split
        rows = cap(data.rows, split.max_samples)
        test = round(rows * split.test_fraction)
        valid = round((rows - test) * split.valid_fraction)
        held_out = round((rows - test - valid) * self.params.ssvfnas.retrain.held_out_fraction)
        return {"train": rows - test - valid - held_out, "valid": valid, "held_out": held_out, "test": test}

    def networks(self, dataset: str, k: int) -> dict[str, Any]:
        """Per party: the supernet, the expected derived network and the hand-designed one, with their forward FLOPs
        per sample, parameters and the bytes a forward of one sample saves; and the two tops' parameters."""
        from fedrepro.ssvfnas.phases import reference_parameters, retrain_overrides, uniform_genotype
        from fedrepro.vfl.spaces import CONV_OPS, MLP_OPS, build_derived, hand_designed, supernet

        if (dataset, k) not in self._networks:
            ss, data = self.params.ssvfnas, self.sets[(dataset, k)]
            s, overrides = ss.search, retrain_overrides(self.params)
            parties = []
            with (
                torch.random.fork_rng()
            ):  # small networks, built on the CPU; the caller's random state is left as it was
                for shape in data.inputs:
                    kind = "conv" if len(shape) == 3 else "mlp"
                    skeleton = {
                        "in_features": shape[0],
                        "out_dim": s.out_dim,
                        "width": s.width,
                        "cells": s.cells,
                        "nodes": s.nodes,
                        "stem_multiplier": 1,
                    }
                    batch = torch.zeros(PROBE_BATCH, *shape)
                    search = supernet(kind, shape[0], s.out_dim, width=s.width, cells=s.cells, nodes=s.nodes)
                    ops = [o for o in (CONV_OPS if kind == "conv" else MLP_OPS) if o != "none"]
                    derived = [build_derived(uniform_genotype(kind, s.nodes, o, skeleton), **overrides) for o in ops]
                    target = reference_parameters(kind, skeleton, overrides)
                    baseline = hand_designed(
                        kind, shape[0], s.out_dim, depth=ss.retrain.baseline_depth, target_params=target
                    )
                    positions = shape[1] * shape[2] if kind == "conv" else 1
                    parties.append(
                        {
                            "supernet": network(search, batch, positions),
                            "alphas": sum(p.numel() for p in search.arch_parameters()),
                            "derived": {
                                "flops": float(np.mean([weight_flops(d, positions) for d in derived])),
                                "parameters": target,
                                "saved": max(saved_bytes(lambda d=d: d(batch)) for d in derived) // PROBE_BATCH,
                            },
                            "baseline": network(baseline, batch, positions),
                        }
                    )
            self._networks[(dataset, k)] = {
                "parties": parties,
                "top": k * s.out_dim * data.classes + data.classes,
                "top_alone": s.out_dim * data.classes + data.classes,
            }
        return self._networks[(dataset, k)]

    def __call__(self, cell) -> CellCost:
        ss, data = self.params.ssvfnas, self.sets[(cell.dataset, cell.parties)]
        nets, rows = self.networks(cell.dataset, cell.parties), self.splits(data)
        parties, training_rows = nets["parties"], rows["train"] + rows["valid"]
        if cell.label_alone:
            bottoms, top = [parties[data.label_party]["baseline"]], nets["top_alone"]
        else:
            bottoms, top = [p["baseline" if cell.baseline else "derived"] for p in parties], nets["top"]
        retrain_forward = sum(b["flops"] for b in bottoms) + 2 * top
        retrain_batch = min(ss.retrain.batch_size, training_rows)
        tokens = {"retrain": ss.retrain.steps * retrain_batch}
        train_flops = 3 * tokens["retrain"] * retrain_forward
        scored = points(ss.retrain.steps, ss.retrain.eval_every) * rows["held_out"] + rows["test"]
        eval_flops = scored * retrain_forward
        # memory: the largest networks a phase trains (the supernets of a search, else the retrained networks)
        weights, alphas, extra = sum(b["parameters"] for b in bottoms) + top, 0, 0
        saved = sum(b["saved"] for b in bottoms) * retrain_batch
        if cell.rule is not None:
            search_forward = sum(p["supernet"]["flops"] for p in parties) + 2 * top
            search_batch = min(ss.search.batch_size, rows["train"], rows["valid"])
            passes = SEARCH_PASSES[(cell.rule, ss.search.second_order and cell.rule == "darts")]
            tokens["search"] = ss.search.steps * passes * search_batch
            train_flops += 3 * tokens["search"] * search_forward
            search_scored = points(ss.search.steps, ss.search.eval_every) * rows["test"]
            scored, eval_flops = scored + search_scored, eval_flops + search_scored * search_forward
            weights, alphas = sum(p["supernet"]["parameters"] for p in parties) + top, sum(p["alphas"] for p in parties)
            saved = max(saved, sum(p["supernet"]["saved"] for p in parties) * search_batch)
        if cell.presearch:
            m = ss.moco
            moco_batch = min(m.batch_size, training_rows)
            tokens["moco"] = m.steps * moco_batch
            # per party and sample: the query encoder's step (3 forwards), the key encoder's forward, and the logits
            # against the queue ((queue + 1) x projection products, trained); the projection heads are left out
            supernets = sum(p["supernet"]["flops"] for p in parties)
            train_flops += tokens["moco"] * (
                4 * supernets + len(parties) * 3 * 2 * (m.queue_size + 1) * m.projection_dim
            )
            extra = sum(p["supernet"]["parameters"] for p in parties) + len(parties) * m.queue_size * m.projection_dim
            saved = max(saved, sum(p["supernet"]["saved"] for p in parties) * moco_batch)
        # SGD with momentum on the weights (one buffer), Adam on the alphas (two moments); MoCo's key encoders
        # and queues
        memory = Memory(
            FP32 * (weights + extra), FP32 * weights, FP32 * (weights - alphas + ADAM_MOMENTS * alphas), saved, 0
        )
        return CellCost(cell.name, cell.name, weights, weights, tokens, scored, train_flops, eval_flops, memory)


def network(module: nn.Module, batch: torch.Tensor, positions: int) -> dict[str, float]:
    """A network's forward FLOPs and saved bytes per sample and its parameters (the bytes from a forward on
    ``batch``)."""
    return {
        "flops": weight_flops(module, positions),
        "parameters": sum(p.numel() for p in module.parameters()),
        "saved": saved_bytes(lambda: module(batch)) // len(batch),
    }


def points(steps: int, every: int) -> int:
    """Evaluations of ``run_steps``: every ``every`` steps and at the last."""
    return steps // every + (steps % every != 0)
