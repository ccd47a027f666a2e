"""A stage's grid on a Ray cluster (``$RAY_ADDRESS``, ``fedrepro.cluster``): two nodes on loopback, each with its own
temporary folder as if it were another machine, train the cells sent to them (inputs shipped, outputs and
checkpoints brought back by content) to the very bytes that the cells trained here give."""

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fedrepro.cell_store import CellStore
from fedrepro.cluster import NODE_INPUTS
from fedrepro.errors import ConfigError
from fedrepro.cluster import CLUSTER_ENV
from fedrepro.grid import run_grid
from fedrepro.jobs import SCORED
from test_grid import ToyCell, train_toy

RAY = Path(sys.executable).parent / "ray"
NODES = ("head", "worker1")
"""The cluster's nodes, each offering a resource of its name: a cell asks for its node's to be sent there."""
UP_SECONDS = 120.0
CELLS = [ToyCell(f"cell-{seed}", seed) for seed in range(4)]


def input_folder(cell: ToyCell) -> Path:
    """A cell's input folder, one of two sets, relative to the stage's working directory as a stage names it."""
    return Path("inputs") / ("even", "odd")[cell.seed % 2]


def train_on_inputs(cell: ToyCell, out: Path, checkpoint_dir: Path, digest: str) -> dict:
    """``train_toy`` with its seed shifted by its input folder's ``shift``, which it copies into its outputs: a cell
    that did not find its inputs on its node fails, and one that found others gives other bytes."""
    shift = (input_folder(cell) / "shift").read_text()
    metrics = train_toy(ToyCell(cell.name, cell.seed + int(shift)), out, checkpoint_dir, digest)
    (out / "shift").write_text(shift)
    return metrics


def noting_the_node(notes: Path, cell: ToyCell, out: Path, checkpoint_dir: Path, digest: str) -> dict:
    """``train_on_inputs``, noting in ``notes`` (outside the cell's folders: the test's nodes share this machine's
    disk) the node that trained the cell and whether it found a checkpoint to resume."""
    import ray

    note = {"node": ray.get_runtime_context().get_node_id(), "resumed": Path(checkpoint_dir).exists()}
    (notes / cell.name).write_text(json.dumps(note))
    return train_on_inputs(cell, out, checkpoint_dir, digest)


def failing(cell: ToyCell, out: Path, checkpoint_dir: Path, digest: str) -> dict:
    if cell.seed == 2:
        print("about to fail", file=sys.stderr)
        raise ValueError("boom")
    return train_on_inputs(cell, out, checkpoint_dir, digest)


def on_its_node(cell: ToyCell) -> dict:
    """Even cells on the head, odd ones on the worker."""
    return {"num_cpus": 1, "resources": {NODES[cell.seed % 2]: 1}}


def grid(root: Path, run_cell, workers: int = 1, resources=None) -> dict[str, bytes]:
    """The cells trained in ``root`` as a stage trains them, with its paths relative to its working directory; every
    file of their outputs and checkpoints."""
    for name, shift in (("even", "10"), ("odd", "20")):
        (root / "inputs" / name).mkdir(parents=True, exist_ok=True)
        (root / "inputs" / name / "shift").write_text(shift)
    with contextlib.chdir(root):
        run_grid(
            {Path("tables"): CELLS},
            Path("tables"),
            Path("out"),
            Path("checkpoints"),
            lambda cell: (input_folder(cell),),
            run_cell,
            lambda metrics: f"loss {metrics['loss']:.3f}",
            lambda cell, digest: f"{cell.name}-{digest}",
            CellStore(root / "store"),
            workers=workers,
            resources=resources,
        )
    return {
        str(path.relative_to(root)): path.read_bytes()
        for folder in ("out", "checkpoints")
        for path in sorted((root / folder).rglob("*"))
        if path.is_file()
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_node(folder: Path, *arguments: str) -> subprocess.Popen:
    """A Ray node in a process group of its own (``ray start --block`` keeps its processes as its children), with its
    own temporary folder (where the cells it runs unpack their inputs), importing this test's modules."""
    (folder / "tmp").mkdir(parents=True)
    tests = str(Path(__file__).parent)
    environment = {
        **os.environ,
        "TMPDIR": str(folder / "tmp"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_worker_niceness": "0",  # Ray's default, 15, starves the workers beside a busy process
        "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])),
    }
    with (folder / "node.log").open("w") as log:
        return subprocess.Popen(
            [
                str(RAY),
                "start",
                "--block",
                "--num-cpus=1",
                "--node-ip-address=127.0.0.1",
                "--disable-usage-stats",
                f"--temp-dir={folder / 'ray'}",
                *arguments,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )


def wait_until_up(node: subprocess.Popen, folder: Path) -> None:
    deadline = time.monotonic() + UP_SECONDS
    while "Ray runtime started" not in (folder / "node.log").read_text():
        if node.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the Ray node in {folder} did not start:\n{(folder / 'node.log').read_text()[-3000:]}")
        time.sleep(0.2)


def stop_nodes(nodes: list[subprocess.Popen]) -> None:
    """Their processes only, by their process groups (``ray stop`` would stop every Ray of this user): asked to end
    all at once, then killed where they have not within 30 s."""
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait()


@pytest.fixture(scope="module")
def cluster():
    """The address of a cluster of two nodes, ``NODES``, one CPU each, and its folder (a folder per node). The folder
    is short: Ray's socket paths under it must fit in 107 bytes. Both nodes are up before a test starts: a cell that
    asks for the resource of a node that never joined would wait for it for ever."""
    folder, port, nodes = Path(tempfile.mkdtemp(prefix="fr-ray-")), free_port(), []
    try:
        nodes.append(
            start_node(
                folder / "head", "--head", f"--port={port}", "--include-dashboard=false", '--resources={"head": 1}'
            )
        )
        wait_until_up(nodes[0], folder / "head")
        nodes.append(start_node(folder / "worker1", f"--address=127.0.0.1:{port}", '--resources={"worker1": 1}'))
        wait_until_up(nodes[1], folder / "worker1")
        yield f"127.0.0.1:{port}", folder
    finally:
        stop_nodes(nodes)
        shutil.rmtree(folder, ignore_errors=True)


def test_cells_on_a_ray_cluster_give_the_bytes_they_give_here(cluster, tmp_path, monkeypatch, capfd):
    """Every file of the outputs and checkpoints as in process and in forked children, one cell resumed on its node
    from the checkpoint shipped with it; the cells on the nodes they asked for, each node unpacking its inputs once."""
    address, nodes = cluster
    assert grid(tmp_path / "forked", train_on_inputs, workers=2) == grid(tmp_path / "fresh", train_on_inputs)
    for root in ("here", "cluster"):  # with cell-1's finished run, not yet scored, in its checkpoint folder to resume
        shutil.copytree(
            tmp_path / "fresh" / "checkpoints" / "tables" / "cell-1",
            tmp_path / root / "checkpoints" / "tables" / "cell-1",
            ignore=shutil.ignore_patterns(SCORED),
        )
    in_process = grid(tmp_path / "here", train_on_inputs)
    notes = tmp_path / "notes"
    notes.mkdir()
    capfd.readouterr()
    monkeypatch.setenv(CLUSTER_ENV, address)
    on_cluster = grid(tmp_path / "cluster", functools.partial(noting_the_node, notes), resources=on_its_node)
    assert on_cluster == in_process, "the outputs and checkpoints, file for file and byte for byte"
    err = capfd.readouterr().err
    assert err.count("sent cell-") == 4 and "(num_cpus 1, num_gpus 0, resources {'head': 1})" in err
    assert "[4/4] cell-" in err and "fedprox rounds" not in err, "the cells' progress bars stay on their nodes"
    ran = {note.name: json.loads(note.read_text()) for note in notes.iterdir()}
    assert ran["cell-0"]["node"] == ran["cell-2"]["node"] != ran["cell-1"]["node"] == ran["cell-3"]["node"]
    assert [name for name, note in sorted(ran.items()) if note["resumed"]] == ["cell-1"]
    unpacked = {node: [path.name for path in (nodes / node / "tmp" / NODE_INPUTS).iterdir()] for node in NODES}
    assert all(len(sets) == 1 for sets in unpacked.values()) and unpacked["head"] != unpacked["worker1"], (
        "each node unpacked the one set of inputs its cells read, once, in a folder of its own"
    )
    assert not [path for node in NODES for path in (nodes / node / "tmp").glob("fedrepro-cell-*")], (
        "the cells' scratch folders are gone"
    )
    # scored before: the driver copies the outputs from the checkpoints, and sends nothing (nor joins the cluster)
    monkeypatch.setenv(CLUSTER_ENV, f"127.0.0.1:{free_port()}")
    shutil.rmtree(tmp_path / "cluster" / "out")
    assert grid(tmp_path / "cluster", train_on_inputs) == in_process
    assert capfd.readouterr().err.count("outputs as scored before") == 4


def test_a_failing_cell_on_the_cluster_stops_the_stage_naming_the_cell(cluster, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(CLUSTER_ENV, cluster[0])
    with pytest.raises(ValueError, match="boom") as raised:
        grid(tmp_path, failing)
    assert any("in cell cell-2's process" in note and "Traceback" in note for note in raised.value.__notes__)
    err = capfd.readouterr().err
    assert "sent cell-2 to the Ray cluster (num_cpus 1, num_gpus 0)\n" in err, "what a cell asks for by default"
    assert "--- cell-2's last lines:\nabout to fail" in err
    assert not (tmp_path / "out" / "tables").exists(), "the stage's output is all or nothing"


def test_an_address_where_no_cluster_answers_is_one_line_naming_it(tmp_path, monkeypatch):
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv(CLUSTER_ENV, address)
    with pytest.raises(ConfigError, match=rf"^\$RAY_ADDRESS = '{address}': no Ray cluster answers there ") as raised:
        grid(tmp_path, train_on_inputs)
    assert "\n" not in str(raised.value)


def test_a_path_that_cannot_travel_to_a_node_is_refused_before_anything_is_sent(tmp_path, monkeypatch):
    monkeypatch.setenv(CLUSTER_ENV, f"127.0.0.1:{free_port()}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inputs").mkdir()
    with pytest.raises(ConfigError, match=rf"^cell cell-0: {tmp_path / 'inputs'} is not inside the working directory"):
        run_grid(
            {Path("tables"): CELLS[:1]},
            Path("tables"),
            Path("out"),
            Path("checkpoints"),
            lambda cell: (tmp_path / "inputs",),
            train_on_inputs,
            str,
            lambda cell, digest: cell.name,
            CellStore(None),
        )
