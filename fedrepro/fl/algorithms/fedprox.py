"""FedProx (Li et al., 2020): FedAvg plus a proximal term that keeps local weights near the round's global ones."""

import torch
from pydantic import Field
from torch import nn

from fedrepro.fl.algorithm import Algorithm, LocalContext, TaskOutput


class FedProx(Algorithm):
    name, label = "fedprox", "FedProx"

    class Settings(Algorithm.Settings):
        mu: float = Field(ge=0, description="weight of the proximal term (mu / 2) ||w - w_global||^2")

    def local_objective(self, model: nn.Module, output: TaskOutput, context: LocalContext) -> torch.Tensor:
        proximal = sum(
            (param - context.received[name]).pow(2).sum()
            for name, param in model.named_parameters()
            if name in context.received
        )
        return output.loss + 0.5 * self.settings.mu * proximal
