"""Every fedrepro module a stage script imports (directly or through other fedrepro modules) is one of the
stage's declared deps: otherwise editing it leaves `dvc repro` thinking the stage's outputs are current."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _module_file(name: str) -> Path | None:
    path = ROOT / Path(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(path: Path) -> set[Path]:
    """The fedrepro files ``path`` imports, one level (package __init__ files included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if not name.startswith("fedrepro"):
                continue
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                file = _module_file(".".join(parts[:depth]))
                if file is not None:
                    found.add(file)
    return found


def transitive_imports(script: Path) -> set[Path]:
    seen, todo = set(), [script]
    while todo:
        for file in _imports(todo.pop()) - seen:
            seen.add(file)
            todo.append(file)
    return seen


def _stages():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        stage = stage.get("do", stage)  # a foreach group's stages share one definition (fedmatch_sweep@<sweep>)
        yield pytest.param(name, stage, id=name)


@pytest.mark.parametrize("name,stage", list(_stages()))
def test_every_imported_fedrepro_module_is_a_declared_dep(name, stage):
    script = ROOT / stage["cmd"].split()[1]
    deps = [ROOT / d for d in stage.get("deps", [])]
    missing = sorted(str(f.relative_to(ROOT)) for f in transitive_imports(script)
                     if f.name != "__init__.py" and not any(f == d or d in f.parents for d in deps))
    assert not missing, f"stage {name} imports {missing} without declaring them in dvc.yaml"
