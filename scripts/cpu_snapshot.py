"""Run FedMatch at CPU scale on the mirrored real data in a clean clone, then freeze its report here.

    python scripts/cpu_snapshot.py run --mirror ../shared/data/raw      # clone, set params, dvc repro (about 1-2 h)
    python scripts/cpu_snapshot.py collect WORKDIR                      # copy WORKDIR's report into reports/cpu/fedmatch

The clone keeps this checkout's data untouched; its report is written by the same `fedmatch_report` stage and
copied with a SNAPSHOT.md that records the commit, the date, the params and the stage wall times.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "reports" / "cpu" / "fedmatch"
GRID = {  # the CPU grid that fits the 2-core budget: Tables 2-3 at 1 seed; Fig 5 at both ends; Figs 6-8 skipped
    "fedmatch.seeds": [0],
    "fedmatch.sweeps.shared_layers": [2, 0],
    "fedmatch.sweeps.patch_size": [],
    "fedmatch.sweeps.aggregate_every": [],
    "fedmatch.sweeps.data_ratio": [],
}


def set_key(params: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        params = params[key]
    params[last] = value


def run(mirror: Path, workdir: Path) -> None:
    subprocess.run(["git", "clone", "-q", str(ROOT), str(workdir)], check=True)
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    for key, value in {"scale": "cpu", "data.source": "mirror", "data.mirror": str(mirror.resolve()),
                       "report.title": "fedrepro — FedMatch at CPU scale on the mirrored real data", **GRID}.items():
        set_key(params, key, value)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True))
    env = {**os.environ, "PYTHONPATH": str(workdir), "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    timings = []
    for target in ("fedmatch_table", "fedmatch_fig5", "fedmatch_fig6", "fedmatch_fig7", "fedmatch_fig8", "fedmatch_report"):
        started = time.perf_counter()
        subprocess.run(["dvc", "repro", target], cwd=workdir, env=env, check=True)
        timings.append(f"{target}: {time.perf_counter() - started:.0f} s")
    (workdir / "stage_times.txt").write_text("\n".join(timings) + "\n")
    collect(workdir)


def collect(workdir: Path) -> None:
    """Copy the clone's report here with a stamp: the commit that trained it, the date, the params."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True, check=True).stdout.strip()
    if TARGET.exists():
        shutil.rmtree(TARGET)
    shutil.copytree(workdir / "reports" / "fedmatch", TARGET)
    shutil.copy(workdir / "params.yaml", TARGET / "params.yaml")
    times = (workdir / "stage_times.txt").read_text() if (workdir / "stage_times.txt").exists() else "(not recorded)\n"
    (TARGET / "SNAPSHOT.md").write_text(
        "# FedMatch CPU-scale snapshot\n\n"
        f"- Trained by commit `{commit}` of this repository (the report stage's code is the same or later; see git log).\n"
        f"- Collected on {dt.date.today().isoformat()} on the project's 2-core CPU machine (no GPU).\n"
        "- Params: `params.yaml` beside this file (scale `cpu`, data from the mirror).\n"
        "- Reproduce: `python scripts/cpu_snapshot.py run --mirror <mirror>`.\n\n"
        f"Stage wall times:\n\n```\n{times}```\n")
    print(f"snapshot written to {TARGET}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("--mirror", type=Path, default=ROOT.parent / "shared" / "data" / "raw")
    run_parser.add_argument("--workdir", type=Path, default=Path(tempfile.mkdtemp()) / "fedrepro-cpu")
    collect_parser = commands.add_parser("collect")
    collect_parser.add_argument("workdir", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.mirror, args.workdir)
    else:
        collect(args.workdir)


if __name__ == "__main__":
    main()
