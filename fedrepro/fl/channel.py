"""The only way tensors cross a client/server (or party) boundary: every message is counted and recorded.

Privacy claims are checked here: ``names_received(party)`` says exactly which parameters a party ever
saw, and tests assert that private names never appear in an upload.
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


class Channel:
    """Counts bytes per round and direction, and keeps the names (never the values) of what was sent."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.scalars: list[Message] = []
        """Scalars a real network carries beside the tensors (a node's client id, sample counts, losses, metrics):
        logged apart, so tensor bytes per round and per link mean the same in every runtime."""

    def send(self, round_index: int, sender: str, receiver: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Deliver a detached copy, so the receiver can never alias (and silently mutate) the sender's memory."""
        return self.broadcast(round_index, sender, [receiver], tensors)

    def broadcast(self, round_index: int, sender: str, receivers: list[str], tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
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

    def send_scalars(self, round_index: int, sender: str, receiver: str, values: dict[str, object]) -> dict[str, object]:
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
