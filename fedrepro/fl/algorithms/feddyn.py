"""FedDyn (Acar et al., ICLR 2021): a dynamic regulariser aligns each client's local optimum with the global one.

Client k keeps g_k, its estimate of the gradient of its loss at its last local model (zero before its first
round), and minimises L_k(theta) - <g_k, theta> + alpha / 2 ||theta - theta_server||^2; after training it
updates g_k <- g_k - alpha (theta_k - theta_server). The server keeps h (zero at the start), moves it by
h <- h - alpha sum_{k in P} q_k (theta_k - theta_server) over this round's clients P, and sets the model to
sum_{k in P} p_k theta_k - h / alpha. q_k is client k's weight among all m clients and p_k the same renormalised
over P: uniform q_k = 1/m is the paper's update; under ``weighting: size`` (FedCMC's p_k = N_k / N) q_k = N_k / N,
so h stays the weighted mean sum_k q_k g_k of every client's g_k, as it is the plain mean in the paper. h never
leaves the server (``is_server_only``) and g_k never leaves its client, so FedDyn sends exactly what FedAvg
sends. The paper's analysis assumes each client solves its local problem; here, as every method, a client takes
its round's Adam steps.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from fedrepro.fl.algorithm import Algorithm, ClientUpdate, LocalContext, TaskOutput

SERVER_STATE, CLIENT_GRADIENT = "feddyn/h/", "feddyn/gradient/"


class FedDyn(Algorithm):
    name, label = "feddyn", "FedDyn"

    class Settings(Algorithm.Settings):
        alpha: float = Field(gt=0, description="weight of the dynamic regulariser (the paper tries 0.1, 0.01, 0.001)")

    def prepare_task(self, task, channel, seed):
        self.total_clients, self.total_samples = len(task.client_ids), task.num_train_samples(task.client_ids)
        return task

    def initial_server_state(self, global_weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**global_weights, **{SERVER_STATE + n: torch.zeros_like(v) for n, v in global_weights.items()}}

    def is_server_only(self, name: str) -> bool:
        return name.startswith(SERVER_STATE)

    def local_objective(self, model: nn.Module, output: TaskOutput, context: LocalContext) -> torch.Tensor:
        linear, proximal = 0.0, 0.0
        for name, param in model.named_parameters():
            if name not in context.received:
                continue
            if CLIENT_GRADIENT + name in context.client_state:
                linear = linear + (param * context.client_state[CLIENT_GRADIENT + name]).sum()
            proximal = proximal + (param - context.received[name]).pow(2).sum()
        return output.loss - linear + 0.5 * self.settings.alpha * proximal

    def upload(self, shared: dict[str, torch.Tensor], context: LocalContext) -> dict[str, torch.Tensor]:
        """Send theta_k as FedAvg does; keep the new g_k."""
        with torch.no_grad():
            for name, value in shared.items():
                step = self.settings.alpha * (value - context.received[name])
                previous = context.client_state.get(CLIENT_GRADIENT + name)
                context.client_state[CLIENT_GRADIENT + name] = -step if previous is None else previous - step
        return shared

    def aggregate(
        self, global_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]
    ) -> dict[str, torch.Tensor]:
        model_names = [n for n in global_weights if not self.is_server_only(n)]
        averaged = super().aggregate({n: global_weights[n] for n in model_names}, updates)
        # the sum of q_k over this round's clients (averaged is their p_k-weighted mean)
        share = (
            sum(u.num_samples for u in updates) / self.total_samples
            if self.common.weighting == "size"
            else len(updates) / self.total_clients
        )
        alpha, result = self.settings.alpha, {}
        for name in model_names:
            h = global_weights[SERVER_STATE + name] - alpha * share * (averaged[name] - global_weights[name])
            result[name], result[SERVER_STATE + name] = averaged[name] - h / alpha, h
        return result
