"""Stage fedcmc_table / fedcmc_sweep@<sweep>: train and evaluate cells of FedCMC's grid.

One process runs the whole of Table 2 (``--tables``: every method x dataset x alpha x seed) or every point of a
sweep, because importing torch and transformers costs about 5 s a process; each cell keeps its own checkpoint and
output folder (``tables/<method>/<cell>``), so a killed run resumes and a new grid point trains only the new
cells. ``--method M`` (re)runs one method's row in place.
"""

import argparse
from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import Params, load_params
from fedrepro.fedcmc.cells import SWEEPS, Cell, sweep_cells, table_cells
from fedrepro.fedcmc.runs import build_cell
from fedrepro.hardware import machine_fingerprint
from fedrepro.io import atomic_dir, tree_digest, write_json
from fedrepro.models.backbone import check_loadable

PREPARED, PARTITIONS, TOKENIZER = Path("data/prepared/re"), Path("data/fedcmc/partitions"), Path("data/fedcmc/tokenizer")
CHECKPOINTS, OUT = Path("data/checkpoints/fedcmc"), Path("data/fedcmc")


def parameter_counts(engine) -> dict[str, int]:
    params = engine.params
    return {"total": sum(p.numel() for p in params.values()),
            "uploaded": sum(params[n].numel() for n in engine.shared_names)}


def run_cell(params: Params, cell: Cell, out: Path, checkpoints: Path) -> None:
    """Train (or resume) one cell, then score the global model on the global valid and test sets."""
    digest = tree_digest(PREPARED / cell.dataset, PARTITIONS / cell.partition, TOKENIZER)  # this cell's inputs only
    engine = build_cell(params, cell, PREPARED, PARTITIONS, TOKENIZER, digest, checkpoints)
    state = engine.run()
    out.mkdir(parents=True)
    model = engine.global_model()
    predictions = engine.task.predict(model, "test")
    predictions.to_csv(out / "predictions.csv", index=False)
    write_json(out / "metrics.json", {
        "cell": {**cell.__dict__, "name": cell.name, "partition": cell.partition},
        "test": engine.task.scores(predictions),
        "valid": engine.task.evaluate(model, "global", "valid"),
        "history": state.history,
        "channel": engine.channel.summary(),
        "memory_bytes": engine.memory_bytes(),
        "parameters": parameter_counts(engine),
        "truncated_train_sentences": engine.task.truncated,
        "hardware": machine_fingerprint(),
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--tables", action="store_true", help="the main table: every method x dataset x alpha x seed")
    which.add_argument("--method", help="one method's row of the main table, in place")
    which.add_argument("--sweep", choices=sorted(SWEEPS), help="every point x method x seed of one sweep")
    args = parser.parse_args()
    params = load_params()
    check_loadable(params.fedcmc.settings.backbone, "fedcmc.settings.backbone")
    if args.sweep:
        folder = Path("sweeps") / args.sweep
        cells = {folder: sweep_cells(params, args.sweep)}
    else:
        if args.method and args.method not in params.fedcmc.methods:
            raise SystemExit(f"error: --method {args.method!r} is not in fedcmc.methods {params.fedcmc.methods}")
        folder = Path("tables") if args.tables else Path("tables") / args.method
        cells = {Path("tables") / m: [c for c in table_cells(params) if c.method == m]
                 for m in (params.fedcmc.methods if args.tables else [args.method])}
    (CHECKPOINTS / folder).mkdir(parents=True, exist_ok=True)  # a declared output, even for no cells
    with atomic_dir(OUT / folder) as tmp:
        for group, group_cells in cells.items():
            for cell in group_cells:
                run_cell(params, cell, tmp / group.relative_to(folder) / cell.name, CHECKPOINTS / group / cell.name)


if __name__ == "__main__":
    run_stage(main)
