"""The Gaussian mechanism (per-sample clip, calibrated noise) and epsilon from opacus' RDP accountant."""

import json
import math

import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp

from fedrepro.vfl.privacy import (
    GaussianMechanism,
    PrivacyLedger,
    compose_epsilon,
    epsilon_of,
    gaussian_epsilon,
    privacy_spent,
)
from fedrepro.vfl.search import batch_at

MNIST, BATCH, DELTA = 60000, 256, 1e-5


def rows(x):
    return x.reshape(x.shape[0], -1).norm(dim=1)


def test_per_sample_clipping_bounds_every_row_and_leaves_small_rows_alone():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 4, 5, generator=g) * torch.logspace(-2, 1, 64).reshape(-1, 1, 1, 1)  # any rank
    clipped = GaussianMechanism(clip=1.0, sigma=0.0).clip_tensor(x)
    assert (rows(clipped) <= 1.0).all()
    small = rows(x) <= 1.0
    assert 0 < small.sum() < 64
    assert torch.equal(clipped[small], x[small])
    big = ~small
    assert torch.allclose(rows(clipped[big]), torch.ones(int(big.sum())), atol=1e-5)  # scaled onto the ball
    assert torch.allclose(
        clipped[big] / rows(clipped[big]).reshape(-1, 1, 1, 1), x[big] / rows(x[big]).reshape(-1, 1, 1, 1), atol=1e-6
    )
    assert torch.equal(GaussianMechanism(1.0, 0.0).apply(x, g), clipped)  # sigma = 0: clipping only


def test_noise_std_is_sigma_times_clip_and_reproducible():
    mechanism = GaussianMechanism(clip=2.0, sigma=0.7)
    zeros = torch.zeros(4000, 50)
    noise = mechanism.apply(zeros, torch.Generator().manual_seed(3))
    assert abs(float(noise.std()) - 1.4) < 0.02 and abs(float(noise.mean())) < 0.01
    assert torch.equal(noise, mechanism.apply(zeros, torch.Generator().manual_seed(3)))
    assert not torch.equal(noise, mechanism.apply(zeros, torch.Generator().manual_seed(4)))


def test_disabling_and_invalid_settings():
    x = torch.randn(8, 3) * 100
    assert torch.equal(GaussianMechanism(math.inf, 0.0).apply(x, torch.Generator()), x)  # identity
    with pytest.raises(ValueError):
        GaussianMechanism(math.inf, 1.0)  # noise sigma * clip would be infinite
    with pytest.raises(ValueError):
        GaussianMechanism(1.0, -1.0)
    with pytest.raises(ValueError):
        GaussianMechanism(0.0, 1.0)


def test_epsilon_reproduces_the_published_dp_sgd_mnist_figures():
    """TF Privacy tutorials/README.md (Abadi et al. 2016's DP-SGD on MNIST, batch 256 of 60000, delta 1e-5):
    noise 1.12 / 60 epochs -> eps 2.92, 0.6 / 30 -> 9.74, 1.2 / 10 -> 1.20. Those figures use the classic RDP
    -> (eps, delta) conversion eps = min_a rdp(a) + log(1/delta)/(a - 1); opacus' RDP curve with that conversion
    must give them. ``privacy_spent`` uses opacus' tighter conversion, so it is a bit lower (noise 1.1, 60
    epochs: the classic 3.01, the "about 3" usually quoted, vs about 2.60)."""
    orders = RDPAccountant.DEFAULT_ALPHAS
    for sigma, epochs, published in [(1.12, 60, 2.92), (0.6, 30, 9.74), (1.2, 10, 1.20)]:
        steps = epochs * MNIST // BATCH
        rdp = compute_rdp(q=BATCH / MNIST, noise_multiplier=sigma, steps=steps, orders=orders)
        classic = min(r + math.log(1 / DELTA) / (a - 1) for r, a in zip(rdp, orders))
        assert abs(classic - published) < 0.02
        eps = privacy_spent(sigma, BATCH / MNIST, steps, DELTA)
        assert 0.75 * classic < eps <= classic  # the tighter conversion saves 10-25% here
    eps = privacy_spent(1.1, BATCH / MNIST, 60 * MNIST // BATCH, DELTA)
    assert 2.5 < eps < 3.01 and abs(eps - 2.597) < 0.01


def test_epsilon_grows_with_steps_and_rate_and_shrinks_with_noise():
    base = privacy_spent(1.0, 0.01, 1000, DELTA)
    assert privacy_spent(1.0, 0.01, 2000, DELTA) > base > privacy_spent(1.0, 0.01, 500, DELTA) > 0
    assert privacy_spent(2.0, 0.01, 1000, DELTA) < base < privacy_spent(1.0, 0.02, 1000, DELTA)
    assert privacy_spent(0.0, 0.01, 10, DELTA) == math.inf
    assert compose_epsilon([(1.0, 0.01, 600), (1.0, 0.01, 400)], DELTA) == pytest.approx(base)


def test_ledger_pools_one_batch_composes_steps_and_takes_the_max_over_disjoint_splits():
    sigma = GaussianMechanism(1.0, 1.2)
    ledger = PrivacyLedger()
    batch, other = torch.arange(0, 4), torch.arange(10, 14)
    for _ in range(10):  # per step: the same batch released twice (e.g. DARTS second order's train passes)
        ledger.release("a", "train", batch, sigma, 0.05)
        ledger.release("a", "train", batch, sigma, 0.05)
        ledger.release("a", "val", other, sigma, 0.05)
        ledger.end_step()
    pooled = privacy_spent(1.2 / math.sqrt(2), 0.05, 10, DELTA)
    assert ledger.history["a"]["train"] == [[pytest.approx(1.2 / math.sqrt(2)), 0.05, 10]]
    assert ledger.epsilon_amplified("a", DELTA) == pytest.approx(pooled)  # max(train, val): train's is larger
    assert pooled > privacy_spent(1.2, 0.05, 20, DELTA)  # reusing a batch costs more than fresh batches
    # no amplification: each of `batch`'s samples took part in 20 releases at sigma 1.2
    assert ledger.max_releases("a") == 20 and ledger.epsilon("a", DELTA) == pytest.approx(
        privacy_spent(1.2, 1.0, 20, DELTA)
    )
    ledger.release("b", "train", batch, None, 0.05)  # no mechanism: nothing is guaranteed
    ledger.release("c", "train", batch, GaussianMechanism(1.0, 1.0, per_sample=False, released_code=True), 0.05)
    ledger.end_step()
    for of in (ledger.epsilon, ledger.epsilon_amplified):
        assert of("b", DELTA) == math.inf and math.isnan(of("c", DELTA)) and of("nobody", DELTA) == 0.0
    restored = PrivacyLedger()
    restored.load(json.loads(json.dumps(ledger.state())))
    assert restored.state() == ledger.state() and restored.epsilon("a", DELTA) == ledger.epsilon("a", DELTA)
    assert restored.epsilon_amplified("a", DELTA) == ledger.epsilon_amplified("a", DELTA)


def test_the_headline_epsilon_counts_each_samples_releases_without_amplification():
    """Fixed-size batches from seeded shuffles whose ids every party sees: no subsampling amplification. 64 rows in
    batches of 16 for 10 steps: every sample is in 2 or 3 batches, so the headline is opacus' accountant at sample rate
    1 over 3 releases, far above the Poisson-amplified figure at rate 1/4 over 10 steps (what the ledger used to
    report)."""
    rows_, batch, steps, sigma = torch.arange(64), 16, 10, GaussianMechanism(1.0, 2.0)
    ledger = PrivacyLedger()
    counts = torch.zeros(64, dtype=torch.long)
    for step in range(steps):
        drawn = batch_at(rows_, batch, step, 0, "train")
        counts[drawn] += 1
        ledger.release("a", "train", drawn, sigma, batch / len(rows_))
        ledger.end_step()
    assert set(counts.tolist()) == {2, 3} and ledger.max_releases("a") == 3
    unamplified = RDPAccountant()
    unamplified.history = [(2.0, 1.0, 3)]
    assert ledger.epsilon("a", DELTA) == pytest.approx(float(unamplified.get_epsilon(DELTA)))
    assert ledger.epsilon_amplified("a", DELTA) == pytest.approx(privacy_spent(2.0, 0.25, steps, DELTA))
    assert ledger.epsilon("a", DELTA) > 1.5 * ledger.epsilon_amplified("a", DELTA)  # 4.01 vs 2.28
    # a second run on the same rows (the retraining) adds each sample's releases: 3 + 1 for the samples in both
    again = PrivacyLedger()
    most = int(torch.argmax(counts))
    again.release("a", "train", torch.tensor([most]), GaussianMechanism(1.0, 1.0), 1 / 64)
    again.end_step()
    assert epsilon_of([ledger, again], "a", DELTA) == pytest.approx(gaussian_epsilon(3 / 2.0**2 + 1.0, DELTA))
    assert gaussian_epsilon(3 / 2.0**2 + 1.0, DELTA) == pytest.approx(privacy_spent((3 / 4 + 1) ** -0.5, 1.0, 1, DELTA))


@pytest.mark.parametrize(
    "history", [[(1.0, 0.01, 1000)], [(0.7, 0.05, 40), (1.3, 0.02, 7), (0.7, 0.05, 3)], [(2.0, 1.0, 5)]]
)
def test_cached_composition_is_opacus_rdp_accountant_exactly(history):
    accountant = RDPAccountant()
    accountant.history = list(history)
    assert compose_epsilon(history, DELTA) == float(accountant.get_epsilon(DELTA))
