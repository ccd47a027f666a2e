"""Training throughput of one FedMatch H+LR cell against a plain PyTorch loop doing the same optimizer steps.

Around the very same steps, an engine round adds the channel copies, each client's private-state swap,
aggregation and an atomic checkpoint. The plain loop trains one copy of the same (patched) model client
after client on the same batches: same seeds, autocast, clipping, Adam and learning-rate schedule, nothing
else. Rounds alternate (engine, plain, engine, ...) so both see the same machine load; the first round of
each is a warm-up and is not timed. Both wall time and this process's CPU time are printed (other jobs on
the cores inflate wall time far more), with medians and the median of the adjacent engine/plain ratios.
A training sequence is one (question, answer) pair; a triple gives two.
Target (issue): engine throughput >= 90% of the plain loop's (engine time / plain time <= 1.11).

Reads DIR/params.yaml, DIR/data/mined and DIR/data/tokenizer (outputs of the mine and tokenizer stages).
Usage: python bench/bench_throughput.py [--project DIR] [--scale cpu] [--rounds 4] [--max-triples 120]
                                        [--precision bf16 [fp32]]   (default: the scale's train.precision)
"""

import argparse
import copy
import math
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import yaml

from fedrepro.config import Params, parse_params
from fedrepro.fedmatch.cells import Cell
from fedrepro.fl.engine import Engine, lr_factor
from fedrepro.runs import build_cell, tree_digest
from fedrepro.seeding import derive_seed

CELL = Cell("fedmatch_h_lr", 0)


def load_cell_params(project: Path, scale: str, **train) -> Params:
    """DIR/params.yaml at ``scale``, with ``train`` keys overridden."""
    with open(project / "params.yaml", encoding="utf-8") as handle:
        raw = yaml.safe_load(handle)
    raw["scale"] = scale
    params = parse_params(raw)
    return params.model_copy(update={"train": params.train.model_copy(update=train)})


def capped_engine(params: Params, project: Path, max_triples: int, checkpoint_dir: Path) -> Engine:
    """The cell's engine, each client training on its first ``max_triples`` triples only."""
    mined, tokenizer = project / "data" / "mined", project / "data" / "tokenizer"
    engine = build_cell(params, CELL, mined, tokenizer, tree_digest(mined, tokenizer), checkpoint_dir, progress=False)
    engine.task = engine.task.with_triples({c: frame.head(max_triples) for c, frame in engine.task.triples.items()})
    return engine


def clocks() -> tuple[float, float]:
    """Wall time and this process's CPU time (less inflated than wall time when other jobs share the cores)."""
    return time.perf_counter(), time.process_time()


def since(started: tuple[float, float]) -> tuple[float, float]:
    return tuple(now - then for now, then in zip(clocks(), started))


def plain_round(task, model, settings, clients, round_index: int, steps: dict[str, int]) -> tuple[float, float]:
    """The engine's local training without the engine: same batches, seeds, autocast, clipping, Adam, schedule."""
    started = clocks()
    model.train()
    for client_id in clients:
        optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
        total = settings.rounds * settings.local_epochs * math.ceil(task.num_train_samples([client_id]) / settings.batch_size)
        losses = []
        for epoch in range(settings.local_epochs):
            generator = torch.Generator().manual_seed(derive_seed(settings.seed, "shuffle", round_index, client_id, epoch))
            torch.manual_seed(derive_seed(settings.seed, "dropout", round_index, client_id, epoch))
            for batch in task.train_batches([client_id], generator):
                for group in optimizer.param_groups:
                    group["lr"] = settings.lr * lr_factor(steps[client_id], total, settings.warmup_fraction)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.precision == "bf16"):
                    loss = task.forward(model, batch).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
                optimizer.step()
                losses.append(loss.item())
                steps[client_id] += 1
    return since(started)


def bench(args: argparse.Namespace, precision: str) -> None:
    params = load_cell_params(args.project, args.scale, rounds=args.rounds + 1, eval_every=0, precision=precision)
    engine_times, plain_times, started = [], [], [clocks()]
    with tempfile.TemporaryDirectory() as folder:
        engine = capped_engine(params, args.project, args.max_triples, Path(folder))
        plain_model, steps = copy.deepcopy(engine.model), defaultdict(int)

        def after_engine_round(record: dict) -> None:
            """Run the plain loop on the same round right after the engine's (checkpoint included), then restart the clocks."""
            engine_times.append(since(started[0]))
            plain_times.append(plain_round(engine.task, plain_model, engine.settings, record["clients"], record["round"] - 1, steps))
            started[0] = clocks()

        engine.on_round_end = after_engine_round
        started[0] = clocks()
        engine.run()
    task = engine.task
    sequences = 2 * engine.settings.local_epochs * task.num_train_samples(engine.sample_clients(0))
    print(f"[{precision}] {len(task.client_ids)} clients x <= {args.max_triples} triples "
          f"({', '.join(f'{c} {len(f)}' for c, f in task.triples.items())}): {sequences} sequences/round, "
          f"{torch.get_num_threads()} threads, {len(engine_times) - 1} timed rounds of each (+1 warm-up)")
    for clock, kind in ((0, "wall"), (1, "cpu")):
        engine_round, plain_round_s = [t[clock] for t in engine_times[1:]], [t[clock] for t in plain_times[1:]]
        engine_s, plain_s = statistics.median(engine_round), statistics.median(plain_round_s)
        paired = statistics.median(e / p for e, p in zip(engine_round, plain_round_s))
        print(f"[{precision}, {kind} time] engine rounds (s): {' '.join(f'{t:.1f}' for t in engine_round)}; "
              f"plain rounds (s): {' '.join(f'{t:.1f}' for t in plain_round_s)}; median of paired ratios {paired:.3f}")
        print(f"[{precision}, {kind} time] engine {engine_s:.1f} s/round ({sequences / engine_s:.0f} seq/s), plain loop "
              f"{plain_s:.1f} s/round ({sequences / plain_s:.0f} seq/s): engine throughput = {plain_s / engine_s:.0%} "
              f"of plain (target >= 90%); time ratio engine/plain = {engine_s / plain_s:.3f} (target <= 1.11)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path("."), help="folder with params.yaml and data/ (default .)")
    parser.add_argument("--scale", default="cpu", help="overrides params.yaml's scale (default cpu)")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds of each, after one warm-up round (default 4)")
    parser.add_argument("--max-triples", type=int, default=120, help="training triples kept per client (default 120)")
    parser.add_argument("--precision", nargs="+", choices=["bf16", "fp32"], help="one line each (default: the scale's)")
    args = parser.parse_args()
    for precision in args.precision or [load_cell_params(args.project, args.scale).train.precision]:
        bench(args, precision)


if __name__ == "__main__":
    main()
