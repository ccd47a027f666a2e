"""A long-running Flower deployment: a node that joins late, a node that leaves for good and a server restarted from
its checkpoint while its nodes keep running. Each drill (``flower_long_running.py``) runs in a loopback-only network
namespace and is compared bit for bit with the engine's run of the same cell, with the deployment's misses replayed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from flower_cells import NODE_UNAVAILABLE  # noqa: E402
from flower_long_running import LATE_ROUNDS, LATECOMER, LEAVE_ROUNDS, LEAVER, RESTART_ROUNDS  # noqa: E402
from fedrepro.fl.flower.server import NO_NODE  # noqa: E402
from loopback import run_on_loopback  # noqa: E402

HERE = Path(__file__).resolve().parent
"""How the server records a message the SuperLink answered for a node it has marked offline."""


@pytest.fixture(scope="module")
def drills(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long-running")
    out = folder / "results.json"
    run_on_loopback(
        [sys.executable, str(HERE / "flower_long_running.py"), "--out", str(out), "--work", str(folder / "work")],
        timeout=900,
    )
    return json.loads(out.read_text())


def same_run(deployment: dict, engine: dict) -> None:
    """Histories (misses and bytes included), final global weights, every client's private state and the channel
    log (in any order within a round: the replayed engine logs a silent client's download after the uploads)."""
    for key in ("history", "global", "clients"):
        assert deployment[key] == engine[key], key
    assert sorted(map(json.dumps, deployment["messages"])) == sorted(map(json.dumps, engine["messages"]))


def test_a_node_that_joins_late_misses_the_rounds_before_and_trains_from_the_first_round_after(drills):
    """The SuperNode of one client (its key registered) is started only after round 1. The server waits
    ``nodes_timeout`` for one node per client, then starts with the two connected; every round that samples the
    missing client records it as missed ('no node serves it') and sends it nothing; the first round that opens after
    it connected asks it which client it serves, and from then on it trains whenever sampled, from a fresh state. The
    run equals bit for bit the engine's run in which that client misses the same rounds."""
    late = drills["late"]
    drill, deployment = late["drill"], late["flower-deployment"]
    history = deployment["history"]
    assert "drill_error" not in drill, drill.get("drill_error")
    assert drill["started_after_round"] >= 1
    assert LATECOMER not in drill["sampled"][0] and all(LATECOMER in sampled for sampled in drill["sampled"][1:])
    assert [record["round"] for record in history] == list(range(1, LATE_ROUNDS + 1)), "the run finished"
    joined = next((index for index, record in enumerate(history) if LATECOMER in record["clients"]), None)
    assert joined is not None, ("it never trained", history)
    assert joined >= 2, "round 2 opened before its node was started: it cannot have trained in it"
    for record in history[1:joined]:
        assert record["missed"] == {LATECOMER: NO_NODE} and record["clients"], record
    for index, record in enumerate(history[joined:], start=joined):
        assert "missed" not in record and record["clients"] == drill["sampled"][index], record
    assert "missed" not in history[0]
    identified = sorted(scalar[1] for scalar in deployment["scalars"] if scalar[0] == -1)
    assert identified == sorted(deployment["clients"]), "each node said once which client it serves"
    same_run(deployment, late["engine"])


def test_a_node_that_leaves_for_good_is_each_later_rounds_miss_and_the_others_lose_nothing(drills):
    """SIGKILL of one SuperNode after round 1, never restarted: round 2 (which does not sample it) runs as usual;
    every later round that samples it goes on without it, recording it in ``missed``: 'no reply' once the reply
    timeout has passed, or, as soon as the SuperLink has marked the node offline (two missed heartbeats, 10 s apart
    in the drills: ``NODE_TIMINGS``), Flower's own 'Node Unavailable' error at once. The other sampled client is
    counted, and the run finishes. Nothing is lost for the others: the run equals bit for bit the engine's run in
    which that client stops answering after round 1, and SCAFFOLD's server variate is still the mean of every
    client's, the departed client's last counted variate (read from its directory) included."""
    leave = drills["leave"]
    drill, history = leave["drill"], leave["flower-deployment"]["history"]
    assert "drill_error" not in drill, drill.get("drill_error")
    assert drill["killed_after_round"] == 1 and drill["state_files_at_kill"] == ["round-000000.safetensors"]
    assert [record["round"] for record in history] == list(range(1, LEAVE_ROUNDS + 1)), "the run finished"
    assert LEAVER in history[0]["clients"]
    for index, record in enumerate(history[1:], start=1):
        sampled = drill["sampled"][index]
        missed = record.get("missed", {})
        assert list(missed) == ([LEAVER] if LEAVER in sampled else []), record
        assert all(
            why.startswith(("no reply within train.reply_timeout", NODE_UNAVAILABLE)) for why in missed.values()
        ), record
        assert record["clients"] == [client for client in sampled if client != LEAVER], record
    assert any(LEAVER in drill["sampled"][index] for index in range(2, LEAVE_ROUNDS)), "a later round waited for it"
    same_run(leave["flower-deployment"], leave["engine"])
    assert drill["control_gap"] < 1e-5, drill["control_gap"]


def test_a_server_restarted_from_its_checkpoint_while_the_nodes_run_resumes_to_the_uninterrupted_run(drills):
    """SIGKILL of the ServerApp process after round 1, then ``flwr run`` again on the same SuperLink and SuperNodes:
    the new ServerApp resumes from round 2 (its log holds the first run's identification of the nodes and its own,
    round 1 is not trained again) and the run equals the engine's uninterrupted run bit for bit, every client's
    private state included: the nodes, whose ClientApps may still have trained round 2 for the dead server, went
    on from the state of the last round the new server counted. No SuperNode died or was restarted. (The dead
    run's ClientApps still waiting for their round-2 input retry for up to 80 min: ``RESTART_LAUNCHER_SLOTS``.)"""
    restart = drills["restart"]
    drill, deployment = restart["drill"], restart["flower-deployment"]
    assert "drill_error" not in drill, drill.get("drill_error")
    assert drill["killed_after_round"] == 1 and drill["server_apps_killed"] == 1
    assert [record["round"] for record in deployment["history"]] == list(range(1, RESTART_ROUNDS + 1))
    identified = [scalar for scalar in deployment["scalars"] if scalar[0] == -1]
    assert len(identified) == 2 * len(deployment["clients"]), "both ServerApps asked each node; the second resumed"
    assert all(record.get("missed") is None for record in deployment["history"])
    same_run(deployment, restart["engine"])
    assert deployment["messages"] == restart["engine"]["messages"], "in the engine's order too: nothing was missed"
    assert drill["supernode_exit_codes"] and set(drill["supernode_exit_codes"].values()) == {None}, (
        "every SuperNode ran from start to end"
    )
