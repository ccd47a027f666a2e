"""What the horizontal cells (``server``, ``client``, ``apps``, ``simulation``) and the vertical ones (``vertical``,
``vertical_deployment``) share on Flower: the config keys, the timeouts, polling a Grid, a quiet loopback-only Ray.

Kept apart from both so that the vertical runtime imports none of the horizontal engine (``fedrepro.fl.engine`` and
the algorithms): SS-VFNAS's stage then depends on this module, not on every federated algorithm's code."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

from fedrepro.device import gpu_share, ray_gpus
from fedrepro.fl.flower.ray_head import OBJECT_STORE_BYTES, STAGE_RAY_ENV, stage_ray_address

CLIENT_ID_KEY, PARTITION_ID_KEY, STATE_DIR_KEY, DATA_DIR_KEY = "client-id", "partition-id", "state-dir", "data-dir"
"""A node's config keys: the client it serves, its simulated partition, its private state's and its data's folders."""
RECIPE_KEY, CHECKPOINT_KEY, REPLY_TIMEOUT_KEY = "recipe", "checkpoint-dir", "reply-timeout"
NODES_TIMEOUT_KEY = "nodes-timeout"
"""A run's config keys (``apps``' module docstring says what each holds)."""
POLL_SECONDS = 0.02
"""How often the server asks the Grid for replies it is still waiting for, unless ``STORED`` wakes it first."""
NODES_TIMEOUT = 120.0
"""Seconds the run waits, before its first round, for one node per client to connect."""


class StoreSignal:
    """Counts the messages stored in this process's message store and wakes whoever waits for the next one.

    Flower's simulation keeps its message store in this process, and ``ray_backend`` signals here every message the
    server or a node stores in it, so a waiter wakes the moment its message is there rather than at its next poll:
    SS-VFNAS's parties exchange several times a step, and waiting out a poll on each exchange cost about a third of
    an embedded SS-VFNAS cell on the simulation. A deployment's store is in the SuperLink's process: nothing signals,
    and a waiter polls every ``timeout``."""

    def __init__(self) -> None:
        self._stored = threading.Condition()
        self.count = 0

    def signal(self) -> None:
        with self._stored:
            self.count += 1
            self._stored.notify_all()

    def wait_after(self, count: int, timeout: float) -> None:
        """Until a message is stored after the ``count``-th, or ``timeout`` s."""
        with self._stored:
            self._stored.wait_for(lambda: self.count != count, timeout)


STORED = StoreSignal()


def send_and_receive(grid: Grid, outgoing: list[Message], timeout: float | None) -> list[Message | None]:
    """Push the messages and collect the replies until all arrived or ``timeout`` s passed (None: no limit): the reply
    to each outgoing message in their order, None where none came. Matched by the message each reply answers, not by
    the node it comes from: for a node it has marked offline the SuperLink itself answers ("Node Unavailable"), from
    its own id, and that answer is the node's miss's reason.

    Flower's own ``Grid.send_and_receive`` polls every 3 s on a deployment (0.1 s in simulation), which
    made a small round wait seconds for replies already there; this looks again as soon as ``STORED`` says a message
    was stored, or every ``POLL_SECONDS``."""
    sent = list(grid.push_messages(outgoing)) if outgoing else []
    pending, deadline = set(sent), None if timeout is None else time.monotonic() + timeout
    replies: dict[str, Message] = {}
    while pending:
        stored = STORED.count
        for reply in grid.pull_messages(pending):
            replies[reply.metadata.reply_to_message_id] = reply
        pending -= set(replies)
        if not pending or (deadline is not None and time.monotonic() >= deadline):
            break
        STORED.wait_after(stored, POLL_SECONDS)
    return [replies.get(message_id) for message_id in sent]


def ray_backend_config(cpus: int, device: str = "cpu") -> dict[str, Any]:
    """Flower's Ray backend for a cell whose one ClientApp worker (``ray_backend.KeptRayBackend``) uses ``cpus`` cores
    and, on a GPU ``device``, its share of a GPU (``fedrepro.device.gpu_share``; Ray then shows the worker its GPU):
    the stage's Ray where one runs (``ray_head.stage_ray``), else a Ray of this process's own, on loopback, no
    dashboard."""
    resources = {"num_cpus": cpus, "num_gpus": gpu_share(device)}
    folder = os.environ.get(STAGE_RAY_ENV)
    if folder:
        return {
            "client_resources": resources,
            "init_args": {"address": stage_ray_address(Path(folder)), "_node_ip_address": "127.0.0.1"},
        }
    return {
        "client_resources": resources,
        "init_args": {
            "num_cpus": cpus,
            "num_gpus": ray_gpus(),
            "_node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "object_store_memory": OBJECT_STORE_BYTES,
        },
    }
