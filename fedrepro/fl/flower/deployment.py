"""A real Flower deployment on this machine: a SuperLink and one SuperNode per client as separate processes,
TLS with certificates generated here, SuperNodes authenticated by key, and ``flwr run`` against it.

``LocalFederation`` starts and stops the processes (each in its own session; stopping ends them and
everything they started, so no process outlives the run). Every address is loopback; ports are picked free.
The same pieces spread over machines are in the README ("The same algorithms on Flower"): the SuperLink's
certificate must name its address, each SuperNode gets the CA certificate, its own key (registered with
``flwr supernode register``) and its ``client-id`` / ``state-dir`` node config.

The nodes run each message's ClientApp in a process forked by a warm launcher (``fedrepro.fl.flower.launcher``)
that has torch and the cell's modules imported already, one at a time per core budget of the cell.

``FlowerDeployment`` is the stage's view: it writes the cell's recipe spec and a minimal Flower App
(components ``fedrepro.fl.flower.apps``), runs it, then reads the server's checkpoint and, as the harness
owning every node's directory on this machine, each client's final state (the server never reads them).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tqdm.auto import tqdm

from fedrepro.errors import FederationError, TrainingDiverged
from fedrepro.fl.algorithm import Algorithm, FederatedTask
from fedrepro.fl.channel import Message
from fedrepro.fl.checkpoint import LATEST, TrainingState, load_checkpoint
from fedrepro.fl.engine import Engine
from fedrepro.fl.flower import launcher
from fedrepro.fl.flower.apps import CHECKPOINT_KEY, DIVERGED_FILE, RECIPE_KEY, REPLY_TIMEOUT_KEY, write_recipe_spec
from fedrepro.fl.flower.node_state import collect_node_states
from fedrepro.fl.flower.simulation import quiet_environment
from fedrepro.fl.runtime import CellRecipe
from fedrepro.io import read_json

LOOPBACK = "127.0.0.1"
CONNECTION = "fedrepro"
"""The SuperLink connection's name in the federation's own Flower config (``$FLWR_HOME/config.toml``)."""
TASK_POLL_SECONDS = "0.2"
"""How often a SuperExec asks its SuperNode for a message to run (Flower's default: every second)."""
STATUS_EVERY_SECONDS = 10.0
"""While the run's checkpoint is not final, ask Flower for the run's status this often (each ask is a CLI process)."""
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
serverapp = "fedrepro.fl.flower.apps:server_app"
clientapp = "fedrepro.fl.flower.apps:client_app"

[tool.flwr.app.config]
{recipe_key} = "{recipe}"
{checkpoint_key} = "{checkpoint}"
{timeout_key} = {timeout}
"""


# ----- certificates and keys ---------------------------------------------------------------------------
def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_certificates(folder: Path, address: str = LOOPBACK, days: int = 2) -> dict[str, Path]:
    """A CA and the SuperLink's certificate for ``address`` (and localhost), signed by it; PEM files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = {"not_valid_before": now - datetime.timedelta(minutes=5), "not_valid_after": now + datetime.timedelta(days=days)}

    def builder(subject: str, issuer: str, public_key) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(public_key)
                .serial_number(x509.random_serial_number()).not_valid_before(valid["not_valid_before"])
                .not_valid_after(valid["not_valid_after"]))

    ca_key, server_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = builder("fedrepro CA", "fedrepro CA", ca_key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.insert(0, x509.IPAddress(ipaddress.ip_address(address)))
    except ValueError:
        names.insert(0, x509.DNSName(address))
    server = builder(address, "fedrepro CA", server_key.public_key()).add_extension(
        x509.SubjectAlternativeName(names), critical=False).sign(ca_key, hashes.SHA256())
    paths = {"ca": folder / "ca.crt", "cert": folder / "superlink.pem", "key": folder / "superlink.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(_pem(server_key))
    paths["key"].chmod(0o600)
    return paths


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """An EC key pair in OpenSSH format for one SuperNode: (private key, public key to register)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    private.chmod(0o600)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return private, public


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


def write_app(folder: Path, recipe_spec: Path, checkpoint_dir: Path, reply_timeout: float | None = None) -> Path:
    """The Flower App ``flwr run`` sends: only a pyproject.toml naming ``fedrepro.fl.flower.apps`` and the run config
    (the recipe spec the apps rebuild the cell from, where the server checkpoints, the reply timeout)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_TOML.format(
        recipe_key=RECIPE_KEY, recipe=recipe_spec, checkpoint_key=CHECKPOINT_KEY, checkpoint=checkpoint_dir,
        timeout_key=REPLY_TIMEOUT_KEY, timeout=float(reply_timeout or 0)))
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

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).resolve()
        self.home = self.folder / "flwr-home"
        self.logs = self.folder / "logs"
        self.port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        self.exit_codes: dict[str, int | None] = {}
        """Per stopped process: its exit code if it had ended by itself before ``stop``, else None."""
        self.certificates: dict[str, Path] = {}
        self.launcher_socket = Path(tempfile.mkdtemp(prefix="fedrepro-launcher-")) / "socket"
        """In a short temporary folder: a Unix socket's path may not exceed about 100 bytes."""
        launcher.shim_script(self.folder / "bin")
        self.environment = {**os.environ, "FLWR_HOME": str(self.home), "FLWR_TELEMETRY_ENABLED": "0",
                            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": TASK_POLL_SECONDS,
                            launcher.SOCKET_ENV: str(self.launcher_socket),
                            "PATH": os.pathsep.join([str(self.folder / "bin"), str(Path(sys.executable).parent),
                                                     os.environ.get("PATH", "")])}

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.environment,
                                   cwd=self.folder, start_new_session=True)
        log.close()
        self.processes[name] = process
        return process

    def flwr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """The Flower CLI against this federation's SuperLink."""
        result = subprocess.run([str(Path(sys.executable).parent / "flwr"), *args], capture_output=True, text=True,
                                env=self.environment, cwd=self.folder, timeout=timeout)
        if check and result.returncode != 0:
            raise FederationError(f"flwr {' '.join(args)} failed ({result.returncode}): {(result.stdout + result.stderr)[-2000:]}")
        return result

    def start_superlink(self) -> None:
        self.certificates = make_certificates(self.folder / "certificates")
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{self.address}"\n'
            f'root-certificates = "{self.certificates["ca"]}"\n')
        self._spawn("superlink", [
            "flower-superlink", "--ssl-ca-certfile", str(self.certificates["ca"]),
            "--ssl-certfile", str(self.certificates["cert"]), "--ssl-keyfile", str(self.certificates["key"]),
            "--enable-supernode-auth", "--disable-runtime-dependency-installation", "--host", LOOPBACK,
            "--port", str(self.port)])
        wait_until(lambda: self.flwr("supernode", "ls", CONNECTION, check=False).returncode == 0, 60,
                   f"the SuperLink on {self.address}")

    def start_launcher(self, threads: int, preload: list[str]) -> None:
        """The warm ClientApp launcher (``fedrepro.fl.flower.launcher``) with ``preload`` imported, shared by the nodes
        of this machine: as many ClientApps at once as its cores fit ClientApps of ``threads`` torch threads."""
        slots = max(1, (os.cpu_count() or 1) // max(1, threads))
        self._spawn("launcher", [sys.executable, "-m", "fedrepro.fl.flower.launcher", str(self.launcher_socket), str(slots),
                                 *preload])
        wait_until(lambda: self.launcher_socket.exists() or self.processes["launcher"].poll() is not None, 120,
                   "the ClientApp launcher")
        if self.processes["launcher"].poll() is not None:
            raise FederationError(f"the ClientApp launcher failed: see {self.logs / 'launcher.log'}")

    def register(self, public_key: Path) -> None:
        self.flwr("supernode", "register", str(public_key), CONNECTION)

    def start_supernode(self, name: str, private_key: Path | None, node_config: dict[str, str], tls: bool = True,
                        max_wait: float | None = None) -> subprocess.Popen:
        """A SuperNode named ``name``; ``private_key`` authenticates it (None: none), ``tls=False`` tries plain HTTP."""
        config = " ".join(f"{key}='{value}'" for key, value in node_config.items())
        command = ["flower-supernode", "--superlink", self.address, "--node-config", config, "--host", LOOPBACK,
                   "--port", str(free_port())]
        command += ["--root-certificates", str(self.certificates["ca"])] if tls else ["--insecure"]
        if private_key is not None:
            command += ["--auth-supernode-private-key", str(private_key)]
        if max_wait is not None:
            command += ["--max-wait-time", str(max_wait)]
        return self._spawn(f"supernode-{name}", command)

    def stop(self, name: str, sig: int = signal.SIGTERM, grace: float = 15) -> None:
        """End a process and everything it started (its SuperExec, ServerApp or ClientApp processes)."""
        process = self.processes.pop(name)
        self.exit_codes[name] = process.poll()
        family = [process.pid, *_descendants(process.pid)]
        family += launcher.children_of(self.launcher_socket, set(family))  # its ClientApps, forked by the launcher
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

    def stop_all(self) -> None:
        """SuperNodes first, then the launcher (and any ClientApp still running), the SuperLink last."""
        last = [name for name in ("launcher", "superlink") if name in self.processes]
        for name in [n for n in self.processes if n not in last] + last:
            self.stop(name)
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

    def run_app(self, recipe_spec: Path, checkpoint_dir: Path, timeout: float, reply_timeout: float | None = None,
                looks_done: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """``flwr run`` the cell's app; wait until the run is over; return its entry of ``flwr ls``. Flower is asked
        for the run's status when ``looks_done()`` (say, the last checkpoint is there), else every few seconds."""
        app = write_app(self.folder / "app", recipe_spec, checkpoint_dir, reply_timeout)
        started = json.loads(self.flwr("run", str(app), CONNECTION, "--format", "json").stdout)
        run_id = str(started["run-id"])
        asked = time.monotonic()

        def status() -> str:
            listing = json.loads(self.flwr("ls", CONNECTION, "--run-id", run_id, "--format", "json").stdout)
            return listing["runs"][0]["status"]

        def finished() -> bool:
            nonlocal asked
            if not looks_done() and time.monotonic() - asked < STATUS_EVERY_SECONDS:
                return False
            asked = time.monotonic()
            return status().startswith("finished")

        wait_until(finished, timeout, f"Flower run {run_id}")
        run = json.loads(self.flwr("ls", CONNECTION, "--run-id", run_id, "--format", "json").stdout)["runs"][0]
        if run["status"] != "finished:completed":
            log = self.flwr("log", run_id, CONNECTION, "--show", check=False)
            raise FederationError(f"Flower run {run_id} ended {run['status']}: {(log.stdout + log.stderr)[-3000:]}")
        return run


# ----- the stage's view ----------------------------------------------------------------------------------
class FlowerDeployment(Engine):
    """``run()`` trains the cell on a local SuperLink and SuperNodes and returns the same ``TrainingState`` as the engine.

    The rounds run in the SuperLink's ServerApp process, so ``on_round_end`` is not called here.
    """

    def __init__(self, recipe: CellRecipe, task: FederatedTask, algorithm: Algorithm, checkpoint_dir: str | Path,
                 progress: bool = True, timeout: float = 3600) -> None:
        if recipe.spec is None:
            raise FederationError("a deployment rebuilds the cell in other processes: its recipe needs a spec")
        super().__init__(task, algorithm, recipe.settings, checkpoint_dir, recipe.fingerprint, progress)
        self.recipe, self.timeout = recipe, timeout
        self.checkpoint_dir = self.checkpoint_dir.resolve()
        self.nodes_root = self.checkpoint_dir / "nodes"
        self.federation_dir = self.checkpoint_dir / "federation"
        self.wire: dict[str, Any] = {}
        """Flower's own count of the run's traffic (``flwr ls``: inbound, outbound, total bytes)."""
        self.reply_timeout: float | None = None
        """Seconds the server waits for a round's replies; a node silent that long misses the round (None: wait)."""
        self.on_federation_up: Callable[[LocalFederation], None] | None = None
        """Called once the SuperLink and the SuperNodes run, before ``flwr run`` (drills start extra nodes here)."""

    def start_node(self, federation: LocalFederation, client_id: str) -> subprocess.Popen:
        """The SuperNode of one client: its registered key, its client id, its own state directory."""
        return federation.start_supernode(client_id, federation.folder / "node-keys" / client_id,
                                          {"client-id": client_id, "state-dir": str(self.nodes_root / client_id)})

    def restart_node(self, federation: LocalFederation, client_id: str, within: float = 300, settle: float = 15) -> None:
        """Start a crashed client's SuperNode again, as a supervisor would. The SuperLink lets the key in again only
        once it has marked the dead connection offline (after missed heartbeats); until then the node exits at
        once, so it is started again every few seconds. Alive after ``settle`` seconds counts as rejoined."""
        deadline = time.monotonic() + within
        while True:
            process = self.start_node(federation, client_id)
            try:
                process.wait(timeout=settle)
            except subprocess.TimeoutExpired:
                return
            if f"supernode-{client_id}" not in federation.processes:
                raise FederationError(f"the federation stopped before the SuperNode of client {client_id} could rejoin")
            federation.stop(f"supernode-{client_id}")
            if time.monotonic() > deadline:
                raise FederationError(f"the SuperNode of client {client_id} could not rejoin within {within:g} s")
            time.sleep(5)

    def _rounds_checkpointed(self) -> int:
        """Rounds the ServerApp has checkpointed so far (it runs in a process of its own)."""
        state = self.checkpoint_dir / LATEST / "state.json"
        try:
            return read_json(state).get("next_round", 0) if state.exists() else 0
        except (OSError, ValueError):  # replaced while being read
            return 0

    def run(self) -> TrainingState:
        if self.state.next_round < self.settings.rounds:
            quiet_environment()
            spec = write_recipe_spec(self.checkpoint_dir / "recipe.json", {**self.recipe.spec, "fingerprint": self.fingerprint})
            diverged = self.checkpoint_dir / DIVERGED_FILE
            diverged.unlink(missing_ok=True)  # a previous run's
            with stopped_cleanly_on_sigterm(), LocalFederation(self.federation_dir) as federation:
                federation.start_launcher(self.recipe.threads,
                                          ["fedrepro.fl.flower.apps", self.recipe.spec["factory"].partition(":")[0]])
                for client_id in self.train_ids:
                    private, public = make_node_key(federation.folder / "node-keys", client_id)
                    federation.register(public)
                    self.start_node(federation, client_id)
                if self.on_federation_up is not None:
                    self.on_federation_up(federation)
                with tqdm(desc=f"{self.algorithm.name} rounds on Flower", total=self.settings.rounds,
                          initial=self.state.next_round, disable=not self.progress) as bar:
                    def last_round_checkpointed() -> bool:
                        done = self._rounds_checkpointed()
                        if done > bar.n:
                            bar.update(done - bar.n)
                        return bar.n >= self.settings.rounds

                    try:
                        self.wire = federation.run_app(spec, self.checkpoint_dir, self.timeout, self.reply_timeout,
                                                       last_round_checkpointed)["network-traffic"]
                    except FederationError:
                        if diverged.exists():  # the error the engine would raise, not "the Flower run failed"
                            raise TrainingDiverged(diverged.read_text()) from None
                        raise
            state = load_checkpoint(self.checkpoint_dir, self.fingerprint)
            if state is None or state.next_round < self.settings.rounds:
                raise FederationError(f"the Flower run ended without its last checkpoint in {self.checkpoint_dir}")
            self.state = state
            self.channel.messages = [Message.from_record(record) for record in state.messages]
            self.channel.scalars = [Message.from_record(record) for record in state.scalars]
        collect_node_states(self, self.nodes_root)
        return self.state
