"""FedMatch's report: Tables 2-3, Figs 5-8, bytes and parameters, from the cells' outputs only (the claims table is
``claims.py``'s; ``render`` writes them all into the markdown)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fedrepro.config import Params
from fedrepro.fedmatch.cells import SWEEPS, Cell, history_health, sweep_cells, table_cells
from fedrepro.fedmatch.methods import FIGURE_METHOD, METHODS
from fedrepro.fl.health import Health
from fedrepro.report.health import UNSOUND
from fedrepro.io import read_table
from fedrepro.metrics.ranking import random_ranking_metrics, ranking_metrics
from fedrepro.metrics.summary import mean_std, overall
from fedrepro.report.figures import convergence_figure, data_ratio_figure, sweep_figure
from fedrepro.report.results import CHANCE, OVERALL, client_level, load_cell, missed_clients
from fedrepro.tasks.qa import qrels_and_run

LABELS = {name: method.label for name, method in METHODS.items()}
BM25_ONLY = "BM25 only"
CHANCE_MARGIN = 0.05
"""a reference within this much of chance (overall MAP or MRR) has learned too little to be beaten meaningfully."""


@dataclass
class FedMatchResults:
    """Everything the report draws on, gathered once from the cell folders."""

    results: pd.DataFrame
    """row (method or sweep point), method, seed, sweep, value, client (incl. overall), metric, value."""
    per_question: pd.DataFrame
    """row, seed, client, question, map, mrr."""
    histories: pd.DataFrame
    info: dict[str, dict] = field(default_factory=dict)
    """row -> metrics.json of its first seed (parameters, memory, channel)."""
    missed: list[dict] = field(default_factory=list)
    """cell, round, client, reason: every client a round went on without."""
    health: dict[str, dict[int, Health]] = field(default_factory=dict)
    """row -> seed -> the cell's health by the shared rule (per-round training loss, validation MRR)."""


def cell_folder(root: Path, cell: Cell) -> Path:
    group = Path("tables") / cell.method if cell.sweep is None else Path("sweeps") / cell.sweep
    return Path(root) / group / cell.name


def row_name(cell: Cell) -> str:
    return cell.method if cell.sweep is None else f"{cell.sweep}={cell.value}:{cell.method}"


def load_fedmatch(root: Path, params: Params) -> FedMatchResults:
    results, questions, histories, info, missed, health = [], [], [], {}, [], {}
    for cell in table_cells(params) + sweep_cells(params):
        metrics, per_question = load_cell(cell_folder(root, cell))
        row = row_name(cell)
        info.setdefault(row, metrics)
        base = {"row": row, "method": cell.method, "seed": cell.seed, "sweep": cell.sweep, "point": cell.value}
        test = metrics["test"]
        for client, values in {**test["clients"], OVERALL: test["overall"]}.items():
            results += [{**base, "client": client, "metric": m, "value": v} for m, v in values.items()]
        questions.append(per_question.assign(row=row, seed=cell.seed))
        for record in metrics["history"]:
            histories.append(
                {
                    **base,
                    "round": record["round"],
                    "train_loss": record["train_loss"],
                    "bytes_up": record["bytes_up"],
                    "bytes_down": record["bytes_down"],
                }
            )
        missed += missed_clients(cell.name, metrics["history"])
        health.setdefault(row, {})[cell.seed] = history_health(metrics["history"])
    return FedMatchResults(
        pd.DataFrame(results), pd.concat(questions, ignore_index=True), pd.DataFrame(histories), info, missed, health
    )


def health_marker(data: FedMatchResults, row: str) -> str:
    """'' for a sound row, else ' [diverged]' / ' [oscillating]' / ' [not converged]' (with 'k of n seeds' when not all
    are), the worst label first."""
    cells = list(data.health.get(row, {}).values())
    for label in UNSOUND:
        count = sum(h.label == label for h in cells)
        if count:
            return f" [{label}]" if count == len(cells) else f" [{label}: {count} of {len(cells)} seeds]"
    return ""


def marked_labels(data: FedMatchResults) -> dict[str, str]:
    """Row labels carrying their health marker, for every table of the report."""
    return {row: LABELS.get(row, row) + health_marker(data, row) for row in data.health}


def health_table(data: FedMatchResults, rows: list[str]) -> pd.DataFrame:
    """One line per table cell: its health by the shared rule and why."""
    lines = [
        {"method": LABELS.get(row, row), "seed": seed, "health": h.label, "why": h.why}
        for row in rows
        for seed, h in sorted(data.health.get(row, {}).items())
    ]
    return pd.DataFrame(lines, columns=["method", "seed", "health", "why"])


# ----- claims ---------------------------------------------------------------------------------------------


def overall_value(data: FedMatchResults, row: str, metric: str) -> float:
    values = data.results[
        (data.results.row == row) & (data.results.client == OVERALL) & (data.results.metric == metric)
    ]
    return mean_std(values["value"].tolist())[0]


def row_label(row: str) -> str:
    """A claim's name for a table row ('FedMatch H+LR') or a sweep point ('FedMatch H+LR at aggregate_every=2')."""
    if ":" in row:
        point, method = row.split(":")
        return f"{LABELS.get(method, method)} at {point}"
    return LABELS.get(row, row)


def sweep_point(sweep: str, value: str) -> int | float:
    """A sweep point as a number: a share for data_ratio, else a whole count."""
    number = float(value)
    return int(number) if number.is_integer() and sweep != "data_ratio" else number


def sweep_series(data: FedMatchResults, sweep: str, client: str, metric: str, method: str = FIGURE_METHOD) -> pd.Series:
    frame = data.results[
        (data.results.sweep == sweep)
        & (data.results.method == method)
        & (data.results.client == client)
        & (data.results.metric == metric)
    ]
    series = frame.groupby("point")["value"].mean()
    series.index = [sweep_point(sweep, v) for v in series.index]
    return series.sort_index()


# ----- chance and figures -----------------------------------------------------------------------------------
def chance_levels(mined: Path, split: str = "test") -> dict:
    """Exact expected MAP/MRR of a random ordering of each client's ``split`` candidates: a method is worth its
    margin over this."""
    clients = {}
    for folder in sorted(p for p in Path(mined).iterdir() if p.is_dir()):
        candidates = read_table(folder / "candidates.parquet")
        clients[folder.name] = random_ranking_metrics(
            *qrels_and_run(candidates[candidates["split"] == split].assign(score=0.0))
        )
    return {"clients": clients, "overall": overall(clients)}


def bm25_levels(scores_dir: Path, split: str = "test") -> dict | None:
    """MAP/MRR of ranking each client's ``split`` candidates by their BM25 score alone (the mining's own scores,
    ``data/mined_bm25``), with the methods' metric code, so ties fall by ascending answer id as theirs do; None
    when the mining recorded no scores."""
    files = sorted(Path(scores_dir).glob("*.parquet"))
    if not files:
        return None
    clients = {}
    for path in files:
        scored = read_table(path)
        clients[path.stem] = ranking_metrics(*qrels_and_run(scored[scored["split"] == split]))
    return {"clients": clients, "overall": overall(clients)}


def sweep_table(data: FedMatchResults, sweep: str, chance: dict | None = None) -> pd.DataFrame:
    """Sweep points x clients (+ overall): FedMatch H+LR's test MRR, mean over the sweep's seeds; with ``chance``
    (``chance_levels``), a last row of each column's random-ranking MRR, which every point is read against."""
    clients = sorted(c for c in set(data.results.client) if c != OVERALL) + [OVERALL]
    table = pd.DataFrame({c: sweep_series(data, sweep, c, "mrr") for c in clients})
    if chance is not None and not table.empty:
        table.index = table.index.astype(object)
        table.loc[CHANCE] = [client_level(chance, c)["mrr"] for c in clients]
    return table


def write_figures(data: FedMatchResults, params: Params, folder: Path, chance: dict[str, dict[str, float]]) -> None:
    """The PNG figures and, for `dvc plots`, one CSV per figure (overall MAP/MRR per sweep point). Figs 5-8 draw
    ``chance``, the random-ranking level of the test candidates (``chance_levels``, the tables' chance row): a sweep
    point can sit at or below chance."""
    tables = data.histories[data.histories.sweep.isna() & data.histories.method.isin(params.fedmatch.table3)]
    convergence_figure(tables, LABELS, folder / "convergence.png")
    tables.groupby(["method", "round"])["train_loss"].mean().reset_index().to_csv(
        folder / "convergence.csv", index=False, float_format="%.6g"
    )
    styles = {"shared_layers": dict(reverse=True), "patch_size": dict(log2=True), "aggregate_every": {}}
    for number, sweep in zip((5, 6, 7), styles):
        table = sweep_table(data, sweep)
        if table.empty:
            continue
        levels = {client: client_level(chance, client)["mrr"] for client in table.columns}
        sweep_figure(
            table,
            levels,
            SWEEPS[sweep].split(": ")[1],
            f"Fig {number}: FedMatch H+LR, test MRR",
            folder / f"fig{number}_{sweep}.png",
            **styles[sweep],
        )
        _figure_csv(data, sweep, FIGURE_METHOD, folder / f"fig{number}_{sweep}.csv")
    client = "insuranceqa" if "insuranceqa" in set(data.results.client) else OVERALL
    curves = [
        pd.DataFrame({m: sweep_series(data, "data_ratio", client, m, method) for m in ("map", "mrr")})
        for method in params.fedmatch.sweeps.data_ratio_methods[:2]
    ]
    if len(curves) == 2 and not curves[0].empty:
        names = tuple(LABELS[m] for m in params.fedmatch.sweeps.data_ratio_methods[:2])
        data_ratio_figure(
            curves[0], curves[1], names, client, client_level(chance, client), folder / "fig8_data_ratio.png"
        )
    for method in params.fedmatch.sweeps.data_ratio_methods:
        _figure_csv(data, "data_ratio", method, folder / f"fig8_data_ratio_{method}.csv")


def _figure_csv(data: FedMatchResults, sweep: str, method: str, path: Path) -> None:
    frame = pd.DataFrame({f"overall_{m}": sweep_series(data, sweep, OVERALL, m, method) for m in ("map", "mrr")})
    frame.index.name = sweep
    frame.reset_index().to_csv(path, index=False, float_format="%.6f")


# ----- tables ---------------------------------------------------------------------------------------------
def communication_table(data: FedMatchResults, rows: list[str]) -> pd.DataFrame:
    """Per method: the training loss's first and last round (did it learn?), parameters (total, trainable, private,
    uploaded), bytes per round and sent once, and the private state the engine holds per client."""
    table = {}
    for row in rows:
        info = data.info[row]
        hist = data.histories[data.histories.row == row]
        once = sum(link["bytes"] for name, link in info["channel"].items() if name.endswith("->server")) - int(
            hist[hist.seed == hist.seed.min()]["bytes_up"].sum()
        )
        loss = hist.groupby("round")["train_loss"].mean()
        table[LABELS.get(row, row)] = {
            "train loss, first -> last round": f"{loss.iloc[0]:.3f} -> {loss.iloc[-1]:.3f}",
            **{f"params {k}": v for k, v in info["parameters"].items()},
            "bytes up / round": int(hist["bytes_up"].mean()),
            "bytes down / round": int(hist["bytes_down"].mean()),
            "data bytes sent once": once,
            "private state / client (B)": info["memory_bytes"]["private_per_client_max"],
        }
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.name = "method"
    return frame


def patch_table(data: FedMatchResults, rows: list[str]) -> pd.DataFrame:
    """Per patched method and client (first seed): the Frobenius norms of the patch's up-projection (zero at the
    start, so its norm is how far it moved), of its down-projection's change and of the down-projection; then what
    the patch changes on the client's validation candidates (features the head reads, scores in score std)."""
    table = {}
    for row in rows:
        norms = data.info.get(row, {}).get("patch_norms")
        if norms:
            table[LABELS.get(row, row)] = {
                client: f"{n['up']:.3g} / {n['down_change']:.3g} / {n['down']:.3g}"
                + (f"; {n['feature_change']:.2%}, {n['score_change']:.2f} sd" if "feature_change" in n else "")
                for client, n in sorted(norms.items())
            }
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index.name = "method: ‖up‖ / ‖Δdown‖ / ‖down‖; Δfeatures, Δscore"
    return frame


def results_frame(data: FedMatchResults) -> pd.DataFrame:
    """results.csv: one row per cell, client (incl. overall) and metric."""
    return data.results.drop(columns="row")


def summary_metrics(data: FedMatchResults) -> dict:
    """metrics.json for `dvc exp show`: each table method's overall test MAP and MRR, mean over seeds."""
    overall = data.results[(data.results.sweep.isna()) & (data.results.client == OVERALL)]
    means = overall.groupby(["metric", "method"])["value"].mean().round(4)
    return {metric: means[metric].to_dict() for metric in ("mrr", "map")}


def training_caveats(data: FedMatchResults, chance: dict, rows: list[str]) -> list[str]:
    """Methods that barely trained (loss fell < 10% from the first round) or sit within CHANCE_MARGIN MRR of chance:
    a verdict involving them says more about the budget than about the method."""
    lines = []
    level = chance["overall"]["mrr"]
    for row in rows:
        loss = data.histories[data.histories.row == row].groupby("round")["train_loss"].mean()
        mrr = overall_value(data, row, "mrr")
        notes = []
        if len(loss) and loss.iloc[-1] > 0.9 * loss.iloc[0]:
            notes.append(f"training loss only {loss.iloc[0]:.3f} -> {loss.iloc[-1]:.3f}")
        if mrr - level < CHANCE_MARGIN:
            notes.append(f"overall MRR {mrr:.3f} is within {CHANCE_MARGIN:g} of chance ({level:.3f})")
        if notes:
            lines.append(f"{LABELS.get(row, row)}: " + "; ".join(notes))
    return lines
