"""The cell store: a finished cell kept by one copy of the project is restored, finished, in another copy (DVC's
queued and temporary experiments), and only a cell whose fingerprint changed trains again."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from fedrepro.cell_store import MARKER, CellStore
from fedrepro.fl.engine import Engine, EngineSettings
from fedrepro.grid import run_grid
from fedrepro.io import write_json
from toy import ToyTask, make_algorithm


def finished_folder(folder: Path) -> Path:
    (folder / "latest").mkdir(parents=True)
    write_json(folder / "latest" / "state.json", {"next_round": 3})
    save_file({"weight": torch.ones(3)}, str(folder / "latest" / "global.safetensors"))
    return folder


def test_a_kept_cell_is_restored_in_another_copy_as_links_to_the_same_files(tmp_path):
    store = CellStore(tmp_path / "store")
    kept = finished_folder(tmp_path / "copy-a" / "cell")
    store.keep("run-1", kept)
    target = tmp_path / "copy-b" / "cell"
    assert store.restore("run-1", target)
    for name in ("state.json", "global.safetensors"):
        assert (target / "latest" / name).read_bytes() == (kept / "latest" / name).read_bytes()
    tensors, state = (target / "latest" / "global.safetensors").stat(), (target / "latest" / "state.json").stat()
    assert tensors.st_ino == (kept / "latest" / "global.safetensors").stat().st_ino, "tensors are linked"
    assert state.st_ino != (kept / "latest" / "state.json").stat().st_ino, "the rest is copied"
    assert json.loads((target / MARKER).read_text()) == {"fingerprint": "run-1"}
    assert not store.restore("run-1", target), "a folder that holds the run is left as it is"
    assert not store.restore("run-2", tmp_path / "copy-c" / "cell"), "a run never kept is not restored"


def test_a_cells_cost_is_kept_in_the_store_and_never_in_the_workspace_marker(tmp_path):
    """The workspace's checkpoint folder is a stage output: seconds in its marker would differ from run to run and
    make DVC see an identical retrained stage as changed. The store's copy keeps the cost for plans."""
    store = CellStore(tmp_path / "store")
    cost = {"label": "toy", "machine": "avx2", "seconds": 12.5, "worth": 1.0, "bytes": 10}
    kept = finished_folder(tmp_path / "copy-a" / "cell")
    store.keep("run-1", kept, cost)
    assert json.loads((kept / MARKER).read_text()) == {"fingerprint": "run-1"}
    assert store.costs("toy", "avx2") == [cost]
    restored = tmp_path / "copy-b" / "cell"
    assert store.restore("run-1", restored)
    assert (restored / MARKER).read_bytes() == (kept / MARKER).read_bytes(), (
        "a restored cell's marker as a trained one's"
    )


def test_restoring_replaces_an_unfinished_or_other_run(tmp_path):
    store = CellStore(tmp_path / "store")
    store.keep("run-1", finished_folder(tmp_path / "a"))
    unfinished = tmp_path / "b"
    (unfinished / "latest").mkdir(parents=True)
    (unfinished / "latest" / "partial.bin").write_bytes(b"round 1 of 3")
    assert store.restore("run-1", unfinished)
    assert sorted(p.name for p in (unfinished / "latest").iterdir()) == ["global.safetensors", "state.json"]


def test_a_store_turned_off_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDREPRO_CELL_STORE", "off")
    store = CellStore.from_environment()
    store.keep("run-1", finished_folder(tmp_path / "a"))
    assert not store.restore("run-1", tmp_path / "b")
    monkeypatch.setenv("FEDREPRO_CELL_STORE", str(tmp_path / "chosen"))
    assert CellStore.from_environment().root == tmp_path / "chosen"
    monkeypatch.delenv("FEDREPRO_CELL_STORE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert CellStore.from_environment().root == tmp_path / "cache" / "fedrepro" / "cells"


@dataclass(frozen=True)
class ToyCell:
    name: str
    knob: float


def toy_engine(checkpoint_dir: Path, fingerprint: str) -> Engine:
    settings = EngineSettings(
        rounds=2,
        local_epochs=1,
        clients_per_round=0,
        lr=0.01,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=0,
    )
    return Engine(
        ToyTask({"a": 16, "b": 8}),
        make_algorithm("fedavg"),
        settings,
        checkpoint_dir,
        fingerprint=fingerprint,
        progress=False,
    )


def test_a_second_copy_of_a_grid_trains_only_the_cells_whose_fingerprint_changed(tmp_path):
    """Two copies of a project (two checkpoint roots) share one store, as a queued experiment shares the user's."""
    torch.use_deterministic_algorithms(True)
    store, trained = CellStore(tmp_path / "store"), []

    def grid(copy: Path, knobs: dict[str, float]) -> dict[str, dict]:
        cells = [ToyCell(name, knob) for name, knob in knobs.items()]
        results = {}

        def run_cell(cell, out, checkpoint_dir, digest):
            engine = toy_engine(checkpoint_dir, fingerprint_of(cell, digest))
            if engine.state.next_round < engine.settings.rounds:
                trained.append((copy.name, cell.name))
            results[cell.name] = engine.run().history
            out.mkdir(parents=True)
            return {}

        def fingerprint_of(cell, digest):
            return f"{cell.name}-{cell.knob}-{digest}"

        (copy / "inputs").mkdir(parents=True, exist_ok=True)
        run_grid(
            {Path("tables"): cells},
            Path("tables"),
            copy / "out",
            copy / "checkpoints",
            lambda cell: (copy / "inputs",),
            run_cell,
            lambda metrics: "done",
            fingerprint_of,
            store,
        )
        return results

    grid(tmp_path / "workspace", {"fedavg": 0.0, "moon": 1.0})
    assert trained == [("workspace", "fedavg"), ("workspace", "moon")]
    trained.clear()
    second = grid(tmp_path / "queued", {"fedavg": 0.0, "moon": 2.0})
    assert trained == [("queued", "moon")], "only the cell whose knob changed trains"
    assert "fedavg" not in second and (tmp_path / "queued" / "out" / "tables" / "fedavg").is_dir(), (
        "the restored cell comes with the outputs it was scored to: not scored again"
    )
