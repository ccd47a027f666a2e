"""FedMatch's Table 2 while its CPU snapshot is still being built: what the results ledger holds so far.

A snapshot needs every cell before its report stage runs, and at this machine's pace FedMatch's is many stretches of
work (``docs/fedmatch.md``). Meanwhile a reader can see the cells already trained, if nothing claims more than they
show: each entry says how many of its seeds are in (``2 of 3 seeds``) or that it is missing, carries its cells' health
marks (``fedrepro.report.health``), and sits above the two trivial rows of the same test candidates (ranking by the
mining's BM25 score alone, and a random ordering's exact expectation); no claim is tested and no verdict given (a
claim needs all of its cells: the report stage writes them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.fedmatch.cells import history_health, table_cells
from fedrepro.fedmatch.report import BM25_ONLY, LABELS, bm25_levels, chance_levels
from fedrepro.metrics.summary import mean_std
from fedrepro.report.health import LEGEND, mark_of
from fedrepro.report.partial import coverage, machines
from fedrepro.report.results import CHANCE, OVERALL, client_level

METRICS = ("map", "mrr")


def _score(metrics: Mapping, client: str, metric: str) -> float:
    return float(client_level(metrics["test"], client)[metric])


def partial_table2(
    params: Params, held: Mapping[str, Mapping], mined: Path, bm25_scores: Path, metric: str
) -> pd.DataFrame:
    """Methods x (each client, overall) of test ``metric`` (MAP or MRR): the held cells' mean ± std, their health mark
    and how many of the method's seeds they are; then the trivial rows of the same candidates. ``held``: cell name ->
    the metrics.json of each cell the ledger holds at HEAD's run; ``mined`` and ``bm25_scores``: the data stages'
    ``data/mined`` and ``data/mined_bm25``."""
    cells = table_cells(params)
    clients = [*params.qa_clients, OVERALL]
    table: dict[str, dict[str, str]] = {}
    for method in params.fedmatch.methods:
        wanted = [c for c in cells if c.method == method]
        got = [held[c.name] for c in wanted if c.name in held]
        mark = mark_of(history_health(m["history"]).label for m in got)
        row = table.setdefault(LABELS.get(method, method), {})
        for client in clients:
            if not got:
                row[client] = f"missing (0 of {len(wanted)} seeds)"
                continue
            mean, std = mean_std([_score(m, client, metric) for m in got])
            spread = f" ± {std:.3f}" if len(got) > 1 else ""
            row[client] = f"{mean:.3f}{spread}{mark} ({len(got)} of {len(wanted)} seeds)"
    trivial = {BM25_ONLY: bm25_levels(bm25_scores), CHANCE: chance_levels(mined)}
    for name, levels in trivial.items():
        if levels is None:
            continue
        table[name] = {client: f"{client_level(levels, client)[metric]:.3f}" for client in clients}
    frame = pd.DataFrame.from_dict(table, orient="index").reindex(columns=clients).fillna("-")
    frame.index.name = "method"
    return frame


def render_partial(params: Params, held: Mapping[str, Mapping], mined: Path, bm25_scores: Path, commit: str) -> str:
    """PARTIAL.md: Table 2 as the ledger holds it at ``commit``, and why it has no verdicts yet."""
    cells = table_cells(params)
    have, per_seed = coverage(cells, held)
    lines = [
        "# FedMatch at CPU scale: Table 2 so far (partial, from the results ledger)",
        "",
        f"Written by `python scripts/cpu_snapshot.py partial fedmatch` at commit {commit[:7]} from the entries of "
        f"`cells/` that hold HEAD's runs: **{have} of {len(cells)} Table 2 cells** ({per_seed}); the ablations and "
        "the figures' sweeps are not shown here. This is not the report: no claim is tested here and no verdict given, "
        "because every claim needs all of its cells (`python scripts/cpu_snapshot.py run fedmatch` writes the report "
        "once the ledger is complete). Test MAP and MRR of each client's test questions (overall: the mean over the "
        "clients), mean ± std over the seeds in (the mean alone for one); the trivial rows rank the same test "
        f"candidates by their BM25 score alone and at random (its exact expectation). {LEGEND} (the shared health "
        f"rule, `docs/reproducibility.md`). Cells trained on: {machines(held)} (each entry's "
        "`stamp.json` names its machine class).",
    ]
    for metric in METRICS:
        lines += ["", f"## Test {metric.upper()}", ""]
        lines.append(partial_table2(params, held, mined, bm25_scores, metric).to_markdown(disable_numparse=True))
    lines += ["", f"Spread over the seeds in: {_spread(params, held)}", ""]
    return "\n".join(lines)


def _spread(params: Params, held: Mapping[str, Mapping]) -> str:
    """The largest seed-to-seed range of overall test MAP of any method with two seeds or more: how much one seed's
    number can mislead."""
    ranges = []
    for method in params.fedmatch.methods:
        values = [
            _score(held[c.name], OVERALL, "map") for c in table_cells(params) if c.method == method and c.name in held
        ]
        if len(values) > 1:
            ranges.append((float(np.ptp(values)), LABELS.get(method, method)))
    if not ranges:
        return "no method has two seeds yet."
    widest, where = max(ranges)
    return f"the widest range of overall test MAP is {widest:.3f} ({where})."
