"""SS-VFNAS per-party search spaces: shapes, parameter split, MixedOp weighting, derivation, baseline, figure."""

import json

import pytest
import torch
from torch.nn import functional as F

from fedrepro.vfl import spaces as S


def _conv(**kw):
    torch.manual_seed(0)
    return S.supernet("conv", 1, 12, width=4, cells=2, nodes=2, **kw)


def _mlp(**kw):
    torch.manual_seed(0)
    return S.supernet("mlp", 10, 12, width=8, cells=2, nodes=3, **kw)


def test_output_shapes_on_digit_halves_and_tables():
    assert _conv()(torch.randn(5, 1, 8, 4)).shape == (5, 12)
    assert _conv()(torch.randn(3, 1, 4, 4)).shape == (3, 12)  # digit quarters
    assert _mlp()(torch.randn(5, 10)).shape == (5, 12)
    with pytest.raises(ValueError):
        _mlp()(torch.randn(5, 1, 8, 4))


@pytest.mark.parametrize("make", [_conv, _mlp])
def test_arch_and_weight_parameters_partition_parameters(make):
    net = make()
    arch, weights = net.arch_parameters(), net.weight_parameters()
    ids = [id(p) for p in arch + weights]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in net.parameters()}
    assert len(arch) == 1 and arch[0].shape == (S.edge_count(net.skeleton["nodes"]), len(net.ops))
    # every cell's MixedOps read the same alphas: a gradient reaches them from the output
    net(torch.randn(4, 1, 8, 4) if net.kind == "conv" else torch.randn(4, 10)).sum().backward()
    assert arch[0].grad is not None and arch[0].grad.abs().sum() > 0


@pytest.mark.parametrize("make,x", [(_conv, torch.randn(4, 1, 8, 4)), (_mlp, torch.randn(4, 10))])
def test_mixed_op_follows_softmax_alpha(make, x):
    net = make()
    assert torch.allclose(net.edge_weights(), F.softmax(net.alphas, dim=-1))
    cell = net.cells[0]
    h = cell.pre1(net.stem(x))
    for k, name in enumerate(net.ops):
        with torch.no_grad():
            net.alphas.zero_()
            net.alphas[:, k] = 100.0
        edge = cell.edges[1]
        mixed = edge(h, net.edge_weights()[1])
        assert torch.allclose(mixed, edge.ops[k](h), atol=1e-5), name
    # the whole network uses the alphas: all-'none' edges leave only the output layer's bias
    with torch.no_grad():
        net.alphas.zero_()
        net.alphas[:, net.ops.index("none")] = 100.0
    assert torch.allclose(net(x), net.head.bias.expand(x.shape[0], -1), atol=1e-5)


def test_genotype_picks_strongest_non_none_ops():
    net = _conv()  # 2 nodes: edges 0,1 -> node 0; edges 2,3,4 -> node 1
    ops = list(net.ops)
    a = torch.zeros_like(net.alphas)
    a[0, ops.index("none")] = 9.0  # 'none' dominates edge 0 but is never chosen
    a[0, ops.index("max_pool_3x3")] = 2.0
    a[1, ops.index("sep_conv_3x3")] = 3.0
    a[2, ops.index("dil_conv_3x3")] = 1.0  # node 1, input 0
    a[3, ops.index("skip_connect")] = 4.0  # node 1, input 1
    a[4, ops.index("none")] = 20.0  # node 1, input 2: large alpha, but 'none' crushes its non-none weights -> dropped
    a[4, ops.index("avg_pool_3x3")] = 2.5
    with torch.no_grad():
        net.alphas.copy_(a)
    g = net.genotype()
    json.dumps(g)  # plain JSON
    picked = [[(e["input"], e["op"]) for e in node] for node in g["nodes"]]
    assert picked == [[(1, "sep_conv_3x3"), (0, "max_pool_3x3")], [(1, "skip_connect"), (0, "dil_conv_3x3")]]
    assert g["concat"] == [2, 3] and g["kind"] == "conv"
    # edge strength: softmax weight of the best non-none op, recomputed by hand for edge 4 vs edge 2
    w = F.softmax(a, dim=-1)
    assert g["nodes"][1][1]["weight"] == pytest.approx(float(w[2, ops.index("dil_conv_3x3")]), abs=1e-6)
    assert float(w[4, ops.index("avg_pool_3x3")]) < float(w[2, ops.index("dil_conv_3x3")])


@pytest.mark.parametrize("make,x", [(_conv, torch.randn(4, 1, 8, 4)), (_mlp, torch.randn(4, 10))])
def test_build_derived_is_fixed_and_smaller(make, x):
    net = make()
    g = net.genotype()
    derived = S.build_derived(g)
    assert derived.arch_parameters() == []
    assert not any(p is net.alphas for p in derived.parameters())
    assert S.count_parameters(derived) < S.count_parameters(net)
    assert derived(x).shape == (4, 12)
    chosen = [[e["op"] for e in node] for node in g["nodes"]]
    built = [[type(op).__name__ for op in ops] for ops in derived.cells[0].ops]
    assert [len(n) for n in built] == [len(n) for n in chosen] == [2] * net.skeleton["nodes"]
    wider = S.build_derived(g, width=2 * net.skeleton["width"])
    assert S.count_parameters(wider) > S.count_parameters(derived)


@pytest.mark.parametrize("make,kind,feats", [(_conv, "conv", 1), (_mlp, "mlp", 10)])
def test_hand_designed_baseline_has_similar_size(make, kind, feats):
    derived = S.build_derived(make().genotype())
    target = S.count_parameters(derived)
    base = S.hand_designed(kind, feats, 12, target_params=target)
    assert 0.5 <= S.count_parameters(base) / target <= 2.0
    assert base.arch_parameters() == []
    x = torch.randn(3, 1, 8, 4) if kind == "conv" else torch.randn(3, 10)
    assert base(x).shape == (3, 12)
    counts = S.parameter_counts(supernet=make(), derived=derived, hand=base)
    assert counts["derived"]["total"] == target and counts["supernet"]["arch"] > 0 == counts["hand"]["arch"]


@pytest.mark.parametrize("kind,feats", [("conv", 1), ("mlp", 10)])
def test_sizing_the_baseline_counts_without_building_so_its_weights_are_the_first_draw(kind, feats):
    """The width search counts parameters on meta tensors (the real network's count, at any width), so the sized
    network's weights are the very ones a network of that width draws first from the same seed."""
    assert all(
        S.hand_designed_parameters(kind, feats, 12, w) == S.count_parameters(S.HandDesigned(kind, feats, 12, w))
        for w in (1, 7, 300)
    )
    torch.manual_seed(5)
    sized = S.hand_designed(kind, feats, 12, target_params=5000)
    torch.manual_seed(5)
    first = S.HandDesigned(kind, feats, 12, sized.config["width"])
    assert sized.config["width"] > 1
    assert all(torch.equal(a, b) for a, b in zip(sized.state_dict().values(), first.state_dict().values()))


def test_draw_genotype_is_deterministic(tmp_path):
    g = _mlp().genotype()
    a = S.draw_genotype(g, "party 1 (mlp)", tmp_path / "a.png")
    b = S.draw_genotype(json.loads(json.dumps(g)), "party 1 (mlp)", tmp_path / "b.png")
    assert a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert a.read_bytes() == b.read_bytes()
