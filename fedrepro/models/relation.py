"""FedCMC's relation-extraction model: entity markers as tokens, entity = sum of its word-piece outputs.

``<e1> gene </e1> ... <e2> phenotype </e2>``: the four markers are added to the tokenizer as special tokens
(so they are never split), the relation representation is ``concat(h_e1, h_e2)`` (2d), and the classifier
is one linear layer whose weight (C x 2d) holds the per-class *classifier vectors* that FedCMC compares.
"""

from __future__ import annotations

import torch
from torch import nn

from fedrepro.data.schema import ENTITY_MARKERS
from fedrepro.models.heads import head_output

CLASSIFIER = "classifier.weight"
"""The parameter whose rows are the classifier vectors (FedCMC's Theta^L)."""


def add_entity_markers(tokenizer) -> None:
    """Register ``<e1> </e1> <e2> </e2>`` as special tokens (the model's embedding table must then grow to match)."""
    tokenizer.add_special_tokens({"additional_special_tokens": list(ENTITY_MARKERS)})


class RelationClassifier(nn.Module):
    """``encoder.*`` the BERT-family backbone, ``classifier.*`` the C x 2d linear layer."""

    def __init__(self, encoder: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.feature_dim = 2 * encoder.config.hidden_size
        self.classifier = nn.Linear(self.feature_dim, num_classes)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, e1_mask: torch.Tensor, e2_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (batch, C) and relation features (batch, 2d); scoring computes the logits in fp32
        (``head_output``)."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        e1 = (hidden * e1_mask.unsqueeze(-1).to(hidden.dtype)).sum(dim=1)
        e2 = (hidden * e2_mask.unsqueeze(-1).to(hidden.dtype)).sum(dim=1)
        features = torch.cat([e1, e2], dim=-1)
        return head_output(self.classifier, features, self.training), features


def local_average_similarity(classifier: torch.Tensor) -> torch.Tensor:
    """d_c = mean cosine similarity of class c's classifier vector to the other classes' vectors (FedCMC Def. 1).

    A class a client holds many samples of is pushed away from the others, so its d_c is small.
    """
    vectors = nn.functional.normalize(classifier.float(), dim=-1)
    cosine = vectors @ vectors.T
    classes = cosine.shape[0]
    return (cosine.sum(dim=1) - cosine.diagonal()) / max(1, classes - 1)
