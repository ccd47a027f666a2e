"""FedCMC's cells and partitions read into tidy frames: ``load_fedcmc`` reads every cell the params ask for once into
``FedCMCResults``, checking each against its partition and params (a missing or stale one is a DataError naming the
stage to rerun). It is the only module of the report that reads the cells' folders; the tables, figures and claims
work on what it returns, so they can be tested on frames built by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.errors import DataError
from fedrepro.fl.health import cell_health, training_losses
from fedrepro.fedcmc.cells import SWEEPS, Cell, sweep_points, table_cells
from fedrepro.io import read_json
from fedrepro.report.results import missed_clients
from fedrepro.report.statistics import micro_f1


TABLE = "table"
CELL_FIELDS = [
    "method",
    "dataset",
    "alpha",
    "clients",
    "local_epochs",
    "seed",
    "vectors",
    "subset",
    "name",
    "partition",
]


@dataclass
class Partition:
    name: str
    counts: pd.DataFrame
    """clients x classes training counts (no ``total`` column)."""
    info: dict
    """partition.json: dataset, alpha, clients, subset, classes, sentences per split, skew, ..."""
    heatmap: Path


@dataclass
class FedCMCResults:
    """Everything the report draws on, gathered once from the cell and partition folders."""

    cells: pd.DataFrame
    """one row per cell: key, group (``table`` or the sweep), the cell's fields, test micro_f1, macro_f1, accuracy,
    health (``fedrepro.fl.health``'s label: converged / not converged / unknown / diverged) and health_why."""
    rounds: pd.DataFrame
    """one row per cell and round: key, round, clients (uploading), train_loss (the mean local loss), fit_loss (the
    global model on the training data), bytes_up, bytes_down, micro_f1, macro_f1 (NaN where not evaluated)."""
    predictions: dict[str, pd.DataFrame]
    """key -> the global test set's sentence_id, label, client, predicted (sorted by sentence_id)."""
    diagnostics: dict[str, list[dict]]
    """key -> per round: round, clients, similarity (clients x classes d_{k,c}), vector_clients (FedCMC)."""
    info: dict[str, dict]
    """key -> metrics.json without its history (channel, memory_bytes, parameters, truncated_train_sentences)."""
    partitions: dict[str, Partition]
    classes: dict[str, list[str]]
    """dataset -> its classes (partition.json)."""
    positive: dict[str, list[str]] = field(default_factory=dict)
    """dataset -> the classes F1 is computed over (all but the negative labels; every class if it has none)."""
    missed: list[dict] = field(default_factory=list)
    """cell, round, client, reason: every client a round went on without."""


def grid(params: Params) -> list[tuple[str, Cell]]:
    """Every (group, cell) of the report: the main table's, then each sweep's, in the params' order."""
    return [(TABLE, c) for c in table_cells(params)] + [(s, c) for s in SWEEPS for c in sweep_points(params, s)]


def cell_folder(root: Path, group: str, cell: Cell) -> Path:
    return Path(root) / (Path("tables") / cell.method if group == TABLE else Path("sweeps") / group) / cell.name


def cell_key(group: str, cell: Cell) -> str:
    return f"{'tables/' + cell.method if group == TABLE else 'sweeps/' + group}/{cell.name}"


def _stage(group: str) -> str:
    return "fedcmc_table" if group == TABLE else "fedcmc_sweeps"


def positive_labels(classes: list[str], negative: list[str]) -> list[str]:
    """The classes F1 counts: all but the negative (no-relation) labels, or every class when none is negative."""
    return [c for c in classes if c not in set(negative)] or list(classes)


def load_fedcmc(root: Path, params: Params) -> FedCMCResults:
    """Read every cell and partition the params ask for; a missing one is a DataError naming it and its stage."""
    root = Path(root)
    cells = grid(params)
    in_table = set(table_cells(params))

    def owner(group: str, cell: Cell) -> str:
        """The group whose stage trained the cell: a sweep point equal to a main-table cell is that cell."""
        return TABLE if cell in in_table else group

    missing = [
        (g, c)
        for g, c in cells
        if not all((cell_folder(root, owner(g, c), c) / f).exists() for f in ("metrics.json", "predictions.csv"))
    ]
    if missing:
        group, cell = missing[0]
        raise DataError(
            f"{cell_folder(root, owner(group, cell), cell)} is missing ({len(missing)} of {len(cells)} FedCMC "
            f"cells are): run `dvc repro {_stage(owner(group, cell))}`"
        )
    partitions = {}
    for name in sorted({c.partition for _, c in cells}):
        folder = root / "partitions" / name
        if not all((folder / f).exists() for f in ("counts.csv", "partition.json", "heatmap.png")):
            raise DataError(f"{folder} is missing or incomplete: run `dvc repro fedcmc_partition`")
        counts = pd.read_csv(folder / "counts.csv", index_col=0, dtype={"client": str}, keep_default_na=False)
        counts.columns = [str(c) for c in counts.columns]
        partitions[name] = Partition(
            name,
            counts.drop(columns="total", errors="ignore"),
            read_json(folder / "partition.json"),
            folder / "heatmap.png",
        )
    classes = {}
    for part in partitions.values():
        own = [str(c) for c in part.info["classes"]]
        first = classes.setdefault(part.info["dataset"], own)
        if own != first:
            raise DataError(
                f"{root / 'partitions' / part.name}: classes {own}, "
                f"where another partition of {part.info['dataset']} has "
                f"{first}: the main table, Table 3 and the figures read a corpus one way (one class set); rerun "
                "`dvc repro fedcmc_partition`"
            )
    negative = params.fedcmc.settings.negative_labels
    positive = {d: positive_labels(c, negative) for d, c in classes.items()}
    rows, rounds, predictions, diagnostics, info, missed = [], [], {}, {}, {}, []
    for group, cell in cells:
        folder, key, stage = (
            cell_folder(root, owner(group, cell), cell),
            cell_key(group, cell),
            _stage(owner(group, cell)),
        )
        metrics = read_json(folder / "metrics.json")
        if metrics.get("cell", {}).get("name") != cell.name:
            raise DataError(
                f"{folder}/metrics.json is of cell {metrics.get('cell', {}).get('name')!r}, not {cell.name!r}: "
                f"rerun `dvc repro {stage}`"
            )
        frame = pd.read_csv(folder / "predictions.csv", dtype=str, keep_default_na=False)
        frame = frame.sort_values("sentence_id", kind="stable").reset_index(drop=True)
        recomputed = micro_f1(frame["label"], frame["predicted"], positive[cell.dataset])
        if abs(recomputed - metrics["test"]["micro_f1"]) > 1e-6:
            raise DataError(
                f"{folder}: predictions.csv gives micro-F1 {recomputed:.6f}, "
                f"metrics.json {metrics['test']['micro_f1']:.6f}; "
                f"rerun `dvc repro {stage}`"
            )
        if len(metrics["history"]) != params.fedcmc.settings.rounds:
            raise DataError(
                f"{folder}/metrics.json has {len(metrics['history'])} rounds, params fedcmc.settings.rounds = "
                f"{params.fedcmc.settings.rounds}: rerun `dvc repro {stage}`"
            )
        counts = partitions[cell.partition].counts
        holders = sorted(str(c) for c in counts.index[counts.sum(axis=1) > 0])
        if metrics["history"] and sorted(metrics["history"][0].get("clients", holders)) != holders:
            raise DataError(
                f"{folder}: its clients are not the partition's non-empty clients ({cell.partition} changed since "
                f"the cell ran): rerun `dvc repro {stage}`"
            )
        predictions[key] = frame
        health = cell_health(
            training_losses(metrics["history"]),
            [r["valid"]["global"]["micro_f1"] for r in metrics["history"] if r.get("valid")],
        )
        rows.append(
            {
                "key": key,
                "group": group,
                **{f: getattr(cell, f) for f in CELL_FIELDS},
                **{m: metrics["test"][m] for m in ("micro_f1", "macro_f1", "accuracy")},
                "health": health.label,
                "health_why": health.why,
            }
        )
        diagnostics[key] = []
        for record in metrics["history"]:
            test = (record.get("test") or {}).get("global", {})
            rounds.append(
                {
                    "key": key,
                    "round": record["round"],
                    "clients": len(record.get("clients", [])),
                    "train_loss": record.get("train_loss", np.nan),
                    "fit_loss": record.get("fit_loss", np.nan),
                    "bytes_up": record.get("bytes_up", 0),
                    "bytes_down": record.get("bytes_down", 0),
                    "micro_f1": test.get("micro_f1", np.nan),
                    "macro_f1": test.get("macro_f1", np.nan),
                }
            )
            diag = record.get("diagnostics") or {}
            if diag.get("local_similarity"):
                diagnostics[key].append(
                    {
                        "round": record["round"],
                        "clients": list(diag["clients"]),
                        "similarity": np.asarray(diag["local_similarity"], dtype=float),
                        "vector_clients": list(record.get("vector_clients") or []),
                    }
                )
        info[key] = {k: v for k, v in metrics.items() if k != "history"}
        missed += missed_clients(key, metrics["history"])
    return FedCMCResults(
        pd.DataFrame(rows), pd.DataFrame(rounds), predictions, diagnostics, info, partitions, classes, positive, missed
    )
