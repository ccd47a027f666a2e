"""Where a CPU-scale cell's time goes: local training against evaluation, and what the evaluation scores.

Trains one cell of each text paper to the end with the library's own ``run_cell`` (what the training stages call):
FedMatch's H+LR method and FedCMC's FedAvg at the dataset and alpha of its sweeps. Timers wrap the engine's own
functions, so the same script measures the code of before issue 47 (run it with ``PYTHONPATH`` at a checkout of that
code) and of now:
- training: every client's local training (``LocalTrainer._train_local``);
- round evaluation: the engine's scoring after each evaluated round (``Engine.evaluate``), split into the training
  loss (``FIT``) and the other splits;
- end scoring: what ``run_cell`` does after the last round (test, and FedMatch's patch effect or FedCMC's valid);
- the rest: building the task (tokenising), checkpoints, the channel.
Each cell's timings and its metrics.json are kept under ``--workdir/<label>/<paper>/s<seed>`` (a finished one is not
trained again); ``--compare LABEL LABEL`` prints the two labels' timings and scores side by side, per seed and as mean
+- sample sd over the seeds both hold.

Reads DIR/params.yaml (run at ``--scale``) and the data stages' outputs under DIR/data, as ``bench_mfu.py`` does.
Usage: python bench/bench_eval_share.py --project DIR --workdir DIR --label now [--paper fedmatch|fedcmc|both]
           [--seeds 0 1 2] [--cells-at-once 2]
       python bench/bench_eval_share.py --workdir DIR --compare before now
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

PARTS = ("training", "round evaluation: FIT", "round evaluation: other splits", "end scoring", "the rest")
SCORE = {"fedmatch": "map", "fedcmc": "micro_f1"}


def timed(owner, name: str, totals: dict[str, float], key) -> None:
    """Wrap ``owner.name`` so that its calls' seconds add up in ``totals[key(*args)]``, and the moment its last call
    returned is in ``totals[key(*args) + ' returned']``."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[key(*args)] += time.perf_counter() - started
            totals[key(*args) + " returned"] = time.perf_counter()

    setattr(owner, name, wrapper)


def train_cell(paper: str, seed: int, project: str, scale: str, out: str) -> dict:
    """One cell in this (spawned) process, timed by part; writes ``timings.json`` beside its metrics.json."""
    import fedrepro
    from fedrepro.config import parse_params, read_raw_params
    from fedrepro.fl.engine import FIT, Engine, LocalTrainer
    from fedrepro.hardware import describe, machine_fingerprint
    from fedrepro.io import tree_digest

    raw = read_raw_params(Path(project) / "params.yaml")
    raw["scale"] = scale
    params, project, out = parse_params(raw), Path(project), Path(out)
    totals: dict[str, float] = defaultdict(float)
    timed(LocalTrainer, "_train_local", totals, lambda *args: "training")
    timed(
        Engine,
        "evaluate",
        totals,
        lambda engine, split: "round evaluation: FIT" if split == FIT else "round evaluation: other splits",
    )
    timed(Engine, "run", totals, lambda *args: "run")
    started = time.perf_counter()
    scratch = out.parent / f"{out.name}.checkpoint"
    if paper == "fedmatch":
        from fedrepro.fedmatch.cells import Cell
        from fedrepro.fedmatch.runs import run_cell

        folders = (project / "data" / "mined", project / "data" / "tokenizer")
        run_cell(params, Cell("fedmatch_h_lr", seed), *folders, out, scratch, tree_digest(*folders))
    else:
        from fedrepro.fedcmc.cells import Cell
        from fedrepro.fedcmc.runs import run_cell

        settings, sweeps = params.fedcmc.settings, params.fedcmc.sweeps
        cell = Cell("fedavg", sweeps.dataset, sweeps.alpha, settings.clients, settings.local_epochs, seed)
        folders = (
            project / "data" / "prepared" / "re",
            project / "data" / "fedcmc" / "partitions",
            project / "data" / "fedcmc" / "tokenizer",
        )
        run_cell(params, cell, *folders, out, scratch, tree_digest(*folders))
    finished = time.perf_counter()
    timings = {
        "cell": finished - started,
        **{part: totals[part] for part in PARTS[:3]},
        "end scoring": finished - totals["run returned"],
    }
    timings["the rest"] = timings["cell"] - sum(timings[part] for part in PARTS[:-1])
    timings.update(
        machine=describe([machine_fingerprint()]),
        code=str(Path(fedrepro.__file__).parent),
        precision=params.train.precision,
    )
    (out / "timings.json").write_text(json.dumps(timings, indent=2))
    return timings


def train(args) -> None:
    """The label's missing cells, ``--cells-at-once`` at a time (each at ``train.threads``, as a stage trains them)."""
    jobs = [
        (paper, seed)
        for paper in (["fedmatch", "fedcmc"] if args.paper == "both" else [args.paper])
        for seed in args.seeds
        if not (args.workdir / args.label / paper / f"s{seed}" / "timings.json").exists()
    ]
    with ProcessPoolExecutor(args.cells_at_once, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        futures = {
            job: pool.submit(
                train_cell, *job, str(args.project), args.scale, str(args.workdir / args.label / job[0] / f"s{job[1]}")
            )
            for job in jobs
        }
        for (paper, seed), future in futures.items():
            timings = future.result()
            print(
                f"{args.label} {paper} s{seed}: {timings['cell']:.0f} s, "
                + ", ".join(f"{part} {timings[part] / timings['cell']:.0%}" for part in PARTS),
                flush=True,
            )


def scores(paper: str, metrics: dict) -> dict[str, float]:
    """Valid (last evaluated round) and test, in the paper's metric (FedMatch: mean over clients)."""
    from fedrepro.metrics.summary import overall

    metric = SCORE[paper]
    valid = [overall(record["valid"])[metric] for record in metrics["history"] if "valid" in record]
    test = metrics["test"]["overall"][metric] if paper == "fedmatch" else metrics["test"][metric]
    return {f"valid {metric} (last round)": valid[-1], f"test {metric}": test}


def compare(workdir: Path, labels: list[str]) -> None:
    """Each paper's timings and scores for the labels side by side, over the seeds every label holds."""
    for paper in SCORE:
        seeds = sorted(
            set.intersection(
                *(
                    {int(p.name[1:]) for p in (workdir / label / paper).glob("s*") if (p / "timings.json").exists()}
                    for label in labels
                )
            )
        )
        if not seeds:
            continue
        rows: dict[str, dict[str, list[float]]] = {label: defaultdict(list) for label in labels}
        for label in labels:
            for seed in seeds:
                folder = workdir / label / paper / f"s{seed}"
                timings = json.loads((folder / "timings.json").read_text())
                rows[label]["cell seconds"].append(timings["cell"])
                for part in PARTS:
                    rows[label][f"{part} (share)"].append(timings[part] / timings["cell"])
                rows[label]["evaluation (share)"].append(sum(timings[part] for part in PARTS[1:4]) / timings["cell"])
                for name, value in scores(paper, json.loads((folder / "metrics.json").read_text())).items():
                    rows[label][name].append(value)
        machine = json.loads((workdir / labels[-1] / paper / f"s{seeds[0]}" / "timings.json").read_text())["machine"]
        print(f"\n{paper}, seeds {seeds}; {machine}")
        print(
            "| | "
            + " | ".join(f"{label} s{seed}" for label in labels for seed in seeds)
            + " | "
            + " | ".join(f"{label} mean +- sd" for label in labels)
            + " |"
        )
        print("|---" * (1 + len(labels) * (len(seeds) + 1)) + "|")
        for name in rows[labels[0]]:
            share = "share" in name
            show = (lambda v: f"{v:.0%}") if share else (lambda v: f"{v:.0f}" if "seconds" in name else f"{v:.4f}")
            each = " | ".join(show(v) for label in labels for v in rows[label][name])
            spread = " | ".join(
                f"{show(np.mean(rows[label][name]))} +- "
                f"{show(np.std(rows[label][name], ddof=1)) if len(seeds) > 1 else '-'}"
                for label in labels
            )
            print(f"| {name} | {each} | {spread} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--label", help="where this code's cells go under --workdir (e.g. before, now)")
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--paper", choices=["fedmatch", "fedcmc", "both"], default="both")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--cells-at-once", type=int, default=2)
    parser.add_argument("--compare", nargs="+", metavar="LABEL")
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()
    if args.compare:
        compare(args.workdir, args.compare)
        return
    if args.project is None or args.label is None:
        parser.error("training needs --project and --label")
    args.project = args.project.resolve()
    train(args)


if __name__ == "__main__":
    main()
