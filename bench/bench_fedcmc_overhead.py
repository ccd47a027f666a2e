"""Extra work per round of FedCMC, MOON and SCAFFOLD against FedAvg's, on the same FedCMC cell.

Each method trains the same partition (same data, seeds, model) for a few rounds; a round's time is its
wall time. FedCMC adds a cosine contrast per batch and, at the server, a similarity per client and class;
MOON runs the batch through two more models (global and previous) and keeps a model per client; SCAFFOLD
adds a linear term per parameter and sends variates both ways. Also printed: bytes per round and the
per-client state each method keeps (what the engine holds for a client between its rounds).

Reads DIR/params.yaml and DIR/data/{prepared/re,fedcmc/partitions,fedcmc/tokenizer} (run the
fedcmc_partition stage first). Rounds after the first are timed (the first warms caches).
Usage: python bench/bench_fedcmc_overhead.py [--project DIR] [--scale embedded] [--rounds 3] [--alpha 0.05]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path


from fedrepro.config import parse_params, read_raw_params
from fedrepro.fedcmc.cells import Cell
from fedrepro.fedcmc.runs import build_cell

METHODS = ("fedavg", "fedcmc", "moon", "scaffold")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--scale", default=None, help="default: params.yaml's scale")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=None, help="default: fedcmc.sweeps.alpha")
    args = parser.parse_args()
    raw = read_raw_params(args.project / "params.yaml")
    raw["scale"] = args.scale or raw["scale"]
    raw["fedcmc"]["settings"]["rounds"] = args.rounds
    raw["fedcmc"]["settings"]["eval_every"] = 0
    params = parse_params(raw)
    sweeps, settings = params.fedcmc.sweeps, params.fedcmc.settings
    data = args.project / "data"
    rows = {}
    for method in METHODS:
        cell = Cell(method, sweeps.dataset, args.alpha or sweeps.alpha, settings.clients, settings.local_epochs, 0)
        with tempfile.TemporaryDirectory() as scratch:
            engine = build_cell(
                params,
                cell,
                data / "prepared" / "re",
                data / "fedcmc" / "partitions",
                data / "fedcmc" / "tokenizer",
                "bench",
                Path(scratch),
                progress=False,
            )
            times = []
            for round_index in range(args.rounds):
                started = time.perf_counter()
                engine.state.history.append(engine._run_round(round_index))
                times.append(time.perf_counter() - started)
            last = engine.state.history[-1]
            rows[method] = (
                statistics.median(times[1:] or times),
                last["bytes_up"],
                last["bytes_down"],
                engine.memory_bytes()["private_per_client_max"],
            )
    base = rows["fedavg"][0]
    print(f"cell: {cell.partition}, {args.rounds} rounds (median of rounds 2..{args.rounds})")
    print(f"{'method':10} {'s/round':>8} {'x FedAvg':>9} {'MB up':>8} {'MB down':>8} {'state/client MB':>16}")
    for method, (seconds, up, down, state) in rows.items():
        print(
            f"{method:10} {seconds:8.2f} {seconds / base:9.2f} "
            f"{up / 2**20:8.2f} {down / 2**20:8.2f} {state / 2**20:16.2f}"
        )


if __name__ == "__main__":
    main()
