"""How far do the embedded main tables move between instruction sets, against how far they move between seeds?

The same seed is bit-identical run to run on one machine, but CPU kernels differ by instruction set, so another
CPU type gives other numbers. This bench runs FedMatch's and FedCMC's embedded main tables in a clone of this
checkout, on this machine's own kernels and on every lower instruction set's (kernel-selecting environment
variables, see ../shared/ENVIRONMENT.md; a set this CPU does not exceed would repeat the native run and is skipped),
at seed 0, and on this machine's kernels at seeds 0, 1, 2. It prints, per headline number (FedMatch: each method's
overall test MRR; FedCMC: each cell's test micro-F1), the largest move between instruction sets and the standard
deviation over seeds, and their medians: a verdict that flips between instruction sets but not between seeds would
be a kernel artefact. FedMatch's embedded report (default: the committed one, trained on whichever machine it names,
seed 0) is compared with this machine's native seed-0 run as well: between two real machines, not emulated kernels.

Usage: python bench/bench_isa_spread.py [--workdir DIR] [--papers fedmatch fedcmc] [--seeds 0 1 2]
                                       [--emulate [avx2 sse4 ...]] [--fedmatch-report DIR]
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
# name: (the CPU flag the native kernels must have for this set to differ from them, the variables that select it)
KERNELS = {
    "avx512-no-amx": ("amx_bf16", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}),
    "avx2": (
        "avx512f",
        {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    ),
    "sse4": (
        "avx2",
        {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    ),
}
PAPERS = {
    "fedmatch": {
        "data": ["fedmatch_mine", "fedmatch_tokenizer"],
        "stage": ["stages/fedmatch_train.py", "--tables"],
        "checkpoints": "data/checkpoints/fedmatch",
        "seeds": "fedmatch.seeds",
    },
    "fedcmc": {
        "data": ["fedcmc_partition"],
        "stage": ["stages/fedcmc_train.py", "--tables"],
        "checkpoints": "data/checkpoints/fedcmc",
        "seeds": "fedcmc.seeds",
    },
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
            values[(f"{cell['method']} {cell['dataset']} a{cell['alpha']:g}", cell["seed"])] = metrics["test"][
                "micro_f1"
            ]
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
    parser.add_argument(
        "--emulate",
        nargs="*",
        default=None,
        choices=sorted(KERNELS),
        help="kernel sets to emulate (default: every one below this CPU's; none: --emulate alone)",
    )
    parser.add_argument(
        "--fedmatch-report",
        type=Path,
        default=ROOT / "reports" / "fedmatch",
        help="an embedded FedMatch report folder (metrics.json, report.md) to compare with this machine",
    )
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp()) / "fedrepro-isa"
    if not workdir.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(workdir)], check=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(workdir),
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    fingerprint = machine_fingerprint()
    print(f"machine: {fingerprint['cpu']} {fingerprint['isa_flags']}")
    kernels_to_run = {"native": {}}
    for name, (above, variables) in KERNELS.items():
        if args.emulate is not None and name not in args.emulate:
            continue
        if above in fingerprint["isa_flags"]:
            kernels_to_run[name] = variables
        else:  # e.g. "avx2" on a CPU without AVX-512: those are the native kernels again
            print(f"no {above} here: the {name} run would repeat the native one, so it is skipped")
    print(f"kernels: {', '.join(kernels_to_run)}")
    original = (workdir / "params.yaml").read_text()
    for paper in args.papers:
        spec = PAPERS[paper]
        subprocess.run(["dvc", "repro", *spec["data"]], cwd=workdir, env=env, check=True, stdout=subprocess.DEVNULL)
        set_seeds(workdir, spec["seeds"], [args.seeds[0]])
        by_kernels = {
            name: run_table(workdir, paper, f"{name}-seed{args.seeds[0]}", kernels)
            for name, kernels in kernels_to_run.items()
        }
        set_seeds(workdir, spec["seeds"], args.seeds[1:])
        other_seeds = f"native-seeds{'-'.join(map(str, args.seeds[1:]))}"
        by_seed = {**run_table(workdir, paper, other_seeds, {}), **by_kernels["native"]}  # native = the first seed's
        (workdir / "params.yaml").write_text(original)
        native = by_kernels["native"]
        emulated = [k for k in kernels_to_run if k != "native"]
        other = other_machine(args.fedmatch_report) if paper == "fedmatch" else {}
        print(
            f"\n{paper}: headline per row at seed {args.seeds[0]}: std over seeds {args.seeds} (this machine), "
            f"the largest move to another kernel set emulated here ({', '.join(emulated) or 'none run'})"
            + (
                f", and the move to the other machine's report ({other['machine']}; it rounds to 4 decimals)"
                if other
                else ""
            )
        )
        print(f"{'row':44s} {'native':>8s} {'seed std':>9s} {'emulated':>9s}" + (f" {'machine':>9s}" if other else ""))
        columns: dict[str, list[float]] = {"seed std": [], "emulated": [], "machine": []}
        for key, value in sorted(native.items()):
            spread = statistics.stdev(by_seed[(key[0], s)] for s in args.seeds)
            line = f"{key[0]:44s} {value:8.4f} {spread:9.4f}"
            columns["seed std"].append(spread)
            if emulated:
                move = max(abs(by_kernels[k][key] - value) for k in emulated)
                columns["emulated"].append(move)
                line += f" {move:9.4f}"
            else:
                line += f" {'-':>9s}"
            if key[0] in other.get("mrr", {}):
                move = abs(other["mrr"][key[0]] - value)
                columns["machine"].append(move)
                line += f" {move:9.4f}"
            print(line)
        for name, values in columns.items():
            if values:
                same = sum(v < 5e-5 for v in values)
                print(
                    f"{name}: median {statistics.median(values):.4f}, largest {max(values):.4f}, "
                    f"{same} of {len(values)} rows below 0.00005"
                )


def other_machine(report: Path) -> dict:
    """An embedded FedMatch report's overall MRR per method (seed 0) and the machine its report names."""
    hardware = next(
        (line for line in (report / "report.md").read_text().splitlines() if "Hardware the cells ran on" in line), ""
    )
    return {
        "mrr": json.loads((report / "metrics.json").read_text())["mrr"],
        "machine": hardware.split(":", 1)[-1].split(". The same")[0].strip(),
    }


if __name__ == "__main__":
    main()
