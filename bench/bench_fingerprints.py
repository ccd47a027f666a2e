"""How many cells an edit retrains: for each file, the cells of the three papers' grids whose code (the fingerprint's
import closure, ``fedrepro.code_closure.cell_code``) holds it, and the stages whose DVC deps hold it (they rerun; their
unchanged cells come back from the cell store, with their outputs).

Usage: python bench/bench_fingerprints.py [--scale embedded|cpu] [FILE ...]   (default: one file of each kind)
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedrepro import code_closure  # noqa: E402
from fedrepro.config import parse_params, read_raw_params  # noqa: E402
from fedrepro.fedcmc.cells import all_cells as fedcmc_cells  # noqa: E402
from fedrepro.fedmatch.cells import sweep_cells, table_cells  # noqa: E402
from fedrepro.fedmatch.methods import METHODS  # noqa: E402
from fedrepro.fl import algorithms  # noqa: E402
from fedrepro.ssvfnas.cells import all_cells as ssvfnas_cells  # noqa: E402

DEFAULT_FILES = [
    "fedrepro/fedmatch/report.py",
    "fedrepro/report/claims.py",
    "fedrepro/fl/flower/server.py",
    "fedrepro/fl/algorithms/fedprox.py",
    "fedrepro/fl/algorithms/fedcmc.py",
    "fedrepro/fl/engine.py",
    "fedrepro/tasks/relation.py",
    "fedrepro/ssvfnas/runs.py",
    "fedrepro/vfl/search.py",
    "fedrepro/config.py",
]


def grid_code(params) -> dict[str, list[set[Path]]]:
    """paper -> each of its cells' code files."""
    runtime = params.train.runtime

    def horizontal(entry: str, algorithm: str) -> set[Path]:
        return code_closure.cell_code(entry, runtime, algorithms.REGISTRY[algorithm].__module__)

    return {
        "fedmatch": [
            horizontal("fedrepro.fedmatch.runs", METHODS[c.method].algorithm)
            for c in table_cells(params) + sweep_cells(params)
        ],
        "fedcmc": [horizontal("fedrepro.fedcmc.runs", c.method) for c in fedcmc_cells(params)],
        "ssvfnas": [code_closure.cell_code("fedrepro.ssvfnas.runs", runtime) for _ in ssvfnas_cells(params)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="embedded", choices=["embedded", "cpu"])
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES)
    args = parser.parse_args()
    raw = copy.deepcopy(read_raw_params(ROOT / "params.yaml"))
    raw["scale"] = args.scale
    if args.scale == "cpu":  # the snapshots' grids: 3 seeds on the sweeps too, the mirror's corpora
        raw["data"]["source"] = "mirror"
        raw["fedmatch"]["sweeps"]["seeds"] = raw["fedcmc"]["sweeps"]["seeds"] = [0, 1, 2]
    params = parse_params(raw)
    grids = grid_code(params)
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    print(f"scale {args.scale}: " + ", ".join(f"{paper} {len(cells)} cells" for paper, cells in grids.items()))
    for name in args.files:
        file = (ROOT / name).resolve()
        retrained = Counter({paper: sum(file in code for code in cells) for paper, cells in grids.items()})
        rerun = [
            stage
            for stage, spec in stages.items()
            if any(file == ROOT / dep or (ROOT / dep) in file.parents for dep in spec.get("do", spec).get("deps", []))
        ]
        cells = ", ".join(f"{paper} {count}" for paper, count in retrained.items() if count) or "none"
        print(f"{name}: cells retrained: {sum(retrained.values())} ({cells}); stages rerun: {len(rerun)}")


if __name__ == "__main__":
    main()
