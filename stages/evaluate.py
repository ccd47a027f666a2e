"""Stage evaluate: MAP and MRR of each client's own final model on its test candidates, for every cell,
and the chance level: the same metrics for a random ordering of the same candidates."""

from pathlib import Path

import pandas as pd
import torch

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.errors import DataError
from fedrepro.io import atomic_dir, write_json, write_table
from fedrepro.metrics.ranking import random_ranking_metrics, ranking_metrics
from fedrepro.metrics.summary import overall
from fedrepro.runs import build_engine, build_qa_task, tree_digest
from fedrepro.tasks.qa import qrels_and_run

MINED, TOKENIZER, TRAINED, OUT = Path("data/mined"), Path("data/tokenizer"), Path("data/train"), Path("data/eval")


def main() -> None:
    params = load_params()
    task = build_qa_task(params, MINED, TOKENIZER)
    digest = tree_digest(MINED, TOKENIZER)
    with atomic_dir(OUT) as tmp:
        for algorithm in params.train.algorithms:
            for seed in params.train.seeds:
                cell = f"{algorithm}-{seed}"
                engine = build_engine(params, task, algorithm, seed, digest, TRAINED / cell, progress=False)
                if engine.state.next_round < engine.settings.rounds:
                    raise DataError(f"{TRAINED / cell}/latest was not trained with the current params and data; run `dvc repro`")
                per_client, scored = {}, []
                with torch.no_grad():
                    for client_id, model in engine.client_models():
                        scores = task.score(model, client_id, "test")
                        per_client[client_id] = ranking_metrics(*qrels_and_run(scores))
                        scored.append(scores.assign(client=client_id))
                (tmp / cell).mkdir()
                write_json(tmp / cell / "metrics.json", {"algorithm": algorithm, "seed": seed, "clients": per_client, "overall": overall(per_client)})
                write_table(tmp / cell / "scores.parquet", pd.concat(scored, ignore_index=True))
        chance = {}
        for client_id in task.client_ids:
            test = task.candidates[client_id].query("split == 'test'").assign(score=0.0)
            chance[client_id] = random_ranking_metrics(*qrels_and_run(test), seed=params.data.seed)
        write_json(tmp / "chance.json", {"clients": chance, "overall": overall(chance)})


if __name__ == "__main__":
    run_stage(main)
