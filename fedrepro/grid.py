"""What the three papers' train stages share: the loop over a grid's cells, the fingerprint that tells a checkpoint
of this very run from any other, and the main table's rows.

A stage imports torch once (seconds a process, more than a small cell's training) and trains its cells in that
process, or, with more than one worker (``cell_workers``), in that many children forked from it, each training one
cell at a time: the networks are small, so one torch thread a cell and two cells on two cores train about 1.4-1.6x as
many sequences a second as one cell on both cores (``bench/README.md``). Each cell seeds itself and keeps its own
checkpoint and output folder, so its result does not depend on the process it ran in, a killed run resumes where it
stopped, and a new grid point trains only the new cells (the others resume from their finished checkpoints, and their
outputs, kept beside each checkpoint, are copied: ``scored_cell``).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Sequence

from fedrepro.cell_store import CellStore
from fedrepro.cluster import CLUSTER_ENV, run_on_cluster
from fedrepro.device import GPU_SHARE_ENV, memory_bytes, visible_gpus
from fedrepro.errors import ConfigError, FedreproError
from fedrepro.hardware import resolve_precision
from fedrepro.io import atomic_dir, tree_digest
from fedrepro.jobs import Job, child_error, restore_job, scored_cell
from fedrepro.ledger import ResultsLedger

TABLES, SWEEPS = Path("tables"), Path("sweeps")
WORKERS_ENV = "FEDREPRO_CELL_WORKERS"
"""Environment variable: how many cells a stage trains at once. Not a param: it moves no result, so changing it must
not rerun a stage."""
STOP_ENV = "FEDREPRO_STOP_AT"
"""Environment variable: a time (Unix seconds) after which a stage starts no cell that the results ledger lacks
(``scripts/cpu_snapshot.py run --budget``): the cells running then finish and are recorded, and the stage fails with
``BudgetSpent``. Cells are then started seed by seed, so a budget spent leaves whole seeds of the table."""


CONFIRM_ENV = "FEDREPRO_CONFIRM_MINUTES"
"""Environment variable: a stage whose plan (``GridPlan``) estimates more minutes of training than this asks before
its first cell, in a terminal (elsewhere it says so and goes on); unset, ``CONFIRM_MINUTES``; 0 never asks. Not a
param: it moves no result, so changing it must not rerun a stage."""
CONFIRM_MINUTES = 30.0


class BudgetSpent(FedreproError):
    """A stage stopped at ``$FEDREPRO_STOP_AT`` with cells left to train."""


class NotConfirmed(FedreproError):
    """The user declined a plan above ``$FEDREPRO_CONFIRM_MINUTES``."""


def fingerprint(identity: dict[str, Any], inputs_digest: str, shaping: dict[str, Any], code: str) -> str:
    """Changes whenever anything that shapes a cell's run changes, and nothing else: what the cell is (``identity``:
    its method, seed and grid point, never the name of the table or sweep that lists it, so a sweep point equal to
    a table cell is one run), ``shaping`` (the settings it runs under, not the grid's lists), the digest of its
    inputs and of the code it runs (``fedrepro.code_closure.cell_code``)."""
    payload = {"cell": identity, **shaping, "inputs": inputs_digest, "code": code}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def table_rows(
    cells: Sequence[Any], methods: Sequence[str], allowed: str, only: str | None = None
) -> tuple[Path, dict[Path, list]]:
    """The main table's cells a row per method (``tables/<method>``) and the folder the rows are written to: all of
    ``tables``, or with ``only`` that one row, rerun in place. ``allowed`` names the methods' params key."""
    if only is not None and only not in methods:
        raise ConfigError(f"--method {only!r} is not in {allowed} {list(methods)}")
    chosen = list(methods) if only is None else [only]
    return (TABLES if only is None else TABLES / only), {
        TABLES / m: [c for c in cells if c.method == m] for m in chosen
    }


def sweep_rows(
    sweeps: Sequence[str], cells_of: Callable[[str], list], only: str | None = None
) -> tuple[Path, dict[Path, list]]:
    """Every sweep's cells (``cells_of(sweep)``) a row per sweep (``sweeps/<sweep>``) and the folder the rows are
    written to: all of ``sweeps``, or with ``only`` that one sweep, rerun in place."""
    return (SWEEPS if only is None else SWEEPS / only), {SWEEPS / s: cells_of(s) for s in sweeps if only in (None, s)}


@dataclass(frozen=True)
class Placement:
    """Where a stage's cells train at once: ``workers`` of them, and on GPUs which GPU each worker sees (worker i:
    ``gpus[i % len(gpus)]``, through ``CUDA_VISIBLE_DEVICES``; none: as the stage sees them) and the ``share`` of one
    GPU a cell takes (``FEDREPRO_GPU_SHARE`` for a Flower ClientApp, ``num_gpus`` for a Ray task)."""

    workers: int
    threads: int
    gpus: tuple[str, ...] = ()
    share: float = 0.0

    def environment(self, worker: int) -> dict[str, str]:
        """What cell worker ``worker`` sets before its first CUDA op."""
        if not self.share:
            return {}
        shown = {"CUDA_VISIBLE_DEVICES": self.gpus[worker % len(self.gpus)]} if self.gpus else {}
        return {**shown, GPU_SHARE_ENV: f"{self.share:g}"}

    def resources(self, cell: Any = None) -> dict[str, float]:
        """What one cell asks a Ray cluster for (``fedrepro.cluster``)."""
        return {"num_cpus": self.threads, "num_gpus": self.share}


def placement(
    threads: int, runtime: str = "engine", device: str = "cpu", cell_bytes: Callable[[], int | None] | None = None
) -> Placement:
    """How a stage trains its cells at once. On the CPU, ``cell_workers``. On a GPU (``device`` cuda), as many cells
    as fit the GPU's memory at ``cell_bytes()`` each (the grid's largest cell, ``fedrepro.<paper>.costs``, asked only
    here; one a GPU where it is not known), on every visible GPU for ``cuda`` (each worker sees its own) or on GPU N
    alone for ``cuda:N``, and no more than the cores allow; ``$FEDREPRO_CELL_WORKERS`` still decides the count where it
    is set."""
    if os.environ.get(CLUSTER_ENV, "").strip() and runtime != "engine":
        raise ConfigError(
            f"train.runtime = {runtime!r}: a stage sends its cells to the Ray cluster at ${CLUSTER_ENV} "
            "on the engine runtime only (Flower runs its own Ray or federation from the stage); set "
            f"train.runtime: engine, or unset {CLUSTER_ENV}"
        )
    if not device.startswith("cuda"):
        return Placement(cell_workers(threads, runtime), threads)
    memory, needed = memory_bytes(device), cell_bytes() if cell_bytes is not None else None
    per_gpu = max(1, memory // needed) if memory and needed else 1
    gpus = tuple(visible_gpus()) if device == "cuda" else ()
    fitting = per_gpu * max(1, len(gpus))
    workers = cell_workers(threads, runtime)
    workers = (
        workers if os.environ.get(WORKERS_ENV, "").strip() or runtime == "flower-deployment" else min(workers, fitting)
    )
    on_one_gpu = -(-workers // max(1, len(gpus)))  # the most cells any one GPU gets
    return Placement(workers, threads, gpus, 1.0 / on_one_gpu)


def cell_workers(threads: int, runtime: str = "engine") -> int:
    """Cells a stage trains at once: ``$FEDREPRO_CELL_WORKERS``, else the cores this process may use over the torch
    threads of a cell. One on a Flower deployment, whose cells share the stage's SuperLink and SuperNodes."""
    if runtime == "flower-deployment":
        return 1
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return max(1, len(os.sched_getaffinity(0)) // threads)
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"${WORKERS_ENV} = {raw!r}: expected a whole number of cells to train at once, 1 or more")
    return int(raw)


@dataclass
class GridPlan:
    """What a stage is about to do, said before its first cell: how many cells its grid has, where the finished ones
    come from, and what the rest will cost, measured from the cells of the same ``label`` (paper, grid, scale,
    precision) this machine kept in the cell store (``CellStore.costs``)."""

    label: str
    cells: int
    held: dict[str, int]
    to_train: int
    worth: float
    """the cells to train in table cells' worth (a grid's ``weight``)"""
    workers: int
    seconds_per_worth: float | None
    bytes_per_cell: float | None
    measured: int

    @property
    def minutes(self) -> float | None:
        if self.seconds_per_worth is None:
            return None
        return self.worth * self.seconds_per_worth / max(1, min(self.workers, self.to_train)) / 60

    def line(self) -> str:
        came = {
            "ledger": "from the results ledger",
            "checkpoint": "finished in their checkpoints",
            "store": "finished in the cell store",
        }
        parts = [f"{n} {came[where]}" for where, n in self.held.items() if n] + [f"{self.to_train} to train"]
        text = f"plan, {self.label}: {self.cells} cells: " + ", ".join(parts)
        if not self.to_train:
            return text
        if self.minutes is None:
            return text + " (no cost measured yet for this grid on this machine: the first cells will tell)"
        disk = (self.bytes_per_cell or 0) * self.to_train
        size = f"{disk / 1e9:.1f} GB" if disk >= 1e9 else f"{disk / 1e6:.0f} MB"
        return (
            text + f": about {self.minutes:.0f} min on {min(self.workers, self.to_train)} worker(s) and "
            f"{size} of checkpoints, from {self.measured} cell(s) measured on this machine"
        )


def grid_label(paper: str, folder: Path, scale: str, precision: str, runtime: str, device: str = "cpu") -> str:
    """What a grid's cells' costs are kept and read under (``GridPlan``): a cell costs what its paper, grid, scale,
    resolved precision, device and runtime make it cost."""
    where = "" if device == "cpu" else f" on {device}"
    return f"{paper} {folder} at {scale} scale, {resolve_precision(precision, device)}{where}, {runtime}"


def _machine() -> str:
    """The CPU kernels torch uses here (AVX2, AVX512): a plan reads costs measured on the same kind of machine."""
    import torch

    return torch.backends.cpu.get_cpu_capability().lower()


def plan_of(jobs: list[Job], label: str, store: CellStore, ledger: ResultsLedger | None, workers: int) -> GridPlan:
    """Marks each job ``held`` where its finished run already is, and estimates the rest (``GridPlan``)."""
    for job in jobs:
        if ledger is not None and ledger.holds(job.run, job.cell.name):
            job.held = "ledger"
        elif CellStore.finished_run(job.checkpoint_dir) == job.run:
            job.held = "checkpoint"
        elif store.holds(job.run):
            job.held = "store"
    costs = store.costs(label, _machine()) if label else []
    rates = sorted(cost["seconds"] / cost["worth"] for cost in costs if cost.get("worth"))
    sizes = sorted(cost["bytes"] for cost in costs if "bytes" in cost)
    training = [job for job in jobs if not job.held]
    return GridPlan(
        label,
        len(jobs),
        {where: sum(job.held == where for job in jobs) for where in ("ledger", "checkpoint", "store")},
        len(training),
        sum(job.weight for job in training),
        workers,
        rates[len(rates) // 2] if rates else None,
        sizes[len(sizes) // 2] if sizes else None,
        len(costs),
    )


def confirm(plan: GridPlan) -> None:
    """Ask before a plan above ``$FEDREPRO_CONFIRM_MINUTES`` in a terminal; elsewhere say so and go on."""
    raw = os.environ.get(CONFIRM_ENV, "").strip()
    try:
        limit = float(raw) if raw else CONFIRM_MINUTES
    except ValueError:
        raise ConfigError(f"${CONFIRM_ENV} = {raw!r}: expected minutes (0: never ask)") from None
    if not limit or plan.minutes is None or plan.minutes <= limit:
        return
    if not sys.stdin.isatty():
        print(f"plan above ${CONFIRM_ENV} = {limit:g} min; not a terminal, so going on", file=sys.stderr, flush=True)
        return
    print(
        f"about {plan.minutes:.0f} min, above ${CONFIRM_ENV} = {limit:g}: train? [y/N] ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise NotConfirmed(
            f"{plan.label}: not started ({plan.to_train} cells, about {plan.minutes:.0f} min); set "
            f"${CONFIRM_ENV} higher, or 0, to run without asking"
        )


def run_grid(
    rows: dict[Path, list],
    folder: Path,
    out: Path,
    checkpoints: Path,
    inputs: Callable[[Any], tuple[Path, ...]],
    run_cell: Callable[[Any, Path, Path, str], dict],
    headline: Callable[[dict], str],
    fingerprint_of: Callable[[Any, str], str],
    store: CellStore | None = None,
    workers: int = 1,
    weight: Callable[[Any], float] | None = None,
    ledger: ResultsLedger | None = None,
    label: str = "",
    plan_only: bool = False,
    resources: Callable[[Any], dict] | None = None,
    environment: Callable[[int], dict[str, str]] | None = None,
) -> None:
    """Run (or resume) every cell of ``rows`` (a folder -> its cells): ``run_cell(cell, out, checkpoint_dir,
    inputs_digest)`` writes to ``out/<row>/<cell>`` and checkpoints in ``checkpoints/<row>/<cell>``. ``folder`` (under
    both) is the stage's output: replaced whole once every cell is done, so a failed stage leaves no half of it. The
    folders a cell reads (``inputs``) are digested once per process, and a line per cell shows the progress. A cell
    that ``store`` (default: the environment's, ``fedrepro.cell_store``) holds under its ``fingerprint_of(cell,
    inputs_digest)`` is restored finished, with its outputs if it was scored as this cell (``scored_cell``); each
    finished cell is kept there, and in ``ledger`` (``fedrepro.ledger``), from which a cell it holds is taken back
    untrained. With ``workers`` > 1 the cells train in forked children, that many at a time (``_run_forked``), those of
    the greatest ``weight`` (a cell's training in table cells' worth) first: a sweep of a few cells otherwise leaves a
    worker idle while its longest ends. With ``$RAY_ADDRESS`` (``CLUSTER_ENV``) set, the cells to train are Ray tasks
    on that cluster instead (``fedrepro.cluster``), each asking for ``resources(cell)`` (Ray's ``num_cpus``,
    ``num_gpus``: a fraction shares a GPU; by default one CPU). Worker i (the stage's own process when it trains alone)
    sets ``environment(i)`` before its first cell (``Placement.environment``: the GPU it sees). Past
    ``$FEDREPRO_STOP_AT`` (``STOP_ENV``) no cell starts. Before the first cell, the stage says its plan (``GridPlan``:
    the cells already finished, the rest's estimated minutes and disk, measured from the cells of the same ``label``
    this machine trained) and, above ``$FEDREPRO_CONFIRM_MINUTES``, asks in a terminal (``confirm``). With ``plan_only``
    it prints the plan (to stdout) and stops there, writing nothing."""
    total, done = sum(len(cells) for cells in rows.values()), 0
    store = store if store is not None else CellStore.from_environment()

    def finish(job: Job, metrics: dict) -> None:
        nonlocal done
        if not job.from_ledger:  # no checkpoint was made: there is nothing to keep
            trained = not (job.held or job.restored or not job.rescored)
            cost = (
                {
                    "label": label,
                    "machine": _machine(),
                    "seconds": round(time.perf_counter() - job.started, 3),
                    "worth": job.weight,
                    "bytes": _size(job.checkpoint_dir),
                }
                if trained and label
                else None
            )
            store.keep(job.run, job.checkpoint_dir, cost)
        done += 1
        came = (
            ", from the results ledger"
            if job.from_ledger
            else (", finished run from the cell store" if job.restored else "")
            + ("" if job.rescored else ", outputs as scored before")
        )
        print(
            f"[{done}/{total}] {job.cell.name}: {headline(metrics)} ({time.perf_counter() - job.started:.1f} s{came})",
            file=sys.stderr,
            flush=True,
        )

    if plan_only:
        print(
            plan_of(
                _jobs(rows, folder, out / folder, checkpoints, inputs, fingerprint_of, weight),
                label,
                store,
                ledger,
                workers,
            ).line(),
            flush=True,
        )
        return
    (checkpoints / folder).mkdir(parents=True, exist_ok=True)  # a declared output, even for no cells
    cluster = os.environ.get(CLUSTER_ENV, "").strip()
    with atomic_dir(out / folder) as tmp:
        jobs = _jobs(rows, folder, tmp, checkpoints, inputs, fingerprint_of, weight)
        plan = plan_of(jobs, label, store, ledger, workers)
        print(plan.line(), file=sys.stderr, flush=True)
        confirm(plan)
        stop_at = _stop_time()
        if stop_at is not None:  # seed by seed, so that a budget spent leaves whole seeds
            jobs.sort(key=lambda job: (getattr(job.cell, "seed", 0), -job.weight))
        elif (workers > 1 or cluster) and weight is not None:  # the longest first: the last to finish are short ones
            jobs.sort(key=lambda job: -job.weight)
        may_start = _starter(stop_at, ledger)
        if cluster:
            run_on_cluster(cluster, jobs, inputs, run_cell, store, finish, ledger, may_start, stop_at, resources)
        elif workers > 1 and len(jobs) > 1:
            _run_forked(jobs, run_cell, store, finish, workers, ledger, may_start, environment)
        else:
            os.environ.update(environment(0) if environment is not None else {})
            for job in jobs:
                if not may_start(job):
                    continue
                job.started = time.perf_counter()
                job.restored = restore_job(job, store, ledger)
                finish(job, scored_cell(run_cell, job, ledger))
        if done < total:
            raise BudgetSpent(
                f"${STOP_ENV} passed: {total - done} of {total} cells were not started ({done} "
                "finished, each kept in the results ledger)"
            )


def _jobs(
    rows: dict[Path, list],
    folder: Path,
    written: Path,
    checkpoints: Path,
    inputs: Callable[[Any], tuple[Path, ...]],
    fingerprint_of: Callable[[Any, str], str],
    weight: Callable[[Any], float] | None,
) -> list[Job]:
    """A job per cell: it writes under ``written`` (the stage's output folder, or its temporary stand-in), with the
    folders it reads digested once each."""
    digests: dict[tuple[Path, ...], str] = {}
    jobs = []
    for row, cells in rows.items():
        for cell in cells:
            folders = inputs(cell)
            if folders not in digests:
                digests[folders] = tree_digest(*folders)
            jobs.append(
                Job(
                    cell,
                    written / row.relative_to(folder) / cell.name,
                    checkpoints / row / cell.name,
                    digests[folders],
                    fingerprint_of(cell, digests[folders]),
                    weight(cell) if weight is not None else 1.0,
                )
            )
    return jobs


def _size(folder: Path) -> int:
    return sum(file.stat().st_size for file in Path(folder).rglob("*") if file.is_file())


def _stop_time() -> float | None:
    raw = os.environ.get(STOP_ENV, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"${STOP_ENV} = {raw!r}: expected a time in Unix seconds") from None


def _starter(stop_at: float | None, ledger: ResultsLedger | None) -> Callable[[Job], bool]:
    """Whether a job may start now: always before ``stop_at``, and after it only if the ledger holds its cell."""

    def may_start(job: Job) -> bool:
        return stop_at is None or time.time() < stop_at or (ledger is not None and ledger.holds(job.run, job.cell.name))

    return may_start


def _run_forked(
    jobs: list[Job],
    run_cell: Callable[[Any, Path, Path, str], dict],
    store: CellStore,
    finish: Callable[[Job, dict], None],
    workers: int,
    ledger: ResultsLedger | None,
    may_start: Callable[[Job], bool],
    environment: Callable[[int], dict[str, str]] | None = None,
) -> None:
    """The jobs on ``workers`` children forked once from this process (which has run no torch op, so no thread pool is
    copied half made), each training the cells handed to it one after another, so what a runtime keeps for a
    process's later cells (Flower's Ray workers) serves each child's. A cell's stderr (its progress bars and warnings)
    goes to a log file named in the line that starts it (``tail -f`` it to watch the cell); its lines other than
    progress bars are repeated here when it ends, above its error if it failed. The first cell to fail stops the
    stage: the children are ended, and the running cells' checkpoints resume on the next run. A job ``may_start``
    refuses is left."""
    context = multiprocessing.get_context("fork")
    _stop_tqdm_monitor()
    pending, idle, busy, children = deque(jobs), [], {}, []
    with tempfile.TemporaryDirectory(prefix="fedrepro-cells-") as logs:
        try:
            for number in range(min(workers, len(jobs))):
                ours, theirs = context.Pipe()
                settings = environment(number) if environment is not None else {}
                child = context.Process(
                    target=_worker, args=(theirs, run_cell, ledger, settings), name=f"cell-worker-{number}"
                )
                child.start()
                theirs.close()
                children.append((ours, child))
                idle.append((ours, child))
            while pending or busy:
                while pending and idle:
                    job = pending.popleft()
                    if not may_start(job):
                        continue
                    ours, child = idle.pop()
                    job.started = time.perf_counter()
                    job.restored = restore_job(job, store, ledger)
                    log = Path(logs) / f"{job.cell.name}.log"
                    ours.send((job, log))
                    busy[ours] = (job, child, log)
                    print(f"started {job.cell.name} (log: {log})", file=sys.stderr, flush=True)
                if not busy:  # every job left was refused (past the stop time): nothing runs, nothing to wait for
                    break
                for ours in wait(list(busy)):
                    job, child, log = busy.pop(ours)
                    try:
                        outcome = ours.recv()
                    except EOFError:  # it died before sending
                        outcome = None
                        child.join()
                    lines = log.read_bytes().decode(errors="replace").split("\n") if log.exists() else []
                    said = [line for line in lines if line.strip() and "\r" not in line]  # not its progress bars
                    if outcome is None or outcome[0] == "error":
                        if said:
                            print(f"--- {job.cell.name}'s last lines:", *said[-20:], sep="\n", file=sys.stderr)
                        raise child_error(job, child, outcome)
                    if said:
                        print(*said, sep="\n", file=sys.stderr)
                    job.rescored, job.from_ledger = outcome[2], outcome[3]
                    finish(job, outcome[1])
                    idle.append((ours, child))
            for ours, child in children:
                ours.send(None)
                child.join()
        finally:
            for _, child in children:
                if child.is_alive():
                    child.terminate()
                    child.join()


def _stop_tqdm_monitor() -> None:
    """End tqdm's monitor thread if a progress bar shown in this process started it: a child forked while it holds
    tqdm's lock inherits the lock held and hangs at its first bar (seen in CI, in test_grid)."""
    from tqdm import tqdm

    if tqdm.monitor is not None:
        tqdm.monitor.exit()
        tqdm.monitor = None


def _worker(
    connection: Connection,
    run_cell: Callable[[Any, Path, Path, str], dict],
    ledger: ResultsLedger | None,
    settings: dict[str, str],
) -> None:
    """A forked child's work: its ``settings`` into its environment (the GPU it sees, before any CUDA op), then each
    cell it is sent (``None`` ends it), its stderr into the cell's log, its metrics or its error sent back."""
    os.environ.update(settings)
    while (sent := connection.recv()) is not None:
        job, log = sent
        sys.stderr.flush()
        with open(log, "w") as stream:
            os.dup2(stream.fileno(), sys.stderr.fileno())
        try:
            metrics = scored_cell(run_cell, job, ledger)
            connection.send(("done", metrics, job.rescored, job.from_ledger))
        except BaseException as error:
            try:
                connection.send(("error", error, traceback.format_exc()))
            except Exception:  # an error that does not pickle travels as its text
                connection.send(("error", None, traceback.format_exc()))
        finally:
            sys.stderr.flush()
    connection.close()
