"""One Ray for a stage's simulated cells (``stage_ray``), in a process of its own that the stage's forked cell workers
join, where each used to start a Ray of its own.

Nothing here imports Ray, and a stage's process must not either before it forks its cell workers: they would inherit
its Ray library's state, random generator included, and two of them joined to one Ray then named objects alike (Ray
stopped one: "Trying to put an object that already existed in plasma").

``python -m fedrepro.fl.flower.ray_head CPUS STORE_BYTES FOLDER`` is that process: Ray on loopback with CPUS cores, no
dashboard and a STORE_BYTES object store, its address written to FOLDER/address once it is up, kept up until its
stdin closes (the stage ended, or died without a word).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from fedrepro.errors import FederationError

STAGE_RAY_ENV = "FEDREPRO_STAGE_RAY"
"""Set while a stage's Ray runs: the folder its process writes its address to (``stage_ray_address`` reads it)."""
STAGE_RAY_TIMEOUT = 120.0
"""Seconds a cell waits for its stage's Ray to come up."""
STOP_SECONDS = 30.0
"""How long a stage's Ray may take to stop before it is killed."""
OBJECT_STORE_BYTES = 1024 * 2**20
"""Ray's shared-memory store: messages to and from the worker pass through it (a MiniLM model is ~90 MB, SCAFFOLD
sends two)."""
LOOPBACK_RAY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for whether a node's address may be other than loopback (``ray_on_loopback_only``)."""
RAY_ENVIRONMENT = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "FLWR_TELEMETRY_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_worker_niceness": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
}
"""What Ray and Flower read from the environment: no usage statistics, telemetry or update check (each would try the
network: the Flower CLI looked up api.flower.ai at every ``flwr`` call for its update check), and
ClientApp workers at the niceness of the process that runs the cell. Ray lowers its workers' priority to niceness 15
by default; beside any busy process of the same session (another cell's server, the test suite's other worker) a
worker then got almost no CPU, and both cells of a stage's Ray waited out their 120 s for a node's first answer."""


@contextlib.contextmanager
def stage_ray(cpus: int) -> Iterator[None]:
    """One Ray with ``cpus`` cores (a stage's cells at once x their threads) for the cells of the stage: started as
    the stage sets out its cells, so that it comes up while the stage still reads its inputs, and joined by every cell
    the stage's processes run (``STAGE_RAY_ENV``); stopped with the stage, or when the stage's process dies."""
    folder = Path(tempfile.mkdtemp(prefix="fedrepro-ray-"))
    with (folder / "head.log").open("w") as log:
        head = subprocess.Popen(
            [sys.executable, "-m", __name__, str(cpus), str(OBJECT_STORE_BYTES), str(folder)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **RAY_ENVIRONMENT},
        )
    (folder / "pid").write_text(str(head.pid))
    os.environ[STAGE_RAY_ENV] = str(folder)
    try:
        yield
    finally:
        del os.environ[STAGE_RAY_ENV]
        joined = sys.modules.get("fedrepro.fl.flower.ray_backend")
        if joined is not None:  # this process ran cells itself: leave the Ray before it stops
            joined.KeptRayBackend.drop()
        head.stdin.close()
        try:
            head.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        shutil.rmtree(folder, ignore_errors=True)


def simulated_stage(runtime: str, cpus: int) -> contextlib.AbstractContextManager[None]:
    """``stage_ray(cpus)`` for a stage on ``train.runtime`` flower-simulation; nothing on another runtime."""
    return stage_ray(cpus) if runtime == "flower-simulation" else contextlib.nullcontext()


def stage_ray_address(folder: Path, timeout: float = STAGE_RAY_TIMEOUT) -> str:
    """The address of the stage's Ray whose process writes to ``folder``, once it is up; a clear error, with its last
    lines, if that process ended first or it is not up within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (folder / "address").exists():
        ended = not _running(int((folder / "pid").read_text()))
        if ended or time.monotonic() > deadline:
            log = folder / "head.log"
            said = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            why = "ended before it was up" if ended else f"is not up after {timeout:.0f} s"
            raise FederationError(f"the stage's Ray ({folder}) {why}:\n{said}")
        time.sleep(0.05)
    return (folder / "address").read_text()


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs: on Linux, one that ended but is not yet reaped by its parent does not; elsewhere
    (no ``/proc``) only whether it exists."""
    if not Path("/proc/self").exists():
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@contextlib.contextmanager
def ray_on_loopback_only() -> Iterator[None]:
    """Around a ``ray.init`` that starts or joins a local Ray (the stage's, or a cell's own): the Ray stays on
    loopback and quiet, in this process and in those the block starts. Ray 2.55 does neither by itself:

    - ``_node_ip_address="127.0.0.1"`` is replaced by the address of the machine's default route (Ray asks the kernel
      which source address a UDP socket "connected" to 8.8.8.8:53 would use, else resolves the host name), so a
      "loopback" head's GCS listened on the machine's network address. Ray keeps loopback only where it believes
      clusters unsupported (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read at import in every Ray process): set for the
      processes the block starts (a head's raylet, agents and, through them, its workers) and, as Ray reads it from
      its constant when it asks, in this process. Both are put back after the block: the same process may later
      start or join a Ray cluster of several machines (``fedrepro.cluster``, a test's ``ray start``), which needs
      them as they were.
    - A head starts a dashboard process whatever ``include_dashboard`` says (with it False, one serving only Ray's usage
      statistics), and at its start that process asks three clouds' metadata services who hosts the machine: two HTTP
      requests to 169.254.169.254 and a DNS lookup of metadata.google.internal, whether usage statistics are on or not
      (``ray._common.usage.usage_lib.get_cluster_config_to_report``). No part of fedrepro uses the dashboard, so within
      the block its start is replaced by what Ray does when the dashboard fails to start (no web UI, no process)."""
    from ray._private import node, ray_constants

    def start_no_api_server(self: Any, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
        self._webui_url = None

    saved = os.environ.get(LOOPBACK_RAY_ENV), ray_constants.ENABLE_RAY_CLUSTER, node.Node.start_api_server
    os.environ[LOOPBACK_RAY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    node.Node.start_api_server = start_no_api_server
    try:
        yield
    finally:
        environment, ray_constants.ENABLE_RAY_CLUSTER, node.Node.start_api_server = saved
        if environment is None:
            os.environ.pop(LOOPBACK_RAY_ENV, None)
        else:
            os.environ[LOOPBACK_RAY_ENV] = environment


def main() -> None:
    import ray

    from fedrepro.device import ray_gpus

    cpus, store_bytes, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    with ray_on_loopback_only():
        context = ray.init(
            num_cpus=cpus,
            num_gpus=ray_gpus(),
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            object_store_memory=store_bytes,
        )
    written = folder / "address.tmp"
    written.write_text(context.address_info["gcs_address"])
    written.replace(folder / "address")
    sys.stdin.read()
    ray.shutdown()


if __name__ == "__main__":
    main()
