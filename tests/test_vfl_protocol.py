"""SS-VFNAS split learning: what crosses the channel, gradient equivalence, DP bounds, message counts, resume."""

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from fedrepro.data.vertical import VerticalDataset
from fedrepro.errors import DataError
from fedrepro.vfl.privacy import GaussianMechanism
from fedrepro.vfl.protocol import Party, VerticalProtocol, parties_from_vertical
from fedrepro.vfl.search import DartsSearch, MiLeNASSearch, Searchable, load_state, make_optimizers, save_state
from toy import TinySearchable

N, D_OUT, CLASSES, BATCH = 64, 4, 3, 16
DIMS = [3, 4, 5]
TRAIN, VAL = torch.arange(0, 32), torch.arange(32, 64)
SETUPS = [(2, 1), (3, 0)]  # (K, label party): digits-halves style and the released code's layout


def build(k, label, seed=0, init_seed=0, forward=None, backward=None, dtype=torch.float32):
    data = torch.Generator().manual_seed(seed)
    x = torch.randn(N, sum(DIMS[:k]), generator=data, dtype=dtype) * 3
    y = torch.randint(0, CLASSES, (N,), generator=data)
    torch.manual_seed(init_seed)
    edges = [0, *torch.cumsum(torch.tensor(DIMS[:k]), 0).tolist()]
    parties = [
        Party(
            j,
            x[:, edges[j] : edges[j + 1]].clone(),
            TinySearchable(DIMS[j], D_OUT).to(dtype),
            labels=y if j == label else None,
            top=nn.Linear(k * D_OUT, CLASSES).to(dtype) if j == label else None,
        )
        for j in range(k)
    ]
    return VerticalProtocol(
        parties,
        forward_mechanisms=forward,
        backward_mechanism=backward,
        seed=seed,
        split_sizes={"train": len(TRAIN), "val": len(VAL)},
    )


RULES = {
    "darts1": lambda P, w, a: DartsSearch(P, w, a),
    "darts2": lambda P, w, a: DartsSearch(P, w, a, second_order=True),
    "darts2_fixed_r": lambda P, w, a: DartsSearch(P, w, a, second_order=True, global_norm=False),
    "milenas": lambda P, w, a: MiLeNASSearch(P, w, a),
    "milenas_unbundled": lambda P, w, a: MiLeNASSearch(P, w, a, bundle=False),
}


def searcher(rule, protocol):
    return RULES[rule](protocol, *make_optimizers(protocol))


def test_bottoms_are_searchable_and_only_the_label_party_has_labels():
    protocol = build(3, 0)
    assert all(isinstance(p.bottom, Searchable) for p in protocol.parties)
    parties = protocol.parties
    with pytest.raises(ValueError, match="exactly one party holds the labels"):
        VerticalProtocol(
            [parties[0], Party(1, parties[1].features, parties[1].bottom, labels=parties[0].labels), parties[2]]
        )
    with pytest.raises(ValueError, match="top network"):
        VerticalProtocol(
            [parties[0], Party(1, parties[1].features, parties[1].bottom, top=nn.Linear(2, 2)), parties[2]]
        )


def test_parties_from_a_vertical_dataset_keep_their_own_columns():
    ids = pd.Series([7, 3, 5], name="sample_id")
    frames = [
        pd.concat([ids, pd.DataFrame({"a": [1.0, 2.0, 3.0]})], axis=1),
        pd.concat([ids, pd.DataFrame({"b": [4.0, 5.0, 6.0], "c": [0.0, 1.0, 0.0]})], axis=1),
    ]
    ds = VerticalDataset("tiny", frames, np.array([0, 1, 1]), 1, "classification")
    parties = parties_from_vertical(ds, [nn.Linear(1, 2), nn.Linear(2, 2)], nn.Linear(4, 2))
    assert [p.features.shape for p in parties] == [(3, 1), (3, 2)]
    assert torch.equal(parties[1].features[:, 0], torch.tensor([4.0, 5.0, 6.0]))
    assert (
        parties[0].labels is None and parties[0].top is None and torch.equal(parties[1].labels, torch.tensor([0, 1, 1]))
    )
    VerticalProtocol(parties)
    frames[1] = frames[1].iloc[[1, 0, 2]].reset_index(drop=True)
    with pytest.raises(DataError, match="not aligned"):
        parties_from_vertical(
            VerticalDataset("tiny", frames, np.array([0, 1, 1]), 1, "classification"),
            [nn.Linear(1, 2), nn.Linear(2, 2)],
            nn.Linear(4, 2),
        )


@pytest.mark.parametrize("k,label", SETUPS)
@pytest.mark.parametrize("rule", ["darts1", "darts2", "milenas"])
def test_no_party_receives_raw_features_labels_or_alphas(k, label, rule):
    """From the channel's records: the label party only receives other parties' activations, every other
    party only its own gradient (second-order DARTS adds one scalar norm each way); all messages go through
    the label party; and every message is exactly the size of a batch of activations (nothing rides along)."""
    protocol = build(k, label, forward=GaussianMechanism(5.0, 0.5), backward=GaussianMechanism(0.2, 0.5))
    searcher(rule, protocol).run(TRAIN, VAL, BATCH, steps=2)
    protocol.evaluate(VAL, batch_size=32, split="val")
    hub = f"party_{label}"
    for channel, rows in ((protocol.channel, BATCH), (protocol.eval_channel, 32)):
        assert channel.messages
        for m in channel.messages:
            assert hub in (m.sender, m.receiver) and m.sender != m.receiver
            if all(n.startswith("gradnorm/") for n in m.names):
                assert rule == "darts2" and m.nbytes == 4  # one float32 scalar
            else:
                assert m.nbytes == len(m.names) * rows * D_OUT * 4
        for j in range(k):
            received = channel.names_received(f"party_{j}")
            if j == label:
                allowed = {f"activation/party_{i}/{s}" for i in range(k) if i != label for s in ("train", "val")}
                allowed |= {f"gradnorm/party_{i}" for i in range(k) if i != label} if rule == "darts2" else set()
            else:
                allowed = {f"gradient/party_{j}/train", f"gradient/party_{j}/val"}
                allowed |= {"gradnorm/total"} if rule == "darts2" else set()
            assert received <= allowed, (j, received - allowed)
            assert received or (channel is protocol.eval_channel and j != label)  # evaluation sends nothing back
            assert all(n.startswith(("activation/", "gradient/", "gradnorm/")) for n in received)


@pytest.mark.parametrize("k,label", SETUPS)
def test_split_training_gives_the_gradients_of_the_unsplit_model(k, label):
    protocol = build(k, label)
    bottoms = [copy.deepcopy(p.bottom) for p in protocol.parties]
    top = copy.deepcopy(protocol.parties[label].top)
    batch = TRAIN[:BATCH]
    protocol.train_step(batch, update=False)

    acts = [b(p.features[batch]) for b, p in zip(bottoms, protocol.parties)]
    F.cross_entropy(top(torch.cat(acts, dim=1)), protocol.parties[label].labels[batch]).backward()
    for party, bottom in zip(protocol.parties, bottoms):
        reference = bottom.weight_parameters() + bottom.arch_parameters()
        if party.index == label:
            reference += list(top.parameters())
            mine = party.bottom.weight_parameters() + party.bottom.arch_parameters() + list(party.top.parameters())
        else:
            mine = party.parameters()
        for p, q in zip(mine, reference, strict=True):
            assert p.grad is not None and q.grad.abs().sum() > 0
            assert torch.allclose(p.grad, q.grad, atol=1e-6), party.name


@pytest.mark.parametrize("k,label", SETUPS)
def test_delivered_activations_and_gradients_respect_the_clip(k, label):
    batch = TRAIN[:BATCH]
    plain = build(k, label)
    p = plain.forward({"train": batch})
    plain.backward(p)
    assert max(p.received["train"][j].norm(dim=1).max() for j in plain.others) > 0.3  # the clip will bind
    assert max(p.delivered_gradients["train"][j].norm(dim=1).max() for j in plain.others) > 1e-3

    dp = build(k, label, forward=GaussianMechanism(0.3, 0.0), backward=GaussianMechanism(1e-3, 0.0))
    q = dp.forward({"train": batch})
    dp.backward(q)
    for j in dp.others:
        assert (q.received["train"][j].norm(dim=1) <= 0.3).all()
        assert (q.delivered_gradients["train"][j].norm(dim=1) <= 1e-3).all()
        # clipping rescales each row, it does not change its direction
        assert torch.allclose(
            F.cosine_similarity(q.received["train"][j], p.received["train"][j]), torch.ones(BATCH), atol=1e-5
        )


@pytest.mark.parametrize("k,label", SETUPS)
def test_what_the_channel_delivers_is_the_clipped_value_plus_noise_of_std_sigma_times_clip(k, label):
    """With sigma > 0 every delivered embedding and gradient differs from its clipped value by fresh Gaussian noise of
    std sigma * C (a protocol that clipped and forgot the noise would pass the sigma = 0 clip test above)."""
    forward, backward = GaussianMechanism(0.5, 2.0), GaussianMechanism(0.05, 1.5)
    protocol = build(k, label, forward=forward, backward=backward)
    rows = torch.arange(N)
    p = protocol.forward({"train": rows, "val": rows})
    exact = {
        s: dict(
            zip(
                protocol.others,
                torch.autograd.grad(p.losses[s], [p.received[s][j] for j in protocol.others], retain_graph=True),
            )
        )
        for s in p.batches
    }
    protocol.backward(p)
    noises = []
    for mechanism, delivered, clean in ((forward, p.received, p.outputs), (backward, p.delivered_gradients, exact)):
        for s in p.batches:
            for j in protocol.others:
                noise = delivered[s][j].detach() - mechanism.clip_tensor(clean[s][j].detach())
                assert abs(float(noise.std()) / mechanism.noise_std - 1) < 0.25, (s, j, float(noise.std()))
                assert abs(float(noise.mean())) < 0.25 * mechanism.noise_std
                noises.append(noise.flatten())
    # a fresh draw for every party, split and direction: no two releases share their noise
    for a in range(len(noises)):
        for b in range(a + 1, len(noises)):
            if len(noises[a]) == len(noises[b]):
                assert abs(float(torch.corrcoef(torch.stack([noises[a], noises[b]]))[0, 1])) < 0.3


@pytest.mark.parametrize("k,label", SETUPS)
def test_the_label_party_alone_reads_only_its_own_rows_and_sends_nothing(k, label):
    protocol = build(k, label, forward=GaussianMechanism(5.0, 1.0))
    hub = protocol.parties[label]
    with torch.no_grad():
        own = hub.bottom(hub.features[VAL])
        d = own.shape[1]
        logits = own @ hub.top.weight[:, label * d : (label + 1) * d].T + hub.top.bias
    expected = float((logits.argmax(dim=1) == hub.labels[VAL]).float().mean())
    for party in protocol.parties:  # the other parties' rows are never read
        if party.index != label:
            party.features = torch.full_like(party.features, math.nan)
    assert protocol.evaluate_label_party_alone(VAL, batch_size=10) == pytest.approx(expected)
    assert not protocol.channel.messages and not protocol.eval_channel.messages and protocol.ledger.history == {}


@pytest.mark.parametrize("k,label", SETUPS)
def test_messages_per_step_match_the_stated_counts(k, label):
    """Per step, with S = K-1 senders: DARTS 1st order 4S msgs / 4 exchanges; 2nd order 12S / 12 (10S / 10
    with a fixed radius); MiLeNAS 2S / 2 (4S / 4 unbundled)."""
    s = k - 1
    expected = {
        "darts1": (4 * s, 4),
        "darts2": (12 * s, 12),
        "darts2_fixed_r": (10 * s, 10),
        "milenas": (2 * s, 2),
        "milenas_unbundled": (4 * s, 4),
    }
    activation_bytes = BATCH * D_OUT * 4
    costs = {}
    for rule, (messages, exchanges) in expected.items():
        protocol = build(k, label)
        search = searcher(rule, protocol)
        assert (search.messages_per_step(), search.exchanges_per_step()) == (messages, exchanges)
        search.run(TRAIN, VAL, BATCH, steps=2)
        for step in (0, 1):
            costs[rule] = protocol.step_cost(step)
            assert costs[rule]["messages"] == messages and costs[rule]["exchanges"] == exchanges, rule
    assert (
        costs["milenas"]["bytes"]
        == costs["milenas_unbundled"]["bytes"]
        == costs["darts1"]["bytes"]
        == 4 * s * activation_bytes
    )
    assert costs["darts2"]["bytes"] == 10 * s * activation_bytes + 2 * s * 4
    assert costs["milenas"]["exchanges"] < costs["darts1"]["exchanges"] < costs["darts2"]["exchanges"]


def test_bundled_milenas_equals_two_sequential_passes():
    a, b = build(3, 0), build(3, 0)
    searcher("milenas", a).run(TRAIN, VAL, BATCH, steps=3)
    searcher("milenas_unbundled", b).run(TRAIN, VAL, BATCH, steps=3)
    for pa, pb in zip(a.parties, b.parties):
        for x, y in zip(pa.parameters(), pb.parameters(), strict=True):
            assert torch.equal(x, y)


def test_second_order_darts_matches_the_exact_unrolled_hypergradient():
    """The finite-difference alpha gradient vs autograd through w' = w - xi grad_w L_train on the unsplit model."""
    xi = 0.5
    protocol = build(3, 0, dtype=torch.float64)
    search = DartsSearch(protocol, *make_optimizers(protocol), second_order=True, xi=xi)
    train, val = TRAIN[:BATCH], VAL[:BATCH]
    model = nn.ModuleDict({f"b{p.index}": p.bottom for p in protocol.parties} | {"top": protocol.parties[0].top})
    labels = protocol.parties[0].labels

    def loss(params, batch):
        acts = [
            functional_call(
                model[f"b{p.index}"],
                {k[len(f"b{p.index}.") :]: v for k, v in params.items() if k.startswith(f"b{p.index}.")},
                (p.features[batch],),
            )
            for p in protocol.parties
        ]
        top = functional_call(
            model["top"], {k[4:]: v for k, v in params.items() if k.startswith("top.")}, (torch.cat(acts, 1),)
        )
        return F.cross_entropy(top, labels[batch])

    params = dict(model.named_parameters())
    arch = {k: v for k, v in params.items() if k.endswith("alpha")}
    weights = {k: v for k, v in params.items() if k not in arch}
    g = torch.autograd.grad(loss(params, train), list(weights.values()), create_graph=True)
    unrolled = {k: w - xi * gw for (k, w), gw in zip(weights.items(), g)} | arch
    exact = torch.autograd.grad(loss(unrolled, val), list(arch.values()))
    first_order = torch.autograd.grad(loss(params, val), list(arch.values()))

    before = {k: v.detach().clone() for k, v in weights.items()}
    approx, _ = search._unrolled_arch_grads(train, val)
    approx = [a for party in approx for a in party]  # party order b0, b1, b2 = model order
    for e, a, f in zip(exact, approx, first_order, strict=True):
        assert torch.allclose(a, e, rtol=1e-3, atol=1e-7)  # central difference: error ~ r^2 (1.5e-4 at r = 0.01)
        assert not torch.allclose(f, e, rtol=1e-2)  # the second-order term matters here
    assert all(torch.equal(before[k], v) for k, v in model.named_parameters() if k in before)  # w restored


def _snapshot(search):
    protocol = search.protocol
    return {
        "params": [
            {k: v.clone() for m in p.modules().values() for k, v in m.state_dict().items()} for p in protocol.parties
        ],
        "optimizers": [o.state_dict() for o in search.weight_optimizers + search.arch_optimizers],
        "messages": list(protocol.channel.messages),
        "eval_messages": list(protocol.eval_channel.messages),
        "ledger": copy.deepcopy(protocol.ledger.state()),
        "history": copy.deepcopy(search.history),
        "step": protocol.step,
    }


def _assert_same(x, y):
    if isinstance(x, torch.Tensor):
        assert torch.equal(x, y)
    elif isinstance(x, dict):
        assert x.keys() == y.keys()
        for key in x:
            _assert_same(x[key], y[key])
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y)
        for a, b in zip(x, y):
            _assert_same(a, b)
    else:
        assert x == y


@pytest.mark.parametrize("rule", ["darts1", "darts2", "milenas"])
def test_resume_after_a_kill_is_bit_identical(tmp_path, rule):
    dp = {"forward": GaussianMechanism(5.0, 0.3), "backward": GaussianMechanism(0.2, 0.3)}
    straight = searcher(rule, build(3, 0, **dp))
    straight.run(TRAIN, VAL, BATCH, steps=3)
    straight.protocol.evaluate(VAL, batch_size=32, split="val")
    straight.run(TRAIN, VAL, BATCH, steps=6)

    first = searcher(rule, build(3, 0, **dp))
    first.run(TRAIN, VAL, BATCH, steps=3)
    first.protocol.evaluate(VAL, batch_size=32, split="val")
    save_state(tmp_path / "ckpt", first)
    del first
    resumed = searcher(rule, build(3, 0, init_seed=99, **dp))  # fresh objects, different initial weights
    load_state(tmp_path / "ckpt", resumed)
    resumed.run(TRAIN, VAL, BATCH, steps=6)

    _assert_same(_snapshot(straight), _snapshot(resumed))
    assert len(straight.history) == 6 and straight.protocol.step == 6


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path):
    first = searcher("darts1", build(2, 1))
    first.run(TRAIN, VAL, BATCH, steps=1)
    save_state(tmp_path / "ckpt", first)
    with pytest.raises(ValueError, match="was written by"):
        load_state(tmp_path / "ckpt", searcher("milenas", build(2, 1)))


def test_released_code_fidelity_batch_level_clip_and_std_sigma():
    """The authors' add_dp_to_list: one factor for the whole batch from its largest row norm (a small row is
    shrunk too), noise std = sigma whatever the clip, and no accounting."""
    x = torch.tensor([[0.3, 0.4], [0.0, 4.0], [2.0, 0.0]])  # row norms 0.5, 4, 2
    released = GaussianMechanism(1.0, 0.0, per_sample=False, released_code=True)
    out = released.apply(x, torch.Generator().manual_seed(0))
    assert out.norm(dim=1).max() <= 1.0 + 1e-6  # float32: clip / (clip + 1e-6) can round up by an ulp
    assert torch.allclose(out, x / 4.0, rtol=1e-5)  # one factor for every row: largest norm / clip
    assert abs(float(out[0].norm()) - 0.125) < 1e-5  # shrunk by 4; per-sample clipping leaves it alone
    per_sample = GaussianMechanism(1.0, 0.0).apply(x, torch.Generator().manual_seed(0))
    assert torch.allclose(per_sample[0], x[0])

    noisy = GaussianMechanism(100.0, 0.1, per_sample=False, released_code=True)
    noise = noisy.apply(torch.zeros(4000, 50), torch.Generator().manual_seed(1))
    assert abs(float(noise.std()) - 0.1) < 0.003  # std = sigma, not sigma * clip = 10

    whole = GaussianMechanism(1.0, 0.0, per_sample=False).apply(x, torch.Generator().manual_seed(0))
    assert whole.norm() <= 1.0  # textbook batch-level clipping: the whole batch's norm
    with pytest.raises(ValueError):
        GaussianMechanism(1.0, 1.0, per_sample=True, released_code=True)

    protocol = build(2, 1, forward=noisy, backward=GaussianMechanism(0.2, 0.1, per_sample=False, released_code=True))
    searcher("milenas", protocol).run(TRAIN, VAL, BATCH, steps=1)
    assert all(math.isnan(e) for e in protocol.epsilon(1e-5).values())


def test_epsilon_is_reported_and_grows_with_steps():
    protocol = build(3, 0, forward=GaussianMechanism(5.0, 1.0), backward=GaussianMechanism(0.2, 1.0))
    search = searcher("darts1", protocol)
    search.run(TRAIN, VAL, BATCH, steps=2)
    early = protocol.epsilon(1e-5)
    search.run(TRAIN, VAL, BATCH, steps=4)
    late = protocol.epsilon(1e-5)
    assert all(0 < early[p] < late[p] < math.inf for p in early)
    assert late["party_0"] > late["party_1"]  # the label party answers K-1 = 2 gradients per pass
    plain = build(2, 1)
    plain.train_step(TRAIN[:BATCH])
    assert all(math.isinf(e) for e in plain.epsilon(1e-5).values())  # no noise: no guarantee


def test_evaluate_can_leave_test_rows_out_of_the_ledger_and_return_predictions():
    protocol = build(2, 1, forward=GaussianMechanism(5.0, 1.0), backward=GaussianMechanism(0.2, 1.0))
    measured = protocol.evaluate(VAL, batch_size=20, split="test", account=False, predictions=True)
    assert protocol.ledger.history == {} and protocol.evaluations == 1
    assert measured["predicted"].shape == (len(VAL),)
    labels = protocol.parties[1].labels[VAL]
    assert (measured["predicted"] == labels).float().mean().item() == pytest.approx(measured["accuracy"])
    protocol.evaluate(VAL, batch_size=20, split="test")
    assert protocol.ledger.history["party_0"]["test"] == [[1.0, 1.0, 1]]
    assert protocol.ledger.max_releases("party_0") == 1 and set(protocol.ledger.participation["party_0"]) == set(
        VAL.tolist()
    )


def test_split_training_of_fixed_networks_costs_one_pass_a_step_and_resumes(tmp_path):
    from fedrepro.vfl.search import SplitTraining, batch_at

    def fixed(k=2, init_seed=0):
        protocol = build(k, 1, init_seed=init_seed)
        for party in protocol.parties:  # freeze the alphas: a derived network has none
            party.bottom.alpha.requires_grad_(False)
            party.bottom.arch_parameters = lambda: []
        weights, _ = make_optimizers(protocol)
        return SplitTraining(protocol, weights, [None] * k)

    straight = fixed()
    for step in range(4):
        straight.step(batch_at(TRAIN, BATCH, step, 0, "train"))
    assert straight.messages_per_step() == 2 and straight.protocol.step_cost(0)["messages"] == 2
    first = fixed()
    for step in range(2):
        first.step(batch_at(TRAIN, BATCH, step, 0, "train"))
    save_state(tmp_path / "ckpt", first)
    resumed = fixed(init_seed=7)
    load_state(tmp_path / "ckpt", resumed)
    for step in range(2, 4):
        resumed.step(batch_at(TRAIN, BATCH, step, 0, "train"))
    for a, b in zip(straight.protocol.parties, resumed.protocol.parties):
        for x, y in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(x, y)
    assert [r["loss_train"] for r in straight.history] == [r["loss_train"] for r in resumed.history]
    assert all(math.isfinite(r["loss_train"]) for r in straight.history)
