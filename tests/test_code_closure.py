"""A cell's fingerprint holds the code it runs and nothing else: an edit retrains exactly the cells that can run the
edited code. Each case edits a copy of the package (``code_closure.ROOT`` pointed at it) and compares the three
papers' fingerprints before and after. Docs, benchmarks, tests and scripts live outside the package: no fingerprint
reads them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import fedrepro.code_closure as code_closure
from fedrepro.config import parse_params
from fedrepro.fedcmc import runs as fedcmc_runs
from fedrepro.fedcmc.cells import Cell as FedCMCCell
from fedrepro.fedmatch import runs as fedmatch_runs
from fedrepro.fedmatch.cells import Cell as FedMatchCell
from fedrepro.ssvfnas import runs as ssvfnas_runs
from fedrepro.ssvfnas.cells import Cell as SSVFNASCell

from test_config import RAW

CELLS = {
    "fedmatch fedavg": (fedmatch_runs, FedMatchCell("fedavg", 0)),
    "fedmatch fedmatch_h_lr": (fedmatch_runs, FedMatchCell("fedmatch_h_lr", 0)),
    "fedcmc fedavg": (fedcmc_runs, FedCMCCell("fedavg", "synthetic-re", 0.5, 10, 1, 0)),
    "fedcmc fedprox": (fedcmc_runs, FedCMCCell("fedprox", "synthetic-re", 0.5, 10, 1, 0)),
    "fedcmc fedcmc": (fedcmc_runs, FedCMCCell("fedcmc", "synthetic-re", 0.5, 10, 1, 0)),
    "ssvfnas vfnas2": (ssvfnas_runs, SSVFNASCell("vfnas2", "digits", 2, 0.0, 0.0, 0)),
}


def _params(runtime: str = "engine"):
    raw = yaml.safe_load(yaml.safe_dump(RAW))
    raw["train"]["runtime"] = runtime
    return parse_params(raw)


def fingerprints(params) -> dict[str, str]:
    return {name: runs.run_fingerprint(params, cell, "inputs") for name, (runs, cell) in CELLS.items()}


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(code_closure.ROOT / "fedrepro", root / "fedrepro", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture
def copy_root(package_copy, monkeypatch):
    """The package copy as the code fingerprints read; each test's edits are undone after it."""
    monkeypatch.setattr(code_closure, "ROOT", package_copy)
    originals = {path: path.read_bytes() for path in (package_copy / "fedrepro").rglob("*.py")}
    yield package_copy
    for path, content in originals.items():
        path.write_bytes(content)


def _append(root: Path, module: str, text: str) -> None:
    path = root / module
    path.write_text(path.read_text() + text)


def _changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in before if before[name] != after[name]}


@pytest.mark.parametrize(
    "module, text, retrained",
    [
        # a report module, and another paper's report: no cell runs them
        ("fedrepro/fedmatch/report.py", "\ndef a_new_table():\n    return 1\n", set()),
        ("fedrepro/fedcmc/render.py", "\nEXTRA_ROW = 'x'\n", set()),
        # prose: a comment in the engine every horizontal cell runs
        ("fedrepro/fl/engine.py", "\n# a note for readers\n", set()),
        # a helper added to the health rule: the cells whose code imports it
        (
            "fedrepro/fl/health.py",
            '\n\ndef explained():\n    """A docstring."""\n',
            {"fedmatch fedavg", "fedmatch fedmatch_h_lr", "ssvfnas vfnas2"},
        ),
        # one algorithm's code: its own cells only
        ("fedrepro/fl/algorithms/fedprox.py", "\nPROXIMAL_SCALE = 2.0\n", {"fedcmc fedprox"}),
        ("fedrepro/fl/algorithms/fedcmc.py", "\nTEMPERATURE_FLOOR = 0.1\n", {"fedcmc fedcmc"}),
        # the shared engine: every horizontal cell, no vertical one
        (
            "fedrepro/fl/engine.py",
            "\nROUND_LIMIT = 10\n",
            {"fedmatch fedavg", "fedmatch fedmatch_h_lr", "fedcmc fedavg", "fedcmc fedprox", "fedcmc fedcmc"},
        ),
        # another paper's training code
        ("fedrepro/ssvfnas/runs.py", "\nEXTRA = 1\n", {"ssvfnas vfnas2"}),
        ("fedrepro/tasks/relation.py", "\nEXTRA = 1\n", {"fedcmc fedavg", "fedcmc fedprox", "fedcmc fedcmc"}),
        # Flower's modules: not run on the engine
        ("fedrepro/fl/flower/server.py", "\nEXTRA = 1\n", set()),
    ],
)
def test_an_edit_retrains_exactly_the_cells_that_run_the_edited_code(copy_root, module, text, retrained):
    params = _params()
    before = fingerprints(params)
    _append(copy_root, module, text)
    assert _changed(before, fingerprints(params)) == retrained


def test_a_docstring_edit_retrains_nothing_but_a_changed_loss_term_is_caught(copy_root):
    params = _params()
    before = fingerprints(params)
    path = copy_root / "fedrepro/fl/algorithms/fedprox.py"
    source = path.read_text()
    first_docstring_end = source.index('"""', source.index('"""') + 3)
    path.write_text(source[:first_docstring_end] + " Reworded." + source[first_docstring_end:])
    assert fingerprints(params) == before
    assert "mu / 2" in source or "self.settings.mu" in source, "the test's edit needs FedProx's proximal term"
    path.write_text(source.replace("self.settings.mu", "(2 * self.settings.mu)", 1))
    assert _changed(before, fingerprints(params)) == {"fedcmc fedprox"}


def test_an_attributes_docstring_edit_retrains_nothing_but_its_default_is_caught(copy_root):
    params = _params()
    before = fingerprints(params)
    path = copy_root / "fedrepro/fl/engine.py"
    source = path.read_text()
    documented = '    eval_every: int = 1\n    """'
    assert documented in source, "the test's edit needs EngineSettings.eval_every and the string that documents it"
    path.write_text(source.replace(documented, documented + "Reworded. ", 1))
    assert fingerprints(params) == before
    path.write_text(source.replace("    eval_every: int = 1\n", "    eval_every: int = 2\n", 1))
    assert _changed(before, fingerprints(params)) == {name for name in CELLS if not name.startswith("ssvfnas")}


def test_flower_modules_are_in_the_code_of_a_cell_run_on_flower(copy_root):
    params = _params("flower-simulation")
    before = fingerprints(params)
    _append(copy_root, "fedrepro/fl/flower/server.py", "\nEXTRA = 1\n")
    assert {"fedmatch fedavg", "fedcmc fedcmc"} <= _changed(before, fingerprints(params))


def test_another_version_of_a_library_the_code_imports_retrains(monkeypatch):
    params = _params()
    before = fingerprints(params)
    real = code_closure.metadata.version
    monkeypatch.setattr(code_closure.metadata, "version", lambda name: "9.9" if name == "torch" else real(name))
    assert _changed(before, fingerprints(params)) == set(CELLS)
    monkeypatch.setattr(code_closure.metadata, "version", lambda name: "9.9" if name == "ranx" else real(name))
    assert _changed(before, fingerprints(params)) == {"fedmatch fedavg", "fedmatch fedmatch_h_lr"}
