"""Stage fedcmc_table / fedcmc_sweeps: train and evaluate cells of FedCMC's grid.

One process runs the whole of Table 2 (``--tables``: every method x dataset x alpha x seed) or every point of every
sweep (``--sweeps``); ``--method M`` or ``--sweep S`` (re)runs one method's row or one sweep in place. Each cell
keeps its own checkpoint and output folder (``tables/<method>/<cell>``, ``fedrepro.grid``).
"""

import argparse
import functools
from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.fedcmc.cells import SWEEPS, sweep_cells, table_cells, training_weight
from fedrepro.fedcmc.costs import largest_cell_gpu_memory
from fedrepro.fedcmc.runs import cell_inputs, check_methods, headline, ledger_gold, run_cell, run_fingerprint
from fedrepro.fl.runtime import stage_federation
from fedrepro.grid import grid_label, placement, run_grid, sweep_rows, table_rows
from fedrepro.ledger import ResultsLedger
from fedrepro.models.backbone import check_loadable

PREPARED, PARTITIONS, TOKENIZER = (
    Path("data/prepared/re"),
    Path("data/fedcmc/partitions"),
    Path("data/fedcmc/tokenizer"),
)
CHECKPOINTS, OUT = Path("data/checkpoints/fedcmc"), Path("data/fedcmc")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--tables", action="store_true", help="the main table: every method x dataset x alpha x seed")
    which.add_argument("--method", help="one method's row of the main table, in place")
    which.add_argument("--sweeps", action="store_true", help="every point x method x seed of every sweep")
    which.add_argument("--sweep", choices=sorted(SWEEPS), help="one sweep's points, in place")
    parser.add_argument(
        "--plan", action="store_true", help="say what it would train and what that would cost; train nothing"
    )
    args = parser.parse_args()
    params = load_params()
    check_methods(params)
    check_loadable(params.fedcmc.settings.backbone, "fedcmc.settings.backbone")
    if args.sweeps or args.sweep:
        folder, rows = sweep_rows(SWEEPS, lambda sweep: sweep_cells(params, sweep), args.sweep)
    else:
        folder, rows = table_rows(table_cells(params), params.fedcmc.methods, "fedcmc.methods", args.method)
    folders = (PREPARED, PARTITIONS, TOKENIZER)
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
        lambda cell: cell_inputs(cell, *folders),
        lambda cell, out, checkpoints, digest: run_cell(params, cell, *folders, out, checkpoints, digest),
        headline,
        lambda cell, digest: run_fingerprint(params, cell, digest),
        workers=place.workers,
        resources=place.resources,
        environment=place.environment,
        weight=lambda cell: training_weight(params, cell),
        ledger=ResultsLedger.from_environment(ledger_gold(PARTITIONS), params.train.precision, params.train.device),
        label=grid_label(
            "fedcmc", folder, params.scale, params.train.precision, params.train.runtime, params.train.device
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
