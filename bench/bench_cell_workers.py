"""Two cells at once with one torch thread each, or one cell with every core? What `$FEDREPRO_CELL_WORKERS` and
`train.threads` trade (fedrepro/grid.py).

For each backbone the scales use (embedded tiny BERT, CPU-scale MiniLM-L6), this times training steps (forward,
backward and a fused Adam step; batch 16, length 48, the precision `train.precision: auto` picks here) in one
process using all the cores, then in as many 1-thread processes at once as there are cores, and prints the
training sequences per second of each and their ratio. Run it on an otherwise idle machine.

Usage: python bench/bench_cell_workers.py [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

BATCH, LENGTH = 16, 48
BACKBONES = {"tiny BERT (embedded)": ("tiny", 8000), "MiniLM-L6 (cpu)": ("minilm", 30522)}


def worker(backbone: str, vocab: int, threads: int, steps: int) -> None:
    """Print this process's median training sequences per second (after warm-up steps)."""
    import torch

    from fedrepro.hardware import resolve_precision
    from fedrepro.models.backbone import build_encoder

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_encoder(backbone, vocab, max_length=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(100, vocab, (BATCH, LENGTH))
    bf16 = resolve_precision("auto") == "bf16"

    def step() -> float:
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = model(input_ids=ids).last_hidden_state
        hidden.float().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    for _ in range(3):
        step()
    print(BATCH / statistics.median(step() for _ in range(steps)))


def run(backbone: str, vocab: int, threads: int, processes: int, steps: int) -> float:
    """Total sequences per second of ``processes`` workers of ``threads`` threads each, run at the same time."""
    command = [sys.executable, __file__, "--worker", backbone, str(vocab), str(threads), "--steps", str(steps)]
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    outputs = [process.communicate()[0] for process in running]
    if any(process.returncode for process in running):
        raise SystemExit(f"a worker failed: {command}")
    return sum(float(output.strip().splitlines()[-1]) for output in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per process")
    parser.add_argument("--worker", nargs=3, metavar=("BACKBONE", "VOCAB", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]), args.steps)
        return
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; training sequences/s at batch {BATCH}, length {LENGTH}\n")
    print(
        f"{'backbone':24s} {'1 cell x ' + str(cores) + ' threads':>20s} "
        f"{str(cores) + ' cells x 1 thread':>20s} {'ratio':>7s}"
    )
    for name, (backbone, vocab) in BACKBONES.items():
        one = run(backbone, vocab, cores, 1, args.steps)
        many = run(backbone, vocab, 1, cores, args.steps)
        print(f"{name:24s} {one:20.1f} {many:20.1f} {many / one:6.2f}x")


if __name__ == "__main__":
    main()
