"""SS-VFNAS's report stage's files beside the markdown: results.csv (``results_frame``), metrics.json
(``summary_metrics``) and the figures with their `dvc plots` CSVs (``write_figures``: accuracy vs bytes and vs
epsilon, messages per step, the searched cells).

The stage reads the cells with ``results.load_ssvfnas``; the tables are ``tables``'s and ``architecture``'s, the
claims ``claims``'s, and ``render.render_report`` writes the markdown. Nothing here or in those modules reads a clock
or an unseeded random source, so a rerun on the same cells gives the same bytes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from fedrepro.config import Params
from fedrepro.report.figures import accuracy_bytes_figure, accuracy_epsilon_figure, curve_caption, messages_figure
from fedrepro.ssvfnas.architecture import shown_cells
from fedrepro.ssvfnas.cells import BASELINE, dp_name
from fedrepro.ssvfnas.results import SSVFNASResults, partition_names
from fedrepro.ssvfnas.selection import (
    ALONE,
    MAJORITY,
    dp_level_text,
    label_alone_accuracy,
    method_label,
    noisy_levels,
    select_cells,
)
from fedrepro.ssvfnas.tables import target_frame


def results_frame(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """results.csv: one row per cell, its fields, accuracy, steps, messages, bytes, epsilon, parameters, target."""
    targets = target_frame(data, params)
    frame = data.cells.merge(targets, on="key", how="left")
    return frame.rename(columns={"key": "cell"})


def summary_metrics(data: SSVFNASResults, params: Params) -> dict:
    """metrics.json for `dvc exp show`: mean retrained test accuracy over every cell of each method (and the baseline),
    and per DP level with noise and dataset-K the search cells' mean total epsilon: the headline without amplification
    and the paper's Poisson-amplified figure beside it."""
    epsilon: dict = {"headline": "no_amplification", "no_amplification": {}, "amplified_poisson_assumed": {}}
    search = data.cells[data.cells.method != BASELINE]
    for level in noisy_levels(params):
        for point in partition_names(params):
            sel = search[(search.dp == dp_name(level)) & (search.partition == point)]
            if sel.empty or sel["epsilon_total"].isna().any():
                continue
            for key, column in (
                ("no_amplification", "epsilon_total"),
                ("amplified_poisson_assumed", "epsilon_total_amplified"),
            ):
                epsilon[key].setdefault(dp_name(level), {})[point] = round(float(sel[column].mean()), 4)
    return {
        "accuracy": {
            m: round(float(select_cells(data, method=m)["accuracy"].mean()), 4)
            for m in list(params.ssvfnas.methods) + [BASELINE]
        },
        "epsilon_total": epsilon,
    }


def _curve(data: SSVFNASResults, **fields) -> pd.DataFrame:
    """Seed-mean curve (step, bytes, messages, accuracy and its std over seeds, epsilon) of the selected search
    cells."""
    keys = select_cells(data, **fields)["key"]
    frame = data.curves[data.curves.key.isin(keys)]
    if frame.empty:
        return pd.DataFrame(columns=["step", "bytes", "messages", "accuracy", "accuracy_std", "epsilon"])
    return (
        frame.groupby("step")
        .agg(
            bytes=("bytes", "mean"),
            messages=("messages", "mean"),
            accuracy=("test_accuracy", "mean"),
            accuracy_std=("test_accuracy", "std"),
            epsilon=("epsilon", "mean"),
        )
        .reset_index()
    )


def figure_point(params: Params) -> str:
    """The dataset-K of the dvc plots CSVs: the first partition of the grid."""
    return partition_names(params)[0]


def trivial_references(data: SSVFNASResults, params: Params, point: str) -> dict[str, float | None]:
    """The trivial rows' mean test accuracies of a partition, the accuracy figures' reference lines: the majority class
    and the label party alone, in that order (each keeps its line style), None where one is missing (no partition data;
    the label-alone cells not run for every seed)."""
    alone = label_alone_accuracy(data, params, point)
    return {MAJORITY: data.majority.get(point), ALONE: None if alone is None else float(alone["accuracy"].mean())}


def write_figures(data: SSVFNASResults, params: Params, folder: Path) -> None:
    """PNGs and, for `dvc plots`, CSVs: accuracy vs bytes per dataset-K, accuracy vs epsilon, messages per step, the
    searched cells (copied from the cells)."""
    folder, ss = Path(folder), params.ssvfnas
    for point in partition_names(params):
        panels = {
            dp_level_text(lvl): {
                method_label(m): _curve(data, partition=point, dp=dp_name(lvl), method=m) for m in ss.methods
            }
            for lvl in ss.dp_levels
        }
        references = trivial_references(data, params, point)
        accuracy_bytes_figure(
            panels,
            f"{point}: supernets' test accuracy vs MB exchanged ({curve_caption(len(ss.seeds))})",
            folder / f"accuracy_vs_bytes_{point}.png",
            ss.target_accuracy,
            references,
        )
        points, unbounded = {}, {}
        for method in list(ss.methods) + [BASELINE]:
            rows = []
            for lvl in noisy_levels(params):
                sel = select_cells(data, partition=point, dp=dp_name(lvl), method=method)
                if not sel.empty and sel["epsilon_total"].notna().all():
                    rows.append(
                        {
                            "epsilon": sel["epsilon_total"].mean(),
                            "accuracy": sel["accuracy"].mean(),
                            "accuracy_std": sel["accuracy"].std(),
                        }
                    )
            frame = pd.DataFrame(rows, columns=["epsilon", "accuracy", "accuracy_std"])
            points[method_label(method)] = frame.sort_values("epsilon")
            clear = select_cells(data, partition=point, dp="nodp", method=method)
            if not clear.empty:
                unbounded[method_label(method)] = float(clear["accuracy"].mean())
        curves = {}
        for lvl in noisy_levels(params):
            for method in ss.methods:
                name = method_label(method) + (f" ({dp_level_text(lvl)})" if len(noisy_levels(params)) > 1 else "")
                curve = _curve(data, partition=point, dp=dp_name(lvl), method=method)
                curves[name] = curve[["epsilon", "accuracy", "accuracy_std"]]
        title = f"{point}: test accuracy vs epsilon (δ = {ss.dp.delta:g}; {curve_caption(len(ss.seeds))})"
        accuracy_epsilon_figure(
            points, unbounded, curves, title, folder / f"accuracy_vs_epsilon_{point}.png", references
        )
    point = figure_point(params)
    for method in ss.methods:
        _curve(data, partition=point, dp=dp_name(ss.dp_levels[0]), method=method).rename(
            columns={"accuracy": "test_accuracy"}
        ).to_csv(folder / f"accuracy_vs_bytes_{method}.csv", index=False, float_format="%.6g")
        rows = []
        for lvl in noisy_levels(params):
            sel = select_cells(data, partition=point, dp=dp_name(lvl), method=method)
            if not sel.empty and sel["epsilon_total"].notna().all():
                rows.append(
                    {
                        "dp": dp_name(lvl),
                        "epsilon": sel["epsilon_total"].mean(),
                        "test_accuracy": sel["accuracy"].mean(),
                    }
                )
        pd.DataFrame(rows, columns=["dp", "epsilon", "test_accuracy"]).to_csv(
            folder / f"accuracy_vs_epsilon_{method}.csv", index=False, float_format="%.6g"
        )
    counts = {}
    for method in ss.methods:
        for k in sorted(set(data.cells.parties)):
            sel = select_cells(data, method=method, parties=k)
            if not sel.empty:
                counts.setdefault(method_label(method), {})[f"messages K={k}"] = sel.messages_per_step.iloc[0]
                counts[method_label(method)][f"exchanges K={k}"] = sel.exchanges_per_step.iloc[0]
    table = pd.DataFrame.from_dict(counts, orient="index")
    messages_figure(
        table,
        "Messages and sequential exchanges per collaborative step (channel counts)",
        folder / "messages_per_step.png",
    )
    table.index.name = "method"
    table.reset_index().to_csv(folder / "messages_per_step.csv", index=False)
    for key in shown_cells(data, params):
        source = data.folders[key] / "cells"
        if source.is_dir():
            shutil.copytree(source, folder / "cells" / key)
