"""Per-round checkpoints: tensors in safetensors, everything else in JSON; no pickle anywhere.

Layout of one checkpoint directory::

    state.json               round reached, run fingerprint, history, channel log
    global.safetensors       the server's shared weights
    clients/<id>.safetensors each client's private tensors (private parameters + algorithm client state)
    server.safetensors       the algorithm's extra server state (may be empty)

A checkpoint is written to a temporary directory and renamed, so a kill leaves the previous one intact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from fedrepro.io import atomic_dir, read_json, write_json

LATEST = "latest"


@dataclass
class TrainingState:
    """Everything needed to continue a run exactly where it stopped."""

    fingerprint: str
    next_round: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    messages: list[list[Any]] = field(default_factory=list)
    scalars: list[list[Any]] = field(default_factory=list)
    """The channel's log of scalars beside the tensors (Flower runs: client ids, sample counts, losses, metrics)."""
    global_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    server_state: dict[str, torch.Tensor] = field(default_factory=dict)
    client_states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


def _save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path))


def save_checkpoint(root: Path, state: TrainingState) -> None:
    """Write ``root/latest`` atomically; the previous checkpoint survives a kill during the write."""
    with atomic_dir(Path(root) / LATEST) as tmp:
        _save_tensors(tmp / "global.safetensors", state.global_weights)
        _save_tensors(tmp / "server.safetensors", state.server_state)
        (tmp / "clients").mkdir()
        for client_id, tensors in state.client_states.items():
            _save_tensors(tmp / "clients" / f"{client_id}.safetensors", tensors)
        meta = {
            "fingerprint": state.fingerprint,
            "next_round": state.next_round,
            "history": state.history,
            "messages": state.messages,
        }
        if state.scalars:  # only runs with a network have them; the engine's checkpoints stay as they were
            meta["scalars"] = state.scalars
        write_json(tmp / "state.json", meta)


def load_checkpoint(root: Path, fingerprint: str, device: str = "cpu") -> TrainingState | None:
    """The latest checkpoint of this exact run, its tensors on ``device``, or None (absent, or written by a run with
    other settings, which the next save then replaces)."""
    directory = Path(root) / LATEST
    if not (directory / "state.json").exists():
        return None
    meta = read_json(directory / "state.json")
    if meta.get("fingerprint") != fingerprint:
        return None
    clients = {p.stem: load_file(str(p), device=device) for p in sorted((directory / "clients").glob("*.safetensors"))}
    return TrainingState(
        fingerprint=fingerprint,
        next_round=meta["next_round"],
        history=meta["history"],
        messages=meta["messages"],
        scalars=meta.get("scalars", []),
        global_weights=load_file(str(directory / "global.safetensors"), device=device),
        server_state=load_file(str(directory / "server.safetensors"), device=device),
        client_states=clients,
    )
