"""One cell of each paper trained twice on ``train.device``: the same bits? how fast? what share of the device's peak?

    python bench/bench_gpu.py --out OUT [--rounds 2] [--set model.max_length=256 --set train.batch_size=32 ...]

Run it in a project whose data stages have run (``dvc repro fedmatch_mine fedcmc_partition ssvfnas_partition``, or
``scripts/gpu_check.sh``, which runs them without DVC). For each paper it takes the first main-table cell of one
method (FedMatch's H+LR patch, FedCMC's own method, an SS-VFNAS search cell), trains it from scratch twice into two
scratch folders at the params (``--set key=value`` overrides, as ``dvc exp run -S``), and prints, per paper:
whether the two runs' metrics (less timings) and final checkpoints are byte-identical, the wall time of each, the
training steps' FLOPs counted by torch's own ``FlopCounterMode`` on one real batch times the steps taken, the
achieved FLOP/s (those FLOPs over the cell's whole wall time, its evaluation included: a lower bound of the training
steps' own rate) and MFU against the device's peak (a GPU's dense tensor-core peak from its datasheet, or one CPU
thread's measured fp32 matmul rate). It writes the same as ``gpu_check.json`` under ``--out``, with the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedrepro.config import parse_params, read_raw_params  # noqa: E402
from fedrepro.costs import GPUS  # noqa: E402
from fedrepro.hardware import machine_fingerprint  # noqa: E402

TIMINGS = ("seconds", "wall", "elapsed", "started", "finished", "time")


def overridden(pairs: list[str]) -> dict:
    """params.yaml with ``key=value`` overrides (YAML values), as ``dvc exp run -S`` sets them."""
    raw = read_raw_params(ROOT / "params.yaml")
    for pair in pairs:
        key, _, value = pair.partition("=")
        *parents, last = key.split(".")
        target = raw
        for part in parents:
            target = target[part]
        target[last] = yaml.safe_load(value)
    return raw


def without_timings(value):
    """A metrics record less whatever measures time (it differs from run to run by nature)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not any(t in k for t in TIMINGS)}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def tree_hash(folder: Path, pattern: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob(pattern)):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def peak_flops(device: str, precision: str) -> tuple[float, str]:
    """The device's peak FLOP/s at ``precision`` and where the figure comes from."""
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        for model, gpu in GPUS.items():  # the cost model's datasheet peaks (bf16 dense, fp32 without TF32)
            if model.upper() in name:
                peak = gpu.peak_tflops[precision]
                return peak * 1e12, f"{name}: {peak:g} TFLOP/s {precision} dense (datasheet, fedrepro.costs.GPUS)"
        return float("nan"), f"{name}: no datasheet peak known here"
    size = 1024
    a = torch.randn(size, size, dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    torch.mm(a, a)
    start = time.perf_counter()
    for _ in range(10):
        torch.mm(a, a)
    rate = 10 * 2 * size**3 / (time.perf_counter() - start)
    return rate, f"CPU: measured {precision} {size}x{size} matmul on {torch.get_num_threads()} thread(s)"


def step_flops(task, model) -> int:
    """FLOPs of one training step (forward and backward) on the task's first training batch, counted by torch."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = next(task.train_batches(list(task.client_ids)[:1], torch.Generator().manual_seed(0)))
    with FlopCounterMode(display=False) as counter:
        task.forward(model, batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def fl_cell(paper: str, params):
    """(run one cell into (out, checkpoints), build its engine) for a FedMatch or FedCMC main-table cell."""
    if paper == "fedmatch":
        from fedrepro.fedmatch import runs
        from fedrepro.fedmatch.cells import table_cells

        cell = next(c for c in table_cells(params) if c.method == "fedmatch_h_lr")
        folders = (Path("data/mined"), Path("data/tokenizer"))
    else:
        from fedrepro.fedcmc import runs
        from fedrepro.fedcmc.cells import table_cells

        cell = next(c for c in table_cells(params) if c.method == "fedcmc")
        folders = (Path("data/prepared/re"), Path("data/fedcmc/partitions"), Path("data/fedcmc/tokenizer"))
    digest = "gpu-check"

    def run(out: Path, checkpoints: Path) -> dict:
        return runs.run_cell(params, cell, *folders, out, checkpoints, digest)

    def engine(checkpoints: Path):
        return runs.build_cell(params, cell, *folders, digest, checkpoints)

    return cell, run, engine


def measure(paper: str, params, scratch: Path) -> dict:
    """The paper's cell trained twice; the comparison, the timings, and (FedMatch, FedCMC) FLOPs and MFU."""
    if paper == "ssvfnas":
        from fedrepro.ssvfnas import runs
        from fedrepro.ssvfnas.cells import table_cells

        cell = next(c for c in table_cells(params) if not c.baseline)

        def run(out, checkpoints):
            return runs.run_cell(params, cell, Path("data/ssvfnas/partitions"), out, checkpoints, "gpu-check")

        engine = None
    else:
        cell, run, engine = fl_cell(paper, params)
    walls, metrics, hashes = [], [], []
    for attempt in (1, 2):
        out, checkpoints = scratch / paper / f"out{attempt}", scratch / paper / f"ckpt{attempt}"
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        metrics.append(without_timings(run(out, checkpoints)))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
        hashes.append(tree_hash(checkpoints, "*.safetensors"))
        print(f"{paper} {cell.name}: run {attempt} took {walls[-1]:.1f} s", flush=True)
    result = {
        "cell": cell.name,
        "device": params.train.device,
        "precision": params.train.precision,
        "wall_s": walls,
        "same_metrics": json.dumps(metrics[0], sort_keys=True, default=str)
        == json.dumps(metrics[1], sort_keys=True, default=str),
        "same_checkpoints": hashes[0] == hashes[1],
    }
    if engine is not None:
        built = engine(scratch / paper / "flops")
        trainer = built.trainer
        per_step = step_flops(built.task, trainer.model)
        steps = sum(trainer.steps_per_round(c) for c in built.train_ids) * built.settings.rounds
        peak, source = peak_flops(params.train.device, params.train.precision)
        achieved = per_step * steps / min(walls)
        result |= {
            "flops_per_step": per_step,
            "training_steps": steps,
            "achieved_tflops": achieved / 1e12,
            "peak": source,
            "mfu": achieved / peak,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of the FL cells (SS-VFNAS: its search steps / 50)"
    )
    parser.add_argument("--papers", nargs="+", default=["fedcmc", "fedmatch", "ssvfnas"])
    parser.add_argument("--set", action="append", default=[], help="key=value override of params.yaml (repeatable)")
    args = parser.parse_args()
    rounds = args.rounds
    params = parse_params(
        overridden(
            args.set
            + [
                f"train.rounds={rounds}",
                f"fedcmc.settings.rounds={rounds}",
                f"ssvfnas.search.steps={50 * rounds}",
                f"ssvfnas.retrain.steps={50 * rounds}",
                "ssvfnas.moco.steps=20",
            ]
        )
    )
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine_fingerprint(params.train.device), "params": args.set, "rounds": rounds, "papers": {}}
    with tempfile.TemporaryDirectory(prefix="fedrepro-gpu-check-") as scratch:
        for paper in args.papers:
            results["papers"][paper] = measure(paper, params, Path(scratch))
            (args.out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    for paper, result in results["papers"].items():
        mfu = (
            f", {result['achieved_tflops']:.2f} TFLOP/s training, MFU {result['mfu']:.1%} of {result['peak']}"
            if "achieved_tflops" in result
            else ""
        )
        print(
            f"{paper} {result['cell']} on {result['device']} ({result['precision']}): same metrics "
            f"{result['same_metrics']}, same checkpoints {result['same_checkpoints']}, "
            f"{min(result['wall_s']):.1f} s{mfu}"
        )


if __name__ == "__main__":
    main()
