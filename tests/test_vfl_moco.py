"""SS-VFNAS MoCo v2 pre-search: queue, momentum update, InfoNCE, augmentations, pretraining."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedrepro.vfl import moco as M
from fedrepro.vfl import spaces as S


def _identity_moco(queue_size=3, temperature=0.5, **kw):
    """Encoder = identity on 2-d inputs, head set to identity matrices: q = normalize(view) for positive views."""
    m = M.MoCo(
        nn.Identity(),
        feature_dim=2,
        projection_dim=2,
        queue_size=queue_size,
        temperature=temperature,
        generator=torch.Generator().manual_seed(0),
        **kw,
    )
    with torch.no_grad():
        for head in (m.head_q, m.head_k):
            for layer in (head[0], head[2]):
                layer.weight.copy_(torch.eye(2))
                layer.bias.zero_()
    return m


def test_queue_is_fifo_with_wrapping_pointer():
    m = _identity_moco(queue_size=5)
    keys = torch.arange(1, 12, dtype=torch.float32)[:, None].repeat(1, 2)  # key i = (i, i), i = 1..11
    m.enqueue(keys[:3])
    assert int(m.queue_ptr) == 3 and torch.equal(m.queue[:3], keys[:3])
    m.enqueue(keys[3:7])  # wraps: slots 3, 4, 0, 1
    assert int(m.queue_ptr) == 2
    assert m.queue[:, 0].tolist() == [6, 7, 3, 4, 5]  # key 1 and 2 (the oldest) were overwritten
    m.enqueue(keys[7:])  # 4 keys: slots 2, 3, 4, 0
    assert int(m.queue_ptr) == 1 and m.queue[:, 0].tolist() == [11, 7, 8, 9, 10]
    m.enqueue(torch.arange(20, 27, dtype=torch.float32)[:, None].repeat(1, 2))  # 7 > size: newest 5 survive
    assert int(m.queue_ptr) == 3 and sorted(m.queue[:, 0].tolist()) == [22, 23, 24, 25, 26]
    # same as writing 20..26 one by one into slots 1,2,3,4,0,1,2: the oldest survivor (22) sits at the pointer
    assert m.queue[:, 0].tolist() == [24, 25, 26, 22, 23]


def test_infonce_matches_hand_computation_and_stores_normalised_keys():
    m = _identity_moco(queue_size=3, temperature=0.5)
    with torch.no_grad():
        m.queue.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, -0.8]]))
    v1 = torch.tensor([[3.0, 4.0], [1.0, 1.0]])
    v2 = torch.tensor([[4.0, 3.0], [2.0, 2.0]])
    r = 1 / math.sqrt(2)
    t = 0.5
    per_sample = [
        # q = (0.6, 0.8), k+ = (0.8, 0.6): q.k+ = 0.96; negatives 0.6, 0.8, -0.28
        -0.96 / t + math.log(sum(math.exp(s / t) for s in (0.96, 0.6, 0.8, -0.28))),
        # q = k+ = (r, r): q.k+ = 1; negatives r, r, -0.2 r
        -1.0 / t + math.log(sum(math.exp(s / t) for s in (1.0, r, r, -0.2 * r))),
    ]
    loss = m.loss(v1, v2)
    assert loss.item() == pytest.approx(sum(per_sample) / 2, abs=1e-5)
    # the keys were enqueued L2-normalised at slots 0, 1; the pointer moved on
    assert torch.allclose(m.queue[:2], torch.tensor([[0.8, 0.6], [r, r]]), atol=1e-6)
    assert torch.equal(m.queue[2], torch.tensor([0.6, -0.8])) and int(m.queue_ptr) == 2


def test_momentum_update_formula_and_key_encoder_without_gradients():
    torch.manual_seed(0)
    m = M.MoCo(
        S.supernet("mlp", 6, 8, width=8, cells=1, nodes=2), feature_dim=8, projection_dim=4, queue_size=8, momentum=0.75
    )
    q_params = list(m.encoder_q.parameters()) + list(m.head_q.parameters())
    k_params = list(m.encoder_k.parameters()) + list(m.head_k.parameters())
    assert len(q_params) == len(k_params) and all(not p.requires_grad for p in k_params)
    assert all(torch.equal(a, b) for a, b in zip(q_params, k_params))  # the key encoder starts as a copy
    assert any(p is m.encoder_k.alphas for p in k_params)  # alphas are momentum-averaged too
    m.loss(torch.randn(5, 6), torch.randn(5, 6)).backward()
    assert all(p.grad is None for p in k_params)
    assert m.encoder_q.alphas.grad is not None and m.head_q[0].weight.grad is not None
    with torch.no_grad():
        for i, (pq, pk) in enumerate(zip(q_params, k_params)):
            pq.copy_(torch.full_like(pq, float(i + 1)))
            pk.copy_(torch.full_like(pk, -2.0))
    m.momentum_update()
    for i, pk in enumerate(k_params):
        assert torch.allclose(pk, torch.full_like(pk, 0.75 * -2.0 + 0.25 * (i + 1)))


def test_momentum_every_epoch_matches_released_code_schedule():
    torch.manual_seed(0)
    x = torch.randn(32, 6)

    def key_after(steps):
        torch.manual_seed(1)
        m = M.MoCo(
            S.supernet("mlp", 6, 8, width=8, cells=1, nodes=2),
            8,
            projection_dim=4,
            queue_size=8,
            momentum_every="epoch",
        )
        start = [p.clone() for p in m.encoder_k.parameters()]
        opt = torch.optim.SGD(list(m.encoder_q.parameters()) + list(m.head_q.parameters()), lr=0.1)
        M.pretrain(m, x, steps, 8, opt, torch.Generator().manual_seed(0))  # 4 steps per epoch
        return all(torch.equal(a, b) for a, b in zip(start, m.encoder_k.parameters()))

    assert key_after(3) is True
    assert key_after(4) is False
    assert M.MoCo(nn.Linear(2, 2), 2, released_code=True).momentum_every == "epoch"
    assert M.MoCo(nn.Linear(2, 2), 2).momentum_every == "step"


def test_image_views_are_shifted_noisy_erased_copies():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 1, 8, 4) + 1.0
    v1, v2 = M.image_views(x, g)
    assert v1.shape == v2.shape == x.shape and not torch.equal(v1, v2)
    a, _ = M.image_views(x, torch.Generator().manual_seed(3))
    b, _ = M.image_views(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)  # all randomness from the generator
    # without noise and erasing, each view is x shifted by at most 1 pixel with zero padding
    v, _ = M.image_views(x, g, noise=0.0, erase_prob=0.0)
    padded = F.pad(x, (1, 1, 1, 1))
    shifts = torch.stack([padded[:, :, 1 + dy : 9 + dy, 1 + dx : 5 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)])
    assert all(any(torch.equal(v[i], shifts[s, i]) for s in range(9)) for i in range(6))
    # erasing only, always: exactly one 2x2 zero patch per image (x has no zeros)
    e, _ = M.image_views(x, g, max_shift=0, noise=0.0, erase_prob=1.0, erase_size=2)
    assert ((e == 0).sum(dim=(1, 2, 3)) == 4).all()


def test_tabular_views_mask_from_marginals_and_scale_noise():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 5) * torch.tensor([1.0, 10.0, 100.0, 1.0, 1.0])
    v, _ = M.tabular_views(x, g, mask_prob=0.5, noise=0.0)
    for j in range(5):  # every entry is the original or the same feature from some row of the batch
        assert set(v[:, j].tolist()) <= set(x[:, j].tolist())
    assert not torch.equal(v, x)
    n, _ = M.tabular_views(x, g, mask_prob=0.0, noise=0.1)
    rel = (n - x).std(dim=0) / x.std(dim=0, unbiased=False)
    assert ((rel > 0.03) & (rel < 0.3)).all()  # noise follows each feature's scale


def test_released_code_flag_gives_identity_views_and_unnormalised_keys():
    g = torch.Generator().manual_seed(0)
    img, tab = torch.rand(4, 1, 8, 4), torch.randn(4, 5)
    for views, x in ((M.image_views, img), (M.tabular_views, tab)):
        a, b = views(x, g, released_code=True)
        assert torch.equal(a, x) and torch.equal(b, x)
        a, b = views(x, g)
        assert not torch.equal(a, x)
    m = M.MoCo(nn.Linear(5, 3), 3, queue_size=4, released_code=True)
    assert isinstance(m.head_q, nn.Identity)
    m.loss(tab, tab)
    with torch.no_grad():
        expected = m.encoder_k(tab)
    assert torch.allclose(m.queue, expected)  # raw keys, not L2-normalised
    assert not torch.allclose(m.queue.norm(dim=1), torch.ones(4))


def test_pretraining_decreases_the_loss_on_an_easy_table():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)  # 64 well-separated instances
    m = M.MoCo(
        S.supernet("mlp", 8, 16, width=16, cells=1, nodes=2),
        16,
        projection_dim=16,
        queue_size=16,
        momentum=0.9,
        temperature=0.2,
        generator=g,
    )
    opt = torch.optim.Adam(list(m.encoder_q.parameters()) + list(m.head_q.parameters()), lr=1e-2)
    history = M.pretrain(m, x, 30, 16, opt, g, views=lambda b, gen: M.tabular_views(b, gen, 0.1, 0.05))
    assert len(history) == 30 and all(math.isfinite(v) for v in history)
    # steps 0-1 still see the random initial queue; compare the first full-queue steps with the last ones
    assert sum(history[-5:]) / 5 < sum(history[2:7]) / 5 - 0.1
    assert torch.allclose(m.queue.norm(dim=1), torch.ones(16), atol=1e-5)


def test_pretrain_conv_supernet_on_digit_halves_moves_weights_and_alphas():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    enc = S.supernet("conv", 1, 8, width=4, cells=1, nodes=2)
    m = M.MoCo(enc, 8, projection_dim=8, queue_size=16, generator=g)
    alphas0 = enc.alphas.detach().clone()
    stem0 = enc.stem[0].weight.detach().clone()
    opts = [
        torch.optim.SGD(enc.weight_parameters() + list(m.head_q.parameters()), lr=0.05, momentum=0.9),
        torch.optim.Adam(enc.arch_parameters(), lr=3e-3),
    ]
    history = M.pretrain(m, torch.rand(24, 1, 8, 4) * 16, 3, 8, opts, g)
    assert len(history) == 3
    assert not torch.equal(enc.alphas, alphas0) and not torch.equal(enc.stem[0].weight, stem0)
