"""A tiny regression task for engine tests: fast, and generic enough to exercise every hook."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from fedrepro.fl.algorithm import TaskOutput


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).squeeze(-1)


class ToyTask:
    """Each client has its own linear target, so personalised heads really differ."""

    def __init__(self, sizes: dict[str, int], batch_size: int = 8) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.client_ids = list(sizes)
        self.batch_size = batch_size
        self.data = {}
        for index, (client, size) in enumerate(sizes.items()):
            x = torch.randn(size + 16, 4, generator=generator)
            w = torch.randn(4, generator=generator) + index
            self.data[client] = (x, x @ w)

    def build_model(self) -> nn.Module:
        return ToyModel()

    def num_train_samples(self, client_ids: Sequence[str]) -> int:
        return sum(len(self.data[c][0]) - 16 for c in client_ids)

    def train_batches(self, client_ids: Sequence[str], generator: torch.Generator):
        x = torch.cat([self.data[c][0][16:] for c in client_ids])
        y = torch.cat([self.data[c][1][16:] for c in client_ids])
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), self.batch_size):
            index = order[start:start + self.batch_size]
            yield x[index], y[index]

    def forward(self, model: nn.Module, batch) -> TaskOutput:
        x, y = batch
        prediction = model(x)
        return TaskOutput(loss=((prediction - y) ** 2).mean(), logits=prediction)

    def evaluate(self, model: nn.Module, client_id: str, split: str) -> dict[str, float]:
        x, y = self.data[client_id]
        return {"mse": float(((model(x[:16]) - y[:16]) ** 2).mean())}
