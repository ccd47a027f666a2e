"""The paper-scale cost model (the shared rules of fedrepro.costs, each paper's counts in fedrepro/<paper>/costs.py)
against hand counts, and the plan command's paper-scale table."""

import importlib.util
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

from fedrepro import costs
from fedrepro.code_closure import import_closure
from fedrepro.config import parse_params, read_raw_params
from fedrepro.fedcmc import costs as fedcmc_costs
from fedrepro.fedcmc.cells import table_cells as fedcmc_table_cells
from fedrepro.fedmatch import costs as fedmatch_costs
from fedrepro.fedmatch.cells import Cell as QACell
from fedrepro.fedmatch.cells import table_cells as fedmatch_table_cells
from fedrepro.models.cross_encoder import CrossEncoder
from fedrepro.vfl.spaces import supernet

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("cpu_snapshot", ROOT / "scripts" / "cpu_snapshot.py")
cpu_snapshot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_snapshot)

V, P, D, L, HEADS, F = 500, 64, 32, 2, 2, 64  # a tiny BERT: vocabulary, positions, width, layers, heads, feed-forward


def tiny_cross_encoder() -> CrossEncoder:
    config = BertConfig(
        vocab_size=V,
        hidden_size=D,
        num_hidden_layers=L,
        num_attention_heads=HEADS,
        intermediate_size=F,
        max_position_embeddings=P,
    )
    torch.manual_seed(0)
    return CrossEncoder(BertModel(config, add_pooling_layer=False))


def params_with(scale: str, **keys):
    raw = read_raw_params(ROOT / "params.yaml")
    for key, value in {"scale": scale, **keys}.items():
        cpu_snapshot.set_key(raw, key, value)
    return parse_params(raw)


def test_parameters_of_a_tiny_bert_match_the_hand_count():
    model = tiny_cross_encoder()
    shape = costs.model_shape(model, lambda name: name.startswith("head."))
    tables = V * D + P * D + 2 * D  # word, position and token-type embeddings: looked up, no FLOPs
    layer = (
        4 * (D * D + D) + 2 * D + (D * F + F) + (F * D + D) + 2 * D
    )  # Q, K, V, O; LayerNorm; feed-forward; LayerNorm
    per_token = L * layer + 2 * D  # + the embeddings' LayerNorm
    head = D + 1
    assert shape.total == sum(p.numel() for p in model.parameters()) == tables + per_token + head
    assert (shape.per_token, shape.per_sequence, shape.private, shape.trained) == (per_token, head, head, shape.total)
    assert shape.transformer == costs.Transformer(L, D, HEADS)


def test_the_published_bert_base_built_on_meta_has_its_known_size():
    tiny = {"vocab_size": 8000, "hidden": 128, "layers": 2, "heads": 2, "intermediate": 512}
    encoder = costs.meta_encoder("bert-base-uncased", 30522, tiny, 256, 0, "model.backbone")
    assert next(encoder.parameters()).device.type == "meta"
    assert sum(p.numel() for p in encoder.parameters()) == 109_482_240  # BertModel with its pooler
    distil = costs.meta_encoder("distilbert-base-uncased", 30522 + 4, tiny, 128, 0, "fedcmc.settings.backbone")
    assert sum(p.numel() for p in distil.parameters()) == 66_362_880 + 4 * 768  # grown by the four entity markers


def test_the_flop_rule_bounds_torchs_count_of_a_tiny_bert_within_5_percent():
    model, batch, length = tiny_cross_encoder(), 3, 40
    shape = costs.model_shape(model, lambda name: False)
    ids = torch.randint(5, V, (batch, length))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    with FlopCounterMode(display=False) as forward:
        model(**inputs)
    with FlopCounterMode(display=False) as step:
        model(**inputs)[0].sum().backward()
    counted = forward.get_total_flops()
    # the rule counts biases and LayerNorms as matmul weights: a little above torch's count of the matmuls
    assert counted <= batch * costs.forward_flops(shape, length) <= 1.05 * counted
    assert step.get_total_flops() == pytest.approx(3 * counted, rel=0.01)  # backward = 2 x forward
    assert costs.training_flops(shape, length) == 3 * costs.forward_flops(shape, length)


@pytest.mark.parametrize("kind, shape", [("conv", (1, 8, 4)), ("mlp", (13,))])
def test_ssvfnas_weight_flops_equal_torchs_count(kind, shape):
    net = supernet(kind, shape[0], 16, width=4, cells=1, nodes=2)
    positions = shape[1] * shape[2] if kind == "conv" else 1
    with FlopCounterMode(display=False) as counter:
        net(torch.zeros(2, *shape))
    assert costs.weight_flops(net, positions) == counter.get_total_flops() / 2


def test_fedmatch_tokens_of_a_toy_client_layout_by_hand():
    params = params_with(
        "embedded",
        **{
            "train.rounds": 3,
            "train.local_epochs": 1,
            "train.batch_size": 4,
            "train.fit_samples": 8,
            "train.eval_every": 1,
            "model.max_length": 32,
            "mine.negatives_per_question": 2,
            "fedmatch.settings.clients_sampled": 2,
        },
    )
    clients = {
        "a": fedmatch_costs.QAClientSize(5, 6, {"valid": 2, "test": 3}, {"valid": 40, "test": 60}),
        "b": fedmatch_costs.QAClientSize(2, 2, {"valid": 1, "test": 1}, {"valid": 20, "test": 21}),
        "c": fedmatch_costs.QAClientSize(1, 1, {"valid": 1, "test": 1}, {"valid": 20, "test": 20}),
    }
    model = fedmatch_costs.FedMatchCosts(params, clients, "fp32", "given")
    cost = model(QACell("fedavg", 0))
    # 2 sequences a triple x (pairs x 2 negatives) triples x 32 tokens x 3 rounds x 1 local epoch
    assert cost.train_tokens == {"a": 2 * 12 * 32 * 3, "b": 2 * 4 * 32 * 3, "c": 2 * 2 * 32 * 3}
    # each of 3 evaluated rounds: the FIT sample (2 batches of 4 triples = 8, or all a client has) x 2 sequences and
    # the valid candidates; then the test candidates once
    assert cost.eval_tokens == 32 * (3 * (2 * 8 + 40) + 60 + 3 * (2 * 4 + 20) + 21 + 3 * (2 * 2 + 20) + 20)
    shape = model.shape(params, "fedavg")
    assert cost.train_flops == (2 * (12 + 4 + 2) * 3) * costs.training_flops(shape, 32)
    assert cost.eval_flops == cost.eval_tokens / 32 * costs.forward_flops(shape, 32)
    sampled = model(QACell("fedavg_cs", 0))  # 2 of the 3 clients a round: each trains in 2/3 of the rounds
    assert sampled.train_tokens == pytest.approx({c: n * 2 / 3 for c, n in cost.train_tokens.items()})
    assert sampled.memory.federation < cost.memory.federation  # 2 uploads held at the aggregation, not 3


def test_memory_grows_with_batch_and_length():
    bert = costs.Transformer(12, 768, 12)
    for precision in ("fp32", "bf16"):
        by_batch = [costs.transformer_activation_bytes(bert, 256, b, precision) for b in (1, 2, 8, 32, 64)]
        by_length = [costs.transformer_activation_bytes(bert, s, 32, precision) for s in (16, 64, 128, 256, 512)]
        assert by_batch == sorted(set(by_batch)) and by_length == sorted(set(by_length))
        reserved = [costs.cell_gpu_memory(costs.Memory(1, 1, 2, a, 5)) for a in by_batch + by_length]
        assert reserved[:5] == sorted(set(reserved[:5])) and reserved[5:] == sorted(set(reserved[5:]))
    activations = {
        precision: costs.transformer_activation_bytes(bert, 256, 32, precision) for precision in ("bf16", "fp32")
    }
    assert activations["bf16"] < activations["fp32"]
    # one batch at the paper's FedMatch shape (64 sequences of 256, fp32) holds about 15 GB in BERT-base's 12 layers
    assert costs.transformer_activation_bytes(bert, 256, 64, "fp32") == pytest.approx(15.4e9, rel=0.01)


def test_the_paper_scale_plan_names_every_table_and_figure(tmp_path):
    """FedCMC on i2b2 alone (the paper's own statistics: no mirror needed), one seed and alpha, so the table is
    quick."""
    params = params_with(
        "paper",
        **{
            "data.source": "mirror",
            "fedcmc.datasets": ["i2b2"],
            "fedcmc.alphas": [0.05],
            "fedcmc.seeds": [0],
            "fedcmc.sweeps.dataset": "i2b2",
            "fedcmc.sweeps.subset_dataset": "i2b2",
            "fedcmc.sweeps.clients": [10, 20],
            "fedcmc.sweeps.local_epochs": [1, 2],
        },
    )
    lines = cpu_snapshot.paper_plan("fedcmc", params, tmp_path, "h100")
    groups = [name for name, _, _ in cpu_snapshot.snapshot_cells("fedcmc", params)]
    assert {
        "Table 2",
        "clients (the clients table)",
        "local_epochs (Fig 3b)",
        "vectors (Fig 4)",
        "subsets (Table 3)",
    } == set(groups)
    for name in groups + ["total, each run once"]:
        assert any(line.startswith(f"  {name}  ") for line in lines), name
    assert "GPU-hours on one H100 SXM5 80 GB in fp32" in lines[0]
    assert all(len(line) <= 120 for line in lines)


@pytest.mark.parametrize("module", ["costs", "fedmatch/costs", "fedcmc/costs", "ssvfnas/costs"])
def test_a_papers_costs_import_no_other_papers_code(module):
    """The shared rules import no paper's code, and a paper's counts none of another's: each paper's train stage
    depends on its own paper's code alone (its DVC deps are its import closure)."""
    own = {
        "costs": set(),
        "fedmatch/costs": {"fedmatch"},
        "fedcmc/costs": {"fedcmc"},
        "ssvfnas/costs": {"ssvfnas", "vfl"},
    }[module]
    closure = import_closure(ROOT / "fedrepro" / f"{module}.py")
    papers = {f.relative_to(ROOT).parts[1] for f in closure if len(f.relative_to(ROOT).parts) > 2}
    assert papers & {"fedmatch", "fedcmc", "ssvfnas", "vfl"} == own


@pytest.mark.parametrize("paper", ["fedmatch", "fedcmc"])
def test_a_text_papers_largest_cell_is_sized_without_its_data(paper):
    params = params_with("cpu")
    module, cells = {"fedmatch": (fedmatch_costs, fedmatch_table_cells), "fedcmc": (fedcmc_costs, fedcmc_table_cells)}[
        paper
    ]
    cells = cells(params)
    largest = module.largest_cell_gpu_memory(params, cells)
    assert largest > costs.CUDA_CONTEXT
    assert largest >= module.largest_cell_gpu_memory(params, cells[:1])
    assert module.largest_cell_gpu_memory(params, []) is None
