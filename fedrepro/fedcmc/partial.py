"""FedCMC's Table 2 while its CPU snapshot is still being built: what the results ledger holds so far.

A snapshot needs every cell before its report stage runs, and at this machine's pace that is several stretches of
work (``docs/fedcmc.md``). Meanwhile a reader can see the cells already trained, if nothing claims more than they show:
each table entry says how many of its seeds are in (``2 of 3 seeds``) or that it is missing, carries its cells'
health marks (``fedrepro.report.health``), and sits above the trivial rows of its partition, scored on the same test
sentences; no claim is tested and no verdict given (a claim needs all of its cells: the report stage writes them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.fedcmc.cells import table_cells
from fedrepro.fedcmc.chance import CHANCE
from fedrepro.fedcmc.results import positive_labels
from fedrepro.fedcmc.selection import main_points, mean_std_percent, method_label, percent, point_name
from fedrepro.fl.health import cell_health, training_losses
from fedrepro.io import read_json, read_table
from fedrepro.metrics.classification import trivial_scores
from fedrepro.report.health import LEGEND, mark_of
from fedrepro.report.partial import coverage, machines


def cell_label(metrics: Mapping) -> str:
    """A held cell's health label by the shared rule, read from its metrics' history as the report stage reads it."""
    history = metrics["history"]
    return cell_health(
        training_losses(history), [r["valid"]["global"]["micro_f1"] for r in history if r.get("valid")]
    ).label


def partial_table2(params: Params, held: Mapping[str, Mapping], partitions: Path) -> pd.DataFrame:
    """Methods x (dataset, α) of test micro-F1 in %: the held cells' mean ± std, their health mark and how many of the
    point's seeds they are; then each point's trivial rows (``trivial_scores``: the partition's training prior, its
    test sentences). ``held``: cell name -> the metrics.json of each cell the ledger holds at HEAD's run."""
    cells = table_cells(params)
    table: dict[str, dict[str, str]] = {}
    for method in params.fedcmc.methods:
        row = table.setdefault(method_label(method), {})
        for dataset, alpha in main_points(params):
            wanted = [c for c in cells if (c.method, c.dataset, c.alpha) == (method, dataset, alpha)]
            got = [held[c.name] for c in wanted if c.name in held]
            row[point_name(dataset, alpha)] = (
                f"{mean_std_percent([m['test']['micro_f1'] for m in got])}{mark_of(cell_label(m) for m in got)} "
                f"({len(got)} of {len(wanted)} seeds)"
                if got
                else f"missing (0 of {len(wanted)} seeds)"
            )
    negative = params.fedcmc.settings.negative_labels
    for dataset, alpha in main_points(params):
        partition = next(c.partition for c in cells if (c.dataset, c.alpha) == (dataset, alpha))
        folder = Path(partitions) / partition
        assignment = read_table(folder / "assignment.parquet")
        counts = pd.read_csv(folder / "counts.csv", index_col=0).drop(columns="total", errors="ignore")
        classes = [str(c) for c in read_json(folder / "partition.json")["classes"]]
        gold = assignment.loc[assignment["split"] == "test", "label"].astype(str).to_numpy()
        prior = {str(c): float(n) for c, n in counts.sum(axis=0).items()}
        for name, scores in trivial_scores(gold, prior, positive_labels(classes, negative)).items():
            table.setdefault(f"{CHANCE}: {name}", {})[point_name(dataset, alpha)] = percent(scores["micro_f1"])
    frame = pd.DataFrame.from_dict(table, orient="index").fillna("-")
    frame.index.name = "method"
    return frame


def render_partial(params: Params, held: Mapping[str, Mapping], partitions: Path, commit: str) -> str:
    """PARTIAL.md: Table 2 as the ledger holds it at ``commit``, and why it has no verdicts yet."""
    cells = table_cells(params)
    have, per_seed = coverage(cells, held)
    return "\n".join(
        [
            "# FedCMC at CPU scale: Table 2 so far (partial, from the results ledger)",
            "",
            f"Written by `python scripts/cpu_snapshot.py partial fedcmc` at commit {commit[:7]} from the entries of "
            f"`cells/` that hold HEAD's runs: **{have} of {len(cells)} Table 2 cells** ({per_seed}); "
            "the clients table, Table 3 and the figures have none yet. This is not the report: "
            "no claim is tested here and no verdict given, because every claim needs all of its cells "
            "(`python scripts/cpu_snapshot.py run fedcmc` writes the report "
            "once the ledger is complete). Test micro-F1 in %, mean ± std over the seeds in (the mean alone for one); "
            f"the trivial rows are the partition's (its training prior, its test sentences). {LEGEND} "
            "(the shared health rule, `docs/reproducibility.md`). Cells trained on: "
            f"{machines(held)} (each entry's `stamp.json` names its machine class).",
            "",
            partial_table2(params, held, partitions).to_markdown(disable_numparse=True),
            "",
            f"Spread over the seeds in: {_spread(params, held)}",
            "",
        ]
    )


def _spread(params: Params, held: Mapping[str, Mapping]) -> str:
    """The largest seed-to-seed range of any entry with two seeds or more: how much one seed's number can mislead."""
    ranges = []
    for method in params.fedcmc.methods:
        for dataset, alpha in main_points(params):
            values = [
                held[c.name]["test"]["micro_f1"]
                for c in table_cells(params)
                if (c.method, c.dataset, c.alpha) == (method, dataset, alpha) and c.name in held
            ]
            if len(values) > 1:
                ranges.append((float(np.ptp(values)), f"{method_label(method)} at {point_name(dataset, alpha)}"))
    if not ranges:
        return "no entry has two seeds yet."
    widest, where = max(ranges)
    return f"the widest range is {100 * widest:.1f} points ({where})."
