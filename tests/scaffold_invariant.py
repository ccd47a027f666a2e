"""SCAFFOLD's bookkeeping invariant, for the engine's and the Flower tests.

With c and every c_k starting at 0, clients uploading their change c_k+ - c_k and the server moving c by
|S|/N times the mean change, c stays the mean over all N clients of c_k (a client never sampled holds 0), in
every round and whichever clients were sampled or missed. A client that uploads its new c_k+ itself, a server
that reads it so, or a client that lost its c_k (a node restarted without its state) breaks it.
"""

from __future__ import annotations

import torch

from fedrepro.fl.algorithms.scaffold import CONTROL
from fedrepro.fl.engine import STATE


def control_variate_gap(
    server: dict[str, torch.Tensor], client_states: dict[str, dict[str, torch.Tensor]], client_ids: list[str]
) -> float:
    """max |c - mean_k c_k| over every coordinate of every server variate."""
    gap = 0.0
    for name, variate in server.items():
        if name.startswith(CONTROL):
            clients = [client_states.get(c, {}).get(STATE + name, torch.zeros_like(variate)) for c in client_ids]
            gap = max(gap, float((variate - torch.stack(clients).mean(dim=0)).abs().max()))
    return gap


def largest_control(tensors: dict[str, torch.Tensor]) -> float:
    """max |c_k| over a client's stored variates (what the server's c would be off by, times N, had it lost them)."""
    return max(float(t.abs().max()) for name, t in tensors.items() if name.startswith(STATE + CONTROL))
