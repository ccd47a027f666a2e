"""A federation's processes end with the process that started them, however that process ends.

A stage killed with SIGKILL (the OOM killer, a CI timeout's ``kill -9``) runs no ``finally``: the SuperLink, the
SuperNodes, their SuperExecs, the ClientApp launcher, the ServerApp and the ClientApps it had started, each in a session
of its own, ran on, and the orphan ServerApp went on training into the cell's checkpoint folder, where the rerun that
the stage's error advises would race it. So a ``LocalFederation`` starts a reaper before its first process: this
module, run as ``python -m fedrepro.fl.flower.reaper OWNER_PID PREFIX``, a process of its own session (a signal to the
stage's process group does not reach it) that imports nothing heavy. It knows its owner, the federation's process,
and the prefix of the mark every process of the federation carries in its environment (``federation.MARK``:
``<federation folder>:<process name>``, inherited by everything they start, whatever session that starts). As soon as
the owner is gone (the reaper finds itself re-parented) or writes ``end`` to its standard input (the federation
stopped its processes itself), it SIGKILLs every live marked process until none is left, and exits. SIGKILL rather
than SIGTERM: with its stage gone, nothing a federation's process does on its way out is wanted, and a ServerApp asked
to end may still write a checkpoint. Its standard output (the federation's ``logs/reaper.log``) says what it ended.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

MARK = "FEDREPRO_FEDERATION_PROCESS"
"""The environment variable that marks a federation's processes (``federation.MARK`` is this one)."""
POLL_SECONDS = 0.2
"""How often the reaper looks whether its owner is gone: the most a federation outlives its stage by, less the kills."""
KILL_SECONDS = 10.0
"""How long the reaper keeps killing marked processes (those that others start meanwhile included) before it gives up
and says which are left."""
END = "end"
"""What the owner writes to the reaper's standard input once it has stopped the federation's processes itself."""


def marked(prefix: str) -> dict[int, str]:
    """The live processes whose ``MARK`` starts with ``prefix``, each with its mark (a zombie has no environment left,
    and is no longer running)."""
    entry = f"{MARK}={prefix}".encode()
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            for variable in environ.read_bytes().split(b"\0"):
                if variable.startswith(entry):
                    found[int(environ.parent.name)] = variable.split(b"=", 1)[1].decode(errors="replace")
        except (OSError, ValueError):
            continue
    return found


def reap(prefix: str, seconds: float = KILL_SECONDS) -> tuple[dict[int, str], dict[int, str]]:
    """SIGKILL every live process marked with ``prefix`` until none is left or ``seconds`` have passed; (the processes
    killed, those still alive then), each with its mark."""
    killed: dict[int, str] = {}
    deadline = time.monotonic() + seconds
    while (found := marked(prefix)) and time.monotonic() < deadline:
        for pid, mark in found.items():
            try:
                os.kill(pid, signal.SIGKILL)
                killed[pid] = mark
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return killed, marked(prefix)


def wait_for_the_owner(owner: int) -> str:
    """Block until the owner is gone or says ``END``; why, in words."""
    while os.getppid() == owner:
        ready, _, _ = select.select([sys.stdin], [], [], POLL_SECONDS)
        if ready:
            line = sys.stdin.readline()
            if not line:  # no process holds the pipe's other end any more: the owner and its forks are gone
                return f"the owner ({owner}) closed its pipe"
            if line.strip() == END:
                return f"the owner ({owner}) stopped the federation"
    return f"the owner ({owner}) is gone"


def main() -> None:
    owner, prefix = int(sys.argv[1]), sys.argv[2]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the owner, which stops the federation and says END
    print(f"reaper of {prefix!r} for process {owner}", flush=True)
    why = wait_for_the_owner(owner)
    killed, left = reap(prefix)
    names = sorted(mark.rpartition(":")[2] for mark in killed.values())
    print(f"{why}: killed {len(killed)} process(es) left running {names}", flush=True)
    if left:
        print(f"still alive after {KILL_SECONDS:g} s: {left}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
