"""The processes of a real Flower deployment on this machine: a SuperLink and one SuperNode per client, TLS with
certificates generated here (``fedrepro.fl.flower.certificates``), SuperNodes authenticated by key, and ``flwr run``
against it.

``LocalFederation`` starts and stops the processes (each in its own session; stopping ends them and everything they
started, so no process outlives the run), and a reaper (``fedrepro.fl.flower.reaper``) ends them all within a second of
the federation's own process dying, SIGKILL included. What a process started is found by ``MARK``, an environment
variable every process inherits from the one the federation spawned, not by the process tree: Flower starts its
SuperExecs in sessions of their own, and once a SuperLink or SuperNode dies its children are re-parented, so a SuperLink
killed mid-run left its ServerApp running long after the stage had failed. While a run is on, a SuperNode that died
unasked (a crashed silo) has its SuperExec and ClientApps ended at once (``end_dead_supernodes``): otherwise the dead
node stays a zombie of this process, Flower's parent monitors keep its SuperExec alive, and the ClientApp that SuperExec
started retries its dead node forever in one of the launcher's few slots, so every other node's ClientApp queued behind
it and the round never ended. Every address is loopback; ports are picked free. The same pieces spread over machines are
in the README ("The same algorithms on Flower"): the SuperLink's certificate must name its address, each SuperNode gets
the CA certificate, its own key (registered with ``flwr supernode register``) and its ``client-id`` / ``state-dir`` node
config.

The nodes run each message's ClientApp in a process forked by a warm launcher (``fedrepro.fl.flower.launcher``) that
has torch and the cell's modules imported already, one at a time per core budget of the cell.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedrepro.errors import FederationError
from fedrepro.fl.flower import launcher, reaper
from fedrepro.fl.flower.certificates import LOOPBACK, make_certificates
from fedrepro.fl.flower.common import CHECKPOINT_KEY, NODES_TIMEOUT, NODES_TIMEOUT_KEY, RECIPE_KEY, REPLY_TIMEOUT_KEY

logger = logging.getLogger(__name__)
CONNECTION = "fedrepro"
"""The SuperLink connection's name in the federation's own Flower config (``$FLWR_HOME/config.toml``)."""
TASK_POLL_SECONDS = "0.2"
"""How often a SuperExec asks its SuperNode for a message to run (Flower's default: every second)."""
MARK = reaper.MARK
"""Set to ``<federation folder>:<process name>`` in the environment of each process the federation spawns, and so of
everything that process starts (see the module docstring)."""
STATUS_EVERY_SECONDS = 10.0
"""While the run's checkpoint is not final, ask Flower for the run's status this often (each ask is a CLI process)."""
SUPERLINK_EXIT_GRACE = 5.0
"""When ``flwr ls`` gets no answer, wait this long for the SuperLink to exit before blaming anything else: one killed
while the CLI asked closes its port a moment before its exit can be seen."""
APP_TOML = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedrepro-cell"
version = "1.0.0"
description = "One fedrepro cell: the engine's algorithms on Flower"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedrepro"

[tool.flwr.app.components]
serverapp = "{serverapp}"
clientapp = "{clientapp}"

[tool.flwr.app.config]
{config}
"""


@dataclass(frozen=True)
class NodeTimings:
    """How often a SuperNode talks to its SuperLink, which Flower fixes (``fedrepro.fl.flower.supernode`` sets them).

    ``heartbeat_interval``: seconds between the heartbeats the SuperLink expects from the node; it marks a node that
    missed two offline, answers the messages sent to it with "Node Unavailable" and only then lets its key in again (a
    crashed silo's restart). Flower accepts 10 s to 30 min. ``pull_interval``: at most this long between two asks of
    an idle node for a message (and between two looks for its ClientApp's reply). Flower's values by default: the
    drills of the tests, where every process is on one machine, set short ones so that a dead node is seen dead and a
    message is picked up sooner."""

    heartbeat_interval: float = 30.0
    pull_interval: float = 3.0


def supernode_command(arguments: list[str], timings: NodeTimings = NodeTimings()) -> list[str]:
    """Flower's SuperNode with ``arguments``, through ``fedrepro.fl.flower.supernode``: it refuses, with the reason,
    TLS settings that could never join the SuperLink, and sets ``timings`` where they are not Flower's."""
    command = [sys.executable, "-m", "fedrepro.fl.flower.supernode"]
    if timings != NodeTimings():
        command += ["--heartbeat-interval", str(timings.heartbeat_interval)]
        command += ["--pull-interval", str(timings.pull_interval)]
    return command + arguments


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise FederationError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.5)


def listed_run(answer: str, run_id: str) -> dict[str, Any]:
    """Run ``run_id``'s entry in ``flwr ls --run-id <id> --format json``'s ``answer`` (that command exits 0 with
    ``"success": false`` when it cannot answer, so a missing entry is the error)."""
    runs = json.loads(answer).get("runs")
    if not runs:
        raise FederationError(f"`flwr ls --run-id {run_id}` did not list Flower run {run_id}: {answer[-2000:]}")
    return runs[0]


def wait_for_run(
    run_id: str,
    listing: Callable[[], dict[str, Any]],
    log: Callable[[], str],
    timeout: float,
    looks_done: Callable[[], bool] = lambda: False,
    on_poll: Callable[[], None] = lambda: None,
    timeout_name: str = "the run's timeout",
) -> dict[str, Any]:
    """Wait until Flower run ``run_id`` is over and return its ``flwr ls`` entry (``listing()``); one that did not
    complete raises with the end of its log (``log()``). Flower is asked when ``looks_done()`` (say, the last
    checkpoint is there), else every ``STATUS_EVERY_SECONDS`` (each ask is a CLI process); ``on_poll`` runs on every
    poll (a harness checks its processes there). Past ``timeout`` seconds (``timeout_name`` says which setting that
    is) it raises; the server's checkpoints stay, so running it again resumes."""
    asked = time.monotonic()

    def finished() -> bool:
        nonlocal asked
        on_poll()
        if not looks_done() and time.monotonic() - asked < STATUS_EVERY_SECONDS:
            return False
        asked = time.monotonic()
        return listing()["status"].startswith("finished")

    wait_until(
        finished,
        timeout,
        f"Flower run {run_id} to end ({timeout_name}; the server's checkpoints are kept, "
        f"so running it again resumes from the last one)",
    )
    run = listing()
    if run["status"] != "finished:completed":
        raise FederationError(f"Flower run {run_id} ended {run['status']}: {log()[-3000:]}")
    return run


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first found first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _marked(mark: str) -> list[int]:
    """The live processes whose environment holds ``MARK=mark`` (zombies have no environment left)."""
    return [pid for pid, their_mark in reaper.marked(mark).items() if their_mark == mark]


def write_app(
    folder: Path,
    recipe_spec: Path,
    checkpoint_dir: Path,
    reply_timeout: float | None = None,
    nodes_timeout: float = NODES_TIMEOUT,
) -> Path:
    """The Flower App ``flwr run`` sends for a horizontal cell (``fedrepro.fl.flower.apps``) with its run config: the
    recipe spec the apps rebuild the cell from, where the server checkpoints, the reply timeout, how long the server
    waits for one node per client before its first round."""
    return write_flower_app(
        folder,
        "fedrepro.fl.flower.apps:server_app",
        "fedrepro.fl.flower.apps:client_app",
        {
            RECIPE_KEY: str(recipe_spec),
            CHECKPOINT_KEY: str(checkpoint_dir),
            REPLY_TIMEOUT_KEY: float(reply_timeout or 0),
            NODES_TIMEOUT_KEY: float(nodes_timeout),
        },
    )


def write_flower_app(folder: Path, serverapp: str, clientapp: str, config: dict[str, str | float]) -> Path:
    """A Flower App folder: only a pyproject.toml naming the components (``module:object``) and the run config."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = "\n".join(f"{key} = {json.dumps(value)}" for key, value in config.items())
    (folder / "pyproject.toml").write_text(APP_TOML.format(serverapp=serverapp, clientapp=clientapp, config=lines))
    return folder


@contextlib.contextmanager
def stopped_cleanly_on_sigterm() -> Any:
    """Turn SIGTERM into SystemExit while the federation runs, so a stage killed by DVC or a CI timeout still stops
    the processes it started (Python's default SIGTERM ends the process without running ``finally``)."""

    def leave(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----- the federation's processes -----------------------------------------------------------------------
class LocalFederation:
    """A SuperLink with TLS and SuperNode authentication, and SuperNodes, all on loopback, under ``folder``."""

    node_timings = NodeTimings()
    """The timings of the SuperNodes every federation of this process starts (a test harness sets shorter ones)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).resolve()
        self.home = self.folder / "flwr-home"
        self.logs = self.folder / "logs"
        self.port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        self.reaper: subprocess.Popen | None = None
        """The reaper of this federation's processes (``fedrepro.fl.flower.reaper``), from the first process it
        spawns until ``stop_all``."""
        self.exit_codes: dict[str, int | None] = {}
        """Per stopped process: its exit code if it had ended by itself before ``stop``, else None."""
        self.ended: set[int] = set()
        """The pids of SuperNodes that died unasked and whose SuperExec and ClientApps were ended."""
        self.certificates: dict[str, Path] = {}
        self.node_keys = self.folder / "node-keys"
        """Each SuperNode's key pair (``certificates.make_node_key``), emptied when the SuperLink starts: a key on file
        is one this SuperLink registered."""
        self.launcher_socket = Path(tempfile.mkdtemp(prefix="fedrepro-launcher-")) / "socket"
        """In a short temporary folder: a Unix socket's path may not exceed about 100 bytes."""
        launcher.shim_script(self.folder / "bin")
        self.environment = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": TASK_POLL_SECONDS,
            launcher.SOCKET_ENV: str(self.launcher_socket),
            "PATH": os.pathsep.join(
                [str(self.folder / "bin"), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
            ),
        }

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.reaper is None:
            self.reaper = self._start_reaper()
        log = open(self.logs / f"{name}.log", "ab")
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.folder,
            env={**self.environment, MARK: self._mark(name)},
            start_new_session=True,
        )
        log.close()
        self.processes[name] = process
        return process

    def _mark(self, name: str) -> str:
        return f"{self.folder}:{name}"

    def _start_reaper(self) -> subprocess.Popen:
        """The reaper of every process marked ``<folder>:``, owned by this process (``fedrepro.fl.flower.reaper``)."""
        with open(self.logs / "reaper.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", reaper.__name__, str(os.getpid()), self._mark("")],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={  # the stage's own environment, unmarked: the reaper is no process of the federation
                    **{key: value for key, value in os.environ.items() if key != MARK},
                    "PYTHONPATH": self.environment["PYTHONPATH"],
                },
                start_new_session=True,
            )

    def _end_reaper(self) -> None:
        """Tell the reaper the federation is stopped; it ends what may be left, and exits."""
        if self.reaper is None:
            return
        with contextlib.suppress(BrokenPipeError):
            self.reaper.stdin.write(f"{reaper.END}\n".encode())
            self.reaper.stdin.close()
        try:
            self.reaper.wait(reaper.KILL_SECONDS + 5)
        except subprocess.TimeoutExpired:
            self.reaper.kill()
            self.reaper.wait()
        self.reaper = None

    def flwr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """The Flower CLI against this federation's SuperLink."""
        result = subprocess.run(
            [str(Path(sys.executable).parent / "flwr"), *args],
            capture_output=True,
            text=True,
            env=self.environment,
            cwd=self.folder,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise FederationError(
                f"flwr {' '.join(args)} failed ({result.returncode}): {(result.stdout + result.stderr)[-2000:]}"
            )
        return result

    def start_superlink(self) -> None:
        self.certificates = make_certificates(self.folder / "certificates")
        shutil.rmtree(self.node_keys, ignore_errors=True)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{self.address}"\n'
            f'root-certificates = "{self.certificates["ca"]}"\n'
        )
        self._spawn(
            "superlink",
            [
                "flower-superlink",
                "--ssl-ca-certfile",
                str(self.certificates["ca"]),
                "--ssl-certfile",
                str(self.certificates["cert"]),
                "--ssl-keyfile",
                str(self.certificates["key"]),
                "--enable-supernode-auth",
                "--disable-runtime-dependency-installation",
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
            ],
        )
        wait_until(
            lambda: self.flwr("supernode", "ls", CONNECTION, check=False).returncode == 0,
            60,
            f"the SuperLink on {self.address}",
        )

    def start_launcher(self, threads: int, preload: list[str], slots: int | None = None) -> None:
        """The warm ClientApp launcher (``fedrepro.fl.flower.launcher``) with ``preload`` imported, shared by the nodes
        of this machine: as many ClientApps at once as its cores fit ClientApps of ``threads`` torch threads, or
        ``slots`` (a drill pins 1, a 2-core machine's count for a cell of 2 threads)."""
        slots = slots or max(1, (os.cpu_count() or 1) // max(1, threads))
        self._spawn(
            "launcher",
            [sys.executable, "-m", "fedrepro.fl.flower.launcher", str(self.launcher_socket), str(slots), *preload],
        )
        wait_until(
            lambda: self.launcher_socket.exists() or self.processes["launcher"].poll() is not None,
            120,
            "the ClientApp launcher",
        )
        if self.processes["launcher"].poll() is not None:
            raise FederationError(f"the ClientApp launcher failed: see {self.logs / 'launcher.log'}")

    def start_service(self, name: str, command: list[str]) -> subprocess.Popen:
        """A long-lived process of a node beside its SuperNode (a vertical party's service), stopped with the rest."""
        return self._spawn(name, command)

    def register(self, public_key: Path) -> None:
        self.flwr("supernode", "register", str(public_key), CONNECTION)

    def start_supernode(
        self,
        name: str,
        private_key: Path | None,
        node_config: dict[str, str],
        tls: bool = True,
        max_wait: float | None = None,
    ) -> subprocess.Popen:
        """A SuperNode named ``name``; ``private_key`` authenticates it (None: none), ``tls=False`` tries plain HTTP."""
        config = " ".join(f"{key}='{value}'" for key, value in node_config.items())
        arguments = [
            "--superlink",
            self.address,
            "--node-config",
            config,
            "--host",
            LOOPBACK,
            "--port",
            str(free_port()),
        ]
        arguments += ["--root-certificates", str(self.certificates["ca"])] if tls else ["--insecure"]
        if private_key is not None:
            arguments += ["--auth-supernode-private-key", str(private_key)]
        if max_wait is not None:
            arguments += ["--max-wait-time", str(max_wait)]
        return self._spawn(f"supernode-{name}", supernode_command(arguments, self.node_timings))

    def stop(self, name: str, sig: int = signal.SIGTERM, grace: float = 15) -> None:
        """End a process and everything it started (its SuperExec, ServerApp or ClientApp processes)."""
        process = self.processes.pop(name)
        self.exit_codes[name] = process.poll()
        family = self.family(name, process)
        for pid in family:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()

    def family(self, name: str, process: subprocess.Popen) -> list[int]:
        """A process and everything it started, re-parented or not, and the ClientApps the launcher forked for them."""
        family = sorted({process.pid, *_descendants(process.pid), *_marked(self._mark(name))})
        return family + launcher.children_of(self.launcher_socket, set(family))

    def end_dead_supernodes(self) -> None:
        """End the SuperExec and ClientApps of every SuperNode that has died unasked (see the module docstring);
        polling the dead node also reaps it."""
        for name, process in list(self.processes.items()):
            if name.startswith("supernode-") and process.pid not in self.ended and process.poll() is not None:
                for pid in self.family(name, process):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.ended.add(process.pid)
                logger.warning(
                    "%s exited (code %s) during the run: its SuperExec and ClientApps were ended",
                    name,
                    process.returncode,
                )

    def stop_all(self) -> None:
        """SuperNodes first, then the launcher (and any ClientApp still running), the SuperLink last."""
        last = [name for name in ("launcher", "superlink") if name in self.processes]
        for name in [n for n in self.processes if n not in last] + last:
            self.stop(name)
        self._end_reaper()
        shutil.rmtree(self.launcher_socket.parent, ignore_errors=True)

    def __enter__(self) -> "LocalFederation":
        try:
            self.start_superlink()
        except BaseException:
            self.stop_all()  # a SuperLink that never answered still runs, and the launcher's folder exists
            raise
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop_all()

    def run_app(
        self,
        recipe_spec: Path,
        checkpoint_dir: Path,
        timeout: float,
        reply_timeout: float | None = None,
        looks_done: Callable[[], bool] = lambda: False,
        nodes_timeout: float = NODES_TIMEOUT,
    ) -> dict[str, Any]:
        """``flwr run`` the cell's app; wait until the run is over (at most ``timeout`` seconds,
        ``train.run_timeout``); return its entry of ``flwr ls`` (see ``wait_for_run``)."""
        app = write_app(self.folder / "app", recipe_spec, checkpoint_dir, reply_timeout, nodes_timeout)
        return self.run(app, timeout, looks_done)

    def run(self, app: Path, timeout: float, looks_done: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """``flwr run`` a Flower App folder and wait until the run is over (``run_app``)."""
        started = json.loads(self.flwr("run", str(app), CONNECTION, "--format", "json").stdout)
        run_id = str(started["run-id"])

        def listing() -> dict[str, Any]:
            self.check_superlink(run_id)
            answer = self.flwr("ls", CONNECTION, "--run-id", run_id, "--format", "json").stdout
            try:
                return listed_run(answer, run_id)
            except FederationError:
                self.check_superlink(run_id, grace=SUPERLINK_EXIT_GRACE)  # one dying as `flwr ls` asked is the cause
                raise

        def log() -> str:
            shown = self.flwr("log", run_id, CONNECTION, "--show", check=False)
            return shown.stdout + shown.stderr

        def on_poll() -> None:
            self.end_dead_supernodes()
            self.check_superlink(run_id)

        return wait_for_run(run_id, listing, log, timeout, looks_done, on_poll, f"train.run_timeout = {timeout:g} s")

    def check_superlink(self, run_id: str, grace: float = 0.0) -> None:
        """Raise ``FederationError`` if the SuperLink has exited (the run cannot go on without it), waiting up to
        ``grace`` seconds for one that may be exiting."""
        try:
            code = self.processes["superlink"].wait(timeout=grace) if grace else self.processes["superlink"].poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            raise FederationError(
                f"the SuperLink exited (code {code}) during Flower run {run_id}: see "
                f"{self.logs / 'superlink.log'}; the server's checkpoints are kept, so running the "
                f"stage again resumes from the last one"
            )
