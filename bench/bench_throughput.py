"""Training throughput of one FedMatch H+LR cell against a plain PyTorch loop doing the same optimizer steps.

Around the very same steps, an engine round adds the channel copies, each client's private-state swap,
aggregation and an atomic checkpoint. The plain loop trains one copy of the same (patched) model client
after client on the same batches: same seeds, autocast, clipping, Adam and learning-rate schedule, nothing
else. The two interleave step by step (the engine's task runs one plain step, timed apart, after each
engine step), because other jobs on the cores can slow steps tens of times over for seconds at a time, which
would swamp a comparison of whole alternating rounds. A round's engine time is its wall time (from the
start of the round to the end of its checkpoint) less the plain steps run inside it. Both sides then
share the global RNG, which changes dropout masks but not the work. The first round is a warm-up.
A training sequence is one (question, answer) pair; a triple gives two.
Target (issue): engine throughput >= 90% of the plain loop's (engine time / plain time <= 1.11).

Reads DIR/params.yaml, DIR/data/mined and DIR/data/tokenizer (outputs of the fedmatch_mine and fedmatch_tokenizer
stages).
Usage: python bench/bench_throughput.py [--project DIR] [--scale cpu] [--rounds 4] [--max-triples 120]
                                        [--precision bf16 [fp32]]   (default: the scale's train.precision)
"""

import argparse
import copy
import itertools
import math
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterator

import torch
import yaml

from fedrepro.config import Params, parse_params
from fedrepro.fedmatch.cells import Cell
from fedrepro.fl.engine import Engine, lr_factor
from fedrepro.io import tree_digest
from fedrepro.fedmatch.runs import build_cell
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


def plain_steps(task, model, settings, clients, round_index: int, steps: dict[str, int]) -> Iterator[None]:
    """The engine's local training without the engine, one optimizer step per ``next``: same batches, seeds,
    autocast, clipping, Adam (fresh each client and round) and learning-rate schedule."""
    model.train()
    for client_id in clients:
        optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
        total = (
            settings.rounds
            * settings.local_epochs
            * math.ceil(task.num_train_samples([client_id]) / settings.batch_size)
        )
        losses = []
        for epoch in range(settings.local_epochs):
            generator = torch.Generator().manual_seed(
                derive_seed(settings.seed, "shuffle", round_index, client_id, epoch)
            )
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
                yield


class Interleaved:
    """The engine's task, running one plain-loop step (timed apart) after each step the engine takes."""

    def __init__(self, task) -> None:
        self.task, self.plain, self.plain_seconds = task, iter(()), 0.0

    def __getattr__(self, name: str):
        return getattr(self.task, name)

    def advance(self, steps: int | None = 1) -> None:
        started = time.perf_counter()
        for _ in itertools.islice(self.plain, steps):
            pass
        self.plain_seconds += time.perf_counter() - started

    def train_batches(self, client_ids, generator):
        for batch in self.task.train_batches(client_ids, generator):
            yield batch
            self.advance()  # the engine has taken its step on ``batch`` and asks for the next one


def bench(args: argparse.Namespace, params: Params, precision: str) -> None:
    train = params.train.model_copy(update={"rounds": args.rounds + 1, "eval_every": 0, "precision": precision})
    params = params.model_copy(update={"train": train})
    engine_times, plain_times, started = [], [], [0.0]
    with tempfile.TemporaryDirectory() as folder:
        engine = capped_engine(params, args.project, args.max_triples, Path(folder))
        task, plain_model, steps = Interleaved(engine.task), copy.deepcopy(engine.model), defaultdict(int)
        engine.task = task

        def start_round(round_index: int) -> None:
            task.plain = plain_steps(
                task.task, plain_model, engine.settings, engine.sample_clients(round_index), round_index, steps
            )
            task.plain_seconds, started[0] = 0.0, time.perf_counter()

        def after_engine_round(record: dict) -> None:
            """Split the round's wall time (checkpoint included) into the plain loop's steps and the engine's rest."""
            elapsed = time.perf_counter() - started[0]
            before = task.plain_seconds
            task.advance(None)  # none left when both took the same steps
            engine_times.append(elapsed - before)
            plain_times.append(task.plain_seconds)
            start_round(record["round"])

        engine.on_round_end = after_engine_round
        start_round(0)
        engine.run()
    sequences = 2 * engine.settings.local_epochs * task.num_train_samples(engine.sample_clients(0))
    engine_s, plain_s = statistics.median(engine_times[1:]), statistics.median(plain_times[1:])
    paired = statistics.median(e / p for e, p in zip(engine_times[1:], plain_times[1:]))
    print(
        f"[{precision}] {len(task.client_ids)} clients x <= {args.max_triples} triples "
        f"({', '.join(f'{c} {len(f)}' for c, f in task.triples.items())}): {sequences} sequences/round, "
        f"{torch.get_num_threads()} threads, {len(engine_times) - 1} timed rounds of each (+1 warm-up)"
    )
    print(
        f"[{precision}] engine rounds (s): {' '.join(f'{t:.1f}' for t in engine_times[1:])}; plain rounds (s): "
        f"{' '.join(f'{t:.1f}' for t in plain_times[1:])}; median of the per-round ratios engine/plain {paired:.3f}"
    )
    print(
        f"[{precision}] engine {engine_s:.1f} s/round ({sequences / engine_s:.0f} seq/s), plain loop "
        f"{plain_s:.1f} s/round ({sequences / plain_s:.0f} seq/s): engine throughput = {plain_s / engine_s:.0%} "
        f"of plain (target >= 90%); time ratio engine/plain = {engine_s / plain_s:.3f} (target <= 1.11)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path("."), help="folder with params.yaml and data/ (default .)")
    parser.add_argument("--scale", default="cpu", help="overrides params.yaml's scale (default cpu)")
    parser.add_argument(
        "--rounds", type=int, default=4, help="timed rounds of each, after one warm-up round (default 4)"
    )
    parser.add_argument("--max-triples", type=int, default=120, help="training triples kept per client (default 120)")
    parser.add_argument("--precision", nargs="+", choices=["bf16", "fp32"], help="one line each (default: the scale's)")
    args = parser.parse_args()
    params = load_cell_params(args.project, args.scale)  # read once: the file may change during a long bench
    for precision in args.precision or [params.train.precision]:
        bench(args, params, precision)


if __name__ == "__main__":
    main()
