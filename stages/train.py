"""Stage train: one (algorithm, seed) cell of the grid; resumes from its last round checkpoint if killed."""

import argparse
import shutil
import time
from pathlib import Path

from dvclive import Live

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.io import atomic_dir, write_json
from fedrepro.metrics.summary import overall
from fedrepro.runs import build_engine, build_qa_task, tree_digest

MINED, TOKENIZER = Path("data/mined"), Path("data/tokenizer")


def log_history(live_dir: Path, history: list[dict]) -> None:
    """Replay the per-round history into dvclive (after training, so a resumed run logs the same curve)."""
    with Live(dir=str(live_dir), dvcyaml=None, save_dvc_exp=False, report=None) as live:
        for record in history:
            live.log_metric("train_loss", record["train_loss"])
            live.log_metric("bytes_up", record["bytes_up"])
            live.log_metric("bytes_down", record["bytes_down"])
            if "valid" in record:
                for name, value in overall(record["valid"]).items():
                    live.log_metric(f"valid_{name}", value)
            live.next_step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithm", required=True)
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args()
    params = load_params()
    cell = f"{args.algorithm}-{args.seed}"
    checkpoints, out = Path("data/checkpoints") / cell, Path("data/train") / cell
    task = build_qa_task(params, MINED, TOKENIZER)
    engine = build_engine(params, task, args.algorithm, args.seed, tree_digest(MINED, TOKENIZER), checkpoints)
    started = time.perf_counter()
    state = engine.run()
    with atomic_dir(out) as tmp:
        shutil.copytree(checkpoints / "latest", tmp / "latest")
        write_json(tmp / "metrics.json", {
            "algorithm": args.algorithm,
            "seed": args.seed,
            "history": state.history,
            "final_valid": overall(state.history[-1]["valid"]),
            "channel": engine.channel.summary(),
            "memory_bytes": engine.memory_bytes(),
        })
    # Wall time varies run to run, so it stays out of the cached cell output (data/train), beside the curves.
    with atomic_dir(Path("data/live") / cell) as tmp:
        log_history(tmp, state.history)
        write_json(tmp / "timing.json", {"seconds_this_invocation": time.perf_counter() - started})


if __name__ == "__main__":
    run_stage(main)
