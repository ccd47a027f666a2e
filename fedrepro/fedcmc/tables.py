"""FedCMC's tables, each a frame for ``render`` to write: Table 2 (``main_table``), the clients table, Table 3, the
companions of Figs 3a, 3b and 4, communication and memory, the partitions and the cells the health rule flags. They
only arrange what ``results``, ``selection`` and ``chance`` give; the markdown around them is ``render``'s."""

from __future__ import annotations

import pandas as pd

from fedrepro.config import Params
from fedrepro.fedcmc.cells import Cell
from fedrepro.fedcmc.chance import CHANCE, chance_scores
from fedrepro.fedcmc.paper import PAPER_GAINS, PAPER_ROUNDS
from fedrepro.fedcmc.results import TABLE, FedCMCResults
from fedrepro.fedcmc.selection import (
    curve_of,
    figure_point,
    health_mark,
    main_points,
    mean_of,
    mean_std_percent,
    method_label,
    percent,
    point_name,
    points_text,
    rounds_text,
    rounds_to_target,
    selected,
    values_of,
)
from fedrepro.metrics.summary import mean_std
from fedrepro.report.health import flagged_cells


def main_table(data: FedCMCResults, params: Params, metric: str) -> pd.DataFrame:
    """Table 2: methods x (dataset, alpha), 'mean ± std' over seeds of test ``metric`` in %, a chance row, and
    for micro-F1 the measured FedCMC − FedAvg gap beside the paper's."""
    fc = params.fedcmc
    table = {}
    for method in fc.methods:
        table[method_label(method)] = {
            point_name(d, a): mean_std_percent(values_of(data, TABLE, metric, method=method, dataset=d, alpha=a))
            + health_mark(data, TABLE, method=method, dataset=d, alpha=a)
            for d, a in main_points(params)
        }
    part = lambda d, a: Cell("fedavg", d, a, fc.settings.clients, fc.settings.local_epochs, 0).partition  # noqa: E731
    for d, a in main_points(params):
        for name, scores in chance_scores(data, d, part(d, a)).items():
            table.setdefault(f"{CHANCE}: {name}", {})[point_name(d, a)] = percent(scores[metric])
    if metric == "micro_f1" and {"fedavg", "fedcmc"} <= set(fc.methods):
        table["FedCMC − FedAvg (measured, points)"] = {
            point_name(d, a): points_text(
                mean_of(data, TABLE, method="fedcmc", dataset=d, alpha=a)
                - mean_of(data, TABLE, method="fedavg", dataset=d, alpha=a)
            )
            for d, a in main_points(params)
        }
        table["FedCMC − FedAvg (paper)"] = {
            point_name(d, a): (f"+{PAPER_GAINS[a][d]:.2f}" if d in PAPER_GAINS.get(a, {}) else "-")
            for d, a in main_points(params)
        }
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.name = "method"
    return frame


def sweep_table(
    data: FedCMCResults, sweep: str, rows: list[str], column: str, values: list, metric: str = "micro_f1", **fixed
) -> pd.DataFrame:
    """Methods x sweep points, 'mean ± std' over the sweep's seeds of test ``metric`` in %."""
    table = {}
    for method in rows:
        table[method_label(method)] = {
            str(v): mean_std_percent(values_of(data, sweep, metric, method=method, **{column: v}, **fixed))
            for v in values
        }
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


def convergence_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """Fig 3a's companion: per method, rounds to reach fedcmc.target_f1 and the last round's micro-F1."""
    point, fc = figure_point(params), params.fedcmc
    rows = {}
    for method in fc.methods:
        curve = curve_of(data, TABLE, method=method, dataset=point[0], alpha=point[1])
        reached = rounds_to_target(curve, fc.target_f1)
        rows[method_label(method)] = {
            f"rounds to {100 * fc.target_f1:g}% micro-F1": rounds_text(reached, fc.settings.rounds),
            "paper (i2b2, α=0.05)": str(PAPER_ROUNDS.get(method, "-")),
            "best round micro-F1": percent(curve.max()) if len(curve) else "-",
            "last round micro-F1": percent(curve.iloc[-1]) if len(curve) else "-",
        }
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
        speed[method_label(method)] = {
            f"E={e}": rounds_text(
                rounds_to_target(curve_of(data, "local_epochs", method=method, local_epochs=e), fc.target_f1),
                fc.settings.rounds,
            )
            for e in sw.local_epochs
        }
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
        up, down = (
            float(rounds.bytes_up.mean()),
            float(later.bytes_down.mean() if len(later) else rounds.bytes_down.mean()),
        )
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
            "loss on the training data, first -> last round": (
                f"{rounds.fit_loss.iloc[0]:.3f} -> {rounds.fit_loss.iloc[-1]:.3f}"
            ),
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
    return (
        f"Measured: FedCMC downloads {extra:,.0f} bytes more than FedAvg per client per round from round 2 "
        f"({clients} clients); with C = {classes} classes that is {extra / classes:,.0f} bytes per class vector, "
        f"i.e. {extra / classes / 4:,.0f} float32 values = 2d."
    )


def partitions_table(data: FedCMCResults, params: Params) -> pd.DataFrame:
    """Every partition the grid trains on: its draw, sentences, skew and how many clients got no training sentence."""
    users: dict[str, set[str]] = {}
    for _, row in data.cells.iterrows():
        users.setdefault(row.partition, set()).add("main table" if row.group == TABLE else f"sweep {row.group}")
    rows = {}
    for name, part in sorted(data.partitions.items()):
        totals = part.counts.sum(axis=1)
        sentences = part.info.get("sentences", {})
        rows[name] = {
            "dataset": part.info["dataset"],
            "alpha": f"{part.info['alpha']:g}",
            "clients": part.info["clients"],
            "subset": part.info.get("subset") or "-",
            "train / valid / test": (
                f"{sentences.get('train', 0)} / {sentences.get('valid', 0)} / {sentences.get('test', 0)}"
            ),
            "skew (JS distance)": f"{part.info['skew']:.3f}",
            "clients without training sentences": int((totals == 0).sum()),
            "smallest non-empty client": int(totals[totals > 0].min()) if (totals > 0).any() else 0,
            "used by": ", ".join(sorted(users.get(name, set()))),
        }
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "partition"
    return frame


def health_table(data: FedCMCResults) -> pd.DataFrame:
    """Every cell that diverged or had not converged, once (a sweep point may be a main-table cell), with the reason."""
    return flagged_cells(data.cells)
