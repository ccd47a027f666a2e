"""MoCo v2 pre-search at one party (SS-VFNAS's self-supervised stage), on the party's own features only.

The query encoder is the party's supernet (``fedrepro.vfl.spaces.Supernet``): pre-training updates its weights
AND its alphas, and the collaborative search starts from both. Components (He et al. 2020; Chen et al. 2020):

* projection head: Linear(feature_dim, feature_dim)-ReLU-Linear(feature_dim, projection_dim) on the encoder
  output; the embedding sent to the label party later is the encoder output, not the projection;
* key encoder: a deep copy of encoder + head, no gradients, updated by momentum
  ``theta_k <- m theta_k + (1 - m) theta_q`` over all parameters (alphas included) after every optimiser
  step (buffers such as BN running statistics are not averaged; the key encoder keeps its own);
* queue: a FIFO buffer of the last ``queue_size`` keys (L2-normalised), with a write pointer;
* loss: InfoNCE = cross-entropy of ``[q.k+, q.queue^T] / temperature`` with the positive at index 0, where
  ``q`` and ``k+`` are the L2-normalised projections of two augmented views of the same samples.

``released_code=True`` reproduces the authors' released self-training instead (for comparison): no
augmentation (both views are the input itself), no projection head, no L2-normalisation, the key encoder in
eval mode, the queue pre-filled with the key encoder's embeddings of the training rows, and the momentum
update once per epoch rather than per step. Two further released-code quirks are NOT reproduced: its key
encoder starts from fresh random weights (only the alphas are copied), and its queue holds every training
row, so a sample's own earlier key is among its negatives.

Single-device caveat: MoCo's "shuffling BN" needs several devices. The MLP space uses LayerNorm (no batch
statistics); for the conv space (BatchNorm, as in DARTS) keys and queries are computed on separate forward
passes of the same batch, which leaves the batch-statistics shortcut MoCo warns about.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

Views = Callable[[torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


class MoCo(nn.Module):
    """MoCo v2 around ``encoder_q`` (output (batch, feature_dim)).

    ``momentum_every``: "step" (MoCo) or "epoch" (released code); default "step", or "epoch" when
    ``released_code``. ``generator`` seeds the initial random queue.
    """

    def __init__(
        self,
        encoder_q: nn.Module,
        feature_dim: int,
        projection_dim: int = 32,
        queue_size: int = 128,
        momentum: float = 0.99,
        temperature: float = 0.2,
        released_code: bool = False,
        momentum_every: str | None = None,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum={momentum}; must be in [0, 1]")
        if temperature <= 0 or queue_size < 1 or feature_dim < 1 or projection_dim < 1:
            raise ValueError("temperature must be > 0 and queue_size, feature_dim, projection_dim >= 1")
        momentum_every = momentum_every or ("epoch" if released_code else "step")
        if momentum_every not in ("step", "epoch"):
            raise ValueError(f"momentum_every={momentum_every!r}; allowed 'step', 'epoch'")
        self.released_code = released_code
        self.momentum = momentum
        self.temperature = temperature
        self.momentum_every = momentum_every
        self.encoder_q = encoder_q
        if released_code:
            self.head_q: nn.Module = nn.Identity()
            key_dim = feature_dim
        else:
            self.head_q = nn.Sequential(
                nn.Linear(feature_dim, feature_dim), nn.ReLU(), nn.Linear(feature_dim, projection_dim)
            )
            key_dim = projection_dim
        self.encoder_k = copy.deepcopy(encoder_q)
        self.head_k = copy.deepcopy(self.head_q)
        for p in self._key_parameters():
            p.requires_grad_(False)
        queue = torch.randn(queue_size, key_dim, generator=generator)
        self.register_buffer("queue", queue if released_code else F.normalize(queue, dim=1))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))

    # -- parameters ---------------------------------------------------------------------------------------
    def _query_parameters(self) -> list[nn.Parameter]:
        return list(self.encoder_q.parameters()) + list(self.head_q.parameters())

    def _key_parameters(self) -> list[nn.Parameter]:
        return list(self.encoder_k.parameters()) + list(self.head_k.parameters())

    @torch.no_grad()
    def momentum_update(self) -> None:
        """theta_k <- m * theta_k + (1 - m) * theta_q for every key parameter (alphas included)."""
        m = self.momentum
        for pk, pq in zip(self._key_parameters(), self._query_parameters()):
            pk.mul_(m).add_(pq.detach(), alpha=1.0 - m)

    # -- queue --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """Write ``keys`` (batch, dim) over the oldest entries (FIFO, wrapping); only the newest
        ``queue_size`` keys survive when the batch is larger than the queue."""
        size = self.queue.shape[0]
        keys = keys.detach().to(self.queue.dtype)
        ptr = int(self.queue_ptr)
        if keys.shape[0] > size:
            ptr = (ptr + keys.shape[0] - size) % size
            keys = keys[-size:]
        idx = (ptr + torch.arange(keys.shape[0], device=self.queue.device)) % size
        self.queue[idx] = keys
        self.queue_ptr.fill_((ptr + keys.shape[0]) % size)

    def _normalise(self, z: torch.Tensor) -> torch.Tensor:
        return z if self.released_code else F.normalize(z, dim=1)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        return self._normalise(self.head_q(self.encoder_q(x)))

    @torch.no_grad()
    def key(self, x: torch.Tensor) -> torch.Tensor:
        self.encoder_k.train(self.encoder_q.training and not self.released_code)
        self.head_k.train(self.head_q.training and not self.released_code)
        return self._normalise(self.head_k(self.encoder_k(x)))

    @torch.no_grad()
    def fill_queue(self, x: torch.Tensor, batch_size: int = 256) -> None:
        """Enqueue the key encoder's keys of ``x`` (the released code starts from such a queue)."""
        for start in range(0, x.shape[0], batch_size):
            self.enqueue(self.key(x[start : start + batch_size]))

    # -- loss ---------------------------------------------------------------------------------------------
    def logits(self, view_1: torch.Tensor, view_2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``([q.k+, q.queue^T] / temperature, k+)``; column 0 is the positive."""
        q = self.query(view_1)
        k = self.key(view_2)
        positive = (q * k).sum(dim=1, keepdim=True)
        negatives = q @ self.queue.clone().t()
        return torch.cat([positive, negatives], dim=1) / self.temperature, k

    def loss(self, view_1: torch.Tensor, view_2: torch.Tensor, enqueue: bool = True) -> torch.Tensor:
        """InfoNCE of queries from ``view_1`` against keys from ``view_2`` and the queue; then enqueue the keys."""
        logits, k = self.logits(view_1, view_2)
        target = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        out = F.cross_entropy(logits, target)
        if enqueue:
            self.enqueue(k)
        return out


# -- augmentations -------------------------------------------------------------------------------------------
def _uniform(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand(shape, generator=generator).to(device)


def _image_view(
    x: torch.Tensor, generator: torch.Generator, max_shift: int, noise: float, erase_prob: float, erase_size: int
) -> torch.Tensor:
    b, c, h, w = x.shape
    dev = x.device
    # 1. random translation by up to max_shift pixels per axis, zero padding (vectorised gather)
    dy = torch.randint(-max_shift, max_shift + 1, (b,), generator=generator).to(dev)
    dx = torch.randint(-max_shift, max_shift + 1, (b,), generator=generator).to(dev)
    padded = F.pad(x, (max_shift, max_shift, max_shift, max_shift))
    rows = torch.arange(h, device=dev)[None, :] + max_shift + dy[:, None]  # (b, h)
    cols = torch.arange(w, device=dev)[None, :] + max_shift + dx[:, None]  # (b, w)
    out = padded[
        torch.arange(b, device=dev)[:, None, None, None],
        torch.arange(c, device=dev)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]
    # 2. Gaussian noise, std = noise x the batch's pixel std (works for raw 0-16 and for scaled pixels)
    scale = noise * x.std().clamp_min(1e-8) if x.numel() > 1 else torch.tensor(noise, device=dev)
    out = out + scale * torch.randn(out.shape, generator=generator).to(dev)
    # 3. random erasing: with probability erase_prob, zero one erase_size x erase_size patch (all channels)
    eh, ew = min(erase_size, h), min(erase_size, w)
    top = torch.randint(0, h - eh + 1, (b,), generator=generator).to(dev)
    left = torch.randint(0, w - ew + 1, (b,), generator=generator).to(dev)
    erase = _uniform((b,), generator, dev) < erase_prob
    r = torch.arange(h, device=dev)[None, :]
    q = torch.arange(w, device=dev)[None, :]
    in_rows = (r >= top[:, None]) & (r < top[:, None] + eh)
    in_cols = (q >= left[:, None]) & (q < left[:, None] + ew)
    mask = (in_rows[:, :, None] & in_cols[:, None, :] & erase[:, None, None])[:, None]  # (b, 1, h, w)
    return out.masked_fill(mask, 0.0)


def image_views(
    x: torch.Tensor,
    generator: torch.Generator,
    max_shift: int = 1,
    noise: float = 0.1,
    erase_prob: float = 0.5,
    erase_size: int = 2,
    released_code: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent augmentations of small images (batch, C, H, W), e.g. 8x4 digit halves.

    Each view: a random shift by up to ``max_shift`` pixels in each axis (zero padding: at 8x4 a crop-and-resize
    would destroy the digit), additive Gaussian noise with std ``noise`` x the batch pixel std, and with
    probability ``erase_prob`` the erasure (zeroing) of one random ``erase_size`` x ``erase_size`` patch.
    No flips (digits are not flip-invariant) and no colour jitter (one grey channel).
    ``released_code=True``: identity views (the input twice), as the authors' code.
    """
    if x.dim() != 4:
        raise ValueError(f"image_views expects (batch, C, H, W), got {tuple(x.shape)}")
    if released_code:
        return x, x
    return (
        _image_view(x, generator, max_shift, noise, erase_prob, erase_size),
        _image_view(x, generator, max_shift, noise, erase_prob, erase_size),
    )


def _tabular_view(
    x: torch.Tensor, generator: torch.Generator, mask_prob: float, noise: float, std: torch.Tensor
) -> torch.Tensor:
    b, d = x.shape
    dev = x.device
    mask = _uniform((b, d), generator, dev) < mask_prob
    donors = torch.randint(0, b, (b, d), generator=generator).to(dev)
    marginal = torch.gather(x, 0, donors)  # the same feature from a random row: a draw from its marginal
    out = torch.where(mask, marginal, x)
    return out + noise * std * torch.randn((b, d), generator=generator).to(dev)


def tabular_views(
    x: torch.Tensor,
    generator: torch.Generator,
    mask_prob: float = 0.2,
    noise: float = 0.1,
    feature_std: torch.Tensor | None = None,
    released_code: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent corruptions of table rows (batch, features).

    Each view: every entry is, with probability ``mask_prob``, replaced by the same feature's value in a random
    row of the batch (a draw from the feature's empirical marginal, the corruption idea of SCARF / VIME), then
    Gaussian noise with std ``noise`` x that feature's std is added (``feature_std``, e.g. over the party's
    training rows; default: the batch std), so features on any scale get comparable noise.
    ``released_code=True``: identity views (the input twice), as the authors' code.
    """
    if x.dim() != 2:
        raise ValueError(f"tabular_views expects (batch, features), got {tuple(x.shape)}")
    if released_code:
        return x, x
    std = (
        feature_std
        if feature_std is not None
        else (x.std(dim=0, unbiased=False) if x.shape[0] > 1 else torch.zeros(x.shape[1], device=x.device))
    )
    std = std.to(x.device, x.dtype)
    return (_tabular_view(x, generator, mask_prob, noise, std), _tabular_view(x, generator, mask_prob, noise, std))


def default_views(features: torch.Tensor, released_code: bool = False) -> Views:
    """``image_views`` for 4-d inputs, ``tabular_views`` (with the whole table's feature std) for 2-d."""
    if features.dim() == 4:
        return lambda x, g: image_views(x, g, released_code=released_code)
    if features.dim() == 2:
        std = (
            features.std(dim=0, unbiased=False)
            if features.shape[0] > 1
            else torch.zeros(features.shape[1], device=features.device)
        )
        return lambda x, g: tabular_views(x, g, feature_std=std, released_code=released_code)
    raise ValueError(f"features of shape {tuple(features.shape)}: expected (n, C, H, W) or (n, features)")


def pretrain(
    moco: MoCo,
    features: torch.Tensor,
    steps: int,
    batch_size: int,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    generator: torch.Generator,
    views: Views | None = None,
) -> list[float]:
    """``steps`` MoCo steps on ``features`` (n, ...); returns the per-step InfoNCE losses.

    Batches: a fresh permutation per epoch (from ``generator``), full batches only (an epoch is
    ``n // batch_size`` steps; batch = n when n < batch_size). ``optimizer``: one optimiser or several (e.g. SGD
    on ``weight_parameters()`` and Adam on ``arch_parameters()`` of the supernet); all step on the same loss, a
    first-order joint update of weights and alphas. The key encoder is momentum-updated after every step, or
    after every epoch when ``moco.momentum_every == "epoch"``. ``views`` defaults to ``default_views``.
    """
    if steps < 0 or batch_size < 1 or features.shape[0] < 1:
        raise ValueError("steps must be >= 0, batch_size >= 1 and features non-empty")
    optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
    views = views or default_views(features, moco.released_code)
    n = features.shape[0]
    batch_size = min(batch_size, n)
    per_epoch = n // batch_size
    moco.train()
    if moco.released_code:
        moco.fill_queue(features)
    history: list[float] = []
    order = torch.empty(0, dtype=torch.long)
    for step in range(steps):
        if step % per_epoch == 0:
            order = torch.randperm(n, generator=generator)
        idx = order[(step % per_epoch) * batch_size : (step % per_epoch + 1) * batch_size].to(features.device)
        view_1, view_2 = views(features[idx], generator)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss = moco.loss(view_1, view_2)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"MoCo loss is {loss.item()} at step {step}")
        loss.backward()
        for opt in optimizers:
            opt.step()
        if moco.momentum_every == "step" or (step + 1) % per_epoch == 0:
            moco.momentum_update()
        history.append(float(loss.item()))
    return history
