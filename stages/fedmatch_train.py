"""Stage fedmatch_table / fedmatch_sweep@<sweep>: train and evaluate cells of FedMatch's grid.

One process runs every row of Tables 2-3 (``--tables``: every method of fedmatch.methods x seed) or every point
of a figure (``--sweep``): importing torch and transformers costs about 5 s a process, more than a small cell's
training, so a process per row would spend most of the embedded run starting up. Each cell still has its own
checkpoint and output folder, so a killed run resumes, and adding a method, a seed or a sweep point trains only
the new cells (the others resume from their finished checkpoints and are only re-evaluated). ``--method M``
(re)runs one row in place, for a quick look at one method.
"""

import argparse
from pathlib import Path

import torch

from fedrepro.cli import run_stage
from fedrepro.config import Params, load_params
from fedrepro.fedmatch.cells import SWEEPS, Cell, sweep_cells
from fedrepro.hardware import machine_fingerprint
from fedrepro.io import atomic_dir, tree_digest, write_json
from fedrepro.metrics.ranking import ranking_metrics, trec_files
from fedrepro.metrics.summary import overall
from fedrepro.models.backbone import check_loadable
from fedrepro.models.patches import patch_effect, patch_norms
from fedrepro.fedmatch.report import history_health
from fedrepro.runs import build_cell
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
    """Train (or resume) one cell, then score each client's own model on its test candidates and measure how far
    its private patch (if any) moved from its initial weights."""
    engine = build_cell(params, cell, MINED, TOKENIZER, digest, checkpoints)
    state = engine.run()
    (out / "trec").mkdir(parents=True)
    per_client, norms = {}, {}
    with torch.no_grad():
        for client_id, model in engine.client_models():
            norms[client_id] = patch_norms(model.named_parameters(), engine.initial_private)
            if norms[client_id]:
                norms[client_id].update(patch_effect(model, engine.task.candidate_batches(client_id, "valid")))
            qrels, run = qrels_and_run(engine.task.score(model, client_id, "test"))
            per_client[client_id] = ranking_metrics(qrels, run)
            qrels_text, run_text = trec_files(qrels, run, cell.name)
            (out / "trec" / f"{client_id}.qrels").write_text(qrels_text)
            (out / "trec" / f"{client_id}.run").write_text(run_text)
    write_json(out / "metrics.json", {
        "cell": {"method": cell.method, "seed": cell.seed, "sweep": cell.sweep, "value": cell.value},
        "history": state.history,
        "health": history_health(state.history).as_dict(),
        "test": {"clients": per_client, "overall": overall(per_client)},
        "channel": engine.channel.summary(),
        "memory_bytes": engine.memory_bytes(),
        "parameters": parameter_counts(engine),
        **({"patch_norms": norms} if any(norms.values()) else {}),
        "hardware": machine_fingerprint(),
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--tables", action="store_true", help="every row of Tables 2-3: fedmatch.methods x fedmatch.seeds")
    which.add_argument("--method", help="one row, in place: every seed of fedmatch.seeds")
    which.add_argument("--sweep", choices=sorted(SWEEPS), help="a figure: every point x method x seed of fedmatch.sweeps")
    args = parser.parse_args()
    params = load_params()
    check_loadable(params.model.backbone, "model.backbone")
    if args.sweep:
        folder = Path("sweeps") / args.sweep
        cells = {folder: [c for c in sweep_cells(params) if c.sweep == args.sweep]}
    else:
        methods = params.fedmatch.methods if args.tables else [args.method]
        if args.method and args.method not in params.fedmatch.methods:
            raise SystemExit(f"error: --method {args.method!r} is not in fedmatch.methods {params.fedmatch.methods}")
        folder = Path("tables") if args.tables else Path("tables") / args.method
        cells = {Path("tables") / m: [Cell(m, seed) for seed in params.fedmatch.seeds] for m in methods}
    digest = tree_digest(MINED, TOKENIZER)
    (Path("data/checkpoints/fedmatch") / folder).mkdir(parents=True, exist_ok=True)  # a declared output, even for no cells
    with atomic_dir(Path("data/fedmatch") / folder) as tmp:
        for group, group_cells in cells.items():
            for cell in group_cells:
                out = tmp / group.relative_to(folder) / cell.name
                run_cell(params, cell, out, Path("data/checkpoints/fedmatch") / group / cell.name, digest)


if __name__ == "__main__":
    run_stage(main)
