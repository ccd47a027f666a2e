"""A stage's grid of cells: trained in forked children, several at a time, each cell gives what it gives in the stage's
own process; a failed child stops the stage with its error and leaves no half-written output."""

import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fedrepro.cell_store import CellStore
from fedrepro.errors import ConfigError
from fedrepro.fl.engine import Engine, EngineSettings
from fedrepro.grid import WORKERS_ENV, cell_workers, run_grid
from fedrepro.seeding import seed_everything
from toy import ToyTask, make_algorithm


@dataclass(frozen=True)
class ToyCell:
    name: str
    seed: int


def train_toy(cell: ToyCell, out: Path, checkpoint_dir: Path, digest: str) -> dict:
    """A cell as the papers' ``run_cell`` is one: it seeds itself, trains, writes its outputs and returns metrics."""
    seed_everything(cell.seed, 1)
    settings = EngineSettings(
        rounds=2,
        local_epochs=1,
        clients_per_round=0,
        lr=0.05,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=cell.seed,
    )
    engine = Engine(
        ToyTask({"a": 24, "b": 16}),
        make_algorithm("fedprox", mu=0.1),
        settings,
        checkpoint_dir,
        fingerprint=f"{cell.name}-{digest}",
        progress=True,
    )
    history = engine.run().history
    weights = {name: tensor.tolist() for name, tensor in engine.state.global_weights.items()}
    out.mkdir(parents=True)
    (out / "result.json").write_text(json.dumps({"history": history, "weights": weights}))
    return {"loss": history[-1]["train_loss"]}


def grid(root: Path, run_cell, workers: int, cells=None) -> dict[str, str]:
    cells = cells or [ToyCell(f"cell-{seed}", seed) for seed in range(4)]
    (root / "inputs").mkdir(parents=True, exist_ok=True)
    run_grid(
        {Path("tables"): cells},
        Path("tables"),
        root / "out",
        root / "checkpoints",
        lambda cell: (root / "inputs",),
        run_cell,
        lambda metrics: f"loss {metrics['loss']:.3f}",
        lambda cell, digest: f"{cell.name}-{digest}",
        CellStore(root / "store"),
        workers=workers,
    )
    return {p.parent.name: p.read_text() for p in sorted((root / "out" / "tables").glob("*/result.json"))}


def test_cells_trained_two_at_a_time_in_children_equal_the_cells_trained_in_process(tmp_path, capfd):
    in_process = grid(tmp_path / "one", train_toy, workers=1)
    forked = grid(tmp_path / "two", train_toy, workers=2)
    assert len(in_process) == 4 and forked == in_process
    err = capfd.readouterr().err
    assert err.count("started cell-") == 4 and "[4/4] cell-" in err, "a line when each cell starts and ends"
    assert "fedprox rounds" not in err.split("[1/4]")[-1], "the children's progress bars go to their logs"


def test_each_child_trains_cells_one_after_another_so_what_a_process_keeps_serves_its_later_cells(tmp_path, capfd):
    """A Flower simulation keeps Ray and its workers per process: two children for six cells, not six, and each
    cell's log holds its own lines only."""

    def run_in_child(cell, out, checkpoint_dir, digest):
        print(f"training {cell.name}", file=sys.stderr)
        metrics = train_toy(cell, out, checkpoint_dir, digest)
        (out / "pid").write_text(str(os.getpid()))
        return metrics

    cells = [ToyCell(f"cell-{seed}", seed) for seed in range(6)]
    grid(tmp_path, run_in_child, workers=2, cells=cells)
    pids = {path.read_text() for path in (tmp_path / "out" / "tables").glob("*/pid")}
    assert len(pids) == 2 and str(os.getpid()) not in pids
    err = capfd.readouterr().err
    assert all(err.count(f"training cell-{seed}") == 1 for seed in range(6)), "each cell's lines repeated once"


def failing(error: BaseException):
    def run_cell(cell, out, checkpoint_dir, digest):
        if cell.seed == 2:
            raise error
        return train_toy(cell, out, checkpoint_dir, digest)

    return run_cell


def test_a_cells_fedrepro_error_stops_the_stage_as_raised_and_no_output_is_left(tmp_path):
    with pytest.raises(ConfigError, match=r"^fedcmc.settings.lr = -1: expected > 0$"):
        grid(tmp_path, failing(ConfigError("fedcmc.settings.lr = -1: expected > 0")), workers=2)
    assert not (tmp_path / "out" / "tables").exists(), "the stage's output is all or nothing"


def test_another_error_carries_the_cell_and_the_childs_traceback(tmp_path):
    with pytest.raises(ValueError, match="boom") as raised:
        grid(tmp_path, failing(ValueError("boom")), workers=2)
    assert any("in cell cell-2's process" in note and "Traceback" in note for note in raised.value.__notes__)


def test_a_child_that_dies_without_a_word_is_named_with_its_exit_code(tmp_path):
    def killed(cell, out, checkpoint_dir, digest):
        if cell.seed == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return train_toy(cell, out, checkpoint_dir, digest)

    with pytest.raises(RuntimeError, match=r"cell cell-1: its process ended with exit code -9 before reporting"):
        grid(tmp_path, killed, workers=2)


def test_how_many_cells_train_at_once(monkeypatch):
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    cores = len(os.sched_getaffinity(0))
    assert cell_workers(1) == cores and cell_workers(2) == max(1, cores // 2)
    assert cell_workers(1, "flower-simulation") == cores, "each child: one Ray worker"
    assert cell_workers(1, "flower-deployment") == 1, "a deployment's cells share the stage's SuperLink and nodes"
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert cell_workers(1) == 3
    for wrong in ("0", "two", "-1"):
        monkeypatch.setenv(WORKERS_ENV, wrong)
        with pytest.raises(ConfigError, match=rf"\$FEDREPRO_CELL_WORKERS = '{wrong}': expected a whole number"):
            cell_workers(1)


def test_torch_in_a_forked_child_after_the_parent_ran_torch(tmp_path):
    """A test process has run torch ops before it forks (a stage has not); the children must still train."""
    torch.ones(64, 64) @ torch.ones(64, 64)
    assert len(grid(tmp_path, train_toy, workers=2, cells=[ToyCell("x", 0), ToyCell("y", 1)])) == 2


def test_no_tqdm_monitor_thread_is_running_when_the_cells_children_are_forked(tmp_path, monkeypatch):
    """A child forked while tqdm's monitor thread holds tqdm's lock inherits it held and hangs at its first progress
    bar; a stage that showed a bar before its grid (a pipeline stage does) has such a thread, so the grid ends it."""
    from tqdm import tqdm

    monkeypatch.setattr(tqdm, "monitor_interval", 10)  # the conftest keeps it off in tests; a stage's process has it on
    with tqdm(total=1, file=sys.stderr) as bar:
        bar.update()
    assert tqdm.monitor is not None and tqdm.monitor.is_alive()
    assert len(grid(tmp_path, train_toy, workers=2)) == 4
    assert tqdm.monitor is None, "the monitor was left running across the fork"


def test_a_finished_cell_run_again_is_neither_retrained_nor_scored_again_unless_it_is_another_cell(tmp_path, capfd):
    calls = []

    def counted(cell, out, checkpoint_dir, digest):
        calls.append(cell.name)
        return train_toy(cell, out, checkpoint_dir, digest)

    first = grid(tmp_path, counted, workers=1)
    shutil.rmtree(tmp_path / "out")
    assert grid(tmp_path, counted, workers=1) == first and len(calls) == 4, "outputs copied, run_cell not called"
    assert capfd.readouterr().err.count("outputs as scored before") == 4
    # the same runs listed under other names (a figure's point equal to a table cell): scored as themselves
    renamed = [ToyCell(f"cell-{seed}", seed) for seed in range(4)]
    fingerprint_of_seed = lambda cell, digest: f"cell-{cell.seed}-{digest}"  # noqa: E731
    run_grid(
        {Path("sweep"): [ToyCell(f"point-{c.seed}", c.seed) for c in renamed]},
        Path("sweep"),
        tmp_path / "out",
        tmp_path / "checkpoints",
        lambda cell: (tmp_path / "inputs",),
        counted,
        lambda m: "",
        fingerprint_of_seed,
        CellStore(tmp_path / "store"),
        workers=1,
    )
    assert sorted(calls[4:]) == [f"point-{seed}" for seed in range(4)]
    err = capfd.readouterr().err
    assert err.count("finished run from the cell store") == 4 and "outputs as scored before" not in err


def test_the_heaviest_cells_start_first(tmp_path, capfd):
    cells = [ToyCell(f"cell-{seed}", seed) for seed in range(4)]
    (tmp_path / "inputs").mkdir()
    run_grid(
        {Path("tables"): cells},
        Path("tables"),
        tmp_path / "out",
        tmp_path / "checkpoints",
        lambda cell: (tmp_path / "inputs",),
        train_toy,
        lambda metrics: "",
        lambda cell, digest: cell.name,
        CellStore(None),
        workers=2,
        weight=lambda cell: {2: 3.0, 3: 2.0}.get(cell.seed, 1.0),
    )
    started = [line.split()[1] for line in capfd.readouterr().err.splitlines() if line.startswith("started ")]
    assert started[:2] == ["cell-2", "cell-3"] and sorted(started[2:]) == ["cell-0", "cell-1"]


def test_a_stage_says_its_plan_from_the_costs_this_machine_measured_and_asks_above_the_limit(
    tmp_path, capfd, monkeypatch
):
    """Before its first cell a stage says how many cells are finished and where, and what the rest will cost, from
    what the cells of the same grid cost here (kept with them in the cell store); above $FEDREPRO_CONFIRM_MINUTES it
    asks in a terminal, and elsewhere says so and goes on."""
    import io

    from fedrepro.grid import CONFIRM_ENV, NotConfirmed

    (tmp_path / "inputs").mkdir()
    store = CellStore(tmp_path / "store")

    def run(cells, label="toy tables", weight=None):
        run_grid(
            {Path("tables"): cells},
            Path("tables"),
            tmp_path / "out",
            tmp_path / "checkpoints",
            lambda cell: (tmp_path / "inputs",),
            train_toy,
            lambda metrics: "",
            lambda cell, digest: cell.name,
            store,
            workers=1,
            weight=weight,
            label=label,
        )
        return capfd.readouterr().err

    first = run([ToyCell(f"cell-{seed}", seed) for seed in range(2)])
    assert "plan, toy tables: 2 cells: 2 to train (no cost measured yet for this grid on this machine" in first
    costs = store.costs("toy tables", __import__("fedrepro.grid", fromlist=["_machine"])._machine())
    assert len(costs) == 2 and all(cost["seconds"] > 0 and cost["worth"] == 1.0 and cost["bytes"] > 0 for cost in costs)
    shutil.rmtree(tmp_path / "checkpoints" / "tables" / "cell-1")  # its finished run is still in the store
    weights = {0: 1.0, 1: 1.0, 2: 3.0, 3: 1.0}
    second = run([ToyCell(f"cell-{seed}", seed) for seed in range(4)], weight=lambda cell: weights[cell.seed])
    rate = sorted(cost["seconds"] / cost["worth"] for cost in costs)[1]
    line = next(text for text in second.splitlines() if text.startswith("plan, "))
    assert line.startswith(
        "plan, toy tables: 4 cells: 1 finished in their checkpoints, 1 finished in the cell store, "
        f"2 to train: about {4 * rate / 60:.0f} min on 1 worker(s) and "
    )
    assert line.endswith(" MB of checkpoints, from 2 cell(s) measured on this machine")
    assert len(store.costs("toy tables", costs[0]["machine"])) == 4, "a restored or finished cell adds no measure"
    assert "2 to train" not in run([ToyCell(f"cell-{seed}", seed) for seed in range(4)], label="other grid")
    # above the limit: a terminal is asked, and a no stops the stage before any cell
    monkeypatch.setenv(CONFIRM_ENV, "0.000001")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    with pytest.raises(NotConfirmed, match="toy tables: not started"):
        run([ToyCell("cell-9", 9)])
    assert not (tmp_path / "checkpoints" / "tables" / "cell-9").exists()
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    assert "train? [y/N]" in run([ToyCell("cell-9", 9)])
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # CI: nobody to ask
    assert "not a terminal, so going on" in run([ToyCell("cell-8", 8)])
    monkeypatch.setenv(CONFIRM_ENV, "0")
    assert "train? [y/N]" not in run([ToyCell("cell-7", 7)])


def test_a_plan_only_run_says_its_plan_on_stdout_and_writes_nothing(tmp_path, capfd):
    (tmp_path / "inputs").mkdir()
    run_grid(
        {Path("tables"): [ToyCell("cell-0", 0)]},
        Path("tables"),
        tmp_path / "out",
        tmp_path / "checkpoints",
        lambda cell: (tmp_path / "inputs",),
        train_toy,
        lambda metrics: "",
        lambda cell, digest: cell.name,
        CellStore(tmp_path / "store"),
        label="toy tables",
        plan_only=True,
    )
    assert capfd.readouterr().out.startswith("plan, toy tables: 1 cells: 1 to train")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs"]


def test_each_cell_worker_sets_its_own_environment_before_its_cells(tmp_path):
    """How a stage gives each worker its own GPU (``Placement.environment``: CUDA_VISIBLE_DEVICES), shown on the CPU
    with a variable of the test's own: every cell sees its worker's value, and two workers two values."""

    def run_in_child(cell, out, checkpoint_dir, digest):
        out.mkdir(parents=True)
        (out / "seen").write_text(os.environ["FEDREPRO_TEST_WORKER"] + " " + str(os.getpid()))
        return {"loss": 0.0}

    cells = [ToyCell(f"cell-{seed}", seed) for seed in range(4)]
    (tmp_path / "inputs").mkdir()
    run_grid(
        {Path("tables"): cells},
        Path("tables"),
        tmp_path / "out",
        tmp_path / "checkpoints",
        lambda cell: (tmp_path / "inputs",),
        run_in_child,
        lambda metrics: "done",
        lambda cell, digest: cell.name,
        CellStore(None),
        workers=2,
        environment=lambda worker: {"FEDREPRO_TEST_WORKER": f"worker-{worker}"},
    )
    seen = {tuple(p.read_text().split()) for p in (tmp_path / "out" / "tables").glob("*/seen")}
    assert {value for value, _ in seen} == {"worker-0", "worker-1"}
    assert all(len({value for value, p in seen if p == pid}) == 1 for _, pid in seen), "one value a process"


@pytest.mark.parametrize(
    "workers_env, expected_workers, share, second_gpu",
    [
        (None, 2, 1.0, "1"),  # 2 cores, 2 GPUs with room for 2 cells each: a cell a GPU
        ("4", 4, 0.5, "1"),  # four workers asked for: two cells on each GPU, half a GPU each
        ("3", 3, 0.5, "1"),
    ],
)
def test_a_gpu_stage_puts_one_worker_on_each_gpu_and_more_where_they_fit(
    monkeypatch, workers_env, expected_workers, share, second_gpu
):
    from fedrepro import grid as grids

    monkeypatch.setattr(grids, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(grids, "memory_bytes", lambda device: 80 * 2**30)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    if workers_env is None:
        monkeypatch.delenv(WORKERS_ENV, raising=False)
    else:
        monkeypatch.setenv(WORKERS_ENV, workers_env)
    placed = grids.placement(1, "engine", "cuda", cell_bytes=lambda: 30 * 2**30)
    assert placed.workers == expected_workers and placed.share == share
    assert placed.environment(0)["CUDA_VISIBLE_DEVICES"] == "0"
    assert placed.environment(1)["CUDA_VISIBLE_DEVICES"] == second_gpu
    assert placed.resources() == {"num_cpus": 1, "num_gpus": share}


def test_a_cell_too_big_for_two_on_a_gpu_gets_a_whole_one_and_cpu_cells_ask_for_no_gpu(monkeypatch):
    from fedrepro import grid as grids

    monkeypatch.setattr(grids, "visible_gpus", lambda: ["3"])
    monkeypatch.setattr(grids, "memory_bytes", lambda device: 80 * 2**30)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    placed = grids.placement(1, "engine", "cuda", cell_bytes=lambda: 50 * 2**30)
    assert placed.workers == 1 and placed.environment(0) == {"CUDA_VISIBLE_DEVICES": "3", "FEDREPRO_GPU_SHARE": "1"}
    pinned = grids.placement(1, "engine", "cuda:1", cell_bytes=lambda: 10 * 2**30)
    assert pinned.workers == 8 and "CUDA_VISIBLE_DEVICES" not in pinned.environment(0), "cuda:N: every cell on GPU N"
    on_cpu = grids.placement(2, "engine", "cpu")
    assert on_cpu.workers == 8 and on_cpu.environment(0) == {} and on_cpu.resources()["num_gpus"] == 0.0


def test_a_flower_stage_refuses_a_ray_cluster_in_one_line(monkeypatch):
    from fedrepro import grid as grids

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    with pytest.raises(ConfigError, match=r"train\.runtime = 'flower-simulation'.*RAY_ADDRESS"):
        grids.placement(1, "flower-simulation")
    assert grids.placement(1, "engine").workers >= 1
