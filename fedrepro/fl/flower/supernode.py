"""Flower's ``flower-supernode`` with its two fixed timings set (``federation.NodeTimings``).

A SuperNode tells its SuperLink it is alive every ``HEARTBEAT_DEFAULT_INTERVAL`` (30 s; the SuperLink marks it offline
after two missed, so a dead node is seen only up to a minute later), and when it finds no message for it, it sleeps
3 s before asking again (then waits for its ClientApp's reply in 0.5-s sleeps). Flower offers no flag for either: this
entry point sets the heartbeat interval in the modules that read it and caps the node loop's sleeps at the pull
interval, then runs Flower's own SuperNode with the remaining arguments, unchanged. ``LocalFederation`` starts it only
when its timings are not Flower's; the node's protocol, its TLS and its authentication stay Flower's.

    python -m fedrepro.fl.flower.supernode HEARTBEAT_INTERVAL PULL_INTERVAL [flower-supernode arguments]
"""

from __future__ import annotations

import sys
import time
from typing import Any


class SleepsAtMost:
    """Stands for the ``time`` module in Flower's node loop (``flwr.supernode.start_client_internal``, which uses it for
    its sleeps alone): every sleep is cut to ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.seconds))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def main(heartbeat_interval: float, pull_interval: float, arguments: list[str]) -> None:
    from flwr.supercore import heartbeat
    from flwr.supernode import fleet_http_connection, start_client_internal
    from flwr.supernode.cli import flower_supernode

    heartbeat.HEARTBEAT_DEFAULT_INTERVAL = heartbeat_interval  # the pace of the node's heartbeats
    fleet_http_connection.HEARTBEAT_DEFAULT_INTERVAL = heartbeat_interval  # what it tells the SuperLink to expect
    start_client_internal.time = SleepsAtMost(pull_interval)
    sys.argv = ["flower-supernode", *arguments]
    flower_supernode()


if __name__ == "__main__":
    main(float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:])
