"""Stage fedmatch_table / fedmatch_sweeps: train and evaluate cells of FedMatch's grid.

One process runs every row of Tables 2-3 (``--tables``: every method of fedmatch.methods x seed) or every point
of Figs 5-8 (``--sweeps``); ``--method M`` or ``--sweep S`` (re)runs one row or one figure in place, for a quick look.
Each cell keeps its own checkpoint and output folder (``fedrepro.grid``).
"""

import argparse
import functools
from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.fedmatch.cells import SWEEPS, sweep_cells, table_cells, training_weight
from fedrepro.fedmatch.costs import largest_cell_gpu_memory
from fedrepro.fedmatch.runs import cell_inputs, headline, ledger_gold, run_cell, run_fingerprint
from fedrepro.fl.runtime import stage_federation
from fedrepro.grid import grid_label, placement, run_grid, sweep_rows, table_rows
from fedrepro.ledger import ResultsLedger
from fedrepro.models.backbone import check_loadable

MINED, TOKENIZER = Path("data/mined"), Path("data/tokenizer")
CHECKPOINTS, OUT = Path("data/checkpoints/fedmatch"), Path("data/fedmatch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--tables", action="store_true", help="every row of Tables 2-3: fedmatch.methods x fedmatch.seeds"
    )
    which.add_argument("--method", help="one row, in place: every seed of fedmatch.seeds")
    which.add_argument("--sweeps", action="store_true", help="Figs 5-8: every point x method x seed of fedmatch.sweeps")
    which.add_argument("--sweep", choices=sorted(SWEEPS), help="one figure's points, in place")
    parser.add_argument(
        "--plan", action="store_true", help="say what it would train and what that would cost; train nothing"
    )
    args = parser.parse_args()
    params = load_params()
    check_loadable(params.model.backbone, "model.backbone")
    if args.sweeps or args.sweep:
        folder, rows = sweep_rows(
            SWEEPS, lambda sweep: [c for c in sweep_cells(params) if c.sweep == sweep], args.sweep
        )
    else:
        folder, rows = table_rows(table_cells(params), params.fedmatch.methods, "fedmatch.methods", args.method)
    cells = [cell for row in rows.values() for cell in row]
    place = placement(
        params.train.threads, params.train.runtime, params.train.device, lambda: largest_cell_gpu_memory(params, cells)
    )
    grid = functools.partial(
        run_grid,
        rows,
        folder,
        OUT,
        CHECKPOINTS,
        lambda cell: cell_inputs(cell, MINED, TOKENIZER),
        lambda cell, out, checkpoints, digest: run_cell(params, cell, MINED, TOKENIZER, out, checkpoints, digest),
        headline,
        lambda cell, digest: run_fingerprint(params, cell, digest),
        workers=place.workers,
        resources=place.resources,
        environment=place.environment,
        weight=lambda cell: training_weight(params, cell),
        ledger=ResultsLedger.from_environment(ledger_gold(MINED), params.train.precision, params.train.device),
        label=grid_label(
            "fedmatch", folder, params.scale, params.train.precision, params.train.runtime, params.train.device
        ),
    )
    if args.plan:
        grid(plan_only=True)
        return
    with stage_federation(
        params.train.runtime, CHECKPOINTS / folder / "federation", place.workers * params.train.threads
    ):
        grid()


if __name__ == "__main__":
    run_stage(main)
