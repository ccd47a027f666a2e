"""Is bf16 autocast faster than fp32 on this CPU? What `train.precision: auto` picks here, and why.

bf16 pays only where the CPU runs bf16 matmuls on bf16 instructions (AVX-512 BF16, AMX); elsewhere oneDNN
emulates them and a training step gets slower, not faster. This bench times one training step (forward and
backward, batch 16, sequence length 64, 2 threads) of the two backbones the scales use, the embedded tiny BERT
and the packaged MiniLM-L6, in fp32 and under bf16 autocast, alternating the two step by step (other jobs on the
cores swing timings for seconds at a time, and alternation exposes both precisions to the same swings). It prints
the median sequences per second of each and their ratio, and the precision `auto` resolves to on this machine.

Usage: python bench/bench_bf16_speed.py [--steps 12] [--length 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedrepro.hardware import machine_fingerprint, native_bf16, resolve_precision
from fedrepro.models.backbone import build_encoder

BATCH = 16
BACKBONES = {"tiny BERT (embedded)": ("tiny", 8000), "MiniLM-L6 (cpu)": ("minilm", 30522)}


def step_seconds(model: torch.nn.Module, ids: torch.Tensor, bf16: bool) -> float:
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        hidden = model(input_ids=ids).last_hidden_state
    hidden.float().mean().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per precision (after one warm-up each)")
    parser.add_argument("--length", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    fingerprint = machine_fingerprint()
    print(
        f"machine: {fingerprint['cpu']} {fingerprint['isa_flags']}, torch kernels {fingerprint['torch_cpu_capability']}"
    )
    print(f"bf16 instructions: {'yes' if native_bf16() else 'no'}; train.precision auto -> {resolve_precision('auto')}")
    print(f"\n{'backbone':24s} {'fp32 seq/s':>11s} {'bf16 seq/s':>11s} {'bf16 / fp32':>12s}")
    for name, (backbone, vocab) in BACKBONES.items():
        model = build_encoder(backbone, vocab, max_length=args.length)
        ids = torch.randint(100, vocab, (BATCH, args.length))
        times: dict[bool, list[float]] = {False: [], True: []}
        for bf16 in (False, True):
            step_seconds(model, ids, bf16)  # warm-up: oneDNN builds its kernels on first use
        for _ in range(args.steps):
            for bf16 in (False, True):
                times[bf16].append(step_seconds(model, ids, bf16))
        fp32, bf16 = (BATCH / statistics.median(times[flag]) for flag in (False, True))
        print(f"{name:24s} {fp32:11.1f} {bf16:11.1f} {bf16 / fp32:11.2f}x")


if __name__ == "__main__":
    main()
