"""Collecting evaluated cells into tidy frames and mean ± std tables over seeds (the tests are in ``statistics``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedrepro.io import read_json
from fedrepro.metrics.ranking import per_question_metrics
from fedrepro.metrics.summary import mean_std

OVERALL = "overall"
CHANCE = "random ranking (chance)"


def read_trec(qrels_path: Path, run_path: Path) -> tuple[dict, dict]:
    """qrels and run back from the standard TREC files a cell wrote."""
    qrels: dict[str, dict[str, int]] = {}
    for line in qrels_path.read_text().splitlines():
        qid, _, doc, relevance = line.split()
        qrels.setdefault(qid, {})[doc] = int(relevance)
    run: dict[str, dict[str, float]] = {}
    for line in run_path.read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    return qrels, run


def load_cell(folder: Path) -> tuple[dict, pd.DataFrame]:
    """A cell's metrics.json and its per-question AP/RR (recomputed from its TREC files)."""
    metrics = read_json(folder / "metrics.json")
    rows = []
    for qrels_path in sorted((folder / "trec").glob("*.qrels")):
        client = qrels_path.stem
        for question, values in per_question_metrics(*read_trec(qrels_path, qrels_path.with_suffix(".run"))).items():
            rows.append((client, question, values["map"], values["mrr"]))
    return metrics, pd.DataFrame(rows, columns=["client", "question", "map", "mrr"])


def missed_clients(cell: str, history: list[dict]) -> list[dict]:
    """One row per client a round went on without (a Flower node that did not answer in time, or whose upload
    was refused): the history records it under ``missed``; the engine never misses one."""
    return [
        {"cell": cell, "round": record["round"], "client": client, "reason": reason}
        for record in history
        for client, reason in sorted((record.get("missed") or {}).items())
    ]


def missed_clients_section(missed: list[dict]) -> list[str]:
    """The report's lines on missed clients; none when every sampled client delivered every round."""
    if not missed:
        return []
    table = pd.DataFrame(missed, columns=["cell", "round", "client", "reason"])
    return [
        "## Clients missing from rounds",
        "",
        f"{len(table)} client updates never reached the server: those rounds aggregated the other clients' updates "
        "only, so these cells are not the uninterrupted run.",
        "",
        table.to_markdown(index=False),
        "",
    ]


def client_level(levels: dict, client: str) -> dict[str, float]:
    """A client's (or ``OVERALL``'s) metrics from levels shaped {"clients": {client: metrics}, "overall": metrics}:
    the chance level (``chance_levels``) or a trivial row's."""
    return levels["overall"] if client == OVERALL else levels["clients"][client]


def summary_table(
    results: pd.DataFrame,
    metric: str,
    rows: list[str],
    labels: dict[str, str],
    chance: dict | None = None,
    baselines: dict[str, dict] | None = None,
) -> pd.DataFrame:
    """Rows x clients (+ overall) of 'mean ± std' over seeds (the mean alone for one seed); ``results`` has columns row,
    seed, client, metric, value. ``baselines`` (label -> {"clients", "overall"}) add one trivial row each, and with
    ``chance`` a last row gives the random-ranking level of the same candidates."""
    clients = sorted(c for c in set(results["client"]) if c != OVERALL) + [OVERALL]
    table = {}
    for row in rows:
        cells = {}
        for client in clients:
            values = results[(results.row == row) & (results.client == client) & (results.metric == metric)]["value"]
            mean, std = mean_std(values.tolist())
            cells[client] = f"{mean:.3f} ± {std:.3f}" if len(values) > 1 else f"{mean:.3f}"
        table[labels.get(row, row)] = cells
    for label, levels in (baselines or {}).items():
        table[label] = {c: f"{client_level(levels, c)[metric]:.3f}" for c in clients}
    if chance is not None:
        table[CHANCE] = {c: f"{client_level(chance, c)[metric]:.3f}" for c in clients}
    frame = pd.DataFrame.from_dict(table, orient="index")[clients]
    frame.index.name = "method"
    return frame
