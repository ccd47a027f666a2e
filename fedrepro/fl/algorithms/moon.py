"""MOON (Li, He and Song, 2021): model-contrastive learning between the local, global and previous models.

Local loss = task loss + mu * l_con, with
l_con = -log e^{sim(z, z_glob)/T} / (e^{sim(z, z_glob)/T} + e^{sim(z, z_prev)/T}),
z the projection of this sample's relation features by the model being trained, z_glob by the round's global
model, z_prev by this client's model at the end of its previous round (the global model on its first round).
The projection head (two layers, ``projection_dim`` out; 0 = none) is shared and averaged with the rest.
The previous model is client state: plain tensors the engine keeps per client (and checkpoints), loaded into
a scratch copy of the model only while that client trains. Deviation, stated: MOON's classifier sits on top
of the projection; here it stays on the relation features, as in every other method, so only the contrastive
term differs between methods.
"""

from __future__ import annotations

import copy

import torch
from pydantic import Field
from torch import nn

from fedrepro.fl.algorithm import Algorithm, LocalContext, TaskOutput

PREVIOUS = "previous/"


def _projection(feature_dim: int, out_dim: int) -> nn.Module:
    if out_dim == 0:
        return nn.Identity()
    return nn.Sequential(nn.Linear(feature_dim, feature_dim), nn.ReLU(), nn.Linear(feature_dim, out_dim))


class Moon(Algorithm):
    name, label = "moon", "MOON"

    class Settings(Algorithm.Settings):
        mu: float = Field(ge=0, description="weight of the model-contrastive term")
        temperature: float = Field(gt=0)
        projection_dim: int = Field(
            ge=0,
            description="output size of the projection head on the relation features "
            "(0: no head, the features used as they are)",
        )

    def adapt_model(self, model: nn.Module) -> nn.Module:
        model.moon_projection = _projection(model.feature_dim, self.settings.projection_dim)
        self._global, self._previous = copy.deepcopy(model), copy.deepcopy(model)
        for scratch in (self._global, self._previous):
            scratch.requires_grad_(False)
        self._loaded_for: tuple[int, str] | None = None
        return model

    def _load_references(self, context: LocalContext) -> None:
        """Fill the two scratch models once per (round, client): the global weights and the client's previous ones."""
        if self._loaded_for == (context.round, context.client_id):
            return
        device = next(iter(context.received.values())).device  # the engine moved the model after adapt_model copied it
        self._global.to(device), self._previous.to(device)
        with torch.no_grad():
            for name, param in self._global.named_parameters():
                param.copy_(context.received[name])
            for name, param in self._previous.named_parameters():
                param.copy_(context.client_state.get(PREVIOUS + name, context.received[name]))
        self._global.eval(), self._previous.eval()  # fixed targets: no dropout noise on z_glob and z_prev
        self._loaded_for = (context.round, context.client_id)

    def local_objective(self, model: nn.Module, output: TaskOutput, context: LocalContext) -> torch.Tensor:
        self._load_references(context)
        z = model.moon_projection(output.features)
        with torch.no_grad():
            z_global = self._global.moon_projection(output.rerun(self._global).features)
            z_previous = self._previous.moon_projection(output.rerun(self._previous).features)
        temperature = self.settings.temperature
        positive = nn.functional.cosine_similarity(z, z_global, dim=-1) / temperature
        negative = nn.functional.cosine_similarity(z, z_previous, dim=-1) / temperature
        contrastive = nn.functional.cross_entropy(
            torch.stack([positive, negative], dim=1).float(), torch.zeros(len(z), dtype=torch.long, device=z.device)
        )
        return output.loss + self.settings.mu * contrastive

    def upload(self, shared: dict[str, torch.Tensor], context: LocalContext) -> dict[str, torch.Tensor]:
        context.client_state.update({PREVIOUS + n: v.detach().clone() for n, v in shared.items()})
        return shared
