"""Stage ssvfnas_table@<method> / ssvfnas_baseline: run cells of SS-VFNAS's grid.

``--method M``: every (dataset, K) x DP level x seed of one method (pre-search for ss_ methods, collaborative
search, derived genotypes, retraining, test accuracy). ``--baseline``: the hand-designed networks once per
(dataset, K) x DP level x seed, trained like the derived ones. One process per stage, because importing torch costs
seconds a process; each cell keeps its own checkpoint folder (``data/checkpoints/ssvfnas/tables/<method>/<cell>``),
so a killed run resumes where it stopped and a new grid point runs only the new cells.
"""

import argparse
import sys
import time
from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.io import atomic_dir
from fedrepro.runs import tree_digest
from fedrepro.ssvfnas.cells import BASELINE, baseline_cells, table_cells
from fedrepro.ssvfnas.runs import run_cell

PARTITIONS, CHECKPOINTS, OUT = Path("data/ssvfnas/partitions"), Path("data/checkpoints/ssvfnas/tables"), Path("data/ssvfnas/tables")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--method", help="a method's cells of the main table: every dataset/K x DP level x seed")
    which.add_argument("--baseline", action="store_true", help="the hand-designed baseline's cells")
    args = parser.parse_args()
    params = load_params()
    method = BASELINE if args.baseline else args.method
    cells = baseline_cells(params) if args.baseline else [c for c in table_cells(params) if c.method == args.method]
    if not args.baseline and args.method not in params.ssvfnas.methods:
        raise SystemExit(f"error: --method {args.method!r} is not in ssvfnas.methods {params.ssvfnas.methods}")
    (CHECKPOINTS / method).mkdir(parents=True, exist_ok=True)  # a declared output, even for no cells
    digests: dict[str, str] = {}
    cache: dict = {}
    with atomic_dir(OUT / method) as tmp:
        for index, cell in enumerate(cells, 1):
            started = time.perf_counter()
            if cell.partition not in digests:  # this cell's inputs only
                digests[cell.partition] = tree_digest(PARTITIONS / cell.partition)
            metrics = run_cell(params, cell, PARTITIONS / cell.partition, tmp / cell.name, CHECKPOINTS / method / cell.name,
                               digests[cell.partition], cache)
            eps = metrics["epsilon_total_max"]
            print(f"[{index}/{len(cells)}] {cell.name}: test accuracy {metrics['test']['accuracy']:.3f}, epsilon "
                  f"{'-' if eps is None else f'{eps:.2f}'} ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    run_stage(main)
