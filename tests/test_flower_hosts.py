"""docs/flower.md's "Flower on several machines" as ``scripts/several_hosts.py`` runs it: each machine a network
namespace, linked by veth pairs on a private subnet with no route out, the SuperLink's certificate naming its address
on that link, every SuperNode registered by key. The run is bit-identical to the engine; a silo whose link goes down
mid-round misses that round and, its link up again, rejoins with its state intact; no namespace, veth or process is
left behind, also when the script is stopped with SIGTERM. Skipped where namespaces cannot be made (not root, no
iproute2).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from fedrepro.channel import Message
from fedrepro.fl.checkpoint import LATEST
from fedrepro.fl.flower.federation import CONNECTION, MARK
from fedrepro.fl.flower.launcher import children_folder
from fedrepro.fl.flower.node_state import NodeStateStore, collect_node_states
from fedrepro.fl.runtime import build_runtime
from flower_cells import NODE_TIMINGS, NODE_UNAVAILABLE, outcome, recipe
from scaffold_invariant import control_variate_gap, largest_control

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "several_hosts.py"
CASE = "hosts-relation/scaffold"
"""The relation cell with SCAFFOLD: state on the server and on every silo, so a lost or stale silo state shows."""
DRILL_CASE, DRILL_ROUNDS, DRILL_REPLY_TIMEOUT = "hosts-drill-relation/scaffold", 6, 60.0
"""The reply timeout bounds every round, and each ClientApp rebuilds the cell: a few seconds on an idle machine, but
over 30 s was seen on 2 cores with two trainings and other Flower tests beside it (a healthy round then failed)."""


def several_machines_section() -> str:
    docs = (ROOT / "docs" / "flower.md").read_text()
    start = docs.index("## Flower on several machines")
    return docs[start : docs.index("**Trust model.**", start)].replace("\\\n", " ")


def flags(command: list[str]) -> list[str]:
    return [token for token in command if token.startswith("--")]


def test_the_docs_several_machines_steps_are_the_scripts():
    """The docs' steps and the script that the tests below run must not drift apart: the same SuperLink and SuperNode
    flags, and the same helpers and CLI calls for the keys, the registration, the app and the run."""
    loaded = importlib.util.spec_from_file_location("several_hosts", SCRIPT)
    script = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(script)
    section, source = several_machines_section(), SCRIPT.read_text()
    entries = {"superlink": "flower-superlink ", "supernode": "fedrepro.fl.flower.supernode "}
    commands = {
        name: next(line.split(entry)[1].split() for line in section.splitlines() if entry in line)
        for name, entry in entries.items()
    }
    certificates = {"ca": Path("ca.crt"), "cert": Path("c.pem"), "key": Path("c.key")}
    assert flags(commands["superlink"]) == flags(script.superlink_command(certificates, "10.0.0.5"))
    assert flags(commands["supernode"]) == flags(script.supernode_command("a:1", Path("ca"), Path("k"), "c", Path("s")))
    assert "scripts/several_hosts.py" in section
    steps = {
        name: name
        for name in (
            "make_certificates",
            "make_node_key",
            "shim_script",
            "fedrepro.fl.flower.launcher",
            "write_recipe_spec",
            "write_app",
        )
    }
    steps.update(
        {
            '"supernode", "ls", CONNECTION': "flwr supernode ls fedrepro",
            '"supernode", "register", str(public), CONNECTION': "flwr supernode register client_03.pub fedrepro",
            '"run", str(app), CONNECTION, "--format", "json"': "flwr run run/app fedrepro --format json",
            '"log", run_id, CONNECTION, "--show"': "flwr log <id> fedrepro --show",
            '"ls", CONNECTION, "--run-id", run_id, "--format", "json"': "flwr ls fedrepro --run-id <id> --format json",
        }
    )
    for in_script, in_docs in steps.items():
        assert in_script in source and in_docs in section, (in_script, in_docs)


@pytest.fixture(scope="module")
def namespaces():
    """Skips the module where this machine cannot make a network namespace with a veth in it."""
    if shutil.which("ip") is None:
        pytest.skip("several hosts need iproute2's `ip` to make network namespaces and veth pairs")
    if os.geteuid() != 0:
        pytest.skip("several hosts need root to make network namespaces (`ip netns add`)")
    probe = f"fedrepro-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode == 0:
        made = subprocess.run(
            ["ip", "-n", probe, "link", "add", "name", "probe0", "type", "veth", "peer", "name", "probe1"],
            capture_output=True,
            text=True,
        )
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"this machine cannot make a network namespace with a veth pair: {made.stderr.strip()}")


def host_veths() -> list[str]:
    listing = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True)
    return listing.stdout.splitlines()


@pytest.fixture
def started():
    """The scripts a test starts; one still running when the test ends (a failed assertion, a timeout) gets SIGTERM,
    on which it removes its hosts."""
    scripts: list[subprocess.Popen] = []
    yield scripts
    for script in scripts:
        if script.poll() is None:
            script.terminate()
            script.communicate(timeout=300)


def start_script(
    started: list,
    work: Path,
    case: str,
    rounds: int,
    prefix: str,
    reply_timeout: float | None = None,
    node_timings: bool = False,
) -> subprocess.Popen:
    """The script on ``case``; ``node_timings``: its SuperNodes with the drills' ``NODE_TIMINGS`` instead of
    Flower's (the docs' ``flower-supernode``)."""
    spec = work / "spec.json"
    work.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps({"factory": "flower_cells:recipe", "kwargs": {"case": case, "rounds": rounds}}))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    command = [
        sys.executable,
        str(SCRIPT),
        "--recipe",
        str(spec),
        "--work",
        str(work / "run"),
        "--prefix",
        prefix,
        "--timeout",
        "400",
    ]
    if reply_timeout is not None:
        command += ["--reply-timeout", str(reply_timeout)]
    if node_timings:
        command += [
            "--heartbeat-interval",
            str(NODE_TIMINGS.heartbeat_interval),
            "--pull-interval",
            str(NODE_TIMINGS.pull_interval),
        ]
    started.append(
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    )
    return started[-1]


def finish(script: subprocess.Popen, timeout: float = 500) -> str:
    out, err = script.communicate(timeout=timeout)
    assert script.returncode == 0, f"several_hosts.py exited {script.returncode}:\n{err[-4000:]}"
    return out


def left_behind(work: Path, prefix: str) -> dict:
    """The script's namespaces still listed and its processes (marked with its work folder) still running."""
    namespaces = [
        line.split()[0]
        for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    ]
    mark = f"{MARK}={work / 'run'}:".encode()
    processes = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if any(entry.startswith(mark) for entry in environ.read_bytes().split(b"\0")):
                processes.append((environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return {"namespaces": [n for n in namespaces if n.startswith(f"{prefix}-")], "processes": processes}


def flower_outcome(case: str, rounds: int, run: Path) -> dict:
    """The run as the script left it: the server's checkpoint and each silo's state directory."""
    flower = build_runtime(recipe(case, rounds), "engine", run / "server", progress=False)
    assert flower.state.next_round == rounds, "the server checkpointed every round"
    flower.channel.messages = [Message.from_record(record) for record in flower.state.messages]
    collect_node_states(flower, run / "nodes")
    return {
        **outcome(flower),
        "control_gap": control_variate_gap(flower.state.global_weights, flower.state.client_states, flower.train_ids),
    }


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


def launcher_pid(namespace: str) -> int:
    """The ClientApp launcher running on a silo's host."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    return next(int(pid) for pid in pids if b"fedrepro.fl.flower.launcher" in Path(f"/proc/{pid}/cmdline").read_bytes())


def online_silos(run: Path, hosts: dict) -> int:
    """How many SuperNodes the SuperLink lists online, asked with the Flower CLI on the experimenter's host."""
    home = run / "hosts" / "experimenter"
    listing = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            hosts["experimenter"]["namespace"],
            str(Path(sys.executable).parent / "flwr"),
            "supernode",
            "ls",
            CONNECTION,
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        cwd=home,
        env={**os.environ, "FLWR_HOME": str(home / "flwr-home")},
    )
    try:
        return sum(node["status"] == "online" for node in json.loads(listing.stdout)["nodes"])
    except (ValueError, KeyError):
        return 0


def rounds_checkpointed(run: Path) -> int:
    try:
        return json.loads((run / "server" / LATEST / "state.json").read_text())["next_round"]
    except (OSError, ValueError, KeyError):
        return 0


def test_the_several_machines_recipe_on_namespaces_gives_the_engines_run_and_leaves_nothing(
    namespaces, started, tmp_path
):
    veths = host_veths()
    prefix = f"frh{os.getpid()}"
    script = start_script(started, tmp_path, CASE, 2, prefix)
    run = tmp_path / "run"
    seen: dict = {}

    def look_at_the_hosts() -> bool:
        """While the run is on: each host's routes and addresses (once the SuperLink is up)."""
        if not (run / "hosts.json").exists():
            return script.poll() is not None
        hosts = json.loads((run / "hosts.json").read_text())
        for host in [hosts["superlink"], hosts["experimenter"], *hosts["silos"].values()]:
            seen[host["address"]] = subprocess.run(
                ["ip", "-n", host["namespace"], "route", "show"], capture_output=True, text=True
            ).stdout.splitlines()
        return True

    wait_for(look_at_the_hosts, 300, "the hosts")
    finish(script)
    engine = build_runtime(recipe(CASE), "engine", tmp_path / "engine", progress=False)
    engine.run()
    expected, flower = outcome(engine), flower_outcome(CASE, 2, run)
    for key in ("history", "global", "clients", "messages"):
        assert flower[key] == expected[key], key
    assert flower["server_checkpoint_clients"] == []
    assert len(seen) == 5, "the SuperLink's host, the experimenter's and three silos'"
    assert all(len(routes) == 1 and routes[0].startswith("10.77.0.0/24 dev ") for routes in seen.values()), (
        "each host reaches the link's subnet and nothing else: no default route",
        seen,
    )
    assert "10.77.0." not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout, (
        "the machine's own namespace has no route into the link"
    )
    certificate = (run / "hosts" / "superlink" / "certs" / "superlink.pem").read_bytes()
    from cryptography import x509

    names = x509.load_pem_x509_certificate(certificate).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "10.77.0.1" in {str(ip) for ip in names.value.get_values_for_type(x509.IPAddress)}
    superlink_log = (run / "logs" / "superlink-superlink.log").read_text()
    assert "Fleet HTTP API on 10.77.0.1:8000" in superlink_log
    for silo in ("client_00", "client_01", "client_02"):
        assert "Starting Flower SuperNode" in (run / "logs" / f"{silo}-supernode.log").read_text()
    assert left_behind(tmp_path, prefix) == {"namespaces": [], "processes": []}
    assert host_veths() == veths, "no veth was made or left on the machine's own namespace"


def test_a_silo_whose_link_goes_down_mid_round_misses_it_and_rejoins_with_its_state_intact(
    namespaces, started, tmp_path
):
    """The link of a silo sampled in rounds 1 and 2 is taken down while its ClientApp works on round 2: round 2 ends
    without it (``missed``) once the SuperLink has marked the silo offline (two missed heartbeats: the SuperNodes run
    with the drills' ``NODE_TIMINGS``, 20 s, before the reply timeout), the link comes up once round 2 is
    checkpointed, and the silo trains again in a later round. Round 3 (which does not sample it) is held until the
    silo is online again, its other silos' ClientApp launchers paused: the silo's heartbeats back off while its link
    is down (up to 20 s apart), and rounds of this cell take about 2 s, so without the hold it was once still offline
    when the last round had passed. Its state is what it held: the files it had when the
    link went down are kept unchanged, and SCAFFOLD's invariant (the server's variate is the mean of every client's)
    holds at the end, which it would not had the silo gone on from the round-2 state the server never counted."""
    prefix = f"frd{os.getpid()}"
    cell = build_runtime(recipe(DRILL_CASE, DRILL_ROUNDS), "engine", tmp_path / "sampling", progress=False)
    sampled = [cell.sample_clients(r) for r in range(DRILL_ROUNDS)]
    victim = max(sorted(set(sampled[0]) & set(sampled[1])), key=lambda c: sum(c in later for later in sampled[2:]))
    assert any(victim in later for later in sampled[2:]), sampled
    script = start_script(started, tmp_path, DRILL_CASE, DRILL_ROUNDS, prefix, DRILL_REPLY_TIMEOUT, node_timings=True)
    run = tmp_path / "run"
    drill: dict = {}

    def state_files(state_dir: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(state_dir.glob("*.safetensors"))}

    def working(pid: int) -> bool:  # the launcher lists an ended ClientApp until its next fork reaps it
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def link_down_and_up() -> None:
        try:
            wait_for(lambda: (run / "hosts.json").exists(), 300, "the hosts")
            hosts = json.loads((run / "hosts.json").read_text())
            silo = hosts["silos"][victim]
            link, state_dir = (
                ["ip", "-n", silo["link"]["namespace"], "link", "set", silo["link"]["device"]],
                Path(silo["state_dir"]),
            )
            children = children_folder(silo["launcher_socket"])
            wait_for(lambda: rounds_checkpointed(run) >= 1, 300, "round 1")
            wait_for(
                lambda: any(working(int(p.name)) for p in children.glob("*")),
                60,
                f"the ClientApp of {victim} in round 2",
            )
            subprocess.run([*link, "down"], check=True)
            drill["files_at_down"] = state_files(state_dir)
            held = NodeStateStore(state_dir, cell.fingerprint).latest_until(DRILL_ROUNDS).tensors
            drill["control_off_if_lost"] = largest_control(held) / len(cell.train_ids)
            wait_for(lambda: rounds_checkpointed(run) >= 2, 300, "round 2 without the silo")
            drill["files_before_up"] = state_files(state_dir)
            others = [launcher_pid(host["namespace"]) for client, host in hosts["silos"].items() if client != victim]
            for pid in others:
                os.kill(pid, signal.SIGSTOP)
            try:
                subprocess.run([*link, "up"], check=True)
                drill["up_after_round"] = rounds_checkpointed(run)
                wait_for(lambda: online_silos(run, hosts) == len(hosts["silos"]), 120, f"{victim} online again")
            finally:
                for pid in others:
                    os.kill(pid, signal.SIGCONT)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            drill["error"] = repr(error)

    thread = threading.Thread(target=link_down_and_up, daemon=True)
    thread.start()
    finish(script)
    thread.join(timeout=10)
    assert "error" not in drill, drill["error"]
    flower = flower_outcome(DRILL_CASE, DRILL_ROUNDS, run)
    history = flower["history"]
    assert list(history[1]["missed"]) == [victim] and victim not in history[1]["clients"]
    assert history[1]["missed"][victim].startswith(NODE_UNAVAILABLE), "the miss says why: the SuperLink's own answer"
    assert history[1]["clients"], "the other silo sampled in round 2 was counted"
    assert list(drill["files_at_down"]) == ["round-000000.safetensors"], "the link went down before round 2's reply"
    assert drill["files_before_up"].items() >= drill["files_at_down"].items(), "the state it held is kept as it was"
    rejoined = history[drill["up_after_round"] :]
    assert any(victim in record["clients"] for record in rejoined), (victim, history)
    assert flower["control_gap"] <= 1e-3 * drill["control_off_if_lost"], (
        "the silo went on from the state the server counted (c = mean of every client's c_k)",
        flower["control_gap"],
    )
    assert left_behind(tmp_path, prefix) == {"namespaces": [], "processes": []}


def test_sigterm_stops_the_script_and_leaves_no_namespace_veth_or_process(namespaces, started, tmp_path):
    veths = host_veths()
    prefix = f"frt{os.getpid()}"
    script = start_script(started, tmp_path, CASE, 2, prefix)
    wait_for(
        lambda: (tmp_path / "run" / "logs" / "client_02-supernode.log").exists() or script.poll() is not None,
        300,
        "the last silo's SuperNode",
    )
    assert script.poll() is None, script.communicate()[1][-4000:]
    assert left_behind(tmp_path, prefix)["processes"], "the federation's processes run"
    script.send_signal(signal.SIGTERM)
    script.communicate(timeout=120)
    assert script.returncode != 0
    assert left_behind(tmp_path, prefix) == {"namespaces": [], "processes": []}
    assert host_veths() == veths
