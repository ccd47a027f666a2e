"""Per-round cost of Flower's simulation (Ray, loopback) against the in-process engine on the same cell.

Trains one FedCMC cell in each runtime from the same recipe. A round's cost is the time from its start
(the server opening it) to its end (checkpoint written), median over the rounds; start-up is the time from
building the runtime to the start of round 1 (for Flower also: Ray, its worker, building the model on the
node, asking each node which client it serves), printed on its own. Issue 9's budget: Flower's round
<= 1.3x the engine's. The simulation then trains the cell a second time in the same process, as a stage's later cell
does, on the Ray workers the first one started (``KeptRayBackend``): its start-up is printed beside the first's. Also
printed: the histories are identical (the equivalence the tests assert).
With ``--deployment`` the cell also runs twice on a local SuperLink and SuperNodes (TLS, node authentication), the
second time on the federation the first started (``shared_federation``, as a stage's later cells), and the bench
prints each one's time and the bytes Flower counted on the wire (``flwr ls``: message payloads as serialised, both
directions) against the channel's count of the tensors and scalars: the protocol's overhead ratio.

Reads DIR/params.yaml and DIR/data/{prepared/re,fedcmc/partitions,fedcmc/tokenizer} (the fedcmc_partition
stage's outputs). Run it on loopback only: scripts/loopback.sh python bench/bench_flower.py --project DIR
Usage: python bench/bench_flower.py [--project DIR] [--params FILE] [--deployment] [--rounds 4] [--method fedavg]
[--alpha 0.5] [--clients 5]
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


from fedrepro.config import parse_params, read_raw_params
from fedrepro.fedcmc.cells import Cell
from fedrepro.fedcmc.runs import cell_recipe
from fedrepro.fl.flower.deployment import shared_federation
from fedrepro.fl.runtime import build_runtime
from fedrepro.io import tree_digest


def timed_run(recipe, runtime: str, folder: Path) -> tuple[float, float, list]:
    """(start-up s, median round s, history) of one run."""
    starts, ends = [], []
    started = time.perf_counter()
    engine = build_runtime(
        recipe, runtime, folder, progress=False, on_round_end=lambda _: ends.append(time.perf_counter())
    )
    open_round = engine.open_round

    def timed_open_round(round_index):
        starts.append(time.perf_counter())
        return open_round(round_index)

    engine.open_round = timed_open_round
    state = engine.run()
    return starts[0] - started, statistics.median(b - a for a, b in zip(starts, ends)), state.history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--params", type=Path, default=None, help="default: DIR/params.yaml")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--alpha", type=float, default=None, help="default: fedcmc.sweeps.alpha")
    parser.add_argument("--clients", type=int, default=None, help="default: fedcmc.settings.clients")
    parser.add_argument(
        "--deployment", action="store_true", help="also run it on a local deployment (bytes on the wire)"
    )
    args = parser.parse_args()
    os.environ.setdefault("RAY_worker_niceness", str(os.nice(0)))  # Ray's workers as nice as the engine's process
    raw = read_raw_params(args.params or args.project / "params.yaml")
    raw["fedcmc"]["settings"]["rounds"] = args.rounds
    raw["fedcmc"]["settings"]["eval_every"] = 0
    params = parse_params(raw)
    sweeps, settings = params.fedcmc.sweeps, params.fedcmc.settings
    cell = Cell(
        args.method,
        sweeps.dataset,
        args.alpha or sweeps.alpha,
        args.clients or settings.clients,
        settings.local_epochs,
        0,
    )
    data = args.project / "data"
    folders = (data / "prepared" / "re", data / "fedcmc" / "partitions", data / "fedcmc" / "tokenizer")
    recipe = cell_recipe(
        params, cell, *folders, tree_digest(folders[0] / cell.dataset, folders[1] / cell.partition, folders[2])
    )
    results = []
    for runtime in ("engine", "flower-simulation", "flower-simulation"):
        with tempfile.TemporaryDirectory() as scratch:
            results.append(timed_run(recipe, runtime, Path(scratch)))
    (engine_start, engine_round, engine_history), (flower_start, flower_round, flower_history), later = results
    print(f"cell {cell.name}: {args.rounds} rounds, {len(engine_history[0]['clients'])} clients a round")
    print(f"engine            start-up {engine_start:6.2f} s   round {engine_round:6.3f} s")
    print(f"flower-simulation start-up {flower_start:6.2f} s   round {flower_round:6.3f} s")
    print(f"  a later cell    start-up {later[0]:6.2f} s   round {later[1]:6.3f} s   (on the kept Ray workers)")
    print(f"round cost ratio flower/engine: {flower_round / engine_round:.2f}x (budget 1.3x)")
    same = all(
        json.dumps(engine_history, sort_keys=True) == json.dumps(history, sort_keys=True)
        for history in (flower_history, later[2])
    )
    print(f"histories identical: {same}")
    if args.deployment:
        deployment_figures(recipe, engine_history)


def deployment_figures(recipe, engine_history: list) -> None:
    """The cell twice on one local deployment, as a stage's cells run (``shared_federation``): the first starts the
    SuperLink, the launcher and the nodes, the second is only a ``flwr run`` on them."""
    with tempfile.TemporaryDirectory() as scratch, shared_federation(Path(scratch) / "federation"):
        runs = []
        for name in ("first", "later"):
            started = time.perf_counter()
            deployment = build_runtime(recipe, "flower-deployment", Path(scratch) / name, progress=False)
            state = deployment.run()
            runs.append((time.perf_counter() - started, deployment, state))
    (first, deployment, state), (later, _, later_state) = runs
    channel = deployment.channel
    up = sum(m.nbytes for m in channel.messages if m.receiver == "server")
    down = sum(m.nbytes for m in channel.messages if m.sender == "server")
    scalars = sum(m.nbytes for m in channel.scalars)
    wire = deployment.wire
    print(f"flower-deployment {first:6.1f} s the first cell (federation start-up, {len(state.history)} rounds)")
    print(f"  a later cell    {later:6.1f} s (on the stage's SuperLink and nodes)")
    print(
        f"channel: {up} B up, {down} B down, {scalars} B of scalars; wire (Flower's count): {wire['inbound-bytes']} B "
        f"in, {wire['outbound-bytes']} B out; overhead ratio {wire['total-bytes'] / (up + down + scalars):.3f}"
    )
    same = all(
        json.dumps(engine_history, sort_keys=True) == json.dumps(s.history, sort_keys=True)
        for s in (state, later_state)
    )
    print(f"deployment histories identical to the engine's: {same}")


if __name__ == "__main__":
    main()
