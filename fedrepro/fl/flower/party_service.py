"""A vertical party's own long-lived process on a deployment's node.

A Flower deployment runs each message in a new ClientApp process, but a party of the split-learning protocol keeps
its networks, its optimizers and the graph of its last forward pass between messages. So each party's node also runs
this service: one process that builds the party from the run's recipe on its first command and holds its
``PartyWorker`` for the run. The ClientApp of every message hands the label party's command to it over a Unix socket
in the node's own directory and replies with what it answered; nothing leaves the node but that reply. The service
serves one command at a time, in the order the ClientApps bring them (the label party sends the next command only
after every reply of the previous one).

Framing: an 8-byte big-endian length, then ``torch.save`` of a dict of strings and tensors (exact bytes both ways,
read back with ``weights_only=True``). A run is named by its recipe's file, which ``VerticalDeployment`` pickled; the
service loads the recipe from it.

    python -m fedrepro.fl.flower.party_service SOCKET DIRECTORY PARTY_ID
"""

from __future__ import annotations

import io
import json
import pickle
import socket
import struct
import sys
from pathlib import Path
from typing import Any, Mapping

import torch

from fedrepro.errors import FederationError
from fedrepro.vfl.nodes import PartyWorker, VerticalRecipe

LENGTH = struct.Struct(">Q")


def load_recipe(path: str | Path) -> VerticalRecipe:
    """The run's recipe, as ``VerticalDeployment`` pickled it (the file every party reads; the label party's drive is
    in another)."""
    with open(path, "rb") as file:
        return pickle.load(file)


def _send(connection: socket.socket, payload: Mapping[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(dict(payload), buffer)
    data = buffer.getvalue()
    connection.sendall(LENGTH.pack(len(data)) + data)


def _receive(connection: socket.socket) -> dict[str, Any]:
    def exactly(n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = connection.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionError("the other side closed the connection mid-message")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    (size,) = LENGTH.unpack(exactly(LENGTH.size))
    return torch.load(io.BytesIO(exactly(size)), weights_only=True)


def ask(
    socket_path: str | Path, spec: str, op: str, command: str, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The ClientApp's side: hand one command to the party's service and return its reply tensors."""
    try:
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(str(socket_path))
            _send(connection, {"spec": spec, "op": op, "command": command, "tensors": dict(tensors)})
            reply = _receive(connection)
    except OSError as error:
        raise FederationError(f"the party service on {socket_path} did not answer {op!r}: {error}") from error
    if "error" in reply:
        raise FederationError(f"the party service on {socket_path} failed on {op!r}: {reply['error']}")
    return reply["tensors"]


class PartyService:
    """Party ``index``'s worker of the current run, rebuilt when a command names another run."""

    def __init__(self, directory: Path, index: int) -> None:
        self.directory, self.index = Path(directory), index
        self.spec: str | None = None
        self.worker: PartyWorker | None = None

    def handle(self, request: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        if request["spec"] != self.spec:
            recipe = load_recipe(request["spec"])
            torch.set_num_threads(recipe.threads)
            self.worker = PartyWorker(recipe, recipe.build_party(self.index), self.directory)
            self.spec = request["spec"]
        return self.worker.handle(request["op"], json.loads(request["command"]), request["tensors"])


def serve(socket_path: str | Path, directory: str | Path, index: int) -> None:
    """Answer commands on ``socket_path`` until killed; a failed command is answered with its error (the label party
    names the party and stops), and the service goes on."""
    socket_path = Path(socket_path)
    socket_path.unlink(missing_ok=True)
    service = PartyService(Path(directory), index)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(socket_path))
        listener.listen(8)
        print(f"party {index} service ready on {socket_path}", flush=True)
        while True:
            connection, _ = listener.accept()
            with connection:
                try:
                    request = _receive(connection)
                except (ConnectionError, OSError, RuntimeError) as error:
                    print(f"dropped a request: {error}", flush=True)
                    continue
                try:
                    reply: dict[str, Any] = {"tensors": service.handle(request)}
                except Exception as error:  # answered, so the label party can name it; the service goes on
                    reply = {"error": f"{type(error).__name__}: {error}"}
                try:
                    _send(connection, reply)
                except OSError as error:
                    print(f"could not answer {request.get('op')!r}: {error}", flush=True)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))
