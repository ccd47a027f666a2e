"""A results ledger: what a report needs of each finished cell, kept in git so that a snapshot grows across machines
and stretches of work (``scripts/cpu_snapshot.py run``), where the cell store (``cell_store``) lives in one machine's
cache and holds weights.

An entry is ``<root>/<cell name>/<run[:16]>-<machine class>/``: ``outputs/`` (the cell's output folder without what
came from the raw data, its ``metrics.json`` included) and ``stamp.json`` (the run fingerprint, the cell, the machine
class, the commit and date it was trained at, its training seconds, null when the process that recorded it found
the cell already trained, and its weight). A stage that finds its cell's run there for this
machine class copies the outputs back, joins the raw data's part back from its own inputs (``Gold.join``), and
trains nothing.

- Nothing of the raw data is kept (the project must never commit any of it): a paper's ``Gold`` names the files
  (FedMatch's qrels) and columns (gold labels) that come from it, and they are dropped; files a report does not read
  (drawings, weights) are left out by ``Gold.keep``.
- The machine class is torch's CPU capability and the precision trained in (``avx512-bf16``, ``avx2-fp32``): the same
  fingerprint trains to other bits on another instruction set, so a stage only takes back cells of its own class,
  and a table never pairs cells of two classes.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from fedrepro.errors import DataError
from fedrepro.io import atomic_dir, read_json, write_json

ENV = "FEDREPRO_LEDGER"
"""Environment variable: the ledger folder a stage takes finished cells from and records its cells in (unset: none)."""
STAMP = "stamp.json"
METRICS = "metrics.json"
"""Every cell's output folder holds its metrics here; an entry keeps it with the outputs and reads it back from
there."""


@dataclass(frozen=True)
class Gold:
    """What of a paper's cell outputs comes from the raw data, and how a stage puts it back.

    ``keep``: globs (relative to a cell's output folder) of the files a report reads, ``metrics.json`` among them;
    ``dropped_files``: globs of
    those made of raw data alone (FedMatch's qrels); ``dropped_columns``: CSV file -> the columns of raw data in it
    (a gold label beside each prediction); ``join(cell, out)`` writes both back into ``out`` from the stage's
    inputs, as the cell's own scoring wrote them."""

    keep: tuple[str, ...]
    join: Callable[[Any, Path], None]
    dropped_files: tuple[str, ...] = ()
    dropped_columns: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def kept_files(self, out: Path) -> list[Path]:
        files = [p.relative_to(out) for p in sorted(out.rglob("*")) if p.is_file()]
        return [
            p
            for p in files
            if any(fnmatch.fnmatch(str(p), g) for g in self.keep)
            and not any(fnmatch.fnmatch(str(p), g) for g in self.dropped_files)
        ]


def machine_class(precision: str, device: str = "cpu") -> str:
    """``<torch's CPU capability>-<precision>`` on the CPU, ``cuda-sm<capability>-<precision>`` on a GPU (``cuda-sm90-
    bf16``: an H100), lower case: which kernels trained a cell."""
    import torch

    if device.startswith("cuda"):
        from fedrepro.device import capability

        major, minor = capability(device)
        return f"cuda-sm{major}{minor}-{precision}"
    return f"{torch.backends.cpu.get_cpu_capability().lower()}-{precision}"


def _commit() -> str | None:
    """The checkout's commit, when the stage runs in one (a snapshot's clone)."""
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:  # no git on this machine: the stamp says no commit rather than the stage failing
        return None
    return found.stdout.strip() if found.returncode == 0 else None


class ResultsLedger:
    """Entries under ``root`` for cells trained on machines of ``machine`` class (``machine_class``)."""

    def __init__(self, root: str | os.PathLike, gold: Gold, machine: str) -> None:
        self.root, self.gold, self.machine = Path(root), gold, machine
        self.commit = _commit()

    @classmethod
    def from_environment(cls, gold: Gold, precision: str, device: str = "cpu") -> ResultsLedger | None:
        """The ledger ``$FEDREPRO_LEDGER`` names, else None."""
        chosen = os.environ.get(ENV, "").strip()
        return cls(Path(chosen).expanduser(), gold, machine_class(precision, device)) if chosen else None

    def entry(self, run: str, cell_name: str) -> Path:
        return self.root / cell_name / f"{run[:16]}-{self.machine}"

    def holds(self, run: str, cell_name: str) -> bool:
        entry = self.entry(run, cell_name)
        return (entry / STAMP).is_file() and read_json(entry / STAMP)["run"] == run

    def restore(self, run: str, cell: Any, out: Path) -> dict | None:
        """The entry's metrics, its outputs written to ``out`` with the raw data's part joined back; None if the
        ledger does not hold this run of this cell for this machine class."""
        if not self.holds(run, cell.name):
            return None
        entry = self.entry(run, cell.name)
        shutil.copytree(entry / "outputs", out)
        self.gold.join(cell, out)
        return read_json(out / METRICS)

    def record(self, run: str, cell: Any, out: Path, seconds: float | None, weight: float) -> None:
        """Keep ``out``'s files that a report reads, less the raw data's part, and the stamp; ``seconds``: None
        when this process did not train the cell (its outputs were scored earlier)."""
        kept = self.gold.kept_files(out)
        if Path(METRICS) not in kept:
            raise ValueError(
                f"{out}: no {METRICS} among the files the paper's Gold keeps ({self.gold.keep}); a ledger "
                f"entry reads its metrics from there"
            )
        with atomic_dir(self.entry(run, cell.name)) as folder:
            for relative in kept:
                target = folder / "outputs" / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                dropped = self.gold.dropped_columns.get(str(relative))
                if dropped:
                    pd.read_csv(out / relative, dtype=str, keep_default_na=False).drop(columns=list(dropped)).to_csv(
                        target, index=False
                    )
                else:
                    shutil.copy2(out / relative, target)
            write_json(
                folder / STAMP,
                {
                    "run": run,
                    "cell": cell.name,
                    "machine": self.machine,
                    "commit": self.commit,
                    "date": dt.date.today().isoformat(),
                    "seconds": None if seconds is None else round(seconds, 1),
                    "weight": weight,
                },
            )


def join_column(out: Path, file: str, key: str, column: str, values: pd.Series, position: int) -> None:
    """Put ``column`` (``values``, indexed by ``key``) back into ``out/file`` at ``position``, every row's value
    found (a key it lacks is an error: the entry was not made from these inputs)."""
    frame = pd.read_csv(out / file, dtype=str, keep_default_na=False)
    joined = frame[key].map(values.astype(str))
    if joined.isna().any():
        missing = frame.loc[joined.isna(), key].head(3).tolist()
        raise DataError(f"{out / file}: no {column} for {key} {missing} in the stage's inputs")
    frame.insert(position, column, joined)
    frame.to_csv(out / file, index=False)
