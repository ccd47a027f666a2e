"""What Flower's simulation costs around the work itself (issue 19): the wall time of a simulated run that does
nothing, and of one round trip that makes a node do nothing.

SS-VFNAS's parties on the simulation (``fedrepro.fl.flower.vertical``, the synthetic parties of
``bench_vertical_nodes.py``): the first run of the process starts Ray and its kept ClientApp worker; every later run
reuses them, so its wall time is what each of a stage's simulated runs (a horizontal cell, an SS-VFNAS phase) pays
beyond its work. Inside one run, the label party then sends every other party a command that does nothing, one
party and all of them, and an ordinary forward of a batch. Prints each figure and the CPU time of this process.

Run it on loopback only: scripts/loopback.sh python bench/bench_simulation_overhead.py
Usage: python bench/bench_simulation_overhead.py [--parties 3] [--runs 5] [--exchanges 150]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fedrepro.vfl.nodes import FORWARD, UPDATE, VerticalHub


def nothing(hub: VerticalHub) -> None:
    """A run's work: none."""


def round_trips(hub: VerticalHub, exchanges: int) -> dict[str, float]:
    """Median seconds of a command that does nothing to one party and to every party, and of a forward (batch 64)."""

    def median(op: str, commands: dict) -> float:
        times = []
        for _ in range(exchanges):
            started = time.perf_counter()
            hub.transport.exchange(op, commands)
            times.append(time.perf_counter() - started)
        return statistics.median(times[10:])

    noop = {"updates": []}
    forward = {"batches": {"train": list(range(64))}, "grad": False, "training": True, "noise_key": ["bench", 0]}
    return {
        "nothing, one party": median(UPDATE, {hub.others[0]: (noop, {})}),
        f"nothing, {len(hub.others)} parties": median(UPDATE, {j: (noop, {}) for j in hub.others}),
        f"forward, {len(hub.others)} parties": median(FORWARD, {j: (forward, {}) for j in hub.others}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--exchanges", type=int, default=150)
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])
    from bench_vertical_nodes import bench_recipe
    from fedrepro.fl.flower.vertical import VerticalSimulation

    import bench_simulation_overhead as this

    recipe = bench_recipe(args.parties, "milenas", False)
    walls, cpus = [], []
    for _ in range(args.runs):
        started, cpu = time.perf_counter(), time.process_time()
        with tempfile.TemporaryDirectory() as folder:
            VerticalSimulation(recipe, folder, this.nothing).run()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    with tempfile.TemporaryDirectory() as folder:
        _, trips = VerticalSimulation(
            recipe, folder, functools.partial(this.round_trips, exchanges=args.exchanges)
        ).run()
    print(f"{args.parties} parties (the label party in the ServerApp, {args.parties - 1} nodes on one kept worker)")
    print(f"first run (starts Ray and the worker): {walls[0]:6.2f} s wall, {cpus[0]:5.2f} s CPU of this process")
    print(
        f"later empty run, median of {len(walls) - 1}:   {statistics.median(walls[1:]):6.3f} s wall, "
        f"{statistics.median(cpus[1:]):5.3f} s CPU of this process"
    )
    for name, seconds in trips.items():
        print(f"round trip, {name:<22} {1000 * seconds:7.2f} ms (median of {args.exchanges - 10})")


if __name__ == "__main__":  # run as the module: Ray then ships the drives by reference
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_simulation_overhead

    bench_simulation_overhead.main()
