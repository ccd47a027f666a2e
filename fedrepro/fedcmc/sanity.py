"""FedCMC's training-sanity protocol: a pooled reference against the trivial baselines, settings chosen on valid.

The reference is the relation classifier trained centrally on the union of the clients' training shares (the
same capped sentences the federated cells see), one run per learning rate, scored on the global validation set
after every round. The trivial baselines are scored in the headline metric (micro-F1 over the positive classes):
always answering the most frequent positive training class, and stratified random guessing (a class drawn from
the training prior for every sentence; its expected micro-F1 from the expected counts, so no draw is needed).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
from fedrepro.config import Params
from fedrepro.fedcmc.cells import Cell
from fedrepro.fedcmc.runs import cell_recipe
from fedrepro.fl.engine import GLOBAL, Engine
from fedrepro.fl.health import training_losses
from fedrepro.metrics.classification import trivial_scores
from fedrepro.report.sanity import SanityResult
from fedrepro.tasks.relation import RelationTask

METRIC = "micro-F1 (positive classes)"


def trivial_baselines(task: RelationTask, split: str = "valid") -> dict[str, float]:
    """Micro-F1 of ``trivial_scores`` on one of the task's global evaluation sets, with the pooled training counts."""
    counts = sum(task.label_counts(c) for c in task.client_ids).tolist()
    scores = trivial_scores(
        task.eval_sets[split][0]["label"], dict(zip(task.classes, counts)), [task.classes[i] for i in task.positive]
    )
    return {name: values["micro_f1"] for name, values in scores.items()}


def train_reference(
    params: Params,
    dataset: str,
    alpha: float,
    lr: float,
    rounds: int,
    folders: tuple[Path, Path, Path],
    digest: str,
    checkpoint_dir: Path,
    seed: int = 0,
    method: str = "centralised",
) -> tuple[list[dict], RelationTask]:
    """Train the pooled reference (or, for the federated one, ``method``'s cell) at ``lr`` for ``rounds`` rounds; per
    round its loss on the training data and the global model's valid micro-F1."""
    cell = Cell(method, dataset, alpha, params.fedcmc.settings.clients, params.fedcmc.settings.local_epochs, seed)
    recipe = cell_recipe(params, cell, *folders, digest)
    settings = dataclasses.replace(recipe.settings, lr=lr, rounds=rounds, eval_every=1, eval_splits=("valid",))
    task, algorithm = recipe.build()
    engine = Engine(
        task, algorithm, settings, checkpoint_dir, f"{recipe.fingerprint}-sanity-{lr}-{rounds}", progress=True
    )
    history = engine.run().history  # checkpointed every round: a killed sweep resumes with every score kept
    points = [
        {"alpha": alpha, "lr": lr, "round": r["round"], "train_loss": loss, "valid": r["valid"][GLOBAL]["micro_f1"]}
        for r, loss in zip(history, training_losses(history))
    ]
    return points, task


def run_sanity(
    params: Params,
    dataset: str,
    lrs: list[float],
    rounds: int,
    folders: tuple[Path, Path, Path],
    digest: str,
    checkpoint_root: Path,
    margin: float,
) -> SanityResult:
    """The sweep over ``lrs`` for one corpus, at the first alpha of the grid (the pooled data do not depend on it)."""
    alpha = params.fedcmc.alphas[0]
    rows, task = [], None
    for lr in lrs:
        points, task = train_reference(
            params, dataset, alpha, lr, rounds, folders, digest, checkpoint_root / f"{dataset}-lr{lr:g}"
        )
        rows += points
    notes = [
        f"Corpus `{dataset}`: {task.num_train_samples(task.client_ids)} pooled training sentences, "
        f"{len(task.eval_sets['valid'][0])} validation sentences; backbone {params.fedcmc.settings.backbone}, "
        f"batch {params.fedcmc.settings.batch_size}, {rounds} epochs, warm-up then linear decay, seed 0."
    ]
    sweep = pd.DataFrame(rows).drop(columns="alpha")  # the pooled sentences do not depend on the partition's alpha
    return SanityResult(f"FedCMC ({dataset})", METRIC, margin, sweep, ["lr"], trivial_baselines(task), notes)


def run_federated_sanity(
    params: Params,
    dataset: str,
    method: str,
    alphas: list[float],
    lrs: list[float],
    rounds: int,
    digests: dict[float, str],
    folders: tuple[Path, Path, Path],
    checkpoint_root: Path,
    margin: float,
) -> SanityResult:
    """The federated reference: ``method`` (FedAvg) at every alpha of the grid for each lr, scored on valid. The
    pooled reference says what the model can learn from these sentences; this says which lr and rounds let a
    federation learn it under the grid's label skew without diverging, which the pooled run cannot tell."""
    rows, task = [], None
    for alpha in alphas:
        for lr in lrs:
            points, task = train_reference(
                params,
                dataset,
                alpha,
                lr,
                rounds,
                folders,
                digests[alpha],
                checkpoint_root / f"{dataset}-a{alpha:g}-{method}-lr{lr:g}",
                method=method,
            )
            rows += points
    notes = [
        f"Corpus `{dataset}`: {task.num_train_samples(task.client_ids)} training sentences over "
        f"{params.fedcmc.settings.clients} clients (Dirichlet alpha {', '.join(f'{a:g}' for a in alphas)}), "
        f"{len(task.eval_sets['valid'][0])} validation sentences; backbone {params.fedcmc.settings.backbone}, "
        f"batch {params.fedcmc.settings.batch_size}, {params.fedcmc.settings.local_work()}, {rounds} rounds, seed 0. "
        "The training loss is the global model's on the clients' training data after each round."
    ]
    return SanityResult(
        f"FedCMC ({dataset}, federated: {method})",
        METRIC,
        margin,
        pd.DataFrame(rows),
        ["alpha", "lr"],
        trivial_baselines(task),
        notes,
        reference=f"A federated reference ({method}, every client every "
        "round), trained on the same capped data and partitions as the grid's cells,",
        averaged=["alpha"],
    )
