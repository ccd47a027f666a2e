"""Run a command in a network namespace of its own with only loopback up: whatever Ray or Flower try, nothing
leaves the machine, and a browser cannot fetch from the internet (``unshare --net`` needs root, as the project's
machines and the GitHub workflow's privileged container give).

A machine that refuses the namespace fails the test saying why, unless ``$FEDREPRO_ALLOW_NO_NETNS`` is ``1``: then
the test is skipped with the reason. Only a CI runner that cannot give the namespace sets it (the GitLab test job, for
shared runners whose containers are not privileged); the project's own CI and the GitHub workflow leave it unset."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest

UP_LOOPBACK = 'ip link set lo up && exec "$@"'
ALLOW_NO_NETNS = "FEDREPRO_ALLOW_NO_NETNS"


@functools.cache
def netns_refusal() -> str | None:
    """Why this machine refuses a network namespace (``unshare --net true`` fails), or None where it gives one;
    asked once per process."""
    try:
        probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if probe.returncode == 0:
        return None
    return probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else f"exit {probe.returncode}"


def run_on_loopback(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``command`` inside ``unshare --net``; a failed namespace set-up fails the test with the reason, or skips it
    where ``$FEDREPRO_ALLOW_NO_NETNS=1`` and the machine refuses the namespace itself."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail(
            "the Flower and offline-plots tests need `unshare` and `ip` (util-linux, iproute2) to isolate the network"
        )
    if os.environ.get(ALLOW_NO_NETNS) == "1" and (refusal := netns_refusal()) is not None:
        pytest.skip(
            f"this runner refuses a network namespace (`unshare --net`: {refusal}); {ALLOW_NO_NETNS}=1 allows the skip"
        )
    environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "FLWR_TELEMETRY_ENABLED": "0"}
    result = subprocess.run(
        ["unshare", "--net", "--", "sh", "-c", UP_LOOPBACK, "sh", *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} failed inside the loopback-only namespace (exit {result.returncode}):\n"
            f"{result.stderr[-12000:]}"
        )
    return result
