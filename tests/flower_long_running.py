"""Drills of a long-running Flower deployment, for test_flower_long_running.py: a node that joins late, a node that
leaves for good and a server restarted from its checkpoint while its nodes keep running.

Each drill trains the tiny SCAFFOLD relation cell of ``flower_cells`` (server and client state both) on a local
deployment and, beside it, the engine's reference for the same cell: the plain engine, or the engine with the
deployment's misses replayed (``ReplayedMisses``), so that what the other clients trained, what the server
aggregated and what crossed can be compared bit for bit. A separate process, started inside a loopback-only network
namespace (``loopback.py``), as ``flower_cells.py`` is.

Usage: python tests/flower_long_running.py --out results.json --work DIR [--only DRILL ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fedrepro.channel import SERVER  # noqa: E402
from fedrepro.fl.engine import Engine  # noqa: E402
from fedrepro.fl.flower import launcher  # noqa: E402
from fedrepro.fl.flower.deployment import rounds_checkpointed  # noqa: E402
from fedrepro.fl.flower.federation import CONNECTION, LocalFederation, wait_until, write_app  # noqa: E402
from fedrepro.fl.flower.server import NO_NODE  # noqa: E402
from fedrepro.fl.runtime import build_runtime  # noqa: E402
from flower_cells import NODE_TIMINGS, outcome, recipe  # noqa: E402
from scaffold_invariant import control_variate_gap  # noqa: E402

LATE, LEAVE, RESTART = "late-relation/scaffold", "leave-relation/scaffold", "restart-relation/scaffold"
LATE_ROUNDS, LEAVE_ROUNDS, RESTART_ROUNDS = 5, 3, 3
LATECOMER = "client_00"
"""Not sampled in round 1 of the cell, sampled in rounds 2 to 5: its SuperNode starts once round 1 is over, after
round 2 has opened without it (the server looks for new nodes as a round opens), so it surely misses round 2; round 2
is held until it is online (``run_late``), so round 3 is the first round that opens after it connected."""
LATE_NODES_TIMEOUT = 2.0
"""How long the server waits for the latecomer before round 1: the other nodes are online before the run starts
(``run_late`` waits for them), so the wait only has to be seen to end without the latecomer, and each second of it
is a second of the drill."""
LEAVER = "client_02"
"""Sampled in rounds 1 and 3 (not 2) of the cell: it trains round 1, is killed while round 2 runs without it, and
round 3 waits for it in vain (a fourth round would not sample it: ``LEAVE_ROUNDS`` stops at 3)."""
RESTART_LAUNCHER_SLOTS = 4
"""The dead run's ClientApps that were waiting for their round-2 input when its ServerApp died keep retrying to pull it
(Flower gives up after 500 tries, about 80 min): on the 2 slots a 2-core machine gets they held every slot, and the
restarted server never heard from its nodes. Four leave the second run room."""
REPLY_TIMEOUT = 300.0
"""Ample for a healthy node on a loaded 2-core machine (at 60 s both healthy clients once missed round 1), and no
cost to the drills: the wait for a dead node ends once the SuperLink has marked it offline (within twice the
heartbeat interval of ``NODE_TIMINGS``, 20 s, after its last heartbeat) and answers for it at once."""


class ReplayedMisses(Engine):
    """The engine with a deployment's misses replayed: in round r the clients of ``missed[r]`` do not train, but
    were sent the round's weights, as on Flower (the server pushed their messages), unless no node served them."""

    def __init__(self, *args, missed: dict[int, dict[str, str]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.missed = missed

    def train_clients(self, round_index, sampled, outgoing):
        missed = self.missed.get(round_index, {})
        updates, losses, refused = super().train_clients(round_index, [c for c in sampled if c not in missed], outgoing)
        self.channel.broadcast(round_index, SERVER, [c for c, why in missed.items() if why != NO_NODE], outgoing)
        return updates, losses, {**refused, **missed}


def reference(case: str, rounds: int, folder: Path, history: list[dict]) -> dict:
    """The engine's run of the cell with the misses of ``history`` replayed (none: the plain engine's run)."""
    cell = recipe(case, rounds)
    task, algorithm = cell.build()
    missed = {record["round"] - 1: record["missed"] for record in history if "missed" in record}
    engine = ReplayedMisses(task, algorithm, cell.settings, folder, cell.fingerprint, progress=False, missed=missed)
    engine.run()
    return outcome(engine)


def checkpointed(deployment) -> int:
    """Rounds the deployment's server has checkpointed so far."""
    return rounds_checkpointed(deployment.checkpoint_dir)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 20 ms (a drill acts right after a round closes, before the next gets far)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def command_line(pid: int) -> bytes:
    """A process's command line (empty once it has ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def in_background(deployment, drill: Callable, record: dict) -> None:
    """Run ``drill(federation)`` in a thread once the federation is up; its failure is recorded, not lost."""

    def guarded(federation) -> None:
        try:
            drill(federation)
        except BaseException as error:  # noqa: BLE001 - reported in the drill's outcome
            record["drill_error"] = repr(error)

    def start(federation) -> None:
        record["thread"] = threading.Thread(target=guarded, args=(federation,), daemon=True)
        record["thread"].start()

    deployment.on_federation_up = start


def run_leave(work: Path) -> dict:
    """The SuperNode of ``LEAVER`` is killed with SIGKILL right after round 1 closes and never restarted."""
    folder = work / LEAVE
    deployment = build_runtime(
        recipe(LEAVE, LEAVE_ROUNDS),
        "flower-deployment",
        folder / "deployment",
        progress=False,
        reply_timeout=REPLY_TIMEOUT,
    )
    drill: dict = {"sampled": [deployment.sample_clients(r) for r in range(LEAVE_ROUNDS)]}

    def leave(federation) -> None:
        wait_for(lambda: checkpointed(deployment) >= 1, 600, "round 1")
        os.kill(federation.processes[deployment.node_name(LEAVER)].pid, signal.SIGKILL)
        drill["killed_after_round"] = checkpointed(deployment)
        drill["state_files_at_kill"] = sorted(p.name for p in (deployment.nodes_root / LEAVER).glob("*.safetensors"))

    in_background(deployment, leave, drill)
    started = time.monotonic()
    deployment.run()
    drill["seconds"] = time.monotonic() - started
    drill.pop("thread").join(timeout=5)
    result = outcome(deployment)
    drill["control_gap"] = control_variate_gap(
        deployment.state.global_weights, deployment.state.client_states, deployment.train_ids
    )
    return {
        "drill": drill,
        "flower-deployment": result,
        "engine": reference(LEAVE, LEAVE_ROUNDS, folder / "engine", result["history"]),
    }


def run_restart(work: Path) -> dict:
    """The ServerApp process alone is killed with SIGKILL right after round 1 closes (a crash: nothing is stopped
    or cleaned up), and ``flwr run`` is given the same app again on the same SuperLink, whose SuperNodes, launcher
    and node directories were never touched; the dead run is left as the crash left it."""
    folder = work / RESTART
    deployment = build_runtime(
        recipe(RESTART, RESTART_ROUNDS),
        "flower-deployment",
        folder / "deployment",
        progress=False,
        reply_timeout=REPLY_TIMEOUT,
    )
    deployment.launcher_slots = RESTART_LAUNCHER_SLOTS
    drill: dict = {}

    def clientapps_left(federation) -> None:
        """Once the last round is checkpointed: the ClientApps still running (none of the second run is left)."""
        wait_for(lambda: checkpointed(deployment) >= RESTART_ROUNDS, 900, "the last round")
        children = launcher.children_folder(federation.launcher_socket).iterdir()
        running = [entry.name for entry in children if command_line(int(entry.name))]  # zombies have none
        drill["clientapps_left_running"] = len(running)

    def crashed_first_run(federation) -> None:
        """Start the run, kill its ServerApp after round 1; ``deployment.run`` then starts the second."""
        app = write_app(
            federation.folder / "first-app",
            deployment.checkpoint_dir / "recipe.json",
            deployment.checkpoint_dir,
            REPLY_TIMEOUT,
        )
        federation.flwr("run", str(app), CONNECTION)
        wait_for(lambda: checkpointed(deployment) >= 1, 600, "round 1")
        server_apps = [
            pid
            for pid in federation.family("superlink", federation.processes["superlink"])
            if b"flwr-serverapp" in command_line(pid)
        ]
        for pid in server_apps:
            os.kill(pid, signal.SIGKILL)
        drill["killed_after_round"] = checkpointed(deployment)
        drill["server_apps_killed"] = len(server_apps)
        drill["federation"] = federation
        threading.Thread(target=clientapps_left, args=(federation,), daemon=True).start()

    deployment.on_federation_up = crashed_first_run
    started = time.monotonic()
    deployment.run()
    drill["seconds"] = time.monotonic() - started
    federation = drill.pop("federation")
    drill["supernode_exit_codes"] = {
        name: code for name, code in federation.exit_codes.items() if name.startswith("supernode-")
    }  # None: still running when the run was over
    result = outcome(deployment)
    return {
        "drill": drill,
        "flower-deployment": result,
        "engine": reference(RESTART, RESTART_ROUNDS, folder / "engine", []),
    }


def run_late(work: Path) -> dict:
    """The SuperNode of ``LATECOMER`` (its key made and registered as it starts) is started only once round 1 is
    checkpointed. The run is started once the other nodes are online; its server waits ``LATE_NODES_TIMEOUT`` for
    the missing one, then starts without it. While the latecomer starts, the ClientApp launcher is paused (SIGSTOP,
    then SIGCONT once the latecomer is online), so round 2, opened without it, cannot end before it is there: a
    round of this tiny cell takes about 2 s, less than a SuperNode's start, and without the pause the latecomer was
    seen joining after the last round had opened, never to train."""
    folder = work / LATE
    deployment = build_runtime(
        recipe(LATE, LATE_ROUNDS),
        "flower-deployment",
        folder / "deployment",
        progress=False,
        reply_timeout=REPLY_TIMEOUT,
    )
    deployment.nodes_timeout = LATE_NODES_TIMEOUT
    drill: dict = {"sampled": [deployment.sample_clients(r) for r in range(LATE_ROUNDS)]}
    start_node = deployment.start_node

    def start_all_but_the_latecomer(federation, client_id: str):
        return None if client_id == LATECOMER else start_node(federation, client_id)

    def online(federation) -> int:
        listing = json.loads(federation.flwr("supernode", "ls", CONNECTION, "--format", "json").stdout)
        return sum(node["status"] == "online" for node in listing["nodes"])

    def join(federation) -> None:
        wait_for(lambda: checkpointed(deployment) >= 1, 600, "round 1")
        launcher_pid = federation.processes["launcher"].pid
        os.kill(launcher_pid, signal.SIGSTOP)
        try:
            start_node(federation, LATECOMER)
            drill["started_after_round"] = checkpointed(deployment)
            wait_until(lambda: online(federation) == len(deployment.train_ids), 300, "the latecomer")
        finally:
            os.kill(launcher_pid, signal.SIGCONT)

    deployment.start_node = start_all_but_the_latecomer
    in_background(deployment, join, drill)
    join_later = deployment.on_federation_up

    def start(federation) -> None:
        wait_until(lambda: online(federation) == len(deployment.train_ids) - 1, 300, "the other SuperNodes")
        join_later(federation)

    deployment.on_federation_up = start
    started = time.monotonic()
    deployment.run()
    drill["seconds"] = time.monotonic() - started
    drill.pop("thread").join(timeout=5)
    result = outcome(deployment)
    return {
        "drill": drill,
        "flower-deployment": result,
        "engine": reference(LATE, LATE_ROUNDS, folder / "engine", result["history"]),
    }


DRILLS = {"late": run_late, "leave": run_leave, "restart": run_restart}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--only", nargs="*", choices=sorted(DRILLS), help="drills to run (default: all)")
    args = parser.parse_args()
    LocalFederation.node_timings = NODE_TIMINGS
    results = {}
    for name in args.only or DRILLS:
        results[name] = DRILLS[name](args.work)
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
