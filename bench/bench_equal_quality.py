"""Equal quality: the CPU-scale training of before issue 19 against now, on real data, over seeds.

Issue 19 made training faster (fused Adam, bf16 where the CPU has bf16 instructions, cells trained at once); that
counts only if the trained models are as good. This trains one CPU-scale cell of each text paper for every seed of
the params, once as before (fp32, Adam's per-tensor loop as torch's CPU default ran it, one cell on every core)
and once as now (the params' ``train.precision`` on this CPU, the fused Adam, ``train.threads`` per cell, as many
cells at once as a training stage runs), with the library's own ``run_cell`` (what the training stages call), and
prints per seed and as mean +- sample standard deviation the validation score (last round and best round) and the
test score, with whether now's mean lies within before's seed-to-seed spread (mean +- 1 sd), and each arm's wall
time.

The cells: FedMatch's H+LR method (``fedmatch_h_lr``) and FedCMC's method at the dataset and alpha of its sweeps
(``fedcmc.sweeps``: ChemProt at alpha 0.05 at CPU scale; ``--fedcmc-method``, ``--fedcmc-dataset``,
``--fedcmc-alpha`` choose another). Finished cells are kept under
``--workdir`` and not retrained, so an interrupted run continues where it stopped.

Reads DIR/params.yaml (run at ``--scale``) and the data stages' outputs under DIR/data, as ``bench_mfu.py`` does.
Usage: python bench/bench_equal_quality.py --project DIR --workdir DIR [--paper fedmatch|fedcmc|both] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from fedrepro.grid import cell_workers
from fedrepro.io import tree_digest
from fedrepro.metrics.summary import overall

from bench_mfu import load_params, per_tensor_adam  # the two arms, as the throughput bench sets them up

ARMS = ("before", "now")
METRIC = {"fedmatch": "map", "fedcmc": "micro_f1"}


def train(paper: str, arm: str, seed: int, project: Path, scale: str, fedcmc_cell: dict, out: Path) -> float:
    """One cell in this (spawned) process, at the arm's ``train.threads`` (the recipe sets them); its metrics.json
    lands in ``out``. Returns the training seconds."""
    with per_tensor_adam() if arm == "before" else contextlib.nullcontext():
        return train_cell(paper, seed, load_params(project, scale, before=arm == "before"), project, fedcmc_cell, out)


def train_cell(paper: str, seed: int, params, project: Path, fedcmc_cell: dict, out: Path) -> float:
    started = time.perf_counter()
    scratch = out.parent / f"{out.name}.checkpoint"  # an interrupted cell resumes from its last round
    shutil.rmtree(out, ignore_errors=True)  # what an interrupted run left before its metrics.json
    if paper == "fedmatch":
        from fedrepro.fedmatch.cells import Cell
        from fedrepro.fedmatch.runs import run_cell

        folders = (project / "data" / "mined", project / "data" / "tokenizer")
        run_cell(params, Cell("fedmatch_h_lr", seed), *folders, out, scratch, tree_digest(*folders))
    else:
        from fedrepro.fedcmc.cells import Cell
        from fedrepro.fedcmc.runs import run_cell

        settings = params.fedcmc.settings
        cell = Cell(
            fedcmc_cell["method"],
            fedcmc_cell["dataset"],
            fedcmc_cell["alpha"],
            settings.clients,
            settings.local_epochs,
            seed,
        )
        folders = (
            project / "data" / "prepared" / "re",
            project / "data" / "fedcmc" / "partitions",
            project / "data" / "fedcmc" / "tokenizer",
        )
        run_cell(params, cell, *folders, out, scratch, tree_digest(*folders))
    return time.perf_counter() - started


def scores(paper: str, metrics: dict) -> dict[str, float]:
    """Validation score of the last and of the best evaluated round, and the test score, in the paper's metric."""
    metric = METRIC[paper]
    valid = [overall(record["valid"])[metric] for record in metrics["history"] if "valid" in record]
    test = metrics["test"]["overall"][metric] if paper == "fedmatch" else metrics["test"][metric]
    return {"valid (last)": valid[-1], "valid (best)": max(valid), "test": test}


def run_arm(paper: str, arm: str, seeds: list[int], args, fedcmc_cell: dict) -> float | None:
    """Train the arm's missing cells (at once where the arm trains cells at once); its wall time, None if all kept."""
    threads = load_params(args.project, args.scale, before=arm == "before").train.threads
    workers = 1 if arm == "before" else cell_workers(threads)
    missing = [s for s in seeds if not (args.workdir / paper / arm / f"s{s}" / "metrics.json").exists()]
    if not missing:
        return None
    print(f"{paper} {arm}: training seeds {missing}, {workers} cell(s) at once x {threads} thread(s)", flush=True)
    started = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        futures = {
            s: pool.submit(
                train, paper, arm, s, args.project, args.scale, fedcmc_cell, args.workdir / paper / arm / f"s{s}"
            )
            for s in missing
        }
        for seed, future in futures.items():
            print(f"  {paper} {arm} seed {seed}: {future.result():.0f} s", flush=True)
    return time.perf_counter() - started


def report(paper: str, seeds: list[int], workdir: Path, walls: dict[str, float | None]) -> None:
    table = {
        arm: [scores(paper, json.loads((workdir / paper / arm / f"s{s}" / "metrics.json").read_text())) for s in seeds]
        for arm in ARMS
    }
    print(
        f"\n{paper} ({METRIC[paper]}), seeds {seeds}; wall time of each arm's training: "
        + ", ".join(f"{arm} {walls[arm]:.0f} s" if walls[arm] else f"{arm} kept from an earlier run" for arm in ARMS)
    )
    print(
        f"| score | {' | '.join(f'{arm} s{s}' for arm in ARMS for s in seeds)} | before mean +- sd | now mean +- sd "
        f"| now within before's spread |"
    )
    print("|---" * (2 * len(seeds) + 4) + "|")
    for name in table["before"][0]:
        values = {arm: np.array([row[name] for row in table[arm]]) for arm in ARMS}
        spread = {arm: (values[arm].mean(), values[arm].std(ddof=1) if len(seeds) > 1 else 0.0) for arm in ARMS}
        (old, old_sd), (new, new_sd) = spread["before"], spread["now"]
        cells = " | ".join(f"{v:.4f}" for arm in ARMS for v in values[arm])
        print(
            f"| {name} | {cells} | {old:.4f} +- {old_sd:.4f} | {new:.4f} +- {new_sd:.4f} | "
            f"{'yes' if abs(new - old) <= old_sd else 'no'} ({new - old:+.4f}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--paper", choices=["fedmatch", "fedcmc", "both"], default="both")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the params' seeds of the paper")
    parser.add_argument("--fedcmc-method", default="fedcmc")
    parser.add_argument("--fedcmc-dataset", default=None)
    parser.add_argument("--fedcmc-alpha", type=float, default=None)
    args = parser.parse_args()
    args.project, args.workdir = args.project.resolve(), args.workdir.resolve()
    params = load_params(args.project, args.scale)
    sweeps = params.fedcmc.sweeps
    fedcmc_cell = {
        "method": args.fedcmc_method,
        "dataset": args.fedcmc_dataset or sweeps.dataset,
        "alpha": args.fedcmc_alpha if args.fedcmc_alpha is not None else sweeps.alpha,
    }
    print(f"FedCMC cell: {fedcmc_cell}", flush=True)
    for paper in ["fedcmc", "fedmatch"] if args.paper == "both" else [args.paper]:
        seeds = args.seeds or getattr(params, paper).seeds
        walls = {arm: run_arm(paper, arm, seeds, args, fedcmc_cell) for arm in ARMS}
        report(paper, seeds, args.workdir, walls)


if __name__ == "__main__":
    main()
