"""FedLC (Zhang et al., ICML'22): logit calibration by the client's label counts.

The local loss is cross-entropy on logit_c - tau * n_c^(-1/4), n_c the client's training samples of class c,
so rare local classes are not suppressed. FedLC's paper does not give tau; it is the ``tau`` knob. A class the
client never saw is counted as 1 (the largest shift) rather than dividing by zero.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from fedrepro.fl.algorithm import Algorithm, LocalContext, TaskOutput


def calibration(counts: torch.Tensor, tau: float) -> torch.Tensor:
    return tau * counts.clamp(min=1).pow(-0.25)


class FedLC(Algorithm):
    name, label = "fedlc", "FedLC"

    class Settings(Algorithm.Settings):
        tau: float = Field(ge=0, description="scale of the calibration tau * n_c^(-1/4)")

    def prepare_task(self, task, channel, seed):
        self.task, self.shifts = task, {}  # counted where a client trains: a silo-local server holds no labels
        return task

    def local_objective(self, model: nn.Module, output: TaskOutput, context: LocalContext) -> torch.Tensor:
        client_id = context.client_id
        if client_id not in self.shifts:
            self.shifts[client_id] = calibration(self.task.label_counts(client_id), self.settings.tau)
        return nn.functional.cross_entropy(
            output.logits.float() - self.shifts[client_id].to(output.logits.device), output.targets
        )
