"""SS-VFNAS's report: the main table (each cell's health marked), the target table, accuracy vs bytes and vs epsilon,
messages per step, the searched cells and the hand-designed baseline, from the cells' outputs and params only (the
claims table is ``claims.py``'s).

``load_ssvfnas`` reads every cell the params ask for once into ``SSVFNASResults`` (tidy frames); the functions
after it each build one table or figure; ``render.render_report`` writes the markdown. Nothing here reads a clock
or an unseeded random source, so a rerun on the same cells gives the same bytes.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.errors import DataError
from fedrepro.io import read_json
from fedrepro.metrics.summary import mean_std
from fedrepro.report.figures import accuracy_bytes_figure, accuracy_epsilon_figure, curve_caption, messages_figure
from fedrepro.report.health import flagged_cells, mark_of
from fedrepro.ssvfnas.cells import (BASELINE, METHODS, Cell, baseline_cells, dp_name, label_alone_cells, partitions, retrain_health,
                                    table_cells)
from fedrepro.ssvfnas.phases import hold_out, load_partition
from fedrepro.ssvfnas.sanity import majority_accuracy

LABELS = {"vfnas1": "VFNAS-1", "vfnas2": "VFNAS-2", "ss_vfnas1": "SS-VFNAS-1", "ss_vfnas2": "SS-VFNAS-2",
          BASELINE: "hand-designed"}
MAJORITY, ALONE = "trivial: majority class", "trivial: label party alone"
RULES = {"darts": "DARTS bi-level", "milenas": "MiLeNAS mixed-level"}
PAIRS = (("ss_vfnas1", "vfnas1"), ("ss_vfnas2", "vfnas2"))
"""(with pre-search, without): the paper's comparisons, one per search rule"""
CHANCE_MARGIN = 0.01
"""cells 'clearly beat' the majority class of their dataset-K when their seed-mean test accuracy is at least this far
above its majority rate; a claim compares no cells that do not (they learned nothing it could compare), and a target
accuracy counts on a dataset-K only when it is this far above the majority rate (below, answering the majority class
already reaches it)."""
CELL_FIELDS = ["method", "dataset", "parties", "partition", "dp", "sigma_forward", "sigma_backward", "seed"]


# ----- loading --------------------------------------------------------------------------------------------
@dataclass
class SSVFNASResults:
    """Everything the report draws on, gathered once from the cell and partition folders."""

    cells: pd.DataFrame
    """one row per cell: key (= cell name), the cell's fields, test accuracy, the retraining's last held-out validation
    accuracy, the search's and retraining's steps, messages, bytes and epsilon, parameter counts, and its health
    (``fedrepro.fl.health``'s label on the retraining's curve) and health_why."""
    curves: pd.DataFrame
    """one row per search cell and curve point: key, step, messages, bytes, test_accuracy, epsilon (NaN: none)."""
    predictions: dict[str, pd.DataFrame]
    """key -> the test set's sample_id, label, predicted (sorted by sample_id)."""
    genotypes: dict[str, list[dict]]
    folders: dict[str, Path]
    partitions: dict[str, dict]
    """partition name -> its summary.json."""
    skipped: list[dict]
    majority: dict[str, float] = field(default_factory=dict)
    """partition name -> test accuracy of always answering its training rows' most frequent class."""
    label_alone: pd.DataFrame = field(default_factory=pd.DataFrame)
    """one row per label-party-alone cell that has run: key, partition, seed, accuracy, valid_accuracy, health."""


CURVE_COLUMNS = ["key", "step", "messages", "bytes", "test_accuracy", "epsilon", "epsilon_amplified", "alpha_entropy",
                 "alpha_shift"]
ALPHA_FIELDS = ("entropy_uniform", "entropy_start", "entropy_end", "max_shift", "max_shift_presearch", "parameter_free_edges",
                "genotype_as_at_start")
ALPHA_MOVED = 0.01
"""alpha 'moved' when the search lowered the entropy of softmax(alpha) by more than this share of the uniform entropy."""


def _alpha_fields(alpha: dict | None, folder: Path, cell: Cell) -> dict:
    """The search's alpha summary (``alpha_<field>``); a search cell without one predates it and must be rerun."""
    if cell.baseline:
        return {f"alpha_{f}": float("nan") for f in ALPHA_FIELDS}
    if alpha is None:
        raise DataError(f"{folder}/metrics.json has no search.alpha (written by older code): rerun `dvc repro ssvfnas_table`")
    return {f"alpha_{f}": float(alpha[f]) for f in ALPHA_FIELDS}


def _amplified_fields(metrics: dict, search: dict, folder: Path) -> dict:
    """The paper's Poisson-amplified epsilon beside the headline (no amplification)."""
    if "epsilon_total_amplified_max" not in metrics:
        raise DataError(f"{folder}/metrics.json has no epsilon_total_amplified_max (written by older code, whose epsilon was "
                        "the amplified one): rerun `dvc repro ssvfnas_table`")
    return {"epsilon_search_amplified": _num(search.get("epsilon_amplified_max")) if search else 0.0,
            "epsilon_total_amplified": _num(metrics["epsilon_total_amplified_max"])}


def _reliance_fields(metrics: dict, folder: Path, cell: Cell) -> dict:
    """The label party's accuracy alone (other embeddings zeroed) and the top network's weight share on the other parties."""
    norms = metrics["retrain"].get("top_weight_norms")
    if norms is None or "accuracy_label_party_only" not in metrics["test"]:
        raise DataError(f"{folder}/metrics.json has no test.accuracy_label_party_only / retrain.top_weight_norms (written by "
                        "older code): rerun `dvc repro ssvfnas_table`")
    label = f"party_{metrics['label_party']}"
    others = sum(v for k, v in norms.items() if k != label)
    return {"label_only_accuracy": float(metrics["test"]["accuracy_label_party_only"]),
            "top_share_others": others / max(others + norms[label], 1e-12)}


def _validation_fields(retrain: dict, folder: Path) -> dict:
    """The retraining's last held-out accuracy and the cell's health by the shared rule, from its validation curve."""
    curve = retrain.get("curve")
    if not curve:
        raise DataError(f"{folder}/metrics.json has no retrain.curve (written by older code, which validated nothing): rerun "
                        "`dvc repro ssvfnas_table`")
    health = retrain_health(curve)
    return {"valid_accuracy": float(curve[-1]["valid_accuracy"]), "held_out_samples": int(retrain["held_out_samples"]),
            "health": health.label, "health_why": health.why}


def grid(params: Params) -> list[Cell]:
    return table_cells(params) + baseline_cells(params)


def cell_folder(root: Path, cell: Cell) -> Path:
    return Path(root) / "tables" / cell.method / cell.name


def _num(value) -> float:
    return float("nan") if value is None else float(value)


def load_ssvfnas(root: Path, params: Params) -> SSVFNASResults:
    """Read every cell and partition the params ask for; a missing one is a DataError naming it and its stage."""
    root = Path(root)
    cells = grid(params)
    missing = [c for c in cells if not all((cell_folder(root, c) / f).exists() for f in ("metrics.json", "predictions.csv"))]
    if missing:
        raise DataError(f"{cell_folder(root, missing[0])} is missing ({len(missing)} of {len(cells)} SS-VFNAS cells are): "
                        "run `dvc repro ssvfnas_table`")
    summary_path = root / "partitions" / "summary.json"
    if not summary_path.exists():
        raise DataError(f"{summary_path} is missing: run `dvc repro ssvfnas_partition`")
    overall = read_json(summary_path)
    parts = {}
    for cell in cells:
        if cell.partition not in overall["partitions"]:
            raise DataError(f"{summary_path} has no partition {cell.partition}: run `dvc repro ssvfnas_partition`")
        parts[cell.partition] = overall["partitions"][cell.partition]
    rows, curves, predictions, genotypes, folders = [], [], {}, {}, {}
    for cell in cells:
        folder = cell_folder(root, cell)
        metrics = read_json(folder / "metrics.json")
        if metrics.get("cell", {}).get("name") != cell.name:
            raise DataError(f"{folder}/metrics.json is of cell {metrics.get('cell', {}).get('name')!r}, not {cell.name!r}: "
                            "rerun `dvc repro ssvfnas_table`")
        frame = pd.read_csv(folder / "predictions.csv").sort_values("sample_id", kind="stable").reset_index(drop=True)
        accuracy = float((frame["label"] == frame["predicted"]).mean())
        if abs(accuracy - metrics["test"]["accuracy"]) > 1e-6:
            raise DataError(f"{folder}: predictions.csv gives accuracy {accuracy:.6f}, metrics.json {metrics['test']['accuracy']:.6f}; "
                            "rerun `dvc repro ssvfnas_table`")
        search, retrain = metrics.get("search") or {}, metrics["retrain"]
        if not cell.baseline and search.get("steps") != params.ssvfnas.search.steps:
            raise DataError(f"{folder}/metrics.json has {search.get('steps')} search steps, params ssvfnas.search.steps = "
                            f"{params.ssvfnas.search.steps}: rerun `dvc repro ssvfnas_table`")
        key = cell.name
        predictions[key], folders[key] = frame, folder
        genotypes[key] = metrics.get("genotypes") or []
        presearch = metrics.get("presearch") or {}
        losses = presearch.get("loss", {})
        rows.append({
            "key": key, **{f: getattr(cell, f) for f in CELL_FIELDS},
            "accuracy": metrics["test"]["accuracy"], "test_samples": metrics["test"]["samples"],
            "search_accuracy": _num(search.get("test_accuracy")),
            "steps": search.get("steps", 0), "messages": search.get("messages", 0), "bytes": search.get("bytes", 0),
            "exchanges": search.get("exchanges", 0), "messages_per_step": search.get("messages_per_step", 0),
            "exchanges_per_step": search.get("exchanges_per_step", 0), "bytes_per_step": search.get("bytes_per_step", 0),
            "retrain_steps": retrain["steps"], "retrain_messages": retrain["messages"], "retrain_bytes": retrain["bytes"],
            "epsilon_search": _num(search.get("epsilon_max")) if search else 0.0,
            "epsilon_total": _num(metrics["epsilon_total_max"]), "epsilon_status": metrics["epsilon_status"],
            **_amplified_fields(metrics, search, folder),
            "params_bottom": sum(metrics["parameters"]["bottom"]), "params_top": metrics["parameters"]["top"],
            "params_supernet": sum(metrics["parameters"].get("supernet", [])),
            "params_target": sum(metrics["parameters"].get("baseline_target", [])),
            "presearch_loss_first": float(np.mean([v["first"] for v in losses.values()])) if losses else float("nan"),
            "presearch_loss_last": float(np.mean([v["last"] for v in losses.values()])) if losses else float("nan"),
            "retrain_loss_first": _num(retrain["loss_train"]["first"]), "retrain_loss_last": _num(retrain["loss_train"]["last"]),
            **_alpha_fields(search.get("alpha"), folder, cell),
            **_reliance_fields(metrics, folder, cell),
            **_validation_fields(retrain, folder),
        })
        for point in search.get("curve", []):
            curves.append({"key": key, **{f: _num(point[f]) if f.startswith("epsilon") else point[f] for f in CURVE_COLUMNS[1:]}})
    curve_frame = pd.DataFrame(curves, columns=CURVE_COLUMNS)
    return SSVFNASResults(pd.DataFrame(rows), curve_frame, predictions, genotypes, folders, parts, overall.get("skipped", []),
                          majority_levels(root / "partitions", params), load_label_alone(root, params))


def majority_levels(partitions_dir: Path, params: Params) -> dict[str, float]:
    """Per partition whose data is there: the test accuracy of answering, with no training, the most frequent class of
    the rows every cell trains on (train + search-valid, less the held-out share)."""
    levels = {}
    for name in partition_names(params):
        folder = Path(partitions_dir) / name
        if (folder / "summary.json").exists():
            data = hold_out(load_partition(folder), params.ssvfnas.retrain.held_out_fraction, params.data.seed)
            levels[name] = majority_accuracy(data, "test")
    return levels


def load_label_alone(root: Path, params: Params) -> pd.DataFrame:
    """The label-party-alone cells that have run (a pipeline that predates them has none; the main table says so)."""
    rows = []
    for cell in label_alone_cells(params):
        path = cell_folder(root, cell) / "metrics.json"
        if not path.exists():
            continue
        metrics = read_json(path)
        if metrics.get("cell", {}).get("name") != cell.name:
            raise DataError(f"{path} is of cell {metrics.get('cell', {}).get('name')!r}, not {cell.name!r}: rerun `dvc repro ssvfnas_table`")
        health = retrain_health(metrics["retrain"]["curve"])
        rows.append({"key": cell.name, "partition": cell.partition, "seed": cell.seed, "accuracy": metrics["test"]["accuracy"],
                     "valid_accuracy": metrics["retrain"]["valid_accuracy"], "health": health.label, "health_why": health.why})
    return pd.DataFrame(rows, columns=["key", "partition", "seed", "accuracy", "valid_accuracy", "health", "health_why"])


def label_alone_accuracy(data: SSVFNASResults, params: Params, partition: str) -> pd.DataFrame | None:
    """The partition's label-alone cells, or None unless every seed's has run (a mean over some seeds would mislead)."""
    cells = data.label_alone[data.label_alone.partition == partition]
    return cells if len(cells) == len(params.ssvfnas.seeds) else None


# ----- selections and formatting ----------------------------------------------------------------------------
def method_label(method: str) -> str:
    """The paper's name of a method (the hand-designed baseline named as such)."""
    return LABELS.get(method, method)


def select_cells(data: SSVFNASResults, **fields) -> pd.DataFrame:
    """The cells whose fields equal the given values."""
    frame = data.cells
    for name, value in fields.items():
        frame = frame[frame[name] == value]
    return frame.sort_values("seed", kind="stable")


def percent(value: float) -> str:
    """A 0-1 accuracy in % with two decimals; '-' where there is none."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.2f}"


def _fmt(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    mean, std = mean_std(values)
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if len(values) > 1 else f"{100 * mean:.2f}"


def megabytes(value: float) -> str:
    return f"{value / 1e6:.3f}"


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


def dp_level_text(level: list[float]) -> str:
    """How the report names a DP level: 'no DP' or the two noise multipliers."""
    s1, s2 = level
    if s1 == 0 and s2 == 0:
        return "no DP"
    return f"σ1 = {s1:g}, σ2 = {s2:g}"


def noisy_levels(params: Params) -> list[list[float]]:
    """The DP levels with noise on both sides, the ones epsilon is accounted for."""
    return [lvl for lvl in params.ssvfnas.dp_levels if lvl[0] > 0 and lvl[1] > 0]


def partition_names(params: Params) -> list[str]:
    """The grid's dataset-K names, in the params' order."""
    return [f"{d}-k{k}" for d, k, _ in partitions(params)]


def cell_hardware(data: SSVFNASResults) -> list[dict | None]:
    """The machine each cell ran on, as its metrics.json records it: the report names them, as the same seed gives the
    same bits only on the same machine type."""
    return [read_json(folder / "metrics.json").get("hardware") for folder in data.folders.values()]


# ----- steps / bytes / epsilon to the target ------------------------------------------------------------------
def to_target(curve: pd.DataFrame, target: float) -> dict | None:
    """The first curve point whose test accuracy reaches ``target``: its step, bytes, messages, epsilon."""
    reached = curve[curve["test_accuracy"] >= target].sort_values("step")
    if reached.empty:
        return None
    row = reached.iloc[0]
    return {"step": int(row["step"]), "bytes": int(row["bytes"]), "messages": int(row["messages"]), "epsilon": float(row["epsilon"])}


def target_frame(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """One row per search cell: whether its search reached the target and at which step, bytes and epsilon."""
    target, rows = params.ssvfnas.target_accuracy, []
    for _, row in data.cells[data.cells.method != BASELINE].iterrows():
        hit = to_target(data.curves[data.curves.key == row.key], target)
        rows.append({"key": row.key, "reached": hit is not None, **{f"target_{k}": (hit or {}).get(k, float("nan"))
                                                                     for k in ("step", "bytes", "messages", "epsilon")}})
    return pd.DataFrame(rows, columns=["key", "reached", "target_step", "target_bytes", "target_messages", "target_epsilon"])


# ----- tables ---------------------------------------------------------------------------------------------
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
                rows.append({
                    "dataset-K": point, "DP": dp_level_text(level), "method": method_label(method),
                    "test accuracy (%)": _fmt(sel["accuracy"].tolist()) + mark_of(sel["health"]),
                    "held-out valid accuracy (%)": _fmt(sel["valid_accuracy"].tolist()),
                    "supernet accuracy (%)": _fmt(sel["search_accuracy"].tolist()) if search else "-",
                    "collaborative steps": f"{int(sel['steps'].mean())} + {int(sel['retrain_steps'].mean())}" if search
                    else f"0 + {int(sel['retrain_steps'].mean())}",
                    "messages": f"{int(sel['messages'].mean()):,} + {int(sel['retrain_messages'].mean()):,}",
                    "MB search": megabytes(sel["bytes"].mean()) if search else "-",
                    "MB retrain": megabytes(sel["retrain_bytes"].mean()),
                    "ε search": _eps(sel["epsilon_search"].tolist(), status) if search else "-",
                    "ε total": _eps(sel["epsilon_total"].tolist(), status),
                    "ε total, amplified (Poisson assumed)": _eps(sel["epsilon_total_amplified"].tolist(), status),
                })
        rows += trivial_rows(data, params, point)
    return pd.DataFrame(rows)


def trivial_rows(data: SSVFNASResults, params: Params, point: str) -> list[dict]:
    """A partition's two trivial rows, which send nothing (so no DP level and no ε): the majority class and the label
    party alone; a row whose inputs are missing says so."""
    majority, alone = data.majority.get(point), label_alone_accuracy(data, params, point)
    accuracies = {MAJORITY: ("not computed (no partition data)" if majority is None else percent(majority), "-"),
                  ALONE: ("not run" if alone is None else _fmt(alone["accuracy"].tolist()) + mark_of(alone["health"]),
                          "-" if alone is None else _fmt(alone["valid_accuracy"].tolist()))}
    return [{"dataset-K": point, "DP": "nothing sent", "method": name, "test accuracy (%)": test,
             "held-out valid accuracy (%)": valid, "supernet accuracy (%)": "-", "collaborative steps": "-", "messages": "0",
             "MB search": "-", "MB retrain": "-", "ε search": "-", "ε total": "-", "ε total, amplified (Poisson assumed)": "-"}
            for name, (test, valid) in accuracies.items()]


def health_table(data: SSVFNASResults) -> pd.DataFrame:
    """Every cell (the label party alone's too) whose retraining diverged or had not converged, once, with the rule's reason."""
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
                rows.append({"dataset-K": point, "DP": dp_level_text(level), "method": method_label(method),
                             "seeds reached": f"{len(ok)} of {len(hits)}",
                             "steps": f"{ok['target_step'].mean():.1f}" if len(ok) else f"not in {ss.search.steps}",
                             "MB": megabytes(ok["target_bytes"].mean()) if len(ok) else "-",
                             "ε at target": _eps(ok["target_epsilon"].tolist(), status) if len(ok) else "-"})
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
                f"{int(first.messages_per_step)} msgs ({expected} expected), {int(first.exchanges_per_step)} exchanges, "
                f"{int(first.bytes_per_step):,} B")
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


def genotype_text(genotype: dict) -> str:
    """node i: op(input), op(input); ... with DARTS's numbering (0, 1 = the cell inputs)."""
    return "; ".join(f"{i}: " + ", ".join(f"{e['op']}({e['input']})" for e in node) for i, node in enumerate(genotype["nodes"]))


def shown_cells(data: SSVFNASResults, params: Params) -> list[str]:
    """The cells whose searched genotypes the report draws: every method x dataset-K at the first DP level, first seed."""
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
            rows.append({"dataset-K": row.partition, "method": method_label(row.method),
                         "party": f"party_{j}" + (" (labels)" if j == part["label_party"] else ""),
                         "space": genotype["kind"], "derived cell (node: op(input), ...)": genotype_text(genotype)})
    return pd.DataFrame(rows)


def reliance_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """Per dataset-K and DP level, over every method's cells and the baseline's: the retrained test accuracy, the label
    party's accuracy with every other party's embedding zeroed, and the top network's weight share on the other parties."""
    rows = []
    for point in partition_names(params):
        for level in params.ssvfnas.dp_levels:
            sel = select_cells(data, partition=point, dp=dp_name(level))
            if sel.empty:
                continue
            rows.append({"dataset-K": point, "DP": dp_level_text(level), "cells": len(sel),
                         "test accuracy (%)": _fmt(sel["accuracy"].tolist()),
                         "label party alone (%)": _fmt(sel["label_only_accuracy"].tolist()),
                         "top weight share on the other parties": f"{sel['top_share_others'].mean():.2f}",
                         "test rows (1 error =)": f"{int(sel['test_samples'].iloc[0])} ({100 / sel['test_samples'].iloc[0]:.2f} points)"})
    return pd.DataFrame(rows)


def kept_edges(genotype: dict) -> list[list[tuple[int, str]]]:
    return [sorted((int(e["input"]), e["op"]) for e in node) for node in genotype["nodes"]]


def alpha_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """Per method: did the search move alpha? The entropy of softmax(alpha) (mean over edges and parties, nats) at the
    search's start and end beside the uniform value, the largest |alpha - alpha_start|, the cells in which the entropy fell
    by more than ``ALPHA_MOVED`` of the uniform value, the derived edges on parameter-free ops, and the cells whose
    derived genotype is the one their starting alphas alone give."""
    rows = []
    for method in params.ssvfnas.methods:
        sel = select_cells(data, method=method)
        if sel.empty:
            continue
        drop = sel["alpha_entropy_start"] - sel["alpha_entropy_end"]
        moved = int((drop > ALPHA_MOVED * sel["alpha_entropy_uniform"]).sum())
        row = {"method": method_label(method), "cells": len(sel),
               "entropy uniform": f"{sel['alpha_entropy_uniform'].mean():.4f}",
               "entropy at search start": f"{sel['alpha_entropy_start'].mean():.4f}",
               "entropy at end": f"{sel['alpha_entropy_end'].mean():.4f}",
               "α shift, max / mean over cells": f"{sel['alpha_max_shift'].max():.4f} / {sel['alpha_max_shift'].mean():.4f}",
               "α moved (cells)": f"{moved} of {len(sel)}",
               "derived edges on parameter-free ops": f"{100 * sel['alpha_parameter_free_edges'].mean():.0f}%",
               "genotype = the starting α's (cells)": f"{int(sel['alpha_genotype_as_at_start'].sum())} of {len(sel)}"}
        if METHODS[method][1]:
            row["pre-search α shift (max)"] = f"{sel['alpha_max_shift_presearch'].max():.4f}"
        rows.append(row)
    return pd.DataFrame(rows).fillna("-")


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
            out.append({"pair": (one, two), "pairs": len(pairs), "mean_gap": float(np.mean(gaps)), "max_gap": float(np.max(gaps)),
                        "same_genotypes": same})
    return out


def alpha_moved(frame: pd.DataFrame) -> pd.Series:
    """Per search cell: did the entropy of softmax(α) fall by more than ALPHA_MOVED of the uniform value?"""
    return frame["alpha_entropy_start"] - frame["alpha_entropy_end"] > ALPHA_MOVED * frame["alpha_entropy_uniform"]


def partitions_table(data: SSVFNASResults) -> pd.DataFrame:
    held_out = data.cells.groupby("partition")["held_out_samples"].first()
    rows = {}
    for name, part in data.partitions.items():
        align = part["alignment"]
        views = [("image " + "x".join(map(str, s[1:]))) if s is not None else f"{f} columns"
                 for s, f in zip(part["shapes"], part["features"])]
        rows[name] = {"parties (label party)": f"{part['parties']} ({part['label_party']})",
                      "features per party": ", ".join(views), "classes": part["classes"],
                      "ids dropped per party (prepare / partition)": f"{align['prepare']['dropped_per_party']} / {align['partition']['dropped_per_party']}",
                      "rows kept": part["cap"]["rows_kept"],
                      "train / search-valid / test": " / ".join(str(part["splits"][s]) for s in ("train", "valid", "test")),
                      "held out of train (validation)": int(held_out[name])}
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "partition"
    return frame


# ----- claims -------------------------------------------------------------------------------------------------
def matched_pairs(data: SSVFNASResults, ours: str, theirs: str, levels: list[list[float]]) -> list[tuple[pd.Series, pd.Series]]:
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


# ----- outputs --------------------------------------------------------------------------------------------
def results_frame(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """results.csv: one row per cell, its fields, accuracy, steps, messages, bytes, epsilon, parameters, target."""
    targets = target_frame(data, params)
    frame = data.cells.merge(targets, on="key", how="left")
    return frame.rename(columns={"key": "cell"})


def summary_metrics(data: SSVFNASResults, params: Params) -> dict:
    """metrics.json for `dvc exp show`: mean retrained test accuracy over every cell of each method (and the baseline), and
    per DP level with noise and dataset-K the search cells' mean total epsilon: the headline without amplification and the
    paper's Poisson-amplified figure beside it."""
    epsilon: dict = {"headline": "no_amplification", "no_amplification": {}, "amplified_poisson_assumed": {}}
    search = data.cells[data.cells.method != BASELINE]
    for level in noisy_levels(params):
        for point in partition_names(params):
            sel = search[(search.dp == dp_name(level)) & (search.partition == point)]
            if sel.empty or sel["epsilon_total"].isna().any():
                continue
            for key, column in (("no_amplification", "epsilon_total"), ("amplified_poisson_assumed", "epsilon_total_amplified")):
                epsilon[key].setdefault(dp_name(level), {})[point] = round(float(sel[column].mean()), 4)
    return {"accuracy": {m: round(float(select_cells(data, method=m)["accuracy"].mean()), 4)
                         for m in list(params.ssvfnas.methods) + [BASELINE]},
            "epsilon_total": epsilon}


def _curve(data: SSVFNASResults, **fields) -> pd.DataFrame:
    """Seed-mean curve (step, bytes, messages, accuracy and its std over seeds, epsilon) of the selected search cells."""
    keys = select_cells(data, **fields)["key"]
    frame = data.curves[data.curves.key.isin(keys)]
    if frame.empty:
        return pd.DataFrame(columns=["step", "bytes", "messages", "accuracy", "accuracy_std", "epsilon"])
    return frame.groupby("step").agg(bytes=("bytes", "mean"), messages=("messages", "mean"), accuracy=("test_accuracy", "mean"),
                                     accuracy_std=("test_accuracy", "std"), epsilon=("epsilon", "mean")).reset_index()


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
        panels = {dp_level_text(lvl): {method_label(m): _curve(data, partition=point, dp=dp_name(lvl), method=m) for m in ss.methods}
                  for lvl in ss.dp_levels}
        references = trivial_references(data, params, point)
        accuracy_bytes_figure(panels, f"{point}: supernets' test accuracy vs MB exchanged ({curve_caption(len(ss.seeds))})",
                              folder / f"accuracy_vs_bytes_{point}.png", ss.target_accuracy, references)
        points, unbounded = {}, {}
        for method in list(ss.methods) + [BASELINE]:
            rows = []
            for lvl in noisy_levels(params):
                sel = select_cells(data, partition=point, dp=dp_name(lvl), method=method)
                if not sel.empty and sel["epsilon_total"].notna().all():
                    rows.append({"epsilon": sel["epsilon_total"].mean(), "accuracy": sel["accuracy"].mean(),
                                 "accuracy_std": sel["accuracy"].std()})
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
        accuracy_epsilon_figure(points, unbounded, curves, title, folder / f"accuracy_vs_epsilon_{point}.png", references)
    point = figure_point(params)
    for method in ss.methods:
        _curve(data, partition=point, dp=dp_name(ss.dp_levels[0]), method=method).rename(columns={"accuracy": "test_accuracy"}).to_csv(
            folder / f"accuracy_vs_bytes_{method}.csv", index=False, float_format="%.6g")
        rows = []
        for lvl in noisy_levels(params):
            sel = select_cells(data, partition=point, dp=dp_name(lvl), method=method)
            if not sel.empty and sel["epsilon_total"].notna().all():
                rows.append({"dp": dp_name(lvl), "epsilon": sel["epsilon_total"].mean(), "test_accuracy": sel["accuracy"].mean()})
        pd.DataFrame(rows, columns=["dp", "epsilon", "test_accuracy"]).to_csv(folder / f"accuracy_vs_epsilon_{method}.csv", index=False,
                                                                             float_format="%.6g")
    counts = {}
    for method in ss.methods:
        for k in sorted(set(data.cells.parties)):
            sel = select_cells(data, method=method, parties=k)
            if not sel.empty:
                counts.setdefault(method_label(method), {})[f"messages K={k}"] = sel.messages_per_step.iloc[0]
                counts[method_label(method)][f"exchanges K={k}"] = sel.exchanges_per_step.iloc[0]
    table = pd.DataFrame.from_dict(counts, orient="index")
    messages_figure(table, "Messages and sequential exchanges per collaborative step (channel counts)", folder / "messages_per_step.png")
    table.index.name = "method"
    table.reset_index().to_csv(folder / "messages_per_step.csv", index=False)
    for key in shown_cells(data, params):
        source = data.folders[key] / "cells"
        if source.is_dir():
            shutil.copytree(source, folder / "cells" / key)
