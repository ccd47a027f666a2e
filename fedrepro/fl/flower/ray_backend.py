"""Flower's simulation runtime as a stage uses it: Ray and its workers kept for the process's later cells, and the
messages handed to the workers as soon as the server sends them.

Both horizontal cells (``simulation``) and SS-VFNAS's parties (``vertical``) run through ``kept_ray_backend``; this
module imports nothing of either.

- Starting Ray and its workers took 7-9 s, most of a small cell's time on Flower, so a process's first cell starts
  its one worker (on the stage's Ray, ``ray_head``, or a Ray of its own) and every later cell runs on it
  (``KeptRayBackend``). A worker keeps no cell's state between cells (horizontal nodes
  rebuild their trainer for each run's fingerprint and keep their private state on disk; a party's worker is replaced
  when another run's first message arrives), and a cell that fails drops them, so the next one starts afresh.
- Flower 1.42's simulation moves the server's messages from its message store to the workers' queue in a loop that
  sleeps 0.1 s between looks, and the server looks for replies in the store on a timer too. A horizontal round sends
  a few messages, but SS-VFNAS's parties exchange activations and gradients several times a step, each exchange
  waiting out both timers: an embedded SS-VFNAS cell took about a minute on Flower against a few seconds in process.
  For the length of a run, the store signals every message stored in it (``common.STORED``), and the feed and the
  server's wait for replies (``common.send_and_receive``) wake on it.
- When the ServerApp ends, Flower's simulation waits for its worker threads and its reply thread, each blocked on a
  queue for up to 1 s before it looks whether the run stopped: every simulated run (a cell, an SS-VFNAS phase) ended
  about 1 s after its work (an empty SS-VFNAS run on a kept worker took 1.09 s wall and 0.04 s of CPU). For the length
  of a run those queues are ``_StoppableQueue``: once the run stops, the feed wakes whoever waits on them.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing.util
import random
import threading
from queue import Empty, Queue
from typing import Any, Callable, Iterator

from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.fleet.vce.backend import raybackend
from flwr.server.superlink.linkstate import InMemoryLinkState

from fedrepro.fl.flower.common import STORED
from fedrepro.fl.flower.ray_head import ray_on_loopback_only

MESSAGE_POLL_SECONDS = 0.1
"""How often the feed looks for messages the server sent when no store wakes it (Flower's own loop's interval)."""


class KeptRayBackend(raybackend.RayBackend):
    """Flower's Ray backend with one ClientApp worker (Flower's fills every core of the Ray it joins, a stage's Ray
    shared by all its cells included), kept for the process's later simulations instead of shut down after each.

    Stopped at the process's exit: a stage's forked cell workers end without running ``atexit`` hooks, Ray's own
    included (its agents outlived them by a minute), so ``build`` registers ``ray.shutdown`` (which stops the worker,
    and does nothing where Ray's own hook ran first) with multiprocessing's exit finalizers, which they do run.
    Flower 1.42 builds its backend from ``raybackend.RayBackend`` when a simulation starts; ``kept_ray_backend`` puts
    this class there for the length of one run. A run that asks for other resources per ClientApp (another cell's
    threads) gets a worker of its own."""

    kept_pool: raybackend.BasicActorPool | None = None
    kept_for: dict[str, float] | None = None
    """The resources per ClientApp the kept workers were started with."""

    def init_ray(self, backend_config: dict[str, Any]) -> None:
        """Flower's, with Python's ``random`` seeded from the OS for it and then put back as the cell left it: Ray names
        a driver's subscriptions to its cluster with ``random``, which every cell seeds, and two cells of one seed that
        joined a stage's Ray under one name took each other's replies, polling it in a loop (a core's worth of CPU). The
        Ray it starts or joins stays on loopback, with no dashboard process (``ray_head.ray_on_loopback_only``)."""
        cell_draws = random.getstate()
        random.seed()
        try:
            with ray_on_loopback_only():
                super().init_ray(backend_config)
        finally:
            random.setstate(cell_draws)

    def build(self, app_fn: Callable[[], Any]) -> None:
        if KeptRayBackend.kept_pool is not None and KeptRayBackend.kept_for != self.client_resources:
            KeptRayBackend.kept_pool.terminate_all_actors()
            KeptRayBackend.kept_pool = None
        if KeptRayBackend.kept_pool is None:
            pool = raybackend.BasicActorPool(
                actor_type=raybackend.ClientAppActor,
                client_resources=self.client_resources,
                actor_kwargs=self.actor_kwargs,
            )
            pool.add_actors_to_pool(1)
            KeptRayBackend.kept_pool, KeptRayBackend.kept_for = pool, dict(self.client_resources)
            multiprocessing.util.Finalize(None, raybackend.ray.shutdown, exitpriority=0)
        self.pool, self.app_fn = KeptRayBackend.kept_pool, app_fn

    def terminate(self) -> None:
        """Kept for the next simulation; ``drop`` stops it."""

    @classmethod
    def drop(cls) -> None:
        """Stop the kept worker and leave Ray (after a failed run, whose worker may be broken or busy, and before a
        stage's Ray stops)."""
        if cls.kept_pool is not None:
            cls.kept_pool.terminate_all_actors()
            cls.kept_pool = None
        raybackend.ray.shutdown()


class _StoppableQueue(Queue):
    """A queue of one simulation's runtime whose waiting ``get`` returns (``Empty``) as soon as ``stop()`` is called,
    rather than at the end of its timeout. Every one made during a run is kept in ``made``."""

    made: list[_StoppableQueue] = []

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False
        _StoppableQueue.made.append(self)

    def stop(self) -> None:
        with self.mutex:
            self.stopped = True
            self.not_empty.notify_all()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        with self.not_empty:
            self.not_empty.wait_for(lambda: self._qsize() or self.stopped, timeout if block else 0)
            if not self._qsize():
                raise Empty
            item = self._get()
            self.not_full.notify()
            return item


def _feed_messages_promptly(state: Any, queue: Queue, nodes_mapping: dict, f_stop: threading.Event) -> None:
    """The simulation's feed from its message store to its workers' queue, woken by every message stored; once the
    run stops, it wakes every thread waiting on the run's queues (``_StoppableQueue``)."""
    while not f_stop.is_set():
        stored, fed = STORED.count, False
        for node_id in nodes_mapping:
            for message in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(message)
                fed = True
        if not fed:
            STORED.wait_after(stored, MESSAGE_POLL_SECONDS)
    for made in _StoppableQueue.made:
        made.stop()


def _signalling(store: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``store`` (a message store's method), then ``STORED.signal()``."""

    @functools.wraps(store)
    def store_and_signal(state: Any, message: Any) -> Any:
        stored = store(state, message)
        STORED.signal()
        return stored

    return store_and_signal


@contextlib.contextmanager
def kept_ray_backend() -> Iterator[None]:
    """Run one simulation on the process's kept Ray backend, its messages handed on as soon as they are stored; a run
    that fails drops it."""
    flowers = (
        raybackend.RayBackend,
        vce_api.add_messages_to_queue,
        vce_api.Queue,
        InMemoryLinkState.store_message_ins,
        InMemoryLinkState.store_message_res,
    )
    raybackend.RayBackend, vce_api.add_messages_to_queue, vce_api.Queue = (
        KeptRayBackend,
        _feed_messages_promptly,
        _StoppableQueue,
    )
    _StoppableQueue.made = []
    InMemoryLinkState.store_message_ins = _signalling(flowers[3])
    InMemoryLinkState.store_message_res = _signalling(flowers[4])
    try:
        yield
    except BaseException:
        KeptRayBackend.drop()
        raise
    finally:
        (
            raybackend.RayBackend,
            vce_api.add_messages_to_queue,
            vce_api.Queue,
            InMemoryLinkState.store_message_ins,
            InMemoryLinkState.store_message_res,
        ) = flowers
        _StoppableQueue.made = []
