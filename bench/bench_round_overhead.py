"""A FedAvg round's wall time over a plain PyTorch loop doing the same optimizer steps on the same data.

The engine adds the channel copies, the per-client state swap, aggregation and an atomic checkpoint per
round; this prints how much that costs. Engine and plain rounds alternate, so both see the same load. Target (issue 2): ratio <= 1.05. Needs the embedded pipeline's
data/mined and data/tokenizer (run `dvc repro` first). Prints medians over repeated rounds.
Usage: python bench/bench_round_overhead.py [--rounds 8]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedrepro.config import load_params
from fedrepro.fl.engine import lr_factor
from fedrepro.runs import build_engine, build_qa_task, tree_digest
from fedrepro.seeding import derive_seed

MINED, TOKENIZER = Path("data/mined"), Path("data/tokenizer")


def plain_round(task, model, settings, round_index: int) -> float:
    """What FedAvg's local training does, without the engine: same batches, same seeds, same optimizer steps."""
    started = time.perf_counter()
    for client_id in task.client_ids:
        optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
        total = settings.rounds * -(-task.num_train_samples([client_id]) // settings.batch_size)
        step = 0
        generator = torch.Generator().manual_seed(derive_seed(settings.seed, "shuffle", round_index, client_id, 0))
        torch.manual_seed(derive_seed(settings.seed, "dropout", round_index, client_id, 0))
        model.train()
        for batch in task.train_batches([client_id], generator):
            for group in optimizer.param_groups:
                group["lr"] = settings.lr * lr_factor(step, total, settings.warmup_fraction)
            output = task.forward(model, batch)
            optimizer.zero_grad(set_to_none=True)
            output.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            optimizer.step()
            step += 1
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=8, help="engine rounds; the last (it evaluates) is not timed")
    args = parser.parse_args()
    params = load_params()
    params = params.model_copy(update={"train": params.train.model_copy(update={"rounds": args.rounds, "eval_every": 10_000})})
    task = build_qa_task(params, MINED, TOKENIZER)
    plain_model = task.build_model()
    engine_times, plain_times, started = [], [], [0.0]

    def after_engine_round(record: dict) -> None:
        """Time the plain loop on the same round right after the engine's, so both see the same machine load."""
        engine_times.append(time.perf_counter() - started[0])
        plain_times.append(plain_round(task, plain_model, engine.settings, record["round"] - 1))
        started[0] = time.perf_counter()

    with tempfile.TemporaryDirectory() as folder:
        engine = build_engine(params, task, "fedavg", 0, tree_digest(MINED, TOKENIZER), Path(folder), progress=False)
        engine.on_round_end = after_engine_round
        started[0] = time.perf_counter()
        engine.run()
    # The engine's last round also evaluates on the validation split: leave that pair out.
    engine_times, plain_times = engine_times[:-1], plain_times[:-1]
    engine_median, plain_median = statistics.median(engine_times), statistics.median(plain_times)
    print(f"rounds timed: {len(engine_times)} of each, on {len(task.client_ids)} clients")
    print(f"FedAvg round (engine: channel, state swap, aggregation, checkpoint): median {engine_median:.3f} s")
    print(f"plain PyTorch loop, same optimizer steps on the same data:           median {plain_median:.3f} s")
    print(f"ratio engine / plain: {engine_median / plain_median:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
