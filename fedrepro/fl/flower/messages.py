"""What travels in Flower messages, and the checks the server makes on what arrives.

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


def upload_problem(client_id: str, upload: dict[str, torch.Tensor], server_tensors: dict[str, torch.Tensor],
                   required: list[str]) -> str | None:
    """Why an upload cannot be aggregated (a name the server does not hold, a missing shared parameter, a wrong
    shape or dtype), naming the client and the field; None when it can."""
    unknown = sorted(set(upload) - set(server_tensors))
    if unknown:
        return f"client {client_id}: upload field {unknown[0]!r} is not a tensor the server holds ({len(unknown)} unknown)"
    missing = [name for name in required if name not in upload]
    if missing:
        return f"client {client_id}: upload lacks field {missing[0]!r} ({len(missing)} shared parameters missing)"
    for name, tensor in upload.items():
        expected = server_tensors[name]
        if tensor.shape != expected.shape or tensor.dtype != expected.dtype:
            return (f"client {client_id}: upload field {name!r} is {tuple(tensor.shape)} {tensor.dtype}, "
                    f"expected {tuple(expected.shape)} {expected.dtype}")
    return None
