"""Stage ssvfnas_table: run the cells of SS-VFNAS's main table.

``--tables``: every method of ssvfnas.methods x (dataset, K) x DP level x seed (pre-search for ss_ methods,
collaborative search, derived genotypes, retraining, test accuracy), then the hand-designed baseline once per
(dataset, K) x DP level x seed, trained like the derived ones, and the label party alone (its own network on its own
features) once per (dataset, K) x seed. ``--method M`` (``label_party_alone`` too) / ``--baseline`` (re)run one row
in place. Each cell keeps its own checkpoint folder (``data/checkpoints/ssvfnas/tables/<method>/<cell>``,
``fedrepro.grid``).
"""

import argparse
import functools
from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.fl.flower.ray_head import simulated_stage
from fedrepro.grid import grid_label, placement, run_grid, table_rows
from fedrepro.ledger import ResultsLedger
from fedrepro.ssvfnas.cells import BASELINE, LABEL_ALONE, all_cells
from fedrepro.ssvfnas.runs import cell_inputs, headline, ledger_gold, run_cell, run_fingerprint

PARTITIONS, CHECKPOINTS, OUT = Path("data/ssvfnas/partitions"), Path("data/checkpoints/ssvfnas"), Path("data/ssvfnas")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--tables", action="store_true", help="every method's cells, the baseline's and the label party alone's"
    )
    which.add_argument("--method", help="one method's cells, in place: every dataset/K x DP level x seed")
    which.add_argument("--baseline", action="store_true", help="the hand-designed baseline's cells, in place")
    parser.add_argument(
        "--plan", action="store_true", help="say what it would train and what that would cost; train nothing"
    )
    args = parser.parse_args()
    params = load_params()
    folder, rows = table_rows(
        all_cells(params),
        [*params.ssvfnas.methods, BASELINE, LABEL_ALONE],
        f"ssvfnas.methods (or {BASELINE}, {LABEL_ALONE})",
        BASELINE if args.baseline else args.method,
    )
    presearch_cache: dict = {}  # a pre-search depends only on the partition and the seed: once per process (each
    # child a stage forks to train cells at once runs its own, to the same result)
    place = placement(
        params.ssvfnas.threads, params.train.runtime, params.train.device
    )  # one cell a GPU (fedrepro/ssvfnas/costs.py)
    grid = functools.partial(
        run_grid,
        rows,
        folder,
        OUT,
        CHECKPOINTS,
        lambda cell: cell_inputs(cell, PARTITIONS),
        lambda cell, out, checkpoints, digest: run_cell(
            params, cell, PARTITIONS, out, checkpoints, digest, presearch_cache
        ),
        headline,
        lambda cell, digest: run_fingerprint(params, cell, digest),
        workers=place.workers,
        resources=place.resources,
        environment=place.environment,
        ledger=ResultsLedger.from_environment(
            ledger_gold(PARTITIONS), "fp32", params.train.device
        ),  # SS-VFNAS trains in fp32
        label=grid_label("ssvfnas", folder, params.scale, "fp32", params.train.runtime, params.train.device),
    )
    if args.plan:
        grid(plan_only=True)
        return
    with simulated_stage(params.train.runtime, place.workers * params.ssvfnas.threads):
        grid()


if __name__ == "__main__":
    run_stage(main)
