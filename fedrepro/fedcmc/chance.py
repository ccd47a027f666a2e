"""What a FedCMC cell that learned nothing beyond its partition's prior scores, and the signs of one: the trivial
baselines (``chance_scores``), the best of them (``chance_level``) with the margin a cell must clear, and main-table
points where different methods predicted every test sentence alike. The tables, figures, claims and caveats all read
the cells against these, so they are computed in one place."""

from __future__ import annotations

from fedrepro.config import Params
from fedrepro.fedcmc.results import TABLE, FedCMCResults
from fedrepro.fedcmc.selection import main_points, method_label, point_name, selected
from fedrepro.metrics.classification import trivial_scores


CHANCE = "trivial"
CHANCE_MARGIN = 0.01
"""a cell less than this (micro-F1) above the best trivial baseline learned little beyond the prior."""


def chance_scores(
    data: FedCMCResults, dataset: str, partition: str, scored_on: str | None = None
) -> dict[str, dict[str, float]]:
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
            groups += [
                f"{point_name(dataset, alpha)} seed {seed}: {', '.join(m)}" for m in alike.values() if len(m) > 1
            ]
    return groups
