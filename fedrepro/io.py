"""Atomic file and directory writes: a failed stage never leaves a half-written output behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pandas as pd


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``target``, on error it is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, mode: str = "w") -> Iterator[Any]:
    """Open a temporary sibling file for writing; it is renamed onto ``target`` only on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    os.close(fd)
    try:
        with open(tmp_name, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Deterministic JSON (sorted keys, fixed indent) so identical runs give identical bytes."""
    with atomic_file(path) as handle:
        json.dump(obj, handle, indent=2, sort_keys=True, ensure_ascii=False)
        handle.write("\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_table(path: str | os.PathLike, frame: pd.DataFrame) -> None:
    """Parquet without the pandas index, written atomically."""
    with atomic_file(path, "wb") as handle:
        frame.to_parquet(handle, index=False)


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    return pd.read_parquet(path)


def tree_digest(*folders: Path, pattern: str = "*") -> str:
    """sha256 over the relative names and bytes of every file matching ``pattern`` under the folders."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(p for p in Path(folder).rglob(pattern) if p.is_file()):
            digest.update(str(path.relative_to(folder)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def code_digest() -> str:
    """sha256 over fedrepro's Python sources: a checkpoint written by other code is never resumed."""
    return tree_digest(Path(__file__).resolve().parent, pattern="*.py")
