"""Run one paper's grid at CPU scale on the mirrored real data in a clean clone, then freeze its report here.

    python scripts/cpu_snapshot.py run fedcmc --budget 90      # train what the ledger lacks for 90 min, committing
                                                               # each cell
    python scripts/cpu_snapshot.py run fedmatch --mirror ../shared/data/raw
    python scripts/cpu_snapshot.py run ssvfnas               # 192 cells, about an hour on 2 cores
    python scripts/cpu_snapshot.py collect fedcmc WORKDIR    # copy WORKDIR's report into reports/cpu/fedcmc
    python scripts/cpu_snapshot.py status [--mark]           # each ledger's cells done and missing; stale reports
    python scripts/cpu_snapshot.py carry fedcmc              # after a code change: re-key the ledger if 3 cells
                                                             # retrain identical
    python scripts/cpu_snapshot.py canary ssvfnas            # a stale one carried forward, or marked
    python scripts/cpu_snapshot.py plan [fedmatch]           # the cells a snapshot trains, by table and figure
    python scripts/cpu_snapshot.py plan --scale paper        # what the paper-scale grid costs on a GPU (bench/README)
    python scripts/cpu_snapshot.py partial fedmatch WORKDIR  # Table 2 as the ledger holds it, no verdicts (PARTIAL.md)

A snapshot grows across stretches of work in its results ledger, ``reports/cpu/<paper>/cells`` (``fedrepro.ledger``):
each cell's outputs a report needs, none of the raw data, committed as it lands. ``run`` clones HEAD (its committed
code: commit first), trains in the clone every cell the ledger lacks for this machine class (the main table seed by
seed, then the figures), takes the others back from the ledger untrained, and with ``--budget`` starts no cell past
the budget less the 90th percentile of its recorded cells' seconds (Ctrl-C stops it at once, losing only the cells
still running); it then writes the ledger's plan (``PLAN.json``: every cell the snapshot needs, its
run fingerprint and inputs) and the stretch's manifest (``stretches/``: commit, dates, the machine, its one-thread
matmul GFLOP/s, what it trained), and commits them. A code change in a cell's closure moves its run fingerprint, and
so leaves its entry behind; when the change moved no result, ``carry`` re-keys the entries to HEAD's runs after a
sample of them retrains at HEAD to the same files. Once every cell is there, the paper's own report stage writes the
report, copied here with a SNAPSHOT.md that records the commit, the date, the params and the stage wall times, and
with the clone's dvc.lock (SNAPSHOT.lock): the hash of every file and the value of every param its cells depended on.
`status` lets DVC compare that lock with HEAD's code and the params HEAD would run the snapshot with; `--mark`
puts a banner at the top of each stale snapshot's report (and takes it off a fresh one), which
tests/test_cpu_snapshot.py requires. A change of code that leaves the results as they were (a refactor) need not
cost a retrain: `canary` retrains a sample of the snapshot's cells at HEAD and compares them bit for bit (``canary``).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAPERS = {
    "fedmatch": {
        "title": "fedrepro — FedMatch at CPU scale on the mirrored real data",
        # Tables 2-3 at 3 seeds; Figs 5-8 at seed 0 (the "1 seed or more"): 3 seeds of every sweep point would
        # add 44 cells, more than the 4-h budget allows, and a figure's claims then say "1 seed" (inconclusive)
        "grid": {"fedmatch.sweeps.seeds": [0]},
        "targets": ["fedmatch_table", "fedmatch_sweeps", "fedmatch_report"],
        "stage_script": "fedmatch_train.py",
        "inputs": ("MINED", "TOKENIZER"),
        "gold": "MINED",
    },
    "fedcmc": {
        "title": "fedrepro — FedCMC at CPU scale on the mirrored real data",
        # Table 2 (and Figs 1, 3a, which read its cells) at 3 seeds; the clients table, Table 3 and Figs 3b, 4 at seed
        # 0: their 32 cells of seeds 1-2 cost about 75 min of a snapshot already 3.7x its 1.5-h budget (bench/README),
        # and their claims then say "1 seed" (inconclusive) instead of being tested
        "grid": {"fedcmc.sweeps.seeds": [0]},
        "targets": ["fedcmc_table", "fedcmc_sweeps", "fedcmc_report"],
        "stage_script": "fedcmc_train.py",
        "inputs": ("PREPARED", "PARTITIONS", "TOKENIZER"),
        "gold": "PARTITIONS",
    },
    "ssvfnas": {
        "title": "fedrepro — SS-VFNAS at CPU scale on the mirrored real data",
        # the main table as the cpu preset sizes it (digits K=2/4, breast, default_credit; no DP, sigma 1 and 2; 3
        # seeds), with the hand-designed baseline and the label party alone
        "grid": {},
        "targets": ["ssvfnas_partition", "ssvfnas_table", "ssvfnas_report"],
        # every method, the baseline and the label party alone, on the cheapest tabular set and on digits (MLP and
        # conv search spaces), without and with DP: 22 of the 192 cells, about 3 min
        "canary": {
            "ssvfnas.datasets": ["breast", "digits"],
            "ssvfnas.parties": [2],
            "ssvfnas.dp_levels": [[0, 0], [1.0, 1.0]],
            "ssvfnas.seeds": [0],
        },
        "cell_key": "cell",
        "stage_script": "ssvfnas_train.py",
        "inputs": ("PARTITIONS",),
        "gold": "PARTITIONS",
    },
}


def plan(paper: str) -> list[tuple[str, int, float]]:
    """(table or figure, cells, their training in main-table cells' worth) of ``paper``'s snapshot: a cell trained
    twice the epochs counts 2, one on a fifth of the data 0.2. Multiply by a main-table cell's seconds for the wall
    time."""
    sys.path.insert(0, str(ROOT))
    from fedrepro.config import parse_params, read_raw_params

    params = parse_params(snapshot_params(paper, read_raw_params(ROOT / "params.yaml"), "mirror"))
    return [
        (name, len(cells), sum(weight(cell) for cell in cells)) for name, cells, weight in snapshot_cells(paper, params)
    ]


def paper_params(mirror: Path):
    """params.yaml at the paper scale, reading the raw mirror at ``mirror``."""
    sys.path.insert(0, str(ROOT))
    from fedrepro.config import parse_params, read_raw_params

    raw = read_raw_params(ROOT / "params.yaml")
    for key, value in {"scale": "paper", "data.source": "mirror", "data.mirror": str(mirror)}.items():
        set_key(raw, key, value)
    return parse_params(raw)


def paper_plan(
    paper: str,
    params,
    mirror: Path,
    gpu: str,
    precision: str | None = None,
    mfu: float | None = None,
    tflops: float | None = None,
) -> list[str]:
    """The lines of ``plan --scale paper``: per table and figure of ``paper``'s grid at ``params``' scale, the cells,
    their tokens and FLOPs (``fedrepro.<paper>.costs``), the largest cell's memory, how many such cells share one
    ``gpu``, and GPU-hours at ``tflops`` achieved TFLOP/s (default: the GPU's dense peak at the precision x ``mfu``);
    then the paper's total, each training run once (a figure's point that is a table's cell is trained once)."""
    from fedrepro import costs

    device = costs.GPUS[gpu]
    if paper == "ssvfnas":
        from fedrepro.ssvfnas.costs import SSVFNASCosts

        model, precision = SSVFNASCosts.from_mirror(params, mirror), SSVFNASCosts.precision
    else:
        from fedrepro.fedcmc.costs import FedCMCCosts
        from fedrepro.fedmatch.costs import FedMatchCosts

        precision = precision or params.train.precision
        text_model = {"fedmatch": FedMatchCosts, "fedcmc": FedCMCCosts}[paper]
        model = text_model.from_mirror(params, mirror, precision)
    mfu = costs.ASSUMED_MFU if mfu is None else mfu
    rate = tflops or device.peak_tflops[precision] * mfu
    how = (
        f"{tflops:g} TFLOP/s achieved (given)"
        if tflops
        else f"{device.peak_tflops[precision]:g} TFLOP/s dense "
        f"{precision} peak x {mfu:.0%} MFU (assumed) = {rate:.1f} TFLOP/s"
    )
    groups = [(name, [model(cell) for cell in cells]) for name, cells, _ in snapshot_cells(paper, params)]
    hours = lambda flops: hours_text(costs.gpu_hours(flops, rate))  # noqa: E731
    runs = {cost.run: cost for _, group in groups for cost in group}
    gib = lambda n: f"{n / 2**30:.1f}"  # noqa: E731

    def row(name: str, group: list) -> str:
        largest = max(group, key=lambda cost: costs.cell_gpu_memory(cost.memory))
        reserve = costs.cell_gpu_memory(largest.memory)
        return (
            f"  {name:<28}{len(group):>6}{sum(sum(c.train_tokens.values()) for c in group):>11.2e}"
            f"{sum(c.eval_tokens for c in group):>10.2e}{sum(c.train_flops for c in group):>11.2e}"
            f"{sum(c.eval_flops for c in group):>10.2e}{gib(largest.memory.peak):>10}{gib(reserve):>9}"
            f"{device.memory // reserve:>6}{hours(sum(cost.flops for cost in group)):>10}"
        )

    total = sum(cost.flops for cost in runs.values())
    lines = [
        f"{paper} at paper scale: {len(runs)} training runs, {total:.2e} FLOPs, {hours(total)} GPU-hours on one "
        f"{device.label} in {precision}",
        f"  at {how}",
        f"  {'table or figure':<28}{'cells':>6}{'train tok':>11}{'eval tok':>10}{'train FLOP':>11}{'eval FLOP':>10}"
        f"{'peak GiB':>10}{'GPU GiB':>9}{'/GPU':>6}{'GPU-hours':>10}",
    ]
    lines += [row(name, group) for name, group in groups]
    lines.append(row("total, each run once", list(runs.values())))
    largest = max(runs.values(), key=lambda cost: cost.parameters)
    notes = [
        f"largest model: {largest.parameters:,} parameters ({largest.name}). peak GiB: weights + gradients + "
        "optimiser state + one batch's activations of the group's largest cell; GPU GiB: what that cell reserves "
        f"(x {costs.GPU_SAFETY} + {gib(costs.CUDA_CONTEXT)} GiB of CUDA context); /GPU: such cells on one GPU",
        *model.notes,
    ]
    if paper == "ssvfnas":
        notes.append(
            "tiny networks: kernel launches, not FLOPs, bound their time on a GPU, so these GPU-hours are a floor"
        )
    return lines + [
        line for note in notes for line in textwrap.wrap(note, 118, initial_indent="  ", subsequent_indent="    ")
    ]


def hours_text(value: float) -> str:
    """GPU-hours to print: whole hours from 100, tenths from 1, two significant digits below."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def snapshot_cells(paper: str, params) -> list[tuple[str, list, object]]:
    """(table or figure, its cells, a cell's training in main-table cells' worth) of ``paper``'s snapshot."""
    if paper == "fedmatch":
        from fedrepro.fedmatch.cells import SWEEPS, sweep_cells, table_cells, training_weight

        weight = lambda cell: training_weight(params, cell)  # noqa: E731
        groups = [("Tables 2-3", table_cells(params), weight)]
        groups += [
            (f"{sweep} ({SWEEPS[sweep].split(':')[0]})", [c for c in sweep_cells(params) if c.sweep == sweep], weight)
            for sweep in SWEEPS
        ]
    elif paper == "fedcmc":
        from fedrepro.fedcmc.cells import SWEEPS, sweep_cells, table_cells, training_weight

        weight = lambda cell: training_weight(params, cell)  # noqa: E731
        groups = [("Table 2", table_cells(params), weight)]
        groups += [(f"{sweep} ({SWEEPS[sweep].split(':')[0]})", sweep_cells(params, sweep), weight) for sweep in SWEEPS]
    else:
        from fedrepro.ssvfnas.cells import baseline_cells, label_alone_cells, table_cells

        groups = [
            (name, cells(params), lambda cell: 1.0)
            for name, cells in [
                ("main table", table_cells),
                ("hand-designed baseline", baseline_cells),
                ("label party alone", label_alone_cells),
            ]
        ]
    return groups


def set_key(params: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        params = params[key]
    params[last] = value


STALE_BANNER = "> **Stale snapshot.**"
ENV = {
    **os.environ,
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "GIT_AUTHOR_NAME": "fedrepro",
    "GIT_AUTHOR_EMAIL": "fedrepro@localhost",
    "GIT_COMMITTER_NAME": "fedrepro",
    "GIT_COMMITTER_EMAIL": "fedrepro@localhost",
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
}


def snapshot_params(paper: str, base: dict, mirror: str) -> dict:
    """``base`` (a params.yaml) as a snapshot of ``paper`` runs it: CPU scale, the mirror, the paper's grid."""
    params = copy.deepcopy(base)
    for key, value in {
        "scale": "cpu",
        "data.source": "mirror",
        "data.mirror": mirror,
        "report.title": PAPERS[paper]["title"],
        **PAPERS[paper]["grid"],
    }.items():
        set_key(params, key, value)
    return params


LEDGER_ENV, STOP_ENV = "FEDREPRO_LEDGER", "FEDREPRO_STOP_AT"  # fedrepro.ledger.ENV, fedrepro.grid.STOP_ENV
PLAN, STRETCHES = "PLAN.json", "stretches"
PREFLIGHT_STAGE = "check"
"""dvc.yaml's first stage (``fedrepro.preflight``): a gate, not an input of any cell."""
COMMIT_EVERY = 60.0
"""Seconds between two commits of the cells a stretch has recorded."""
CODE_AND_PARAMS = ("fedrepro", "stages", "params.yaml", "dvc.yaml", "scales")


def ledger_dir(paper: str) -> Path:
    return ROOT / "reports" / "cpu" / paper / "cells"


def git(*args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, check=check).stdout


def commit_ledger(paper: str, message: str) -> int:
    """Commit what the ledger's folder holds new (its cells, plan and stretches, nothing else); the files committed."""
    if not ledger_dir(paper).is_dir():  # no cell has landed yet
        return 0
    folder = str(ledger_dir(paper).relative_to(ROOT))
    git("add", "--", folder)
    staged = git("diff", "--cached", "--name-only", "--", folder).split()
    if staged:
        git("commit", "-q", "-m", message, "--", folder)
    return len(staged)


class LedgerCommitter(threading.Thread):
    """Commits the cells a stretch records every ``COMMIT_EVERY`` s, so that a machine lost loses at most a minute of
    them (git is all that outlives a session)."""

    def __init__(self, paper: str) -> None:
        super().__init__(daemon=True)
        self.paper, self.stopped = paper, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(COMMIT_EVERY):
            cells = len(list(ledger_dir(self.paper).glob("*/*/stamp.json")))
            try:
                commit_ledger(
                    self.paper, f"ledger: {self.paper}, {cells} cells recorded (cpu_snapshot.py run, as they land)"
                )
            except subprocess.CalledProcessError as error:  # a commit of the user's at the same moment: next time
                print(f"ledger commit deferred: {error.stderr.strip()}", file=sys.stderr)

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def machine_speed() -> float:
    """One thread's fp32 matmul GFLOP/s (``bench/bench_pipeline.py``): how fast this stretch's machine was."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_pipeline import machine_speed as measure

    return measure()


def last_start_margin(paper: str, machine: str) -> float:
    """How much before the end of a budget the last cell may start: the 90th percentile of the training seconds the
    cells of this machine class took (0 when none is recorded). Not the longest: two FedCMC cells that ran beside a
    busy machine took 1,830 and 1,980 s where nine in ten took under 490, and would cut a 45-min stretch's window to
    start cells in to 12 min. A cell as slow as those may run past the budget by its excess."""
    seconds = sorted(stamp.get("seconds") or 0 for stamp in ledger_stamps(paper) if stamp["machine"] == machine)
    return seconds[int(0.9 * (len(seconds) - 1))] if seconds else 0.0


def seconds_per_worth(stamps: list[dict]) -> float | None:
    """The median recorded training seconds of a main-table cell's worth over the stamps that timed their cell
    (None when none did): what the ledger measured a cell to cost on this kind of machine."""
    rates = sorted(
        stamp["seconds"] / stamp["weight"] for stamp in stamps if stamp.get("seconds") and stamp.get("weight")
    )
    return rates[len(rates) // 2] if rates else None


def minutes(worth: float, rate: float) -> str:
    """``worth`` main-table cells' worth at ``rate`` seconds each, on the two cell workers of this machine."""
    return f"about {worth * rate / 2 / 60:.0f} min"


def at_rate(rate: float) -> str:
    return f"on two cell workers at the median recorded {rate:.0f} s a cell-worth"


def ledger_stamps(paper: str) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(ledger_dir(paper).glob("*/*/stamp.json"))]


def run(paper: str, mirror: Path, workdir: Path, budget: float | None = None, commit: bool = True) -> None:
    """One stretch of ``paper``'s snapshot (see the module docstring)."""
    spec = PAPERS[paper]
    dirty = git("status", "--porcelain", "--", *CODE_AND_PARAMS)
    if dirty:
        sys.exit(f"uncommitted changes to code or params:\n{dirty}the clone trains HEAD's committed code: commit first")
    _, env, machine = snapshot_clone(paper, workdir, str(mirror.resolve()))
    env[LEDGER_ENV] = str(ledger_dir(paper))
    started, speed_before = time.time(), machine_speed()
    if budget is not None:
        env[STOP_ENV] = str(started + budget * 60 - last_start_margin(paper, machine))
    before = {json.dumps(stamp, sort_keys=True) for stamp in ledger_stamps(paper)}
    committer = LedgerCommitter(paper) if commit else None
    if committer:
        committer.start()
    timings, complete = [], True
    try:
        for target in spec["targets"]:
            target_started = time.perf_counter()
            if subprocess.run(["dvc", "repro", target], cwd=workdir, env=env).returncode != 0:
                complete = False
                break
            timings.append(f"{target}: {time.perf_counter() - target_started:.0f} s")
    except KeyboardInterrupt:  # Ctrl-C: the running cells are lost, what landed is kept, planned and committed below
        complete = False
        print("stopped by hand: recording the cells that landed (Ctrl-C again abandons that too)", file=sys.stderr)
    finally:
        if committer:
            committer.stop()
    subprocess.run(
        [sys.executable, str(workdir / "scripts" / "cpu_snapshot.py"), "write-plan", paper],
        cwd=workdir,
        env={**env, "PYTHONPATH": str(workdir)},
        check=True,
    )
    trained = [stamp["cell"] for stamp in ledger_stamps(paper) if json.dumps(stamp, sort_keys=True) not in before]
    write_stretch(paper, workdir, machine, started, budget, speed_before, trained, complete)
    if complete:
        (workdir / f"stage_times_{paper}.txt").write_text("\n".join(timings) + "\n")
        collect(paper, workdir)
    elif paper in PARTIAL_INPUTS and all((workdir / folder).is_dir() for folder in PARTIAL_INPUTS[paper]):
        write_partial(paper, workdir)
    if commit:
        commit_ledger(
            paper,
            f"ledger: {paper}, a stretch of {(time.time() - started) / 60:.0f} min on {machine} "
            f"trained {len(trained)} cells" + ("; every cell is in" if complete else ""),
        )
        partial = (ROOT / "reports" / "cpu" / paper / PARTIAL).relative_to(ROOT)
        if not complete and (ROOT / partial).is_file():
            git("add", "--", str(partial))
            if git("diff", "--cached", "--name-only", "--", str(partial)).strip():
                git(
                    "commit",
                    "-q",
                    "-m",
                    f"{paper}: its main table so far, from the ledger (no verdicts)",
                    "--",
                    str(partial),
                )
        if complete:
            git("add", "--", str((ROOT / "reports" / "cpu" / paper).relative_to(ROOT)))
            git(
                "commit",
                "-q",
                "-m",
                f"{paper} CPU snapshot assembled from its ledger",
                "--",
                str((ROOT / "reports" / "cpu" / paper).relative_to(ROOT)),
            )
    for line in ledger_status(paper):
        print(line)


MACHINE_CLASS = (
    "from fedrepro.config import load_params; from fedrepro.ledger import machine_class; "
    "print(machine_class('fp32' if {paper!r} == 'ssvfnas' else load_params().train.precision))"
)
"""Run in a snapshot's clone: the machine class its cells record (SS-VFNAS trains in fp32, the others as resolved)."""


def snapshot_clone(paper: str, workdir: Path, mirror: str) -> tuple[dict, dict, str]:
    """A clone of HEAD in ``workdir`` (which must be empty) whose params.yaml is ``paper``'s snapshot's, reading the
    mirror at ``mirror``: its params, the environment its commands run in (its own code first), and the machine
    class its cells record (asked of the clone's code, which resolves ``precision: auto``)."""
    if workdir.exists() and any(workdir.iterdir()):
        sys.exit(f"--workdir {workdir} is not empty (an earlier snapshot's clone?): remove it or name a new folder")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(workdir)], check=True)
    params = snapshot_params(paper, yaml.safe_load((workdir / "params.yaml").read_text()), mirror)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True))
    env = {**ENV, "PYTHONPATH": str(workdir)}
    machine = subprocess.run(
        [sys.executable, "-c", MACHINE_CLASS.format(paper=paper)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return params, env, machine


def write_stretch(
    paper: str,
    workdir: Path,
    machine: str,
    started: float,
    budget: float | None,
    speed_before: float,
    trained: list[str],
    complete: bool,
) -> None:
    """The stretch's manifest: which commit trained on which machine, how fast it was, what it recorded."""
    sys.path.insert(0, str(ROOT))
    from fedrepro.hardware import machine_fingerprint

    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True, check=True
    ).stdout.strip()
    stamp = dt.datetime.fromtimestamp(started, dt.timezone.utc)
    manifest = {
        "commit": commit,
        "started": stamp.isoformat(timespec="seconds"),
        "ended": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "budget_minutes": budget,
        "machine_class": machine,
        "machine": machine_fingerprint(),
        "matmul_gflops_one_thread": {"before": round(speed_before, 1), "after": round(machine_speed(), 1)},
        "cells_trained": trained,
        "every_cell_in": complete,
    }
    folder = ledger_dir(paper) / STRETCHES
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stamp:%Y%m%dT%H%M%S}-{commit[:7]}.json").write_text(json.dumps(manifest, indent=1) + "\n")


def checkout_stage(paper: str):
    """(In a checkout, run from its root) its params, ``paper``'s runs module, its train stage's module and the
    folders a cell reads, as that stage names them."""
    sys.path.insert(0, str(Path.cwd()))
    from fedrepro.config import load_params

    runs = importlib.import_module(f"fedrepro.{paper}.runs")
    stage_spec = importlib.util.spec_from_file_location(
        f"{paper}_stage", Path("stages") / PAPERS[paper]["stage_script"]
    )
    stage = importlib.util.module_from_spec(stage_spec)
    stage_spec.loader.exec_module(stage)
    return load_params(), runs, stage, [getattr(stage, name) for name in PAPERS[paper]["inputs"]]


def write_plan(paper: str) -> None:
    """In a snapshot's clone whose cells' inputs are built: every cell the snapshot needs, with its table or figure,
    seed, weight, inputs digest and run fingerprint, and the lock of the stages upstream of its cells (what makes
    those inputs), into the ledger's PLAN.json."""
    params, runs, _, folders = checkout_stage(paper)
    from fedrepro.io import tree_digest

    digests, cells = {}, {}
    for group, members, weight in snapshot_cells(paper, params):
        for cell in members:
            inputs = tuple(runs.cell_inputs(cell, *folders))
            if not all(Path(folder).is_dir() for folder in inputs):  # not built by this stretch: planned by a later one
                continue
            if inputs not in digests:
                digests[inputs] = tree_digest(*inputs)
            cells[cell.name] = {
                "group": group,
                "seed": cell.seed,
                "weight": weight(cell),
                "inputs": digests[inputs],
                "run": runs.run_fingerprint(params, cell, digests[inputs]),
            }
    lock = yaml.safe_load(Path("dvc.lock").read_text())
    cell_stages = set(PAPERS[paper]["targets"])
    upstream = {
        name: entry
        for name, entry in lock["stages"].items()
        if name not in cell_stages and name.split("@")[0] not in cell_stages
    }
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    plan_file = Path(os.environ[LEDGER_ENV]) / PLAN
    plan_file.parent.mkdir(parents=True, exist_ok=True)
    plan_file.write_text(
        json.dumps(
            {
                "commit": commit,
                "date": dt.date.today().isoformat(),
                "mirror": params.data.mirror,
                "upstream_lock": {**lock, "stages": upstream},
                "cells": cells,
            },
            indent=1,
        )
        + "\n"
    )


def head_runs(paper: str, plan_data: dict) -> tuple[dict[str, tuple[str, str, float]], int, list[str]]:
    """Each planned cell's (table or figure, run fingerprint at HEAD, weight), from the plan's digests of its inputs;
    how many of HEAD's cells the plan lacks; and, if the stages that make those inputs changed since the plan, what
    changed (the digests, and so the runs, are then unknown: empty result)."""
    sys.path.insert(0, str(ROOT))
    from fedrepro.config import parse_params, read_raw_params

    mirror = plan_data.get("mirror") or "mirror"  # the plan's clone read the mirror there
    raw = snapshot_params(paper, yaml.safe_load(git("show", "HEAD:params.yaml")), mirror)
    cell_stages = [t for t in PAPERS[paper]["targets"] if not t.endswith("_report")]
    moved = [
        line
        for line in dependency_changes(
            yaml.safe_dump(plan_data["upstream_lock"]), raw, cell_stages, since=plan_data["commit"]
        )
        if line.split(":")[0].split("@")[0] not in cell_stages
    ]
    if moved:
        return {}, 0, moved
    params = parse_params(snapshot_params(paper, read_raw_params(ROOT / "params.yaml"), mirror))  # with scales/
    runs = importlib.import_module(f"fedrepro.{paper}.runs")
    groups = snapshot_cells(paper, params)
    planned = {
        cell.name: (group, runs.run_fingerprint(params, cell, plan_data["cells"][cell.name]["inputs"]), weight(cell))
        for group, members, weight in groups
        for cell in members
        if cell.name in plan_data["cells"]
    }
    return planned, sum(len(members) for _, members, _ in groups) - len(planned), []


CARRY_SAMPLE = 3
"""Cells a ``carry`` retrains at HEAD, spread over the ledger's cheapest entries to carry."""


def carry(paper: str, workdir: Path, sample: int = CARRY_SAMPLE) -> list[str]:
    """Carry the ledger's entries of this machine class forward to HEAD's runs without retraining them all, when a
    code change left their results as they were (a refactor, a new check): in a clone of HEAD the stages that make
    the cells' inputs run again and HEAD's plan is written there; every cell's inputs must digest as the ledger's
    plan says (the code that makes them may have changed, the data must not), and ``sample`` of the entries behind
    are retrained at HEAD and each must come out as its entry, every kept file byte for byte and its metrics but the
    hardware. Then every entry is re-keyed to its cell's HEAD run, its stamp saying from which run and by which
    commit, and HEAD's plan replaces the ledger's. Returns what differed (empty: carried)."""
    folder = ledger_dir(paper)
    plan_data = json.loads((folder / PLAN).read_text())
    _, env, machine = snapshot_clone(paper, workdir, plan_data["mirror"])
    # the stages that make the cells' inputs, and none of the cells: a stop time already passed
    subprocess.run(["dvc", "repro", PAPERS[paper]["targets"][0]], cwd=workdir, env={**env, STOP_ENV: "0"})
    at_head = workdir / "plan-at-head"
    subprocess.run(
        [sys.executable, str(workdir / "scripts" / "cpu_snapshot.py"), "write-plan", paper],
        cwd=workdir,
        env={**env, LEDGER_ENV: str(at_head)},
        check=True,
    )
    head_plan = json.loads((at_head / PLAN).read_text())
    moved = [
        f"{name}: its inputs digest {cell['inputs'][:12]} at HEAD, {plan_data['cells'][name]['inputs'][:12]} in the "
        f"ledger's plan (the data changed: it retrains)"
        for name, cell in head_plan["cells"].items()
        if name in plan_data["cells"] and cell["inputs"] != plan_data["cells"][name]["inputs"]
    ]
    if moved:
        return moved
    planned = {name: (cell["group"], cell["run"], cell["weight"]) for name, cell in head_plan["cells"].items()}
    behind = entries_behind(paper, planned, machine)
    if not behind:
        print(f"{paper}: no entry of {machine} is behind HEAD's runs")
        return []
    order = sorted(behind, key=lambda name: (planned[name][2], name))
    sampled = order[:: max(1, len(order) // sample)][:sample]
    retrained = workdir / "carry-ledger"
    subprocess.run(
        [sys.executable, str(workdir / "scripts" / "cpu_snapshot.py"), "train-cells", paper, str(retrained), *sampled],
        cwd=workdir,
        env=env,
        check=True,
    )
    differences = []
    for name in sampled:
        fresh = retrained / name / f"{planned[name][1][:16]}-{machine}"
        if not fresh.is_dir():
            differences.append(
                f"{name}: its run at HEAD in the clone is not the one HEAD's plan computes (inputs differ?)"
            )
            continue
        differences += [f"{name}: {why}" for why in entry_differences(folder / name / behind[name], fresh)]
    if differences:
        return differences
    carry_entries(paper, behind, head_plan, machine, sampled)
    return []


def entries_behind(paper: str, planned: dict, machine: str) -> dict[str, str]:
    """Cell -> the folder of its entry of ``machine`` class at another run than HEAD's, for the planned cells the
    ledger does not yet hold at HEAD's run."""
    behind, held = {}, set()
    for stamp in ledger_stamps(paper):
        if stamp["machine"] == machine and stamp["cell"] in planned and stamp["run"] == planned[stamp["cell"]][1]:
            held.add(stamp["cell"])
    for path in sorted(ledger_dir(paper).glob("*/*/stamp.json")):
        stamp = json.loads(path.read_text())
        name = stamp["cell"]
        if stamp["machine"] == machine and name in planned and name not in held and stamp["run"] != planned[name][1]:
            behind[name] = path.parent.name
    return behind


def entry_differences(old: Path, new: Path) -> list[str]:
    """What differs between two ledger entries of one cell: each kept file byte for byte, the metrics but the
    hardware that trained them."""

    def files(entry: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(entry)): p.read_bytes()
            for p in sorted(entry.rglob("*"))
            if p.is_file() and p.name != "stamp.json"
        }

    ours, theirs, differences = files(old), files(new), []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name), theirs.get(name)
        if name.endswith("metrics.json") and a is not None and b is not None:
            a, b = ({k: v for k, v in json.loads(x).items() if k != "hardware"} for x in (a, b))
        if a != b:
            differences.append(f"{name} differs" if a is not None and b is not None else f"{name} in one entry only")
    return differences


def carry_entries(paper: str, behind: dict[str, str], head_plan: dict, machine: str, sampled: list[str]) -> None:
    """Re-key each entry of ``behind`` to its cell's run in ``head_plan`` (the old folder goes; git keeps it), which
    becomes the ledger's plan."""
    folder, commit = ledger_dir(paper), head_plan["commit"]
    for name, entry in behind.items():
        run = head_plan["cells"][name]["run"]
        old, new = folder / name / entry, folder / name / f"{run[:16]}-{machine}"
        stamp = json.loads((old / "stamp.json").read_text())
        shutil.copytree(old, new)
        (new / "stamp.json").write_text(
            json.dumps(
                {
                    **stamp,
                    "run": run,
                    "carried_from": stamp["run"],
                    "carried_by": commit,
                    "carried_on": dt.date.today().isoformat(),
                    "carried_because": f"{len(sampled)} cells retrained at "
                    f"{commit[:7]} came out identical: {', '.join(sampled)}",
                },
                indent=1,
            )
            + "\n"
        )
        shutil.rmtree(old)
    (folder / PLAN).write_text(json.dumps(head_plan, indent=1) + "\n")


def train_cells(paper: str, ledger_root: Path, names: list[str]) -> None:
    """(In a snapshot's clone whose cells' inputs are built) train the named cells at this checkout's code with the
    stage's own ``run_cell``, one after another, each recorded in the ledger at ``ledger_root``."""
    params, runs, stage, folders = checkout_stage(paper)
    from fedrepro.io import tree_digest
    from fedrepro.ledger import ResultsLedger, machine_class

    ledger = ResultsLedger(
        ledger_root,
        runs.ledger_gold(getattr(stage, PAPERS[paper]["gold"])),
        machine_class("fp32" if paper == "ssvfnas" else params.train.precision),
    )
    cells = {cell.name: (cell, weight) for _, members, weight in snapshot_cells(paper, params) for cell in members}
    work = Path(tempfile.mkdtemp(prefix="fedrepro-carry-"))
    for name in names:
        cell, weight = cells[name]
        digest = tree_digest(*runs.cell_inputs(cell, *folders))
        started = time.perf_counter()
        runs.run_cell(params, cell, *folders, work / "out" / name, work / "checkpoints" / name, digest)
        ledger.record(
            runs.run_fingerprint(params, cell, digest),
            cell,
            work / "out" / name,
            time.perf_counter() - started,
            weight(cell),
        )
        print(f"{name}: retrained at HEAD ({time.perf_counter() - started:.0f} s)", flush=True)


def ledger_status(paper: str) -> list[str]:
    """Per table and figure, how many of the plan's cells the ledger holds (by machine class), what is missing and
    about how long it would take here, and how many entries are stale; the plan checked against HEAD first."""
    folder = ledger_dir(paper)
    if not (folder / PLAN).is_file():
        return [
            f"{paper} ledger: no plan yet (`python scripts/cpu_snapshot.py run {paper} --budget MINUTES` starts it)"
        ]
    plan_data = json.loads((folder / PLAN).read_text())
    lines = [f"{paper} ledger (plan of commit {plan_data['commit'][:7]}, {plan_data['date']}):"]
    planned, unplanned, moved = head_runs(paper, plan_data)
    if moved:
        return (
            lines
            + ["  the cells' inputs changed since the plan (run a stretch to re-plan):"]
            + [f"    {m}" for m in moved]
        )
    stamps = ledger_stamps(paper)
    held = defaultdict(set)  # (cell, run) -> machine classes
    for stamp in stamps:
        held[(stamp["cell"], stamp["run"])].add(stamp["machine"])
    by_group, missing_weight = defaultdict(lambda: [0, 0, Counter()]), 0.0
    for name, (group, run, weight) in planned.items():
        counts = by_group[group]
        counts[1] += 1
        machines = held.get((name, run), set())
        if machines:
            counts[0] += 1
            counts[2].update(machines)
        else:
            missing_weight += weight
    for group, (done, total, machines) in by_group.items():
        classes = ", ".join(f"{m}: {n}" for m, n in sorted(machines.items()))
        lines.append(f"  {group}: {done} of {total} cells" + (f" ({classes})" if classes else ""))
    current = {(name, run) for name, (_, run, _) in planned.items()}
    stale = sum(1 for stamp in stamps if (stamp["cell"], stamp["run"]) not in current)
    rate = seconds_per_worth(stamps)
    left = sum(1 for key in current if key not in held)
    estimate = f", {minutes(missing_weight, rate)} {at_rate(rate)}" if rate and left else ""
    lines.append(
        f"  missing: {left} cells{estimate}" + (f"; {unplanned} not in the plan (re-plan)" if unplanned else "")
    )
    lines.append(f"  stale entries (another run of a cell than HEAD's): {stale}")
    return lines


PARTIAL = "PARTIAL.md"
"""Beside a snapshot that is still being built: its main table as the ledger holds it (``partial``)."""


def held_metrics(paper: str) -> dict[str, dict]:
    """Cell name -> the metrics of its ledger entry at HEAD's run (the plan's), on any machine class it was trained
    on."""
    plan_data = json.loads((ledger_dir(paper) / PLAN).read_text())
    planned, _, moved = head_runs(paper, plan_data)
    if moved:
        sys.exit(f"{paper}: the cells' inputs changed since the plan; run a stretch to re-plan first")
    held = {}
    for stamp in ledger_stamps(paper):
        if stamp["cell"] in planned and planned[stamp["cell"]][1] == stamp["run"]:
            entry = ledger_dir(paper) / stamp["cell"] / f"{stamp['run'][:16]}-{stamp['machine']}"
            held[stamp["cell"]] = json.loads((entry / "outputs" / "metrics.json").read_text())
    return held


PARTIAL_INPUTS = {"fedcmc": ["data/fedcmc/partitions"], "fedmatch": ["data/mined", "data/mined_bm25"]}
"""What a paper's PARTIAL.md reads from a stretch's workdir beside the ledger: the data stages' outputs its trivial rows
are scored on."""


def write_partial(paper: str, workdir: Path) -> Path:
    """``reports/cpu/<paper>/PARTIAL.md`` from the ledger's entries at HEAD and the data stages' outputs in
    ``workdir`` (``PARTIAL_INPUTS``)."""
    sys.path.insert(0, str(ROOT))
    from fedrepro.config import parse_params, read_raw_params

    inputs = [Path(workdir) / folder for folder in PARTIAL_INPUTS[paper]]
    for folder in inputs:
        if not folder.is_dir():
            sys.exit(f"{folder} does not exist: give the workdir of a stretch or a carry (its data stages made it)")
    params = parse_params(snapshot_params(paper, read_raw_params(ROOT / "params.yaml"), "mirror"))
    commit = git("rev-parse", "HEAD").strip()
    if paper == "fedcmc":
        from fedrepro.fedcmc.partial import render_partial as render_fedcmc

        text = render_fedcmc(params, held_metrics(paper), *inputs, commit)
    else:
        from fedrepro.fedmatch.partial import render_partial as render_fedmatch

        text = render_fedmatch(params, held_metrics(paper), *inputs, commit)
    target = ROOT / "reports" / "cpu" / paper / PARTIAL
    target.write_text(text)
    return target


def collect(paper: str, workdir: Path) -> None:
    """Copy the clone's report here with a stamp: the commit that trained it, the date, the params."""
    target = ROOT / "reports" / "cpu" / paper
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True, check=True
    ).stdout.strip()
    for entry in (workdir / "reports" / paper).iterdir():  # what the report stage writes replaces its old copy; the
        old = target / entry.name  # ledger, sanity sweeps and notes beside it are kept
        if old.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    shutil.copytree(workdir / "reports" / paper, target, dirs_exist_ok=True)
    shutil.copy(workdir / "params.yaml", target / "params.yaml")
    (target / "scales").mkdir(exist_ok=True)
    shutil.copy(workdir / "scales" / "cpu.yaml", target / "scales" / "cpu.yaml")
    shutil.copy(workdir / "dvc.lock", target / "SNAPSHOT.lock")
    (target / CELL_DIGESTS).write_text(json.dumps(cell_digests(workdir, paper), indent=1, sort_keys=True) + "\n")
    times_file = next(
        (f for f in (workdir / f"stage_times_{paper}.txt", workdir / "stage_times.txt") if f.exists()), None
    )
    times = times_file.read_text() if times_file else "(not recorded)\n"
    (target / "SNAPSHOT.md").write_text(
        f"# {paper} CPU-scale snapshot\n\n"
        f"- Trained by commit `{commit}` of this repository (the report stage's code is the same or later; "
        "see git log).\n"
        f"- Collected on {dt.date.today().isoformat()} on the project's 2-core CPU machine (no GPU).\n"
        "- Params: `params.yaml` beside this file (scale `cpu`, data from the mirror) and its presets, "
        "`scales/cpu.yaml`.\n"
        f"- Reproduce: `python scripts/cpu_snapshot.py run {paper} --mirror <mirror>`.\n\n"
        f"Stage wall times:\n\n```\n{times}```\n"
    )
    print(f"snapshot written to {target}")


CELL_DIGESTS = "SNAPSHOT.cells.json"
"""Beside a snapshot: each cell's output folder (under ``data/<paper>``) -> the sha256 of its files, what a canary
compares bit for bit."""
CODE_DEPS = ("fedrepro/", "stages/")


def cell_digest(folder: Path) -> str:
    """sha256 over a cell's output files (names and bytes), its metrics.json without the ``hardware`` it ran on (the
    machine is compared apart: cells of another instruction set differ in their bits)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "metrics.json":
            metrics = json.loads(data)
            metrics.pop("hardware", None)
            data = json.dumps(metrics, sort_keys=True).encode()
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def cell_digests(workdir: Path, paper: str) -> dict[str, str]:
    """Every cell folder (one with a metrics.json) under the clone's ``data/<paper>`` -> its ``cell_digest``."""
    base = workdir / "data" / paper
    return {str(m.parent.relative_to(base)): cell_digest(m.parent) for m in sorted(base.rglob("metrics.json"))}


def _is_code(dep: dict) -> bool:
    return dep["path"].startswith(CODE_DEPS)


def restamped_lock(old: dict, canary: dict, stages: list[str]) -> dict:
    """``old`` (a snapshot's lock) with the code of ``stages`` as the canary's clone has it: each stage's command
    and code deps (fedrepro modules, stage scripts) from ``canary``, its params, data deps and outputs as trained."""
    new = copy.deepcopy(old)
    for name in stages:
        entry, ran = new["stages"][name], canary["stages"][name]
        entry["cmd"] = ran["cmd"]
        entry["deps"] = sorted(
            [d for d in ran["deps"] if _is_code(d)] + [d for d in entry["deps"] if not _is_code(d)],
            key=lambda d: d["path"],
        )
    return new


def canary(paper: str, workdir: Path) -> list[str]:
    """Whether HEAD's code still trains ``paper``'s snapshot to the same bits, without retraining it: in a clone of
    HEAD with the snapshot's params, the stages upstream of its cells must write outputs of the very hashes the
    snapshot's lock holds for what its cells read, and a sample of its cells (``PAPERS[paper]["canary"]``: every method,
    the cheapest settings) must come out as the snapshot's (each cell's files against ``SNAPSHOT.cells.json`` where the
    snapshot has it, else its row of results.csv, every column as written). All identical: the snapshot is re-stamped
    (its lock takes HEAD's code, SNAPSHOT.md says what was compared) and stays fresh. Anything else: it is marked stale.
    Returns what differed (empty: carried forward)."""
    spec, folder = PAPERS[paper], ROOT / "reports" / "cpu" / paper
    if "canary" not in spec:
        raise SystemExit(f"{paper}: no canary sample is defined (PAPERS['{paper}']['canary']); retrain it with `run`")
    changes = status(paper)
    if not changes:
        print(f"{paper}: fresh against HEAD, nothing to compare")
        return []
    moved_params = [line for line in changes if ": param " in line]
    if moved_params:
        mark(paper, True)
        return [f"params changed, which no canary can carry forward: {moved_params}"]
    old_lock = yaml.safe_load((folder / "SNAPSHOT.lock").read_text())
    mirror = yaml.safe_load((folder / "params.yaml").read_text())["data"]["mirror"]
    params, env, _ = snapshot_clone(paper, workdir, mirror)
    (workdir / "dvc.lock").unlink()  # the embedded run's: the clone's lock is to hold only what the canary ran
    upstream = spec["targets"][0]
    subprocess.run(["dvc", "repro", upstream], cwd=workdir, env=env, check=True)
    ran = yaml.safe_load((workdir / "dvc.lock").read_text())
    upstream_stages = list(ran["stages"])
    differences = _moved_inputs(workdir, env, ran, old_lock, spec["targets"][1])
    if not differences:
        sampled = copy.deepcopy(params)
        for key, value in spec["canary"].items():
            set_key(sampled, key, value)
        (workdir / "params.yaml").write_text(yaml.safe_dump(sampled, sort_keys=False, allow_unicode=True))
        subprocess.run(["dvc", "repro", spec["targets"][-1]], cwd=workdir, env=env, check=True)
        differences, compared, how = _compare_cells(paper, workdir, folder)
    if differences:
        mark(paper, True)
        return differences
    canary_lock = yaml.safe_load((workdir / "dvc.lock").read_text())
    stamped = restamped_lock(old_lock, canary_lock, [s for s in spec["targets"] if s not in upstream_stages])
    for name in upstream_stages:  # these ran with the snapshot's own params: their entries are the snapshot's now
        stamped["stages"][name] = ran["stages"][name]
    (folder / "SNAPSHOT.lock").write_text(yaml.safe_dump(stamped, sort_keys=False))
    digests = json.loads((folder / CELL_DIGESTS).read_text()) if (folder / CELL_DIGESTS).exists() else {}
    digests.update(cell_digests(workdir, paper))
    (folder / CELL_DIGESTS).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True, check=True
    ).stdout.strip()
    with (folder / "SNAPSHOT.md").open("a") as handle:
        handle.write(
            f"\nCarried forward to commit `{commit}` on {dt.date.today().isoformat()} by a canary "
            f"(`python scripts/cpu_snapshot.py canary {paper}`): HEAD's code changed what these cells depend "
            f"on ({len(changes)} deps), the data its cells read hashed as the snapshot's lock says, and "
            f"{len(compared)} cells retrained at HEAD came out identical ({how}): "
            f"{', '.join(sorted(compared))}.\n"
        )
    remaining = status(paper)
    mark(paper, bool(remaining))
    return [f"still stale after the re-stamp: {line}" for line in remaining]


def _moved_inputs(workdir: Path, env: dict, ran: dict, old_lock: dict, stage: str) -> list[str]:
    """The data ``stage`` (the cells' stage) reads, as the canary's clone has made it, against what the snapshot's
    cells read (its lock's entry): DVC's own comparison, code deps left out (they are what moved). An upstream
    output may differ where the cells never look (``data/prepared`` holds every paper's data)."""
    (workdir / "dvc.lock").write_text(
        yaml.safe_dump({**ran, "stages": {**ran["stages"], stage: old_lock["stages"][stage]}}, sort_keys=False)
    )
    status = subprocess.run(["dvc", "status", "--json", stage], cwd=workdir, env=env, capture_output=True, text=True)
    if status.returncode != 0:
        raise SystemExit(f"dvc status failed in {workdir}: {status.stderr.strip()}")
    moved = []
    for entry in json.loads(status.stdout or "{}").get(stage, []):
        if isinstance(entry, dict):
            moved += [
                f"{stage}: its input {path} is not what the snapshot's cells read ({state})"
                for path, state in entry.get("changed deps", {}).items()
                if not path.startswith(CODE_DEPS)
            ]
    (workdir / "dvc.lock").write_text(yaml.safe_dump(ran, sort_keys=False))
    return moved


def _compare_cells(paper: str, workdir: Path, folder: Path) -> tuple[list[str], list[str], str]:
    """The canary's cells against the snapshot's: (what differs, the cells compared, how they were compared)."""
    recorded = json.loads((folder / CELL_DIGESTS).read_text()) if (folder / CELL_DIGESTS).exists() else {}
    fresh = cell_digests(workdir, paper)
    key = PAPERS[paper]["cell_key"]
    ours = pd.read_csv(workdir / "reports" / paper / "results.csv", dtype=str, keep_default_na=False).set_index(key)
    theirs = pd.read_csv(folder / "results.csv", dtype=str, keep_default_na=False).set_index(key)
    path_of = {path.rsplit("/", 1)[-1]: path for path in fresh}  # cell name -> its folder under data/<paper>
    unlisted = sorted(cell for cell in path_of if cell not in ours.index)  # trivial rows kept out of results.csv
    differences, by_bits, not_compared = [], 0, []
    for cell in [*unlisted, *ours.index]:
        path = path_of.get(cell)
        if path in recorded:
            by_bits += 1
            if fresh[path] != recorded[path]:
                differences.append(f"{cell}: its output files differ from the snapshot's (sha256)")
        elif cell in unlisted:
            not_compared.append(cell)
        elif cell not in theirs.index:
            differences.append(f"{cell}: not in the snapshot's results.csv")
        else:
            row = ours.loc[cell]
            moved = [
                column
                for column in ours.columns
                if column in theirs.columns and row[column] != theirs.loc[cell, column]
            ]
            if moved:
                differences.append(f"{cell}: " + ", ".join(f"{c} {theirs.loc[cell, c]} -> {row[c]}" for c in moved[:5]))
    compared = [cell for cell in [*ours.index, *unlisted] if cell not in not_compared]
    how = (
        f"{by_bits} by every output file's sha256, {len(compared) - by_bits} by their results.csv rows, every column "
        "as written"
        + (
            f"; not compared, for want of a recorded sha256 or a results.csv row, its digest recorded for the "
            f"next canary: {', '.join(not_compared)}"
            if not_compared
            else ""
        )
    )
    return differences, compared, how


def dependency_changes(
    lock: str, params: dict, targets: list[str], revision: str = "HEAD", since: str | None = None
) -> list[str]:
    """What differs between a snapshot's dvc.lock and ``revision``'s code and dvc.yaml run with ``params``: one
    line per changed dependency, param or command of ``targets`` and the stages upstream of them (DVC's own
    comparison, in a copy of ``revision``; outputs are absent there, so those are not counted). Empty = fresh. The
    ``check`` stage is left out: it reads every param and writes the same output for every valid params.yaml, so
    what changes it changes no cell. With ``since``, the commit whose code the lock was taken from, a dependency
    whose bytes changed but which does the same (``same_behaviour``: a restyle, a docstring) is not a change. Nor,
    where ``params`` train on the engine, is a module of Flower's (``fedrepro.code_closure.FLOWER``): a stage imports
    them to run on Flower, and on the engine none of them runs a cell (the cells' fingerprints leave them out by
    the same rule), so a Flower-only change staled both engine snapshots for nothing."""
    sys.path.insert(0, str(ROOT))
    from fedrepro.code_closure import FLOWER

    on_engine = params.get("train", {}).get("runtime", "engine") == "engine"
    with tempfile.TemporaryDirectory() as tmp:
        head = Path(tmp)
        archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(head)], input=archive, check=True)
        (head / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True))
        (head / "dvc.lock").write_text(lock)
        for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "snapshot status"]):
            subprocess.run(command, cwd=head, check=True, env=ENV, capture_output=True)
        status = subprocess.run(
            ["dvc", "status", "--json", "--with-deps", *targets], cwd=head, env=ENV, capture_output=True, text=True
        )
    if status.returncode != 0:
        raise SystemExit(f"dvc status failed: {status.stderr.strip()}")
    changes = []
    for stage, entries in json.loads(status.stdout).items():
        if stage == PREFLIGHT_STAGE:
            continue
        for entry in entries:
            if isinstance(entry, str):
                changes.append(f"{stage}: {entry}")
                continue
            for kind, items in entry.items():
                for name, state in items.items():
                    if isinstance(state, dict):  # a params file: {param: state}
                        changes += [f"{stage}: param {param} ({what})" for param, what in state.items()]
                    elif kind == "changed deps" and state != "deleted":  # outputs are absent in the copy
                        if state == "modified" and since is not None and same_behaviour(name, since, revision):
                            continue
                        if on_engine and Path(name).is_relative_to(FLOWER):
                            continue
                        changes.append(f"{stage}: {name} ({state})")
    return changes


def same_behaviour(path: str, since: str, revision: str, root: Path = ROOT) -> bool:
    """Whether ``path`` (a file or a folder of the repository at ``root``) does at ``revision`` what it did at
    ``since``: the same files, the Python ones with the same syntax tree less docstrings
    (``fedrepro.code_closure.source_digest``, what a cell's fingerprint holds of its code), any other with the same
    bytes. DVC compares bytes, so a restyle or a docstring staled every snapshot (the ruff restyle moved 91 of the
    SS-VFNAS snapshot's deps and not one cell's fingerprint); a cell's result follows its fingerprint."""
    sys.path.insert(0, str(ROOT))
    from fedrepro.code_closure import source_digest

    def files(commit: str) -> dict[str, bytes]:
        listed = subprocess.run(
            ["git", "ls-tree", "-r", "-z", "--name-only", commit, "--", path], cwd=root, capture_output=True, check=True
        ).stdout.decode()
        return {
            name: subprocess.run(["git", "show", f"{commit}:{name}"], cwd=root, capture_output=True, check=True).stdout
            for name in listed.split("\0")
            if name
        }

    def behaviour(name: str, content: bytes, folder: Path) -> str | bytes:
        if not name.endswith(".py"):
            return content
        file = folder / hashlib.sha256(name.encode()).hexdigest()
        file.write_bytes(content)
        try:
            return source_digest(file)
        except SyntaxError:
            return content

    before, after = files(since), files(revision)
    if not before or before.keys() != after.keys():
        return False
    with tempfile.TemporaryDirectory() as tmp:
        then, now = Path(tmp) / "since", Path(tmp) / "now"
        then.mkdir()
        now.mkdir()
        return all(behaviour(name, before[name], then) == behaviour(name, after[name], now) for name in before)


def trained_by(folder: Path) -> str:
    found = re.search(r"Trained by commit `([0-9a-f]+)`", (folder / "SNAPSHOT.md").read_text())
    return found.group(1)[:7] if found else "unknown"


NO_REPORT = "no report yet"


def status(paper: str) -> list[str]:
    """Why ``paper``'s snapshot is stale against HEAD; empty when its cells would be trained the same way today."""
    folder = ROOT / "reports" / "cpu" / paper
    if not (folder / "report.md").is_file():
        return [f"{NO_REPORT}: its ledger ({ledger_dir(paper).relative_to(ROOT)}) lacks cells, see below"]
    if not (folder / "SNAPSHOT.lock").is_file():
        return [
            f"no SNAPSHOT.lock: trained by commit {trained_by(folder)} before snapshots kept what their cells "
            "depended on"
        ]
    head_params = yaml.safe_load(
        subprocess.run(["git", "show", "HEAD:params.yaml"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    )
    mirror = yaml.safe_load((folder / "params.yaml").read_text())["data"]["mirror"]
    lock = folder / "SNAPSHOT.lock"
    taken_at = (
        "HEAD" if git("status", "--porcelain", "--", str(lock)) else git("log", "-1", "--format=%H", "--", str(lock))
    )
    return dependency_changes(
        lock.read_text(),
        snapshot_params(paper, head_params, mirror),
        PAPERS[paper]["targets"],
        since=taken_at.strip() or None,
    )


def mark(paper: str, stale: bool) -> None:
    """A stale snapshot's report says so in its first line; a fresh one's does not."""
    report = ROOT / "reports" / "cpu" / paper / "report.md"
    if not report.is_file():  # nothing to mark until the ledger is complete
        return
    lines = report.read_text().split("\n")
    if lines[0].startswith(STALE_BANNER):
        lines = lines[2:]
    if stale:
        banner = (
            f"{STALE_BANNER} Trained by commit `{trained_by(report.parent)}`; the code or params its cells depend "
            "on have changed since (`python scripts/cpu_snapshot.py status` lists what), so these are not the "
            "current code's numbers."
        )
        lines = [banner, ""] + lines
    report.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("paper", choices=sorted(PAPERS))
    run_parser.add_argument("--mirror", type=Path, default=ROOT.parent / "shared" / "data" / "raw")
    run_parser.add_argument("--workdir", type=Path, default=None, help="default: a new temporary folder")
    run_parser.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="MINUTES",
        help="start no cell past this many minutes less the 90th percentile of the recorded cells' seconds",
    )
    run_parser.add_argument("--no-commit", action="store_true", help="record cells in the ledger without committing")
    plan_writer = commands.add_parser("write-plan", help="(in a snapshot's clone) write the ledger's PLAN.json")
    plan_writer.add_argument("paper", choices=sorted(PAPERS))
    carry_parser = commands.add_parser(
        "carry",
        help="carry the ledger's entries forward to HEAD's runs when a sample "
        "of them retrained at HEAD comes out identical",
    )
    carry_parser.add_argument("paper", choices=sorted(PAPERS))
    carry_parser.add_argument("--sample", type=int, default=CARRY_SAMPLE)
    carry_parser.add_argument("--workdir", type=Path, default=None, help="default: a new temporary folder")
    trainer = commands.add_parser("train-cells", help="(in a snapshot's clone) train the named cells into a ledger")
    trainer.add_argument("paper", choices=sorted(PAPERS))
    trainer.add_argument("ledger", type=Path)
    trainer.add_argument("cells", nargs="+")
    collect_parser = commands.add_parser("collect")
    collect_parser.add_argument("paper", choices=sorted(PAPERS))
    collect_parser.add_argument("workdir", type=Path)
    status_parser = commands.add_parser("status")
    status_parser.add_argument("papers", nargs="*", help=f"of {sorted(PAPERS)}; default: every paper")
    status_parser.add_argument(
        "--mark", action="store_true", help="banner on each stale snapshot's report, none on a fresh one"
    )
    canary_parser = commands.add_parser(
        "canary",
        help="carry a stale snapshot forward if a sample of its cells "
        "retrained at HEAD comes out bit-identical; else mark it stale",
    )
    canary_parser.add_argument("paper", choices=sorted(p for p in PAPERS if "canary" in PAPERS[p]))
    canary_parser.add_argument("--workdir", type=Path, default=None, help="default: a new temporary folder")
    plan_parser = commands.add_parser(
        "plan",
        help="the cells a snapshot trains (--scale cpu); with --scale paper, what "
        "the paper-scale grid costs on a GPU (fedrepro/<paper>/costs.py)",
    )
    plan_parser.add_argument("papers", nargs="*", help=f"of {sorted(PAPERS)}; default: every paper")
    plan_parser.add_argument("--scale", choices=["cpu", "paper"], default="cpu")
    plan_parser.add_argument(
        "--mirror",
        type=Path,
        default=ROOT.parent / "shared" / "data" / "raw",
        help="(--scale paper) the raw data mirror the datasets' sizes are counted from",
    )
    plan_parser.add_argument(
        "--gpu",
        choices=["h100", "h200", "a100"],
        default="h100",  # fedrepro.costs.GPUS
        help="(--scale paper) the GPU whose datasheet gives the peak and the memory",
    )
    plan_parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default=None,
        help="(--scale paper) the text papers' training precision; default: the params' (SS-VFNAS trains in fp32)",
    )
    plan_parser.add_argument(
        "--mfu",
        type=float,
        default=None,
        help="(--scale paper) the share of the GPU's dense peak achieved; default: fedrepro.costs.ASSUMED_MFU",
    )
    plan_parser.add_argument(
        "--tflops",
        type=float,
        default=None,
        help="(--scale paper) a measured throughput in achieved TFLOP/s, in place of the peak x MFU",
    )
    partial_parser = commands.add_parser(
        "partial", help="a paper's Table 2 as the ledger holds it, no verdicts (reports/cpu/<paper>/PARTIAL.md)"
    )
    partial_parser.add_argument("paper", choices=sorted(PARTIAL_INPUTS))
    partial_parser.add_argument(
        "workdir",
        type=Path,
        help="a clone whose data stages ran at HEAD (a stretch's or a "
        "carry's workdir): its data stages' outputs give the trivial rows",
    )
    args = parser.parse_args()
    if args.command == "run":
        run(
            args.paper,
            args.mirror,
            args.workdir or Path(tempfile.mkdtemp()) / f"fedrepro-cpu-{args.paper}",
            args.budget,
            not args.no_commit,
        )
        return
    if args.command == "write-plan":
        write_plan(args.paper)
        return
    if args.command == "train-cells":
        train_cells(args.paper, args.ledger, args.cells)
        return
    if args.command == "carry":
        differences = carry(
            args.paper, args.workdir or Path(tempfile.mkdtemp()) / f"fedrepro-carry-{args.paper}", args.sample
        )
        for line in differences:
            print(f"  {line}")
        print(
            f"{args.paper}: "
            + (
                "not carried: the entries stay at their runs"
                if differences
                else "every entry behind HEAD carried forward (commit reports/cpu/<paper>/cells)"
            )
        )
        sys.exit(1 if differences else 0)
    if args.command == "canary":
        differences = canary(args.paper, args.workdir or Path(tempfile.mkdtemp()) / f"fedrepro-canary-{args.paper}")
        for line in differences:
            print(f"  {line}")
        print(f"{args.paper}: {'marked stale' if differences else 'fresh against HEAD'}")
        sys.exit(1 if differences else 0)
    if args.command == "collect":
        collect(args.paper, args.workdir)
        return
    if args.command == "partial":
        print(f"written: {write_partial(args.paper, args.workdir).relative_to(ROOT)}")
        return
    unknown = sorted(set(args.papers) - set(PAPERS))
    if unknown:
        parser.error(f"{args.command}: unknown paper(s) {unknown}; allowed {sorted(PAPERS)}")
    for paper in args.papers or sorted(PAPERS):
        if args.command == "plan" and args.scale == "paper":
            for line in paper_plan(
                paper, paper_params(args.mirror), args.mirror, args.gpu, args.precision, args.mfu, args.tflops
            ):
                print(line)
            continue
        if args.command == "plan":
            groups, rate = plan(paper), seconds_per_worth(ledger_stamps(paper))
            total = sum(w for _, _, w in groups)
            print(
                f"{paper}: {sum(n for _, n, _ in groups)} cells, {total:.1f} main-table cells' worth"
                + (
                    f", {minutes(total, rate)} {at_rate(rate)} of its ledger"
                    if rate
                    else ", no cell of its ledger timed yet"
                )
            )
            for name, cells, worth in groups:
                print(f"  {name}: {cells} cells ({worth:.1f}" + (f", {minutes(worth, rate)})" if rate else ")"))
            continue
        changes = status(paper)
        none_yet = bool(changes) and changes[0].startswith(NO_REPORT)
        print(f"{paper} report: " + ("none yet" if none_yet else f"{'stale' if changes else 'fresh'} against HEAD"))
        for line in changes:
            print(f"  {line}")
        if args.mark:
            mark(paper, bool(changes))
        for line in ledger_status(paper):
            print(line)


if __name__ == "__main__":
    main()
