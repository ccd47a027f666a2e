"""The ``fedrepro`` command (``pyproject.toml``'s scripts), for what a user asks of the project outside a stage.

    fedrepro check [PARAMS]    # every mistake in params.yaml (and its scale's preset) at once; exit 2 if any
    fedrepro plan              # before a long `dvc repro`: each train stage's cells, those already finished, the
                               # rest's estimated minutes and disk on this machine (``fedrepro.grid.GridPlan``)

The pipeline runs the same check as its first stage (``stages/check.py``); no stage imports this module, so its
commands add nothing to any stage's dependencies.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from fedrepro.errors import ConfigError
from fedrepro.preflight import check_params


def _upstream(stages: dict, name: str) -> list[str]:
    """The stages whose outputs ``name`` reads, directly or not (dvc.yaml's deps against its outs)."""
    outs = {
        str(next(iter(out)) if isinstance(out, dict) else out): other
        for other, stage in stages.items()
        for out in stage.get("outs", [])
    }
    found, todo = [], [name]
    while todo:
        for dep in stages[todo.pop()].get("deps", []):
            for out, owner in outs.items():
                if (dep == out or dep.startswith(out + "/") or out.startswith(dep + "/")) and owner not in found:
                    found.append(owner)
                    todo.append(owner)
    return found


def plan() -> None:
    """Each train stage's plan (its ``--plan``), in the pipeline's order; a stage whose upstream stages rerun first is
    planned on the inputs they wrote last time, and says so."""
    stages = yaml.safe_load(Path("dvc.yaml").read_text())["stages"]
    status = subprocess.run(["dvc", "status", "--json"], capture_output=True, text=True)
    changed = set(json.loads(status.stdout or "{}")) if status.returncode == 0 else set()
    for name, stage in stages.items():
        command = shlex.split(str(stage["cmd"]))
        if len(command) < 2 or not command[1].endswith("_train.py"):
            continue
        first = [other for other in _upstream(stages, name) if other in changed]
        if first:
            print(f"{name}: {', '.join(first)} rerun first; planned on what they wrote last time")
        result = subprocess.run([sys.executable, *command[1:], "--plan"], capture_output=True, text=True)
        if result.returncode == 0:
            print(result.stdout.strip())
        else:  # its inputs are not there yet, say: the stage's own one-line error says which
            last = result.stderr.strip().splitlines()
            print(f"{name}: no plan yet ({last[-1] if last else f'exit {result.returncode}'})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="fedrepro", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="list every mistake in params.yaml at once, before any work")
    check.add_argument(
        "params", nargs="?", default="params.yaml", help="the params file (its scales/ folder beside it)"
    )
    commands.add_parser("plan", help="each train stage's cells, those finished, and the rest's estimated cost")
    args = parser.parse_args(argv)
    if args.command == "plan":
        plan()
        return
    try:
        check_params(args.params, out=None)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"{args.params}: no problem found (keys and values, names, algorithm knobs, backbones, own files)")


if __name__ == "__main__":
    main()
