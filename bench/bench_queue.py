"""A queued grid of variations of one method's knob, with the cell store and without it.

`dvc exp run --queue` runs each experiment in a fresh copy of the project, without the workspace's cell
checkpoints, so before the cell store every queued variation retrained its whole table. This bench makes a fresh
copy of the project, runs `dvc repro TARGET` in it once (the workspace's grid), then queues one experiment per
value of KNOB and runs the queue (`dvc queue start -j 1`, waiting for it), timing the queue; twice, each time in a
new copy: with the cell store off (FEDREPRO_CELL_STORE=off, as before it existed) and with a fresh store. It counts
the cells each queue trained from their progress lines ("from the cell store" marks a restored one).

Goal (issue 19): a queued experiment trains only the cells its change touches.
Usage: python bench/bench_queue.py [--target fedcmc_table] [--knob algorithms.fedcmc.mu] [--values 0.5 2 4 8]
                                   [--set fedcmc.settings.rounds=4 ...]   (extra -S for the base and every variation)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipeline_copy import ENV, fresh_copy  # noqa: E402

CELL_LINE = re.compile(r"^\[\d+/\d+\] (\S+): .*\((\d+\.\d) s(, finished run from the cell store)?\)$", re.M)


def dvc(args: list[str], cwd: Path, env: dict) -> str:
    result = subprocess.run(["dvc", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"dvc {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def queued_grid(store: str, target: str, knob: str, values: list[str], extra: list[str]) -> tuple[float, int, int]:
    """(seconds for the queue, cells trained, cells restored) in a new copy with FEDREPRO_CELL_STORE=store."""
    env = {**ENV, "FEDREPRO_CELL_STORE": store}
    with tempfile.TemporaryDirectory() as folder:
        project = fresh_copy(Path(folder))
        sets = [arg for pair in extra for arg in ("-S", pair)]
        dvc(["exp", "run", *sets, target] if sets else ["repro", target], project, env)
        subprocess.run(["git", "commit", "-qam", "the base grid", "--allow-empty"], cwd=project, env=env, check=True)
        for value in values:
            dvc(["exp", "run", "--queue", *sets, "-S", f"{knob}={value}", target], project, env)
        started = time.perf_counter()
        dvc(["queue", "start", "-j", "1"], project, env)
        while "Queued" in dvc(["queue", "status"], project, env) or "Running" in dvc(["queue", "status"], project, env):
            time.sleep(5)
        elapsed = time.perf_counter() - started
        logs = "".join(dvc(["queue", "logs", task], project, env) for task in _finished_tasks(project, env))
        lines = CELL_LINE.findall(logs)
        restored = sum(1 for _, _, stored in lines if stored)
        return elapsed, len(lines) - restored, restored


def _finished_tasks(project: Path, env: dict) -> list[str]:
    """The task ids of the queue's successful experiments (`dvc queue status`: task, name, created, status)."""
    rows = [line.split() for line in dvc(["queue", "status"], project, env).splitlines()]
    return [row[0] for row in rows if row and row[-1] == "Success"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="fedcmc_table")
    parser.add_argument("--knob", default="algorithms.fedcmc.mu")
    parser.add_argument("--values", nargs="+", default=["0.5", "2", "4", "8"])
    parser.add_argument("--set", dest="extra", nargs="*", default=[], help="key=value for the base and every variation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as store:
        for label, where in (("cell store off", "off"), ("cell store on", os.path.join(store, "cells"))):
            seconds, trained, restored = queued_grid(where, args.target, args.knob, args.values, args.extra)
            print(
                f"{label}: {len(args.values)} queued variations of {args.knob} ({args.target}) in {seconds:.0f} s; "
                f"cells trained {trained}, restored from the store {restored}",
                flush=True,
            )


if __name__ == "__main__":
    main()
