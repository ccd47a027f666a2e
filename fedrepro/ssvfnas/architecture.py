"""What SS-VFNAS's searches found: did alpha move (``alpha_table``, ``alpha_moved``), the derived cells
(``genotypes_table``, ``shown_cells``), and how far the two search rules agree on matched cells (``rule_agreement``,
``matched_pairs``, the paper's pairs). It reads the search's alpha summary and genotypes, which no accuracy or cost
table does, so it stands apart from ``tables``."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.ssvfnas.cells import METHODS, Cell, dp_name
from fedrepro.ssvfnas.results import SSVFNASResults, partition_names
from fedrepro.ssvfnas.selection import method_label, select_cells


RULES = {"darts": "DARTS bi-level", "milenas": "MiLeNAS mixed-level"}
PAIRS = (("ss_vfnas1", "vfnas1"), ("ss_vfnas2", "vfnas2"))
"""(with pre-search, without): the paper's comparisons, one per search rule"""
ALPHA_MOVED = 0.01
"""alpha 'moved' when the search lowered the entropy of softmax(alpha) by more than this share of the uniform
entropy."""


def kept_edges(genotype: dict) -> list[list[tuple[int, str]]]:
    return [sorted((int(e["input"]), e["op"]) for e in node) for node in genotype["nodes"]]


def alpha_moved(frame: pd.DataFrame) -> pd.Series:
    """Per search cell: did the entropy of softmax(α) fall by more than ALPHA_MOVED of the uniform value?"""
    return frame["alpha_entropy_start"] - frame["alpha_entropy_end"] > ALPHA_MOVED * frame["alpha_entropy_uniform"]


def alpha_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """Per method: did the search move alpha? The entropy of softmax(alpha) (mean over edges and parties, nats) at the
    search's start and end beside the uniform value, the largest |alpha - alpha_start|, the cells in which the entropy
    fell by more than ``ALPHA_MOVED`` of the uniform value, the derived edges on parameter-free ops, and the cells whose
    derived genotype is the one their starting alphas alone give."""
    rows = []
    for method in params.ssvfnas.methods:
        sel = select_cells(data, method=method)
        if sel.empty:
            continue
        drop = sel["alpha_entropy_start"] - sel["alpha_entropy_end"]
        moved = int((drop > ALPHA_MOVED * sel["alpha_entropy_uniform"]).sum())
        row = {
            "method": method_label(method),
            "cells": len(sel),
            "entropy uniform": f"{sel['alpha_entropy_uniform'].mean():.4f}",
            "entropy at search start": f"{sel['alpha_entropy_start'].mean():.4f}",
            "entropy at end": f"{sel['alpha_entropy_end'].mean():.4f}",
            "α shift, max / mean over cells": (
                f"{sel['alpha_max_shift'].max():.4f} / {sel['alpha_max_shift'].mean():.4f}"
            ),
            "α moved (cells)": f"{moved} of {len(sel)}",
            "derived edges on parameter-free ops": f"{100 * sel['alpha_parameter_free_edges'].mean():.0f}%",
            "genotype = the starting α's (cells)": f"{int(sel['alpha_genotype_as_at_start'].sum())} of {len(sel)}",
        }
        if METHODS[method][1]:
            row["pre-search α shift (max)"] = f"{sel['alpha_max_shift_presearch'].max():.4f}"
        rows.append(row)
    return pd.DataFrame(rows).fillna("-")


def matched_pairs(
    data: SSVFNASResults, ours: str, theirs: str, levels: list[list[float]]
) -> list[tuple[pd.Series, pd.Series]]:
    """Matched (ours, theirs) cells: the same dataset-K, DP level and seed."""
    out = []
    index = data.cells.set_index("key", drop=False)
    for _, a in data.cells[data.cells.method == ours].iterrows():
        if [a.sigma_forward, a.sigma_backward] not in [list(map(float, lvl)) for lvl in levels]:
            continue
        name = Cell(theirs, a.dataset, a.parties, a.sigma_forward, a.sigma_backward, a.seed).name
        if name in index.index:
            out.append((a, index.loc[name]))
    return out


def rule_agreement(data: SSVFNASResults, params: Params) -> list[dict]:
    """For each pre-search choice, VFNAS-1 (DARTS) against VFNAS-2 (MiLeNAS) on matched cells (same dataset-K, DP level,
    seed): the mean and largest |difference| of the supernets' test accuracy over the curve points, and the cells whose
    derived genotypes (every party's) are identical."""
    out = []
    for one, two in (("vfnas1", "vfnas2"), ("ss_vfnas1", "ss_vfnas2")):
        if not {one, two} <= set(params.ssvfnas.methods):
            continue
        pairs = matched_pairs(data, one, two, params.ssvfnas.dp_levels)
        gaps, same = [], 0
        for a, b in pairs:
            ca = data.curves[data.curves.key == a.key].set_index("step")["test_accuracy"]
            cb = data.curves[data.curves.key == b.key].set_index("step")["test_accuracy"]
            gaps += (ca - cb).abs().dropna().tolist()
            same += [kept_edges(g) for g in data.genotypes[a.key]] == [kept_edges(g) for g in data.genotypes[b.key]]
        if pairs:
            out.append(
                {
                    "pair": (one, two),
                    "pairs": len(pairs),
                    "mean_gap": float(np.mean(gaps)),
                    "max_gap": float(np.max(gaps)),
                    "same_genotypes": same,
                }
            )
    return out


def genotype_text(genotype: dict) -> str:
    """node i: op(input), op(input); ... with DARTS's numbering (0, 1 = the cell inputs)."""
    return "; ".join(
        f"{i}: " + ", ".join(f"{e['op']}({e['input']})" for e in node) for i, node in enumerate(genotype["nodes"])
    )


def shown_cells(data: SSVFNASResults, params: Params) -> list[str]:
    """The cells whose searched genotypes the report draws: every method x dataset-K at the first DP level, first
    seed."""
    ss, keys = params.ssvfnas, []
    for point in partition_names(params):
        for method in ss.methods:
            sel = select_cells(data, partition=point, method=method, dp=dp_name(ss.dp_levels[0]), seed=ss.seeds[0])
            keys += sel["key"].tolist()
    return keys


def genotypes_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    rows = []
    for key in shown_cells(data, params):
        row = data.cells.set_index("key").loc[key]
        part = data.partitions[row.partition]
        for j, genotype in enumerate(data.genotypes[key]):
            rows.append(
                {
                    "dataset-K": row.partition,
                    "method": method_label(row.method),
                    "party": f"party_{j}" + (" (labels)" if j == part["label_party"] else ""),
                    "space": genotype["kind"],
                    "derived cell (node: op(input), ...)": genotype_text(genotype),
                }
            )
    return pd.DataFrame(rows)
