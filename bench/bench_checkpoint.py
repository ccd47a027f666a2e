"""What a per-round checkpoint costs, against what a round costs: is writing every round worth slimming?

The heaviest checkpoint a cell writes is FedMatch's `individual` at CPU scale: every client keeps a whole private
MiniLM (the packaged all-MiniLM-L6-v2, 22.7M parameters), so a round's checkpoint holds T full models, about 450 MB
for T = 5 (issue 47). Everything in it is what an exact resume needs (each client's weights as the round left them;
the engine keeps no optimizer state between rounds), so the only lever is writing less often. This script builds
that checkpoint's tensors at their real sizes (the MiniLM's parameter shapes, loaded from the package's config) and
times ``fedrepro.fl.checkpoint.save_checkpoint`` writing them, median of ``--repeats``; a CPU-scale round of that cell
is the other side of the ratio (``--round-seconds``: bench/README's measured FedMatch cell, 707 s over 3 rounds).

Usage: python bench/bench_checkpoint.py [--clients 5] [--repeats 3] [--round-seconds 236]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from transformers import AutoConfig, AutoModel  # noqa: E402

from bench_pipeline import machine_speed  # noqa: E402
from fedrepro.fl.checkpoint import TrainingState, save_checkpoint  # noqa: E402
from fedrepro.hardware import machine_fingerprint  # noqa: E402
from fedrepro.models.backbone import minilm_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--round-seconds",
        type=float,
        default=707 / 3,
        help="a CPU-scale FedMatch round (bench/README: a 707-s, 3-round H+LR cell)",
    )
    args = parser.parse_args()
    with torch.device("meta"):
        shapes = {
            name: p.shape
            for name, p in AutoModel.from_config(AutoConfig.from_pretrained(minilm_path())).named_parameters()
        }
    generator = torch.Generator().manual_seed(0)
    client = {f"param/{name}": torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    state = TrainingState("bench", next_round=1, client_states={f"client_{k}": client for k in range(args.clients)})
    size = sum(t.numel() * t.element_size() for t in client.values()) * args.clients
    seconds = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            started = time.perf_counter()
            save_checkpoint(Path(folder), state)
            seconds.append(time.perf_counter() - started)
    median = statistics.median(seconds)
    hardware = machine_fingerprint()
    print(
        f"machine: {hardware['cpu']} ({', '.join(hardware['isa_flags'])}), one-thread fp32 matmul "
        f"{machine_speed():.1f} GFLOP/s"
    )
    print(
        f"checkpoint of {args.clients} private MiniLMs: {size / 1e6:.0f} MB written in {median:.2f} s (median of "
        f"{args.repeats}: {', '.join(f'{s:.2f}' for s in seconds)})"
    )
    print(f"against a {args.round_seconds:.0f}-s round: {100 * median / args.round_seconds:.2f}% of the round")


if __name__ == "__main__":
    main()
