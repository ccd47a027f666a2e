"""Per-step cost of SS-VFNAS's parties as Flower nodes against the in-process protocol (issue 21).

The same search (MLP supernets, one per party, on synthetic columns; every party built alone from its own seed, as a
node builds it) runs three ways, four with ``--deployment``: ``VerticalProtocol`` with every party in this process; the
node protocol with the other parties' workers called in this process (``LocalTransport``: what splitting the roles
costs without a network); on Flower's simulation, the label party in the ServerApp and one node per other party; and
on a real Flower deployment on this machine (TLS, a SuperNode and a service process per other party, a new ClientApp
process per message). A step's cost is the median over the steps after the first of the time from its start to its
end; start-up (Ray or the federation, the nodes, building each party) is left out. Prints each median, the ratios to
the in-process step, and whether the histories are identical.

Run it on loopback only: scripts/loopback.sh python bench/bench_vertical_nodes.py
Usage: python bench/bench_vertical_nodes.py [--parties 3] [--steps 12] [--batch 64] [--rule milenas] [--dp]
       [--deployment]
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

import torch
from torch import nn

from fedrepro.seeding import derive_seed
from fedrepro.vfl.nodes import LocalTransport, PartyWorker, VerticalHub, VerticalRecipe
from fedrepro.vfl.privacy import GaussianMechanism
from fedrepro.vfl.protocol import Party, VerticalProtocol
from fedrepro.vfl.search import DartsSearch, MiLeNASSearch, SplitTraining, batch_at, make_optimizers
from fedrepro.vfl.spaces import supernet

ROWS, FEATURES, OUT_DIM, CLASSES, SEED = 2048, 64, 16, 10, 3


def synthetic_party(index: int, parties: int, label: int) -> Party:
    """Party ``index`` alone: its own synthetic columns and supernet (and the labels and top if it is the label
    party)."""
    columns = torch.Generator().manual_seed(derive_seed(SEED, "columns", index))
    features = torch.randn(ROWS, FEATURES, generator=columns)
    torch.manual_seed(derive_seed(SEED, "bottom", index))
    bottom = supernet("mlp", FEATURES, OUT_DIM, width=32, cells=2, nodes=2)
    if index != label:
        return Party(index, features, bottom)
    labels = torch.randint(0, CLASSES, (ROWS,), generator=torch.Generator().manual_seed(derive_seed(SEED, "labels")))
    torch.manual_seed(derive_seed(SEED, "top"))
    return Party(index, features, bottom, labels, nn.Linear(parties * OUT_DIM, CLASSES))


def bench_recipe(parties: int, rule: str, dp: bool) -> VerticalRecipe:
    return VerticalRecipe(
        functools.partial(synthetic_party, parties=parties, label=parties - 1),
        parties,
        parties - 1,
        rule,
        SEED,
        fingerprint=f"bench/{parties}/{rule}/{dp}",
        threads=torch.get_num_threads(),
        forward_mechanism=GaussianMechanism(5.0, 1.0) if dp else None,
        backward_mechanism=GaussianMechanism(0.5, 1.0) if dp else None,
        split_sizes=(("train", ROWS // 2), ("val", ROWS // 2)),
    )


def batches(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    train, val = torch.arange(ROWS // 2), torch.arange(ROWS // 2, ROWS)
    return batch_at(train, size, step, SEED, "train"), batch_at(val, size, step, SEED, "val")


def median_after_first(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def in_process(recipe: VerticalRecipe, steps: int, size: int) -> tuple[float, list]:
    protocol = VerticalProtocol(
        [recipe.build_party(j) for j in range(recipe.parties)],
        forward_mechanisms=recipe.forward_mechanism,
        backward_mechanism=recipe.backward_mechanism,
        seed=recipe.seed,
        split_sizes=dict(recipe.split_sizes),
    )
    weights, arch = make_optimizers(protocol)
    rule = {"train": SplitTraining, "darts": DartsSearch, "milenas": MiLeNASSearch}[recipe.rule]
    search = rule(protocol, weights, arch, grad_clip=recipe.grad_clip)
    times = []
    for step in range(steps):
        started = time.perf_counter()
        search.step(*batches(step, size))
        times.append(time.perf_counter() - started)
    return median_after_first(times), search.history


def timed_steps(hub: VerticalHub, steps: int, size: int) -> list[float]:
    times = []
    for step in range(steps):
        started = time.perf_counter()
        hub.run_step(*batches(step, size))
        times.append(time.perf_counter() - started)
    return times


def timed_run(hub: VerticalHub, steps: int, size: int) -> tuple[list[float], list]:
    """A deployment's drive (module-level, so its ServerApp process unpickles it by reference): times and history."""
    return timed_steps(hub, steps, size), hub.history


def local_nodes(recipe: VerticalRecipe, steps: int, size: int) -> tuple[float, list]:
    workers = {j: PartyWorker(recipe, recipe.build_party(j)) for j in recipe.others}
    hub = VerticalHub(recipe, recipe.build_party(recipe.label), LocalTransport(workers))
    return median_after_first(timed_steps(hub, steps, size)), hub.history


def flower_nodes(recipe: VerticalRecipe, steps: int, size: int) -> tuple[float, list]:
    from fedrepro.fl.flower.vertical import VerticalSimulation

    with tempfile.TemporaryDirectory() as folder:
        hub, times = VerticalSimulation(recipe, folder, lambda h: timed_steps(h, steps, size)).run()
    return median_after_first(times), hub.history


def deployment_nodes(recipe: VerticalRecipe, steps: int, size: int) -> tuple[float, list]:
    from fedrepro.fl.flower.vertical_deployment import VerticalDeployment

    with tempfile.TemporaryDirectory() as folder:
        times, history = VerticalDeployment(recipe, folder, functools.partial(timed_run, steps=steps, size=size)).run()
    return median_after_first(times), history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rule", choices=("train", "darts", "milenas"), default="milenas")
    parser.add_argument("--dp", action="store_true", help="both Gaussian mechanisms on")
    parser.add_argument("--deployment", action="store_true", help="also on a real Flower deployment on this machine")
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])
    recipe = bench_recipe(args.parties, args.rule, args.dp)
    torch.set_num_threads(recipe.threads)
    reference, history = in_process(recipe, args.steps, args.batch)
    local, local_history = local_nodes(recipe, args.steps, args.batch)
    flower, flower_history = flower_nodes(recipe, args.steps, args.batch)
    deployed, deployed_history = (
        deployment_nodes(recipe, args.steps, args.batch) if args.deployment else (None, history)
    )
    print(
        f"{args.rule}, {args.parties} parties, batch {args.batch}, {args.steps} steps, DP "
        f"{'on' if args.dp else 'off'}, {recipe.threads} torch threads"
    )
    print(f"in-process protocol:         {1000 * reference:8.1f} ms/step")
    print(f"nodes, in process:           {1000 * local:8.1f} ms/step  ({local / reference:.2f}x)")
    print(f"nodes on Flower (simulation): {1000 * flower:7.1f} ms/step  ({flower / reference:.2f}x)")
    if deployed is not None:
        print(f"nodes on Flower (deployment): {1000 * deployed:7.1f} ms/step  ({deployed / reference:.2f}x)")
    print(f"histories identical: {history == local_history == flower_history == deployed_history}")


if __name__ == "__main__":  # run as the module: Ray then ships the recipe's functions by reference
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_vertical_nodes

    bench_vertical_nodes.main()
