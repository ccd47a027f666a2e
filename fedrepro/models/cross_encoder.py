"""The paper's matching model f(q, a): a cross-encoder over ``[CLS] q [SEP] a [SEP]`` scored from its pair state.

The paper reads the [CLS] state, which BERT's pre-training (next-sentence prediction) trains to summarise a
pair. A sentence-transformer backbone such as the packaged all-MiniLM-L6-v2 is trained through the mean of its
token states instead and leaves [CLS] untrained: at its 2nd layer the [CLS] state is the same (cosine 1.0000)
for every candidate of a question, so a head on it starts blind and only a large learning rate moves it.
``pooling="mean"`` scores the masked mean of the token states, the representation such a backbone gives.
"""

from __future__ import annotations

import torch
from torch import nn

from fedrepro.models.heads import head_output

POOLINGS = ("cls", "mean")


class CrossEncoder(nn.Module):
    """``encoder.*`` is the BERT backbone, ``head.*`` the scoring layer (FedPer keeps it private)."""

    def __init__(self, encoder: nn.Module, pooling: str = "cls") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} (params: fedmatch.settings.pooling): allowed {list(POOLINGS)}")
        self.encoder, self.pooling = encoder, pooling
        self.head = nn.Linear(encoder.config.hidden_size, 1)

    def represent(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores (batch,) and the pair features (batch, hidden); scoring computes the scores in fp32
        (``head_output``)."""
        features = self.represent(input_ids, attention_mask, token_type_ids)
        return head_output(self.head, features, self.training).squeeze(-1), features
