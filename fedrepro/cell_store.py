"""Finished cells shared by every copy of the project, keyed by their fingerprint.

DVC's queued and temporary experiments (``dvc exp run --queue``, ``--temp``) run in fresh copies of the project
that lack the workspace's cell checkpoints (they are not cached outputs), so every cell of a grid would retrain
from round 1 though most of them are unchanged. A cell's fingerprint changes with anything that shapes its run
(the cell, its settings, its inputs' digest, the code), so a finished checkpoint kept under it is exactly the run
any copy would repeat: restored into that copy's checkpoint folder, the cell resumes finished and is only re-scored.

Where: ``$FEDREPRO_CELL_STORE``, else ``$XDG_CACHE_HOME/fedrepro/cells`` (``~/.cache/fedrepro/cells``); ``off``
turns it off. Deleting it loses nothing but time. Tensor files (``.safetensors``, nearly all of a checkpoint's
bytes) are hard-linked where the store and the project share a file system: their writers replace whole files
atomically, never edit one in place, so neither side can change a file under the other. Everything else (JSON,
a deployment's logs, which are appended to) is copied.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fedrepro.io import read_json, write_json

ENV = "FEDREPRO_CELL_STORE"
MARKER = "cell-store.json"
"""In a checkpoint folder: the fingerprint of the finished run it holds, once kept or restored."""


def _link_or_copy(source: str, target: str) -> None:
    if source.endswith(".safetensors"):
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copy2(source, target)


class CellStore:
    """Finished checkpoint folders under ``root/<fingerprint>``; a store without a root keeps nothing."""

    def __init__(self, root: str | os.PathLike | None) -> None:
        self.root = Path(root) if root is not None else None

    @classmethod
    def from_environment(cls) -> CellStore:
        """The store ``$FEDREPRO_CELL_STORE`` names (``off``: none), else the user's cache folder."""
        chosen = os.environ.get(ENV, "").strip()
        if chosen.lower() == "off":
            return cls(None)
        if chosen:
            return cls(Path(chosen).expanduser())
        cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return cls(Path(cache) / "fedrepro" / "cells")

    @staticmethod
    def finished_run(checkpoint_dir: Path) -> str | None:
        """The fingerprint of the finished run ``checkpoint_dir`` holds (kept or restored), None if none."""
        marker = Path(checkpoint_dir) / MARKER
        return read_json(marker).get("fingerprint") if marker.exists() else None

    def holds(self, fingerprint: str) -> bool:
        return self.root is not None and (self.root / fingerprint).is_dir()

    def costs(self, label: str, machine: str) -> list[dict]:
        """What the kept runs of grid ``label`` on ``machine`` cost to train (``keep``'s ``cost``): a plan's measure."""
        if self.root is None or not self.root.is_dir():
            return []
        found = []
        for marker in self.root.glob(f"*/{MARKER}"):
            cost = read_json(marker).get("cost")
            if cost and cost.get("label") == label and cost.get("machine") == machine:
                found.append(cost)
        return found

    def restore(self, fingerprint: str, checkpoint_dir: Path) -> bool:
        """Put the stored finished run ``fingerprint`` into ``checkpoint_dir`` unless it holds it already (whatever
        else is there is replaced: a stale or unfinished run). True if it was restored."""
        stored = self.root / fingerprint if self.root is not None else None
        checkpoint_dir = Path(checkpoint_dir)
        if stored is None or not stored.is_dir() or self.finished_run(checkpoint_dir) == fingerprint:
            return False
        if checkpoint_dir.exists():
            shutil.rmtree(checkpoint_dir)
        shutil.copytree(stored, checkpoint_dir, copy_function=_link_or_copy)
        write_json(checkpoint_dir / MARKER, {"fingerprint": fingerprint})  # as a run trained here leaves it (``keep``)
        return True

    def keep(self, fingerprint: str, checkpoint_dir: Path, cost: dict | None = None) -> None:
        """Keep ``checkpoint_dir``, the finished run ``fingerprint``, in the store (once; a copy running the same
        cell at the same time keeps its own identical files or finds them kept), with what it cost to train where it
        was trained here (``cost``: its grid's label, the machine, seconds, table cells' worth, bytes). The cost goes
        into the store's marker only: the workspace's marker is a stage output's file, and seconds that differ from
        run to run would make DVC see a retrained but identical stage as changed."""
        checkpoint_dir = Path(checkpoint_dir)
        write_json(checkpoint_dir / MARKER, {"fingerprint": fingerprint})
        if self.root is None or (self.root / fingerprint).is_dir():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{fingerprint[:12]}.tmp-", dir=self.root))
        try:
            shutil.copytree(checkpoint_dir, staging / "cell", copy_function=_link_or_copy)
            if cost:
                write_json(staging / "cell" / MARKER, {"fingerprint": fingerprint, "cost": cost})
            os.replace(staging / "cell", self.root / fingerprint)
        except OSError:
            if not (self.root / fingerprint).is_dir():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
