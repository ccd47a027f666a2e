"""A client's private state on its own node: one safetensors file per round it trained, written atomically.

What a client keeps between its rounds (private parameters, algorithm state such as SCAFFOLD's variate or
MOON's previous model) never travels to the server. On Flower it lives in
the node's ``Context.state`` and, so that it survives a node restart or a server resumed from an older
round, in the node's own directory. The file of round r holds the state *after* round r.

A round starts from the state of the last round whose update the server counted (``counted_round``, which the
server sends with every message), not from the newest file: a reply that arrived after the server closed the
round, or that it refused, left the node a step ahead of the federation, and SCAFFOLD's variates (the server's
c is the mean of every client's c_k) or a private head trained against a model the server never built would
silently part from the server's. A round the server replays after a crash starts from what the client held
the first time, for the same reason. So the file a round started from is kept beside the one it writes; older
ones go.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from fedrepro.fl.flower.messages import safetensors_metadata
from fedrepro.io import atomic_file

PREFIX, SUFFIX = "round-", ".safetensors"
NODES = "nodes"
"""The folder, beside a cell's server checkpoint, holding one state directory per client (``<nodes>/<client id>``) where
the harness owns every node's directory on this machine (a simulation, or a local deployment whose nodes have no
``state-dir`` of their own)."""


@dataclass
class NodeState:
    """The state a client holds after ``round_index`` (``-1``: before its first round)."""

    round_index: int
    tensors: dict[str, torch.Tensor]


def encode(state: NodeState, fingerprint: str) -> bytes:
    """The safetensors bytes of a state; its round and the run's fingerprint ride in its metadata."""
    metadata = {"round": str(state.round_index), "fingerprint": fingerprint}
    return save_tensors({k: v.contiguous() for k, v in state.tensors.items()}, metadata=metadata)


def decode(blob: bytes) -> tuple[NodeState, str]:
    """A state and the fingerprint of the run that wrote it."""
    metadata = safetensors_metadata(blob)
    return NodeState(int(metadata["round"]), load_tensors(blob)), metadata["fingerprint"]


class NodeStateStore:
    """The state files of one client of one run under ``directory`` (the node's own folder)."""

    def __init__(self, directory: str | Path, fingerprint: str) -> None:
        self.directory, self.fingerprint = Path(directory), fingerprint

    def _path(self, round_index: int) -> Path:
        return self.directory / f"{PREFIX}{round_index:06d}{SUFFIX}"

    def _rounds(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name[len(PREFIX) : -len(SUFFIX)]) for p in self.directory.glob(f"{PREFIX}*{SUFFIX}"))

    def _ours(self, round_index: int) -> bool:
        """Whether this run wrote the file (reads only its header)."""
        with open(self._path(round_index), "rb") as handle:
            head = handle.read(8)
            head += handle.read(struct.unpack("<Q", head)[0])
        return safetensors_metadata(head).get("fingerprint") == self.fingerprint

    def newest_round_until(self, round_index: int) -> int | None:
        """The newest round up to and including ``round_index`` this run wrote a state for (file headers only)."""
        return next((r for r in reversed(self._rounds()) if r <= round_index and self._ours(r)), None)

    def latest_until(self, round_index: int) -> NodeState | None:
        """The state after the newest round up to ``round_index`` (None: the client had not trained by then)."""
        newest = self.newest_round_until(round_index)
        return None if newest is None else decode(self._path(newest).read_bytes())[0]

    def save(self, state: NodeState, started_from: int) -> bytes:
        """Write the state of ``state.round_index`` atomically, keep the file of ``started_from`` (the round this
        one started from: what the next round starts from if the server does not count this one), drop the others,
        and return the bytes written."""
        blob = encode(state, self.fingerprint)
        with atomic_file(self._path(state.round_index), "wb") as handle:
            handle.write(blob)
            handle.flush()
            os.fsync(handle.fileno())
        keep = {state.round_index, started_from}
        for stored_round in self._rounds():
            if stored_round not in keep:
                self._path(stored_round).unlink()
        return blob


def counted_round(history: list[dict], client_id: str) -> int:
    """The last round (0-based) whose update from ``client_id`` the server aggregated, by its record; -1: none."""
    return max((record["round"] - 1 for record in history if client_id in record["clients"]), default=-1)


def collect_node_states(engine, nodes_root: Path) -> None:
    """Each client's final private state (after the last round the server counted), read into ``engine.state``
    from its node's directory: what the harness does after a Flower run so a stage can score each client's own
    model on this machine, as each silo would. The Flower server never calls it."""
    for client_id in engine.train_ids:
        store = NodeStateStore(nodes_root / client_id, engine.fingerprint)
        state = store.latest_until(counted_round(engine.state.history, client_id))
        if state is not None:
            engine.state.client_states[client_id] = state.tensors
