"""FedRS (Li and Zhan, KDD'21): restricted softmax, so a client's missing classes are not pushed away blindly.

Each client scales class c's logit by alpha_c = n_c / max_j n_j * (1 - a) + a, n_c its training samples of
class c: a never-seen class gets a (``alpha``), the most frequent 1. This count-scaled form is the one
the FedRS author's code uses; ``mask`` switches to the paper's binary mask (1 for classes the client
holds, a for the others), which is a different method and reported as such. Only the local loss changes.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from fedrepro.fl.algorithm import Algorithm, LocalContext, TaskOutput


def restricted_scale(counts: torch.Tensor, alpha: float, mask: bool) -> torch.Tensor:
    if mask:
        return torch.where(counts > 0, torch.ones_like(counts), torch.full_like(counts, alpha))
    return counts / counts.max().clamp(min=1) * (1 - alpha) + alpha


class FedRS(Algorithm):
    name, label = "fedrs", "FedRS"

    class Settings(Algorithm.Settings):
        alpha: float = Field(
            ge=0, le=1, description="logit scale of a class the client never saw (1 for its most frequent class)"
        )
        mask: bool = Field(
            description="the paper's binary present/absent mask instead of the author's count-scaled one"
        )

    def prepare_task(self, task, channel, seed):
        self.task, self.scales = task, {}  # counted where a client trains: a silo-local server holds no labels
        return task

    def local_objective(self, model: nn.Module, output: TaskOutput, context: LocalContext) -> torch.Tensor:
        client_id = context.client_id
        if client_id not in self.scales:
            self.scales[client_id] = restricted_scale(
                self.task.label_counts(client_id), self.settings.alpha, self.settings.mask
            )
        return nn.functional.cross_entropy(
            output.logits.float() * self.scales[client_id].to(output.logits.device), output.targets
        )
