"""FedCMC (Zhang et al., 2023): contrast each sample's relation feature with the *major classifier vectors*.

After FedAvg aggregation (p_k = N_k / N) the server looks at every uploaded classifier (C x 2d): for client k
and class c, d_{k,c} is the mean cosine similarity of c's vector to the other classes' vectors. The client
holding most of class c pushes c's vector furthest from the rest, so the major vector of class c is client
argmin_k d_{k,c}'s row c. The C major vectors are sent to every client with the model (the only extra
download), and the local loss adds mu * CE(cos(h, v_c) / T over classes c, y): the sample's own class is the
positive, the other classes the negatives. No vectors exist before the first aggregation, so round 1 is
plain FedAvg. Ablation (Fig 4): ``minor`` takes argmax_k instead, ``random`` a seeded random client per
class and round, ``none`` sends nothing and adds nothing (FedAvg).
"""

from __future__ import annotations

import numpy as np
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from fedrepro.fl.algorithm import Algorithm, ClientUpdate, CommonSettings, LocalContext, TaskOutput
from fedrepro.models.relation import CLASSIFIER, local_average_similarity
from fedrepro.seeding import derive_seed

MAJOR_VECTORS = "fedcmc/major_vectors"
VECTOR_CHOICES = ("major", "minor", "random", "none")


def choose_clients(similarity: torch.Tensor, rule: str, rng: np.random.Generator) -> list[int]:
    """For each class (column of the clients x classes ``similarity``), the index of the client whose vector stands for
    it."""
    if rule == "major":
        return similarity.argmin(dim=0).tolist()
    if rule == "minor":
        return similarity.argmax(dim=0).tolist()
    if rule == "random":
        return rng.integers(0, similarity.shape[0], size=similarity.shape[1]).tolist()
    raise ValueError(f"fedcmc vectors {rule!r}: allowed {VECTOR_CHOICES}")


def contrastive_loss(
    features: torch.Tensor, vectors: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Cross-entropy over cosine similarities between each feature and the C class vectors (own class positive)."""
    cosine = nn.functional.normalize(features.float(), dim=-1) @ nn.functional.normalize(vectors.float(), dim=-1).T
    return nn.functional.cross_entropy(cosine / temperature, targets)


class FedCMC(Algorithm):
    name, label = "fedcmc", "FedCMC"

    class Settings(Algorithm.Settings):
        set_per_cell: ClassVar[dict[str, str]] = {"vectors": "fedcmc.sweeps.vectors (Fig 4; every other cell: major)"}
        mu: float = Field(ge=0, description="weight of the contrastive term against the major classifier vectors")
        temperature: float = Field(gt=0, description="temperature of the contrastive term")
        vectors: Literal[VECTOR_CHOICES] = Field(  # type: ignore[valid-type]
            "major", description="which client's vector stands for each class (major: the published method)"
        )

    def __init__(self, settings: Settings, common: CommonSettings) -> None:
        super().__init__(settings, common)
        self.chosen: list[str] = []
        self.round = 0

    def server_extras(self, round_index: int) -> dict[str, torch.Tensor]:
        self.round = round_index  # the major vectors themselves travel in the server state, sent with the model
        return {}

    def local_objective(self, model: nn.Module, output: TaskOutput, context: LocalContext) -> torch.Tensor:
        if MAJOR_VECTORS not in context.received:
            return output.loss
        contrast = contrastive_loss(
            output.features, context.received[MAJOR_VECTORS], output.targets, self.settings.temperature
        )
        return output.loss + self.settings.mu * contrast

    def aggregate(
        self, global_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]
    ) -> dict[str, torch.Tensor]:
        result = super().aggregate({n: v for n, v in global_weights.items() if n != MAJOR_VECTORS}, updates)
        self.chosen = []
        if self.settings.vectors == "none":
            return result
        classifiers = torch.stack([u.tensors[CLASSIFIER] for u in updates])
        similarity = torch.stack([local_average_similarity(c) for c in classifiers])
        rng = np.random.default_rng(derive_seed(self.common.seed, "fedcmc-random", self.round))
        owners = choose_clients(similarity, self.settings.vectors, rng)
        result[MAJOR_VECTORS] = torch.stack([classifiers[k, c] for c, k in enumerate(owners)]).clone()
        self.chosen = [updates[k].client_id for k in owners]
        return result

    def round_notes(self) -> dict:
        return {"vector_clients": self.chosen} if self.chosen else {}
