"""Each stage's fedrepro deps in dvc.yaml are exactly the modules its script can run (its import closure,
``fedrepro.code_closure``): one missing leaves `dvc repro` thinking the stage's outputs are current after an edit to
it; one extra reruns the stage for an edit that cannot change it. ``python scripts/stage_deps.py --write`` mends it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedrepro.code_closure import import_closure, runs_nothing

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedrepro"


def _stages():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        yield pytest.param(name, stage, id=name)


def _declared_modules(deps: list[str]) -> set[Path]:
    """The fedrepro modules (that run something) the deps name, a folder standing for every module under it."""
    modules = set()
    for dep in deps:
        path = ROOT / dep
        if PACKAGE in path.parents:
            modules |= set(path.rglob("*.py")) if path.is_dir() else {path} if path.suffix == ".py" else set()
    return {module for module in modules if not runs_nothing(module)}


@pytest.mark.parametrize("name,stage", list(_stages()))
def test_a_stages_fedrepro_deps_are_its_scripts_import_closure(name, stage):
    script = ROOT / stage["cmd"].split()[1]
    closure = {f for f in import_closure(script) if PACKAGE in f.parents and not runs_nothing(f)}
    declared = _declared_modules(stage.get("deps", []))
    missing = sorted(str(f.relative_to(ROOT)) for f in closure - declared)
    extra = sorted(str(f.relative_to(ROOT)) for f in declared - closure)
    assert not missing, f"stage {name} imports {missing} without declaring them in dvc.yaml"
    assert not extra, (
        f"stage {name} declares {extra}, which its script never imports: an edit there reruns it for nothing"
    )


def test_the_deps_script_finds_dvc_yaml_in_order():
    result = subprocess.run([sys.executable, "scripts/stage_deps.py"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_closure_follows_imports_inside_functions_and_packages_inits(tmp_path, monkeypatch):
    import fedrepro.code_closure as closure

    package = tmp_path / "fedrepro"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text('"""prose only"""\n')
    (package / "sub" / "__init__.py").write_text("FLAG = 1\n")
    (package / "sub" / "lazy.py").write_text("import numpy\n")
    (package / "sub" / "unused.py").write_text("")
    (package / "entry.py").write_text("def run():\n    from fedrepro.sub.lazy import numpy\n    return numpy\n")
    monkeypatch.setattr(closure, "ROOT", tmp_path)
    found = closure.import_closure(package / "entry.py")
    assert found == {
        package / "entry.py",
        package / "__init__.py",
        package / "sub" / "__init__.py",
        package / "sub" / "lazy.py",
    }
    assert closure.runs_nothing(package / "__init__.py") and not closure.runs_nothing(package / "sub" / "__init__.py")
    assert "numpy" in closure.third_party(found)
    assert closure.import_closure(package / "entry.py", leave_out=[package / "sub"]) == {
        package / "entry.py",
        package / "__init__.py",
    }
