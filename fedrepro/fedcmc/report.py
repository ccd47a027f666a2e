"""FedCMC's report stage's files beside the markdown: results.csv (``results_frame``), metrics.json
(``summary_metrics``) and the figures with their `dvc plots` CSVs (``write_figures``: Figs 1, 3a, 3b and 4 and every
partition's heat-map).

The stage reads the cells with ``results.load_fedcmc``; the tables are ``tables``'s, the claims ``claims``'s, and
``render.render_report`` writes the markdown. Nothing here or in those modules reads a clock or an unseeded random
source, so a rerun on the same cells gives the same bytes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from fedrepro.config import Params
from fedrepro.fedcmc.chance import CHANCE, chance_scores
from fedrepro.fedcmc.observation3 import cell_counts, figure1_cells
from fedrepro.fedcmc.results import CELL_FIELDS, TABLE, FedCMCResults
from fedrepro.fedcmc.selection import curve_of, figure_point, health_mark, mean_of, method_label, point_name, selected
from fedrepro.fedcmc.tables import vectors_table
from fedrepro.report.figures import bar_figure, f1_curves_figure, similarity_figure
from fedrepro.report.formatting import over_seeds


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


def _curves_figure(
    data: FedCMCResults,
    group: str,
    selections: dict[str, dict],
    labels: dict[str, str],
    title: str,
    path: Path,
    target: float,
    styles: dict[str, dict] | None = None,
) -> None:
    """Fig 3a or 3b: each curve (``selections``, legend ``labels``) marked with its cells' health (``health_mark``),
    crossed at its end where one of them diverged (its end is no result), over the trivial baselines (Table 2's) of
    the cells' partition on their test set, which a curve must clear to have learned more than the prior."""
    marked = {name: labels[name] + health_mark(data, group, **fields) for name, fields in selections.items()}
    diverged = [
        marked[name]
        for name, fields in selections.items()
        if "diverged" in set(selected(data, group, **fields)["health"])
    ]
    first = selected(data, group, **next(iter(selections.values()))).iloc[0]
    references = {
        f"{CHANCE}: {name}": scores["micro_f1"]
        for name, scores in chance_scores(data, first.dataset, first.partition).items()
    }
    f1_curves_figure(
        _curves(data, group, selections).rename(columns=marked),
        title,
        path,
        target,
        {marked[name]: style for name, style in (styles or {}).items()},
        references,
        diverged,
    )


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
        similarity_figure(
            tables[0],
            tables[1],
            counts,
            (
                f"d_(k,c), round {records[0]['round']}",
                f"d_(k,c), round {records[-1]['round']}",
                f"training samples ({row.partition})",
            ),
            folder / "fig1_similarity.png",
        )
    convergence = _convergence_selections(params)
    if convergence:
        _curves_figure(
            data,
            TABLE,
            convergence,
            {m: method_label(m) for m in convergence},
            f"Fig 3a: {point_name(*figure_point(params))}, test micro-F1 ({over_seeds(len(fc.seeds))})",
            folder / "fig3a_convergence.png",
            fc.target_f1,
        )
    _curves(data, TABLE, convergence).reindex(columns=list(fc.methods)).reset_index().to_csv(
        folder / "fig3a_convergence.csv", index=False, float_format="%.6f"
    )
    if fc.sweeps.local_epochs:
        epochs, styles = _local_epochs_selections(params)
        _curves_figure(
            data,
            "local_epochs",
            epochs,
            {name: name for name in epochs},
            f"Fig 3b: {point_name(fc.sweeps.dataset, fc.sweeps.alpha)}, local epochs E",
            folder / "fig3b_local_epochs.png",
            fc.target_f1,
            styles,
        )
        _curves(data, "local_epochs", epochs).reset_index().to_csv(
            folder / "fig3b_local_epochs.csv", index=False, float_format="%.6f"
        )
    vectors = vectors_table(data, params)
    if not vectors.empty:
        partition = selected(data, "vectors", method="fedcmc")["partition"].iloc[0]
        trivial = {
            f"{CHANCE}: {name}": 100 * scores["micro_f1"]
            for name, scores in chance_scores(data, fc.sweeps.dataset, partition).items()
        }
        marks = {rule: health_mark(data, "vectors", method="fedcmc", vectors=rule) for rule in vectors.index}
        bar_figure(
            vectors,
            f"Fig 4: FedCMC's vectors, {point_name(fc.sweeps.dataset, fc.sweeps.vectors_alpha)}",
            "test micro-F1 (%)",
            folder / "fig4_vectors.png",
            len(fc.sweeps.seeds),
            trivial,
            marks,
        )
    (vectors / 100).rename(columns={"mean": "micro_f1"}).reset_index().to_csv(
        folder / "fig4_vectors.csv", index=False, float_format="%.6f"
    )
    (folder / "partitions").mkdir(exist_ok=True)
    for name, part in sorted(data.partitions.items()):
        shutil.copyfile(part.heatmap, folder / "partitions" / f"{name}.png")
