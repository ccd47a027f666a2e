"""Label-skew client splits for FedCMC: every sample once, one share table for all splits, skew that follows alpha,
a bounded redraw loop, the balance trick, Table 3 subsets, count tables and the heat-map."""

import numpy as np
import pandas as pd
import pytest

from fedrepro.data import label_skew
from fedrepro.data.label_skew import (
    SCHEMES,
    client_class_counts,
    client_proportions,
    partition_corpus,
    split_by_proportions,
    skew_statistic,
    subsample_train,
)
from fedrepro.errors import DataError
from fedrepro.report.figures import partition_heatmap

CLASSES = [f"rel{c}" for c in range(5)]
SIZES = {"train": 600, "valid": 100, "test": 100}


@pytest.fixture(scope="module")
def table():
    """800 sentences over 5 Zipf-skewed classes (p_c proportional to 1/(c+1)), split 600/100/100."""
    rng = np.random.default_rng(0)
    p = 1 / np.arange(1, 6)
    rows = [
        (f"{split}-{i:03d}", "text", CLASSES[rng.choice(5, p=p / p.sum())], split)
        for split, n in SIZES.items()
        for i in range(n)
    ]
    return pd.DataFrame(rows, columns=["sentence_id", "text", "label", "split"]).sample(frac=1, random_state=1)


def class_totals(frame, split):
    return frame[frame["split"] == split]["label"].value_counts().reindex(CLASSES, fill_value=0)


def expected_counts(shares, n):
    """The cut rule written out again: floor of cumulative share * n, the last cut at n."""
    cuts = np.floor(np.cumsum(shares) * n + 1e-9).astype(int)
    cuts[-1] = n
    return np.diff(cuts, prepend=0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_sample_once_with_the_same_shares_on_every_split(table, scheme):
    assignment, proportions = partition_corpus(table, 4, scheme, 0.3, seed=5)
    assert list(assignment.columns) == ["sentence_id", "label", "split", "client"]
    assert assignment["sentence_id"].tolist() == table["sentence_id"].tolist()  # one row per sentence, input order
    assert assignment["client"].notna().all()
    assert list(proportions.index) == ["client_00", "client_01", "client_02", "client_03"]
    assert list(proportions.columns) == CLASSES
    assert np.allclose(proportions.sum(axis=0), 1.0)
    for split in SIZES:
        counts = client_class_counts(assignment, split)
        assert counts[CLASSES].sum(axis=0).tolist() == class_totals(table, split).tolist()
        assert counts["total"].sum() == SIZES[split]
        for c in CLASSES:  # the train shares, applied to this split's own class total
            want = expected_counts(proportions[c].to_numpy(), class_totals(table, split)[c])
            assert counts[c].tolist() == want.tolist(), (split, c)


def test_split_by_proportions_alone():
    labels = np.array(["a"] * 7 + ["b"] * 5)
    shares = pd.DataFrame({"a": [0.5, 0.5, 0.0], "b": [0.2, 0.2, 0.6]})
    client = split_by_proportions(labels, shares, seed=3)
    assert client.dtype.kind == "i" and client.shape == (12,)
    assert np.bincount(client[labels == "a"], minlength=3).tolist() == [3, 4, 0]
    assert np.bincount(client[labels == "b"], minlength=3).tolist() == [1, 1, 3]
    assert np.array_equal(client, split_by_proportions(pd.Series(labels), shares, seed=3))
    other = split_by_proportions(labels, shares, seed=4)  # same counts, other samples: the cut follows a shuffle
    assert not np.array_equal(client, other) and np.array_equal(np.bincount(client), np.bincount(other))
    with pytest.raises(DataError, match="'zzz'"):
        split_by_proportions(np.array(["a", "zzz"]), shares, seed=3)


def test_iid_cuts_are_exact_and_the_minimum_uses_them():
    ten = client_proportions({"a": 10}, 10, "iid", 1.0, seed=0)
    assert np.bincount(split_by_proportions(np.array(["a"] * 10), ten, seed=0)).tolist() == [1] * 10  # 0.1 * 8 != 0.8
    # two clients, three classes of 3: the floor cut gives client_00 1 of each class (3 in all), client_01 6
    counts = {"a": 3, "b": 3, "c": 3}
    halves = client_proportions(counts, 2, "iid", 1.0, seed=0, min_size=3)
    labels = np.repeat(["a", "b", "c"], 3)
    assert np.bincount(split_by_proportions(labels, halves, seed=0)).tolist() == [3, 6]
    with pytest.raises(DataError, match="min_size=4"):  # 4.5 each by share, but the split gives client_00 only 3
        client_proportions(counts, 2, "iid", 1.0, seed=0, min_size=4)


def test_same_seed_same_split_other_seed_other_split(table):
    a, pa = partition_corpus(table, 5, "dirichlet", 0.5, seed=11)
    b, pb = partition_corpus(table, 5, "dirichlet", 0.5, seed=11)
    c, pc = partition_corpus(table, 5, "dirichlet", 0.5, seed=12)
    assert a.equals(b) and np.array_equal(pa.to_numpy(), pb.to_numpy())
    assert not a["client"].equals(c["client"]) and not np.array_equal(pa.to_numpy(), pc.to_numpy())
    counts = {c: 10 for c in CLASSES}
    assert client_proportions(counts, 3, "quantity", 1.0, 4).equals(client_proportions(counts, 3, "quantity", 1.0, 4))


def mean_skew(table, scheme, alpha):
    return np.mean(
        [skew_statistic(client_class_counts(partition_corpus(table, 5, scheme, alpha, seed)[0])) for seed in range(5)]
    )


def test_smaller_alpha_more_skew(table):
    tiny, half, large = (mean_skew(table, "dirichlet", a) for a in (0.05, 0.5, 100.0))
    assert tiny > half > large
    assert large < 0.1 and mean_skew(table, "iid", 1.0) < 0.02
    quantity = partition_corpus(table, 5, "quantity", 0.3, seed=0)[0]
    sizes = client_class_counts(quantity)["total"]
    assert sizes.max() > 2 * sizes.min()  # sizes skewed ...
    assert skew_statistic(client_class_counts(quantity)) < 0.05  # ... labels not


def test_skew_statistic_extremes():
    assert skew_statistic(pd.DataFrame({"a": [5, 10], "b": [5, 10], "total": [10, 20]})) == 0.0
    # two pure clients against a 50/50 pool: each at JS distance sqrt(JSD([1, 0], [.5, .5])) in base 2
    jsd = (np.log2(1 / 0.75) + 0.5 * np.log2(0.5 / 0.75) + 0.5 * np.log2(0.5 / 0.25)) / 2
    assert skew_statistic(pd.DataFrame({"a": [10, 0], "b": [0, 10]})) == pytest.approx(np.sqrt(jsd))
    assert skew_statistic(pd.DataFrame({"a": [10, 0], "b": [0, 30]})) > skew_statistic(
        pd.DataFrame({"a": [10, 5], "b": [5, 30]})
    )


def test_minimum_size_met_exactly_or_refused_after_max_tries(table, monkeypatch):
    assignment, _ = partition_corpus(table, 5, "dirichlet", 0.3, seed=0, min_size=90)
    assert client_class_counts(assignment)["total"].min() >= 90  # the check counts what the split gives

    calls = []
    draw = label_skew._draw_proportions
    monkeypatch.setattr(label_skew, "_draw_proportions", lambda *a: calls.append(1) or draw(*a))
    counts = class_totals(table, "train").to_dict()
    with pytest.raises(DataError, match=r"max_tries=7.*min_size=50.*alpha=0\.01.*n_clients=10.*'rel0': \d+") as err:
        client_proportions(counts, 10, "dirichlet", 0.01, seed=0, min_size=50, max_tries=7)
    assert len(calls) == 7 and "raise alpha" in str(err.value)
    calls.clear()
    with pytest.raises(DataError, match=r"min_size=61.*n_clients=10.*600 training samples"):
        client_proportions(counts, 10, "dirichlet", 0.01, seed=0, min_size=61)
    assert not calls  # impossible on its face: refused before any draw


@pytest.mark.parametrize(
    "kwargs, word", [({"scheme": "shards"}, "scheme"), ({"alpha": 0.0}, "alpha"), ({"n_clients": 0}, "n_clients")]
)
def test_bad_parameters(kwargs, word):
    args = {"class_counts": {"a": 10}, "n_clients": 2, "scheme": "dirichlet", "alpha": 1.0, "seed": 0} | kwargs
    with pytest.raises(DataError, match=word):
        client_proportions(**args)


def test_balance_trick_caps_client_size(table):
    n, k = SIZES["train"], 5
    biggest = class_totals(table, "train").max()
    plain, balanced = [], []
    for seed in range(8):
        for flag, out in ((False, plain), (True, balanced)):
            out.append(
                client_class_counts(partition_corpus(table, k, "dirichlet", 0.1, seed, balance=flag)[0])["total"].max()
            )
    # a client below N/K takes at most one whole class before it is closed, so it ends below N/K + the largest class
    assert max(balanced) < n / k + biggest
    assert np.mean(balanced) < np.mean(plain)


def test_subsample_train(table):
    balanced = subsample_train(table, 250, "balanced", seed=0)
    assert class_totals(balanced, "train").tolist() == [50] * 5
    for split in ("valid", "test"):
        assert balanced[balanced["split"] == split].equals(table[table["split"] == split])
    assert balanced.index.tolist() == [i for i in table.index if i in set(balanced.index)]  # input order kept
    natural = subsample_train(table, 101, "natural", seed=0)
    got, have = class_totals(natural, "train"), class_totals(table, "train")
    assert got.sum() == 101 and (abs(got - 101 * have / 600) < 1).all()
    assert subsample_train(table, 101, "natural", seed=0).equals(natural)
    assert not subsample_train(table, 101, "natural", seed=1).equals(natural)
    with pytest.raises(DataError, match="divisible"):
        subsample_train(table, 251, "balanced", seed=0)
    smallest = have.idxmin()
    with pytest.raises(DataError, match=f"'{smallest}': {have.min()}"):
        subsample_train(table, 5 * (have.min() + 1), "balanced", seed=0)
    with pytest.raises(DataError, match="size"):
        subsample_train(table, 601, "natural", seed=0)


def test_counts_keep_empty_clients_and_classes():
    assignment = pd.DataFrame(
        {
            "sentence_id": ["s1", "s2", "s3", "s4"],
            "label": ["a", "a", "b", "c"],
            "split": ["train", "train", "train", "test"],
        }
    )
    assignment["client"] = pd.Categorical(
        ["client_00", "client_00", "client_02", "client_01"], categories=["client_00", "client_01", "client_02"]
    )
    counts = client_class_counts(assignment)
    assert list(counts.index) == ["client_00", "client_01", "client_02"]
    assert list(counts.columns) == ["a", "b", "c", "total"]
    assert counts.to_numpy().tolist() == [[2, 0, 0, 2], [0, 0, 0, 0], [0, 1, 0, 1]]


def test_heatmap_png_is_deterministic(table, tmp_path):
    counts = client_class_counts(partition_corpus(table, 5, "dirichlet", 0.5, seed=0)[0])
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    partition_heatmap(counts, "dirichlet alpha=0.5", first)
    partition_heatmap(counts, "dirichlet alpha=0.5", second)
    assert first.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert first.read_bytes() == second.read_bytes()


def test_cap_splits_keeps_each_splits_label_mix():
    from fedrepro.data.label_skew import cap_splits
    from fedrepro.data.relation import synthetic_relations

    table = synthetic_relations(n_sentences=800, n_classes=4, seed=1).table
    capped = cap_splits(table, 200, 30, seed=0)
    sizes = capped.groupby("split").size().to_dict()
    assert sizes == {"train": 200, "valid": 30, "test": 30}
    train, kept = (
        table[table.split == "train"].label.value_counts(normalize=True),
        capped[capped.split == "train"].label.value_counts(),
    )
    assert all(abs(kept[c] - 200 * train[c]) <= 1 for c in train.index)
    assert capped.equals(cap_splits(table, 200, 30, seed=0)) and set(capped.sentence_id) <= set(table.sentence_id)
    assert cap_splits(table, 0, 0, seed=0).equals(table)
