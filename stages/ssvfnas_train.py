"""Stage ssvfnas_table: run the cells of SS-VFNAS's main table.

``--tables``: every method of ssvfnas.methods x (dataset, K) x DP level x seed (pre-search for ss_ methods,
collaborative search, derived genotypes, retraining, test accuracy), then the hand-designed baseline once per
(dataset, K) x DP level x seed, trained like the derived ones. ``--method M`` / ``--baseline`` (re)run one row
in place. One process for the table, because importing torch costs seconds a process; each cell keeps its own
checkpoint folder (``data/checkpoints/ssvfnas/tables/<method>/<cell>``), so a killed run resumes where it
stopped and a new grid point runs only the new cells.
"""

import argparse
import sys
import time
from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.io import atomic_dir, tree_digest
from fedrepro.ssvfnas.cells import BASELINE, baseline_cells, table_cells
from fedrepro.ssvfnas.runs import run_cell

PARTITIONS, CHECKPOINTS, OUT = Path("data/ssvfnas/partitions"), Path("data/checkpoints/ssvfnas/tables"), Path("data/ssvfnas/tables")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--tables", action="store_true", help="every method's cells and the baseline's")
    which.add_argument("--method", help="one method's cells, in place: every dataset/K x DP level x seed")
    which.add_argument("--baseline", action="store_true", help="the hand-designed baseline's cells, in place")
    args = parser.parse_args()
    params = load_params()
    if args.method and args.method not in params.ssvfnas.methods:
        raise SystemExit(f"error: --method {args.method!r} is not in ssvfnas.methods {params.ssvfnas.methods}")
    rows = {m: [c for c in table_cells(params) if c.method == m] for m in params.ssvfnas.methods}
    rows[BASELINE] = baseline_cells(params)
    chosen = list(rows) if args.tables else [BASELINE if args.baseline else args.method]
    folder = Path() if args.tables else Path(chosen[0])
    (CHECKPOINTS / folder).mkdir(parents=True, exist_ok=True)  # a declared output, even for no cells
    digests: dict[str, str] = {}
    cache: dict = {}
    total, index = sum(len(rows[m]) for m in chosen), 0
    with atomic_dir(OUT / folder) as tmp:
        for method in chosen:
            (CHECKPOINTS / method).mkdir(parents=True, exist_ok=True)
            for cell in rows[method]:
                index += 1
                started = time.perf_counter()
                if cell.partition not in digests:  # this cell's inputs only
                    digests[cell.partition] = tree_digest(PARTITIONS / cell.partition)
                out = tmp / Path(method).relative_to(folder) / cell.name
                metrics = run_cell(params, cell, PARTITIONS / cell.partition, out, CHECKPOINTS / method / cell.name,
                                   digests[cell.partition], cache)
                eps = metrics["epsilon_total_max"]
                print(f"[{index}/{total}] {cell.name}: test accuracy {metrics['test']['accuracy']:.3f}, epsilon "
                      f"{'-' if eps is None else f'{eps:.2f}'} ({time.perf_counter() - started:.1f} s)", file=sys.stderr,
                      flush=True)


if __name__ == "__main__":
    run_stage(main)
