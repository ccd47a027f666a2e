"""The results ledger (``fedrepro.ledger``): what a report needs of each finished cell, kept without any of the raw
data, taken back untrained by a stage on a machine of the same class, and a budget that stops a stage between cells."""

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from fedrepro.cell_store import CellStore
from fedrepro.fedcmc.runs import ledger_gold as fedcmc_gold
from fedrepro.fedmatch.runs import ledger_gold as fedmatch_gold
from fedrepro import ledger as ledger_module
from fedrepro.grid import STOP_ENV, BudgetSpent, run_grid
from fedrepro.ledger import Gold, ResultsLedger, join_column
from fedrepro.metrics.ranking import trec_files
from fedrepro.tasks.qa import qrels_and_run

GOLD_LABELS = {"s1": "rel0", "s2": "rel2", "s3": "rel1"}


@dataclass(frozen=True)
class ToyCell:
    name: str
    seed: int


def join_toy_labels(cell, out: Path) -> None:
    join_column(out, "predictions.csv", "sentence_id", "label", pd.Series(GOLD_LABELS), 1)


TOY_GOLD = Gold(
    keep=("metrics.json", "predictions.csv"), dropped_columns={"predictions.csv": ("label",)}, join=join_toy_labels
)


def toy_cell(calls: list):
    """A cell that writes predictions with gold labels beside them, a drawing no report reads, and metrics."""

    def run_cell(cell, out, checkpoint_dir, digest):
        calls.append(cell.name)
        out.mkdir(parents=True)
        pd.DataFrame(
            {
                "sentence_id": list(GOLD_LABELS),
                "label": list(GOLD_LABELS.values()),
                "client": ["c0", "c1", "c0"],
                "predicted": ["rel0", "rel0", f"rel{cell.seed}"],
            }
        ).to_csv(out / "predictions.csv", index=False)
        (out / "drawing.png").write_bytes(b"\x89PNG not kept")
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        (checkpoint_dir / "weights.safetensors").write_bytes(b"weights")
        metrics = {"f1": 0.5 + cell.seed / 10}
        (out / "metrics.json").write_text(json.dumps(metrics))
        return metrics

    return run_cell


def grid(root: Path, ledger: ResultsLedger | None, calls: list, cells=None, workers: int = 1) -> dict[str, bytes]:
    cells = cells or [ToyCell(f"cell-{seed}", seed) for seed in range(3)]
    (root / "inputs").mkdir(parents=True, exist_ok=True)
    run_grid(
        {Path("tables"): cells},
        Path("tables"),
        root / "out",
        root / "checkpoints",
        lambda cell: (root / "inputs",),
        toy_cell(calls),
        lambda metrics: f"F1 {metrics['f1']:.2f}",
        lambda cell, digest: f"run-of-{cell.name}-{digest}",
        CellStore(None),
        workers=workers,
        ledger=ledger,
    )
    return {str(p.relative_to(root / "out")): p.read_bytes() for p in sorted((root / "out").rglob("*.csv"))}


def test_a_cell_the_ledger_holds_comes_back_untrained_and_byte_for_byte_with_its_gold_joined_back(tmp_path):
    ledger = ResultsLedger(tmp_path / "ledger", TOY_GOLD, "avx2-fp32")
    first_calls, again_calls = [], []
    trained = grid(tmp_path / "first", ledger, first_calls)
    again = grid(tmp_path / "again", ledger, again_calls)  # a fresh checkout: no checkpoint, no cell store
    assert first_calls == ["cell-0", "cell-1", "cell-2"] and again_calls == []
    assert again == trained and len(trained) == 3


def test_the_ledger_keeps_no_gold_label_no_weights_and_no_file_a_report_does_not_read(tmp_path):
    ledger = ResultsLedger(tmp_path / "ledger", TOY_GOLD, "avx2-fp32")
    grid(tmp_path / "first", ledger, [])
    kept = sorted(str(p.relative_to(tmp_path / "ledger")) for p in (tmp_path / "ledger").rglob("*") if p.is_file())
    assert sorted(Path(p).name for p in kept) == ["metrics.json"] * 3 + ["predictions.csv"] * 3 + ["stamp.json"] * 3, (
        kept
    )
    for path in (tmp_path / "ledger").rglob("predictions.csv"):
        frame = pd.read_csv(path)
        assert list(frame.columns) == ["sentence_id", "client", "predicted"]
    stamp = next((tmp_path / "ledger").rglob("stamp.json")).read_text()
    assert '"machine": "avx2-fp32"' in stamp and '"seconds"' in stamp


def test_a_cell_found_already_trained_is_recorded_without_training_seconds(tmp_path):
    """A stage that found a cell trained and scored (its checkpoint folder) spent no training on it: its stamp says
    null, so a snapshot's time estimate reads only cells trained where they were recorded."""

    def seconds(ledger_root: Path) -> list:
        return [json.loads(p.read_text())["seconds"] for p in sorted(ledger_root.rglob("stamp.json"))]

    grid(tmp_path / "work", ResultsLedger(tmp_path / "first", TOY_GOLD, "avx2-fp32"), [])
    calls = []
    grid(tmp_path / "work", ResultsLedger(tmp_path / "second", TOY_GOLD, "avx2-fp32"), calls)
    assert calls == [] and seconds(tmp_path / "second") == [None] * 3
    assert all(isinstance(s, float) for s in seconds(tmp_path / "first"))


def test_an_entry_needs_the_cells_metrics_among_what_it_keeps(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    ledger = ResultsLedger(tmp_path / "ledger", Gold(keep=("predictions.csv",), join=join_toy_labels), "avx2-fp32")
    with pytest.raises(ValueError, match="no metrics.json among the files"):
        ledger.record("run", ToyCell("cell-0", 0), out, 1.0, 1.0)


def test_a_machine_without_git_records_no_commit(tmp_path, monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(ledger_module.subprocess, "run", no_git)
    assert ResultsLedger(tmp_path, TOY_GOLD, "avx2-fp32").commit is None


def test_a_stage_takes_back_only_cells_of_its_own_machine_class(tmp_path):
    grid(tmp_path / "first", ResultsLedger(tmp_path / "ledger", TOY_GOLD, "avx512-bf16"), [])
    calls = []
    grid(tmp_path / "other", ResultsLedger(tmp_path / "ledger", TOY_GOLD, "avx2-fp32"), calls)
    assert calls == ["cell-0", "cell-1", "cell-2"], "bf16 cells never stand in for fp32 ones"


def test_a_missing_gold_label_is_an_error_that_names_the_file(tmp_path):
    out = tmp_path / "cell"
    out.mkdir()
    pd.DataFrame({"sentence_id": ["s1", "s9"], "client": ["c0", "c0"], "predicted": ["rel0", "rel1"]}).to_csv(
        out / "predictions.csv", index=False
    )
    with pytest.raises(Exception, match=r"predictions.csv: no label for sentence_id \['s9'\]"):
        join_toy_labels(None, out)


@pytest.mark.parametrize("workers", [1, 2])
def test_past_the_stop_time_no_cell_starts_but_those_the_ledger_holds_and_the_stage_fails_saying_how_many(
    tmp_path, monkeypatch, workers
):
    """In process and on forked cell workers."""
    ledger = ResultsLedger(tmp_path / "ledger", TOY_GOLD, "avx2-fp32")
    grid(tmp_path / "first", ledger, [], cells=[ToyCell("cell-0", 0)])
    monkeypatch.setenv(STOP_ENV, str(time.time() - 1))
    calls = []
    with pytest.raises(BudgetSpent, match="2 of 3 cells were not started"):
        grid(tmp_path / "later", ledger, calls, workers=workers)
    assert calls == []
    assert not (tmp_path / "later" / "out" / "tables").exists(), "no half of the stage's output"


def test_past_the_stop_time_with_no_cell_held_forked_workers_end_at_once(tmp_path, monkeypatch):
    """Every cell refused before any started: the forked path has nothing running and must not wait on it (it
    waited forever once, when ``cpu_snapshot.py carry`` built a clone's inputs with a stop time already passed)."""
    monkeypatch.setenv(STOP_ENV, str(time.time() - 1))
    calls = []
    with pytest.raises(BudgetSpent, match="3 of 3 cells were not started"):
        grid(tmp_path / "later", ResultsLedger(tmp_path / "ledger", TOY_GOLD, "avx2-fp32"), calls, workers=2)
    assert calls == []


def test_under_a_budget_cells_start_seed_by_seed(tmp_path, monkeypatch):
    monkeypatch.setenv(STOP_ENV, str(time.time() + 3600))
    calls = []
    cells = [ToyCell(f"{method}-{seed}", seed) for method in ("a", "b") for seed in (0, 1)]
    grid(tmp_path, None, calls, cells=cells)
    assert calls == ["a-0", "b-0", "a-1", "b-1"]


def test_fedcmc_and_fedmatch_outputs_lose_their_gold_in_the_ledger_and_get_it_back_from_the_stage_inputs(tmp_path):
    """The papers' own ``Gold``: FedCMC's labels from the partition's assignment, FedMatch's qrels from the mined
    candidates, each as the cell's scoring wrote them."""
    partitions = tmp_path / "partitions"
    (partitions / "p").mkdir(parents=True)
    pd.DataFrame(
        {
            "sentence_id": ["s1", "s2", "s3"],
            "label": ["rel0", "rel2", "rel1"],
            "split": "test",
            "client": ["c0", "c1", "c0"],
        }
    ).to_parquet(partitions / "p" / "assignment.parquet")
    mined = tmp_path / "mined" / "fiqa"
    mined.mkdir(parents=True)
    candidates = pd.DataFrame(
        {
            "question_id": ["q1", "q1", "q2", "q2", "q3"],
            "answer_id": ["a1", "a2", "a3", "a4", "a5"],
            "relevance": [1, 0, 0, 1, 1],
            "split": ["test"] * 4 + ["valid"],
        }
    )
    candidates.to_parquet(mined / "candidates.parquet")
    candidates.head(0).to_parquet(mined / "triples.parquet")

    @dataclass(frozen=True)
    class Cell:
        name: str
        seed: int
        partition: str = "p"

    def fedcmc_run(cell, out, checkpoint_dir, digest):
        out.mkdir(parents=True)
        pd.DataFrame(
            {
                "sentence_id": ["s1", "s2", "s3"],
                "label": ["rel0", "rel2", "rel1"],
                "client": ["c0", "c1", "c0"],
                "predicted": ["rel0", "rel1", "rel1"],
            }
        ).to_csv(out / "predictions.csv", index=False)
        (out / "metrics.json").write_text('{"f1": 0.5}')
        return {"f1": 0.5}

    def fedmatch_run(cell, out, checkpoint_dir, digest):
        (out / "trec").mkdir(parents=True)
        scored = candidates[candidates["split"] == "test"].assign(score=[0.9, 0.1, 0.3, 0.8])
        qrels, run = qrels_and_run(scored)
        qrels_text, run_text = trec_files(qrels, run, cell.name)
        (out / "trec" / "fiqa.qrels").write_text(qrels_text)
        (out / "trec" / "fiqa.run").write_text(run_text)
        (out / "metrics.json").write_text('{"f1": 0.5}')
        return {"f1": 0.5}

    for paper, gold, run_cell, gold_file in (
        ("fedcmc", fedcmc_gold(partitions), fedcmc_run, "predictions.csv"),
        ("fedmatch", fedmatch_gold(tmp_path / "mined"), fedmatch_run, "trec/fiqa.qrels"),
    ):
        ledger = ResultsLedger(tmp_path / paper / "ledger", gold, "avx2-fp32")
        outputs = {}
        for copy in ("trained", "restored"):
            root = tmp_path / paper / copy
            (root / "inputs").mkdir(parents=True)
            run_grid(
                {Path("t"): [Cell("c-0", 0)]},
                Path("t"),
                root / "out",
                root / "ck",
                lambda cell: (root / "inputs",),
                run_cell,
                str,
                lambda cell, digest: "run",
                CellStore(None),
                ledger=ledger,
            )
            outputs[copy] = {
                str(p.relative_to(root / "out")): p.read_bytes() for p in (root / "out").rglob("*") if p.is_file()
            }
        assert outputs["restored"] == outputs["trained"], paper
        assert not any(gold_file in str(p) for p in (tmp_path / paper / "ledger").rglob("*.qrels")), paper
        held = [p.read_text() for p in (tmp_path / paper / "ledger").rglob("*") if p.is_file()]
        assert not any("rel2" in text for text in held), "no gold label is kept"
