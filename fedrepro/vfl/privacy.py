"""The Gaussian mechanism on what SS-VFNAS parties exchange, and epsilon from an established accountant.

Convention (as opacus and TF Privacy): ``sigma`` is a *noise multiplier*. Each sample's row (every dimension
but 0, flattened) is clipped to L2 norm <= ``clip``, then N(0, (sigma * clip)^2) noise is added to every entry.
Under add/remove-one-sample adjacency the row's sensitivity is ``clip``, so one release is the Gaussian
mechanism with noise multiplier ``sigma``, and opacus' RDP accountant turns (sigma, sample rate, steps) into
epsilon at a given delta. Clipping a row is only a per-sample bound when row i depends on sample i alone:
a BatchNorm in train mode inside a bottom or top network mixes samples and weakens the guarantee.

What is released, and whose data it depends on (``PrivacyLedger`` records it while the protocol runs):

* forward: party j's activation ``N_j`` of a batch, sent to the label party, depends on party j's features;
  one release for party j each time it sends that batch;
* backward: the gradient dL/dN_j returned to party j depends on the label party's labels (and features);
  the label party makes K-1 such releases per backward pass, one per other party, and all of them compose
  (colluding receivers), so the label party's ledger holds every returned gradient;
* several releases of the *same* sampled batch in one step (DARTS second order passes one train batch four
  times) are one subsampled Gaussian mechanism with 1/sigma_eff^2 = sum 1/sigma_i^2, not independent
  subsamplings (which would understate epsilon);
* the train and validation halves are disjoint, so a sample is only ever in one of them and a party's
  epsilon is the maximum over the splits (parallel composition), each split composed over all its steps.

The accountant assumes Poisson sampling at rate batch/split size; batches drawn from shuffled epochs are the
usual approximation (as opacus and TF Privacy report it).

``released_code=True`` (with ``per_sample=False``) reproduces the authors' ``add_dp_to_list``: the whole batch
is divided by one factor, max(largest L2 norm along dim 1, clip)/clip, and noise with std = ``sigma`` (the
argument they call "variance") is added, independent of the clip; no accounting is possible (the noise is not
calibrated to a per-sample sensitivity), so the ledger reports epsilon as NaN.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as rdp_analysis

# Opacus' clipping guard: divide by (norm + EPS) so that the clipped norm is strictly <= clip.
EPS = 1e-6


@dataclass(frozen=True)
class GaussianMechanism:
    """Clip then add Gaussian noise. ``sigma = 0`` adds no noise; ``clip = inf`` (with ``sigma = 0``) is the
    identity. A calibrated mechanism with ``clip = inf`` and ``sigma > 0`` would need infinite noise: refused."""

    clip: float
    sigma: float
    per_sample: bool = True
    released_code: bool = False

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"GaussianMechanism: clip must be > 0, got {self.clip}")
        if not self.sigma >= 0 or math.isnan(self.sigma) or math.isinf(self.sigma):
            raise ValueError(f"GaussianMechanism: sigma must be finite and >= 0, got {self.sigma}")
        if self.released_code and self.per_sample:
            raise ValueError("released_code=True is batch-level clipping: pass per_sample=False as well")
        if not self.released_code and math.isinf(self.clip) and self.sigma > 0:
            raise ValueError("noise std is sigma * clip: clip=inf with sigma > 0 has no finite noise")

    @property
    def accountable(self) -> bool:
        """Whether one release is a Gaussian mechanism of noise multiplier ``sigma`` per sample."""
        return self.per_sample and not self.released_code

    @property
    def noise_std(self) -> float:
        if self.sigma == 0:
            return 0.0
        return self.sigma if self.released_code else self.sigma * self.clip

    def clip_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """The clipped tensor, before noise (vectorised: one norm per row, one multiply)."""
        if math.isinf(self.clip):
            return x
        if self.released_code:
            # the authors' rule: one factor for the batch, from the largest norm along dim 1
            factor = (x.norm(dim=1).max() / (self.clip + EPS)).clamp(min=1.0)
            return x / factor
        if not self.per_sample:
            # textbook batch-level clipping: the whole tensor's L2 norm <= clip
            return x * (self.clip / (x.norm() + EPS)).clamp(max=1.0)
        norms = x.reshape(x.shape[0], -1).norm(dim=1)
        factors = (self.clip / (norms + EPS)).clamp(max=1.0)
        return x * factors.reshape(-1, *([1] * (x.dim() - 1)))

    def apply(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Clip, then add noise drawn from ``generator`` (a CPU generator; seed it per release for resume)."""
        with torch.no_grad():
            out = self.clip_tensor(x.detach())
            if self.noise_std > 0:
                noise = torch.randn(out.shape, generator=generator, dtype=out.dtype)
                out = out + self.noise_std * noise.to(out.device)
        return out


@functools.lru_cache(maxsize=4096)
def _unit_rdp(noise_multiplier: float, sample_rate: float) -> tuple[float, ...]:
    """RDP of one subsampled Gaussian release at opacus' default orders (the costly part: fractional orders)."""
    return tuple(rdp_analysis.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1,
                                          orders=RDPAccountant.DEFAULT_ALPHAS).tolist())


def compose_epsilon(history: Iterable[tuple[float, float, int]], delta: float) -> float:
    """Epsilon at ``delta`` of the composition of subsampled Gaussian mechanisms, each entry
    ``(noise_multiplier, sample_rate, steps)``: exactly opacus' ``RDPAccountant`` (same orders, RDP summed over
    the entries, ``steps`` x the one-release RDP as opacus' ``compute_rdp``, the same conversion), with the
    one-release RDP cached per (noise multiplier, rate), because curves ask for epsilon every few steps. A zero
    multiplier means no noise: epsilon is infinite."""
    history = [(float(s), float(q), int(n)) for s, q, n in history if int(n) > 0]
    if not history:
        return 0.0
    if any(s == 0 for s, _, _ in history):
        return math.inf
    rdp = sum([np.array(_unit_rdp(s, q)) * n for s, q, n in history])
    eps, _ = rdp_analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
    return float(eps)


def privacy_spent(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """Epsilon of ``steps`` releases, each a Gaussian mechanism of ``noise_multiplier`` on a batch sampled at
    ``sample_rate`` (opacus' RDPAccountant with ``history=[(noise_multiplier, sample_rate, steps)]``)."""
    return compose_epsilon([(noise_multiplier, sample_rate, steps)], delta)


class PrivacyLedger:
    """Per party and split: the (noise multiplier, sample rate, steps) history of every release that touched
    that party's data. Releases of one batch within a step are pooled (``release``) and folded into the
    history at ``end_step``; JSON-serialisable through ``state``/``load``."""

    def __init__(self) -> None:
        self.history: dict[str, dict[str, list[list[float]]]] = {}
        self.unaccounted: set[str] = set()
        self._pending: dict[tuple[str, str, str], list[float]] = {}

    def release(self, party: str, split: str, batch_key: str, mechanism: GaussianMechanism | None,
                sample_rate: float) -> None:
        """One release of ``party``'s data on the batch ``batch_key`` of ``split`` in the current step."""
        if mechanism is not None and not mechanism.accountable:
            self.unaccounted.add(party)
            return
        sigma = 0.0 if mechanism is None else mechanism.sigma
        pooled = self._pending.setdefault((party, split, batch_key), [0.0, float(sample_rate)])
        pooled[0] += math.inf if sigma == 0 else 1.0 / sigma**2

    def add(self, party: str, split: str, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Append ``steps`` releases to the history (merged with the last entry when identical, as opacus)."""
        entries = self.history.setdefault(party, {}).setdefault(split, [])
        if entries and entries[-1][0] == noise_multiplier and entries[-1][1] == sample_rate:
            entries[-1][2] += steps
        else:
            entries.append([float(noise_multiplier), float(sample_rate), int(steps)])

    def end_step(self) -> None:
        for (party, split, _), (inverse_variance, rate) in sorted(self._pending.items()):
            self.add(party, split, 0.0 if math.isinf(inverse_variance) else inverse_variance**-0.5, rate)
        self._pending.clear()

    def epsilon(self, party: str, delta: float) -> float:
        """Max over disjoint splits of the composed epsilon; NaN when a non-calibrated mechanism was used,
        inf when something was released without noise, 0 when nothing was released."""
        if party in self.unaccounted:
            return math.nan
        splits = self.history.get(party, {})
        return max((compose_epsilon(entries, delta) for entries in splits.values()), default=0.0)

    def state(self) -> dict:
        if self._pending:
            raise RuntimeError("PrivacyLedger.state() in the middle of a step: call end_step() first")
        return {"history": self.history, "unaccounted": sorted(self.unaccounted)}

    def load(self, state: dict) -> None:
        self.history = {p: {s: [list(e) for e in es] for s, es in splits.items()}
                        for p, splits in state["history"].items()}
        self.unaccounted = set(state["unaccounted"])
        self._pending.clear()
