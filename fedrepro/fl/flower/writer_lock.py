"""One writer per checkpoint folder: a deployment's ServerApp holds an exclusive lock on ``<folder>/writer.lock`` from
before it reads the checkpoint until its run ends.

Why: the ServerApp is a process of its own, started by the SuperLink's SuperExec, not by the stage. Should it outlive
its stage (on this machine the federation's reaper, ``reaper.py``, ends it within a second; on a SuperLink host of
its own nothing does), the rerun that the stage's error advises would start a second ServerApp on the same folder and
the two would interleave their rounds' checkpoints. The lock is ``fcntl.flock``: the kernel drops it when its holder
exits, however it exits, so a crash never leaves a stale lock behind; the file says who holds it (process id, host,
since when, command line), which the second writer's error repeats.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from fedrepro.errors import FederationError

LOCK_FILE = "writer.lock"


def _holder() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(sys.argv)[:300],
    }


def _described(text: str) -> str:
    try:
        holder = json.loads(text)
        return (
            f"process {holder['pid']} on {holder['host']} (since {holder['since']}; {holder['command']}); "
            f"end it (`kill {holder['pid']}` there) or wait for it to finish"
        )
    except (ValueError, KeyError, TypeError):
        return "a process that has not yet said who it is"


@contextlib.contextmanager
def sole_writer(folder: str | Path) -> Iterator[None]:
    """Hold ``folder``'s writer lock for the body; a ``FederationError`` naming the folder and the holder if another
    process (or another open of the lock in this one) holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise FederationError(
                f"checkpoint folder {folder} is being written by another ServerApp: {_described(lock.read())}; "
                "two writers would interleave their rounds"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(json.dumps(_holder()))
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
