"""FedMatch patches: all 8 variants start as the identity, act once non-zero, split parameters by name, ignore
padding."""

import copy

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel
from transformers.models.bert.modeling_bert import BertLayer

from fedrepro.errors import ConfigError
from fedrepro.models.cross_encoder import CrossEncoder
from fedrepro.models.patches import (
    INSERTIONS,
    STRUCTURES,
    PatchSpec,
    encoder_layer_index,
    inject_patch,
    is_patch_parameter,
    patch_effect,
    patch_norms,
    patch_parameter_count,
)

HIDDEN, LAYERS = 32, 2
VARIANTS = [(i, s) for i in INSERTIONS for s in STRUCTURES]


def tiny_bert() -> BertModel:
    config = BertConfig(
        vocab_size=100, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=2, intermediate_size=64
    )
    return BertModel(config, add_pooling_layer=False)


def models(insertion: str, structure: str) -> tuple[CrossEncoder, CrossEncoder, PatchSpec]:
    """The same CrossEncoder unpatched and patched, both in eval mode."""
    torch.manual_seed(0)
    plain = CrossEncoder(tiny_bert()).eval()
    spec = PatchSpec(insertion, structure, size=8, heads=2)
    patched = inject_patch(copy.deepcopy(plain), spec).eval()
    return plain, patched, spec


def batch(lengths=(8, 5), width=8) -> dict:
    """Token ids 5.. for real tokens, then [PAD] (id 0) with mask 0 up to ``width``."""
    torch.manual_seed(1)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(5, 100, (n,))
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def make_up_nonzero(model: nn.Module) -> None:
    torch.manual_seed(2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_patch_parameter(name) and ".up." in name:
                nn.init.normal_(param, std=0.5)


@pytest.mark.parametrize("insertion,structure", VARIANTS)
def test_patched_model_starts_as_the_unpatched_one(insertion, structure):
    plain, patched, _ = models(insertion, structure)
    inputs = batch()
    with torch.no_grad():
        (s0, f0), (s1, f1) = plain(**inputs), patched(**inputs)
        hidden = patched.encoder(**inputs).last_hidden_state
    assert hidden.shape == (2, 8, HIDDEN) and f1.shape == f0.shape and s1.shape == s0.shape == (2,)
    assert (s1 - s0).abs().max() < 1e-6 and (f1 - f0).abs().max() < 1e-6


@pytest.mark.parametrize("insertion,structure", VARIANTS)
def test_non_zero_up_projection_changes_the_output(insertion, structure):
    plain, patched, _ = models(insertion, structure)
    make_up_nonzero(patched)
    inputs = batch()
    with torch.no_grad():
        (s0, f0), (s1, f1) = plain(**inputs), patched(**inputs)
    assert (f1 - f0).abs().max() > 1e-3 and (s1 - s0).abs().max() > 1e-5


@pytest.mark.parametrize("insertion,structure", VARIANTS)
def test_patch_parameters_are_counted_and_the_rest_is_the_backbone(insertion, structure):
    plain, patched, spec = models(insertion, structure)
    names = dict(patched.named_parameters())
    patch = sum(p.numel() for n, p in names.items() if is_patch_parameter(n))
    assert patch == patch_parameter_count(HIDDEN, spec, LAYERS) > 0
    rest = {n.replace(".base.", "."): p.shape for n, p in names.items() if not is_patch_parameter(n)}
    assert rest == {n: p.shape for n, p in plain.named_parameters()}


@pytest.mark.parametrize("insertion,structure", VARIANTS)
def test_extra_right_padding_leaves_the_scores_unchanged(insertion, structure):
    _, patched, _ = models(insertion, structure)
    make_up_nonzero(patched)
    with torch.no_grad():
        tight, _ = patched(**batch(lengths=(5,), width=5))
        padded, _ = patched(**batch(lengths=(5, 8), width=8))
    assert torch.allclose(tight[0], padded[0], atol=1e-5)


@pytest.mark.parametrize("insertion", INSERTIONS)
def test_each_patch_reads_and_writes_where_the_docstring_says(insertion):
    _, patched, _ = models(insertion, "lr")
    make_up_nonzero(patched)
    bert, seen = patched.encoder, {}

    def record(key):
        def hook(module, args, out):
            seen.setdefault(key, (args, out))  # the first call only; returns None so the output is kept

        return hook

    bert.embeddings.register_forward_hook(record("embeddings"))
    layers = [m for m in bert.modules() if isinstance(m, BertLayer)]
    layers[0].register_forward_hook(record("first"))
    layers[-1].register_forward_hook(record("last"))
    first_patch = next(m for n, m in bert.named_modules() if n.endswith("patch"))
    first_patch.register_forward_hook(record("patch"))
    with torch.no_grad():
        top = bert(**batch()).last_hidden_state
    embeddings, first, last = seen["embeddings"][1], seen["first"][1], seen["last"][1]
    (patch_in,), patch_out = seen["patch"]
    reads = {"inner": embeddings, "outer": first, "vertical": embeddings, "horizontal": last}[insertion]
    assert torch.equal(patch_in, reads)
    if insertion in ("vertical", "horizontal"):
        assert torch.allclose(top, last + patch_out, atol=1e-6)
    if insertion == "inner":  # LayerNorm(dropout(dense(attn)) + x + patch(x)) in the first layer
        self_output = bert.encoder.layer[0].attention.output
        self_output.register_forward_hook(record("self_output"))
        with torch.no_grad():
            bert(**batch())
            (attn, _), out = seen["self_output"]
            expected = self_output.base.LayerNorm(self_output.base.dense(attn) + embeddings + patch_out)
        assert torch.allclose(out, expected, atol=1e-6)


def test_a_deep_copy_reads_its_own_padding_mask():
    _, patched, _ = models("inner", "pal")
    make_up_nonzero(patched)
    twin = copy.deepcopy(patched)
    with torch.no_grad():
        tight, _ = twin(**batch(lengths=(5,), width=5))
        padded, _ = twin(**batch(lengths=(5, 8), width=8))
    assert torch.allclose(tight[0], padded[0], atol=1e-5)


def test_encoder_layer_index():
    assert encoder_layer_index("encoder.encoder.layer.1.attention.output.base.dense.weight") == 1
    assert encoder_layer_index("encoder.layer.11.patch.up.bias") == 11
    assert encoder_layer_index("encoder.encoder.base.layer.0.output.dense.weight") == 0, "inside a wrapped encoder"
    assert encoder_layer_index("encoder.encoder.patch.down.weight") is None
    assert encoder_layer_index("head.weight") is None


def test_is_patch_parameter():
    assert is_patch_parameter("patch.up.weight") and is_patch_parameter(
        "encoder.encoder.layer.0.patch.attn.in_proj_weight"
    )
    assert not is_patch_parameter("encoder.encoder.layer.0.base.output.dense.weight")


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"insertion": "middle", "structure": "lr"}, "insertion = 'middle'"),
        ({"insertion": "inner", "structure": "mlp"}, "structure = 'mlp'"),
        ({"insertion": "inner", "structure": "pal", "size": 10, "heads": 4}, "heads = 4: a PAL patch of size 10"),
        ({"insertion": "inner", "structure": "lr", "size": 0}, "size = 0"),
    ],
)
def test_bad_spec_names_the_field_and_knows_no_params_key(kwargs, field):
    with pytest.raises(ValueError, match=field) as caught:
        PatchSpec(**kwargs)
    assert "fedmatch" not in str(caught.value)


def test_the_stage_names_the_params_key_a_bad_patch_came_from():
    from fedrepro.fedmatch.runs import algorithm_settings
    from test_config import with_change

    from fedrepro.config import parse_params

    params = parse_params(with_change("fedmatch.settings.patch_heads", 3))
    size = params.fedmatch.settings.patch_size
    with pytest.raises(
        ConfigError,
        match=rf"^params: fedmatch.settings.patch_heads = 3: a PAL patch of size {size} needs a "
        rf"divisor of {size} \(for fedmatch_h_pal\)$",
    ):
        algorithm_settings(params, "fedmatch_h_pal")


def test_inject_needs_an_unpatched_bert():
    with pytest.raises(ConfigError, match="no BERT encoder"):
        inject_patch(nn.Linear(2, 2), PatchSpec("inner", "lr"))
    _, patched, spec = models("vertical", "lr")
    with pytest.raises(ConfigError, match="already holds a patch"):
        inject_patch(patched, spec)


def test_patch_norms_of_a_fresh_patch_and_after_a_change():
    # inner = one patch per layer: the norms add up over the layers' patches (Frobenius over all of them)
    _, patched, _ = models("inner", "lr")
    initial = {n: p.detach().clone() for n, p in patched.named_parameters()}
    fresh = patch_norms(patched.named_parameters(), initial)
    downs = [p for n, p in patched.named_parameters() if n.endswith("patch.down.weight")]
    assert len(downs) == LAYERS
    assert fresh["up"] == fresh["up_change"] == fresh["down_change"] == 0.0
    assert fresh["down"] == pytest.approx(float(sum(p.detach().pow(2).sum() for p in downs)) ** 0.5)
    with torch.no_grad():
        for name, param in patched.named_parameters():
            if name.endswith("patch.up.weight"):
                param.fill_(0.5)  # 32 x 8 entries per layer
    moved = patch_norms(patched.named_parameters(), initial)
    assert moved["up"] == moved["up_change"] == pytest.approx(0.5 * (LAYERS * HIDDEN * 8) ** 0.5)
    assert moved["down_change"] == 0.0
    assert patch_norms(CrossEncoder(tiny_bert()).named_parameters(), {}) == {}


@pytest.mark.parametrize("insertion", INSERTIONS)
def test_patch_effect_is_zero_for_a_fresh_patch_and_measures_a_trained_one(insertion):
    plain, patched, _ = models(insertion, "lr")
    assert patch_effect(patched, [batch()]) == {"feature_change": 0.0, "score_change": 0.0}
    make_up_nonzero(patched)
    effect = patch_effect(patched, [batch(), batch((3, 6))])
    with torch.no_grad():
        on, off = patched(**batch())[1], plain(**batch())[1]  # zeroing the patch output gives the unpatched model
    assert effect["feature_change"] > 0 and effect["score_change"] > 0
    assert patch_effect(patched, [batch()])["feature_change"] == pytest.approx(
        float(((on - off).norm(dim=-1) / off.norm(dim=-1)).mean()), rel=1e-5
    )
    assert patch_effect(plain, [batch()]) == {}
