"""Does bf16 autocast keep FedMatch's results sound? One cell trained in fp32 and in bf16, same seed and data.

Reads a project that has run its FedMatch table (default: this checkout). The bf16 side reuses the project's
finished checkpoint when its params say bf16 (the engine resumes it at once); the fp32 side trains in a
temporary folder. Prints test MAP/MRR of both and the wall time of each training.
Usage: python bench/bench_precision.py [--project DIR] [--method fedmatch_h_lr]
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from fedrepro.config import load_params
from fedrepro.fedmatch.cells import Cell
from fedrepro.metrics.ranking import ranking_metrics
from fedrepro.metrics.summary import overall
from fedrepro.io import tree_digest
from fedrepro.fedmatch.runs import build_cell
from fedrepro.tasks.qa import qrels_and_run


def train_and_score(params, cell: Cell, project: Path, checkpoints: Path) -> tuple[dict, float]:
    mined, tokenizer = project / "data" / "mined", project / "data" / "tokenizer"
    engine = build_cell(params, cell, mined, tokenizer, tree_digest(mined, tokenizer), checkpoints, progress=False)
    started = time.perf_counter()
    engine.run()
    seconds = time.perf_counter() - started
    with torch.no_grad():
        scores = {
            c: ranking_metrics(*qrels_and_run(engine.task.score(m, c, "test"))) for c, m in engine.client_models()
        }
    return overall(scores), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--method", default="fedmatch_h_lr")
    args = parser.parse_args()
    project = args.project.resolve()
    os.chdir(project)
    params = load_params(project / "params.yaml")
    cell = Cell(args.method, params.fedmatch.seeds[0])
    results = {}
    for precision in ("bf16", "fp32"):
        chosen = params.model_copy(update={"train": params.train.model_copy(update={"precision": precision})})
        reuse = project / "data" / "checkpoints" / "fedmatch" / "tables" / args.method / cell.name
        with tempfile.TemporaryDirectory() as scratch:
            folder = reuse if precision == params.train.precision and reuse.exists() else Path(scratch)
            results[precision] = train_and_score(chosen, cell, project, folder)
    for precision, (metrics, seconds) in results.items():
        print(
            f"{precision}: test MAP {metrics['map']:.4f}, MRR {metrics['mrr']:.4f} (training this run: {seconds:.0f} s)"
        )
    gap = results["bf16"][0]["mrr"] - results["fp32"][0]["mrr"]
    print(f"{cell.name} at scale {params.scale}: MRR bf16 - fp32 = {gap:+.4f}")


if __name__ == "__main__":
    main()
