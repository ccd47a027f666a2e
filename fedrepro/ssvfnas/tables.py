"""SS-VFNAS's accuracy and cost tables, each a frame for ``render`` to write: the main table with its trivial rows, the
target table (and ``target_frame``, which results.csv and the claims share), messages per step, parameters, the
reliance on the other parties, the partitions and the cells the health rule flags. The searched architectures have
their own module (``architecture``); the markdown around the tables is ``render``'s."""

from __future__ import annotations

import math

import pandas as pd

from fedrepro.config import Params
from fedrepro.metrics.summary import mean_std
from fedrepro.report.health import flagged_cells, mark_of
from fedrepro.ssvfnas.cells import BASELINE, METHODS, dp_name
from fedrepro.ssvfnas.results import SSVFNASResults, partition_names
from fedrepro.ssvfnas.selection import (
    ALONE,
    MAJORITY,
    dp_level_text,
    label_alone_accuracy,
    megabytes,
    method_label,
    percent,
    select_cells,
)


def _fmt(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    mean, std = mean_std(values)
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if len(values) > 1 else f"{100 * mean:.2f}"


def _eps(values: list[float], status: str) -> str:
    """Epsilon of a group of cells: 'inf' without noise, 'n/a' for the released-code mechanism."""
    if status.startswith("unbounded"):
        return "∞"
    if status.startswith("not accountable"):
        return "n/a"
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    mean, std = mean_std(values)
    return f"{mean:.2f}" + (f" ± {std:.2f}" if std > 0 else "")


def to_target(curve: pd.DataFrame, target: float) -> dict | None:
    """The first curve point whose test accuracy reaches ``target``: its step, bytes, messages, epsilon."""
    reached = curve[curve["test_accuracy"] >= target].sort_values("step")
    if reached.empty:
        return None
    row = reached.iloc[0]
    return {
        "step": int(row["step"]),
        "bytes": int(row["bytes"]),
        "messages": int(row["messages"]),
        "epsilon": float(row["epsilon"]),
    }


def target_frame(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """One row per search cell: whether its search reached the target and at which step, bytes and epsilon."""
    target, rows = params.ssvfnas.target_accuracy, []
    for _, row in data.cells[data.cells.method != BASELINE].iterrows():
        hit = to_target(data.curves[data.curves.key == row.key], target)
        rows.append(
            {
                "key": row.key,
                "reached": hit is not None,
                **{f"target_{k}": (hit or {}).get(k, float("nan")) for k in ("step", "bytes", "messages", "epsilon")},
            }
        )
    return pd.DataFrame(
        rows, columns=["key", "reached", "target_step", "target_bytes", "target_messages", "target_epsilon"]
    )


def main_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """Per (dataset-K, DP level, method incl. the baseline): retrained test accuracy (mean ± std over seeds; † if a cell
    diverged, ° if one had not converged), its last held-out validation accuracy, the search supernets' last test
    accuracy, collaborative steps, messages, MB of the search and of the retraining, and epsilon (worst party) of the
    search and in total; after each dataset-K its trivial rows (``trivial_rows``)."""
    ss, rows = params.ssvfnas, []
    for point in partition_names(params):
        for level in ss.dp_levels:
            for method in list(ss.methods) + [BASELINE]:
                sel = select_cells(data, partition=point, dp=dp_name(level), method=method)
                if sel.empty:
                    continue
                search = method != BASELINE
                status = sel["epsilon_status"].iloc[0]
                rows.append(
                    {
                        "dataset-K": point,
                        "DP": dp_level_text(level),
                        "method": method_label(method),
                        "test accuracy (%)": _fmt(sel["accuracy"].tolist()) + mark_of(sel["health"]),
                        "held-out valid accuracy (%)": _fmt(sel["valid_accuracy"].tolist()),
                        "supernet accuracy (%)": _fmt(sel["search_accuracy"].tolist()) if search else "-",
                        "collaborative steps": f"{int(sel['steps'].mean())} + {int(sel['retrain_steps'].mean())}"
                        if search
                        else f"0 + {int(sel['retrain_steps'].mean())}",
                        "messages": f"{int(sel['messages'].mean()):,} + {int(sel['retrain_messages'].mean()):,}",
                        "MB search": megabytes(sel["bytes"].mean()) if search else "-",
                        "MB retrain": megabytes(sel["retrain_bytes"].mean()),
                        "ε search": _eps(sel["epsilon_search"].tolist(), status) if search else "-",
                        "ε total": _eps(sel["epsilon_total"].tolist(), status),
                        "ε total, amplified (Poisson assumed)": _eps(sel["epsilon_total_amplified"].tolist(), status),
                    }
                )
        rows += trivial_rows(data, params, point)
    return pd.DataFrame(rows)


def trivial_rows(data: SSVFNASResults, params: Params, point: str) -> list[dict]:
    """A partition's two trivial rows, which send nothing (so no DP level and no ε): the majority class and the label
    party alone; a row whose inputs are missing says so."""
    majority, alone = data.majority.get(point), label_alone_accuracy(data, params, point)
    accuracies = {
        MAJORITY: ("not computed (no partition data)" if majority is None else percent(majority), "-"),
        ALONE: (
            "not run" if alone is None else _fmt(alone["accuracy"].tolist()) + mark_of(alone["health"]),
            "-" if alone is None else _fmt(alone["valid_accuracy"].tolist()),
        ),
    }
    return [
        {
            "dataset-K": point,
            "DP": "nothing sent",
            "method": name,
            "test accuracy (%)": test,
            "held-out valid accuracy (%)": valid,
            "supernet accuracy (%)": "-",
            "collaborative steps": "-",
            "messages": "0",
            "MB search": "-",
            "MB retrain": "-",
            "ε search": "-",
            "ε total": "-",
            "ε total, amplified (Poisson assumed)": "-",
        }
        for name, (test, valid) in accuracies.items()
    ]


def health_table(data: SSVFNASResults) -> pd.DataFrame:
    """Every cell (the label party alone's too) whose retraining diverged or had not converged, once, with the rule's
    reason."""
    return flagged_cells(pd.concat([data.cells, data.label_alone]).rename(columns={"key": "name"}))


def target_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """Per (dataset-K, DP level, method): seeds whose search reached the target accuracy, and the mean steps, MB and
    epsilon at the first curve point that did (over those seeds)."""
    ss = params.ssvfnas
    reached = target_frame(data, params).set_index("key")
    rows = []
    for point in partition_names(params):
        for level in ss.dp_levels:
            for method in ss.methods:
                sel = select_cells(data, partition=point, dp=dp_name(level), method=method)
                hits = reached.loc[sel["key"]]
                ok = hits[hits["reached"]]
                status = sel["epsilon_status"].iloc[0] if not sel.empty else ""
                rows.append(
                    {
                        "dataset-K": point,
                        "DP": dp_level_text(level),
                        "method": method_label(method),
                        "seeds reached": f"{len(ok)} of {len(hits)}",
                        "steps": f"{ok['target_step'].mean():.1f}" if len(ok) else f"not in {ss.search.steps}",
                        "MB": megabytes(ok["target_bytes"].mean()) if len(ok) else "-",
                        "ε at target": _eps(ok["target_epsilon"].tolist(), status) if len(ok) else "-",
                    }
                )
    return pd.DataFrame(rows)


def messages_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """Per method and K: messages, sequential exchanges and bytes of one collaborative step, counted by the channel
    (one search cell each), beside the counts the rules imply."""
    ss, rows = params.ssvfnas, {}
    for method in ss.methods:
        rule, _ = METHODS[method]
        for k in sorted({c for c in data.cells.parties}):
            sel = select_cells(data, method=method, parties=k)
            if sel.empty:
                continue
            first = sel.iloc[0]
            s = k - 1
            if rule == "darts":
                expected = (12 if ss.search.second_order else 4) * s
            else:
                expected = (2 if ss.fidelity == "paper" else 4) * s
            rows.setdefault(method_label(method), {})[f"K={k}"] = (
                f"{int(first.messages_per_step)} msgs ({expected} expected), {int(first.exchanges_per_step)} "
                f"exchanges, {int(first.bytes_per_step):,} B"
            )
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "method"
    return frame


def parameters_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """Per dataset-K: bottom networks' parameters (summed over parties) of the supernets, the derived networks (mean
    over a method's cells) and the hand-designed baseline, and the reference size the baseline was matched to."""
    rows = {}
    for point in partition_names(params):
        row = {}
        search = select_cells(data, partition=point)
        search = search[search.method != BASELINE]
        if not search.empty:
            row["supernets"] = f"{int(search['params_supernet'].iloc[0]):,}"
        for method in params.ssvfnas.methods:
            sel = select_cells(data, partition=point, method=method)
            if not sel.empty:
                low, high = int(sel["params_bottom"].min()), int(sel["params_bottom"].max())
                row[f"derived, {method_label(method)}"] = f"{low:,}" if low == high else f"{low:,} - {high:,}"
        base = select_cells(data, partition=point, method=BASELINE)
        if not base.empty:
            row["expected derived size (baseline sized to)"] = f"{int(base['params_target'].iloc[0]):,}"
            row["hand-designed"] = f"{int(base['params_bottom'].iloc[0]):,}"
            row["top network"] = f"{int(base['params_top'].iloc[0]):,}"
        rows[point] = row
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "dataset-K"
    return frame


def reliance_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """Per dataset-K and DP level, over every method's cells and the baseline's: the retrained test accuracy, the label
    party's accuracy with every other party's embedding zeroed, and the top network's weight share on the other
    parties."""
    rows = []
    for point in partition_names(params):
        for level in params.ssvfnas.dp_levels:
            sel = select_cells(data, partition=point, dp=dp_name(level))
            if sel.empty:
                continue
            rows.append(
                {
                    "dataset-K": point,
                    "DP": dp_level_text(level),
                    "cells": len(sel),
                    "test accuracy (%)": _fmt(sel["accuracy"].tolist()),
                    "label party alone (%)": _fmt(sel["label_only_accuracy"].tolist()),
                    "top weight share on the other parties": f"{sel['top_share_others'].mean():.2f}",
                    "test rows (1 error =)": (
                        f"{int(sel['test_samples'].iloc[0])} ({100 / sel['test_samples'].iloc[0]:.2f} points)"
                    ),
                }
            )
    return pd.DataFrame(rows)


def partitions_table(data: SSVFNASResults) -> pd.DataFrame:
    held_out = data.cells.groupby("partition")["held_out_samples"].first()
    rows = {}
    for name, part in data.partitions.items():
        align = part["alignment"]
        views = [
            ("image " + "x".join(map(str, s[1:]))) if s is not None else f"{f} columns"
            for s, f in zip(part["shapes"], part["features"])
        ]
        rows[name] = {
            "parties (label party)": f"{part['parties']} ({part['label_party']})",
            "features per party": ", ".join(views),
            "classes": part["classes"],
            "ids dropped per party (prepare / partition)": (
                f"{align['prepare']['dropped_per_party']} / {align['partition']['dropped_per_party']}"
            ),
            "rows kept": part["cap"]["rows_kept"],
            "train / search-valid / test": " / ".join(str(part["splits"][s]) for s in ("train", "valid", "test")),
            "held out of train (validation)": int(held_out[name]),
        }
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "partition"
    return frame
