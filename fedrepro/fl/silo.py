"""Silo-local data: each client's rows in a directory of its own, as a hospital joining a federation holds them, and
a server that holds none of them.

``write_silos`` lays out one directory per client (``<root>/<client id>/``: the tables its task names, plus
``silo.json`` saying whose they are) and the server's ``manifest.json``: the client ids and each one's declared
training size, nothing else. A node builds its client's task from its own directory alone (``read_silo``); the
server builds a ``ServerTaskView`` from the manifest: it knows who takes part and how much each trains on (to check
a reply's ``num_samples`` and to weight the uploads) and builds the model, but cannot train or score anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd
import torch
from torch import nn

from fedrepro.errors import DataError, FederationError
from fedrepro.fl.algorithm import ClientUpdate, FederatedTask, TaskOutput
from fedrepro.io import read_json, read_table, write_json, write_table

MANIFEST, SILO_FILE = "manifest.json", "silo.json"
SILOS = "silos"
"""The folder of a cell's checkpoint directory its silos are laid out in when a stage runs it silo-local."""


@dataclass(frozen=True)
class Manifest:
    """What the server knows of the federation's data: who takes part (in the task's order, which client sampling
    follows), and each client's training size."""

    client_ids: list[str]
    train_sizes: dict[str, int]


def write_silos(
    root: str | Path,
    tables: Mapping[str, Mapping[str, pd.DataFrame]],
    train_sizes: Mapping[str, int],
    told: Mapping[str, Any] | None = None,
) -> Manifest:
    """``<root>/<client>/<name>.parquet`` for each of a client's ``tables`` (exactly its own rows), what every silo
    is ``told`` besides (no rows: e.g. the label space) in its ``silo.json``, and the server's
    ``<root>/manifest.json``: the clients in ``train_sizes`` order (the task's) and their declared training sizes."""
    root = Path(root)
    if set(tables) != set(train_sizes):
        raise DataError(
            f"silos of {root}: tables for clients {sorted(tables)}, training sizes for {sorted(train_sizes)}"
        )
    for client_id, client_tables in tables.items():
        folder = root / client_id
        folder.mkdir(parents=True, exist_ok=True)
        for name, frame in client_tables.items():
            write_table(folder / f"{name}.parquet", frame)
        write_json(folder / SILO_FILE, {"client": client_id, "tables": sorted(client_tables), "told": dict(told or {})})
    manifest = Manifest(list(train_sizes), {client_id: int(size) for client_id, size in train_sizes.items()})
    write_json(root / MANIFEST, {"clients": manifest.client_ids, "train_sizes": manifest.train_sizes})
    return manifest


@dataclass(frozen=True)
class Silo:
    """One client's directory as its node reads it."""

    client_id: str
    tables: dict[str, pd.DataFrame]
    told: dict[str, Any]


def read_silo(folder: str | Path) -> Silo:
    """The client a silo directory belongs to, its tables and what it was told."""
    folder = Path(folder)
    if not (folder / SILO_FILE).exists():
        raise DataError(
            f"{folder / SILO_FILE} is missing: {folder} is no client's silo (see fedrepro.fl.silo.write_silos)"
        )
    silo = read_json(folder / SILO_FILE)
    tables = {}
    for name in silo["tables"]:
        if not (folder / f"{name}.parquet").exists():
            raise DataError(f"{folder / name}.parquet is missing: the silo of client {silo['client']!r} is incomplete")
        tables[name] = read_table(folder / f"{name}.parquet")
    return Silo(str(silo["client"]), tables, dict(silo.get("told", {})))


def read_manifest(root: str | Path) -> Manifest:
    path = Path(root) / MANIFEST
    if not path.exists():
        raise DataError(f"{path} is missing: the server of a silo-local run needs the silos' manifest")
    manifest = read_json(path)
    clients, sizes = manifest.get("clients"), manifest.get("train_sizes")
    if not isinstance(sizes, dict) or not sizes or not all(isinstance(n, int) and n >= 0 for n in sizes.values()):
        raise DataError(f"{path}: train_sizes = {sizes!r}: expected a non-empty map of client id to sample count")
    if not isinstance(clients, list) or sorted(clients) != sorted(sizes):
        raise DataError(
            f"{path}: clients = {clients!r}: expected the clients of train_sizes ({sorted(sizes)}), in order"
        )
    return Manifest([str(c) for c in clients], sizes)


class ServerTaskView(FederatedTask):
    """The server's side of a silo-local task: the clients and their declared training sizes (from the manifest),
    the model, and whatever the task reads off uploads alone (``diagnose``) or off the counts its clients send
    (``score_counts``, for a task scored on one global set). Anything that needs a client's rows raises: on
    silo-local data the clients train and score, the server never does."""

    def __init__(
        self,
        manifest: Manifest,
        build_model: Callable[[], nn.Module],
        diagnose: Callable[[list[ClientUpdate]], dict[str, Any] | None] | None = None,
        score_counts: Callable[[dict[str, int]], dict[str, float]] | None = None,
    ) -> None:
        self.manifest, self._build_model = manifest, build_model
        self._diagnose, self._score_counts = diagnose, score_counts
        self.client_ids = manifest.client_ids
        self.evaluates_global_model = score_counts is not None

    def build_model(self) -> nn.Module:
        return self._build_model()

    def num_train_samples(self, client_ids: Sequence[str]) -> int:
        return sum(self.manifest.train_sizes[c] for c in client_ids)

    def _no_rows(self, what: str) -> FederationError:
        return FederationError(f"the server of a silo-local run holds no client's data: it cannot {what}")

    def train_batches(self, client_ids: Sequence[str], generator: torch.Generator):
        raise self._no_rows(f"train on clients {list(client_ids)}")

    def forward(self, model: nn.Module, batch: Any) -> TaskOutput:
        raise self._no_rows("run a batch")

    def evaluate(self, model: nn.Module, client_id: str, split: str) -> dict[str, float]:
        raise self._no_rows(f"score {client_id} on {split} (the clients score their own data)")

    def label_counts(self, client_id: str) -> torch.Tensor:
        raise self._no_rows(f"count the labels of client {client_id}")

    def diagnose_round(self, updates: list[ClientUpdate]) -> dict[str, Any] | None:
        return None if self._diagnose is None else self._diagnose(updates)

    def evaluation_counts(self, model: nn.Module, client_id: str, split: str) -> dict[str, int]:
        raise self._no_rows(f"count {client_id}'s {split} predictions")

    def scores_from_counts(self, counts: dict[str, int]) -> dict[str, float]:
        if self._score_counts is None:
            raise FederationError("this task is scored per client, not from counts summed over its clients")
        return self._score_counts(counts)
