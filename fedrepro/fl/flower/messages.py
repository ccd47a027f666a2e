"""What travels in Flower messages (the server checks what arrives with ``fedrepro.channel.upload_problem``).

Every message holds named tensors in one ``ArrayRecord`` (``TENSORS``) and scalars in a ``ConfigRecord``
(``CONFIG``, server to node) or a ``MetricRecord`` (``METRICS``, node to server). The tensors of a message cross
packed, as one ``Array`` holding the safetensors bytes of them all (their names, dtypes, shapes and order inside), so
they arrive bit for bit as they were sent. Packed, because Flower moves every ``Array`` of a message as objects of its
own, each one HTTP request to push and one to pull at the SuperLink: the embedded FedCMC model sent tensor by tensor
was about 80 objects a message, and on a deployment the SuperLink and SuperNodes spent most of a round in their HTTP
stack.

A node whose client's own training diverged answers with an error whose reason starts with ``DIVERGED``. Any
other failure of a node reaches the server as an error reply Flower writes itself (its reason names the exception
or the lost node, never with that prefix), so the prefix alone tells the two apart.
"""

from __future__ import annotations

import json
import struct

import torch
from flwr.app import Array, ArrayRecord, Error, Message
from flwr.common.constant import ErrorCode
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from fedrepro.errors import FederationError, TrainingDiverged

TENSORS, CONFIG, METRICS = "tensors", "config", "metrics"
ROUND, FINGERPRINT, SPLIT, CLIENT_ID = "round", "fingerprint", "split", "client_id"
COUNTED = "counted_round"
"""In a message to a node: the last round whose update from its client the server counted (``node_state``)."""
NUM_SAMPLES, TRAIN_LOSS = "num_samples", "train_loss"
DIVERGED = "fedrepro: training diverged: "

PACKED = "safetensors"
"""The name, and the ``stype``, of the one ``Array`` a record's tensors travel in."""
ORDER = "order"
"""The packed bytes' metadata key holding the tensors' names in the sender's order (safetensors sorts them)."""


def safetensors_metadata(blob: bytes) -> dict[str, str]:
    """The metadata of safetensors bytes (an 8-byte little-endian header length, then the JSON header); ``blob`` may
    be the header alone."""
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length]).get("__metadata__", {})


def to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    """A copy of the tensors, packed in one ``Array`` (name order kept)."""
    # safetensors refuses tensors that share memory (views of one parameter): one contiguous copy of each
    copies = {
        name: tensor.detach().cpu().clone(memory_format=torch.contiguous_format) for name, tensor in tensors.items()
    }
    blob = save_tensors(copies, metadata={ORDER: json.dumps(list(copies))})
    return ArrayRecord({PACKED: Array(dtype="uint8", shape=(len(blob),), stype=PACKED, data=blob)})


def to_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """The tensors ``to_record`` packed, in the sender's order."""
    if list(record) != [PACKED] or record[PACKED].stype != PACKED:
        raise FederationError(
            f"a message's {TENSORS!r} record holds {[(k, a.stype) for k, a in record.items()]}: "
            f"expected one array {PACKED!r} of stype {PACKED!r} (both ends must run this fedrepro)"
        )
    blob = record[PACKED].data
    tensors = load_tensors(blob)
    return {name: tensors[name] for name in json.loads(safetensors_metadata(blob)[ORDER])}


def diverged_reply(error: TrainingDiverged, message: Message) -> Message:
    """The node's answer when its client's own training diverged: the run must stop, not go on without the client."""
    return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, DIVERGED + str(error)), reply_to=message)


def divergence(reply: Message | None) -> str | None:
    """The node's ``TrainingDiverged`` text if ``reply`` is a ``diverged_reply``, else None."""
    reason = (reply.error.reason or "") if reply is not None and reply.has_error() else ""
    return reason[len(DIVERGED) :] if reason.startswith(DIVERGED) else None
