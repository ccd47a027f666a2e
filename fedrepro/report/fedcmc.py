"""FedCMC's report: Table 2, the clients table, Table 3, Figs 1, 3a, 3b and 4, the partitions, communication and
memory, and the claims table with paired bootstrap tests, from the cells' outputs and params only.

``load_fedcmc`` reads every cell the params ask for once into ``FedCMCResults`` (tidy frames); the functions
after it each build one table, figure or claim; ``render_report`` writes the markdown. Nothing here reads a
clock or an unseeded random source, so a rerun on the same cells gives the same bytes.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import f1_score

from fedrepro.config import Params
from fedrepro.errors import DataError
from fedrepro.fl.health import RULE, cell_health, training_losses
from fedrepro.hardware import describe
from fedrepro.fedcmc.cells import SWEEPS, Cell, sweep_points, table_cells
from fedrepro.io import read_json
from fedrepro.metrics.classification import trivial_scores
from fedrepro.metrics.summary import mean_std
from fedrepro.report.figures import bar_figure, f1_curves_figure, similarity_figure
from fedrepro.report.health import flagged_cells, mark_of
from fedrepro.report.results import missed_clients, missed_clients_section, verdict
from fedrepro.seeding import derive_seed

LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "moon": "MOON", "fedrs": "FedRS",
          "fedlc": "FedLC", "fedcmc": "FedCMC"}
DATASET_LABELS = {"i2b2": "2010 i2b2/VA", "chemprot_cpr5": "ChemProt (CPR)", "pgr": "PGR"}
PAPER_GAINS = {0.05: {"i2b2": 12.99, "chemprot_cpr5": 8.39, "pgr": 4.04},
               0.5: {"i2b2": 9.08, "chemprot_cpr5": 7.81, "pgr": 2.12}}
"""FedCMC − FedAvg F1 the paper reports (ANCHORS.md), by alpha and dataset."""
PAPER_ROUNDS = {"fedcmc": 5, "fedrs": 15, "fedavg": 20}
"""Rounds to 45% F1 at alpha 0.05 the paper reports (Fig 3a)."""
TABLE = "table"
RESAMPLES = 1000
BOOTSTRAP_SEED = 0
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


def _stage(group: str, cell: Cell) -> str:
    return "fedcmc_table" if group == TABLE else f"fedcmc_sweep@{group}"


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
                        f"cells are): run `dvc repro {_stage(owner(group, cell), cell)}`")
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
        classes.setdefault(part.info["dataset"], [str(c) for c in part.info["classes"]])
    negative = params.fedcmc.settings.negative_labels
    positive = {d: positive_labels(c, negative) for d, c in classes.items()}
    rows, rounds, predictions, diagnostics, info, missed = [], [], {}, {}, {}, []
    for group, cell in cells:
        folder, key, stage = cell_folder(root, owner(group, cell), cell), cell_key(group, cell), _stage(owner(group, cell), cell)
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


# ----- micro-F1 and the paired bootstrap ---------------------------------------------------------------------
def sentence_counts(gold, predicted, positive) -> np.ndarray:
    """Per sentence (tp, fp, fn) of micro-F1 over the ``positive`` classes, as scikit-learn counts them with
    ``labels=positive``: a hit on a positive class is a tp; a wrong positive prediction a fp; a positive gold
    label predicted wrong a fn (so a wrong positive-for-positive sentence is both)."""
    gold, predicted = np.asarray(gold, dtype=object), np.asarray(predicted, dtype=object)
    keep = set(positive)
    gold_pos = np.fromiter((g in keep for g in gold), bool, len(gold))
    pred_pos = np.fromiter((p in keep for p in predicted), bool, len(predicted))
    right = gold == predicted
    return np.stack([gold_pos & right, pred_pos & ~right, gold_pos & ~right], axis=1).astype(float)


def _f1(sums: np.ndarray) -> np.ndarray:
    """Micro-F1 from summed (tp, fp, fn) in the last axis; 0 where there is nothing to score (zero_division=0)."""
    tp, fp, fn = sums[..., 0], sums[..., 1], sums[..., 2]
    denominator = 2 * tp + fp + fn
    return np.divide(2 * tp, denominator, out=np.zeros_like(denominator, dtype=float), where=denominator > 0)


def micro_f1(gold, predicted, positive) -> float:
    return float(_f1(sentence_counts(gold, predicted, positive).sum(axis=0)))


@dataclass(frozen=True)
class Bootstrap:
    difference: float
    """the contrast on the full test sets (micro-F1, 0-1)."""
    low: float
    high: float
    """the 2.5% and 97.5% percentiles over the resamples."""
    sentences: int
    resamples: int
    seeds: int


def bootstrap_contrast(terms: list[tuple[float, str, list[pd.DataFrame]]], positive: dict[str, list[str]],
                       resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Bootstrap:
    """Paired bootstrap of sum_i weight_i * (micro-F1 of term i, averaged over its seeds' predictions).

    Each term is (weight, test set, [predictions of each seed]). The sentences of each test set (those every
    term on it scored, matched by sentence_id) are resampled with replacement once per resample and shared by
    all its terms and seeds, so the comparison is paired; a contrast over several test sets resamples each
    independently. A difference A − B is [(1, d, A), (−1, d, B)]; with one seed list per side of equal length
    the seed-mean of each side per resample equals the mean of the per-seed differences.
    """
    totals, point, sentences, seeds = np.zeros(resamples), 0.0, 0, 0
    for group in sorted({g for _, g, _ in terms}):
        members = [(w, frames) for w, g, frames in terms if g == group]
        ids = sorted(set.intersection(*[set(f["sentence_id"]) for _, frames in members for f in frames]))
        n = len(ids)
        if n == 0:
            raise DataError(f"bootstrap: the predictions on test set {group!r} share no sentence")
        rng = np.random.default_rng(derive_seed(seed, group))
        draws = rng.integers(0, n, size=(resamples, n))
        weights = np.bincount((draws + np.arange(resamples)[:, None] * n).ravel(), minlength=resamples * n)
        weights = weights.reshape(resamples, n).astype(float)
        for weight, frames in members:
            counts = [sentence_counts(*f.set_index("sentence_id").loc[ids, ["label", "predicted"]].to_numpy().T, positive[group])
                      for f in frames]
            stacked = np.concatenate(counts, axis=1)  # n x 3*seeds
            resampled = (weights @ stacked).reshape(resamples, len(frames), 3)
            totals += weight * _f1(resampled).mean(axis=1)
            point += weight * float(np.mean([_f1(c.sum(axis=0)) for c in counts]))
            seeds = max(seeds, len(frames))
        sentences += n
    low, high = np.percentile(totals, [2.5, 97.5])
    return Bootstrap(float(point), float(low), float(high), sentences, resamples, seeds)


def bootstrap_difference(better: list[pd.DataFrame], worse: list[pd.DataFrame], positive: list[str],
                         resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Bootstrap:
    """Micro-F1 of ``better`` minus ``worse`` on one test set (lists of per-seed predictions), paired bootstrap."""
    return bootstrap_contrast([(1.0, "test", better), (-1.0, "test", worse)], {"test": positive}, resamples, seed)


def interval_verdict(result: Bootstrap) -> str:
    """The claim 'the contrast is positive': holds if the 95% interval is above 0, reversed if below, else not
    significant (results.verdict's wording; 'no difference' when the predictions score exactly the same)."""
    if result.low > 0 or result.high < 0:
        return verdict(result.low if result.low > 0 else result.high, 0.0)
    if result.difference == 0 and result.low == result.high == 0:
        return "not significant (no difference)"
    return verdict(result.difference, 1.0)


def _test_text(result: Bootstrap, what: str = "") -> str:
    seeds = f"{result.seeds} seeds averaged within each resample" if result.seeds > 1 else "1 seed"
    return (f"paired bootstrap{what} over {result.sentences} test sentences ({result.resamples} resamples, {seeds}): "
            f"{_pts(result.difference)} points, 95% CI [{_pts(result.low)}, {_pts(result.high)}]")


# ----- selections and formatting ----------------------------------------------------------------------------
def _pct(value: float) -> str:
    return f"{100 * value:.2f}"


def _pts(value: float) -> str:
    return f"{100 * value:+.2f}"


def _fmt(values: list[float]) -> str:
    mean, std = mean_std(values)
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if len(values) > 1 else f"{100 * mean:.2f}"


def _label(method: str) -> str:
    return LABELS.get(method, method)


def _dataset_label(dataset: str) -> str:
    return DATASET_LABELS.get(dataset, dataset)


def _select(data: FedCMCResults, group: str, **fields) -> pd.DataFrame:
    frame = data.cells[data.cells.group == group]
    for name, value in fields.items():
        frame = frame[frame[name].isna()] if value is None else frame[frame[name] == value]
    return frame.sort_values("seed", kind="stable")


def _values(data: FedCMCResults, group: str, metric: str = "micro_f1", **fields) -> list[float]:
    return _select(data, group, **fields)[metric].tolist()


def _mean(data: FedCMCResults, group: str, metric: str = "micro_f1", **fields) -> float:
    values = _values(data, group, metric, **fields)
    return float(np.mean(values)) if values else float("nan")


def _frames(data: FedCMCResults, group: str, **fields) -> list[pd.DataFrame]:
    return [data.predictions[k] for k in _select(data, group, **fields)["key"]]


def _point(dataset: str, alpha: float) -> str:
    return f"{dataset} α={alpha:g}"


def _compare(data: FedCMCResults, finding: str, group: str, better: dict, worse: dict, dataset: str, what: str = "") -> dict:
    """One claims row: the cells ``better`` selects beat those ``worse`` selects (test micro-F1, paired bootstrap)."""
    a, b = _frames(data, group, **better), _frames(data, group, **worse)
    if not a or not b:
        return _not_run(finding, "its cells are not in this scale's grid")
    result = bootstrap_difference(a, b, data.positive[dataset])
    name = lambda sel: _label(sel["method"]) + (f" (vectors: {sel['vectors']})" if "vectors" in sel else "")  # noqa: E731
    return _guard(data, {"finding (paper)": finding,
                         "measured": f"{what}{name(better)} {_pct(_mean(data, group, **better))} vs {name(worse)} "
                                     f"{_pct(_mean(data, group, **worse))} micro-F1 ({_pts(result.difference)} points)",
                         "verdict": interval_verdict(result), "test": _test_text(result)}, group, better, worse)


def diverged_cells(data: FedCMCResults, group: str, *selections: dict) -> list[str]:
    """The names of the diverged cells among those the selections pick (``fedrepro.fl.health``'s rule)."""
    names = []
    for selection in selections:
        chosen = _select(data, group, **selection)
        names += chosen.loc[chosen["health"] == "diverged", "name"].tolist()
    return sorted(set(names))


def _guard(data: FedCMCResults, row: dict, group: str, *selections: dict) -> dict:
    """No claim rests on a diverged cell: its verdict says so instead of the test's."""
    diverged = diverged_cells(data, group, *selections)
    if diverged:
        row["verdict"] = f"inconclusive: rests on {len(diverged)} diverged cell(s) ({', '.join(diverged)})"
    return row


def health_mark(data: FedCMCResults, group: str, **fields) -> str:
    """† if any selected cell diverged, ° if any had not converged (``fedrepro.fl.health``), else nothing."""
    return mark_of(_select(data, group, **fields)["health"])


def health_table(data: FedCMCResults) -> pd.DataFrame:
    """Every cell that diverged or had not converged, once (a sweep point may be a main-table cell), with the reason."""
    return flagged_cells(data.cells)



def identical_predictions(data: FedCMCResults, params: Params) -> list[str]:
    """Main-table points where different methods' cells predicted every test sentence alike (same seed): different
    algorithms rarely agree sentence for sentence unless their models collapsed onto the same few answers."""
    groups = []
    for dataset, alpha in main_points(params):
        for seed in params.fedcmc.seeds:
            cells = _select(data, TABLE, dataset=dataset, alpha=alpha, seed=seed)
            alike: dict[tuple, list[str]] = {}
            for key, method in zip(cells["key"], cells["method"]):
                alike.setdefault(tuple(data.predictions[key]["predicted"]), []).append(_label(method))
            groups += [f"{_point(dataset, alpha)} seed {seed}: {', '.join(m)}" for m in alike.values() if len(m) > 1]
    return groups


def _not_run(finding: str, why: str = "") -> dict:
    return {"finding (paper)": finding, "measured": "not run at this scale" + (f": {why}" if why else ""),
            "verdict": "not run at this scale", "test": "-"}


# ----- tables ---------------------------------------------------------------------------------------------
def chance_scores(data: FedCMCResults, dataset: str, partition: str) -> dict[str, dict[str, float]]:
    """The trivial baselines on the dataset's test set (``fedrepro.metrics.classification``): always the most
    frequent positive training class of the partition, and stratified random guessing from its training prior.
    What a model that learned nothing but the prior scores; the majority class itself is no baseline here when it
    is the excluded no-relation class (it scores 0)."""
    totals = data.partitions[partition].counts.sum(axis=0)
    key = data.cells[data.cells.dataset == dataset]["key"].iloc[0]
    return trivial_scores(data.predictions[key]["label"], totals.to_dict(), data.positive[dataset])


def chance_level(data: FedCMCResults, dataset: str, partition: str, metric: str = "micro_f1") -> float:
    """The best trivial baseline: a method must clear this to have learned anything."""
    return max(scores[metric] for scores in chance_scores(data, dataset, partition).values())


def main_points(params: Params) -> list[tuple[str, float]]:
    return [(d, a) for d in params.fedcmc.datasets for a in params.fedcmc.alphas]


def main_table(data: FedCMCResults, params: Params, metric: str) -> pd.DataFrame:
    """Table 2: methods x (dataset, alpha), 'mean ± std' over seeds of test ``metric`` in %, a chance row, and
    for micro-F1 the measured FedCMC − FedAvg gap beside the paper's."""
    fc = params.fedcmc
    table = {}
    for method in fc.methods:
        table[_label(method)] = {_point(d, a): _fmt(_values(data, TABLE, metric, method=method, dataset=d, alpha=a))
                                 + health_mark(data, TABLE, method=method, dataset=d, alpha=a) for d, a in main_points(params)}
    part = lambda d, a: Cell("fedavg", d, a, fc.settings.clients, fc.settings.local_epochs, 0).partition  # noqa: E731
    for d, a in main_points(params):
        for name, scores in chance_scores(data, d, part(d, a)).items():
            table.setdefault(f"{CHANCE}: {name}", {})[_point(d, a)] = _pct(scores[metric])
    if metric == "micro_f1" and {"fedavg", "fedcmc"} <= set(fc.methods):
        table["FedCMC − FedAvg (measured, points)"] = {
            _point(d, a): _pts(_mean(data, TABLE, method="fedcmc", dataset=d, alpha=a) - _mean(data, TABLE, method="fedavg", dataset=d, alpha=a))
            for d, a in main_points(params)}
        table["FedCMC − FedAvg (paper)"] = {_point(d, a): (f"+{PAPER_GAINS[a][d]:.2f}" if d in PAPER_GAINS.get(a, {}) else "-")
                                            for d, a in main_points(params)}
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.name = "method"
    return frame


def sweep_table(data: FedCMCResults, sweep: str, rows: list[str], column: str, values: list, metric: str = "micro_f1",
                **fixed) -> pd.DataFrame:
    """Methods x sweep points, 'mean ± std' over the sweep's seeds of test ``metric`` in %."""
    table = {}
    for method in rows:
        table[_label(method)] = {str(v): _fmt(_values(data, sweep, metric, method=method, **{column: v}, **fixed)) for v in values}
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.name = "method"
    return frame


def rounds_to_target(curve: pd.Series, target: float) -> int | None:
    """The first evaluated round (index) whose test micro-F1 reaches ``target``; None if none does."""
    curve = curve.dropna().sort_index()
    reached = curve[curve >= target]
    return int(reached.index[0]) if len(reached) else None


def _curve(data: FedCMCResults, group: str, metric: str = "micro_f1", **fields) -> pd.Series:
    """Test ``metric`` per round, mean over the selected cells (seeds); evaluated rounds only."""
    keys = _select(data, group, **fields)["key"]
    frame = data.rounds[data.rounds.key.isin(keys)]
    return frame.groupby("round")[metric].mean().dropna()


def _rounds_text(rounds: int | None, total: int) -> str:
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
        curve = _curve(data, TABLE, method=method, dataset=point[0], alpha=point[1])
        reached = rounds_to_target(curve, fc.target_f1)
        rows[_label(method)] = {f"rounds to {100 * fc.target_f1:g}% micro-F1": _rounds_text(reached, fc.settings.rounds),
                                "paper (i2b2, α=0.05)": str(PAPER_ROUNDS.get(method, "-")),
                                "best round micro-F1": _pct(curve.max()) if len(curve) else "-",
                                "last round micro-F1": _pct(curve.iloc[-1]) if len(curve) else "-"}
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
        speed[_label(method)] = {f"E={e}": _rounds_text(rounds_to_target(_curve(data, "local_epochs", method=method, local_epochs=e),
                                                                           fc.target_f1), fc.settings.rounds)
                                 for e in sw.local_epochs}
    speed_frame = pd.DataFrame.from_dict(speed, orient="index")
    speed_frame.index.name = "method"
    return final, speed_frame


def vectors_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """Fig 4: test micro-F1 (%) of FedCMC per vector rule, mean and std over the sweep's seeds."""
    rows = {}
    for rule in params.fedcmc.sweeps.vectors:
        mean, std = mean_std(_values(data, "vectors", method="fedcmc", vectors=rule))
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
    wanted = _select(data, TABLE, method="fedavg", dataset=fc.sweeps.dataset, alpha=fc.sweeps.alpha, seed=fc.seeds[0])
    note = ""
    if wanted.empty:
        wanted = _select(data, TABLE, method="fedavg").head(1)
        note = (f" (the sweeps' point {_point(fc.sweeps.dataset, fc.sweeps.alpha)} is not in the main table, so the first "
                "FedAvg cell stands in)")
    row = wanted.iloc[0]
    other = _select(data, TABLE, method="fedcmc", dataset=row.dataset, alpha=row.alpha, seed=row.seed)
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


def _observation3_numbers(data: FedCMCResults, key: str, counts: pd.DataFrame, picks: str) -> dict[int, tuple[float, float, int]]:
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
    frame = _select(data, TABLE, **fields)
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
        table[_label(method)] = {
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
def _methods_present(params: Params, *methods: str) -> bool:
    return set(methods) <= set(params.fedcmc.methods)


def claims_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    fc = params.fedcmc
    rows: list[dict] = []
    # (a), (b): FedCMC over FedAvg at each alpha the paper reports, per dataset; other grid alphas after them
    for alpha in [0.05, 0.5] + [a for a in fc.alphas if a not in (0.05, 0.5)]:
        for dataset in fc.datasets:
            paper = PAPER_GAINS.get(alpha, {}).get(dataset)
            finding = f"Table 2: FedCMC beats FedAvg on {_dataset_label(dataset)} at α={alpha:g}" + (
                f" (paper: +{paper:.2f} F1)" if paper is not None else
                " (the paper reports no number for this dataset)" if alpha in PAPER_GAINS else " (α of the paper's set-up; no number reported)")
            if alpha not in fc.alphas:
                rows.append(_not_run(finding, f"α={alpha:g} is not in fedcmc.alphas"))
            elif not _methods_present(params, "fedcmc", "fedavg"):
                rows.append(_not_run(finding, "FedCMC or FedAvg is not in fedcmc.methods"))
            else:
                rows.append(_compare(data, finding, TABLE, dict(method="fedcmc", dataset=dataset, alpha=alpha),
                                     dict(method="fedavg", dataset=dataset, alpha=alpha), dataset))
    # (c) FedCMC is the best method at every dataset x alpha
    if "fedcmc" in fc.methods and len(fc.methods) > 1:
        for dataset, alpha in main_points(params):
            others = [m for m in fc.methods if m != "fedcmc"]
            strongest = max(others, key=lambda m: (_mean(data, TABLE, method=m, dataset=dataset, alpha=alpha), -others.index(m)))
            row = _compare(data, f"Table 2: FedCMC is the best method on {_dataset_label(dataset)} at α={alpha:g}", TABLE,
                           dict(method="fedcmc", dataset=dataset, alpha=alpha), dict(method=strongest, dataset=dataset, alpha=alpha),
                           dataset, what=f"strongest other method: {_label(strongest)}; ")
            if _mean(data, TABLE, method="fedcmc", dataset=dataset, alpha=alpha) < _mean(data, TABLE, method=strongest, dataset=dataset, alpha=alpha):
                row["verdict"] = f"does not hold (vs the best: {row['verdict']})"
            rows.append(row)
    else:
        rows.append(_not_run("Table 2: FedCMC is the best method at every dataset and α", "FedCMC or its rivals are not in fedcmc.methods"))
    # (d) FedRS and FedLC beat FedAvg and MOON (pooled over the main table's points)
    for better in ("fedrs", "fedlc"):
        for worse in ("fedavg", "moon"):
            finding = f"Table 2: {_label(better)} is significantly better than {_label(worse)}"
            if not _methods_present(params, better, worse):
                rows.append(_not_run(finding, f"{_label(better)} or {_label(worse)} is not in fedcmc.methods"))
                continue
            points = main_points(params)
            terms = [(s / len(points), d, _frames(data, TABLE, method=m, dataset=d, alpha=a))
                     for d, a in points for m, s in ((better, 1.0), (worse, -1.0))]
            result = bootstrap_contrast(terms, data.positive)
            mean = lambda m: float(np.mean([_mean(data, TABLE, method=m, dataset=d, alpha=a) for d, a in points]))  # noqa: E731
            rows.append(_guard(data, {
                "finding (paper)": finding,
                "measured": f"mean over {len(points)} dataset x α points: {_label(better)} {_pct(mean(better))} vs "
                            f"{_label(worse)} {_pct(mean(worse))} micro-F1 ({_pts(result.difference)} points)",
                "verdict": interval_verdict(result),
                "test": _test_text(result, ", sentences resampled within each dataset's test set, mean of the per-point differences")},
                TABLE, *[dict(method=m, dataset=d, alpha=a) for d, a in points for m in (better, worse)]))
    # (e) rounds to the target F1
    rows += _rounds_claims(data, params)
    # (f) the vector ablation
    rows += _vector_claims(data, params)
    # (g) the FedCMC − FedAvg gap grows with the clients; FedCMC best at every client count
    rows += _clients_claims(data, params)
    # (h) the subsets
    rows += _subset_claims(data, params)
    # (i) FedAvg loses more than FedCMC from α=0.5 to 0.05
    for dataset in fc.datasets:
        finding = f"FedAvg loses more F1 than FedCMC from α=0.5 to α=0.05 on {_dataset_label(dataset)}"
        if not {0.05, 0.5} <= set(fc.alphas) or not _methods_present(params, "fedavg", "fedcmc"):
            rows.append(_not_run(finding, "needs α 0.05 and 0.5 and both methods in the main table"))
            continue
        sel = lambda m, a: _frames(data, TABLE, method=m, dataset=dataset, alpha=a)  # noqa: E731
        terms = [(1.0, dataset, sel("fedavg", 0.5)), (-1.0, dataset, sel("fedavg", 0.05)),
                 (-1.0, dataset, sel("fedcmc", 0.5)), (1.0, dataset, sel("fedcmc", 0.05))]
        result = bootstrap_contrast(terms, data.positive)
        drop = lambda m: _mean(data, TABLE, method=m, dataset=dataset, alpha=0.05) - _mean(data, TABLE, method=m, dataset=dataset, alpha=0.5)  # noqa: E731
        rows.append(_guard(data, {"finding (paper)": finding,
                                  "measured": f"α 0.5 -> 0.05: FedAvg {_pts(drop('fedavg'))}, FedCMC {_pts(drop('fedcmc'))} points",
                                  "verdict": interval_verdict(result),
                                  "test": _test_text(result, " of the difference of the two drops")},
                           TABLE, *[dict(method=m, dataset=dataset, alpha=a) for m in ("fedavg", "fedcmc") for a in (0.05, 0.5)]))
    # (j) Observation 3
    rows += _observation3_claims(data, params)
    return pd.DataFrame(rows, columns=["finding (paper)", "measured", "verdict", "test"])


def _rounds_claims(data: FedCMCResults, params: Params) -> list[dict]:
    fc = params.fedcmc
    point, target, total = figure_point(params), fc.target_f1, fc.settings.rounds
    rows = []
    for rival in ("fedavg", "fedrs"):
        finding = (f"Fig 3a: FedCMC reaches {100 * target:g}% F1 in fewer rounds than {_label(rival)} "
                   f"(paper, α=0.05: FedCMC {PAPER_ROUNDS['fedcmc']}, {_label(rival)} {PAPER_ROUNDS[rival]})")
        if point is None or not _methods_present(params, "fedcmc", rival):
            rows.append(_not_run(finding, "the sweeps' point or a method is not in the main table"))
            continue
        if not fc.settings.eval_every:
            rows.append(_not_run(finding, "fedcmc.settings.eval_every = 0 (no per-round test F1)"))
            continue
        ours = rounds_to_target(_curve(data, TABLE, method="fedcmc", dataset=point[0], alpha=point[1]), target)
        theirs = rounds_to_target(_curve(data, TABLE, method=rival, dataset=point[0], alpha=point[1]), target)
        if ours is None and theirs is None:
            result = "not measurable (neither reaches the target)"
        elif ours is not None and (theirs is None or ours < theirs):
            result = "holds (descriptive)"
        else:
            result = "does not hold (descriptive)"
        rows.append(_guard(data, {
            "finding (paper)": finding,
            "measured": f"{_point(*point)}: FedCMC {_rounds_text(ours, total)}, {_label(rival)} {_rounds_text(theirs, total)} "
                        "(rounds, seed-mean curve)",
            "verdict": result, "test": "descriptive (no test): first evaluated round at or above the target"},
            TABLE, *[dict(method=m, dataset=point[0], alpha=point[1]) for m in ("fedcmc", rival)]))
    finding = "Fig 3b: more local epochs speed FedCMC up, not FedAvg or FedRS"
    sw = fc.sweeps
    if len(sw.local_epochs) < 2 or not fc.settings.eval_every:
        rows.append(_not_run(finding, "fedcmc.sweeps.local_epochs has fewer than 2 points or eval_every = 0"))
    else:
        low, high = min(sw.local_epochs), max(sw.local_epochs)
        speed = {m: (rounds_to_target(_curve(data, "local_epochs", method=m, local_epochs=low), target),
                     rounds_to_target(_curve(data, "local_epochs", method=m, local_epochs=high), target)) for m in sw.methods}
        faster = {m: (b if b is not None else total + 1) < (a if a is not None else total + 1) for m, (a, b) in speed.items()}
        measured = "; ".join(f"{_label(m)} E={low}: {_rounds_text(a, total)}, E={high}: {_rounds_text(b, total)}" for m, (a, b) in speed.items())
        if "fedcmc" not in speed:
            result = "not run at this scale (FedCMC not in sweeps.methods)"
        else:
            result = "holds (descriptive)" if faster["fedcmc"] and not any(v for m, v in faster.items() if m != "fedcmc") \
                else "does not hold (descriptive)"
        rows.append(_guard(data, {"finding (paper)": finding, "measured": f"rounds to {100 * target:g}%: " + measured,
                                  "verdict": result,
                                  "test": "descriptive (no test): rounds to the target at the fewest and most local epochs"},
                           "local_epochs", *[dict(method=m) for m in sw.methods]))
    return rows


def _vector_claims(data: FedCMCResults, params: Params) -> list[dict]:
    sw = params.fedcmc.sweeps
    dataset, rows = sw.dataset, []
    where = f" ({_dataset_label(dataset)}, α={sw.vectors_alpha:g})"
    for better, worse, finding in (("major", "random", "Fig 4: major vectors beat random vectors"),
                                   ("major", "minor", "Fig 4: major vectors beat minor vectors"),
                                   ("none", "minor", "Fig 4: minor vectors are worse than none (FedAvg)")):
        if not {better, worse} <= set(sw.vectors):
            rows.append(_not_run(finding + where, "a rule is not in fedcmc.sweeps.vectors"))
            continue
        rows.append(_compare(data, finding + where, "vectors", dict(method="fedcmc", vectors=better),
                             dict(method="fedcmc", vectors=worse), dataset))
    return rows


def _clients_claims(data: FedCMCResults, params: Params) -> list[dict]:
    sw = params.fedcmc.sweeps
    rows = []
    finding = "Clients table: the FedCMC − FedAvg gap grows from 10 to 50 clients"
    if len(sw.clients) < 2 or not {"fedcmc", "fedavg"} <= set(sw.methods):
        rows.append(_not_run(finding, "needs 2 client counts and FedCMC and FedAvg in fedcmc.sweeps.methods"))
    else:
        low, high = min(sw.clients), max(sw.clients)
        sel = lambda m, k: _frames(data, "clients", method=m, clients=k)  # noqa: E731
        terms = [(1.0, sw.dataset, sel("fedcmc", high)), (-1.0, sw.dataset, sel("fedavg", high)),
                 (-1.0, sw.dataset, sel("fedcmc", low)), (1.0, sw.dataset, sel("fedavg", low))]
        result = bootstrap_contrast(terms, data.positive)
        gap = lambda k: _mean(data, "clients", method="fedcmc", clients=k) - _mean(data, "clients", method="fedavg", clients=k)  # noqa: E731
        rows.append(_guard(data, {"finding (paper)": finding,
                                  "measured": "gap " + ", ".join(f"{_pts(gap(k))} at {k}" for k in sw.clients) + " clients (points)",
                                  "verdict": interval_verdict(result),
                                  "test": _test_text(result, f" of gap({high}) − gap({low})")},
                           "clients", *[dict(method=m) for m in ("fedcmc", "fedavg")]))
    if "fedcmc" in sw.methods and len(sw.methods) > 1:
        for k in sw.clients:
            if k == params.fedcmc.settings.clients:
                continue
            others = [m for m in sw.methods if m != "fedcmc"]
            strongest = max(others, key=lambda m: (_mean(data, "clients", method=m, clients=k), -others.index(m)))
            row = _compare(data, f"Clients table: FedCMC is the best method with {k} clients", "clients",
                           dict(method="fedcmc", clients=k), dict(method=strongest, clients=k), sw.dataset,
                           what=f"strongest other: {_label(strongest)}; ")
            if _mean(data, "clients", method="fedcmc", clients=k) < _mean(data, "clients", method=strongest, clients=k):
                row["verdict"] = f"does not hold (vs the best: {row['verdict']})"
            rows.append(row)
    return rows


def _subset_claims(data: FedCMCResults, params: Params) -> list[dict]:
    sw = params.fedcmc.sweeps
    rows, dataset = [], sw.subset_dataset
    rivals = [m for m in ("fedrs", "fedlc") if m in sw.subset_methods]
    for mode in ("balanced", "natural"):
        for rival in ("fedrs", "fedlc"):
            if mode == "balanced":
                finding = f"Table 3: on the balanced {sw.subset_size}-sentence subset {_label(rival)} is close to FedCMC"
            else:
                finding = f"Table 3: on the natural {sw.subset_size}-sentence subset FedCMC is ahead of {_label(rival)}"
            if mode not in sw.subset_modes or rival not in rivals or "fedcmc" not in sw.subset_methods:
                rows.append(_not_run(finding, "its mode or methods are not in fedcmc.sweeps"))
                continue
            selections = (dict(method="fedcmc", subset=mode), dict(method=rival, subset=mode))
            row = _compare(data, finding, "subsets", *selections, dataset)
            if mode == "balanced":
                result = bootstrap_difference(_frames(data, "subsets", method="fedcmc", subset=mode),
                                              _frames(data, "subsets", method=rival, subset=mode), data.positive[dataset])
                if result.low <= 0 <= result.high:
                    row["verdict"] = "holds (no significant difference; not a proof of equivalence)"
                else:
                    row["verdict"] = "does not hold (FedCMC significantly " + ("ahead)" if result.low > 0 else "behind)")
            rows.append(_guard(data, row, "subsets", *selections))
    return rows


def _observation3_claims(data: FedCMCResults, params: Params) -> list[dict]:
    finding = "Observation 3 (Fig 1): in every round the client holding most of class c has the smallest d_{k,c}"
    fedavg, fedcmc, which = figure1_cells(data, params)
    if fedavg is None or not data.diagnostics.get(fedavg):
        return [_not_run(finding, "no FedAvg cell with per-round diagnostics")]
    row = data.cells.set_index("key").loc[fedavg]
    counts = cell_counts(data, fedavg)
    numbers = _observation3_numbers(data, fedavg, counts, "argmin")
    first, last = min(numbers), max(numbers)
    measured = "; ".join(f"round {r}: {numbers[r][0]:.0%} of {numbers[r][2]} classes (chance {numbers[r][1]:.0%})" for r in (first, last))
    holds = all(numbers[r][0] > numbers[r][1] for r in (first, last))
    rows = [{"finding (paper)": finding, "measured": f"FedAvg `{row['name']}`: " + measured,
             "verdict": "holds (descriptive: above chance in the first and last round)" if holds else "does not hold (descriptive)",
             "test": "descriptive (no test): share of classes whose argmin_k d_{k,c} is the largest holder vs a uniform pick among holders"}]
    if fedcmc is not None:
        picks = _observation3_numbers(data, fedcmc, counts, "vector_clients")
        if picks:
            shares = [v[0] for v in picks.values()]
            chance = next(iter(picks.values()))[1]
            rows.append({"finding (paper)": "FedCMC's major vector of class c comes from the class's largest holder",
                         "measured": f"FedCMC `{data.cells.set_index('key').loc[fedcmc, 'name']}`: {np.mean(shares):.0%} of classes over "
                                     f"{len(picks)} rounds ({min(shares):.0%} to {max(shares):.0%}; chance {chance:.0%})",
                         "verdict": "holds (descriptive: above chance)" if np.mean(shares) > chance else "does not hold (descriptive)",
                         "test": "descriptive (no test): `vector_clients` of each round against the training counts"})
    return rows


# ----- outputs -----------------------------------------------------------------------------------------------
def results_frame(data: FedCMCResults) -> pd.DataFrame:
    """results.csv: one row per cell, its group and fields and test micro/macro-F1 and accuracy."""
    return data.cells.drop(columns="key")[["group"] + CELL_FIELDS + ["micro_f1", "macro_f1", "accuracy"]]


def summary_metrics(data: FedCMCResults, params: Params) -> dict:
    """metrics.json for `dvc exp show`: mean test micro-F1 over the main-table cells per method."""
    return {"f1": {m: round(_mean(data, TABLE, method=m), 4) for m in params.fedcmc.methods}}


def _convergence_frame(data: FedCMCResults, params: Params) -> pd.DataFrame:
    point = figure_point(params)
    if point is None:
        return pd.DataFrame()
    frame = pd.DataFrame({m: _curve(data, TABLE, method=m, dataset=point[0], alpha=point[1]) for m in params.fedcmc.methods})
    frame.index.name = "round"
    return frame


def _local_epochs_frame(data: FedCMCResults, params: Params) -> tuple[pd.DataFrame, dict[str, dict]]:
    sw = params.fedcmc.sweeps
    columns, styles = {}, {}
    colours = {m: f"C{i}" for i, m in enumerate(sw.methods)}
    for method in sw.methods:
        for index, epochs in enumerate(sw.local_epochs):
            name = f"{_label(method)}, E={epochs}"
            columns[name] = _curve(data, "local_epochs", method=method, local_epochs=epochs)
            styles[name] = {"color": colours[method], "linestyle": ("-", "--", ":", "-.")[index % 4]}
    frame = pd.DataFrame(columns)
    frame.index.name = "round"
    return frame, styles


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
    convergence = _convergence_frame(data, params)
    if not convergence.empty:
        renamed = convergence.rename(columns=LABELS)
        f1_curves_figure(renamed, f"Fig 3a: {_point(*figure_point(params))}, test micro-F1 ({_over_seeds(len(fc.seeds))})",
                         folder / "fig3a_convergence.png", fc.target_f1)
    convergence.reindex(columns=list(fc.methods)).reset_index().to_csv(folder / "fig3a_convergence.csv", index=False, float_format="%.6f")
    if fc.sweeps.local_epochs:
        frame, styles = _local_epochs_frame(data, params)
        f1_curves_figure(frame, f"Fig 3b: {_point(fc.sweeps.dataset, fc.sweeps.alpha)}, local epochs E", folder / "fig3b_local_epochs.png",
                         fc.target_f1, styles)
        frame.reset_index().to_csv(folder / "fig3b_local_epochs.csv", index=False, float_format="%.6f")
    vectors = vectors_table(data, params)
    if not vectors.empty:
        bar_figure(vectors, f"Fig 4: FedCMC's vectors, {_point(fc.sweeps.dataset, fc.sweeps.vectors_alpha)}", "test micro-F1 (%)",
                   folder / "fig4_vectors.png")
    (vectors / 100).rename(columns={"mean": "micro_f1"}).reset_index().to_csv(folder / "fig4_vectors.csv", index=False, float_format="%.6f")
    (folder / "partitions").mkdir(exist_ok=True)
    for name, part in sorted(data.partitions.items()):
        shutil.copyfile(part.heatmap, folder / "partitions" / f"{name}.png")


# ----- the report ------------------------------------------------------------------------------------------
def _backbone_text(params: Params) -> str:
    settings = params.fedcmc.settings
    if settings.backbone == "tiny":
        tiny = params.model.tiny
        return (f"`tiny` (a BERT initialised at random: {tiny.layers} layers, hidden {tiny.hidden}, {tiny.heads} heads, "
                f"WordPiece vocabulary trained on the corpora's training text)")
    if settings.backbone == "minilm":
        text = "`minilm` (the packaged pretrained all-MiniLM-L6-v2)"
    else:
        text = f"`{settings.backbone}`"
    return text + (f", lowest {settings.keep_layers} encoder layers kept" if settings.keep_layers else "")


def _over_seeds(count: int) -> str:
    return f"mean ± std over {count} seeds" if count > 1 else "1 seed"


def _not_run_text(sweep: str) -> list[str]:
    return [f"Not run at this scale (`fedcmc.sweeps.{sweep}` is empty).", ""]


def _empty_clients(data: FedCMCResults) -> str:
    parts = []
    for name, part in sorted(data.partitions.items()):
        totals = part.counts.sum(axis=1)
        parts.append(f"{name}: {int((totals == 0).sum())} of {len(totals)}")
    return "; ".join(parts)


def _dataset_lines(data: FedCMCResults, params: Params) -> list[str]:
    negative = params.fedcmc.settings.negative_labels
    lines = []
    for dataset in sorted(data.classes):
        classes = data.classes[dataset]
        present = [c for c in classes if c in set(negative)]
        part = next(p for _, p in sorted(data.partitions.items()) if p.info["dataset"] == dataset and not p.info.get("subset"))
        sentences = part.info.get("sentences", {})
        lines.append(f"  - `{dataset}`" + (f" ({DATASET_LABELS[dataset]})" if dataset in DATASET_LABELS else " (not one of the paper's corpora)")
                     + f": {len(classes)} classes ({', '.join(classes)}); {sentences.get('train', 0)} train / {sentences.get('valid', 0)} "
                     f"valid / {sentences.get('test', 0)} test sentences after the caps; "
                     + (f"negative label(s) {', '.join(present)} left out of F1." if present else
                        "none of the negative labels occurs, so every class counts and micro-F1 = accuracy."))
    return lines


def _closing(data: FedCMCResults, params: Params, claims: pd.DataFrame) -> list[str]:
    fc = params.fedcmc
    part = lambda d, a: Cell("fedavg", d, a, fc.settings.clients, fc.settings.local_epochs, 0).partition  # noqa: E731
    lines = []
    synthetic = [d for d in fc.datasets if d not in DATASET_LABELS]
    if synthetic:
        lines.append(f"The main table runs on {', '.join(f'`{d}`' for d in synthetic)}, which is not one of the paper's corpora: "
                     "these numbers test the pipeline and the direction of the effects, not the paper's values.")
    near = []
    for dataset, alpha in main_points(params):
        chance = chance_level(data, dataset, part(dataset, alpha))
        for method in fc.methods:
            value = _mean(data, TABLE, method=method, dataset=dataset, alpha=alpha)
            if value - chance < 0.01:
                near.append(f"{_label(method)} at {_point(dataset, alpha)} ({_pct(value)} vs {_pct(chance)})")
    if near:
        lines.append("These main-table cells score less than 1 point above the better trivial baseline (always the "
                     "commonest positive class, or stratified random; or below it), so training learned little beyond the prior there and comparisons involving them say "
                     "little about the methods: " + "; ".join(near) + ".")
    else:
        lines.append("Every main-table cell scores more than 1 point above the better trivial baseline.")
    widths = [float(high) - float(low) for low, high in re.findall(r"95% CI \[([+-][0-9.]+), ([+-][0-9.]+)\]", "\n".join(claims["test"]))]
    if widths:
        lines.append(f"The 95% bootstrap intervals of the tested claims are {np.median(widths):.2f} points wide (median): "
                     "a smaller difference cannot be told from the choice of test sentences here.")
    single = [name for name, seeds in (("main-table", fc.seeds), ("sweep", fc.sweeps.seeds)) if len(seeds) == 1]
    if single:
        lines.append(f"The {' and '.join(single)} cells have one training seed each: their intervals cover the sampling of test "
                     "sentences only, not the spread between training runs, which in small federated runs is often as large "
                     "as the differences between methods.")
    verdicts = claims["verdict"]
    tested = verdicts[~verdicts.str.startswith("not run")]
    counts = {k: int(tested.str.startswith(k).sum()) for k in ("holds", "does not hold", "not significant", "not measurable")}
    lines.append(f"Of {len(verdicts)} claims rows, {len(verdicts) - len(tested)} are not run at this scale; of the rest "
                 f"{counts['holds']} hold, {counts['does not hold']} do not hold, {counts['not significant']} not significant"
                 + (f", {counts['not measurable']} not measurable" if counts["not measurable"] else "") + ".")
    if fc.settings.rounds < max(PAPER_ROUNDS.values()):
        lines.append(f"The run has {fc.settings.rounds} rounds; the paper's Fig 3a numbers reach {max(PAPER_ROUNDS.values())} "
                     "rounds, so the convergence claims are checked on a much shorter horizon and a method 'not reached' here "
                     "may still reach the target later.")
    return [" ".join(lines), ""]


def render_report(params: Params, data: FedCMCResults) -> str:
    fc, settings, sw, train, knobs = params.fedcmc, params.fedcmc.settings, params.fedcmc.sweeps, params.train, params.algorithms
    truncated = max(int(i.get("truncated_train_sentences", 0)) for i in data.info.values())
    scheme = {"dirichlet": "Dirichlet per class (each class's training sentences split among the clients by p_c ~ Dir_K(α))",
              "iid": "IID (uniform)", "quantity": "quantity skew"}[settings.partition]
    lines = [
        f"# FedCMC — reproduction at scale `{params.scale}`",
        "",
        f"Written by the `fedcmc_report` stage at scale `{params.scale}` from the cells' own outputs; nothing is typed in by hand. "
        "Paper: FedCMC (Zhang et al., federated contrastive learning with major classifier vectors for medical relation "
        "extraction; arXiv 2301.05376, Applied Intelligence 2023; no public code). Its absolute numbers are not comparable "
        "with these (other data sizes, backbone and budget); the claims table checks its stated relative findings.",
        "",
        "## Setup",
        "",
        "- Datasets:",
        *_dataset_lines(data, params),
        f"- Caps: at most {settings.max_train_sentences or 'all'} training and {settings.max_eval_sentences or 'all'} valid/test "
        f"sentences per corpus (a seeded sample keeping the label mix); {truncated} training sentences were longer than "
        f"{settings.max_length} tokens and were cut (the most in any one cell).",
        f"- Grid: α in {', '.join(f'{a:g}' for a in fc.alphas)}; {settings.clients} clients; {settings.rounds} rounds; "
        f"{settings.local_work()}; every client "
        "trains every round. Seeds: main table "
        f"{', '.join(map(str, fc.seeds))}; sweeps {', '.join(map(str, sw.seeds))}. The paper: 10 clients, 1 local epoch, "
        "3 seeds, lr 5e-5, batch 8, DistilBERT.",
        f"- Model: relation classifier on {_backbone_text(params)}, max length {settings.max_length}; entity markers "
        "`<e1>..</e1>`, `<e2>..</e2>` as added tokens, each entity the sum of its word-piece outputs, the relation "
        f"feature [h_e1; h_e2] (2d), a linear classifier C x 2d. Adam, lr {settings.lr:g}, {train.warmup_fraction:.0%} warm-up then "
        f"linear decay, batch {settings.batch_size}, gradient norm clipped at {train.max_grad_norm:g}, {train.precision} steps; "
        "aggregation weights p_k = N_k / N.",
        f"- Partition: {scheme}; NIID-Bench's balance trick {'on' if settings.balance else 'off'}; minimum client size "
        + (f"{settings.min_client_size} (bounded redraws)" if settings.min_client_size else
           "none (a client the draw leaves empty sits out every round)")
        + f". Clients with no training sentence, per partition: {_empty_clients(data)}.",
        f"- F1: the headline is micro-F1 over the positive classes (every class but the negative labels "
        f"{', '.join(f'`{n}`' for n in settings.negative_labels)}; every class when a corpus has none of them), macro-F1 "
        "beside it; percentages with 2 decimals as in the paper.",
        "- Evaluation: the global (aggregated) model on the global test set, the union of the clients' test shares, because "
        "the paper evaluates the aggregated model on each dataset's test set. Nothing is selected on the test set; the "
        "per-round test F1 (Figs 3a, 3b) is only reported.",
        "- Deviations and unstated values:",
        f"  - FedCMC's mu and temperature are not given in the paper: mu = {knobs['fedcmc']['mu']:g}, temperature = "
        f"{knobs['fedcmc']['temperature']:g} here.",
        "  - FedCMC's round 1 is FedAvg: no classifier vectors exist before the first aggregation.",
        "  - SCAFFOLD runs under Adam like every method here; its variates are the clients' mean raw local gradients "
        "(under plain SGD the same quantity as its option II), and the correction is added before Adam rescales the "
        "gradient; SCAFFOLD's analysis assumes SGD (`fedrepro/fl/algorithms/scaffold.py`).",
        f"  - MOON (mu {knobs['moon']['mu']:g}, temperature {knobs['moon']['temperature']:g}, projection {knobs['moon']['projection_dim']}): "
        "its classifier stays on the relation features as in every other method, not on top of the projection "
        "(`moon.py`), so only the contrastive term differs.",
        f"  - FedRS (a = {knobs['fedrs']['alpha']:g}): "
        + ("the paper's binary present/absent mask, a different method from its author's code"
           if knobs["fedrs"]["mask"] else "its author's count-scaled logits n_c / max n * (1 − a) + a, not the binary mask")
        + " (`fedrs.py`).",
        f"  - FedLC's tau is not given in its paper: tau = {knobs['fedlc']['tau']:g} (`fedlc.py`).",
        f"  - FedProx mu = {knobs['fedprox']['mu']:g} (not given for this paper).",
        f"- Hardware the cells ran on: {describe([i.get('hardware') for i in data.info.values()])}. The same seed gives the "
        "same bits on the same machine type; another instruction set moves the numbers a little (README, Reproducibility).",
        "",
    ]
    # Table 2
    lines += ["## Table 2: methods x dataset x α", "",
              "The paper reports FedCMC's F1 gain over FedAvg: +12.99 (i2b2), +8.39 (ChemProt), +4.04 (PGR) at α = 0.05 and "
              "+9.08, +7.81, +2.12 at α = 0.5 (the paper writes '%'; read here as F1 points), and FedRS and FedLC well "
              "above FedAvg and MOON. The trivial rows need no model: always the partition's most frequent positive "
              "training class, and stratified random guessing from its training prior (expected score).", ""]
    for metric, name in (("micro_f1", "micro-F1"), ("macro_f1", "macro-F1")):
        lines += [f"Test {name} in % ({_over_seeds(len(fc.seeds))})", "", main_table(data, params, metric).to_markdown(disable_numparse=True), ""]
    counts = data.cells["health"].value_counts()
    lines += [f"† a cell diverged, ° a cell had not converged: {RULE}. Of {len(data.cells)} cells: "
              + ", ".join(f"{n} {label}" for label, n in counts.items()) + ".", ""]
    flagged = health_table(data)
    if not flagged.empty:
        lines += ["Cells flagged by that rule (no claim rests on a diverged one):", "",
                  flagged.to_markdown(index=False), ""]
    alike = identical_predictions(data, params)
    if alike:
        lines += ["Methods whose cells predicted every test sentence alike (different algorithms agree sentence for "
                  "sentence only when their models collapsed onto the same few answers; their rows are equal, not "
                  "close): " + "; ".join(alike) + ".", ""]
    # clients table
    lines += ["## The clients table (more clients)", ""]
    if sw.clients:
        lines += [f"{_dataset_label(sw.dataset)}, α = {sw.alpha:g}, test micro-F1 in % ({_over_seeds(len(sw.seeds))}), columns = "
                  "clients. The paper reports FedCMC best at 10, 20 and 50 clients on i2b2 with its gap over the others "
                  "growing with the clients (ANCHORS.md gives no numbers).", "",
                  sweep_table(data, "clients", sw.methods, "clients", sw.clients).to_markdown(disable_numparse=True), ""]
    else:
        lines += _not_run_text("clients")
    # Table 3
    lines += ["## Table 3: balanced vs natural training subset", ""]
    if sw.subset_modes:
        lines += [f"{sw.subset_size} training sentences of {_dataset_label(sw.subset_dataset)} (balanced: {sw.subset_size} / C per "
                  f"class; natural: the corpus's label mix), α = {sw.alpha:g}, {settings.clients} clients, "
                  f"{f'at most {settings.max_eval_sentences} test sentences' if settings.max_eval_sentences else 'the whole test set'}; "
                  f"sentences of a no-relation class ({', '.join(settings.negative_labels)}) leave every split, as the paper's "
                  "CPR has only its five relation types; "
                  f"test micro-F1 in % ({_over_seeds(len(sw.seeds))}). The paper (500 ChemProt sentences, 100 per class): "
                  "FedRS and FedLC about as good as FedCMC on the balanced subset, FedCMC ahead on the natural one.", "",
                  sweep_table(data, "subsets", sw.subset_methods, "subset", sw.subset_modes).to_markdown(disable_numparse=True), ""]
    else:
        lines += _not_run_text("subset_modes")
    # Fig 1
    lines += ["## Fig 1 and Observation 3: local average similarity d_{k,c}", ""]
    fedavg, _, which = figure1_cells(data, params)
    if fedavg is not None and data.diagnostics[fedavg]:
        lines += ["d_{k,c} is the mean cosine similarity of class c's classifier vector to the other classes' vectors in "
                  "client k's classifier after its local training (uploading clients only). The paper's Observation 3: "
                  "the client holding most of class c has the smallest d_{k,c} in every round, which is why FedCMC "
                  "takes class c's vector from argmin_k d_{k,c}. " + which, "",
                  "![fig 1](figures/fig1_similarity.png)", "",
                  "Share of classes whose smallest-d client (FedAvg) or picked client (FedCMC; its picks in round r feed "
                  "round r + 1) is the class's largest holder, against a uniform pick among the clients holding the "
                  "class:", "", observation3_table(data, params).to_markdown(disable_numparse=True), ""]
    else:
        lines += [which if fedavg is None else "The FedAvg cell recorded no per-round diagnostics.", ""]
    # Fig 3a / 3b
    lines += ["## Fig 3a: convergence", ""]
    point = figure_point(params)
    if point is None:
        lines += [f"The sweeps' point {_point(sw.dataset, sw.alpha)} is not in the main table, so Fig 3a is not drawn.", ""]
    elif not settings.eval_every:
        lines += ["`fedcmc.settings.eval_every` is 0: no per-round test F1 was recorded.", ""]
    else:
        lines += [f"{_point(*point)}: the global model's test micro-F1 after each round ({_over_seeds(len(fc.seeds))}), and the rounds each "
                  f"method needs to reach the target {100 * fc.target_f1:g}% (`fedcmc.target_f1`). The paper (i2b2, α = 0.05): "
                  "FedCMC 5 rounds, FedRS 15, FedAvg 20.", "",
                  "![fig 3a](figures/fig3a_convergence.png)", "", convergence_table(data, params).to_markdown(disable_numparse=True), ""]
        chance = chance_level(data, point[0], Cell("fedavg", *point, settings.clients, settings.local_epochs, 0).partition)
        if fc.target_f1 <= chance:
            lines += [f"The target {100 * fc.target_f1:g}% is at or below the better trivial baseline on this test set "
                      f"({_pct(chance)}%), so reaching it says nothing about learning here.", ""]
    lines += ["## Fig 3b: local epochs", ""]
    if sw.local_epochs:
        final, speed = local_epochs_tables(data, params)
        lines += [f"{_point(sw.dataset, sw.alpha)}, {settings.clients} clients, E local epochs between aggregations. The paper: "
                  "more local epochs speed up FedCMC but not FedAvg or FedRS, and FedAvg's F1 varies more.", "",
                  "![fig 3b](figures/fig3b_local_epochs.png)", "",
                  f"Final test micro-F1 in % ({_over_seeds(len(sw.seeds))})", "", final.to_markdown(disable_numparse=True), "",
                  f"Rounds to {100 * fc.target_f1:g}% micro-F1 (seed-mean curve)", "", speed.to_markdown(disable_numparse=True), ""]
    else:
        lines += _not_run_text("local_epochs")
    # Fig 4
    lines += ["## Fig 4: which classifier vectors", ""]
    if sw.vectors:
        shown = pd.DataFrame({"test micro-F1 (%)": [_fmt(_values(data, "vectors", method="fedcmc", vectors=v)) for v in sw.vectors]},
                             index=pd.Index(sw.vectors, name="vectors"))
        lines += [f"FedCMC at {_point(sw.dataset, sw.vectors_alpha)} with class c's vector taken from the smallest-d client "
                  "(major), a seeded random client (random), the largest-d client (minor), or no vectors and no contrastive "
                  f"term (none = FedAvg); {_over_seeds(len(sw.seeds))}. The paper (i2b2 and CPR, α = 0.01): major clearly "
                  "best, minor worst, below none.", "", "![fig 4](figures/fig4_vectors.png)", "", shown.to_markdown(disable_numparse=True), ""]
    else:
        lines += _not_run_text("vectors")
    # partitions
    lines += ["## Partitions", "",
              "Every client split the grid trains on (`data/fedcmc/partitions/`); skew is the sample-weighted Jensen-Shannon "
              "distance of the clients' label distributions to the pooled one (0 = IID, 1 = disjoint).", "",
              partitions_table(data, params).to_markdown(disable_numparse=True), ""]
    for name in sorted(data.partitions):
        lines += [f"![{name}](figures/partitions/{name}.png)", ""]
    # communication and memory
    comm = communication_table(data, params)
    where = f"{_point(*point)}, seed {fc.seeds[0]}" if point is not None else f"the first main-table cell of each method, seed {fc.seeds[0]}"
    lines += ["## Communication and memory", "",
              f"One main-table cell per method ({where}). Bytes are counted by the channel (`fedrepro/fl/channel.py`) and summed "
              "over the clients of a round. FedCMC downloads the C major vectors (C x 2d floats) with the model from round 2 "
              "on; SCAFFOLD's control variates travel with the weights both ways, about doubling each direction; MOON keeps "
              "each client's previous model and SCAFFOLD each client's variate as private state.", "",
              comm.to_markdown(disable_numparse=True), ""]
    extra = fedcmc_extra_download(data, params)
    if extra:
        lines += [extra, ""]
    lines += missed_clients_section(data.missed)
    # claims
    claims = claims_table(data, params)
    lines += ["## Claims checked at this scale", "",
              "Each finding the paper states (ANCHORS.md), with the measured numbers and the test used; a verdict follows "
              f"the numbers whatever they are. Tested claims use a paired bootstrap over test sentences ({RESAMPLES} resamples, "
              f"seed {BOOTSTRAP_SEED}) of the micro-F1 difference: 'holds' if its 95% interval is above 0, 'does not hold "
              "(significantly reversed)' if below, else 'not significant'. Claims on rounds or on Observation 3 are "
              "descriptive.", "", claims.to_markdown(index=False, disable_numparse=True), ""]
    lines += ["## What this run can and cannot say", ""] + _closing(data, params, claims)
    return "\n".join(lines)
