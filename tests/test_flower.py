"""The engine's algorithms on Flower: identical runs in both runtimes, private state only on the nodes, what
crosses the network audited by the same channel, a killed server resumed exactly, bad uploads refused, a client's
diverged training stopping the run as in the engine.

The Flower runs happen in a subprocess (``flower_cells.py``) inside a loopback-only network namespace: one for the
cases compared with the engine, one for the fault cases.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from fedrepro.errors import ConfigError, FederationError
from fedrepro.fl.engine import FIT, Engine
from fedrepro.fl.flower.common import STORED, StoreSignal
from fedrepro.fl.flower.node_state import NodeState, NodeStateStore, counted_round, decode
from fedrepro.fl.flower.ray_backend import KeptRayBackend, kept_ray_backend, raybackend
from fedrepro.fl.flower.ray_head import stage_ray_address
from fedrepro.fl.flower.supernode import REFUSED_EXIT
from fedrepro.fl.runtime import build_runtime
from flower_cells import (
    CRASHES,
    DEPLOY_CASES,
    DIVERGES,
    FAULT_CASES,
    KILL_CASE,
    KILL_ROUNDS,
    NODE_UNAVAILABLE,
    QA_SIZES,
    RESUME_CASE,
    SHARED_CASE,
    SHARED_CELLS,
    SILO_CASES,
    STAGE_KILL_CASE,
    STAGE_KILL_POINTS,
    STAGE_RAY_CASE,
    STAGE_RAY_CELLS,
    STAGE_SILO_CASES,
    SUPERLINK_KILL_CASE,
    all_cases,
    federated_algorithms,
    recipe,
)
from loopback import run_on_loopback

HERE = Path(__file__).resolve().parent
TRACED = "connect,sendto,execve"
TRACE_KEY = "syscalls trace"
INET_ADDRESS = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')
EQUIVALENCE_CASES = [case for case in all_cases() if case.split("/")[0] in ("relation", "qa")]


# ----- without Flower ----------------------------------------------------------------------------------------
def test_node_state_keeps_the_state_a_round_started_from_and_survives_a_restart(tmp_path):
    store = NodeStateStore(tmp_path / "node", "run-1")
    assert store.latest_until(5) is None
    first = store.save(NodeState(0, {"param/head.weight": torch.ones(2, 3)}), started_from=-1)
    store.save(NodeState(2, {"param/head.weight": torch.full((2, 3), 2.0)}), started_from=0)
    assert store.latest_until(1).round_index == 0, "a replayed round 2 starts from what the client held before it"
    assert store.latest_until(2).round_index == 2
    store.save(NodeState(3, {"param/head.weight": torch.zeros(2, 3)}), started_from=0)  # the server never counted 2
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == [
        "round-000000.safetensors",
        "round-000003.safetensors",
    ]
    store.save(NodeState(4, {"param/head.weight": torch.zeros(2, 3)}), started_from=3)
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == [
        "round-000003.safetensors",
        "round-000004.safetensors",
    ]
    reopened = NodeStateStore(tmp_path / "node", "run-1")  # a node restarted: only its directory is left
    assert torch.equal(reopened.latest_until(3).tensors["param/head.weight"], torch.zeros(2, 3))
    state, fingerprint = decode(first)
    assert fingerprint == "run-1" and state.round_index == 0
    assert torch.equal(state.tensors["param/head.weight"], torch.ones(2, 3))
    assert NodeStateStore(tmp_path / "node", "run-2").latest_until(9) is None, "another run's state is never used"


def test_node_state_file_is_the_bytes_it_returns(tmp_path):
    store = NodeStateStore(tmp_path, "run")
    blob = store.save(NodeState(1, {"state/control/w": torch.arange(4.0)}), started_from=-1)
    assert (tmp_path / "round-000001.safetensors").read_bytes() == blob


def test_the_round_a_node_goes_on_from_is_the_last_the_server_counted():
    history = [
        {"round": 1, "clients": ["a", "b"]},
        {"round": 2, "clients": ["a"], "missed": {"b": "no reply"}},
        {"round": 3, "clients": ["c"], "missed": {"a": "rejected: client a: ..."}},
    ]
    assert [counted_round(history, c) for c in "abcd"] == [1, 0, 2, -1]


def test_a_node_whose_reply_the_server_never_counted_goes_on_as_if_it_had_not_trained(tmp_path, monkeypatch):
    """A reply that arrived after the server closed the round (or that it refused) left the node a round ahead of
    the federation. Its next round must start from the state of the last round the server counted, so that it is
    exactly the round a node that never got the uncounted message trains: SCAFFOLD's c_k, the change it uploads
    and the state it keeps all equal. (Starting from the newest file instead, a late or refused reply, or a ClientApp
    outliving its killed SuperNode, left c off the mean of the c_k: the kill drill once ended 0.99 off.)"""
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedrepro.fl.flower import messages as m
    from fedrepro.fl.flower.client import NodeHandlers

    for field in ("_task_id", "_run_id", "_node_id"):  # what Flower sets in a running ClientApp
        monkeypatch.setattr(TaskIdentity, field, 1)
    cell = recipe("relation/scaffold", rounds=3)
    server = build_runtime(cell, "engine", tmp_path / "server", progress=False)
    _, outgoing = server.open_round(0)  # the global weights and SCAFFOLD's c as the server sends them

    def node(root: Path):
        handlers = NodeHandlers(cell, nodes_root=root)
        context = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={})

        def train(round_index: int, counted: int) -> dict[str, torch.Tensor]:
            config = ConfigRecord({m.ROUND: round_index, m.FINGERPRINT: cell.fingerprint, m.COUNTED: counted})
            message = Message(
                RecordDict({m.TENSORS: m.to_record(outgoing), m.CONFIG: config}),
                dst_node_id=1,
                message_type=MessageType.TRAIN,
            )
            return m.to_tensors(handlers.train(message, context).content[m.TENSORS])

        return train

    late, fresh = node(tmp_path / "late"), node(tmp_path / "fresh")
    first = late(0, -1)
    assert any(name.startswith("control/") and bool(t.abs().max() > 0) for name, t in first.items()), "c_k moved"
    went_on, never_had_it = late(1, -1), fresh(1, -1)
    assert went_on.keys() == never_had_it.keys()
    assert all(torch.equal(went_on[name], never_had_it[name]) for name in went_on)
    client = server.task.client_ids[0]
    kept = NodeStateStore(tmp_path / "late" / client, cell.fingerprint)
    assert kept.newest_round_until(9) == 1 and kept.latest_until(0) is None, "the uncounted first round's state is gone"


def test_a_silo_node_given_another_clients_directory_refuses_naming_both(tmp_path, monkeypatch):
    """A SuperNode started for one client with another's data-dir would train the wrong client's rows under its name."""
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from flwr.app import Context, RecordDict

    from fedrepro.errors import FedreproError
    from fedrepro.fl.flower import client as node
    from toy import write_relation_silos

    write_relation_silos(tmp_path)
    cell = recipe("silo-relation/fedavg", silos=str(tmp_path))
    monkeypatch.setattr(node, "_trainers", {})
    config = {"client-id": "client_00", "data-dir": str(tmp_path / "client_01")}
    context = Context(run_id=1, node_id=1, node_config=config, state=RecordDict(), run_config={})
    with pytest.raises(
        FedreproError,
        match=rf"node of client client_00: its data-dir {tmp_path / 'client_01'} holds "
        r"the data of \['client_01'\]",
    ):
        node.NodeHandlers(cell).trainer(context, "client_00")
    assert node.NodeHandlers(cell).trainer(context, "client_01").task.client_ids == ["client_01"]


def test_methods_that_share_nothing_train_in_process_on_every_runtime(tmp_path):
    individual = recipe("qa/individual")
    assert type(build_runtime(individual, "flower-simulation", tmp_path, progress=False)) is Engine


def test_waiting_for_a_flower_run_names_its_timeout_and_a_failed_runs_log(monkeypatch):
    """``wait_for_run`` (the deployment's and the several-hosts script's wait): a run past its timeout raises naming
    the setting; one that ended otherwise than completed raises with its log; Flower is asked at once when the last
    checkpoint looks written, else only every STATUS_EVERY_SECONDS."""
    from fedrepro.errors import FederationError
    from fedrepro.fl.flower import federation

    monkeypatch.setattr(federation.time, "sleep", lambda _: None)
    asked: list[str] = []
    statuses = iter(["running", "finished:completed", "finished:completed"])

    def listing() -> dict:
        asked.append("ls")
        return {"run-id": 7, "status": next(statuses)}

    entry = federation.wait_for_run("7", listing, lambda: "", 60, looks_done=lambda: True)
    assert entry["status"] == "finished:completed" and asked == ["ls"] * 3
    asked.clear()
    with pytest.raises(FederationError, match=r"Flower run 7 ended finished:failed: .*ClientApp raised"):
        federation.wait_for_run(
            "7", lambda: {"status": "finished:failed"}, lambda: "log ... ClientApp raised", 60, looks_done=lambda: True
        )
    with pytest.raises(
        FederationError,
        match=r"timed out after 0\.01 s waiting for Flower run 7 to end \("
        r"train\.run_timeout = 0\.01 s; .* resumes",
    ):
        federation.wait_for_run("7", listing, lambda: "", 0.01, timeout_name="train.run_timeout = 0.01 s")
    assert asked == [], "without a final checkpoint, Flower is not asked before STATUS_EVERY_SECONDS"


@pytest.mark.parametrize("progress", [False, True])
def test_a_deployment_sees_its_last_round_checkpointed_whether_or_not_its_progress_bar_shows(tmp_path, progress):
    """The deployment's ``looks_done`` counts the server's checkpointed rounds, not its bar's: a disabled bar
    (``progress=False``: the tests, the benches) never moves, and a run watched through it waited out Flower's status
    poll (up to 10 s) after its last round."""
    from tqdm import tqdm

    from fedrepro.fl.checkpoint import LATEST
    from fedrepro.fl.flower.deployment import watch_rounds
    from fedrepro.io import write_json

    with tqdm(total=3, disable=not progress) as bar:
        last_round_checkpointed = watch_rounds(tmp_path, 3, bar)
        assert not last_round_checkpointed()
        (tmp_path / LATEST).mkdir()
        write_json(tmp_path / LATEST / "state.json", {"next_round": 2})
        assert not last_round_checkpointed()
        write_json(tmp_path / LATEST / "state.json", {"next_round": 3})
        assert last_round_checkpointed()
        assert bar.n == (3 if progress else 0)


def test_an_unknown_runtime_names_the_param_and_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"train.runtime = 'ray': allowed \['engine', 'flower-simulation'"):
        build_runtime(recipe("qa/fedavg"), "ray", tmp_path)


# ----- on Flower ---------------------------------------------------------------------------------------------
def flower_cells(folder: Path, cases: list[str], timeout: float, traced: bool = False) -> dict:
    """``cases`` (all: none given), in one loopback-only subprocess (Ray starts once per Flower run). ``traced``: under
    ``strace``, every process it starts included, recording each connect, each send to an address and each program
    started (``TRACED``), in ``folder/syscalls.trace``, whose path the results' ``TRACE_KEY`` holds."""
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")
    out = folder / "results.json"
    tracer = []
    if traced:
        if shutil.which("strace") is None:
            pytest.fail("the Flower tests record every connection with `strace` (apt-get install strace)")
        tracer = ["strace", "-f", "--seccomp-bpf", "-qq", "-s", "256", "-e", f"trace={TRACED}"]
        tracer += ["-o", str(folder / "syscalls.trace")]
    run_on_loopback(
        [
            *tracer,
            sys.executable,
            str(HERE / "flower_cells.py"),
            "--out",
            str(out),
            "--work",
            str(folder / "work"),
            *(["--only", *cases] if cases else []),
        ],
        timeout=timeout,
    )
    results = json.loads(out.read_text())
    if traced:
        results[TRACE_KEY] = str(folder / "syscalls.trace")
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case of ``all_cases`` in both runtimes, every connection recorded."""
    return flower_cells(tmp_path_factory.mktemp("flower"), [], timeout=1500, traced=True)


@pytest.fixture(scope="module")
def node_kill(tmp_path_factory):
    """The node-kill drill alone: were it to fail, only its own test fails."""
    return flower_cells(tmp_path_factory.mktemp("kill"), [KILL_CASE], timeout=900)


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """The fault cases alone, so their tests need none of the other runs."""
    return flower_cells(
        tmp_path_factory.mktemp("faults"), [*FAULT_CASES, SUPERLINK_KILL_CASE, STAGE_KILL_CASE], timeout=900
    )


def test_every_federated_algorithm_of_the_registry_is_checked():
    checked = {case.split("/")[1] for case in EQUIVALENCE_CASES if case.startswith("relation/")}
    assert checked == set(federated_algorithms())


def expected_flower_messages(case: str, engine: dict) -> list:
    """The engine's channel log plus what only a network needs: when each client scores its own model on its node
    (the QA cell), the server sends it the global shared weights after every round, once per split it scores:
    its training data (the engine's FIT, for the health rule) and valid. In the engine those weights are already in
    the clients' memory."""
    if "qa/" not in case:
        return engine["messages"]
    expected = []
    for round_index in range(len(engine["history"])):
        this_round = [m for m in engine["messages"] if m[0] == round_index]
        upload = next(m for m in this_round if m[2] == "server")
        expected += this_round + [
            [round_index, "server", client, upload[3], upload[4]] for _split in (FIT, "valid") for client in QA_SIZES
        ]
    return expected


def test_a_waiter_on_the_message_store_wakes_as_a_message_is_stored_not_at_its_next_look():
    """SS-VFNAS's parties exchange several times a step: waiting out a poll on each exchange cost the embedded
    ssvfnas_table on the simulation about a quarter of its time (135.5 s against 103.8 s)."""
    signal = StoreSignal()
    seen = signal.count
    threading.Timer(0.05, signal.signal).start()
    started = time.monotonic()
    signal.wait_after(seen, timeout=30)
    assert time.monotonic() - started < 10 and signal.count == seen + 1

    seen = signal.count
    signal.signal()  # stored between reading the count and waiting: not missed
    started = time.monotonic()
    signal.wait_after(seen, timeout=30)
    assert time.monotonic() - started < 10

    started = time.monotonic()
    signal.wait_after(signal.count, timeout=0.2)  # nothing stored (a deployment's store is in another process)
    assert time.monotonic() - started >= 0.2


def test_during_a_simulated_run_the_message_store_signals_each_message_it_stores_and_not_after(monkeypatch):
    from flwr.server.superlink.linkstate import InMemoryLinkState

    stored = []
    monkeypatch.setattr(InMemoryLinkState, "store_message_ins", lambda state, message: stored.append(message) or "in")
    monkeypatch.setattr(InMemoryLinkState, "store_message_res", lambda state, message: stored.append(message) or "res")
    flowers = InMemoryLinkState.store_message_ins, InMemoryLinkState.store_message_res
    with kept_ray_backend():
        before = STORED.count
        assert InMemoryLinkState.store_message_ins(None, "to a node") == "in"
        assert InMemoryLinkState.store_message_res(None, "a reply") == "res"
        assert STORED.count == before + 2 and stored == ["to a node", "a reply"]
    assert (InMemoryLinkState.store_message_ins, InMemoryLinkState.store_message_res) == flowers


def test_once_a_simulated_run_stops_its_runtimes_threads_stop_waiting_on_their_queues():
    """Flower's simulation waits for its worker and reply threads, each blocked up to 1 s on a queue before it looks
    whether the run stopped (every simulated run ended about 1 s after its work): during a run those queues are the
    run's, and the feed, once the run stops, wakes whoever waits on them."""
    from queue import Empty

    from flwr.server.superlink.fleet.vce import vce_api

    flowers_queue = vce_api.Queue
    with kept_ray_backend():
        queues = [vce_api.Queue() for _ in range(2)]
        outcomes = []

        def wait(queue):
            try:
                outcomes.append(queue.get(timeout=60))
            except Empty:
                outcomes.append("woken empty")

        waiters = [threading.Thread(target=wait, args=(queue,)) for queue in queues]
        for waiter in waiters:
            waiter.start()
        queues[0].put("a message")  # still handed over as a plain queue's get would
        stop = threading.Event()
        stop.set()
        vce_api.add_messages_to_queue(None, queues[0], {}, stop)  # the feed of a run that has stopped
        for waiter in waiters:
            waiter.join(timeout=10)
        assert not any(waiter.is_alive() for waiter in waiters)
        assert sorted(outcomes) == ["a message", "woken empty"]
        with pytest.raises(Empty):
            queues[1].get(timeout=60)  # a stopped queue's get does not wait for its timeout
    assert vce_api.Queue is flowers_queue


def test_no_process_of_a_simulated_or_deployed_run_connects_outside_loopback_or_starts_a_dashboard(runs):
    """Every connect and addressed send of every process the Flower runs started (Ray's head, agents and workers, the
    SuperLink, SuperNodes, SuperExecs, ServerApps, ClientApps, the Flower CLI) went to loopback. Seen failing before
    ``ray_head.ray_on_loopback_only`` and Flower's update check off: Ray's dashboard process asked 169.254.169.254 and
    looked up metadata.google.internal, Ray looked up its node address by a UDP socket to 8.8.8.8:53, and each ``flwr``
    call looked up api.flower.ai (inside this namespace they failed; on a machine with a network they would not)."""
    trace = Path(runs[TRACE_KEY]).read_text()
    addresses = collections.Counter(
        v4 or v6 for line in trace.splitlines() for v4, v6 in INET_ADDRESS.findall(line) if "AF_INET" in line
    )
    assert addresses, "the trace recorded no connection at all: it did not follow the run's processes"
    outside = {
        address: count
        for address, count in addresses.items()
        if not ipaddress.ip_address(address).is_loopback
        and not (address.startswith("::ffff:") and ipaddress.ip_address(address[7:]).is_loopback)
    }
    assert not outside, f"connections outside loopback (address: count): {outside}"
    programs = [line for line in trace.splitlines() if "execve(" in line and "dashboard/dashboard.py" in line]
    assert not programs, f"a Ray dashboard process started: {programs[0][:300]}"


def test_every_simulated_cell_of_a_process_ran_on_the_kept_ray_workers(runs):
    """Ray and its worker start once per process, not per cell (issue 19), one worker for the cells' one thread (a
    round's clients train one after another, as in the engine), and the identical runs below were on it."""
    workers = {case: tuple(runs[case]["ray_workers"]) for case in EQUIVALENCE_CASES}
    assert len(set(workers.values())) == 1 and len(next(iter(workers.values()))) == 1, workers


@pytest.fixture(scope="module")
def stage_ray_run(tmp_path_factory):
    """Two cells of one seed at once in forked children on one stage's Ray, in a process of their own (forking a
    process whose Ray is up, as ``runs``' is, would copy it half made)."""
    return flower_cells(tmp_path_factory.mktemp("stage-ray"), [STAGE_RAY_CASE], timeout=600)[STAGE_RAY_CASE]


def test_a_stages_forked_cells_join_its_one_ray_and_each_equals_the_engine(stage_ray_run):
    """One Ray per stage (issue 19): both children joined the stage's cluster (one address, sized as the stage asked,
    a job each) instead of starting their own, ran bit-identical to the engine, and nothing of it outlived the stage."""
    assert not stage_ray_run["forked_with_ray"]
    cells = [stage_ray_run[case] for case in STAGE_RAY_CELLS]
    assert len({cell["cluster"] for cell in cells}) == 1 and len({cell["job"] for cell in cells}) == 2, cells
    assert {cell["cpus"] for cell in cells} == {2.0}
    assert [cell["worker_niceness"] for cell in cells] == [cell["niceness"] for cell in cells], (
        "a ClientApp's worker runs at its cell's priority (Ray's default, 15, starved it beside any busy process)"
    )
    for case, cell in zip(STAGE_RAY_CELLS, cells):
        for key in ("history", "global", "clients", "messages"):
            assert cell["flower-simulation"][key] == cell["engine"][key], (case, key)
    assert not stage_ray_run["folder_left"] and not stage_ray_run["processes_left"]
    assert not stage_ray_run["cluster_answers"], "the stage's Ray stopped with it"


def test_joining_ray_names_its_subscriptions_from_the_os_and_leaves_the_cells_draws_as_they_were(monkeypatch):
    """Ray names a driver's subscriptions to its cluster with Python's ``random``, which every cell seeds: two cells of
    one seed on a stage's Ray took each other's replies under one name and polled in a loop, a core's worth of CPU
    (issue 19). Joining draws from the OS, and the cell's own draws go on as if it had not joined."""
    drawn = []
    monkeypatch.setattr(raybackend.RayBackend, "init_ray", lambda self, config: drawn.append(random.getrandbits(64)))
    random.seed(0)
    seeded = random.getrandbits(64)
    random.seed(0)
    KeptRayBackend.init_ray(KeptRayBackend.__new__(KeptRayBackend), {})
    assert drawn and drawn[0] != seeded
    assert random.getrandbits(64) == seeded


def test_a_ray_joined_or_started_for_flower_is_on_loopback_while_it_starts_and_the_process_is_as_before_after(
    monkeypatch,
):
    """``ray_on_loopback_only`` holds only around the ``ray.init``: a later ``ray start`` of a cluster of several
    machines from the same process (a test's, ``fedrepro.cluster``'s) is refused under Ray's loopback-only switch."""
    from ray._private import node, ray_constants

    from fedrepro.fl.flower.ray_head import LOOPBACK_RAY_ENV

    monkeypatch.delenv(LOOPBACK_RAY_ENV, raising=False)
    seen = []

    def init_ray(self, config):
        seen.append((os.environ.get(LOOPBACK_RAY_ENV), ray_constants.ENABLE_RAY_CLUSTER))
        probe = type("Probe", (), {})()
        node.Node.start_api_server(probe, include_dashboard=False, raise_on_failure=True)  # starts nothing
        seen.append(probe._webui_url)

    monkeypatch.setattr(raybackend.RayBackend, "init_ray", init_ray)
    before = ray_constants.ENABLE_RAY_CLUSTER, node.Node.start_api_server
    KeptRayBackend.init_ray(KeptRayBackend.__new__(KeptRayBackend), {})
    assert seen == [("0", False), None]
    assert LOOPBACK_RAY_ENV not in os.environ
    assert (ray_constants.ENABLE_RAY_CLUSTER, node.Node.start_api_server) == before


def test_a_cell_waiting_for_a_stages_ray_that_ended_says_so_with_its_last_lines(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "pid").write_text(ended.stdout.strip())
    (tmp_path / "head.log").write_text("ValueError: no room for the object store\n")
    with pytest.raises(FederationError, match=r"(?s)the stage's Ray .* ended before it was up:.*no room for the"):
        stage_ray_address(tmp_path, timeout=30)


def test_a_cell_waits_for_a_stages_ray_no_longer_than_its_timeout(tmp_path):
    (tmp_path / "pid").write_text(str(os.getpid()))  # running, never up
    started = time.monotonic()
    with pytest.raises(FederationError, match=r"the stage's Ray .* is not up after 0 s"):
        stage_ray_address(tmp_path, timeout=0.2)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("case", EQUIVALENCE_CASES)
def test_engine_and_flower_simulation_give_identical_runs(runs, case):
    """Bit-identical, not just close: both runtimes run the same functions on the same seeds and thread count,
    tensors cross Flower as exact float32 bytes, and the server aggregates the uploads in the sampled order."""
    engine, flower = runs[case]["engine"], runs[case]["flower-simulation"]
    assert flower["history"] == engine["history"]
    assert flower["global"] == engine["global"]
    assert flower["clients"] == engine["clients"], "every client's private state, read back from its node"
    assert flower["messages"] == expected_flower_messages(case, engine)


@pytest.mark.parametrize("case", EQUIVALENCE_CASES)
def test_private_state_stays_on_the_nodes_and_never_crosses(runs, case):
    flower = runs[case]["flower-simulation"]
    crossed = {name for message in flower["messages"] for name in message[3]}
    assert not crossed & set(flower["private"]), "no private parameter in any Flower message"
    assert flower["server_checkpoint_clients"] == [], "the server's checkpoint holds no client state"
    scalar_names = {name for message in flower["scalars"] for name in message[3]}
    # what a node's scores of its own model say: accuracy on valid, and loss / samples on its training data (FIT)
    assert scalar_names <= {"client_id", "num_samples", "train_loss", "accuracy", "loss", "samples"}, scalar_names
    identified = [m[1] for m in flower["scalars"] if m[0] == -1]
    assert len(identified) == len(set(identified)) == 3, "each node said once which client it serves"


def test_a_killed_server_resumes_from_its_checkpoint_to_the_uninterrupted_run(runs):
    """SCAFFOLD keeps state on both sides (the server's variate in its checkpoint, each client's on its node), so
    the resumed run only matches if both are restored exactly."""
    resume = runs[RESUME_CASE]
    assert resume["resumed_from_round"] == 1
    for key in ("history", "global", "clients", "messages"):
        assert resume["resumed"][key] == resume["straight"][key], key


def test_an_upload_that_crossed_flower_is_checked_as_the_engine_checks_it():
    """The server refuses what the engine refuses (test_engine: names, shapes, NaN/Inf) with the same function; an
    upload that crossed as Flower arrays passes it unchanged, and a NaN survives the crossing to be refused."""
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from fedrepro.channel import upload_problem
    from fedrepro.fl.flower import server
    from fedrepro.fl.flower.messages import to_record, to_tensors

    assert server.upload_problem is upload_problem
    tensors = {"encoder.w": torch.zeros(2, 3), "head.b": torch.zeros(1)}
    shared = ["encoder.w", "head.b"]
    good = {"encoder.w": torch.ones(2, 3), "head.b": torch.ones(1)}
    assert upload_problem("a", to_tensors(to_record(good)), tensors, shared) is None
    poisoned = to_tensors(to_record({**good, "head.b": torch.tensor([float("nan")])}))
    assert (
        upload_problem("b", poisoned, tensors, shared)
        == "client b: upload field 'head.b' holds 1 non-finite values (NaN or Inf) of 1"
    )


def test_a_messages_tensors_travel_packed_in_one_array_bit_for_bit_in_their_order():
    """Flower moves each Array of a message as objects of its own (a request each way at the SuperLink), so a
    message's tensors go as one Array: every dtype (bf16 too), shape and bit comes back, in the sender's order, each a
    copy of its own (views of one tensor included); a record packed another way is refused by name."""
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from flwr.app import Array, ArrayRecord

    from fedrepro.errors import FederationError
    from fedrepro.fl.flower.messages import PACKED, to_record, to_tensors

    weight = torch.randn(3, 4)
    tensors = {
        "z.weight": weight,
        "a.row": weight[1],
        "count": torch.tensor(7),
        "empty": torch.zeros(0, 5),
        "half": torch.randn(6).to(torch.bfloat16),
        "nan": torch.tensor([float("nan"), -0.0]),
    }
    record = to_record(tensors)
    assert list(record) == [PACKED]
    back = to_tensors(record)
    assert list(back) == list(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape
        assert back[name].reshape(-1).view(torch.uint8).tolist() == tensor.reshape(-1).view(torch.uint8).tolist()
    weight.zero_()
    assert back["z.weight"].abs().sum() > 0, "a message must hold a copy, not the sender's live tensor"
    assert to_tensors(to_record({})) == {}
    with pytest.raises(FederationError, match="expected one array 'safetensors'"):
        to_tensors(ArrayRecord({"z.weight": Array(weight.numpy())}))


# ----- on a real deployment: SuperLink and SuperNodes as processes, TLS, node authentication ------------------
@pytest.mark.parametrize("case", DEPLOY_CASES)
def test_engine_and_a_flower_deployment_give_identical_runs(runs, case):
    engine, deployment = runs[case]["engine"], runs[case]["flower-deployment"]
    for key in ("history", "global", "clients"):
        assert deployment[key] == engine[key], key
    assert deployment["messages"] == expected_flower_messages(case, engine)
    assert deployment["server_checkpoint_clients"] == []


def test_a_stages_deployment_cells_share_one_superlink_and_its_nodes_and_each_equals_the_engine(runs):
    """One federation per stage (issue 19): every cell ran on the SuperLink, launcher and numbered nodes the first
    started, the QA cell with a spare node serving none of its three clients, and each cell is still the engine's
    run bit for bit. Nothing of the federation runs after the block."""
    shared = runs[SHARED_CASE]
    cells = [shared["cells"][case] for case, _ in SHARED_CELLS]
    first = cells[0]["pids"]
    assert sorted(first) == ["launcher", "superlink", *(f"supernode-{n}" for n in range(SHARED_CELLS[0][1]))]
    assert all(cell["pids"] == first for cell in cells), "a later cell started no process of its own"
    for (case, _), cell in zip(SHARED_CELLS, cells):
        engine, deployment = cell["engine"], cell["flower-deployment"]
        for key in ("history", "global", "clients"):
            assert deployment[key] == engine[key], (case, key)
        assert deployment["messages"] == expected_flower_messages(case, engine)
    identified = {m[1] for m in cells[1]["flower-deployment"]["scalars"] if m[0] == -1}
    assert identified == set(QA_SIZES), "the spare node answered no client and was sent nothing"
    assert shared["left_running"] == []


@pytest.mark.parametrize("case", DEPLOY_CASES)
def test_every_message_ran_in_a_clientapp_the_warm_launcher_forked(runs, case):
    """One process per message still (Flower's design), but forked with torch already imported; none cold."""
    clientapps = runs[case]["drill"]["clientapps"]
    assert clientapps["cold"] == 0
    assert clientapps["warm"] >= clientapps["messages"], "a query to each node, a train message to each sampled client"


@pytest.mark.parametrize("case", DEPLOY_CASES)
def test_a_supernode_whose_key_is_not_registered_is_refused_and_receives_nothing(runs, case):
    outsider = runs[case]["drill"]["unregistered"]
    assert outsider["exit"] not in (None, 0), "it gave up: the SuperLink never let it in"
    assert any("Failed to activate SuperNode" in line for line in outsider["errors"]), outsider["errors"]
    assert not outsider["received_anything"], "no message reached it: its state directory was never created"


@pytest.mark.parametrize("case", DEPLOY_CASES)
def test_a_supernode_or_a_cli_without_tls_cannot_connect(runs, case):
    drill = runs[case]["drill"]
    plaintext = drill["plaintext"]
    assert plaintext["exit"] == REFUSED_EXIT, "refused before it starts, not after retrying until --max-wait-time"
    assert any("speaks TLS" in line for line in plaintext["errors"]), plaintext["errors"]
    assert not plaintext["received_anything"]
    assert drill["cli_without_tls"] != 0, "flwr over plain HTTP is refused too"


def test_a_supernode_killed_mid_round_is_left_out_and_rejoins_with_its_state_intact(node_kill):
    """SIGKILL of one SuperNode process alone while its ClientApp works on round 2, the launcher running one
    ClientApp at a time: round 2 ends without it (once the SuperLink has marked it offline and answers for it) with
    the other client counted, the record says who missed which round, every later round goes on (the dead node's
    ClientApp, whose retries once held the launcher's only slot forever, is ended with it), and the restarted node
    trains again from its state file, byte-identical to what it held when killed. That it went on from that state is
    read off SCAFFOLD's invariant (``scaffold_invariant``): the server's variate is the mean of every client's only
    if the rejoined client's change was taken from the variate it held when killed."""
    drill = node_kill[KILL_CASE]["drill"]
    victim, history = drill["victim"], drill["history"]
    assert [record["round"] for record in history] == list(range(1, KILL_ROUNDS + 1)), "the run finished"
    assert list(history[1]["missed"]) == [victim] and victim not in history[1]["clients"]
    assert history[1]["missed"][victim].startswith(NODE_UNAVAILABLE), "the miss says why: the SuperLink's own answer"
    assert history[1]["clients"], "the other client sampled in round 2 was counted"
    assert all(victim not in record["clients"] for record in history if victim in record.get("missed", {}))
    assert drill["files_at_kill"], "the victim had trained before it was killed"
    assert list(drill["files_at_kill"]) == ["round-000000.safetensors"], "killed before it saved round 2's state"
    assert drill["files_before_restart"].items() >= drill["files_at_kill"].items(), (
        "the state it held when killed is kept as it was (its round-2 ClientApp may have saved an uncounted round)"
    )
    rejoined = history[drill["rejoined_after_round"] :]
    assert any(victim in record["clients"] for record in rejoined), "it trained again after rejoining"
    assert drill["control_gap"] <= 1e-3 * drill["control_off_if_lost"], (
        "the rejoined node went on from the control variate it held when killed (c = mean of every client's c_k)",
        drill["control_gap"],
        [(record["round"], record.get("missed")) for record in history],
    )


def test_a_superlink_killed_mid_run_stops_the_stage_naming_it_and_leaves_no_process(faults):
    """SIGKILL of the SuperLink process alone: the stage stops with a FederationError saying so (not a KeyError from
    a failed ``flwr ls``), no process of the federation (its ServerApp included) outlives it, and the rounds done
    stay checkpointed for a rerun to resume from."""
    killed = faults[SUPERLINK_KILL_CASE]
    assert killed["error"] is not None and killed["error"]["type"] == "FederationError", killed["error"]
    assert "the SuperLink exited" in killed["error"]["message"] and "resumes" in killed["error"]["message"]
    assert killed["left_running"] == []
    assert 1 <= killed["rounds_checkpointed"] < KILL_ROUNDS


def test_a_stage_killed_with_sigkill_leaves_no_process_of_its_federation_and_no_checkpoint_write(faults):
    """SIGKILL of the stage's own process (the OOM killer, a CI timeout's ``kill -9``: no ``finally`` runs), once its
    federation is up and once in round 2: within seconds no process of the federation runs (its reaper,
    ``fedrepro.fl.flower.reaper``), and the checkpoint folder is not written to after that."""
    drills = faults[STAGE_KILL_CASE]
    assert sorted(drills) == sorted(STAGE_KILL_POINTS)
    for point, drill in drills.items():
        assert drill["left_after_10s"] == [], point
        assert drill["seconds_to_none"] < 3, point
        assert not drill["checkpoint_changed"], f"{point}: an orphan wrote to the cell's checkpoint after the kill"
    assert 1 <= drills["round-1"]["rounds_checkpointed"] < KILL_ROUNDS, "killed while the run was under way"


def test_a_superlink_that_dies_while_flwr_ls_asks_it_is_named_as_the_cause(tmp_path, monkeypatch):
    """The race the drill above can hit: the SuperLink is alive when the run's status is polled and dies while
    ``flwr ls`` asks it, so the CLI answers ``"success": false``. The stage names the SuperLink's exit, not a run
    Flower did not list."""
    import subprocess
    from types import SimpleNamespace

    from fedrepro.errors import FederationError
    from fedrepro.fl.flower.federation import LocalFederation

    federation = LocalFederation(tmp_path)
    superlink = subprocess.Popen(["sleep", "60"])
    federation.processes["superlink"] = superlink

    def flwr(*args, check=True, timeout=120):
        if args[0] == "run":
            return SimpleNamespace(stdout=json.dumps({"run-id": 7}))
        superlink.kill()  # dies while the CLI asks; its exit is not yet reaped
        return SimpleNamespace(stdout=json.dumps({"success": False, "error-message": "SuperLink is unavailable"}))

    monkeypatch.setattr(federation, "flwr", flwr)
    with pytest.raises(FederationError, match=r"the SuperLink exited \(code -9\) during Flower run 7.*resumes"):
        federation.run(tmp_path / "app", timeout=30, looks_done=lambda: True)


# ----- a node that fails, on the simulation and on a deployment -------------------------------------------------
@pytest.mark.parametrize("case", FAULT_CASES)
def test_a_node_whose_own_training_diverges_stops_the_run_naming_client_round_and_step(faults, case):
    """As in the engine (test_engine): the run stops in the round the client diverged, with its node's message,
    instead of going on without it; the rounds before stay checkpointed."""
    result = faults[case]
    assert DIVERGES not in result["sampled"][0] and DIVERGES in result["sampled"][1], result["sampled"]
    assert result["diverged"] is not None, "the run went on without the diverging client"
    assert re.fullmatch(
        rf"Flower node \d+ of client {DIVERGES}, round 2: client {DIVERGES} diverged in round 2 at local "
        rf"step 1 of \d+ \(schedule step \d+ of \d+\): training loss nan, .*",
        result["diverged"],
    )
    assert [record["round"] for record in result["history"]] == [1]


@pytest.mark.parametrize("case", FAULT_CASES)
def test_a_node_that_fails_otherwise_is_its_clients_miss_and_the_round_goes_on(faults, case):
    first = faults[case]["history"][0]
    assert CRASHES in faults[case]["sampled"][0]
    assert list(first["missed"]) == [CRASHES] and CRASHES not in first["clients"] and first["clients"]
    assert first["missed"][CRASHES].startswith("node error: ") and "its disk failed" in first["missed"][CRASHES]


# ----- the server's round against a Grid that fakes the nodes' replies ------------------------------------------
SILENT = object()
"""What a fake node answers when it never replies."""
SUPERLINK = 0
"""The node id a fake SuperLink answers from, for a node it has marked offline."""


class FakeGrid:
    """Stands for Flower's Grid: each pushed message is answered at once with ``answer(client_id, message)``: the
    content of the reply, an ``Error`` the SuperLink sends from its own id (as for a node it marked offline), or
    ``SILENT`` (no reply at all)."""

    def __init__(self, client_of: dict[int, str], answer) -> None:
        self.client_of, self.answer, self.replies = client_of, answer, {}

    def push_messages(self, messages):
        from flwr.app import Message

        ids = []
        for index, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"message-{len(self.replies)}-{index}"  # the SuperLink's job
            ids.append(message.metadata.message_id)
            answer = self.answer(self.client_of[message.metadata.dst_node_id], message)
            if answer is SILENT:
                continue
            reply = Message(answer, reply_to=message)
            if reply.has_error():
                reply.metadata.__dict__["_src_node_id"] = SUPERLINK
            self.replies[message.metadata.message_id] = reply
        return ids

    def pull_messages(self, ids):
        return [self.replies[i] for i in ids if i in self.replies]


@pytest.fixture
def fake_round(tmp_path, monkeypatch):
    """``play(tamper)``: round 1 of FedAvg under size weighting on a ``FlowerServer`` whose nodes reply through a
    ``FakeGrid``: every client uploads the weights it was sent and its true training size, then ``tamper(client_id,
    content)`` may change the reply. Returns the round's record."""
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from flwr.app import MessageType, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedrepro.fl.flower import messages as m
    from fedrepro.fl.flower.server import FlowerServer

    for field in ("_task_id", "_run_id", "_node_id"):  # what Flower sets in a running ServerApp
        monkeypatch.setattr(TaskIdentity, field, 1)
    cell = recipe("faults/fedavg")
    task, algorithm = cell.build()
    server = FlowerServer(cell, task, algorithm, tmp_path, progress=False)
    server.node_of = {client_id: index + 10 for index, client_id in enumerate(server.train_ids)}

    def play(tamper, reply_timeout=None):
        """``tamper`` may change the reply's content, or return what the node answers instead (``FakeGrid``)."""

        def answer(client_id, message):
            if message.metadata.message_type == MessageType.EVALUATE:
                return RecordDict({m.METRICS: MetricRecord({"accuracy": 0.5})})
            content = RecordDict(
                {
                    m.TENSORS: message.content[m.TENSORS],
                    m.METRICS: MetricRecord({m.NUM_SAMPLES: QA_SIZES[client_id], m.TRAIN_LOSS: 1.0}),
                }
            )
            instead = tamper(client_id, content)
            return content if instead is None else instead

        server.reply_timeout = reply_timeout

        server.grid = FakeGrid({node: client for client, node in server.node_of.items()}, answer)
        return server._run_round(0)

    return play


def test_honest_fake_nodes_deliver_so_the_tampering_tests_below_can_fail(fake_round):
    record = fake_round(lambda client_id, content: None)
    assert "missed" not in record and len(record["clients"]) == 2


def test_each_miss_says_why_a_node_marked_offline_by_the_superlink_and_a_silent_one(fake_round):
    """The SuperLink answers for a node it marked offline from its own id; matched by the node it came from, that
    answer was dropped and the miss read "no reply". Each miss now names its cause."""
    from flwr.app import Error

    def first_one(answer):
        victim = []

        def tamper(client_id, content):
            if not victim:
                victim.append(client_id)
                return answer

        return victim, tamper

    offline, tamper = first_one(Error(0, "Error: Node Unavailable"))
    record = fake_round(tamper, reply_timeout=0.3)
    assert record["missed"] == {offline[0]: NODE_UNAVAILABLE} and record["clients"], record
    silent, tamper = first_one(SILENT)
    record = fake_round(tamper, reply_timeout=0.3)
    assert record["missed"] == {silent[0]: "no reply within train.reply_timeout (0.3 s)"} and record["clients"], record


def test_a_reply_without_its_metrics_is_that_clients_miss_naming_it(fake_round):
    from fedrepro.fl.flower import messages as m

    victim = []

    def drop_metrics(client_id, content):
        if not victim:
            victim.append(client_id)
            del content[m.METRICS]

    record = fake_round(drop_metrics)
    assert list(record["missed"]) == victim and victim[0] not in record["clients"] and record["clients"]
    assert record["missed"][victim[0]] == f"rejected: client {victim[0]}: its reply holds no '{m.METRICS}' record"


def test_a_client_claiming_more_samples_than_its_partition_holds_is_rejected_naming_it(fake_round):
    """Under size weighting a client's num_samples is its weight N_k / N: 1e9 would take over the model."""
    from fedrepro.fl.flower import messages as m

    inflated = []

    def inflate(client_id, content):
        if not inflated:
            inflated.append(client_id)
            content[m.METRICS][m.NUM_SAMPLES] = 1_000_000_000

    record = fake_round(inflate)
    client = inflated[0]
    assert list(record["missed"]) == [client] and client not in record["clients"] and record["clients"]
    assert record["missed"][client] == (
        f"rejected: client {client}: num_samples 1000000000 is not its declared training size {QA_SIZES[client]}"
    )


# ----- silo-local data: each node holds its own client's rows, the server none ----------------------------------
@pytest.fixture(scope="module")
def silo_runs(tmp_path_factory):
    """The silo-local cases alone: the engine on the whole task, Flower on the clients' own directories."""
    return flower_cells(tmp_path_factory.mktemp("silos"), list(SILO_CASES), timeout=1200)


def without_fit(history: list[dict]) -> list[dict]:
    """A history without the global model's FIT scores: on silo-local data they are the clients' losses on their own
    data, weighted by size, not the engine's loss over batches that mix every client's sentences."""
    return [{key: value for key, value in record.items() if key not in (FIT, "fit_loss")} for record in history]


@pytest.mark.parametrize("case", SILO_CASES)
def test_silo_local_runs_are_the_engines_bit_for_bit(silo_runs, case):
    """Nodes built from their own client's directory alone (on the deployment: the other clients' files removed,
    the server's silos folder holding only the manifest) train exactly the engine's run on the whole task: the same
    global weights, private states and rounds, and the valid and test scores, from the clients' summed counts,
    equal to the engine's on the whole global sets."""
    engine, flower = silo_runs[case]["engine"], silo_runs[case]["flower"]
    assert flower["global"] == engine["global"]
    assert flower["clients"] == engine["clients"], "every client's private state, read back from its node"
    assert without_fit(flower["history"]) == without_fit(engine["history"])
    assert {"valid", "test"} <= set(engine["history"][0]), "the scores compared above are there"
    fits, engine_fits = ([record[FIT]["global"] for record in run["history"]] for run in (flower, engine))
    assert [fit["samples"] for fit in fits] == [fit["samples"] for fit in engine_fits]
    # the same model's loss on the same sentences, averaged per client instead of over mixed batches
    assert [fit["loss"] for fit in fits] == pytest.approx([fit["loss"] for fit in engine_fits], rel=0.25)
    if case.startswith("deploy-"):
        files = silo_runs[case]["silo_files"]
        assert files and all(names == ["sentences.parquet", "silo.json"] for names in files.values()), files
        assert silo_runs[case]["server_silo_files"] == ["manifest.json"]


@pytest.mark.parametrize("case", SILO_CASES)
def test_on_silo_local_data_only_counts_and_losses_of_the_evaluation_cross(silo_runs, case):
    """The channel log names what each client sent of its evaluation: per-class true positive, false positive and
    false negative counts (valid and test) and its loss and size on its own training data (FIT), never a row; the
    only tensors besides the engine's are the global weights sent to every client to score, once per split."""
    engine, flower = silo_runs[case]["engine"], silo_runs[case]["flower"]
    counts = {f"{kind}/rel{c}" for kind in ("tp", "fp", "fn") for c in range(3)}
    clients = sorted({m[1] for m in flower["scalars"] if m[0] == -1})
    evaluations = [set(m[3]) for m in flower["scalars"] if m[0] >= 0 and "num_samples" not in m[3]]
    rounds = len(engine["history"])
    assert sorted(map(sorted, evaluations)) == sorted(
        [sorted(counts)] * (2 * rounds * len(clients)) + [["loss", "samples"]] * (rounds * len(clients))
    )
    extra = list(flower["messages"])
    for message in engine["messages"]:
        extra.remove(message)
    assert len(extra) == 3 * rounds * len(clients) and all(m[1] == "server" for m in extra)
    assert not {name for m in flower["messages"] for name in m[3]} & set(flower["private"])


@pytest.fixture(scope="module")
def stage_silo_runs(tmp_path_factory):
    """Each paper's ``run_cell`` in the engine and silo-local on the Flower simulation (``train.silo_local``)."""
    return flower_cells(tmp_path_factory.mktemp("stage-silos"), list(STAGE_SILO_CASES), timeout=1200)


@pytest.mark.parametrize("case", STAGE_SILO_CASES)
def test_train_silo_local_runs_a_papers_cell_to_the_engines_outputs(stage_silo_runs, case):
    """``train.silo_local`` through the paper's own ``run_cell`` (what its train stage calls): the cell's silos laid
    out under its checkpoint folder, one directory per client holding that client's files and the manifest beside
    them, and every output file equal to the engine's run of the cell: FedCMC's test predictions (each client
    predicting its own share) and its test and valid scores from the clients' summed counts; FedMatch's per-client
    TREC runs, each client scoring its own model on its own directory's candidates."""
    engine, flower = stage_silo_runs[case]["engine"], stage_silo_runs[case]["flower"]
    assert flower["files"] and flower["files"] == engine["files"]
    assert flower["metrics"]["test"] == engine["metrics"]["test"]
    silos = dict(stage_silo_runs[case]["silos"])
    assert silos.pop("manifest.json") is None and len(silos) == 3
    if case.endswith("fedcmc"):
        assert all(files == ["sentences.parquet", "silo.json"] for files in silos.values()), silos
        assert flower["metrics"]["valid"] == engine["metrics"]["valid"]
        truncated = "truncated_train_sentences"
        assert flower["metrics"][truncated] == engine["metrics"][truncated]
    else:
        assert all(files == ["candidates.parquet", "silo.json", "triples.parquet"] for files in silos.values()), silos
        assert flower["metrics"]["patch_norms"] == engine["metrics"]["patch_norms"]
        assert flower["metrics"]["history"] == engine["metrics"]["history"], "silo-local FedMatch is the same run"


TELEMETRY_PROBE = """
import urllib.error
import urllib.request
import fedrepro.fl.flower.{module}
from flwr.supercore import telemetry

tried = []


def refuse(request, **kwargs):
    tried.append(request.full_url)
    raise urllib.error.URLError("the probe reaches no network")


urllib.request.urlopen = refuse
telemetry.create_event(telemetry.EventType.START_SIMULATION_ENTER, {{}})
print(tried)
"""


@pytest.mark.parametrize("module", ["simulation", "deployment", "vertical", "vertical_deployment"])
def test_flower_sends_no_telemetry_from_a_process_that_runs_it_through_fedrepro(module):
    """Flower reads ``FLWR_TELEMETRY_ENABLED`` once, as it is imported, and then posts an event to its server at every
    simulation it starts: a stage whose process imported Flower before switching it off posted them (a user with a
    network would have sent them; here they failed). Checked in a fresh process with nothing set beforehand."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("FLWR_TELEMETRY_ENABLED", "RAY_USAGE_STATS_ENABLED")
    }
    probe = subprocess.run(
        [sys.executable, "-c", TELEMETRY_PROBE.format(module=module)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip().splitlines()[-1] == "[]", probe.stdout
