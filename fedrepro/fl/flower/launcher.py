"""A warm start for Flower's per-message ClientApp processes on a node.

A SuperNode runs every message it receives in a fresh ``flwr-clientapp`` process. Building a BERT cell
there means importing torch and transformers first: about 4 s of CPU per message, which on a small machine
made a round of eight clients take close to a minute. The launcher imports those modules once, then forks
one child per message; the child runs Flower's own ``flwr-clientapp`` entry point with the arguments the
SuperExec gave, so every message still gets a process of its own and the node's protocol is Flower's.

How it hooks in: the federation's processes find ``flwr-clientapp`` on their ``PATH`` first in a folder
holding ``shim_script``, a stdlib-only script that hands its arguments to the launcher's Unix socket and
exits; when no launcher answers it runs Flower's real ``flwr-clientapp`` instead. The launcher must stay
single-threaded until it forks (it runs no torch op and starts no thread), so the children are safe.
At most ``slots`` children run at once (the machine's cores over the cell's torch threads): a deployment
on one machine shares its cores among all the nodes, and eight ClientApps of two threads each on two cores
spun OpenMP threads against each other until a round took a minute; on Ray each ClientApp likewise asks
for the cores it uses. Each child is listed in ``<socket>.children/<pid>`` with the pid of the SuperExec that
asked for it, so stopping a SuperNode (and its SuperExec) can stop the ClientApp processes working for it too. A
SuperNode that dies unasked has its ClientApps ended the same way, by the federation that started it
(``LocalFederation.end_dead_supernodes``): a ClientApp whose node is gone retries it forever and would hold its slot,
and only the federation, which owns the node's process, can tell a dead node's ClientApp from a slow one.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

SOCKET_ENV = "FEDREPRO_CLIENTAPP_LAUNCHER"
"""Environment variable naming the launcher's Unix socket (read by the shim)."""
COMMAND = "flwr-clientapp"

SHIM = '''#!{python}
"""flwr-clientapp, started warm: hands its arguments to the fedrepro launcher (see fedrepro/fl/flower/launcher.py)."""
import json, os, socket, sys
path = os.environ.get("{socket_env}")
try:
    with socket.socket(socket.AF_UNIX) as launcher:
        launcher.connect(path)
        launcher.sendall(json.dumps(sys.argv[1:]).encode() + b"\\n")
        answer = launcher.makefile().readline()
except (OSError, TypeError):
    answer = ""
if not answer.startswith("started"):
    os.execv("{real}", ["{real}", *sys.argv[1:]])
'''


def shim_script(folder: Path) -> Path:
    """Write the ``flwr-clientapp`` shim into ``folder`` (put it first on the federation's PATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    real = Path(sys.executable).parent / COMMAND
    shim = folder / COMMAND
    shim.write_text(SHIM.format(python=sys.executable, socket_env=SOCKET_ENV, real=real))
    shim.chmod(0o755)
    return shim


def _run_clientapp(arguments: list[str]) -> None:
    """In the forked child: Flower's ``flwr-clientapp`` main with the SuperExec's arguments; never returns."""
    code = 0
    try:
        from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

        sys.argv = [COMMAND, *arguments]
        flwr_clientapp()
    except SystemExit as leaving:
        code = leaving.code if isinstance(leaving.code, int) else (0 if leaving.code is None else 1)
    except BaseException:  # a child must never return into the launcher's loop
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def children_folder(socket_path: str | Path) -> Path:
    return Path(f"{socket_path}.children")


def children_of(socket_path: str | Path, requesters: set[int]) -> list[int]:
    """The running ClientApp processes the launcher started for any of the ``requesters`` (SuperExec pids)."""
    found = []
    for entry in children_folder(socket_path).glob("*"):
        try:
            if int(entry.read_text() or -1) in requesters:
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def _requester(arguments: list[str]) -> int:
    """The SuperExec's pid, which it passes to every ClientApp as ``--parent-pid`` (-1 if absent)."""
    if "--parent-pid" in arguments[:-1]:
        return int(arguments[arguments.index("--parent-pid") + 1])
    return -1


def serve(socket_path: str | Path, slots: int, preload: list[str]) -> None:
    """Import ``preload``, then fork one ``flwr-clientapp`` child per request on ``socket_path`` until killed,
    at most ``slots`` at a time (a request waits for a free slot)."""
    for module in ["flwr.supernode.cli.flwr_clientapp", *preload]:
        importlib.import_module(module)
    if threading.active_count() != 1:
        raise RuntimeError(f"the ClientApp launcher must not fork with threads running: {threading.enumerate()}")
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    socket_path = Path(socket_path)
    socket_path.unlink(missing_ok=True)
    children = children_folder(socket_path)
    children.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(socket_path))
        listener.listen(64)
        print(f"launcher ready on {socket_path} (preloaded {', '.join(preload) or 'nothing'})", flush=True)
        while True:
            connection, _ = listener.accept()
            with connection:
                arguments = json.loads(connection.makefile().readline())
                _reap(children, block_while_running=slots)
                child = os.fork()
                if child == 0:
                    listener.close()
                    connection.close()
                    _run_clientapp(arguments)
                (children / str(child)).write_text(str(_requester(arguments)))
                connection.sendall(f"started {child}\n".encode())
            _reap(children)


def _reap(children: Path, block_while_running: int | None = None) -> None:
    """Collect the children that have ended (they stay zombies otherwise) and drop them from the list; with
    ``block_while_running=n``, wait until fewer than n are left running."""
    while True:
        running = sum(1 for _ in children.iterdir())
        wait = block_while_running is not None and running >= block_while_running
        try:
            pid, _ = os.waitpid(-1, 0 if wait else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        (children / str(pid)).unlink(missing_ok=True)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
