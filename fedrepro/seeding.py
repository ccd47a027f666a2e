"""Seeds derived from names, so every random draw is reproducible on its own (needed for exact resume)."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any printable parts (unlike ``hash``, identical across processes)."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seed_everything(seed: int, threads: int) -> None:
    """Global seeds plus deterministic kernels and a fixed thread count (reduction order depends on it)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
