"""Collecting the evaluated cells into tidy frames and mean±std tables over seeds."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedrepro.io import read_json
from fedrepro.metrics.summary import mean_std

OVERALL = "overall"


def load_results(eval_dir: Path, algorithms: list[str], seeds: list[int]) -> pd.DataFrame:
    """Long frame: algorithm, seed, client (incl. 'overall'), metric, value — one row per measured number."""
    rows = []
    for algorithm in algorithms:
        for seed in seeds:
            metrics = read_json(Path(eval_dir) / f"{algorithm}-{seed}" / "metrics.json")
            for client, values in {**metrics["clients"], OVERALL: metrics["overall"]}.items():
                rows.extend((algorithm, seed, client, name, value) for name, value in values.items())
    return pd.DataFrame(rows, columns=["algorithm", "seed", "client", "metric", "value"])


def load_histories(train_dir: Path, algorithms: list[str], seeds: list[int]) -> pd.DataFrame:
    """Long frame of the per-round history: algorithm, seed, round, train_loss, bytes, overall valid MAP/MRR."""
    rows = []
    for algorithm in algorithms:
        for seed in seeds:
            for record in read_json(Path(train_dir) / f"{algorithm}-{seed}" / "metrics.json")["history"]:
                row = {"algorithm": algorithm, "seed": seed, "round": record["round"], "train_loss": record["train_loss"],
                       "bytes_up": record["bytes_up"], "bytes_down": record["bytes_down"]}
                if "valid" in record:
                    for metric in ("map", "mrr"):
                        values = [v[metric] for v in record["valid"].values()]
                        row[f"valid_{metric}"] = sum(values) / len(values)
                rows.append(row)
    return pd.DataFrame(rows)


CHANCE = "random ranking (chance)"


def load_memory(train_dir: Path, algorithms: list[str], seed: int) -> pd.DataFrame:
    """Per algorithm: the bytes the engine held (model, server's shared weights, private state per client)."""
    rows = {a: read_json(Path(train_dir) / f"{a}-{seed}" / "metrics.json")["memory_bytes"] for a in algorithms}
    return pd.DataFrame.from_dict(rows, orient="index")


def summary_table(results: pd.DataFrame, metric: str, algorithms: list[str], chance: dict | None = None) -> pd.DataFrame:
    """Algorithms x clients (+ overall) of 'mean ± std' strings over seeds, in the given algorithm order;
    with ``chance`` (evaluate's chance.json) a last row gives the random-ranking level of the same candidates."""
    clients = [c for c in dict.fromkeys(results["client"]) if c != OVERALL] + [OVERALL]
    table = {}
    for algorithm in algorithms:
        row = {}
        for client in clients:
            values = results[(results.algorithm == algorithm) & (results.client == client) & (results.metric == metric)]["value"]
            mean, std = mean_std(values.tolist())
            row[client] = f"{mean:.3f} ± {std:.3f}"
        table[algorithm] = row
    if chance is not None:
        table[CHANCE] = {c: f"{(chance['overall'] if c == OVERALL else chance['clients'][c])[metric]:.3f}" for c in clients}
    frame = pd.DataFrame.from_dict(table, orient="index")[clients]
    frame.index.name = "method"
    return frame


def overall_stats(results: pd.DataFrame, algorithms: list[str]) -> dict[str, dict[str, float]]:
    """Per algorithm: mean and std over seeds of the overall MAP and MRR (the numbers `dvc exp show` lists)."""
    stats = {}
    for algorithm in algorithms:
        entry = {}
        for metric in ("map", "mrr"):
            values = results[(results.algorithm == algorithm) & (results.client == OVERALL) & (results.metric == metric)]["value"]
            entry[f"{metric}_mean"], entry[f"{metric}_std"] = mean_std(values.tolist())
        stats[algorithm] = entry
    return stats
