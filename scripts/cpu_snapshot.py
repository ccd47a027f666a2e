"""Run one paper's grid at CPU scale on the mirrored real data in a clean clone, then freeze its report here.

    python scripts/cpu_snapshot.py run fedmatch --mirror ../shared/data/raw    # clone, set params, dvc repro (about 1 h)
    python scripts/cpu_snapshot.py run fedcmc --mirror ../shared/data/raw
    python scripts/cpu_snapshot.py run ssvfnas --mirror ../shared/data/raw   # the main table, about 23 min
    python scripts/cpu_snapshot.py collect fedcmc WORKDIR                      # copy WORKDIR's report into reports/cpu/fedcmc

The clone keeps this checkout's data untouched; its report is written by the paper's own report stage and
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
PAPERS = {
    "fedmatch": {
        "title": "fedrepro — FedMatch at CPU scale on the mirrored real data",
        # Tables 2-3 at 1 seed fit the 2-core budget; Fig 5 at both ends; Figs 6-8 skipped
        "grid": {"fedmatch.seeds": [0], "fedmatch.sweeps.shared_layers": [2, 0], "fedmatch.sweeps.patch_size": [],
                 "fedmatch.sweeps.aggregate_every": [], "fedmatch.sweeps.data_ratio": []},
        "targets": ["fedmatch_table", "fedmatch_fig5", "fedmatch_fig6", "fedmatch_fig7", "fedmatch_fig8", "fedmatch_report"],
    },
    "fedcmc": {
        "title": "fedrepro — FedCMC at CPU scale on the mirrored real data",
        # Table 2 (PGR and ChemProt x alpha 0.05 / 0.5 x 7 methods) at 1 seed fits the hour; the sweeps do not
        "grid": {"fedcmc.seeds": [0], "fedcmc.sweeps.clients": [], "fedcmc.sweeps.local_epochs": [],
                 "fedcmc.sweeps.vectors": [], "fedcmc.sweeps.subset_modes": []},
        "targets": ["fedcmc_table", "fedcmc_sweep", "fedcmc_report"],
    },
    "ssvfnas": {
        "title": "fedrepro — SS-VFNAS at CPU scale on the mirrored real data",
        # the main table as the cpu preset sizes it (digits K=2/4, breast, default_credit; no DP, sigma 1 and 2; 3 seeds)
        "grid": {},
        "targets": ["ssvfnas_partition", "ssvfnas_table", "ssvfnas_report"],
    },
}


def set_key(params: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        params = params[key]
    params[last] = value


def run(paper: str, mirror: Path, workdir: Path) -> None:
    spec = PAPERS[paper]
    subprocess.run(["git", "clone", "-q", str(ROOT), str(workdir)], check=True)
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    for key, value in {"scale": "cpu", "data.source": "mirror", "data.mirror": str(mirror.resolve()),
                       "report.title": spec["title"], **spec["grid"]}.items():
        set_key(params, key, value)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True))
    env = {**os.environ, "PYTHONPATH": str(workdir), "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    timings = []
    for target in spec["targets"]:
        started = time.perf_counter()
        subprocess.run(["dvc", "repro", target], cwd=workdir, env=env, check=True)
        timings.append(f"{target}: {time.perf_counter() - started:.0f} s")
    (workdir / f"stage_times_{paper}.txt").write_text("\n".join(timings) + "\n")
    collect(paper, workdir)


def collect(paper: str, workdir: Path) -> None:
    """Copy the clone's report here with a stamp: the commit that trained it, the date, the params."""
    target = ROOT / "reports" / "cpu" / paper
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True, check=True).stdout.strip()
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(workdir / "reports" / paper, target)
    shutil.copy(workdir / "params.yaml", target / "params.yaml")
    times_file = next((f for f in (workdir / f"stage_times_{paper}.txt", workdir / "stage_times.txt") if f.exists()), None)
    times = times_file.read_text() if times_file else "(not recorded)\n"
    (target / "SNAPSHOT.md").write_text(
        f"# {paper} CPU-scale snapshot\n\n"
        f"- Trained by commit `{commit}` of this repository (the report stage's code is the same or later; see git log).\n"
        f"- Collected on {dt.date.today().isoformat()} on the project's 2-core CPU machine (no GPU).\n"
        "- Params: `params.yaml` beside this file (scale `cpu`, data from the mirror).\n"
        f"- Reproduce: `python scripts/cpu_snapshot.py run {paper} --mirror <mirror>`.\n\n"
        f"Stage wall times:\n\n```\n{times}```\n")
    print(f"snapshot written to {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("paper", choices=sorted(PAPERS))
    run_parser.add_argument("--mirror", type=Path, default=ROOT.parent / "shared" / "data" / "raw")
    run_parser.add_argument("--workdir", type=Path, default=None, help="default: a new temporary folder")
    collect_parser = commands.add_parser("collect")
    collect_parser.add_argument("paper", choices=sorted(PAPERS))
    collect_parser.add_argument("workdir", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.paper, args.mirror, args.workdir or Path(tempfile.mkdtemp()) / f"fedrepro-cpu-{args.paper}")
    else:
        collect(args.paper, args.workdir)


if __name__ == "__main__":
    main()
