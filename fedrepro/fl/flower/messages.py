"""What travels in Flower messages (the server checks what arrives with ``fedrepro.fl.channel.upload_problem``).

Every message holds named tensors in one ``ArrayRecord`` (``TENSORS``) and scalars in a ``ConfigRecord``
(``CONFIG``, server to node) or a ``MetricRecord`` (``METRICS``, node to server). Tensors cross as float
arrays in NumPy's format, so they arrive bit for bit as they were sent.
"""

from __future__ import annotations

import torch
from flwr.app import Array, ArrayRecord

TENSORS, CONFIG, METRICS = "tensors", "config", "metrics"
ROUND, FINGERPRINT, SPLIT, CLIENT_ID = "round", "fingerprint", "split", "client_id"
NUM_SAMPLES, TRAIN_LOSS = "num_samples", "train_loss"


def to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    """A copy of the tensors in Flower's serialised form (name order kept)."""
    return ArrayRecord({name: Array(tensor.detach().cpu().numpy()) for name, tensor in tensors.items()})


def to_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(array.numpy()) for name, array in record.items()}
