"""ESIM and RE2: the pair split, masking (padding, empty sides) and that they learn a trivial matching task."""

import pytest
import torch

from fedrepro.errors import ConfigError
from fedrepro.models.matchers import ESIM, MATCHERS, RE2, MatcherSpec, build_matcher, split_pair

PAD, CLS, SEP = 0, 1, 2
SPEC = MatcherSpec(vocab_size=50, pad_id=PAD, cls_id=CLS, sep_id=SEP, embedding_dim=16, hidden=16, dropout=0.0)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and a second thread fighting other processes makes them 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def encode(pairs, length=None):
    """BERT-style ``[CLS] q [SEP] a [SEP]`` batches, right-padded to ``length``."""
    rows = [([CLS, *q, SEP] + [*a, SEP], [0] * (len(q) + 2) + [1] * (len(a) + 1)) for q, a in pairs]
    length = length or max(len(ids) for ids, _ in rows)

    def pad(xs):
        return torch.tensor([x + [0] * (length - len(x)) for x in xs])

    return {
        "input_ids": pad([ids for ids, _ in rows]),
        "attention_mask": pad([[1] * len(ids) for ids, _ in rows]),
        "token_type_ids": pad([types for _, types in rows]),
    }


def make(name, seed=0):
    torch.manual_seed(seed)
    return build_matcher(name, SPEC)


def test_split_pair_left_aligns_each_side_and_drops_specials_and_padding():
    input_ids = torch.tensor(
        [
            [CLS, 5, 6, SEP, 7, 8, 9, SEP],
            [CLS, 5, SEP, 7, SEP, 3, 3, 0],  # padding with stray ids and answer types
            [CLS, 5, 6, 7, SEP, SEP, 0, 0],
        ]
    )  # answer truncated away
    attention_mask = torch.tensor([[1] * 8, [1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0]])
    token_type_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1, 0, 0]])
    q, q_mask, a, a_mask = split_pair(input_ids, attention_mask, token_type_ids, CLS, SEP)
    assert q.tolist() == [[5, 6, 0], [5, 0, 0], [5, 6, 7]]
    assert q_mask.tolist() == [[True, True, False], [True, False, False], [True, True, True]]
    assert a.tolist() == [[7, 8, 9], [7, 0, 0], [0, 0, 0]]
    assert a_mask.tolist() == [[True, True, True], [True, False, False], [False, False, False]]


@pytest.mark.parametrize("build", [ESIM, RE2, lambda spec: RE2(spec, blocks=3)], ids=["esim", "re2", "re2-3blocks"])
def test_shapes_and_no_nan_with_an_empty_answer(build):
    torch.manual_seed(0)
    model = build(SPEC)
    batch = encode([([5, 6, 7], [8, 9]), ([5], [])])
    scores, features = model(**batch)
    assert scores.shape == (2,) and scores.dtype == torch.float32
    assert features.shape[0] == 2 and features.dim() == 2
    scores.sum().backward()
    assert torch.isfinite(scores).all() and torch.isfinite(features).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", MATCHERS)
def test_scores_ignore_padding_and_batch_mates(name):
    model = make(name).eval()
    pair = ([5, 6, 7], [8, 9])
    with torch.no_grad():
        alone = model(**encode([pair]))[0]
        padded = model(**encode([pair], length=16))[0]
        with_longer = model(**encode([pair, ([10, 11, 12, 13, 14], [15, 16, 17, 18, 19, 20])]))[0]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(with_longer[:1], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", MATCHERS)
def test_score_depends_on_the_answer(name):
    model = make(name).eval()
    with torch.no_grad():
        scores = model(**encode([([5, 6, 7], [8, 9]), ([5, 6, 7], [8, 30])]))[0]
    assert (scores[0] - scores[1]).abs() > 1e-4


def synthetic_pairs(n=16, seed=0):
    """Positives share a token with the question, negatives share none."""
    g = torch.Generator().manual_seed(seed)
    positives, negatives = [], []
    for _ in range(n):
        tokens = (torch.randperm(47, generator=g)[:8] + 3).tolist()
        question = tokens[:3]
        positives.append((question, [tokens[3], question[int(torch.randint(3, (1,), generator=g))], tokens[4]]))
        negatives.append((question, tokens[5:8]))
    return encode(positives), encode(negatives)


@pytest.mark.parametrize("name", MATCHERS)
def test_a_few_adam_steps_lower_the_pairwise_hinge_loss(name):
    model = make(name)
    positives, negatives = synthetic_pairs()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def hinge():
        return torch.relu(1 - model(**positives)[0] + model(**negatives)[0]).mean()

    with torch.no_grad():
        before = hinge().item()
    for _ in range(25):
        optimizer.zero_grad()
        hinge().backward()
        optimizer.step()
    with torch.no_grad():
        after = hinge().item()
    assert after < 0.5 * before


def test_unknown_matcher_names_the_param_and_the_allowed_names():
    with pytest.raises(ConfigError, match=r"matcher 'bimpm'.*esim.*re2"):
        build_matcher("bimpm", SPEC)
