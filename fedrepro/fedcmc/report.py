"""FedCMC's report: Table 2, the clients table, Table 3, Figs 1, 3a, 3b and 4, the partitions, communication and
memory, from the cells' outputs and params only (the claims table is ``claims.py``'s).

``load_fedcmc`` reads every cell the params ask for once into ``FedCMCResults`` (tidy frames); the functions
after it each build one table or figure; ``render.render_report`` writes the markdown. Nothing here reads a
clock or an unseeded random source, so a rerun on the same cells gives the same bytes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.errors import DataError
from fedrepro.fl.algorithms import REGISTRY
from fedrepro.fl.health import cell_health, training_losses
from fedrepro.fedcmc.cells import SWEEPS, Cell, sweep_points, table_cells
from fedrepro.io import read_json
from fedrepro.metrics.classification import trivial_scores
from fedrepro.metrics.summary import mean_std
from fedrepro.report.figures import bar_figure, f1_curves_figure, similarity_figure
from fedrepro.report.health import flagged_cells, mark_of
from fedrepro.report.formatting import over_seeds
from fedrepro.report.results import missed_clients
from fedrepro.report.statistics import micro_f1

LABELS = {name: algorithm.label for name, algorithm in REGISTRY.items()}
DATASET_LABELS = {"i2b2": "2010 i2b2/VA", "chemprot_cpr5": "ChemProt (CPR)", "pgr": "PGR"}
PAPER_GAINS = {0.05: {"i2b2": 12.99, "chemprot_cpr5": 8.39, "pgr": 4.04},
               0.5: {"i2b2": 9.08, "chemprot_cpr5": 7.81, "pgr": 2.12}}
"""FedCMC − FedAvg F1 the paper reports (ANCHORS.md), by alpha and dataset."""
CHEMPROT_READING = ("ChemProt is `chemprot_cpr5`, the five CPR relation types (CPR:3/4/5/6/9) with no no-relation class: "
                    "the paper counts 10,307 CPR sentences in 5 relation types (the positive pairs; the CPR-group version "
                    "with NA candidates has 38,106) and draws Table 3's balanced subset as 100 per class of 500, i.e. 5 classes")
"""The one reading of ChemProt the main table, Table 3 and the figures share, and why (the paper's Datasets and Table 3)."""
PAPER_ROUNDS = {"fedcmc": 5, "fedrs": 15, "fedavg": 20}
"""Rounds to 45% F1 at alpha 0.05 the paper reports (Fig 3a)."""
TABLE = "table"
CHANCE = "trivial"
CELL_FIELDS = ["method", "dataset", "alpha", "clients", "local_epochs", "seed", "vectors", "subset", "name", "partition"]


# ----- loading --------------------------------------------------------------------------------------------
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

    missing = [(g, c) for g, c in cells
               if not all((cell_folder(root, owner(g, c), c) / f).exists() for f in ("metrics.json", "predictions.csv"))]
    if missing:
        group, cell = missing[0]
        raise DataError(f"{cell_folder(root, owner(group, cell), cell)} is missing ({len(missing)} of {len(cells)} FedCMC "
                        f"cells are): run `dvc repro {_stage(owner(group, cell))}`")
    partitions = {}
    for name in sorted({c.partition for _, c in cells}):
        folder = root / "partitions" / name
        if not all((folder / f).exists() for f in ("counts.csv", "partition.json", "heatmap.png")):
            raise DataError(f"{folder} is missing or incomplete: run `dvc repro fedcmc_partition`")
        counts = pd.read_csv(folder / "counts.csv", index_col=0, dtype={"client": str}, keep_default_na=False)
        counts.columns = [str(c) for c in counts.columns]
        partitions[name] = Partition(name, counts.drop(columns="total", errors="ignore"), read_json(folder / "partition.json"),
                                     folder / "heatmap.png")
    classes = {}
    for part in partitions.values():
        own = [str(c) for c in part.info["classes"]]
        first = classes.setdefault(part.info["dataset"], own)
        if own != first:
            raise DataError(f"{root / 'partitions' / part.name}: classes {own}, where another partition of {part.info['dataset']} has "
                            f"{first}: the main table, Table 3 and the figures read a corpus one way (one class set); rerun "
                            "`dvc repro fedcmc_partition`")
    negative = params.fedcmc.settings.negative_labels
    positive = {d: positive_labels(c, negative) for d, c in classes.items()}
    rows, rounds, predictions, diagnostics, info, missed = [], [], {}, {}, {}, []
    for group, cell in cells:
        folder, key, stage = cell_folder(root, owner(group, cell), cell), cell_key(group, cell), _stage(owner(group, cell))
        metrics = read_json(folder / "metrics.json")
        if metrics.get("cell", {}).get("name") != cell.name:
            raise DataError(f"{folder}/metrics.json is of cell {metrics.get('cell', {}).get('name')!r}, not {cell.name!r}: "
                            f"rerun `dvc repro {stage}`")
        frame = pd.read_csv(folder / "predictions.csv", dtype=str, keep_default_na=False)
        frame = frame.sort_values("sentence_id", kind="stable").reset_index(drop=True)
        recomputed = micro_f1(frame["label"], frame["predicted"], positive[cell.dataset])
        if abs(recomputed - metrics["test"]["micro_f1"]) > 1e-6:
            raise DataError(f"{folder}: predictions.csv gives micro-F1 {recomputed:.6f}, metrics.json {metrics['test']['micro_f1']:.6f}; "
                            f"rerun `dvc repro {stage}`")
        if len(metrics["history"]) != params.fedcmc.settings.rounds:
            raise DataError(f"{folder}/metrics.json has {len(metrics['history'])} rounds, params fedcmc.settings.rounds = "
                            f"{params.fedcmc.settings.rounds}: rerun `dvc repro {stage}`")
        counts = partitions[cell.partition].counts
        holders = sorted(str(c) for c in counts.index[counts.sum(axis=1) > 0])
        if metrics["history"] and sorted(metrics["history"][0].get("clients", holders)) != holders:
            raise DataError(f"{folder}: its clients are not the partition's non-empty clients ({cell.partition} changed since "
                            f"the cell ran): rerun `dvc repro {stage}`")
        predictions[key] = frame
        health = cell_health(training_losses(metrics["history"]),
                             [r["valid"]["global"]["micro_f1"] for r in metrics["history"] if r.get("valid")])
        rows.append({"key": key, "group": group, **{f: getattr(cell, f) for f in CELL_FIELDS},
                     **{m: metrics["test"][m] for m in ("micro_f1", "macro_f1", "accuracy")},
                     "health": health.label, "health_why": health.why})
        diagnostics[key] = []
        for record in metrics["history"]:
            test = (record.get("test") or {}).get("global", {})
            rounds.append({"key": key, "round": record["round"], "clients": len(record.get("clients", [])),
                           "train_loss": record.get("train_loss", np.nan),
                           "fit_loss": record.get("fit_loss", np.nan), "bytes_up": record.get("bytes_up", 0),
                           "bytes_down": record.get("bytes_down", 0), "micro_f1": test.get("micro_f1", np.nan),
                           "macro_f1": test.get("macro_f1", np.nan)})
            diag = record.get("diagnostics") or {}
            if diag.get("local_similarity"):
                diagnostics[key].append({"round": record["round"], "clients": list(diag["clients"]),
                                         "similarity": np.asarray(diag["local_similarity"], dtype=float),
                                         "vector_clients": list(record.get("vector_clients") or [])})
        info[key] = {k: v for k, v in metrics.items() if k != "history"}
        missed += missed_clients(key, metrics["history"])
    return FedCMCResults(pd.DataFrame(rows), pd.DataFrame(rounds), predictions, diagnostics, info, partitions, classes, positive,
                         missed)


# ----- selections and formatting ----------------------------------------------------------------------------
def percent(value: float) -> str:
    """A 0-1 score as a percentage with two decimals, the unit of every FedCMC table."""
    return f"{100 * value:.2f}"


def points_text(value: float) -> str:
    return f"{100 * value:+.2f}"


def mean_std_percent(values: list[float]) -> str:
    """'mean ± std' in % over seeds (the mean alone for one seed)."""
    mean, std = mean_std(values)
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if len(values) > 1 else f"{100 * mean:.2f}"


def method_label(method: str) -> str:
    """The paper's name of a method (the params' key where it has none)."""
    return LABELS.get(method, method)


def dataset_label(dataset: str) -> str:
    """The paper's name of a corpus (the params' key for one it does not use)."""
    return DATASET_LABELS.get(dataset, dataset)


def selected(data: FedCMCResults, group: str, **fields) -> pd.DataFrame:
    frame = data.cells[data.cells.group == group]
    for name, value in fields.items():
        frame = frame[frame[name].isna()] if value is None else frame[frame[name] == value]
    return frame.sort_values("seed", kind="stable")


def values_of(data: FedCMCResults, group: str, metric: str = "micro_f1", **fields) -> list[float]:
    """The selected cells' ``metric``, one value per seed in seed order."""
    return selected(data, group, **fields)[metric].tolist()


def mean_of(data: FedCMCResults, group: str, metric: str = "micro_f1", **fields) -> float:
    """The selected cells' mean ``metric`` over seeds; NaN where the grid has none."""
    values = values_of(data, group, metric, **fields)
    return float(np.mean(values)) if values else float("nan")


def prediction_frames(data: FedCMCResults, group: str, **fields) -> dict[int, pd.DataFrame]:
    """seed -> test predictions of the selected cells: the bootstrap's terms, paired by seed."""
    chosen = selected(data, group, **fields)
    return {int(seed): data.predictions[key] for seed, key in zip(chosen["seed"], chosen["key"])}


def point_name(dataset: str, alpha: float) -> str:
    """How the report names a main-table point: dataset and α."""
    return f"{dataset} α={alpha:g}"


CHANCE_MARGIN = 0.01
"""a cell less than this (micro-F1) above the best trivial baseline learned little beyond the prior."""


def health_mark(data: FedCMCResults, group: str, **fields) -> str:
    """The worst mark of the selected cells' health (``fedrepro.report.health.mark_of``)."""
    return mark_of(selected(data, group, **fields)["health"])


def health_table(data: FedCMCResults) -> pd.DataFrame:
    """Every cell that diverged or had not converged, once (a sweep point may be a main-table cell), with the reason."""
    return flagged_cells(data.cells)


def identical_predictions(data: FedCMCResults, params: Params) -> list[str]:
    """Main-table points where different methods' cells predicted every test sentence alike (same seed): different
    algorithms rarely agree sentence for sentence unless their models collapsed onto the same few answers."""
    groups = []
    for dataset, alpha in main_points(params):
        for seed in params.fedcmc.seeds:
            cells = selected(data, TABLE, dataset=dataset, alpha=alpha, seed=seed)
            alike: dict[tuple, list[str]] = {}
            for key, method in zip(cells["key"], cells["method"]):
                alike.setdefault(tuple(data.predictions[key]["predicted"]), []).append(method_label(method))
            groups += [f"{point_name(dataset, alpha)} seed {seed}: {', '.join(m)}" for m in alike.values() if len(m) > 1]
    return groups


# ----- tables ---------------------------------------------------------------------------------------------
def chance_scores(data: FedCMCResults, dataset: str, partition: str,
                  scored_on: str | None = None) -> dict[str, dict[str, float]]:
    """The trivial baselines (``fedrepro.metrics.classification``) of a model that learned only ``partition``'s
    training prior: always its most frequent positive training class, and stratified random guessing from the prior;
    scored on the test set of ``scored_on``'s cells (the partition's own by default), the test set the cells a table
    compares them with are scored on. The majority class itself is no baseline here when it is the excluded
    no-relation class (it scores 0)."""
    totals = data.partitions[partition].counts.sum(axis=0)
    key = data.cells.loc[data.cells.partition == (scored_on or partition), "key"].iloc[0]
    return trivial_scores(data.predictions[key]["label"], totals.to_dict(), data.positive[dataset])


def chance_level(data: FedCMCResults, dataset: str, partition: str, metric: str = "micro_f1") -> float:
    """The best trivial baseline: a method must clear this to have learned anything."""
    return max(scores[metric] for scores in chance_scores(data, dataset, partition).values())


def main_points(params: Params) -> list[tuple[str, float]]:
    """The main table's dataset x α points, in the params' order."""
    return [(d, a) for d in params.fedcmc.datasets for a in params.fedcmc.alphas]


def main_table(data: FedCMCResults, params: Params, metric: str) -> pd.DataFrame:
    """Table 2: methods x (dataset, alpha), 'mean ± std' over seeds of test ``metric`` in %, a chance row, and
    for micro-F1 the measured FedCMC − FedAvg gap beside the paper's."""
    fc = params.fedcmc
    table = {}
    for method in fc.methods:
        table[method_label(method)] = {point_name(d, a): mean_std_percent(values_of(data, TABLE, metric, method=method, dataset=d, alpha=a))
                                 + health_mark(data, TABLE, method=method, dataset=d, alpha=a) for d, a in main_points(params)}
    part = lambda d, a: Cell("fedavg", d, a, fc.settings.clients, fc.settings.local_epochs, 0).partition  # noqa: E731
    for d, a in main_points(params):
        for name, scores in chance_scores(data, d, part(d, a)).items():
            table.setdefault(f"{CHANCE}: {name}", {})[point_name(d, a)] = percent(scores[metric])
    if metric == "micro_f1" and {"fedavg", "fedcmc"} <= set(fc.methods):
        table["FedCMC − FedAvg (measured, points)"] = {
            point_name(d, a): points_text(mean_of(data, TABLE, method="fedcmc", dataset=d, alpha=a) - mean_of(data, TABLE, method="fedavg", dataset=d, alpha=a))
            for d, a in main_points(params)}
        table["FedCMC − FedAvg (paper)"] = {point_name(d, a): (f"+{PAPER_GAINS[a][d]:.2f}" if d in PAPER_GAINS.get(a, {}) else "-")
                                            for d, a in main_points(params)}
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.name = "method"
    return frame


def sweep_table(data: FedCMCResults, sweep: str, rows: list[str], column: str, values: list, metric: str = "micro_f1",
                **fixed) -> pd.DataFrame:
    """Methods x sweep points, 'mean ± std' over the sweep's seeds of test ``metric`` in %."""
    table = {}
    for method in rows:
        table[method_label(method)] = {str(v): mean_std_percent(values_of(data, sweep, metric, method=method, **{column: v}, **fixed)) for v in values}
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.name = "method"
    return frame


def clients_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """The clients table: methods x client counts, test micro-F1 in % (``sweep_table``), then the trivial rows (Table
    2's) of each count's partition on its test set: a method's number is read against them as in Table 2."""
    sw = params.fedcmc.sweeps
    frame = sweep_table(data, "clients", sw.methods, "clients", sw.clients)
    trivial: dict[str, dict[str, str]] = {}
    for count in sw.clients:
        cells = selected(data, "clients", clients=count)
        if cells.empty:
            continue
        for name, scores in chance_scores(data, sw.dataset, cells["partition"].iloc[0]).items():
            trivial.setdefault(f"{CHANCE}: {name}", {})[str(count)] = percent(scores["micro_f1"])
    table = pd.concat([frame, pd.DataFrame.from_dict(trivial, orient="index")]).fillna("-")
    table.index.name = "method"
    return table


def subsets_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """Table 3: methods x subset mode, test micro-F1 in % (``sweep_table``), then the trivial rows of each subset's
    training prior (Table 2's), each scored on every column's test set. The balanced prior is flat, so its 'commonest'
    class is merely the first; a reader needs the natural prior's commonest class beside the balanced cells too, as
    the test set keeps the corpus's label mix."""
    sw = params.fedcmc.sweeps
    frame = sweep_table(data, "subsets", sw.subset_methods, "subset", sw.subset_modes)
    partitions = {mode: selected(data, "subsets", subset=mode)["partition"].iloc[0] for mode in sw.subset_modes}
    trivial: dict[str, dict[str, str]] = {}
    for mode, partition in partitions.items():
        for prior_mode, prior in partitions.items():
            for name, scores in chance_scores(data, sw.subset_dataset, prior, scored_on=partition).items():
                trivial.setdefault(f"{CHANCE}: {name} ({prior_mode} prior)", {})[mode] = percent(scores["micro_f1"])
    table = pd.concat([frame, pd.DataFrame.from_dict(trivial, orient="index")])
    table.index.name = "method"
    return table


def rounds_to_target(curve: pd.Series, target: float) -> int | None:
    """The first evaluated round (index) whose test micro-F1 reaches ``target``; None if none does."""
    curve = curve.dropna().sort_index()
    reached = curve[curve >= target]
    return int(reached.index[0]) if len(reached) else None


def curve_of(data: FedCMCResults, group: str, metric: str = "micro_f1", **fields) -> pd.Series:
    """Test ``metric`` per round, mean over the selected cells (seeds); evaluated rounds only."""
    keys = selected(data, group, **fields)["key"]
    frame = data.rounds[data.rounds.key.isin(keys)]
    return frame.groupby("round")[metric].mean().dropna()


def rounds_text(rounds: int | None, total: int) -> str:
    return str(rounds) if rounds is not None else f"not reached in {total} rounds"


def figure_point(params: Params) -> tuple[str, float] | None:
    """(dataset, alpha) of Fig 3a and the communication table: the sweeps' point if the main table has it."""
    fc = params.fedcmc
    if fc.sweeps.dataset in fc.datasets and fc.sweeps.alpha in fc.alphas:
        return fc.sweeps.dataset, fc.sweeps.alpha
    return None


def convergence_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """Fig 3a's companion: per method, rounds to reach fedcmc.target_f1 and the last round's micro-F1."""
    point, fc = figure_point(params), params.fedcmc
    rows = {}
    for method in fc.methods:
        curve = curve_of(data, TABLE, method=method, dataset=point[0], alpha=point[1])
        reached = rounds_to_target(curve, fc.target_f1)
        rows[method_label(method)] = {f"rounds to {100 * fc.target_f1:g}% micro-F1": rounds_text(reached, fc.settings.rounds),
                                "paper (i2b2, α=0.05)": str(PAPER_ROUNDS.get(method, "-")),
                                "best round micro-F1": percent(curve.max()) if len(curve) else "-",
                                "last round micro-F1": percent(curve.iloc[-1]) if len(curve) else "-"}
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "method"
    return frame


def local_epochs_tables(data: FedCMCResults, params: Params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fig 3b's companions: final test micro-F1 and rounds to the target per (method, local epochs)."""
    sw, fc = params.fedcmc.sweeps, params.fedcmc
    final = sweep_table(data, "local_epochs", sw.methods, "local_epochs", sw.local_epochs)
    final.columns = [f"E={e}" for e in final.columns]
    speed = {}
    for method in sw.methods:
        speed[method_label(method)] = {f"E={e}": rounds_text(rounds_to_target(curve_of(data, "local_epochs", method=method, local_epochs=e),
                                                                           fc.target_f1), fc.settings.rounds)
                                 for e in sw.local_epochs}
    speed_frame = pd.DataFrame.from_dict(speed, orient="index")
    speed_frame.index.name = "method"
    return final, speed_frame


def vectors_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """Fig 4: test micro-F1 (%) of FedCMC per vector rule, mean and std over the sweep's seeds."""
    rows = {}
    for rule in params.fedcmc.sweeps.vectors:
        mean, std = mean_std(values_of(data, "vectors", method="fedcmc", vectors=rule))
        rows[rule] = {"mean": 100 * mean, "std": 100 * std}
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=["mean", "std"])
    frame.index.name = "vectors"
    return frame


# ----- Observation 3 / Fig 1 --------------------------------------------------------------------------------
def argmin_clients(similarity: np.ndarray, clients: list[str]) -> list[str]:
    """For each class (column of clients x classes d_{k,c}), the client with the smallest d (FedCMC's major rule)."""
    return [clients[i] for i in np.argmin(np.asarray(similarity, dtype=float), axis=0)]


def largest_holder_share(picked: list[str], counts: pd.DataFrame) -> tuple[float, float, int]:
    """Observation 3 measured: the share of classes whose picked client is (one of) the largest holder(s) of
    that class in the training counts (clients x classes, columns in the picks' order), the share a uniform
    pick among the class's holders would reach (mean of ties / holders), and the number of classes counted
    (classes nobody holds are left out)."""
    hits, chance, counted = 0, 0.0, 0
    for index, column in enumerate(counts.columns):
        values = counts[column]
        holders = values[values > 0]
        if holders.empty:
            continue
        top = set(holders[holders == holders.max()].index.astype(str))
        counted += 1
        hits += picked[index] in top
        chance += len(top) / len(holders)
    if not counted:
        return float("nan"), float("nan"), 0
    return hits / counted, chance / counted, counted


def figure1_cells(data: FedCMCResults, params: Params) -> tuple[str | None, str | None, str]:
    """(FedAvg key, FedCMC key at the same point or None, a sentence saying which cell) for Fig 1."""
    fc = params.fedcmc
    if "fedavg" not in fc.methods:
        return None, None, "FedAvg is not in fedcmc.methods, so Fig 1 is not drawn."
    wanted = selected(data, TABLE, method="fedavg", dataset=fc.sweeps.dataset, alpha=fc.sweeps.alpha, seed=fc.seeds[0])
    note = ""
    if wanted.empty:
        wanted = selected(data, TABLE, method="fedavg").head(1)
        note = (f" (the sweeps' point {point_name(fc.sweeps.dataset, fc.sweeps.alpha)} is not in the main table, so the first "
                "FedAvg cell stands in)")
    row = wanted.iloc[0]
    other = selected(data, TABLE, method="fedcmc", dataset=row.dataset, alpha=row.alpha, seed=row.seed)
    text = f"FedAvg cell `{row['name']}`{note}; FedCMC's picks from `{other['name'].iloc[0]}`." if not other.empty else \
        f"FedAvg cell `{row['name']}`{note}; no FedCMC cell at this point."
    return row["key"], (other["key"].iloc[0] if not other.empty else None), text


def cell_counts(data: FedCMCResults, key: str) -> pd.DataFrame:
    """The training counts of a cell's partition, columns in the classifier's class order."""
    row = data.cells.set_index("key").loc[key]
    return data.partitions[row.partition].counts.reindex(columns=data.classes[row.dataset], fill_value=0)


def observation3_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """Per round: how often FedAvg's argmin_k d_{k,c} and FedCMC's picked client are class c's largest holder."""
    fedavg, fedcmc, _ = figure1_cells(data, params)
    if fedavg is None or not data.diagnostics[fedavg]:
        return pd.DataFrame()
    counts = cell_counts(data, fedavg)
    rows = {}
    for record in data.diagnostics[fedavg]:
        share, chance, counted = largest_holder_share(argmin_clients(record["similarity"], record["clients"]), counts)
        rows[record["round"]] = {"FedAvg: argmin_k d = largest holder": f"{share:.0%} of {counted}",
                                 "chance (1 / holders)": f"{chance:.0%}"}
    for record in data.diagnostics.get(fedcmc, []) if fedcmc else []:
        if record["vector_clients"]:
            share, _, counted = largest_holder_share(record["vector_clients"], counts)
            rows.setdefault(record["round"], {})["FedCMC: picked client = largest holder"] = f"{share:.0%} of {counted}"
    frame = pd.DataFrame.from_dict(rows, orient="index").fillna("-")
    frame.index.name = "round"
    return frame


def observation3_numbers(data: FedCMCResults, key: str, counts: pd.DataFrame, picks: str) -> dict[int, tuple[float, float, int]]:
    out = {}
    for record in data.diagnostics.get(key, []):
        picked = argmin_clients(record["similarity"], record["clients"]) if picks == "argmin" else record["vector_clients"]
        if picked:
            out[record["round"]] = largest_holder_share(picked, counts)
    return out


# ----- communication, partitions ------------------------------------------------------------------------------
def _comm_cell(data: FedCMCResults, params: Params, method: str) -> str | None:
    point, fc = figure_point(params), params.fedcmc
    fields = {"method": method, "seed": fc.seeds[0]}
    if point is not None:
        fields.update(dataset=point[0], alpha=point[1])
    frame = selected(data, TABLE, **fields)
    return frame["key"].iloc[0] if not frame.empty else None


def communication_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """Per method (one main-table cell each, the same point): uploading clients, bytes per round both ways
    (round 1 and later rounds apart: FedCMC's vectors travel from round 2), against FedAvg, parameters, the
    per-client state the engine keeps, and the training loss's first and last round."""
    table, base = {}, None
    for method in params.fedcmc.methods:
        key = _comm_cell(data, params, method)
        if key is None:
            continue
        rounds = data.rounds[data.rounds.key == key].sort_values("round")
        info = data.info[key]
        later = rounds[rounds["round"] > 1]
        up, down = float(rounds.bytes_up.mean()), float(later.bytes_down.mean() if len(later) else rounds.bytes_down.mean())
        if method == "fedavg":
            base = (up, down)
        table[method_label(method)] = {
            "clients / round": int(rounds.clients.iloc[0]),
            "bytes up / round": int(round(up)),
            "bytes down, round 1": int(rounds.bytes_down.iloc[0]),
            "bytes down / later round": int(round(down)),
            "params total": info["parameters"]["total"],
            "params uploaded": info["parameters"]["uploaded"],
            "private state / client max (B)": info["memory_bytes"]["private_per_client_max"],
            "private state, all clients (B)": info["memory_bytes"]["private_all_clients"],
            "loss on the training data, first -> last round": f"{rounds.fit_loss.iloc[0]:.3f} -> {rounds.fit_loss.iloc[-1]:.3f}",
        }
    frame = pd.DataFrame.from_dict(table, orient="index")
    if base is not None and not frame.empty:
        frame.insert(2, "up vs FedAvg", [f"{v / base[0]:.3f}x" for v in frame["bytes up / round"]])
        frame.insert(5, "down vs FedAvg (later)", [f"{v / base[1]:.3f}x" for v in frame["bytes down / later round"]])
    frame.index.name = "method"
    return frame


def fedcmc_extra_download(data: FedCMCResults, params: Params) -> str:
    """A sentence: FedCMC's measured extra download per client per round from round 2 against FedAvg's."""
    ours, theirs = _comm_cell(data, params, "fedcmc"), _comm_cell(data, params, "fedavg")
    if ours is None or theirs is None:
        return ""
    a = data.rounds[(data.rounds.key == ours) & (data.rounds["round"] > 1)]
    b = data.rounds[(data.rounds.key == theirs) & (data.rounds["round"] > 1)]
    if a.empty or b.empty:
        return ""
    row = data.cells.set_index("key").loc[ours]
    clients, classes = int(a.clients.iloc[0]), len(data.classes[row.dataset])
    extra = (a.bytes_down.mean() - b.bytes_down.mean()) / max(clients, 1)
    return (f"Measured: FedCMC downloads {extra:,.0f} bytes more than FedAvg per client per round from round 2 "
            f"({clients} clients); with C = {classes} classes that is {extra / classes:,.0f} bytes per class vector, "
            f"i.e. {extra / classes / 4:,.0f} float32 values = 2d.")


def partitions_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """Every partition the grid trains on: its draw, sentences, skew and how many clients got no training sentence."""
    users: dict[str, set[str]] = {}
    for _, row in data.cells.iterrows():
        users.setdefault(row.partition, set()).add("main table" if row.group == TABLE else f"sweep {row.group}")
    rows = {}
    for name, part in sorted(data.partitions.items()):
        totals = part.counts.sum(axis=1)
        sentences = part.info.get("sentences", {})
        rows[name] = {"dataset": part.info["dataset"], "alpha": f"{part.info['alpha']:g}", "clients": part.info["clients"],
                      "subset": part.info.get("subset") or "-",
                      "train / valid / test": f"{sentences.get('train', 0)} / {sentences.get('valid', 0)} / {sentences.get('test', 0)}",
                      "skew (JS distance)": f"{part.info['skew']:.3f}",
                      "clients without training sentences": int((totals == 0).sum()),
                      "smallest non-empty client": int(totals[totals > 0].min()) if (totals > 0).any() else 0,
                      "used by": ", ".join(sorted(users.get(name, set())))}
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "partition"
    return frame


# ----- claims -------------------------------------------------------------------------------------------------


# ----- outputs -----------------------------------------------------------------------------------------------
def results_frame(data: FedCMCResults) -> pd.DataFrame:
    """results.csv: one row per cell, its group and fields and test micro/macro-F1 and accuracy."""
    return data.cells.drop(columns="key")[["group"] + CELL_FIELDS + ["micro_f1", "macro_f1", "accuracy"]]


def summary_metrics(data: FedCMCResults, params: Params) -> dict:
    """metrics.json for `dvc exp show`: mean test micro-F1 over the main-table cells per method."""
    return {"f1": {m: round(mean_of(data, TABLE, method=m), 4) for m in params.fedcmc.methods}}


def _curves(data: FedCMCResults, group: str, selections: dict[str, dict]) -> pd.DataFrame:
    """Test micro-F1 per round (index) of each curve (column -> the fields selecting its cells), mean over seeds."""
    frame = pd.DataFrame({name: curve_of(data, group, **fields) for name, fields in selections.items()})
    frame.index.name = "round"
    return frame


def _convergence_selections(params: Params) -> dict[str, dict]:
    """Fig 3a's curves, one per method at the figure's point; none when the main table lacks the point."""
    point = figure_point(params)
    return {} if point is None else {m: dict(method=m, dataset=point[0], alpha=point[1]) for m in params.fedcmc.methods}


def _local_epochs_selections(params: Params) -> tuple[dict[str, dict], dict[str, dict]]:
    """Fig 3b's curves, one per (method, local epochs E), and their styles: a colour per method, a dash per E."""
    sw = params.fedcmc.sweeps
    selections, styles = {}, {}
    colours = {m: f"C{i}" for i, m in enumerate(sw.methods)}
    for method in sw.methods:
        for index, epochs in enumerate(sw.local_epochs):
            name = f"{method_label(method)}, E={epochs}"
            selections[name] = dict(method=method, local_epochs=epochs)
            styles[name] = {"color": colours[method], "linestyle": ("-", "--", ":", "-.")[index % 4]}
    return selections, styles


def _curves_figure(data: FedCMCResults, group: str, selections: dict[str, dict], labels: dict[str, str], title: str,
                   path: Path, target: float, styles: dict[str, dict] | None = None) -> None:
    """Fig 3a or 3b: each curve (``selections``, legend ``labels``) marked with its cells' health (``health_mark``),
    crossed at its end where one of them diverged (its end is no result), over the trivial baselines (Table 2's) of
    the cells' partition on their test set, which a curve must clear to have learned more than the prior."""
    marked = {name: labels[name] + health_mark(data, group, **fields) for name, fields in selections.items()}
    diverged = [marked[name] for name, fields in selections.items()
                if "diverged" in set(selected(data, group, **fields)["health"])]
    first = selected(data, group, **next(iter(selections.values()))).iloc[0]
    references = {f"{CHANCE}: {name}": scores["micro_f1"]
                  for name, scores in chance_scores(data, first.dataset, first.partition).items()}
    f1_curves_figure(_curves(data, group, selections).rename(columns=marked), title, path, target,
                     {marked[name]: style for name, style in (styles or {}).items()}, references, diverged)


def write_figures(data: FedCMCResults, params: Params, folder: Path) -> None:
    """PNGs and, for `dvc plots`, CSVs: Fig 1, Fig 3a, Fig 3b, Fig 4, and a copy of every partition's heat-map."""
    folder = Path(folder)
    fc = params.fedcmc
    fedavg, _, _ = figure1_cells(data, params)
    if fedavg is not None and data.diagnostics[fedavg]:
        row = data.cells.set_index("key").loc[fedavg]
        records = data.diagnostics[fedavg]
        classes = data.classes[row.dataset]
        tables = [pd.DataFrame(r["similarity"], index=r["clients"], columns=classes) for r in (records[0], records[-1])]
        counts = cell_counts(data, fedavg).reindex(index=records[0]["clients"], fill_value=0)
        similarity_figure(tables[0], tables[1], counts,
                          (f"d_(k,c), round {records[0]['round']}", f"d_(k,c), round {records[-1]['round']}",
                           f"training samples ({row.partition})"), folder / "fig1_similarity.png")
    convergence = _convergence_selections(params)
    if convergence:
        _curves_figure(data, TABLE, convergence, {m: method_label(m) for m in convergence},
                       f"Fig 3a: {point_name(*figure_point(params))}, test micro-F1 ({over_seeds(len(fc.seeds))})",
                       folder / "fig3a_convergence.png", fc.target_f1)
    _curves(data, TABLE, convergence).reindex(columns=list(fc.methods)).reset_index().to_csv(
        folder / "fig3a_convergence.csv", index=False, float_format="%.6f")
    if fc.sweeps.local_epochs:
        epochs, styles = _local_epochs_selections(params)
        _curves_figure(data, "local_epochs", epochs, {name: name for name in epochs},
                       f"Fig 3b: {point_name(fc.sweeps.dataset, fc.sweeps.alpha)}, local epochs E",
                       folder / "fig3b_local_epochs.png", fc.target_f1, styles)
        _curves(data, "local_epochs", epochs).reset_index().to_csv(folder / "fig3b_local_epochs.csv", index=False,
                                                                   float_format="%.6f")
    vectors = vectors_table(data, params)
    if not vectors.empty:
        partition = selected(data, "vectors", method="fedcmc")["partition"].iloc[0]
        trivial = {f"{CHANCE}: {name}": 100 * scores["micro_f1"]
                   for name, scores in chance_scores(data, fc.sweeps.dataset, partition).items()}
        marks = {rule: health_mark(data, "vectors", method="fedcmc", vectors=rule) for rule in vectors.index}
        bar_figure(vectors, f"Fig 4: FedCMC's vectors, {point_name(fc.sweeps.dataset, fc.sweeps.vectors_alpha)}", "test micro-F1 (%)",
                   folder / "fig4_vectors.png", len(fc.sweeps.seeds), trivial, marks)
    (vectors / 100).rename(columns={"mean": "micro_f1"}).reset_index().to_csv(folder / "fig4_vectors.csv", index=False, float_format="%.6f")
    (folder / "partitions").mkdir(exist_ok=True)
    for name, part in sorted(data.partitions.items()):
        shutil.copyfile(part.heatmap, folder / "partitions" / f"{name}.png")
