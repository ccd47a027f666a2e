"""What travels in Flower messages (the server checks what arrives with ``fedrepro.fl.channel.upload_problem``).

Every message holds named tensors in one ``ArrayRecord`` (``TENSORS``) and scalars in a ``ConfigRecord``
(``CONFIG``, server to node) or a ``MetricRecord`` (``METRICS``, node to server). Tensors cross as float
arrays in NumPy's format, so they arrive bit for bit as they were sent.

A node whose client's own training diverged answers with an error whose reason starts with ``DIVERGED``. Any
other failure of a node reaches the server as an error reply Flower writes itself (its reason names the exception
or the lost node, never with that prefix), so the prefix alone tells the two apart.
"""

from __future__ import annotations

import torch
from flwr.app import Array, ArrayRecord, Error, Message
from flwr.common.constant import ErrorCode

from fedrepro.errors import TrainingDiverged

TENSORS, CONFIG, METRICS = "tensors", "config", "metrics"
ROUND, FINGERPRINT, SPLIT, CLIENT_ID = "round", "fingerprint", "split", "client_id"
COUNTED = "counted_round"
"""In a message to a node: the last round whose update from its client the server counted (``node_state``)."""
NUM_SAMPLES, TRAIN_LOSS = "num_samples", "train_loss"
DIVERGED = "fedrepro: training diverged: "


def to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    """A copy of the tensors in Flower's serialised form (name order kept)."""
    return ArrayRecord({name: Array(tensor.detach().cpu().numpy()) for name, tensor in tensors.items()})


def to_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(array.numpy()) for name, array in record.items()}


def diverged_reply(error: TrainingDiverged, message: Message) -> Message:
    """The node's answer when its client's own training diverged: the run must stop, not go on without the client."""
    return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, DIVERGED + str(error)), reply_to=message)


def divergence(reply: Message | None) -> str | None:
    """The node's ``TrainingDiverged`` text if ``reply`` is a ``diverged_reply``, else None."""
    reason = (reply.error.reason or "") if reply is not None and reply.has_error() else ""
    return reason[len(DIVERGED):] if reason.startswith(DIVERGED) else None
