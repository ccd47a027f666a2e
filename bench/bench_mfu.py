"""How close a CPU-scale training round of each text paper comes to what this CPU can do.

For one cell of each text paper (FedMatch H+LR; FedCMC FedAvg on the first dataset and alpha of the params), built
by the library exactly as its training stage builds it, this times round 1's local training of every client (the
engine's own ``LocalTrainer.client_round``) and then one validation pass, and prints:
- training tokens per second, counting real tokens only (attention mask), and the share of padding in the batches;
- achieved training FLOP/s: the model FLOPs of the real tokens, 6 x (weights of the Linear layers) per token plus
  the attention products (12 x layers x hidden x length per token), over the training time;
- the matmul peak of this machine in fp32 and bf16, measured here by the same script (the best of a few runs of a
  2048x384 by 384x1536 product, the CPU-scale model's feed-forward shape, and of a 1024-cube product);
- the model-FLOP utilisation (MFU): achieved / peak of the precision the cell trains in (``train.precision``);
- the time split of a round: local training against the validation pass (``train.eval_every``).

``--compare`` prints it for the training of before issue 19 and of now, on the same machine in the same run:
- before: fp32, Adam's per-tensor loop (torch's CPU default, which the engine used: emulated here by patching
  ``torch.optim.Adam``), one cell on every core;
- now: ``train.precision`` as the params resolve it on this CPU, the fused Adam, ``train.threads`` per cell and as many
  cells at once as a training stage runs (``fedrepro.grid.cell_workers``), each a forked copy of the same round;
  the machine's throughput is the real tokens of all of them over the wall time they took together.

Reads DIR/params.yaml (run at ``--scale``) and the CPU-scale data stages' outputs under DIR/data (fedmatch_mine,
fedmatch_tokenizer, fedcmc_partition); a clone with ``scale: cpu`` and the mirror after ``dvc repro fedmatch_mine
fedmatch_tokenizer fedcmc_partition`` has them.
Usage: python bench/bench_mfu.py --project DIR [--scale cpu] [--paper fedmatch|fedcmc|both]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from fedrepro.config import Params, parse_params, read_raw_params
from fedrepro.grid import cell_workers
from fedrepro.hardware import describe, machine_fingerprint, resolve_precision
from fedrepro.io import tree_digest


def load_params(project: Path, scale: str, before: bool = False) -> Params:
    """The params at ``scale``; ``before``: with the training stages' settings before issue 19 (fp32, every core a
    cell: the recipe sets a cell's torch threads from ``train.threads``)."""
    raw = read_raw_params(project / "params.yaml")
    raw["scale"] = scale
    if before:
        raw["train"].update(precision="fp32", threads=len(os.sched_getaffinity(0)))
    return parse_params(raw)


@contextlib.contextmanager
def per_tensor_adam():
    """The engine's Adam as it was before issue 19: torch's per-tensor loop (no ``fused``, no ``foreach``)."""
    fused_adam = torch.optim.Adam
    torch.optim.Adam = lambda params, lr, fused=None: fused_adam(params, lr=lr, foreach=False)
    try:
        yield
    finally:
        torch.optim.Adam = fused_adam


def matmul_peak(dtype: torch.dtype, repeats: int = 5) -> float:
    """Best FLOP/s of a few timed products of the model's feed-forward shape and of a 1024 cube."""
    best = 0.0
    for m, k, n in ((2048, 384, 1536), (1024, 1024, 1024)):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        torch.mm(a, b)
        for _ in range(repeats):
            started, calls = time.perf_counter(), 0
            while time.perf_counter() - started < 0.3:
                torch.mm(a, b)
                calls += 1
            best = max(best, 2 * m * k * n * calls / (time.perf_counter() - started))
    return best


def linear_weights(model: nn.Module) -> int:
    return sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))


def encoder_shape(model: nn.Module) -> tuple[int, int]:
    """(layers, hidden size) of the BERT-family encoder inside ``model``."""
    config = next(m.config for m in model.modules() if hasattr(m, "config") and hasattr(m.config, "hidden_size"))
    layers = sum(1 for name, _ in model.named_modules() if name.endswith("attention.self"))
    return layers, config.hidden_size


class TokenCounter:
    """Wraps a task's ``train_batches`` to count real and padded tokens and the attention work of real tokens."""

    def __init__(self, task, layers: int, hidden: int) -> None:
        self.task, self.layers, self.hidden = task, layers, hidden
        self.real = self.padded = 0
        self.attention_flops = 0.0
        self.original = task.train_batches
        task.train_batches = self.train_batches

    def train_batches(self, client_ids, generator):
        for batch in self.original(client_ids, generator):
            mask = batch["attention_mask"]
            lengths = mask.sum(dim=1).double()
            self.real += int(lengths.sum())
            self.padded += mask.numel()
            self.attention_flops += float((12 * self.layers * self.hidden * lengths**2).sum())
            yield batch


def train_round(engine) -> tuple[TokenCounter, float]:
    """The tokens of round 1's local training of every client, and its seconds."""
    layers, hidden = encoder_shape(engine.model)
    counter = TokenCounter(engine.task, layers, hidden)
    started = time.perf_counter()
    for client_id in engine.train_ids:
        engine.trainer.client_round(0, client_id, engine.state.global_weights, {})
    return counter, time.perf_counter() - started


def machine_tokens_per_second(build, scratch: Path, workers: int) -> float:
    """Real training tokens per second of ``workers`` forked copies of one cell's round 1, trained at once as a stage
    forks its cells. The wall time includes building each copy (model and task), so the figure errs low."""
    reads = []
    started = time.perf_counter()
    for worker in range(workers):
        read, write = os.pipe()
        if os.fork() == 0:
            os.close(read)
            real = 0
            try:
                real = train_round(build(scratch / f"worker{worker}"))[0].real
            finally:
                os.write(write, str(real).encode())
                os._exit(0)
        os.close(write)
        reads.append(read)
    tokens = []
    for read in reads:
        with os.fdopen(read) as pipe:
            tokens.append(int(pipe.read() or 0))
    seconds = time.perf_counter() - started
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
    if not all(tokens):
        raise SystemExit("a forked cell failed (its traceback is above)")
    return sum(tokens) / seconds


def measure(engine, label: str, precision: str, peaks: dict[str, float]) -> None:
    layers, hidden = encoder_shape(engine.model)
    weights = linear_weights(engine.model)
    counter, train_seconds = train_round(engine)
    started = time.perf_counter()
    engine.evaluate("valid")
    eval_seconds = time.perf_counter() - started
    flops = 6 * weights * counter.real + counter.attention_flops
    achieved = flops / train_seconds
    peak = peaks["bf16" if precision == "bf16" else "fp32"]
    print(f"\n{label} ({layers} layers, hidden {hidden}, {weights / 1e6:.1f} M Linear weights, {precision})")
    print(
        f"  round 1, {len(engine.train_ids)} clients: {counter.real} real tokens in {train_seconds:.1f} s = "
        f"{counter.real / train_seconds:,.0f} tokens/s; padding {1 - counter.real / counter.padded:.1%} of the batches"
    )
    print(
        f"  achieved {achieved / 1e9:.1f} GFLOP/s of model FLOPs = "
        f"MFU {achieved / peak:.1%} of the {precision} matmul peak"
    )
    print(f"  validation pass {eval_seconds:.1f} s = {eval_seconds / (train_seconds + eval_seconds):.0%} of the round")


def fedmatch_engine(project: Path, params: Params, scratch: Path):
    from fedrepro.fedmatch.cells import Cell
    from fedrepro.fedmatch.runs import build_cell

    mined, tokenizer = project / "data" / "mined", project / "data" / "tokenizer"
    return build_cell(
        params, Cell("fedmatch_h_lr", 0), mined, tokenizer, tree_digest(mined, tokenizer), scratch, progress=False
    )


def fedcmc_engine(project: Path, params: Params, scratch: Path):
    from fedrepro.fedcmc.cells import table_cells
    from fedrepro.fedcmc.runs import build_cell

    folders = (
        project / "data" / "prepared" / "re",
        project / "data" / "fedcmc" / "partitions",
        project / "data" / "fedcmc" / "tokenizer",
    )
    cell = next(c for c in table_cells(params) if c.method == "fedavg")
    return build_cell(params, cell, *folders, tree_digest(*folders), scratch, progress=False)


def compare(project: Path, scale: str, papers: list[str]) -> None:
    """Machine throughput of round 1 before issue 19 and now (module docstring), for each paper."""
    cores = len(os.sched_getaffinity(0))
    now = load_params(project, scale)
    before = load_params(project, scale, before=True)
    workers = cell_workers(now.train.threads)
    print(f"machine: {describe([machine_fingerprint()])}; {cores} cores")
    print(
        f"before: fp32, per-tensor Adam, 1 cell x {cores} threads;  now: {now.train.precision}, fused Adam, "
        f"{workers} cells x {now.train.threads} thread(s)"
    )
    for paper in papers:
        build, label = BUILDERS[paper]
        with tempfile.TemporaryDirectory() as scratch:  # each build sets its torch threads (train.threads)
            new = machine_tokens_per_second(functools.partial(build, project, now), Path(scratch), workers)
            with per_tensor_adam():
                counter, seconds = train_round(build(project, before, Path(scratch) / "before"))
            real, padded = counter.real, counter.padded
            old = real / seconds
        print(
            f"{label}: before {old:,.0f} real tokens/s ({seconds:.1f} s for round 1's {real} real tokens, padding "
            f"{1 - real / padded:.1%}), now {new:,.0f} tokens/s: {new / old:.2f}x"
        )


BUILDERS = {"fedmatch": (fedmatch_engine, "FedMatch H+LR"), "fedcmc": (fedcmc_engine, "FedCMC's FedAvg cell")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--paper", choices=["fedmatch", "fedcmc", "both"], default="both")
    parser.add_argument("--compare", action="store_true", help="before issue 19 against now (module docstring)")
    args = parser.parse_args()
    papers = ["fedmatch", "fedcmc"] if args.paper == "both" else [args.paper]
    if args.compare:
        compare(args.project.resolve(), args.scale, papers)
        return
    params = load_params(args.project.resolve(), args.scale)
    torch.set_num_threads(params.train.threads)
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    print(f"machine: {describe([machine_fingerprint()])}; {torch.get_num_threads()} threads")
    print(f"matmul peak: fp32 {peaks['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s")
    precision = resolve_precision(params.train.precision)
    for paper in papers:
        build, label = BUILDERS[paper]
        with tempfile.TemporaryDirectory() as scratch:
            measure(build(args.project.resolve(), params, Path(scratch)), label, precision, peaks)


if __name__ == "__main__":
    main()
