"""Run a command in a network namespace of its own with only loopback up: whatever Ray or Flower try, nothing
leaves the machine, and a browser cannot fetch from the internet (``unshare --net`` needs root, as the project's
machines and CI give)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

UP_LOOPBACK = 'ip link set lo up && exec "$@"'


def run_on_loopback(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``command`` inside ``unshare --net``; a failed namespace set-up fails the test with the reason."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("the Flower and offline-plots tests need `unshare` and `ip` (util-linux, iproute2) to isolate "
                    "the network")
    environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "FLWR_TELEMETRY_ENABLED": "0"}
    result = subprocess.run(["unshare", "--net", "--", "sh", "-c", UP_LOOPBACK, "sh", *command], capture_output=True,
                            text=True, timeout=timeout, env=environment)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed inside the loopback-only namespace (exit {result.returncode}):\n"
                    f"{result.stderr[-12000:]}")
    return result
