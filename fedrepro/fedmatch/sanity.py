"""FedMatch's training-sanity protocol: a pooled reference against BM25 and random ranking, settings chosen on valid.

The reference is the cross-encoder trained centrally on the union of the clients' mined training triples (the
same capped triples the federated cells see), one run per learning rate, scored on every client's validation
candidates after every round. The trivial baselines rank the very same candidates: BM25 alone (the candidates'
scores over the pool they were mined from) and a uniformly random order (its exact expected MAP). The
protocol's test is per collection: the chosen reference must beat both by the stated margin on every one.

A round r < R of an R-round run is scored under the R-round learning-rate schedule (warm-up, then linear decay
to zero at round R), so "round r" is a point of that run, not a run trained for r rounds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from fedrepro.config import Params
from fedrepro.fedmatch.cells import Cell
from fedrepro.fl.engine import Engine
from fedrepro.fl.health import training_losses
from fedrepro.io import read_table
from fedrepro.metrics.ranking import random_ranking_metrics, ranking_metrics
from fedrepro.report.sanity import SanityResult
from fedrepro.retrieval.bm25 import score_candidates
from fedrepro.fedmatch.runs import cell_recipe
from fedrepro.tasks.qa import qrels_and_run

METRIC = "MAP (mean over collections)"
BM25, RANDOM = "BM25 only", "random order (exact expectation)"


def trivial_baselines(
    mined_dir: Path, partition_dir: Path, params: Params, split: str = "valid"
) -> dict[str, dict[str, float]]:
    """Per client: MAP of ranking ``split``'s candidates by BM25 alone and the expected MAP of a random order."""
    mine, scores = params.mine, {BM25: {}, RANDOM: {}}
    for folder in sorted(p for p in Path(mined_dir).iterdir() if p.is_dir()):
        candidates = read_table(folder / "candidates.parquet")
        candidates = candidates[candidates["split"] == split]
        pool = read_table(Path(partition_dir) / folder.name / "pool.parquet")
        scored = score_candidates(candidates, pool, mine.backend, k1=mine.k1, b=mine.b, es_url=mine.es_url)
        scores[BM25][folder.name] = ranking_metrics(*qrels_and_run(scored))["map"]
        scores[RANDOM][folder.name] = random_ranking_metrics(*qrels_and_run(candidates.assign(score=0.0)))["map"]
    return scores


def pooled_reference(
    params: Params,
    lr: float,
    rounds: int,
    mined_dir: Path,
    tokenizer_dir: Path,
    digest: str,
    checkpoint_dir: Path,
    seed: int = 0,
) -> list[dict]:
    """Train the pooled reference at ``lr`` for ``rounds`` rounds (one epoch of the pooled triples each); per round
    its training loss and every client's validation MAP, read from the run's history, so a resumed or finished
    run gives the same points."""
    recipe = cell_recipe(params, Cell("centralised", seed), mined_dir, tokenizer_dir, digest)
    settings = dataclasses.replace(recipe.settings, lr=lr, rounds=rounds, eval_every=1)
    task, algorithm = recipe.build()
    engine = Engine(
        task, algorithm, settings, checkpoint_dir, f"{recipe.fingerprint}-sanity-{lr}-{rounds}", progress=True
    )
    points, history = [], engine.run().history
    for record, loss in zip(history, training_losses(history)):
        per_client = {client: values["map"] for client, values in sorted(record["valid"].items())}
        points.append(
            {
                "lr": lr,
                "round": record["round"],
                "train_loss": loss,
                "valid": sum(per_client.values()) / len(per_client),
                **{f"valid {c}": v for c, v in per_client.items()},
            }
        )
    return points


def run_sanity(
    params: Params,
    lrs: list[float],
    rounds: int,
    mined_dir: Path,
    partition_dir: Path,
    tokenizer_dir: Path,
    digest: str,
    checkpoint_root: Path,
    margin: float,
) -> tuple[SanityResult, dict[str, dict[str, float]]]:
    """The sweep over ``lrs`` and the baselines; the per-client baselines come back too, for the per-collection test."""
    baselines = trivial_baselines(mined_dir, partition_dir, params)
    rows = []
    for lr in lrs:
        rows += pooled_reference(params, lr, rounds, mined_dir, tokenizer_dir, digest, checkpoint_root / f"lr{lr:g}")
    triples = {p.name: len(read_table(p / "triples.parquet")) for p in sorted(Path(mined_dir).iterdir()) if p.is_dir()}
    model, train = params.model, params.train
    layers = f"lowest {model.keep_layers} layers" if model.keep_layers else "all layers"
    notes = [
        f"Pooled training triples: {sum(triples.values())} ({', '.join(f'{c} {n}' for c, n in triples.items())}), "
        f"the federated cells' own caps; backbone {model.backbone} ({layers}), max length "
        f"{model.max_length}, batch {train.batch_size}, {train.precision}, {rounds} rounds, warm-up then linear decay "
        "over the whole run, seed 0. A round r < the last is scored under the full run's schedule.",
        "The protocol's test is per collection (below): the chosen reference must beat both BM25 alone and the "
        "random order on every collection by the margin; the verdict above compares only the means.",
    ]
    result = SanityResult(
        "FedMatch",
        METRIC,
        margin,
        pd.DataFrame(rows),
        ["lr"],
        {name: sum(v.values()) / len(v) for name, v in baselines.items()},
        notes,
    )
    return result, baselines


def per_collection(result: SanityResult, baselines: dict[str, dict[str, float]]) -> pd.DataFrame:
    """At the chosen setting and round: each collection's validation MAP against BM25 and random, and its margin
    over the better of the two (BM25 can sit below random: its candidates are BM25's own top non-gold hits)."""
    choice = result.choice()
    if not choice:
        return pd.DataFrame()
    point = result.sweep[(result.sweep["lr"] == choice["lr"]) & (result.sweep["round"] == choice["round"])].iloc[0]
    rows = []
    for client in sorted(baselines[BM25]):
        reference = float(point[f"valid {client}"])
        best = max(baselines[BM25][client], baselines[RANDOM][client])
        rows.append(
            {
                "collection": client,
                "pooled reference": reference,
                BM25: baselines[BM25][client],
                RANDOM: baselines[RANDOM][client],
                "margin over the better": reference - best,
                "passed": reference - best >= result.margin,
            }
        )
    return pd.DataFrame(rows)
