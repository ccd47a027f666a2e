"""Which of fedrepro's own files a piece of code can run, and a digest of exactly those: what a cell's fingerprint
and a stage's DVC deps are made of.

The import closure of a file is every fedrepro module it imports, directly or through other fedrepro modules, read
from the source (``ast``), so an import inside a function counts as much as one at the top (a stage that can run a
runtime depends on it, whether or not today's params pick it). Importing ``a.b.c`` runs ``a/__init__`` and
``a/b/__init__`` too, so those are in the closure. Nothing is imported to compute it.

A cell's code digest is narrower than its stage's closure in two ways, each because the cell provably runs none of
what is left out: the federated algorithms other than the cell's own (``fedrepro/fl/algorithms/<name>.py``: the
registry imports every one, a cell builds one) and, on the engine runtime, Flower's modules (``fedrepro/fl/flower``:
imported only to run on Flower). The digest holds what each file does, not its bytes (its syntax tree without
docstrings and comments), and the versions of the third-party libraries the closure imports: an upgraded torch
retrains, while an edit to a docstring, a report module, a benchmark or another paper retrains nothing.
"""

from __future__ import annotations

import ast
import hashlib
import json
import platform
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
"""The folder that holds the ``fedrepro`` package (the repository's root in a checkout)."""
ALGORITHMS = Path("fedrepro/fl/algorithms")
FLOWER = Path("fedrepro/fl/flower")


def module_file(name: str) -> Path | None:
    """The file that module ``name`` (``fedrepro.fl.engine``) runs from: ``name.py`` or a package's ``__init__.py``;
    None for a name that is no module (an imported class or function)."""
    path = ROOT / Path(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=None)
def _parsed_imports(path: Path, stamp: tuple[int, int]) -> tuple[frozenset[Path], frozenset[str]]:
    """(fedrepro files, third-party top-level modules) that ``path`` imports one level deep; ``stamp`` (mtime and
    size) makes an edited file parsed again."""
    ours, theirs = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "fedrepro":
                theirs.add(parts[0])
                continue
            for depth in range(1, len(parts) + 1):
                file = module_file(".".join(parts[:depth]))
                if file is not None:
                    ours.add(file)
    return frozenset(ours), frozenset(theirs)


def imports_of(path: Path) -> tuple[frozenset[Path], frozenset[str]]:
    path = Path(path).resolve()
    status = path.stat()
    return _parsed_imports(path, (status.st_mtime_ns, status.st_size))


def import_closure(*entries: Path, leave_out: Iterable[Path] = ()) -> set[Path]:
    """Every fedrepro file the ``entries`` (files) import, transitively, the entries among them. A file under one of
    the ``leave_out`` folders (or that file itself) is neither taken nor followed, unless it is an entry."""
    leave_out = [Path(p).resolve() for p in leave_out]

    def left_out(file: Path) -> bool:
        return any(file == folder or folder in file.parents for folder in leave_out)

    seen = {Path(entry).resolve() for entry in entries}
    todo = list(seen)
    while todo:
        for file in imports_of(todo.pop())[0]:
            if file not in seen and not left_out(file):
                seen.add(file)
                todo.append(file)
    return seen


def third_party(files: Iterable[Path]) -> dict[str, str]:
    """The installed distributions (name -> version) that ``files`` import, standard library left out."""
    modules = set().union(*(imports_of(file)[1] for file in files)) - set(sys.stdlib_module_names)
    owners = _distributions()
    return {dist: metadata.version(dist) for module in sorted(modules) for dist in owners.get(module, [])}


@lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def cell_code(entry: str, runtime: str, algorithm: str | None = None) -> set[Path]:
    """The fedrepro files a cell built by module ``entry`` (``fedrepro.fedmatch.runs``) runs on ``runtime``: its
    closure without the other algorithms' modules (with ``algorithm``, the module of the cell's algorithm:
    ``fedrepro.fl.algorithms.fedavg``) and without Flower's on the engine."""
    leave_out = [file for file in (ROOT / ALGORITHMS).glob("*.py") if file.name != "__init__.py"]
    if runtime == "engine":
        leave_out.append(ROOT / FLOWER)
    start = [module_file(name) for name in (entry, algorithm) if name is not None]
    missing = [name for name, file in zip((entry, algorithm), start) if file is None]
    if missing:
        raise ValueError(f"no fedrepro module {missing[0]!r} under {ROOT}")
    return import_closure(*start, leave_out=leave_out)


def _prose(statement: ast.stmt) -> bool:
    """A bare string statement: a docstring, or the string under an attribute that documents it (a no-op either way)."""
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if isinstance(statements, list) and any(_prose(s) for s in statements):
                setattr(node, field, [s for s in statements if not _prose(s)] or [ast.Pass()])
    return tree


@lru_cache(maxsize=None)
def _source_digest(path: Path, stamp: tuple[int, int]) -> str:
    tree = _without_docstrings(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def source_digest(file: Path) -> str:
    """sha256 of what ``file`` does: its syntax tree without docstrings (attributes' included), comments, layout or
    line numbers, so an edit to its prose alone leaves every fingerprint that holds it as it was. Kept per process
    until the file changes (mtime and size), as its imports are: a stage fingerprints all its cells from one tree."""
    path = Path(file).resolve()
    status = path.stat()
    return _source_digest(path, (status.st_mtime_ns, status.st_size))


def runs_nothing(file: Path) -> bool:
    """Whether ``file`` is prose alone (a package's ``__init__`` that only says what the package holds)."""
    body = _without_docstrings(ast.parse(Path(file).read_text(encoding="utf-8"))).body
    return all(isinstance(node, ast.Pass) for node in body)


def code_digest(files: Iterable[Path]) -> str:
    """sha256 over the files' paths (from the repository root) and what they do (``source_digest``), the versions of
    the libraries they import and Python's: what a cell's fingerprint holds of its code."""
    files = sorted(Path(f).resolve() for f in files)
    listing = {str(file.relative_to(ROOT)): source_digest(file) for file in files}
    payload = {"files": listing, "libraries": third_party(files), "python": platform.python_version()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
