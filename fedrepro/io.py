"""Atomic file and directory writes: a failed stage never leaves a half-written output behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from fedrepro.errors import DataError


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


def _first_non_finite(obj: Any, where: str = "") -> str | None:
    """Where in ``obj`` the first NaN or Inf float sits (``history[2].train_loss``), or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where or "the value"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = _first_non_finite(value, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}".lstrip("."))
        if found is not None:
            return found
    return None


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Deterministic, strict JSON (sorted keys, fixed indent) so identical runs give identical bytes. NaN and
    Infinity are refused: they are not JSON (Python writes them as bare tokens most parsers reject), and a
    missing number is written as None (null)."""
    try:
        text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except ValueError as error:
        where = _first_non_finite(obj)
        if where is None:
            raise
        raise ValueError(f"{path}: {where} is not a finite number; JSON has no NaN or Infinity (write None)") from error
    with atomic_file(path) as handle:
        handle.write(text + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_table(path: str | os.PathLike, frame: pd.DataFrame) -> None:
    """Parquet without the pandas index, written atomically."""
    with atomic_file(path, "wb") as handle:
        frame.to_parquet(handle, index=False)


def read_csv(path: str | os.PathLike, **options: Any) -> pd.DataFrame:
    """``pandas.read_csv`` for a file a user brings: an empty or malformed file stops in one line that names it
    (pandas' own error names no file and ends a long traceback)."""
    try:
        return pd.read_csv(path, **options)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the file is empty; expected a header row, then one row per record") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        kind = "tab-separated" if options.get("sep") == "\t" else "comma-separated"
        raise DataError(f"{path}: not a readable {kind} table ({str(error).strip()})") from None


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
