"""The paper's matching model f(q, a): a cross-encoder over ``[CLS] q [SEP] a [SEP]`` scored from the [CLS] state."""

from __future__ import annotations

import torch
from torch import nn


class CrossEncoder(nn.Module):
    """``encoder.*`` is the BERT backbone, ``head.*`` the scoring layer (FedPer keeps it private)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.config.hidden_size, 1)

    def represent(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        return hidden[:, 0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores (batch,) and the [CLS] features (batch, hidden)."""
        features = self.represent(input_ids, attention_mask, token_type_ids)
        return self.head(features).squeeze(-1), features
