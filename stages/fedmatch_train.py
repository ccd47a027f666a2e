"""Stage fedmatch_table@<method> / fedmatch_fig<N>: train and evaluate cells of FedMatch's grid.

One process runs every seed of a table row (or every point of a figure): importing torch and transformers
costs about 4 s a process, more than a small cell's training. Each cell still has its own checkpoint and
output folder, so a killed run resumes, and adding a seed or a sweep point trains only the new cells (the
others resume from their finished checkpoints and are only re-evaluated).
"""

import argparse
from pathlib import Path

import torch

from fedrepro.cli import run_stage
from fedrepro.config import Params, load_params
from fedrepro.fedmatch.cells import SWEEPS, Cell, sweep_cells
from fedrepro.io import atomic_dir, write_json
from fedrepro.metrics.ranking import ranking_metrics, trec_files
from fedrepro.metrics.summary import overall
from fedrepro.runs import build_cell, tree_digest
from fedrepro.tasks.qa import qrels_and_run

MINED, TOKENIZER = Path("data/mined"), Path("data/tokenizer")


def parameter_counts(engine) -> dict[str, int]:
    """Total, trainable, private (never sent) and uploaded (sent by a client each round it trains) parameters."""
    params = engine.params
    return {"total": sum(p.numel() for p in params.values()),
            "trainable": sum(p.numel() for p in params.values() if p.requires_grad),
            "private": sum(params[n].numel() for n in engine.private_names),
            "uploaded": sum(params[n].numel() for n in engine.shared_names) if engine.algorithm.federated else 0}


def run_cell(params: Params, cell: Cell, out: Path, checkpoints: Path, digest: str) -> None:
    """Train (or resume) one cell, then score each client's own model on its test candidates."""
    engine = build_cell(params, cell, MINED, TOKENIZER, digest, checkpoints)
    state = engine.run()
    (out / "trec").mkdir(parents=True)
    per_client = {}
    with torch.no_grad():
        for client_id, model in engine.client_models():
            qrels, run = qrels_and_run(engine.task.score(model, client_id, "test"))
            per_client[client_id] = ranking_metrics(qrels, run)
            qrels_text, run_text = trec_files(qrels, run, cell.name)
            (out / "trec" / f"{client_id}.qrels").write_text(qrels_text)
            (out / "trec" / f"{client_id}.run").write_text(run_text)
    write_json(out / "metrics.json", {
        "cell": {"method": cell.method, "seed": cell.seed, "sweep": cell.sweep, "value": cell.value},
        "history": state.history,
        "test": {"clients": per_client, "overall": overall(per_client)},
        "channel": engine.channel.summary(),
        "memory_bytes": engine.memory_bytes(),
        "parameters": parameter_counts(engine),
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--method", help="a table row: every seed of fedmatch.seeds")
    which.add_argument("--sweep", choices=sorted(SWEEPS), help="a figure: every point x method x seed of fedmatch.sweeps")
    args = parser.parse_args()
    params = load_params()
    if args.method:
        cells, folder = [Cell(args.method, seed) for seed in params.fedmatch.seeds], Path("tables") / args.method
    else:
        cells, folder = [c for c in sweep_cells(params) if c.sweep == args.sweep], Path("sweeps") / args.sweep
    digest = tree_digest(MINED, TOKENIZER)
    (Path("data/checkpoints/fedmatch") / folder).mkdir(parents=True, exist_ok=True)  # a declared output, even for no cells
    with atomic_dir(Path("data/fedmatch") / folder) as tmp:
        for cell in cells:
            run_cell(params, cell, tmp / cell.name, Path("data/checkpoints/fedmatch") / folder / cell.name, digest)


if __name__ == "__main__":
    run_stage(main)
