"""What the three papers' train stages share: the loop over a grid's cells, the fingerprint that tells a checkpoint
of this very run from any other, and the main table's rows.

A stage runs many cells in one process, because importing torch costs seconds a process, more than a small cell's
training; each cell keeps its own checkpoint and output folder, so a killed run resumes where it stopped and a new
grid point trains only the new cells (the others resume from their finished checkpoints and are only re-scored).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from fedrepro.cell_store import CellStore
from fedrepro.errors import ConfigError
from fedrepro.io import atomic_dir, code_digest, tree_digest

TABLES = Path("tables")


def fingerprint(cell: Any, inputs_digest: str, shaping: dict[str, Any]) -> str:
    """Changes whenever anything that shapes a cell's run changes: the cell, ``shaping`` (the settings it runs
    under, not the grid's lists), the digest of its inputs and the code."""
    payload = {"cell": asdict(cell), **shaping, "inputs": inputs_digest, "code": code_digest()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def table_rows(cells: Sequence[Any], methods: Sequence[str], allowed: str,
               only: str | None = None) -> tuple[Path, dict[Path, list]]:
    """The main table's cells a row per method (``tables/<method>``) and the folder the rows are written to: all of
    ``tables``, or with ``only`` that one row, rerun in place. ``allowed`` names the methods' params key."""
    if only is not None and only not in methods:
        raise ConfigError(f"--method {only!r} is not in {allowed} {list(methods)}")
    chosen = list(methods) if only is None else [only]
    return (TABLES if only is None else TABLES / only), {TABLES / m: [c for c in cells if c.method == m] for m in chosen}


def run_grid(rows: dict[Path, list], folder: Path, out: Path, checkpoints: Path,
             inputs: Callable[[Any], tuple[Path, ...]], run_cell: Callable[[Any, Path, Path, str], dict],
             headline: Callable[[dict], str], fingerprint_of: Callable[[Any, str], str],
             store: CellStore | None = None) -> None:
    """Run (or resume) every cell of ``rows`` (a folder -> its cells): ``run_cell(cell, out, checkpoint_dir,
    inputs_digest)`` writes to ``out/<row>/<cell>`` and checkpoints in ``checkpoints/<row>/<cell>``. ``folder`` (under
    both) is the stage's output: replaced whole once every cell is done, so a failed stage leaves no half of it. The
    folders a cell reads (``inputs``) are digested once per process, and a line per cell shows the progress. A cell
    that ``store`` (default: the environment's, ``fedrepro.cell_store``) holds under its ``fingerprint_of(cell,
    inputs_digest)`` is restored finished and only re-scored; each finished cell is kept there."""
    total, done = sum(len(cells) for cells in rows.values()), 0
    digests: dict[tuple[Path, ...], str] = {}
    store = store if store is not None else CellStore.from_environment()
    (checkpoints / folder).mkdir(parents=True, exist_ok=True)  # a declared output, even for no cells
    with atomic_dir(out / folder) as tmp:
        for row, cells in rows.items():
            for cell in cells:
                started = time.perf_counter()
                folders = inputs(cell)
                if folders not in digests:
                    digests[folders] = tree_digest(*folders)
                checkpoint_dir, run = checkpoints / row / cell.name, fingerprint_of(cell, digests[folders])
                restored = store.restore(run, checkpoint_dir)
                metrics = run_cell(cell, tmp / row.relative_to(folder) / cell.name, checkpoint_dir, digests[folders])
                store.keep(run, checkpoint_dir)
                done += 1
                print(f"[{done}/{total}] {cell.name}: {headline(metrics)} ({time.perf_counter() - started:.1f} s"
                      f"{', finished run from the cell store' if restored else ''})", file=sys.stderr, flush=True)
