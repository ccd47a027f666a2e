"""SS-VFNAS's cells and partitions read into tidy frames: ``load_ssvfnas`` reads every cell the params ask for once into
``SSVFNASResults`` (with the majority-class levels and the label-party-alone cells that have run), checking each
against its predictions and params (a missing or stale one is a DataError naming the stage to rerun). It is the only
module of the report that reads the cells' folders; the tables, figures and claims work on what it returns, so they
can be tested on frames built by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.errors import DataError
from fedrepro.io import read_json
from fedrepro.ssvfnas.cells import Cell, baseline_cells, label_alone_cells, partitions, retrain_health, table_cells
from fedrepro.ssvfnas.phases import hold_out, load_partition
from fedrepro.ssvfnas.sanity import majority_accuracy


CELL_FIELDS = ["method", "dataset", "parties", "partition", "dp", "sigma_forward", "sigma_backward", "seed"]


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


CURVE_COLUMNS = [
    "key",
    "step",
    "messages",
    "bytes",
    "test_accuracy",
    "epsilon",
    "epsilon_amplified",
    "alpha_entropy",
    "alpha_shift",
]
ALPHA_FIELDS = (
    "entropy_uniform",
    "entropy_start",
    "entropy_end",
    "max_shift",
    "max_shift_presearch",
    "parameter_free_edges",
    "genotype_as_at_start",
)


def _alpha_fields(alpha: dict | None, folder: Path, cell: Cell) -> dict:
    """The search's alpha summary (``alpha_<field>``); a search cell without one predates it and must be rerun."""
    if cell.baseline:
        return {f"alpha_{f}": float("nan") for f in ALPHA_FIELDS}
    if alpha is None:
        raise DataError(
            f"{folder}/metrics.json has no search.alpha (written by older code): rerun `dvc repro ssvfnas_table`"
        )
    return {f"alpha_{f}": float(alpha[f]) for f in ALPHA_FIELDS}


def _amplified_fields(metrics: dict, search: dict, folder: Path) -> dict:
    """The paper's Poisson-amplified epsilon beside the headline (no amplification)."""
    if "epsilon_total_amplified_max" not in metrics:
        raise DataError(
            f"{folder}/metrics.json has no epsilon_total_amplified_max (written by older code, whose epsilon was "
            "the amplified one): rerun `dvc repro ssvfnas_table`"
        )
    return {
        "epsilon_search_amplified": _num(search.get("epsilon_amplified_max")) if search else 0.0,
        "epsilon_total_amplified": _num(metrics["epsilon_total_amplified_max"]),
    }


def _reliance_fields(metrics: dict, folder: Path, cell: Cell) -> dict:
    """The label party's accuracy alone (other embeddings zeroed) and the top network's weight share on the other
    parties."""
    norms = metrics["retrain"].get("top_weight_norms")
    if norms is None or "accuracy_label_party_only" not in metrics["test"]:
        raise DataError(
            f"{folder}/metrics.json has no test.accuracy_label_party_only / retrain.top_weight_norms (written by "
            "older code): rerun `dvc repro ssvfnas_table`"
        )
    label = f"party_{metrics['label_party']}"
    others = sum(v for k, v in norms.items() if k != label)
    return {
        "label_only_accuracy": float(metrics["test"]["accuracy_label_party_only"]),
        "top_share_others": others / max(others + norms[label], 1e-12),
    }


def _validation_fields(retrain: dict, folder: Path) -> dict:
    """The retraining's last held-out accuracy and the cell's health by the shared rule, from its validation curve."""
    curve = retrain.get("curve")
    if not curve:
        raise DataError(
            f"{folder}/metrics.json has no retrain.curve (written by older code, which validated nothing): rerun "
            "`dvc repro ssvfnas_table`"
        )
    health = retrain_health(curve)
    return {
        "valid_accuracy": float(curve[-1]["valid_accuracy"]),
        "held_out_samples": int(retrain["held_out_samples"]),
        "health": health.label,
        "health_why": health.why,
    }


def grid(params: Params) -> list[Cell]:
    return table_cells(params) + baseline_cells(params)


def partition_names(params: Params) -> list[str]:
    """The grid's dataset-K names, in the params' order."""
    return [f"{d}-k{k}" for d, k, _ in partitions(params)]


def cell_folder(root: Path, cell: Cell) -> Path:
    return Path(root) / "tables" / cell.method / cell.name


def _num(value) -> float:
    return float("nan") if value is None else float(value)


def load_ssvfnas(root: Path, params: Params) -> SSVFNASResults:
    """Read every cell and partition the params ask for; a missing one is a DataError naming it and its stage."""
    root = Path(root)
    cells = grid(params)
    missing = [
        c for c in cells if not all((cell_folder(root, c) / f).exists() for f in ("metrics.json", "predictions.csv"))
    ]
    if missing:
        raise DataError(
            f"{cell_folder(root, missing[0])} is missing ({len(missing)} of {len(cells)} SS-VFNAS cells are): "
            "run `dvc repro ssvfnas_table`"
        )
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
            raise DataError(
                f"{folder}/metrics.json is of cell {metrics.get('cell', {}).get('name')!r}, not {cell.name!r}: "
                "rerun `dvc repro ssvfnas_table`"
            )
        frame = pd.read_csv(folder / "predictions.csv").sort_values("sample_id", kind="stable").reset_index(drop=True)
        accuracy = float((frame["label"] == frame["predicted"]).mean())
        if abs(accuracy - metrics["test"]["accuracy"]) > 1e-6:
            raise DataError(
                f"{folder}: predictions.csv gives accuracy {accuracy:.6f}, metrics.json "
                f"{metrics['test']['accuracy']:.6f}; "
                "rerun `dvc repro ssvfnas_table`"
            )
        search, retrain = metrics.get("search") or {}, metrics["retrain"]
        if not cell.baseline and search.get("steps") != params.ssvfnas.search.steps:
            raise DataError(
                f"{folder}/metrics.json has {search.get('steps')} search steps, params ssvfnas.search.steps = "
                f"{params.ssvfnas.search.steps}: rerun `dvc repro ssvfnas_table`"
            )
        key = cell.name
        predictions[key], folders[key] = frame, folder
        genotypes[key] = metrics.get("genotypes") or []
        presearch = metrics.get("presearch") or {}
        losses = presearch.get("loss", {})
        rows.append(
            {
                "key": key,
                **{f: getattr(cell, f) for f in CELL_FIELDS},
                "accuracy": metrics["test"]["accuracy"],
                "test_samples": metrics["test"]["samples"],
                "search_accuracy": _num(search.get("test_accuracy")),
                "steps": search.get("steps", 0),
                "messages": search.get("messages", 0),
                "bytes": search.get("bytes", 0),
                "exchanges": search.get("exchanges", 0),
                "messages_per_step": search.get("messages_per_step", 0),
                "exchanges_per_step": search.get("exchanges_per_step", 0),
                "bytes_per_step": search.get("bytes_per_step", 0),
                "retrain_steps": retrain["steps"],
                "retrain_messages": retrain["messages"],
                "retrain_bytes": retrain["bytes"],
                "epsilon_search": _num(search.get("epsilon_max")) if search else 0.0,
                "epsilon_total": _num(metrics["epsilon_total_max"]),
                "epsilon_status": metrics["epsilon_status"],
                **_amplified_fields(metrics, search, folder),
                "params_bottom": sum(metrics["parameters"]["bottom"]),
                "params_top": metrics["parameters"]["top"],
                "params_supernet": sum(metrics["parameters"].get("supernet", [])),
                "params_target": sum(metrics["parameters"].get("baseline_target", [])),
                "presearch_loss_first": float(np.mean([v["first"] for v in losses.values()]))
                if losses
                else float("nan"),
                "presearch_loss_last": float(np.mean([v["last"] for v in losses.values()])) if losses else float("nan"),
                "retrain_loss_first": _num(retrain["loss_train"]["first"]),
                "retrain_loss_last": _num(retrain["loss_train"]["last"]),
                **_alpha_fields(search.get("alpha"), folder, cell),
                **_reliance_fields(metrics, folder, cell),
                **_validation_fields(retrain, folder),
            }
        )
        for point in search.get("curve", []):
            curves.append(
                {"key": key, **{f: _num(point[f]) if f.startswith("epsilon") else point[f] for f in CURVE_COLUMNS[1:]}}
            )
    curve_frame = pd.DataFrame(curves, columns=CURVE_COLUMNS)
    return SSVFNASResults(
        pd.DataFrame(rows),
        curve_frame,
        predictions,
        genotypes,
        folders,
        parts,
        overall.get("skipped", []),
        majority_levels(root / "partitions", params),
        load_label_alone(root, params),
    )


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
            raise DataError(
                f"{path} is of cell {metrics.get('cell', {}).get('name')!r}, not {cell.name!r}: "
                "rerun `dvc repro ssvfnas_table`"
            )
        health = retrain_health(metrics["retrain"]["curve"])
        rows.append(
            {
                "key": cell.name,
                "partition": cell.partition,
                "seed": cell.seed,
                "accuracy": metrics["test"]["accuracy"],
                "valid_accuracy": metrics["retrain"]["valid_accuracy"],
                "health": health.label,
                "health_why": health.why,
            }
        )
    return pd.DataFrame(
        rows, columns=["key", "partition", "seed", "accuracy", "valid_accuracy", "health", "health_why"]
    )


def cell_hardware(data: SSVFNASResults) -> list[dict | None]:
    """The machine each cell ran on, as its metrics.json records it: the report names them, as the same seed gives the
    same bits only on the same machine type."""
    return [read_json(folder / "metrics.json").get("hardware") for folder in data.folders.values()]
