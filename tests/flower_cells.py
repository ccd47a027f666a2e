"""Runs tiny cells in the engine and on Flower's simulation and writes what each produced, for test_flower.py.

A separate process, because the tests start it inside a network namespace with only loopback up
(``loopback.py``): Ray and Flower then cannot reach anything but this machine. Each cell is trained by
both runtimes from the same recipe; the output holds their histories, channel logs, and digests of the
final global weights and of every client's private state.

Usage: python tests/flower_cells.py --out results.json --work DIR [--only CASE ...]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import multiprocessing
import os
import queue
import re
import socket
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fedrepro.errors import TrainingDiverged  # noqa: E402
from fedrepro.fl.algorithm import CommonSettings  # noqa: E402
from fedrepro.fl.algorithms import REGISTRY  # noqa: E402
from fedrepro.fl.checkpoint import load_checkpoint  # noqa: E402
from fedrepro.fl.engine import EngineSettings  # noqa: E402
from fedrepro.fl.flower.federation import LocalFederation, NodeTimings  # noqa: E402
from fedrepro.fl.flower.node_state import NodeStateStore  # noqa: E402
from fedrepro.fl.flower.ray_head import STAGE_RAY_ENV, stage_ray  # noqa: E402
from fedrepro.fl.recipe import CellRecipe, SiloRecipe  # noqa: E402
from fedrepro.fl.runtime import build_runtime  # noqa: E402
from fedrepro.models.patches import PatchSpec  # noqa: E402
from scaffold_invariant import control_variate_gap, largest_control  # noqa: E402
from toy import (
    FaultyNodesTask,
    ToyQATask,
    relation_server_view,
    relation_silo_task,
    relation_task,  # noqa: E402
    write_relation_silos,
)

# What a cell's build and training import on first use, imported with this module because a deployment's warm
# ClientApp launcher preloads the recipe factory's module (this one: ``fedrepro.fl.flower.launcher``), so that every
# ClientApp it forks starts with them. Imported in each ClientApp instead, they cost about 6 s of CPU a message, most
# of a tiny round: sklearn and transformers through the relation cell, torch's compiler stack through
# ``torch.use_deterministic_algorithms`` (``fedrepro.seeding``).
import torch._dynamo  # noqa: E402
import fedrepro.data.label_skew  # noqa: E402
import fedrepro.data.relation  # noqa: E402
import fedrepro.models.backbone  # noqa: E402
import fedrepro.models.relation  # noqa: E402
import fedrepro.tasks.relation  # noqa: E402,F401

QA_SIZES = {"a": 8, "b": 6, "c": 4}
QA_ALGORITHMS = ("fedavg", "fedper", "fedmatch")
"""Beside the relation cell (which every algorithm runs): a QA cross-encoder with a private head (FedPer), a
patch inside its BERT (FedMatch), and each client scoring its own model, which on Flower happens on its node."""
CRASH_AFTER_ROUND = 1
RESUME_CASE = "resume/scaffold"
DEPLOY_CASES = ("deploy-relation/scaffold", "deploy-qa/fedper")
"""On a real local deployment (SuperLink + SuperNodes, TLS, node authentication): server and client state both
(SCAFFOLD), and a private head with each node scoring its own model (FedPer)."""
OUTSIDER_WAIT = 5.0
"""How long the outsiders (``outsiders``) keep trying to join before they give up and exit: they must have exited
before the deployment's run is over, which takes longer, so that their exit code is seen."""
SHARED_CASE = "shared-deployment"
SHARED_CELLS = (("shared-relation/fedavg", 4), ("shared-qa/fedper", 3), ("shared-relation/scaffold", 3))
"""Cells (case, clients) run one after another on one local deployment (``shared_federation``), as a stage runs its
cells: the first starts four numbered nodes, the QA cell then has three clients and a spare node."""
NODE_UNAVAILABLE = "node error: Error: Node Unavailable"
"""How a round's record gives the miss of a node the SuperLink has marked offline: the SuperLink's own answer for it."""
KILL_CASE = "kill-relation/scaffold"
KILL_ROUNDS, REPLY_TIMEOUT = 8, 120.0
"""The node-kill drill's rounds and reply timeout. The timeout bounds a whole round, whose ClientApps run one at a
time: locally a round of two takes about 15 s, but at 45 s a CI run once recorded both round-1 clients as missed,
so the margin is wide. It costs the drill nothing: the killed node's round ends once the SuperLink has marked the
node offline (two missed heartbeats, ``NODE_TIMINGS``) and answers for it, which the server records as that node's
miss (``NODE_UNAVAILABLE``)."""
RESTART_SETTLE = 5.0
"""How long the node-kill drill's restarted node must stay up to count as rejoined (``restart_node``'s ``settle``). It
is let in at once: round 2 ended only once the SuperLink had marked the killed node offline, which is what a restart
waits for. The drill's thread ends with that wait, and it must end before the run does (its federation then stops): at
``restart_node``'s 15 s, the rounds after round 2, a few seconds each, could end first."""
NODE_TIMINGS = NodeTimings(heartbeat_interval=10.0, pull_interval=0.2)
"""The SuperNodes' timings in every deployment of the tests (``LocalFederation.node_timings``): Flower's shortest
heartbeat, so that a killed node is offline (and its key let in again) within 20 s instead of a minute, and an idle
node asking for its next message every 0.2 s instead of 3 s (each message of a vertical run, each round of a
horizontal one waited for that ask)."""
SILO_CASES = ("silo-relation/scaffold", "silo-relation/fedrs", "deploy-silo-relation/fedavg")
"""On silo-local data (``fedrepro.fl.silo``): each node reads only its own client's directory, the server only the
manifest, and the global model is scored from the clients' per-class counts. The deployment's node directories hold
their own client's files alone (the others removed) and the server's silos folder the manifest alone."""
STAGE_SILO_CASES = ("stage-silo/fedcmc", "stage-silo/fedmatch")
"""A paper's own ``run_cell`` (the train stage's) on a tiny embedded-scale cell, in the engine and with
``train.silo_local`` on the Flower simulation: the silos laid out under the cell's checkpoint folder, each client's
final evaluation on its own directory's task."""
STAGE_RAY_CASE = "stage-ray"
STAGE_RAY_CELLS = ("relation/fedavg", "relation/scaffold")
"""Two cells of one seed, trained at once by two forked children of one process, as a stage's cell workers train
them (``fedrepro.grid``), both on the stage's one Ray (``stage_ray``)."""
FAULT_CASES = ("faults/fedavg", "deploy-faults/fedavg")
SUPERLINK_KILL_CASE = "superlink-kill-relation/fedavg"
STAGE_KILL_CASE = "stage-kill-relation/fedavg"
STAGE_KILL_POINTS = {"federation-up": 10.0, "round-1": 30.0}
"""Where the stage-kill drill SIGKILLs the process that runs a deployment (the stage), and how many seconds it then
watches the checkpoint folder: once its federation is up (its nodes still joining, no run started), and once round 1
is checkpointed (round 2 under way). An orphan ServerApp checkpointed a round every 10-25 s in the drill without a
reaper, so 30 s sees it write."""
CRASHES, DIVERGES = "c", "a"
"""In the fault cases: round 1 samples c (whose node fails) but not a, round 2 samples a (whose training diverges)."""
KNOBS = {
    "fedprox": {"mu": 0.1},
    "fedmatch": {"patch": PatchSpec("horizontal", "lr", size=8)},
    "moon": {"mu": 1.0, "temperature": 0.5, "projection_dim": 8},
    "fedcmc": {"mu": 1.0, "temperature": 0.5},
    "fedrs": {"alpha": 0.5, "mask": False},
    "fedlc": {"tau": 1.0},
    "lg_fedavg": {"local_layers": None},
    "feddyn": {"alpha": 0.1},
}
"""Every knob of every algorithm switched on, so each hook does real work."""


def federated_algorithms() -> list[str]:
    """Every registered algorithm that federates (the others never leave the process, on any runtime)."""
    return sorted(name for name, cls in REGISTRY.items() if cls.federated)


def all_cases() -> list[str]:
    """The cases the ``runs`` fixture runs together (each drill that kills a process has a fixture of its own)."""
    return (
        [f"relation/{name}" for name in federated_algorithms()]
        + [f"qa/{name}" for name in QA_ALGORITHMS]
        + [RESUME_CASE, *DEPLOY_CASES, SHARED_CASE]
    )


def recipe(case: str, rounds: int = 2, silos: str | None = None, clients: int = 3) -> CellRecipe:
    """The algorithm with its ``KNOBS``; 2 clients per round, of 3 (the relation cell: of ``clients``). ``silos``: the
    relation cell on silo-local data laid out there (``toy.write_relation_silos``)."""
    family, algorithm = case.split("/")
    family = family.rpartition("-")[2]  # deploy-relation, kill-relation, ...: the relation cell
    relation = family in ("relation", "resume")
    settings = EngineSettings(
        rounds=rounds,
        local_epochs=1,
        clients_per_round=2,
        lr=1e-3,
        batch_size=8 if relation else 4,
        warmup_fraction=0.1,
        max_grad_norm=1.0,
        seed=0,
        eval_every=1,
        eval_splits=("valid", "test") if relation else ("valid",),
    )
    build = functools.partial(relation_task, clients) if relation else functools.partial(ToyQATask, QA_SIZES)
    if family == "faults":
        build = functools.partial(FaultyNodesTask, QA_SIZES, CRASHES, DIVERGES)
    knobs = REGISTRY[algorithm].Settings(**KNOBS.get(algorithm, {}))
    silo = (
        None
        if silos is None
        else SiloRecipe(Path(silos), relation_silo_task, functools.partial(relation_server_view, Path(silos)))
    )
    return CellRecipe(
        build_task=build,
        algorithm=algorithm,
        algorithm_settings=knobs,
        common=CommonSettings(weighting="size", seed=0),
        settings=settings,
        fingerprint=f"{case}-{rounds}-{clients}",
        threads=1,
        silo=silo,
        spec={
            "factory": "flower_cells:recipe",
            "kwargs": {"case": case, "rounds": rounds, "clients": clients, **({"silos": silos} if silos else {})},
        },
    )


def digest(tensor: torch.Tensor) -> str:
    raw = tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
    return f"{tensor.dtype}{tuple(tensor.shape)}:" + hashlib.sha256(raw).hexdigest()[:16]


def outcome(engine) -> dict:
    state = engine.state
    return {
        "history": state.history,
        "messages": [m.to_record() for m in engine.channel.messages],
        "scalars": [m.to_record() for m in engine.channel.scalars],
        "global": {name: digest(t) for name, t in state.global_weights.items()},
        "clients": {c: {name: digest(t) for name, t in s.items()} for c, s in state.client_states.items()},
        "shared": engine.shared_names,
        "private": engine.private_names,
        "server_checkpoint_clients": sorted(p.name for p in (engine.checkpoint_dir / "latest" / "clients").iterdir()),
    }


class Crash(RuntimeError):
    """Stands for the server side dying mid-run."""


def crash_after_round(record: dict) -> None:
    if record["round"] == CRASH_AFTER_ROUND:
        raise Crash(f"server killed after round {CRASH_AFTER_ROUND}")


def run_case(case: str, work: Path) -> dict:
    if case == RESUME_CASE:
        return run_resume(work)
    if case in DEPLOY_CASES:
        return run_deployment(case, work)
    if case == SHARED_CASE:
        return run_shared_deployment(work)
    if case == KILL_CASE:
        return run_node_kill(work)
    if case in FAULT_CASES:
        return run_faults(case, work)
    if case == SUPERLINK_KILL_CASE:
        return run_superlink_kill(work)
    if case == STAGE_KILL_CASE:
        return run_stage_kill(work)
    if case in SILO_CASES:
        return run_silo_local(case, work)
    if case in STAGE_SILO_CASES:
        return run_stage_silo_local(case, work)
    if case == STAGE_RAY_CASE:
        return run_stage_ray(work)
    result = {}
    for runtime in ("engine", "flower-simulation"):
        engine = build_runtime(recipe(case), runtime, work / case / runtime, progress=False)
        engine.run()
        result[runtime] = outcome(engine)
    from fedrepro.fl.flower.ray_backend import KeptRayBackend  # not before: the stage-ray case forks without Ray

    result["ray_workers"] = sorted(actor._actor_id.hex() for actor in KeptRayBackend.kept_pool.pool)
    return result


def run_stage_ray(work: Path) -> dict:
    """``STAGE_RAY_CELLS`` on the simulation in forked children inside ``stage_ray``, then each on the engine: what
    each gave, the Ray each joined (the address of its cluster, its job), and what the stage's Ray left behind."""
    context = multiprocessing.get_context("fork")
    replies = context.Queue()
    loaded_ray = "ray" in sys.modules  # as a stage's process: not before it forks its cell workers (``ray_head``)
    with stage_ray(cpus=2):
        folder = Path(os.environ[STAGE_RAY_ENV])
        children = [
            context.Process(target=simulate_on_stage_ray, args=(case, work, replies)) for case in STAGE_RAY_CELLS
        ]
        for child in children:
            child.start()
        simulated = _replies(replies, children, timeout=600)
        for child in children:
            child.join()
    host, port = simulated[STAGE_RAY_CELLS[0]]["cluster"].rsplit(":", 1)
    result = {
        "forked_with_ray": loaded_ray,
        "folder_left": folder.exists(),
        "cluster_answers": _answers(host, int(port)),
        "processes_left": [pid for pid in os.listdir("/proc") if pid.isdigit() and _names(pid, folder)],
    }
    for case in STAGE_RAY_CELLS:
        engine = build_runtime(recipe(case), "engine", work / "stage-ray" / case / "engine", progress=False)
        engine.run()
        result[case] = {"engine": outcome(engine), **simulated[case]}
    return result


def _replies(replies, children: list, timeout: float) -> dict:
    """Each child's reply, failing at once with a child's own error, or when a child ended without replying, instead
    of waiting out ``timeout`` (under CPU starvation, twice in CI, both children had ended and the wait ran 600 s)."""
    got, deadline = {}, time.monotonic() + timeout
    while len(got) < len(children):
        try:
            case, reply = replies.get(timeout=1)
        except queue.Empty:
            ended = [child.exitcode for child in children if child.exitcode is not None]
            if len(ended) > len(got) or time.monotonic() > deadline:
                raise RuntimeError(
                    f"stage-ray: {len(got)} of {len(children)} cells replied; exit codes of the "
                    f"children that ended: {ended} (a child's traceback is on stderr)"
                ) from None
            continue
        if isinstance(reply, str):
            raise RuntimeError(f"stage-ray: {case} failed in its child:\n{reply}")
        got[case] = reply
    return got


def simulate_on_stage_ray(case: str, work: Path, replies) -> None:
    """One cell on the simulation in a forked child, its outcome and the Ray it ran on put in ``replies`` (or its
    traceback, so the parent fails with it)."""
    import ray

    try:
        cell = build_runtime(recipe(case), "flower-simulation", work / "stage-ray" / case / "flower", progress=False)
        cell.run()
        context = ray.get_runtime_context()
        from fedrepro.fl.flower.ray_backend import KeptRayBackend

        worker = KeptRayBackend.kept_pool.pool[0]
        replies.put(
            (
                case,
                {
                    "flower-simulation": outcome(cell),
                    "cluster": context.gcs_address,
                    "job": context.get_job_id(),
                    "cpus": ray.cluster_resources()["CPU"],
                    "niceness": os.nice(0),
                    "worker_niceness": ray.get(worker.__ray_call__.remote(_niceness)),
                },
            )
        )
    except BaseException:
        replies.put((case, traceback.format_exc()))
        raise


def _niceness(_actor) -> int:
    """The niceness of the process a Ray actor runs in."""
    return os.nice(0)


def _answers(host: str, port: int) -> bool:
    """Whether anything still accepts connections at ``host:port``."""
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def _names(pid: str, folder: Path) -> bool:
    """Whether process ``pid``'s command line names ``folder``."""
    try:
        return str(folder) in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


def run_resume(work: Path) -> dict:
    """SCAFFOLD (server and client state both) for 3 rounds on Flower: once straight through, and once with the
    server killed after round 1 and started again from its checkpoint, its nodes' states left where they were."""
    result = {}
    straight = build_runtime(
        recipe(RESUME_CASE, rounds=3), "flower-simulation", work / "resume" / "straight", progress=False
    )
    straight.run()
    result["straight"] = outcome(straight)
    folder = work / "resume" / "killed"
    killed = build_runtime(
        recipe(RESUME_CASE, rounds=3), "flower-simulation", folder, progress=False, on_round_end=crash_after_round
    )
    try:
        killed.run()
        raise AssertionError("the crash did not stop the run")
    except Crash:
        pass
    resumed = build_runtime(recipe(RESUME_CASE, rounds=3), "flower-simulation", folder, progress=False)
    result["resumed_from_round"] = resumed.state.next_round
    resumed.run()
    result["resumed"] = outcome(resumed)
    return result


def outsiders(folder: Path, drill: dict):
    """While the deployment runs: a SuperNode whose key was never registered, one without TLS, and a Flower CLI
    connection without TLS. Each claims to serve a real client, with a state directory of its own."""

    def start(federation) -> None:
        from fedrepro.fl.flower.certificates import make_node_key
        from fedrepro.fl.flower.federation import CONNECTION

        key, _ = make_node_key(federation.folder / "outsider-keys", "unregistered")
        federation.start_supernode(
            "unregistered",
            key,
            {"client-id": "client_00", "state-dir": str(folder / "unregistered")},
            max_wait=OUTSIDER_WAIT,
        )
        federation.start_supernode(
            "plaintext",
            None,
            {"client-id": "client_01", "state-dir": str(folder / "plaintext")},
            tls=False,
            max_wait=OUTSIDER_WAIT,
        )
        config = federation.home / "config.toml"
        config.write_text(
            config.read_text() + f'\n[superlink.plaintext]\naddress = "{federation.address}"\ninsecure = true\n'
        )
        drill["cli_without_tls"] = federation.flwr("ls", "plaintext", check=False).returncode
        drill["nodes"] = federation.flwr("supernode", "ls", CONNECTION, "--format", "json").stdout
        drill["federation"] = federation

    return start


def run_deployment(case: str, work: Path) -> dict:
    """The same cell in the engine and on a local deployment, with outsiders trying to join during the run."""
    result, drill = {}, {}
    engine = build_runtime(recipe(case), "engine", work / case / "engine", progress=False)
    engine.run()
    result["engine"] = outcome(engine)
    deployment = build_runtime(recipe(case), "flower-deployment", work / case / "deployment", progress=False)
    deployment.on_federation_up = outsiders(work / case / "outsiders", drill)
    deployment.run()
    result["flower-deployment"] = outcome(deployment)
    federation = drill.pop("federation")
    for name in ("unregistered", "plaintext"):
        drill[name] = {
            "exit": federation.exit_codes[f"supernode-{name}"],
            "received_anything": (work / case / "outsiders" / name).exists(),
            "errors": [
                line
                for line in (federation.logs / f"supernode-{name}.log").read_text().splitlines()
                if "Exit Code" in line or "Failed" in line or "refused" in line
            ],
        }
    drill["wire"] = deployment.wire
    started = "Start `flwr-clientapp` process"
    drill["clientapps"] = {
        "warm": (federation.logs / "launcher.log").read_text().count(started),
        "cold": sum(log.read_text().count(started) for log in federation.logs.glob("supernode-*.log")),
        "messages": len(deployment.train_ids) + sum(len(r["clients"]) for r in deployment.state.history),
    }
    result["drill"] = drill
    return result


def federation_processes(home: Path) -> list[str]:
    """The command lines of the running processes of the federation whose Flower home is ``home``."""
    mark, found = f"FLWR_HOME={home}".encode(), []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes().split(b"\0"):
                found.append((environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def run_shared_deployment(work: Path) -> dict:
    """``SHARED_CELLS`` on one shared federation, each also in the engine: per cell both outcomes and the pids of the
    SuperLink, the launcher and the nodes it ran on; what of the federation still ran after the block."""
    from fedrepro.fl.flower.deployment import shared_federation

    result: dict = {"cells": {}}
    with shared_federation(work / SHARED_CASE / "federation"):
        for case, clients in SHARED_CELLS:
            engine = build_runtime(recipe(case, clients=clients), "engine", work / case / "engine", progress=False)
            engine.run()
            deployment = build_runtime(
                recipe(case, clients=clients), "flower-deployment", work / case / "deployment", progress=False
            )
            seen: dict = {}

            def look(federation, seen=seen) -> None:
                seen["home"] = str(federation.home)
                seen["pids"] = {name: process.pid for name, process in federation.processes.items()}

            deployment.on_federation_up = look
            deployment.run()
            result["cells"][case] = {"engine": outcome(engine), "flower-deployment": outcome(deployment), **seen}
    result["left_running"] = federation_processes(Path(seen["home"]))
    return result


def run_node_kill(work: Path) -> dict:
    """SCAFFOLD for ``KILL_ROUNDS`` rounds on a deployment (after round 2, time for the restarted node to rejoin and be
    sampled again: the node is let in once the SuperLink has seen it offline, which ends round 2), its launcher
    running one ClientApp at a time (a 2-core machine). In round 2, while its ClientApp works on the round, a client
    that trained in round 1 has its SuperNode process alone killed with SIGKILL (not its SuperExec or ClientApp, as a
    crash would); once round 2 is over without it, the node is started again with the same key and directory and
    must rejoin with its state as it was."""
    import os
    import signal
    import threading

    from fedrepro.fl.flower.federation import wait_until
    from fedrepro.fl.flower.launcher import children_of

    folder = work / KILL_CASE
    deployment = build_runtime(
        recipe(KILL_CASE, KILL_ROUNDS), "flower-deployment", folder, progress=False, reply_timeout=REPLY_TIMEOUT
    )
    deployment.launcher_slots = 1
    sampled = [deployment.sample_clients(r) for r in range(KILL_ROUNDS)]
    victim = max(sorted(set(sampled[0]) & set(sampled[1])), key=lambda c: sum(c in later for later in sampled[2:]))
    state_dir = deployment.nodes_root / victim
    drill: dict = {"victim": victim, "sampled": sampled}

    def checkpointed() -> int:
        state = folder.resolve() / "latest" / "state.json"
        return json.loads(state.read_text())["next_round"] if state.exists() else 0

    def state_files() -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(state_dir.glob("*.safetensors"))}

    def kill_and_restart(federation) -> None:
        wait_until(lambda: checkpointed() >= 1, 600, "round 1")
        name = deployment.node_name(victim)
        node = federation.processes[name]

        def running(pid: int) -> bool:  # the launcher lists an ended ClientApp until its next fork reaps it
            try:
                return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False

        deadline = time.monotonic() + 120
        while not any(map(running, children_of(federation.launcher_socket, set(federation.family(name, node))))):
            if time.monotonic() > deadline:
                raise AssertionError(f"no ClientApp of client {victim} ran in round 2")
            time.sleep(0.01)  # until the victim's round-2 ClientApp runs
        os.kill(node.pid, signal.SIGKILL)
        drill["files_at_kill"] = state_files()
        held = NodeStateStore(state_dir, deployment.fingerprint).latest_until(KILL_ROUNDS).tensors
        drill["control_off_if_lost"] = largest_control(held) / len(deployment.train_ids)
        wait_until(lambda: checkpointed() >= 2, 600, "round 2 without the killed node")
        drill["files_before_restart"] = state_files()
        deployment.restart_node(federation, victim, settle=RESTART_SETTLE)
        drill["rejoined_after_round"] = checkpointed()

    def start(federation) -> None:
        drill["thread"] = threading.Thread(target=kill_and_restart, args=(federation,), daemon=True)
        drill["thread"].start()

    deployment.on_federation_up = start
    deployment.run()
    drill.pop("thread").join(timeout=5)
    drill["files_at_end"] = state_files()
    drill["control_gap"] = control_variate_gap(
        deployment.state.global_weights, deployment.state.client_states, deployment.train_ids
    )
    drill["history"] = deployment.state.history
    return {"drill": drill}


def run_superlink_kill(work: Path) -> dict:
    """FedAvg for ``KILL_ROUNDS`` rounds on a deployment whose SuperLink process alone is killed with SIGKILL once
    round 1 is checkpointed: what the stage raised, the rounds it checkpointed, and which of the federation's
    processes (those with its FLWR_HOME) still run after it."""
    import os
    import signal
    import threading

    from fedrepro.fl.flower.federation import wait_until

    deployment = build_runtime(
        recipe(SUPERLINK_KILL_CASE, KILL_ROUNDS), "flower-deployment", work / SUPERLINK_KILL_CASE, progress=False
    )
    result: dict = {}

    def kill(federation) -> None:
        result["home"] = str(federation.home)
        wait_until(lambda: (deployment.checkpoint_dir / "latest" / "state.json").exists(), 600, "round 1")
        os.kill(federation.processes["superlink"].pid, signal.SIGKILL)

    def start(federation) -> None:
        threading.Thread(target=kill, args=(federation,), daemon=True).start()

    deployment.on_federation_up = start
    try:
        deployment.run()
        result["error"] = None
    except Exception as error:  # noqa: BLE001 - what the stage would die with, whatever it is
        result["error"] = {"type": type(error).__name__, "message": str(error)}
    result["left_running"] = federation_processes(Path(result["home"]))
    result["rounds_checkpointed"] = load_checkpoint(deployment.checkpoint_dir, deployment.fingerprint).next_round
    return result


def run_stage_kill(work: Path) -> dict:
    """For each of ``STAGE_KILL_POINTS``, a stage of its own (this script with ``--stage``: FedAvg for ``KILL_ROUNDS``
    rounds on a deployment) SIGKILLed there: the seconds until none of its federation's processes ran, those still
    running 10 s after the kill, and whether its checkpoint folder changed between 1 s after it and the end of the
    point's watch."""
    import signal
    import subprocess

    from fedrepro.fl.flower.federation import wait_until
    from fedrepro.fl.flower.reaper import marked

    def files(folder: Path) -> dict[str, tuple[int, int]]:
        return {str(path): (path.stat().st_mtime_ns, path.stat().st_size) for path in sorted(folder.rglob("*"))}

    result = {}
    for point, watch in STAGE_KILL_POINTS.items():
        folder = work / STAGE_KILL_CASE / point
        folder.mkdir(parents=True)
        stage = subprocess.Popen([sys.executable, __file__, "--stage", str(folder)])
        up, checkpoint = folder / "federation", folder / "cell"
        state = checkpoint / "latest" / "state.json"
        wait_until(lambda: up.exists() or stage.poll() is not None, 600, "the stage's federation")
        if point == "round-1":
            wait_until(lambda: state.exists() or stage.poll() is not None, 600, "round 1")
        if stage.poll() is not None:
            raise RuntimeError(f"the stage ended (code {stage.returncode}) before the kill at {point}")
        prefix = f"{up.read_text()}:"
        stage.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        stage.wait()
        while marked(prefix) and time.monotonic() - killed < 10:
            time.sleep(0.05)
        gone = time.monotonic() - killed
        time.sleep(max(0.0, killed + 1 - time.monotonic()))
        at_one_second = files(checkpoint)
        time.sleep(max(0.0, killed + 10 - time.monotonic()))
        left = sorted(marked(prefix).values())
        time.sleep(max(0.0, killed + watch - time.monotonic()))
        result[point] = {
            "seconds_to_none": gone,
            "left_after_10s": left,
            "checkpoint_changed": files(checkpoint) != at_one_second,
            "rounds_checkpointed": json.loads(state.read_text())["next_round"] if state.exists() else 0,
        }
    return result


def run_stage(folder: Path) -> None:
    """The stage the stage-kill drill kills: ``STAGE_KILL_CASE`` on a deployment, its federation's folder written to
    ``folder/federation`` once it is up."""
    deployment = build_runtime(
        recipe(STAGE_KILL_CASE, KILL_ROUNDS), "flower-deployment", folder / "cell", progress=False
    )

    def say_up(federation: LocalFederation) -> None:
        (folder / "federation.tmp").write_text(str(federation.folder))
        (folder / "federation.tmp").replace(folder / "federation")

    deployment.on_federation_up = say_up
    deployment.run()


def run_silo_local(case: str, work: Path) -> dict:
    """The relation cell in the engine (the whole task in one process) and on Flower on silo-local data. On the
    deployment every SuperNode's data directory holds its own client's silo alone (copied out of the layout, every
    other client's files left behind) and the server's silos folder keeps the manifest alone."""
    import shutil

    from fedrepro.fl.silo import MANIFEST

    silos = work / case / "silos"
    manifest = write_relation_silos(silos)
    engine = build_runtime(recipe(case), "engine", work / case / "engine", progress=False)
    engine.run()
    result = {"engine": outcome(engine), "silo_files": {}}
    if not case.startswith("deploy-"):
        cell = build_runtime(
            recipe(case, silos=str(silos)), "flower-simulation", work / case / "flower", progress=False
        )
        cell.run()
        result["flower"] = outcome(cell)
        return result
    node_dirs = {}
    for client_id in manifest.client_ids:
        node_dirs[client_id] = work / case / "node-data" / client_id
        shutil.copytree(silos / client_id, node_dirs[client_id])
        shutil.rmtree(silos / client_id)
        result["silo_files"][client_id] = sorted(p.name for p in node_dirs[client_id].iterdir())
    result["server_silo_files"] = sorted(p.name for p in silos.iterdir())
    assert result["server_silo_files"] == [MANIFEST]
    cell = build_runtime(recipe(case, silos=str(silos)), "flower-deployment", work / case / "flower", progress=False)
    cell.data_dirs = node_dirs
    cell.run()
    result["flower"] = outcome(cell)
    return result


def run_faults(case: str, work: Path) -> dict:
    """A cell whose nodes fail (``FaultyNodesTask``), on Flower: what stopped it and the rounds it checkpointed."""
    runtime = "flower-deployment" if case.startswith("deploy-") else "flower-simulation"
    cell = build_runtime(recipe(case), runtime, work / case, progress=False)
    result = {"sampled": [cell.sample_clients(r) for r in range(2)], "diverged": None}
    try:
        cell.run()
    except TrainingDiverged as error:
        result["diverged"] = str(error)
    result["history"] = load_checkpoint(cell.checkpoint_dir, cell.fingerprint).history
    return result


def stage_silo_data(paper: str, folder: Path) -> tuple:
    """A tiny cell of ``paper`` at embedded scale (2 rounds) and the folders its ``run_cell`` reads."""
    import pandas as pd

    from fedrepro.config import parse_params
    from fedrepro.io import write_json, write_table
    from fedrepro.models.backbone import train_wordpiece
    from test_config import with_change
    from toy import relation_parts

    params = parse_params(with_change("scale", "embedded"))
    tokenizer_dir = folder / "tokenizer"
    if paper == "fedcmc":
        from fedrepro.fedcmc.cells import Cell

        settings = params.fedcmc.settings.model_copy(update={"rounds": 2})
        params = params.model_copy(update={"fedcmc": params.fedcmc.model_copy(update={"settings": settings})})
        corpus, assignment, tokenizer = relation_parts()
        cell = Cell("fedavg", "synthetic", 0.5, 3, 1, 0)
        prepared, partitions = folder / "prepared", folder / "partitions"
        write_table(prepared / cell.dataset / "table.parquet", corpus.table)
        write_table(partitions / cell.partition / "assignment.parquet", assignment)
        write_json(partitions / cell.partition / "partition.json", {"classes": corpus.classes})
        tokenizer.save_pretrained(tokenizer_dir)
        return params, cell, (prepared, partitions, tokenizer_dir)
    from fedrepro.fedmatch.cells import Cell

    params = params.model_copy(update={"train": params.train.model_copy(update={"rounds": 2})})
    mined, texts = folder / "mined", []
    for index, client_id in enumerate(["bank", "clinic", "insurer"]):
        rows = [
            (
                f"{client_id}{q}",
                f"how do i file claim {q} at the {client_id}",
                f"p{q}",
                f"file form {q} online",
                f"n{q}{j}",
                f"policy rider {j} of {client_id}",
            )
            for q in range(4 + 2 * index)
            for j in range(2)
        ]
        candidates = [
            (split, f"{client_id}{q}", f"how do i file claim {q}", f"a{q}{k}", f"answer {k} form {q}", int(k == q % 3))
            for split in ("valid", "test")
            for q in range(3)
            for k in range(3)
        ]
        write_table(
            mined / client_id / "triples.parquet",
            pd.DataFrame(
                rows, columns=["question_id", "question", "positive_id", "positive", "negative_id", "negative"]
            ),
        )
        write_table(
            mined / client_id / "candidates.parquet",
            pd.DataFrame(candidates, columns=["split", "question_id", "question", "answer_id", "answer", "relevance"]),
        )
        texts += [text for row in rows for text in (row[1], row[3], row[5])] + [row[4] for row in candidates]
    train_wordpiece(pd.Series(texts), 300).save_pretrained(tokenizer_dir)
    return params, Cell("fedmatch_h_lr", 0), (mined, tokenizer_dir)


def run_stage_silo_local(case: str, work: Path) -> dict:
    """The paper's ``run_cell`` twice on the same cell: the engine, and flower-simulation with ``train.silo_local``;
    each one's metrics and output files, and what the silo-local run laid out under its checkpoint folder."""
    from fedrepro.fl.silo import SILOS

    paper = case.split("/")[1]
    runs = __import__(f"fedrepro.{paper}.runs", fromlist=["run_cell"])
    params, cell, folders = stage_silo_data(paper, work / case / "data")
    on_silos = params.model_copy(
        update={"train": params.train.model_copy(update={"runtime": "flower-simulation", "silo_local": True})}
    )
    result = {}
    for name, cell_params in (("engine", params), ("flower", on_silos)):
        out, checkpoints = work / case / name / "out", work / case / name / "checkpoints"
        metrics = runs.run_cell(cell_params, cell, *folders, out, checkpoints, "inputs")
        files = {
            str(p.relative_to(out)): p.read_text()
            for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "metrics.json"
        }
        result[name] = {"metrics": json.loads(json.dumps(metrics)), "files": files}
    silos = work / case / "flower" / "checkpoints" / SILOS
    result["silos"] = {p.name: sorted(f.name for f in p.iterdir()) if p.is_dir() else None for p in silos.iterdir()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--only", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--stage", type=Path, help="run the stage the stage-kill drill kills, in this folder")
    args = parser.parse_args()
    LocalFederation.node_timings = NODE_TIMINGS
    if args.stage is not None:
        return run_stage(args.stage)
    if args.out is None or args.work is None:
        parser.error("--out and --work are required")
    results = {}
    for case in args.only or all_cases():
        try:
            results[case] = run_case(case, args.work)
        except BaseException:
            print_federation_logs(args.work / case)
            raise
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True))


def print_federation_logs(folder: Path, lines: int = 20) -> None:
    """The last non-empty lines of each log a failed case's deployment left, with the file's last change, to stderr
    before the traceback: a failure seen only in CI must say which process stalled."""
    for log in sorted(folder.rglob("logs/*.log")):
        changed = time.strftime("%H:%M:%S", time.localtime(log.stat().st_mtime))
        plain = (re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip() for line in log.read_text(errors="replace").splitlines())
        tail = [line for line in plain if line and not line.endswith(":")][-lines:]
        print(
            f"--- {log.relative_to(folder)} (last written {changed}, now {time.strftime('%H:%M:%S')}):",
            *tail,
            sep="\n",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
