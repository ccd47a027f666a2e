"""One cell of a grid as a job: where it writes, the run its checkpoint is kept under, and how its outputs are
scored once and taken back after (from the results ledger, or from its checkpoint folder). The grid runs jobs in
process or in forked children (``fedrepro.grid``), the cluster as Ray tasks (``fedrepro.cluster``): both through here.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedrepro.cell_store import CellStore
from fedrepro.errors import FedreproError
from fedrepro.io import atomic_dir, read_json, write_json
from fedrepro.ledger import ResultsLedger


@dataclass
class Job:
    """One cell of the grid, with where it writes and the fingerprint its checkpoint is kept under."""

    cell: Any
    out: Path
    checkpoint_dir: Path
    inputs_digest: str
    run: str
    weight: float = 1.0
    restored: bool = False
    rescored: bool = True
    from_ledger: bool = False
    started: float = 0.0
    held: str = ""
    """Where its finished run already is before the stage starts (``GridPlan``): "ledger", "checkpoint", "store" or
    "" (it trains here, and what that costs is kept with it in the cell store)."""


SCORED = "scored"
"""In a cell's checkpoint folder: the outputs its finished run was scored to, and the run and cell they are of."""


def scored_cell(
    run_cell: Callable[[Any, Path, Path, str], dict], job: Job, ledger: ResultsLedger | None = None
) -> dict:
    """The job's outputs and metrics: as scored before where they were (``scored_before``), else ``run_cell``'s, then
    kept (``keep_scored``)."""
    metrics = scored_before(job, ledger)
    if metrics is None:
        metrics = run_cell(job.cell, job.out, job.checkpoint_dir, job.inputs_digest)
        keep_scored(job, metrics, ledger)
    return metrics


def scored_before(job: Job, ledger: ResultsLedger | None) -> dict | None:
    """The job's metrics, its outputs written to ``job.out``, where this run of this cell was scored before: from the
    results ledger where it holds them; else copied from its checkpoint folder where this very run was already scored
    as this very cell (a finished cell resumed, or restored from the cell store, is not scored again), then kept in
    the ledger. None where the cell must run: a run scored as another cell (a figure's point equal to a table cell) is
    scored anew, its outputs name the cell."""
    if ledger is not None:
        metrics = ledger.restore(job.run, job.cell, job.out)
        if metrics is not None:
            job.rescored, job.from_ledger = False, True
            return metrics
    kept = job.checkpoint_dir / SCORED
    if not (kept / "stamp.json").is_file() or read_json(kept / "stamp.json") != _stamp(job):
        return None
    shutil.copytree(kept / "outputs", job.out)
    job.rescored = False
    if ledger is not None:
        ledger.record(job.run, job.cell, job.out, None, job.weight)
    return read_json(kept / "metrics.json")


def keep_scored(job: Job, metrics: dict, ledger: ResultsLedger | None) -> None:
    """Keep the outputs and metrics the job's run was just scored to in its checkpoint folder, and in the ledger with
    the seconds it took (none for a restored run: it was only scored)."""
    seconds = None if job.restored else time.perf_counter() - job.started
    with atomic_dir(job.checkpoint_dir / SCORED) as folder:
        shutil.copytree(job.out, folder / "outputs")
        write_json(folder / "metrics.json", metrics)
        write_json(folder / "stamp.json", _stamp(job))
    if ledger is not None:
        ledger.record(job.run, job.cell, job.out, seconds, job.weight)


def _stamp(job: Job) -> dict:
    """What a checkpoint's scored outputs are of: the run and the cell."""
    return {"run": job.run, "cell": job.cell.name}


def restore_job(job: Job, store: CellStore, ledger: ResultsLedger | None) -> bool:
    """Restore the job's finished run from the cell store, unless the ledger holds its outputs (no checkpoint
    needed)."""
    return (ledger is None or not ledger.holds(job.run, job.cell.name)) and store.restore(job.run, job.checkpoint_dir)


def child_error(job: Job, child: Any, outcome: tuple | None) -> BaseException:
    """What a failed cell raises in the stage: a fedrepro error as it was raised (one clear line), anything else
    with the child's traceback attached; a child that died without a word, with its exit code."""
    if outcome is None:
        return RuntimeError(
            f"cell {job.cell.name}: its process ended with exit code {child.exitcode} before "
            "reporting (killed, or out of memory?)"
        )
    _, error, formatted = outcome
    if isinstance(error, FedreproError):
        return error
    if error is None:
        return RuntimeError(f"cell {job.cell.name} failed:\n{formatted}")
    error.add_note(f"in cell {job.cell.name}'s process:\n{formatted}")
    return error
