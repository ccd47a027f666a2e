"""The last linear layer of a scoring model, which decides a ranking or a class, in fp32 when the model scores.

Under bf16 autocast a linear layer's output carries bf16's 8-bit mantissa: a score of about 2 is rounded to steps of
1/64, so near-equal candidates or classes tie and the tie, not the model, orders them. Computing only the head in
fp32 from the (bf16) features removes the ties and keeps the scoring pass's bf16 speed: on the embedded FedMatch
table's weights, test MAP per client moved by at most 0.007 (mean 0.0004 over 95 client models) against scoring in
fp32 throughout, where a bf16 head moved it by up to 0.04 (bench/README.md, issue 47). Training keeps autocast's
choice, so a bf16-trained model trains as it did.
"""

from __future__ import annotations

import torch
from torch import nn


def head_output(head: nn.Linear, features: torch.Tensor, training: bool) -> torch.Tensor:
    """``head(features)``: under autocast when training, in fp32 when scoring (eval mode)."""
    if training:
        return head(features)
    with torch.autocast(features.device.type, enabled=False):
        return head(features.float())
