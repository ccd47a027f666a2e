"""Summaries across clients and seeds, as the papers report them."""

from __future__ import annotations

import numpy as np


def overall(per_client: dict[str, dict[str, float]]) -> dict[str, float]:
    """The paper's "overall" column: the unweighted mean of each metric over clients."""
    names = sorted({name for metrics in per_client.values() for name in metrics})
    return {name: float(np.mean([metrics[name] for metrics in per_client.values()])) for name in names}


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation over seeds (std 0 for a single seed)."""
    array = np.asarray(values, dtype=float)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0
