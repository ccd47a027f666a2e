"""How far do the embedded main tables move between instruction sets, against how far they move between seeds?

The same seed is bit-identical run to run on one machine, but CPU kernels differ by instruction set, so another
CPU type gives other numbers. This bench runs FedMatch's and FedCMC's embedded main tables in a clone of this
checkout, on this machine's own kernels and on another machine's (kernel-selecting environment variables, see
../shared/ENVIRONMENT.md), at seed 0, and on this machine's kernels at seeds 0, 1, 2. It prints, per headline
number (FedMatch: each method's overall test MRR; FedCMC: each cell's test micro-F1), the largest move between
instruction sets and the standard deviation over seeds, and their medians: a verdict that flips between
instruction sets but not between seeds would be a kernel artefact.

Usage: python bench/bench_isa_spread.py [--workdir DIR] [--papers fedmatch fedcmc] [--seeds 0 1 2]
(per paper: one run per kernel set at the first seed, one run of the other seeds. On the idle 2-core machine
FedCMC's half took about 30 minutes; FedMatch's seed-0 table took 4 minutes native and 19 on AVX2. Rerun with the
same --workdir to resume an interrupted bench: each run keeps its own cell checkpoints.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from fedrepro.hardware import machine_fingerprint

ROOT = Path(__file__).resolve().parents[1]
KERNELS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512-no-amx": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
}
PAPERS = {
    "fedmatch": {"data": ["mine", "tokenizer"], "stage": ["stages/fedmatch_train.py", "--tables"],
                 "checkpoints": "data/checkpoints/fedmatch", "seeds": "fedmatch.seeds"},
    "fedcmc": {"data": ["fedcmc_partition"], "stage": ["stages/fedcmc_train.py", "--tables"],
               "checkpoints": "data/checkpoints/fedcmc", "seeds": "fedcmc.seeds"},
}


def set_seeds(workdir: Path, key: str, seeds: list[int]) -> None:
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    group, name = key.split(".")
    params[group][name] = seeds
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True))


def headline(workdir: Path, paper: str) -> dict[tuple, float]:
    """(method/cell, seed) -> the number the paper's table shows, from the cells' own metrics files."""
    values = {}
    root = workdir / "data" / paper / "tables"
    for path in sorted(root.glob("*/*/metrics.json")):
        metrics = json.loads(path.read_text())
        if paper == "fedcmc":
            cell = metrics["cell"]
            values[(f"{cell['method']} {cell['dataset']} a{cell['alpha']:g}", cell["seed"])] = metrics["test"]["micro_f1"]
        else:
            overall = metrics["test"]["overall"]
            values[(path.parent.parent.name, int(path.parent.name.rsplit("-", 1)[1]))] = overall["mrr"]
    return values


def run_table(workdir: Path, paper: str, label: str, kernels: dict[str, str]) -> dict[tuple, float]:
    """The paper's tables under ``kernels``. Checkpoints do not record the kernels, so each run (``label``: its kernels
    and seeds) trains into a checkpoint folder of its own, linked in place: an interrupted bench resumes there."""
    spec = PAPERS[paper]
    live, own = workdir / spec["checkpoints"], workdir / "isa-checkpoints" / paper / label
    own.mkdir(parents=True, exist_ok=True)
    if live.is_symlink():
        live.unlink()
    else:
        shutil.rmtree(live, ignore_errors=True)
    live.parent.mkdir(parents=True, exist_ok=True)
    live.symlink_to(own.resolve(), target_is_directory=True)
    env = {**os.environ, **kernels, "PYTHONPATH": str(workdir), "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, *spec["stage"]], cwd=workdir, env=env, check=True, stdout=subprocess.DEVNULL)
    return headline(workdir, paper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--papers", nargs="+", default=sorted(PAPERS), choices=sorted(PAPERS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp()) / "fedrepro-isa"
    if not workdir.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(workdir)], check=True)
    env = {**os.environ, "PYTHONPATH": str(workdir), "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    fingerprint = machine_fingerprint()
    print(f"machine: {fingerprint['cpu']} {fingerprint['isa_flags']}")
    kernels_to_run = dict(KERNELS)
    if "amx_bf16" not in fingerprint["isa_flags"]:  # without AMX, "AVX-512 without AMX" is the native kernels again
        del kernels_to_run["avx512-no-amx"]
        print("no amx_bf16 here: the avx512-no-amx run would repeat the native one, so it is skipped")
    print(f"kernels: {', '.join(kernels_to_run)}")
    original = (workdir / "params.yaml").read_text()
    for paper in args.papers:
        spec = PAPERS[paper]
        subprocess.run(["dvc", "repro", *spec["data"]], cwd=workdir, env=env, check=True, stdout=subprocess.DEVNULL)
        set_seeds(workdir, spec["seeds"], [args.seeds[0]])
        by_kernels = {name: run_table(workdir, paper, f"{name}-seed{args.seeds[0]}", kernels)
                      for name, kernels in kernels_to_run.items()}
        set_seeds(workdir, spec["seeds"], args.seeds[1:])
        other_seeds = f"native-seeds{'-'.join(map(str, args.seeds[1:]))}"
        by_seed = {**run_table(workdir, paper, other_seeds, {}), **by_kernels["native"]}  # native = the first seed's
        (workdir / "params.yaml").write_text(original)
        native = by_kernels["native"]
        rows = []
        for key, value in sorted(native.items()):
            moves = [abs(by_kernels[k][key] - value) for k in kernels_to_run if k != "native"]
            seeds = [by_seed[(key[0], s)] for s in args.seeds]
            rows.append((key[0], value, max(moves), statistics.stdev(seeds)))
        print(f"\n{paper}: headline per row, largest move between kernels (seed {args.seeds[0]}) vs std over seeds "
              f"{args.seeds}")
        print(f"{'row':44s} {'native':>8s} {'isa move':>9s} {'seed std':>9s}")
        for name, value, move, spread in rows:
            print(f"{name:44s} {value:8.4f} {move:9.4f} {spread:9.4f}")
        identical = sum(move == 0 for _, _, move, _ in rows)
        print(f"median isa move {statistics.median(r[2] for r in rows):.4f}, median seed std "
              f"{statistics.median(r[3] for r in rows):.4f}; {identical} of {len(rows)} rows identical across kernels")


if __name__ == "__main__":
    main()
