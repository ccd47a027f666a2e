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

Two epsilons, both from opacus' RDP accountant:

* the headline, without amplification (``PrivacyLedger.epsilon``): every party knows which sample ids each batch holds
  (split learning aligns them by id) and the batches are fixed-size draws from seeded shuffles, so subsampling hides
  nothing and amplifies nothing. A release of a batch is a Gaussian mechanism (rate 1) for each sample in it and does
  not touch the others, so the ledger counts, per sample, the releases it took part in; Gaussian mechanisms compose
  exactly into one of noise multiplier (sum 1/sigma_i^2)^(-1/2), and a party's epsilon is that of its most-released
  sample. Composing with another run on the same rows (the retraining after the search) adds the per-sample sums.
* the amplified one (``PrivacyLedger.epsilon_amplified``), what the paper's accounting gives: it assumes Poisson
  sampling at rate batch/split size, hidden from the adversary, and composes every step at that rate.

Both treat a release as depending on a sample only through that sample's own row (the paper's accounting): a
party's weights are trained on its own un-noised rows, so later releases also depend on earlier samples, which
neither figure covers.

``released_code=True`` (with ``per_sample=False``) reproduces the authors' ``add_dp_to_list``: the whole batch
is divided by one factor, max(largest L2 norm along dim 1, clip)/clip, and noise with std = ``sigma`` (the
argument they call "variance") is added, independent of the clip; no accounting is possible (the noise is not
calibrated to a per-sample sensitivity), so the ledger reports epsilon as NaN.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

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


@functools.cache
def _accountant() -> tuple[Any, list[float]]:
    """opacus' RDP analysis and its accountant's default orders, imported on first use: importing opacus loads its
    whole package (the PrivacyEngine, torch.distributed's tensor code, sympy: about 1.7 s of CPU), which only a
    process that computes an epsilon needs, not a party's node that only adds noise."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp

    return rdp, RDPAccountant.DEFAULT_ALPHAS


@functools.lru_cache(maxsize=4096)
def _unit_rdp(noise_multiplier: float, sample_rate: float) -> tuple[float, ...]:
    """RDP of one subsampled Gaussian release at opacus' default orders (the costly part: fractional orders)."""
    rdp, orders = _accountant()
    return tuple(rdp.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=orders).tolist())


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
    analysis, orders = _accountant()
    eps, _ = analysis.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    return float(eps)


def privacy_spent(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """Epsilon of ``steps`` releases, each a Gaussian mechanism of ``noise_multiplier`` on a batch sampled at
    ``sample_rate`` (opacus' RDPAccountant with ``history=[(noise_multiplier, sample_rate, steps)]``)."""
    return compose_epsilon([(noise_multiplier, sample_rate, steps)], delta)


def gaussian_epsilon(inverse_variance: float, delta: float) -> float:
    """Epsilon at ``delta`` of Gaussian mechanisms (rate 1) whose 1/sigma^2 sum to ``inverse_variance``: one mechanism
    of noise multiplier inverse_variance^(-1/2), through opacus' RDP accountant (0 when nothing was released)."""
    if inverse_variance <= 0:
        return 0.0
    return compose_epsilon([(inverse_variance**-0.5, 1.0, 1)], delta)


class PrivacyLedger:
    """Per party, what its data released. For the amplified epsilon, per split the (noise multiplier, sample rate,
    steps) history, releases of one batch within a step pooled (``release``) and folded in at ``end_step``. For the
    headline epsilon, per sample (row index) the number of releases it took part in and their summed 1/sigma^2. A
    release without noise makes the party's epsilon infinite (``noiseless``); a released-code mechanism makes it NaN
    (``unaccounted``). JSON-serialisable through ``state``/``load``."""

    def __init__(self) -> None:
        self.history: dict[str, dict[str, list[list[float]]]] = {}
        self.participation: dict[str, dict[int, list[float]]] = {}
        """party -> sample -> [releases, sum of 1/sigma^2]"""
        self.unaccounted: set[str] = set()
        self.noiseless: set[str] = set()
        self._pending: dict[tuple[str, str, str], list[float]] = {}

    def release(
        self, party: str, split: str, samples: torch.Tensor, mechanism: GaussianMechanism | None, sample_rate: float
    ) -> None:
        """One release of ``party``'s data on the batch ``samples`` (row indices) of ``split`` in the current step."""
        if not self.record(party, samples, mechanism):
            return
        sigma = 0.0 if mechanism is None else mechanism.sigma
        key = (party, split, str(tuple(torch.as_tensor(samples).tolist())))
        pooled = self._pending.setdefault(key, [0.0, float(sample_rate)])
        pooled[0] += math.inf if sigma == 0 else 1.0 / sigma**2

    def record(self, party: str, samples: torch.Tensor, mechanism: GaussianMechanism | None) -> bool:
        """Count one release for each of ``samples``; False (nothing counted) for a mechanism that cannot be
        accounted."""
        if mechanism is not None and not mechanism.accountable:
            self.unaccounted.add(party)
            return False
        if mechanism is None or mechanism.sigma == 0:
            self.noiseless.add(party)
            return True
        rows, weight = self.participation.setdefault(party, {}), 1.0 / mechanism.sigma**2
        for sample in torch.as_tensor(samples).tolist():
            entry = rows.setdefault(int(sample), [0, 0.0])
            entry[0] += 1
            entry[1] += weight
        return True

    def add(self, party: str, split: str, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Append ``steps`` releases to the amplified history (merged with the last entry when identical, as opacus)."""
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
        """The headline: no amplification, the epsilon of ``party``'s most-released sample (``epsilon_of``)."""
        return epsilon_of([self], party, delta)

    def epsilon_amplified(self, party: str, delta: float) -> float:
        """Assuming Poisson subsampling: max over disjoint splits of the composed history; NaN when a non-calibrated
        mechanism was used, inf when something was released without noise, 0 when nothing was released."""
        if party in self.unaccounted:
            return math.nan
        splits = self.history.get(party, {})
        return max((compose_epsilon(entries, delta) for entries in splits.values()), default=0.0)

    def max_releases(self, party: str) -> int:
        """The most releases any one sample of ``party`` took part in (noisy ones)."""
        return max((int(n) for n, _ in self.participation.get(party, {}).values()), default=0)

    def state(self) -> dict:
        if self._pending:
            raise RuntimeError("PrivacyLedger.state() in the middle of a step: call end_step() first")
        return {
            "history": self.history,
            "unaccounted": sorted(self.unaccounted),
            "noiseless": sorted(self.noiseless),
            "participation": {
                p: [[i, *v] for i, v in sorted(rows.items())] for p, rows in sorted(self.participation.items())
            },
        }

    def load(self, state: dict) -> None:
        self.history = {
            p: {s: [list(e) for e in es] for s, es in splits.items()} for p, splits in state["history"].items()
        }
        self.unaccounted = set(state["unaccounted"])
        self.noiseless = set(state["noiseless"])
        self.participation = {
            p: {int(i): [int(n), float(w)] for i, n, w in rows} for p, rows in state["participation"].items()
        }
        self._pending.clear()


def epsilon_of(ledgers: Sequence[PrivacyLedger], party: str, delta: float) -> float:
    """Epsilon without amplification of ``party`` over runs on the same rows (e.g. the search, then the retraining):
    each sample's 1/sigma^2 summed over every ledger, the worst sample's epsilon. NaN if any release was not
    accountable, inf if any was noiseless, 0 if nothing was released."""
    if any(party in ledger.unaccounted for ledger in ledgers):
        return math.nan
    if any(party in ledger.noiseless for ledger in ledgers):
        return math.inf
    totals: dict[int, float] = {}
    for ledger in ledgers:
        for sample, (_, weight) in ledger.participation.get(party, {}).items():
            totals[sample] = totals.get(sample, 0.0) + weight
    return gaussian_epsilon(max(totals.values(), default=0.0), delta)
