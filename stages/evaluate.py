"""Stage evaluate: MAP and MRR of each client's own final model on its test candidates."""

import argparse
from pathlib import Path

import pandas as pd
import torch

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.errors import DataError
from fedrepro.fl.engine import POOLED
from fedrepro.io import atomic_dir, write_json, write_table
from fedrepro.metrics.ranking import ranking_metrics
from fedrepro.metrics.summary import overall
from fedrepro.runs import build_qa_engine
from fedrepro.tasks.qa import qrels_and_run

MINED, TOKENIZER = Path("data/mined"), Path("data/tokenizer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithm", required=True)
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args()
    cell = f"{args.algorithm}-{args.seed}"
    trained = Path("data/train") / cell
    engine = build_qa_engine(load_params(), args.algorithm, args.seed, MINED, TOKENIZER, trained, progress=False)
    if engine.state.next_round < engine.settings.rounds:
        raise DataError(f"{trained}/latest was not trained with the current params and data; run `dvc repro`")
    per_client, scored = {}, []
    for client_id in engine.task.client_ids:
        engine.load_client(POOLED if engine.algorithm.pooled else client_id)
        engine.model.eval()
        with torch.no_grad():
            scores = engine.task.score(engine.model, client_id, "test")
        per_client[client_id] = ranking_metrics(*qrels_and_run(scores))
        scored.append(scores.assign(client=client_id))
    with atomic_dir(Path("data/eval") / cell) as tmp:
        write_json(tmp / "metrics.json", {"algorithm": args.algorithm, "seed": args.seed, "clients": per_client, "overall": overall(per_client)})
        write_table(tmp / "scores.parquet", pd.concat(scored, ignore_index=True))


if __name__ == "__main__":
    run_stage(main)
