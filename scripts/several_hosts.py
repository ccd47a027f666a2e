#!/usr/bin/env python
"""docs/flower.md's "Flower on several machines", run end to end on this machine with network namespaces for the
machines. Needs root and iproute2 (``ip netns``).

The hosts: the SuperLink's (``<subnet>.1``), the experimenter's (``<subnet>.254``, where the Flower CLI runs) and
one per client's silo (``<subnet>.2`` on), each a namespace of its own named ``<prefix>-<host>``. A bridge in the
SuperLink's namespace has one veth pair to every other host; no namespace has a default route and nothing is
attached to this machine's own interfaces, so the federation's traffic stays between these hosts. Then the docs'
steps, in their order:

1. on the SuperLink's host: a CA and the SuperLink's certificate naming its address on the link, then the SuperLink;
2. on the experimenter's host: the Flower CLI's config pointing at that address and the CA;
3. on each silo's host: its key, registered from the experimenter's CLI (``flwr supernode register``), the warm
   ClientApp launcher (``fedrepro.fl.flower.launcher``) and the SuperNode with its ``client-id`` and ``state-dir``;
4. the recipe spec and the app, ``flwr run`` from the experimenter's host, and a wait until Flower says the run
   finished.

Every host keeps its own ``FLWR_HOME``. On the way out (the run finished or failed, Ctrl-C, SIGTERM) every process
in the hosts' namespaces is ended, found by namespace rather than by process tree (Flower starts its SuperExecs in
sessions of their own), then the namespaces are deleted, which deletes their veths. ``<work>/hosts.json`` says
where everything is once the hosts are up (namespaces, addresses, each silo's link, state directory and launcher
socket), so a drill can take a silo's link down mid-run.

Usage: python scripts/several_hosts.py --recipe SPEC.json --work DIR [--prefix NAME] [--reply-timeout S]
       [--heartbeat-interval S] [--pull-interval S]
The SuperNodes keep Flower's timings (docs/flower.md's step 3) unless the last two say otherwise
(``fedrepro.fl.flower.federation.NodeTimings``; the tests' link drill sees a silo offline sooner).
The spec is ``{"factory": "module:function", "kwargs": {...}}`` (``fedrepro.fl.recipe``); every process of the
federation imports the factory, so its module must be on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedrepro.errors import FederationError
from fedrepro.fl.checkpoint import LATEST
from fedrepro.fl.flower import federation, launcher
from fedrepro.fl.flower.certificates import make_certificates, make_node_key
from fedrepro.fl.flower.federation import (
    CONNECTION,
    MARK,
    TASK_POLL_SECONDS,
    NodeTimings,
    listed_run,
    stopped_cleanly_on_sigterm,
    wait_for_run,
    wait_until,
    write_app,
)
from fedrepro.fl.recipe import load_recipe, write_recipe_spec
from fedrepro.io import atomic_file, read_json

PORT = 8000
"""The SuperLink's port (Fleet and Control APIs); each host has its own ports, so it is always free."""
BRIDGE = "br0"
SUPERLINK, EXPERIMENTER = "superlink", "experimenter"
GRACE_SECONDS = 10.0
"""How long the processes of a host get to end after SIGTERM before SIGKILL."""


def ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise FederationError(f"`ip {' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")


class Hosts:
    """The namespaces standing for machines, their link, and the processes started on them (see the docstring)."""

    def __init__(self, work: Path, prefix: str, subnet: str, clients: list[str]) -> None:
        if len(clients) > 250:
            raise FederationError(
                f"--subnet {subnet}.0/24 holds at most 250 silos, the cell has {len(clients)} clients"
            )
        self.work, self.prefix = work, prefix
        self.address = {
            SUPERLINK: f"{subnet}.1",
            EXPERIMENTER: f"{subnet}.254",
            **{client: f"{subnet}.{index + 2}" for index, client in enumerate(clients)},
        }
        self.veth = {host: f"v{index}" for index, host in enumerate(h for h in self.address if h != SUPERLINK)}
        """Each host's link, by the name of its end on the SuperLink's bridge (the drill takes it down)."""
        self.processes: list[subprocess.Popen] = []
        self.made: list[str] = []
        self.sockets = Path(tempfile.mkdtemp(prefix="fedrepro-hosts-"))
        """Launcher sockets: a Unix socket's path may not exceed about 100 bytes."""

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def home(self, host: str) -> Path:
        return self.work / "hosts" / host

    def __enter__(self) -> "Hosts":
        try:
            self._make()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.remove()

    def _make(self) -> None:
        hub = self.namespace(SUPERLINK)
        existing = {Path(n).name for n in Path("/run/netns").glob("*")}
        for host in self.address:
            if self.namespace(host) in existing:
                raise FederationError(
                    f"network namespace {self.namespace(host)} exists already (another run, or one "
                    f"killed with SIGKILL): pick another --prefix, or `ip netns del` it"
                )
            ip("netns", "add", self.namespace(host))
            self.made.append(self.namespace(host))
            ip("-n", self.namespace(host), "link", "set", "lo", "up")
        ip("-n", hub, "link", "add", "name", BRIDGE, "type", "bridge")
        ip("-n", hub, "addr", "add", f"{self.address[SUPERLINK]}/24", "dev", BRIDGE)
        ip("-n", hub, "link", "set", BRIDGE, "up")
        for host, veth in self.veth.items():
            ip(
                "-n",
                hub,
                "link",
                "add",
                "name",
                veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                self.namespace(host),
            )
            ip("-n", hub, "link", "set", veth, "master", BRIDGE, "up")
            ip("-n", self.namespace(host), "addr", "add", f"{self.address[host]}/24", "dev", "eth0")
            ip("-n", self.namespace(host), "link", "set", "eth0", "up")

    def describe(self, state_dirs: dict[str, Path], sockets: dict[str, Path]) -> dict:
        """What ``hosts.json`` holds."""
        return {
            "superlink": {"namespace": self.namespace(SUPERLINK), "address": self.address[SUPERLINK]},
            "experimenter": {"namespace": self.namespace(EXPERIMENTER), "address": self.address[EXPERIMENTER]},
            "silos": {
                client: {
                    "namespace": self.namespace(client),
                    "address": self.address[client],
                    "link": {"namespace": self.namespace(SUPERLINK), "device": self.veth[client]},
                    "state_dir": str(state_dirs[client]),
                    "launcher_socket": str(sockets[client]),
                }
                for client in state_dirs
            },
        }

    def environment(self, host: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        return {
            **os.environ,
            "FLWR_HOME": str(self.home(host) / "flwr-home"),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": TASK_POLL_SECONDS,
            MARK: f"{self.work}:{host}",
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
            **(extra or {}),
        }

    def start(self, host: str, name: str, command: list[str], extra: dict[str, str] | None = None) -> subprocess.Popen:
        """``command`` on ``host``, its output in ``<work>/logs/<host>-<name>.log``."""
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{host}-{name}.log", "ab") as log:
            process = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace(host), *command],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home(host),
                env=self.environment(host, extra),
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def flwr(self, *args: str, timeout: float = 120) -> str:
        """The Flower CLI on the experimenter's host; its stdout."""
        result = subprocess.run(
            ["ip", "netns", "exec", self.namespace(EXPERIMENTER), str(Path(sys.executable).parent / "flwr"), *args],
            capture_output=True,
            text=True,
            cwd=self.home(EXPERIMENTER),
            env=self.environment(EXPERIMENTER),
            timeout=timeout,
        )
        if result.returncode != 0:
            raise FederationError(
                f"flwr {' '.join(args)} failed ({result.returncode}): {(result.stdout + result.stderr)[-2000:]}"
            )
        return result.stdout

    @staticmethod
    def pids(namespace: str) -> list[int]:
        result = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
        return [int(pid) for pid in result.stdout.split()]

    def remove(self) -> None:
        """End every process on the silos' hosts, then on the others (the SuperLink last), then delete the
        namespaces and with them their veths. A second SIGTERM does not cut this short."""
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            self._remove()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _remove(self) -> None:
        silos = [n for n in self.made if n not in (self.namespace(SUPERLINK), self.namespace(EXPERIMENTER))]
        self._end(silos)
        self._end(self.made)
        for process in self.processes:
            process.wait()
        for namespace in reversed(self.made):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self.made = []
        shutil.rmtree(self.sockets, ignore_errors=True)

    def _end(self, namespaces: list[str]) -> None:
        """SIGTERM to every process in ``namespaces``, SIGKILL to those left after ``GRACE_SECONDS``."""

        def left() -> list[int]:
            for process in self.processes:
                process.poll()  # reap the ones this script started, so they leave their namespace
            return [pid for namespace in namespaces for pid in self.pids(namespace)]

        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in left():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + GRACE_SECONDS
            while left() and time.monotonic() < deadline:
                time.sleep(0.2)


def superlink_command(certificates: dict[str, Path], address: str) -> list[str]:
    """docs/flower.md's step 1 (tests/test_flower_hosts.py checks that the docs give the same flags)."""
    return [
        "flower-superlink",
        "--ssl-ca-certfile",
        str(certificates["ca"]),
        "--ssl-certfile",
        str(certificates["cert"]),
        "--ssl-keyfile",
        str(certificates["key"]),
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--host",
        address,
        "--port",
        str(PORT),
    ]


def supernode_command(
    superlink: str, ca: Path, private_key: Path, client: str, state_dir: Path, timings: NodeTimings = NodeTimings()
) -> list[str]:
    """docs/flower.md's step 3 (tests/test_flower_hosts.py checks that the docs give the same flags), with ``timings``
    where they are not Flower's."""
    return federation.supernode_command(
        [
            "--superlink",
            superlink,
            "--root-certificates",
            str(ca),
            "--auth-supernode-private-key",
            str(private_key),
            "--node-config",
            f"client-id='{client}' state-dir='{state_dir}'",
        ],
        timings,
    )


def last_round_checkpointed(checkpoint_dir: Path, rounds: int) -> bool:
    state = checkpoint_dir / LATEST / "state.json"
    try:
        return state.exists() and read_json(state).get("next_round", 0) >= rounds
    except (OSError, ValueError):  # replaced while being read
        return False


def run(
    spec_path: Path,
    work: Path,
    prefix: str,
    subnet: str,
    reply_timeout: float | None,
    timeout: float,
    timings: NodeTimings = NodeTimings(),
) -> dict:
    """The docs' four steps on namespaces (see the module docstring); Flower's ``flwr ls`` entry of the run."""
    recipe = load_recipe(spec_path)
    task, algorithm = recipe.build()
    if algorithm.pooled:
        raise FederationError(
            f"{spec_path}: algorithm {recipe.algorithm} trains on pooled data: there is no silo to federate"
        )
    clients = list(task.client_ids)
    work.mkdir(parents=True, exist_ok=True)
    with stopped_cleanly_on_sigterm(), Hosts(work, prefix, subnet, clients) as hosts:
        for host in hosts.address:
            hosts.home(host).mkdir(parents=True, exist_ok=True)
        superlink = f"{hosts.address[SUPERLINK]}:{PORT}"
        # 1. the SuperLink's host: CA, certificate naming its address, the SuperLink
        certificates = make_certificates(hosts.home(SUPERLINK) / "certs", hosts.address[SUPERLINK])
        link = hosts.start(SUPERLINK, "superlink", superlink_command(certificates, hosts.address[SUPERLINK]))
        # 2. the experimenter's Flower CLI (the CA certificate is all it gets from the SuperLink's host)
        ca = hosts.home(EXPERIMENTER) / "ca.crt"
        shutil.copyfile(certificates["ca"], ca)
        config = hosts.home(EXPERIMENTER) / "flwr-home" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{superlink}"\nroot-certificates = "{ca}"\n'
        )

        def superlink_answers() -> bool:
            if link.poll() is not None:
                raise FederationError(f"the SuperLink exited ({link.returncode}): see {work / 'logs'}")
            try:
                hosts.flwr("supernode", "ls", CONNECTION)
                return True
            except FederationError:
                return False

        wait_until(superlink_answers, 120, f"the SuperLink on {superlink}")
        # 3. each silo: its key, registered; its launcher; its SuperNode
        state_dirs = {client: work / "nodes" / client for client in clients}
        sockets = {client: hosts.sockets / f"{index}" for index, client in enumerate(clients)}
        with atomic_file(work / "hosts.json", "w") as handle:  # a drill may read it while it is written
            json.dump(hosts.describe(state_dirs, sockets), handle, indent=1)
        preload = ["fedrepro.fl.flower.apps", recipe.spec["factory"].partition(":")[0]]
        for client in clients:
            silo = hosts.home(client)
            shutil.copyfile(certificates["ca"], silo / "ca.crt")
            private, public = make_node_key(silo / "keys", client)
            hosts.flwr("supernode", "register", str(public), CONNECTION)
            hosts.start(
                client,
                "launcher",
                [sys.executable, "-m", "fedrepro.fl.flower.launcher", str(sockets[client]), "1", *preload],
            )
            warm = {
                launcher.SOCKET_ENV: str(sockets[client]),
                "PATH": os.pathsep.join(
                    [str(launcher.shim_script(silo / "bin").parent), hosts.environment(client)["PATH"]]
                ),
            }
            hosts.start(
                client,
                "supernode",
                supernode_command(superlink, silo / "ca.crt", private, client, state_dirs[client], timings),
                warm,
            )
        # 4. the recipe spec and the app, `flwr run`, and the wait
        spec = write_recipe_spec(work / "run" / "recipe.json", {**recipe.spec, "fingerprint": recipe.fingerprint})
        checkpoint_dir = work / "server"
        app = write_app(work / "run" / "app", spec.resolve(), checkpoint_dir, reply_timeout)
        run_id = str(json.loads(hosts.flwr("run", str(app), CONNECTION, "--format", "json"))["run-id"])

        def listing() -> dict:
            if link.poll() is not None:
                raise FederationError(
                    f"the SuperLink exited ({link.returncode}) during Flower run {run_id}: see {work / 'logs'}"
                )
            return listed_run(hosts.flwr("ls", CONNECTION, "--run-id", run_id, "--format", "json"), run_id)

        return wait_for_run(
            run_id,
            listing,
            lambda: hosts.flwr("log", run_id, CONNECTION, "--show"),
            timeout,
            lambda: last_round_checkpointed(checkpoint_dir, recipe.settings.rounds),
            timeout_name=f"--timeout {timeout:g}",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, required=True, help="the cell's recipe spec (JSON)")
    parser.add_argument("--work", type=Path, required=True, help="where keys, logs, states and checkpoints go")
    parser.add_argument("--prefix", default="fedrepro", help="namespaces are named <prefix>-<host>")
    parser.add_argument("--subnet", default="10.77.0", help="the link's /24, as its first three numbers")
    parser.add_argument(
        "--reply-timeout",
        type=float,
        default=None,
        help="seconds the server waits for a round's replies (default: until every silo answers)",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds the whole run may take")
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=NodeTimings.heartbeat_interval,
        help="seconds between a SuperNode's heartbeats (Flower's default; at least 10): the SuperLink "
        "marks a silo offline after two missed",
    )
    parser.add_argument(
        "--pull-interval",
        type=float,
        default=NodeTimings.pull_interval,
        help="at most this long between an idle SuperNode's asks for a message (Flower's default)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None:
        parser.error("the hosts are network namespaces: run as root, with iproute2's `ip` on PATH")
    if not args.recipe.is_file():
        parser.error(f"--recipe {args.recipe}: no such file")
    entry = run(
        args.recipe.resolve(),
        args.work.resolve(),
        args.prefix,
        args.subnet,
        args.reply_timeout,
        args.timeout,
        NodeTimings(args.heartbeat_interval, args.pull_interval),
    )
    print(
        json.dumps(
            {"run-id": entry["run-id"], "status": entry["status"], "network-traffic": entry.get("network-traffic")}
        )
    )


if __name__ == "__main__":
    main()
