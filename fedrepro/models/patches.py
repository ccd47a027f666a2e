"""FedMatch's private patches: small modules injected into a shared BERT backbone (FedMatch, CIKM'21, Sec. 3).

A patch maps hidden states (..., d) to a delta (..., d). Its up-projection ``up`` is zero-initialised, so a freshly
patched model computes exactly what the unpatched one does. Two structures:

``lr``   low-rank: Linear(d->r) -> GELU -> Linear(r->d).
``pal``  projected attention layer (Stickland & Murray's PALs): Linear(d->r) -> multi-head self-attention in the
         r-space, never attending to padding -> Linear(r->d) -> GELU (GELU(0) = 0 keeps the zero start).

Four insertions into a ``BertModel``; the paper's "in every layer" gives inner/outer, "at BERT level" gives
vertical/horizontal, each pair told apart by where the patch reads and writes:

``inner``       every layer, inside it, parallel to the self-attention sub-layer (released code: ``mult``): each
                ``encoder.layer.i.attention.output`` computes LayerNorm(dropout(dense(attn)) + x + patch(x)), x the
                layer input. The paper only says "inside the layer"; we follow PALs and ``mult`` in adding the
                patch inside the residual before the attention LayerNorm.
``outer``       every layer, on its output (released code: ``houlsby``; a serial residual adapter placed after the
                layer's sub-layers rather than Houlsby's two per layer): h = layer(x); h + patch(h).
``vertical``    one patch at BERT level, a side branch from the embeddings to the top (released code: ``vertical``):
                encoder(e).last_hidden_state + patch(e). The released code applies a LayerNorm to that sum; we
                omit it so that the zero-initialised patch leaves the model unchanged.
``horizontal``  one patch at BERT level stacked on top of the encoder (released code: ``top``): h_L + patch(h_L).

Every patch module is registered under an attribute named ``patch`` and the wrapped original under ``base``, so
patch parameters are recognised by name (:func:`is_patch_parameter`) and the remaining names are the backbone's
own once the ``.base`` segments are dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Iterable

import torch
from torch import nn

from fedrepro.errors import ConfigError

INSERTIONS = ("inner", "outer", "vertical", "horizontal")
STRUCTURES = ("pal", "lr")


@dataclass(frozen=True)
class PatchSpec:
    insertion: str
    structure: str
    size: int = 128  # r, the projection size
    heads: int = 4  # PAL heads

    def __post_init__(self) -> None:
        """A spec the patch can be built from, or a ValueError naming the field: the library knows no params keys
        (``fedrepro.fedmatch.runs.algorithm_settings`` says which key of fedmatch.settings set it)."""
        if self.insertion not in INSERTIONS:
            raise ValueError(f"insertion = {self.insertion!r}: allowed {list(INSERTIONS)}")
        if self.structure not in STRUCTURES:
            raise ValueError(f"structure = {self.structure!r}: allowed {list(STRUCTURES)}")
        for field in ("size", "heads"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} = {value!r}: allowed a positive integer")
        if self.structure == "pal" and self.size % self.heads:
            raise ValueError(f"heads = {self.heads}: a PAL patch of size {self.size} needs a divisor of {self.size}")


class _MaskRecorder:
    """Forward pre-hook on the BertModel keeping its 2-D padding mask for the PAL patches, which never see it.

    A callable object rather than a closure so that ``copy.deepcopy`` of the model gives the copy its own
    recorder, shared by the copy's hook and patches.
    """

    mask: torch.Tensor | None = None

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)


def _zero(up: nn.Linear) -> None:
    """A zero up-projection: the patched model starts exactly as the unpatched one."""
    nn.init.zeros_(up.weight)
    nn.init.zeros_(up.bias)


class LowRankPatch(nn.Module):
    def __init__(self, hidden: int, size: int) -> None:
        super().__init__()
        self.down, self.act, self.up = nn.Linear(hidden, size), nn.GELU(), nn.Linear(size, hidden)
        _zero(self.up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(x)))


class PalPatch(nn.Module):
    def __init__(self, hidden: int, size: int, heads: int, masks: _MaskRecorder) -> None:
        super().__init__()
        self.down, self.up, self.act = nn.Linear(hidden, size), nn.Linear(size, hidden), nn.GELU()
        self.attn = nn.MultiheadAttention(size, heads, batch_first=True)
        _zero(self.up)
        self.masks = masks  # a plain attribute: shared, not a submodule, not in the state dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.masks.mask
        padding = None if mask is None else mask == 0  # True = a padded key, never attended to
        z = self.down(x)
        z, _ = self.attn(z, z, z, key_padding_mask=padding, need_weights=False)
        return self.act(self.up(z))


class PatchedSelfOutput(nn.Module):
    """``inner``: the patch of the layer input x joins the attention residual before its LayerNorm."""

    def __init__(self, base: nn.Module, patch: nn.Module) -> None:
        super().__init__()
        self.base, self.patch = base, patch

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.base(hidden_states, input_tensor + self.patch(input_tensor), *args, **kwargs)


class PatchedLayer(nn.Module):
    """``outer``: h + patch(h) on the layer output h."""

    def __init__(self, base: nn.Module, patch: nn.Module) -> None:
        super().__init__()
        self.base, self.patch = base, patch

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        h = self.base(hidden_states, *args, **kwargs)
        return h + self.patch(h)


class PatchedEncoder(nn.Module):
    """``vertical`` (patch reads the embedding output, the encoder's input) or ``horizontal`` (reads h_L)."""

    def __init__(self, base: nn.Module, patch: nn.Module, from_embeddings: bool) -> None:
        super().__init__()
        self.base, self.patch, self.from_embeddings = base, patch, from_embeddings

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        out = self.base(hidden_states, *args, **kwargs)
        top = out.last_hidden_state
        out.last_hidden_state = top + self.patch(hidden_states if self.from_embeddings else top)
        return out


def inject_patch(model: nn.Module, spec: PatchSpec) -> nn.Module:
    """Inject in place into the first submodule that looks like a BERT encoder (has ``.embeddings`` and
    ``.encoder.layer``); returns ``model``. Raise ConfigError if none is found."""
    if any(is_patch_parameter(name) for name, _ in model.named_parameters()):
        raise ConfigError(f"{type(model).__name__} already holds a patch; inject once")
    bert = next(
        (m for m in model.modules() if hasattr(m, "embeddings") and hasattr(getattr(m, "encoder", None), "layer")), None
    )
    if bert is None:
        raise ConfigError(f"found no BERT encoder (.embeddings and .encoder.layer) in {type(model).__name__}")
    hidden = bert.config.hidden_size
    if spec.structure == "pal":
        masks = _MaskRecorder()
        bert.register_forward_pre_hook(masks, with_kwargs=True)
        make = partial(PalPatch, hidden, spec.size, spec.heads, masks)
    else:
        make = partial(LowRankPatch, hidden, spec.size)
    if spec.insertion == "inner":
        for layer in bert.encoder.layer:
            layer.attention.output = PatchedSelfOutput(layer.attention.output, make())
    elif spec.insertion == "outer":
        for i, layer in enumerate(bert.encoder.layer):
            bert.encoder.layer[i] = PatchedLayer(layer, make())
    else:
        bert.encoder = PatchedEncoder(bert.encoder, make(), from_embeddings=spec.insertion == "vertical")
    return model


def is_patch_parameter(name: str) -> bool:
    """True for every parameter of a patch: all are registered under an attribute named ``patch``."""
    return name.startswith("patch.") or ".patch." in name


_LAYER = re.compile(r"(?:^|\.)encoder\.(?:base\.)?layer\.(\d+)\.")


def encoder_layer_index(name: str) -> int | None:
    """The encoder layer i of a name containing ``encoder.layer.{i}.``, also inside a wrapped encoder
    (``encoder.base.layer.{i}.``, as vertical/horizontal patches name it), else None."""
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


_PROJECTION = re.compile(r"(?:^|\.)patch\.(down|up)\.weight$")


def patch_norms(parameters: Iterable[tuple[str, torch.Tensor]], initial: dict[str, torch.Tensor]) -> dict[str, float]:
    """How far a model's patches have moved: Frobenius norms over all its patches of the down- and up-projection
    weights (``down``, ``up``), and of their change from ``initial`` (``down_change``, ``up_change``; the
    up-projection starts at zero, so its norm is its change). Empty for a model without a patch."""
    squares: dict[str, float] = {}
    for name, value in parameters:
        match = _PROJECTION.search(name)
        if match is None:
            continue
        which, value = match.group(1), value.detach().float()
        squares[which] = squares.get(which, 0.0) + float(value.pow(2).sum())
        change = value - initial[name].float() if name in initial else value
        squares[f"{which}_change"] = squares.get(f"{which}_change", 0.0) + float(change.pow(2).sum())
    return {key: squares[key] ** 0.5 for key in sorted(squares)}


def patch_effect(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
    """What a model's patches change in its output on ``batches``, against the same model with every patch's
    output zeroed: the mean relative change of the features the head reads (``feature_change``) and the mean
    absolute score change in units of the scores' standard deviation (``score_change``). Weight norms alone do
    not say whether a patch matters; this does. Empty for a model without a patch."""
    patches = [module for name, module in model.named_modules() if name == "patch" or name.endswith(".patch")]
    if not patches:
        return {}
    features, scores, device = [], [], next(model.parameters()).device
    with torch.no_grad():
        for batch in batches:
            batch = {name: tensor.to(device) for name, tensor in batch.items()}
            with_patch = model(**batch)
            handles = [p.register_forward_hook(lambda module, args, output: torch.zeros_like(output)) for p in patches]
            try:
                without = model(**batch)
            finally:
                for handle in handles:
                    handle.remove()
            features.append((with_patch[1] - without[1]).norm(dim=-1) / without[1].norm(dim=-1).clamp(min=1e-12))
            scores.append(torch.stack([with_patch[0], without[0]]))
    if not features:
        return {}
    features, scores = torch.cat(features), torch.cat(scores, dim=1)
    spread = float(scores[0].std()) if scores.shape[1] > 1 else 0.0
    return {
        "feature_change": float(features.mean()),
        "score_change": float((scores[0] - scores[1]).abs().mean()) / spread if spread > 0 else 0.0,
    }


def patch_parameter_count(hidden: int, spec: PatchSpec, num_layers: int) -> int:
    """Patch parameters in closed form: per layer for inner/outer times ``num_layers``, once at BERT level."""
    d, r = hidden, spec.size
    one = d * r + r + r * d + d  # down and up projections with biases
    if spec.structure == "pal":
        one += 4 * r * r + 4 * r  # attention in the r-space: q, k, v and output projections with biases
    return one * num_layers if spec.insertion in ("inner", "outer") else one
