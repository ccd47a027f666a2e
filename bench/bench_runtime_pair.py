"""The embedded pipeline on the engine and on another runtime, stage by stage in turn, on the same machine at once.

Two whole-default runs one after the other (``bench_pipeline.py`` then ``bench_pipeline.py --set ...``) measure the
machine twice: on a shared 2-core host one run's half-hour can be 10-15% slower than the next, which is the size of
the margin issue 19's ratio is judged by. Here two fresh copies, one with ``params.yaml`` as it is and one with the
``--set`` values written into it, run the stages one by one, each after those it needs, copy A's stage then copy
B's, so every stage's pair meets the same minutes of the machine. Prints each stage's two times and their ratio, the
sums, and the no-op ``dvc repro`` median of both copies.

Usage: scripts/loopback.sh python bench/bench_runtime_pair.py --set train.runtime=flower-simulation [--target STAGE ...]
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import networkx
from dvc.repo import Repo
from ruamel.yaml import YAML

from bench_pipeline import machine_speed, noop_times, timed_stages

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipeline_copy import ENV, fresh_copy, run  # noqa: E402


def set_params(project: Path, assignments: list[str]) -> None:
    """Write ``KEY=VALUE`` (dotted keys, YAML values) into ``project/params.yaml`` and commit it, as
    ``dvc exp run -S`` would before running."""
    yaml = YAML()
    path = project / "params.yaml"
    params = yaml.load(path)
    for assignment in assignments:
        key, _, value = assignment.partition("=")
        *parents, leaf = key.split(".")
        node = params
        for part in parents:
            if part not in node:
                sys.exit(f"--set {assignment}: params.yaml has no key {key!r}")
            node = node[part]
        if leaf not in node:
            sys.exit(f"--set {assignment}: params.yaml has no key {key!r}")
        node[leaf] = YAML(typ="safe").load(value)
    yaml.dump(params, path)
    for command in (["git", "add", "params.yaml"], ["git", "commit", "-qm", f"set {' '.join(assignments)}"]):
        if run(command, project).returncode != 0:
            sys.exit(f"{project}: {' '.join(command)} failed")


def stage_order(project: Path, targets: list[str]) -> list[str]:
    """The stages ``dvc repro [targets]`` runs in a fresh copy (all of them, or the targets and what they need), each
    after those it needs. (``dvc repro --dry`` cannot list them there: a stage's inputs do not exist yet.)"""
    with Repo(str(project)) as repo:
        graph = repo.index.graph  # an edge from each stage to a stage it needs
        by_name = {stage.name: stage for stage in graph}
        wanted = set(graph)
        if targets:
            unknown = [target for target in targets if target not in by_name]
            if unknown:
                sys.exit(f"--target {unknown}: not stages of dvc.yaml (they are: {', '.join(by_name)})")
            wanted = set().union(*({by_name[t]} | networkx.descendants(graph, by_name[t]) for t in targets))
        return [stage.name for stage in reversed(list(networkx.topological_sort(graph))) if stage in wanted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", required=True, metavar="KEY=VALUE", help="copy B's params")
    parser.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="STAGE",
        help="only these stages and what they need (default: the whole pipeline)",
    )
    args = parser.parse_args()
    speed_before = machine_speed()
    with tempfile.TemporaryDirectory() as folder:
        copies = {}
        for name in ("A", "B"):
            root = Path(folder) / name
            root.mkdir()
            copies[name] = fresh_copy(root)
        set_params(copies["B"], args.set)
        stages = stage_order(copies["A"], args.target)
        print(f"{len(stages)} stages; A: params.yaml as committed, B: {' '.join(args.set)}", flush=True)
        times = {"A": {}, "B": {}}
        for stage in stages:
            for name in ("A", "B"):
                ENV["FEDREPRO_CELL_STORE"] = str(Path(folder) / f"cells-{name}")  # empty at first, as a fresh clone's
                call, ran = timed_stages(["dvc", "repro", stage], copies[name])
                if list(ran) not in ([stage], []):
                    sys.exit(f"copy {name}: `dvc repro {stage}` ran {list(ran)}, expected only {stage}")
                times[name][stage] = ran.get(stage, call)  # none ran: DVC restored it from its run-cache
            a, b = times["A"][stage], times["B"][stage]
            print(f"  {stage:32s} A {a:7.1f} s   B {b:7.1f} s   B/A {b / a:5.2f}x", flush=True)
        noops = {name: noop_times(project, args.target) for name, project in copies.items()}
    speed_after = machine_speed()
    total_a, total_b = sum(times["A"].values()), sum(times["B"].values())
    print(
        f"sum of stages: A {total_a:.1f} s ({total_a / 60:.2f} min), B {total_b:.1f} s ({total_b / 60:.2f} min), "
        f"B/A {total_b / total_a:.2f}x"
    )
    print(f"machine: one thread's fp32 matmul {speed_before:.1f} GFLOP/s before, {speed_after:.1f} after")
    for name, runs in noops.items():
        print(
            f"no-op dvc repro in {name}: median {statistics.median(runs):.2f} s of {len(runs)} "
            f"({', '.join(f'{s:.2f}' for s in runs)}; target < 2 s)"
        )


if __name__ == "__main__":
    main()
