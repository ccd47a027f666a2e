"""Observation 3 and Fig 1 measured: which client FedAvg's argmin_k d_{k,c} and FedCMC's vectors pick per class, and
how often that is the class's largest holder in the training counts. It works on the per-round diagnostics only the
FedAvg and FedCMC cells record, and feeds a table, a figure and a claim, so it stands apart from the score tables."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.fedcmc.results import TABLE, FedCMCResults
from fedrepro.fedcmc.selection import point_name, selected


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
        note = (
            f" (the sweeps' point {point_name(fc.sweeps.dataset, fc.sweeps.alpha)} is not in the main table, "
            "so the first FedAvg cell stands in)"
        )
    row = wanted.iloc[0]
    other = selected(data, TABLE, method="fedcmc", dataset=row.dataset, alpha=row.alpha, seed=row.seed)
    text = (
        f"FedAvg cell `{row['name']}`{note}; FedCMC's picks from `{other['name'].iloc[0]}`."
        if not other.empty
        else f"FedAvg cell `{row['name']}`{note}; no FedCMC cell at this point."
    )
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
        rows[record["round"]] = {
            "FedAvg: argmin_k d = largest holder": f"{share:.0%} of {counted}",
            "chance (1 / holders)": f"{chance:.0%}",
        }
    for record in data.diagnostics.get(fedcmc, []) if fedcmc else []:
        if record["vector_clients"]:
            share, _, counted = largest_holder_share(record["vector_clients"], counts)
            rows.setdefault(record["round"], {})["FedCMC: picked client = largest holder"] = f"{share:.0%} of {counted}"
    frame = pd.DataFrame.from_dict(rows, orient="index").fillna("-")
    frame.index.name = "round"
    return frame


def observation3_numbers(
    data: FedCMCResults, key: str, counts: pd.DataFrame, picks: str
) -> dict[int, tuple[float, float, int]]:
    out = {}
    for record in data.diagnostics.get(key, []):
        picked = (
            argmin_clients(record["similarity"], record["clients"]) if picks == "argmin" else record["vector_clients"]
        )
        if picked:
            out[record["round"]] = largest_holder_share(picked, counts)
    return out
