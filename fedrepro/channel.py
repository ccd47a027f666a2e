"""The only way tensors cross a client/server (or party) boundary: every message is counted and recorded.

Privacy claims are checked here: ``names_received(party)`` says exactly which parameters a party ever
saw, and tests assert that private names never appear in an upload. What a server may aggregate is checked
here too (``upload_problem``), by every runtime, before an upload crosses.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pandas as pd
import torch

SERVER = "server"


@dataclass(frozen=True)
class Message:
    round: int
    sender: str
    receiver: str
    names: tuple[str, ...]
    nbytes: int

    def to_record(self) -> list:
        """The JSON form kept in checkpoints."""
        return [self.round, self.sender, self.receiver, list(self.names), self.nbytes]

    @classmethod
    def from_record(cls, record: list) -> "Message":
        round_index, sender, receiver, names, nbytes = record
        return cls(round_index, sender, receiver, tuple(names), nbytes)


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def upload_problem(
    client_id: str, upload: dict[str, torch.Tensor], server_tensors: dict[str, torch.Tensor], required: list[str]
) -> str | None:
    """Why a server must not aggregate an upload (a name it does not hold, a missing shared parameter, a wrong
    shape or dtype, a NaN or Inf value), naming the client and the field; None when it may.

    The engine and the Flower server both call it on every upload, so the same upload is refused on every
    runtime: one NaN averaged into the global weights spreads to every client in the next round."""
    unknown = sorted(set(upload) - set(server_tensors))
    if unknown:
        return (
            f"client {client_id}: upload field {unknown[0]!r} is not a tensor the server holds ({len(unknown)} unknown)"
        )
    missing = [name for name in required if name not in upload]
    if missing:
        return f"client {client_id}: upload lacks field {missing[0]!r} ({len(missing)} shared parameters missing)"
    for name, tensor in upload.items():
        expected = server_tensors[name]
        if tensor.shape != expected.shape or tensor.dtype != expected.dtype:
            return (
                f"client {client_id}: upload field {name!r} is {tuple(tensor.shape)} {tensor.dtype}, "
                f"expected {tuple(expected.shape)} {expected.dtype}"
            )
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            return (
                f"client {client_id}: upload field {name!r} holds {int((~finite).sum())} non-finite values "
                f"(NaN or Inf) of {tensor.numel()}"
            )
    return None


class Channel:
    """Counts bytes per round and direction, and keeps the names (never the values) of what was sent."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.scalars: list[Message] = []
        """Scalars a real network carries beside the tensors (a node's client id, sample counts, losses, metrics):
        logged apart, so tensor bytes per round and per link mean the same in every runtime."""

    def send(
        self, round_index: int, sender: str, receiver: str, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Deliver a detached copy, so the receiver can never alias (and silently mutate) the sender's memory."""
        return self.broadcast(round_index, sender, [receiver], tensors)

    def broadcast(
        self, round_index: int, sender: str, receivers: list[str], tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The same tensors to several receivers: one read-only copy in memory, bytes counted once per receiver."""
        delivered = {name: t.detach().clone() for name, t in tensors.items()}
        names, nbytes = tuple(sorted(delivered)), tensor_bytes(delivered)
        self.messages.extend(Message(round_index, sender, receiver, names, nbytes) for receiver in receivers)
        return delivered

    def send_table(self, round_index: int, sender: str, receiver: str, name: str, table: pd.DataFrame) -> pd.DataFrame:
        """Deliver a copy of a table of records (e.g. questions a client discloses); its names are ``name.<column>``
        and its bytes the UTF-8 size of every cell, as it would travel in a text format."""
        delivered = table.copy(deep=True)
        nbytes = sum(len(str(value).encode("utf-8")) for column in delivered for value in delivered[column])
        names = tuple(sorted(f"{name}.{column}" for column in delivered.columns))
        self.messages.append(Message(round_index, sender, receiver, names, nbytes))
        return delivered

    def send_scalars(
        self, round_index: int, sender: str, receiver: str, values: dict[str, object]
    ) -> dict[str, object]:
        """Log scalars that cross beside the tensors; their bytes are their UTF-8 text, as in a text format."""
        nbytes = sum(len(str(value).encode("utf-8")) for value in values.values())
        self.scalars.append(Message(round_index, sender, receiver, tuple(sorted(values)), nbytes))
        return dict(values)

    def round_bytes(self, round_index: int) -> dict[str, int]:
        """Bytes uploaded to and downloaded from the server in one round."""
        totals = {"up": 0, "down": 0}
        for message in self.messages:
            if message.round == round_index:
                totals["up" if message.receiver == SERVER else "down"] += message.nbytes
        return totals

    def names_received(self, receiver: str) -> set[str]:
        return {name for m in self.messages if m.receiver == receiver for name in m.names}

    def names_sent(self, sender: str) -> set[str]:
        return {name for m in self.messages if m.sender == sender for name in m.names}

    def summary(self) -> dict[str, dict[str, int]]:
        """Total bytes and message count per (sender -> receiver) link, for the report."""
        links: dict[str, dict[str, int]] = defaultdict(lambda: {"bytes": 0, "messages": 0})
        for message in self.messages:
            link = links[f"{message.sender}->{message.receiver}"]
            link["bytes"] += message.nbytes
            link["messages"] += 1
        return dict(sorted(links.items()))
