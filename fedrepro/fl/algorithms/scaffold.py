"""SCAFFOLD (Karimireddy et al., 2020): control variates correct each client's drift towards its own optimum.

The server variate c travels with the model (``control/<name>``, so it is counted on the channel); each
client keeps its own c_k between rounds as client state. Locally the gradient becomes g + c - c_k, added
here as the linear term <theta, c - c_k> in the loss. After training the client updates its variate by
option II of the paper, c_k+ = c_k - c + (x - y_k) / (K eta), with K eta the sum of the step sizes it used,
and uploads the change c_k+ - c_k beside its weights; the server moves c by |S|/N times their mean.

Deviation, stated: the engine optimises with Adam (as every method here does), so the corrected gradient is
then rescaled per coordinate and (x - y_k) / (K eta) estimates the mean update direction rather than the mean
gradient. SCAFFOLD's analysis assumes plain SGD.
"""

from __future__ import annotations

import torch
from torch import nn

from fedrepro.fl.algorithm import Algorithm, ClientUpdate, LocalContext, TaskOutput

CONTROL = "control/"


class Scaffold(Algorithm):
    name = "scaffold"

    def prepare_task(self, task, channel, seed):
        self.total_clients = len(task.client_ids)
        return task

    def initial_server_state(self, global_weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**global_weights, **{CONTROL + n: torch.zeros_like(v) for n, v in global_weights.items()}}

    def _client_control(self, name: str, context: LocalContext) -> torch.Tensor:
        return context.client_state.get(CONTROL + name, torch.zeros_like(context.received[CONTROL + name]))

    def local_objective(self, model: nn.Module, output: TaskOutput, context: LocalContext) -> torch.Tensor:
        correction = sum(
            (param * (context.received[CONTROL + name] - self._client_control(name, context))).sum()
            for name, param in model.named_parameters() if CONTROL + name in context.received
        )
        return output.loss + correction

    def upload(self, shared: dict[str, torch.Tensor], context: LocalContext) -> dict[str, torch.Tensor]:
        deltas = {}
        with torch.no_grad():
            for name, value in shared.items():
                old = self._client_control(name, context)
                new = old - context.received[CONTROL + name] + (context.received[name] - value) / max(context.lr_sum, 1e-12)
                context.client_state[CONTROL + name] = new
                deltas[CONTROL + name] = new - old
        return {**shared, **deltas}

    def aggregate(self, global_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
        model_names = [n for n in global_weights if not n.startswith(CONTROL)]
        result = super().aggregate({n: global_weights[n] for n in model_names}, updates)
        share = len(updates) / self.total_clients
        for name in global_weights:
            if name.startswith(CONTROL):
                mean_delta = torch.stack([u.tensors[name] for u in updates]).mean(dim=0)
                result[name] = global_weights[name] + share * mean_delta
        return result
