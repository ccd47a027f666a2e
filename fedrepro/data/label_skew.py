"""Label-skew client splits of a relation corpus for FedCMC, and the tables that show how skewed they are.

The split is drawn once as a clients x classes table of *proportions* (which share of each class every client
gets) and then applied to any set of labels, so train, valid and test can share one client label distribution.
Integer counts always come from ``_cut``, the one rounding rule used both to check a draw and to apply it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedrepro.data import schema
from fedrepro.errors import DataError
from fedrepro.seeding import derive_seed

SCHEMES = ("dirichlet", "iid", "quantity")
SUBSAMPLE_MODES = ("balanced", "natural")
_EPS = 1e-9  # floor(0.7999999999 * 10) would give 7: cumulative sums of 1/K are not exact in floating point


def client_names(n_clients: int) -> list[str]:
    """``client_00``, ``client_01``, ... (wider numbers past 100 clients, so names still sort in order)."""
    width = max(2, len(str(n_clients - 1)))
    return [f"client_{k:0{width}d}" for k in range(n_clients)]


def _cut(shares: np.ndarray, n: int) -> np.ndarray:
    """Per-client counts of ``n`` samples: floor of cumulative share * n, last cut = n (each sample once)."""
    cuts = np.floor(np.cumsum(shares) * n + _EPS).astype(np.int64).clip(0, n)
    cuts[-1] = n
    return np.diff(cuts, prepend=0)


def _check_partition_args(n_clients: int, scheme: str, alpha: float) -> None:
    if scheme not in SCHEMES:
        raise DataError(f"label skew: scheme={scheme!r}; allowed {list(SCHEMES)}")
    if not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
        raise DataError(f"label skew: n_clients={n_clients!r}; must be an integer >= 1")
    if not np.isfinite(alpha) or alpha <= 0:
        raise DataError(f"label skew: alpha={alpha!r}; must be a finite number > 0")


def _draw_proportions(
    rng: np.random.Generator, counts: np.ndarray, n_clients: int, scheme: str, alpha: float, balance: bool
) -> np.ndarray:
    """One draw: a clients x classes array whose columns sum to 1 (classes in the order of ``counts``)."""
    if scheme == "iid":
        return np.full((n_clients, len(counts)), 1.0 / n_clients)
    if scheme == "quantity":
        q = rng.dirichlet(np.full(n_clients, alpha))
        return np.repeat(q[:, None], len(counts), axis=1)
    out = np.empty((n_clients, len(counts)))
    held = np.zeros(n_clients, dtype=np.int64)
    cap = counts.sum() / n_clients
    for j, n in enumerate(counts):
        p = rng.dirichlet(np.full(n_clients, alpha))
        if balance:  # NIID-Bench: a client already holding >= N/K samples gets nothing more
            open_ = held < cap
            if open_.any():  # none open only when every client holds exactly N/K and the class is empty
                masked = p * open_
                # the open clients can all draw an exact 0 at tiny alpha: share equally rather than divide by 0
                p = masked / masked.sum() if masked.sum() > 0 else open_ / open_.sum()
            held += _cut(p, int(n))
        out[:, j] = p
    return out


def client_proportions(
    class_counts: dict[str, int],
    n_clients: int,
    scheme: str,
    alpha: float,
    seed: int,
    min_size: int = 1,
    balance: bool = False,
    max_tries: int = 100,
) -> pd.DataFrame:
    """Clients x classes table of shares: column c says which share of class c each client gets (sums to 1).

    ``dirichlet``: per class p_c ~ Dir_K(alpha), the per-class label skew of FedCMC and NIID-Bench.
    ``balance=True`` adds NIID-Bench's balance trick (drawing class by class, a client already holding >= N/K
    samples gets share 0 of the next classes, then the shares are renormalised). FedCMC's paper does not say
    whether it uses the trick, so it is a parameter; the other schemes ignore it.
    ``iid``: every share 1/K (alpha unused but still checked). ``quantity``: client sizes q ~ Dir_K(alpha) and
    the same share q_k of every class (quantity skew, labels IID).

    ``class_counts`` are the TRAINING counts: a draw is redrawn until every client gets >= ``min_size`` of them
    (counted with the rounding ``split_by_proportions`` uses, so the check is exact), at most ``max_tries``
    times: at small alpha the usual unbounded loop can spin forever, so this raises instead.
    """
    _check_partition_args(n_clients, scheme, alpha)
    if not class_counts:
        raise DataError("client_proportions: class_counts is empty; need at least one class")
    classes = sorted(str(c) for c in class_counts)
    counts = np.array([class_counts[c] for c in sorted(class_counts, key=str)])
    if len(set(classes)) < len(classes) or (counts < 0).any() or not np.issubdtype(counts.dtype, np.integer):
        raise DataError(
            f"client_proportions: class_counts={class_counts}; need distinct class names and integer counts >= 0"
        )
    if min_size < 0 or max_tries < 1:
        raise DataError(f"client_proportions: min_size={min_size}, max_tries={max_tries}; need >= 0 and >= 1")
    total = int(counts.sum())
    shown = dict(zip(classes, counts.tolist()))
    if min_size * n_clients > total:
        raise DataError(
            f"client_proportions: min_size={min_size} x K=n_clients={n_clients} = {min_size * n_clients} "
            f"exceeds the {total} training samples (class counts {shown}); lower min_size or use "
            "fewer clients"
        )
    rng = np.random.default_rng(seed)
    tries = 1 if scheme == "iid" else max_tries  # iid has nothing random to redraw
    for _ in range(tries):
        shares = _draw_proportions(rng, counts, n_clients, scheme, alpha, balance)
        sizes = sum(_cut(shares[:, j], int(n)) for j, n in enumerate(counts))
        if sizes.min() >= min_size:
            table = pd.DataFrame(shares, index=pd.Index(client_names(n_clients), name="client"), columns=classes)
            table.columns.name = None
            return table
    raise DataError(
        f"client_proportions: no draw out of max_tries={tries} gave every client >= min_size={min_size} "
        f"training samples (scheme={scheme!r}, alpha={alpha}, K=n_clients={n_clients}, class counts "
        f"{shown}); raise alpha, lower min_size or use fewer clients"
    )


def split_by_proportions(labels: pd.Series | np.ndarray, proportions: pd.DataFrame, seed: int) -> np.ndarray:
    """Each sample's client index (aligned with ``labels``): per class, a seeded permutation of its samples is cut
    by the cumulative shares, so every sample goes to exactly one client and class totals are kept."""
    labels = pd.Series(np.asarray(labels, dtype=object)).astype(str).to_numpy()
    missing = sorted(set(labels) - set(map(str, proportions.columns)))
    if missing:
        raise DataError(
            f"split_by_proportions: class(es) {missing} in labels have no column in proportions "
            f"(columns {list(proportions.columns)})"
        )
    values = proportions.to_numpy(dtype=float)
    if (values < 0).any() or not np.allclose(values.sum(axis=0), 1.0, atol=1e-6):
        raise DataError("split_by_proportions: every proportions column must be >= 0 and sum to 1")
    shares = dict(zip(map(str, proportions.columns), values.T))
    out = np.full(len(labels), -1, dtype=np.int64)
    for c in sorted(set(labels)):
        where = np.flatnonzero(labels == c)
        where = where[np.random.default_rng(derive_seed(seed, "class", c)).permutation(len(where))]
        out[where] = np.repeat(np.arange(len(proportions)), _cut(shares[c], len(where)))
    return out


def partition_corpus(
    table: pd.DataFrame,
    n_clients: int,
    scheme: str,
    alpha: float,
    seed: int,
    min_size: int = 1,
    balance: bool = False,
    max_tries: int = 100,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Client of every sentence: shares drawn from the TRAIN class counts, then applied to train, valid and test
    separately (own seed per split), so each client's local valid/test follow its own label distribution and
    their union is still the corpus's global valid/test.

    FedCMC's headline number is the global (aggregated) model on each dataset's global test set; the per-client
    valid/test exist for personalised evaluation. Classes with no train sample get shares too (for their
    valid/test rows) but count nothing towards ``min_size``.
    Returns (assignment, proportions): ``sentence_id, label, split, client`` in the input's row order, ``client``
    categorical over all K clients (so empty clients still show in counts), and the shares table.
    """
    missing = [c for c in ("sentence_id", "label", "split") if c not in table.columns]
    if missing:
        raise DataError(f"partition_corpus: table lacks column(s) {missing}; expected {list(schema.RE_COLUMNS)}")
    bad = sorted(set(table["split"]) - set(schema.SPLITS))
    if bad:
        raise DataError(f"partition_corpus: field 'split' has {bad}; allowed {list(schema.SPLITS)}")
    labels = table["label"].astype(str)
    train = labels[table["split"] == "train"]
    if train.empty:
        raise DataError("partition_corpus: no train rows; the shares are drawn from the train class counts")
    class_counts = {c: int((train == c).sum()) for c in sorted(set(labels))}
    proportions = client_proportions(class_counts, n_clients, scheme, alpha, seed, min_size, balance, max_tries)
    client = np.full(len(table), -1, dtype=np.int64)
    for split in schema.SPLITS:
        rows = np.flatnonzero((table["split"] == split).to_numpy())
        client[rows] = split_by_proportions(labels.to_numpy()[rows], proportions, derive_seed(seed, "split", split))
    assignment = table[["sentence_id", "label", "split"]].copy()
    assignment["client"] = pd.Categorical.from_codes(client, categories=list(proportions.index))
    return assignment, proportions


def subsample_train(table: pd.DataFrame, size: int, mode: str, seed: int) -> pd.DataFrame:
    """``size`` train rows for the small-data runs (FedCMC Table 3, 500-sample ChemProt); valid/test kept whole.

    ``balanced``: size / C of every class (C = all classes left). ``natural``: per-class counts proportional to
    the train label distribution, rounded by largest remainder so they sum to ``size``.
    """
    if mode not in SUBSAMPLE_MODES:
        raise DataError(f"subsample_train: mode={mode!r}; allowed {list(SUBSAMPLE_MODES)}")
    is_train = (table["split"] == "train").to_numpy()
    labels = table["label"].astype(str).to_numpy()
    classes = sorted(set(labels))
    have = {c: int((labels[is_train] == c).sum()) for c in classes}
    n_train = int(is_train.sum())
    if not isinstance(size, (int, np.integer)) or not 1 <= size <= n_train:
        raise DataError(f"subsample_train: size={size!r}; must be an integer in 1..{n_train} (the train rows)")
    if mode == "balanced":
        if size % len(classes):
            raise DataError(f"subsample_train: size={size} is not divisible by the {len(classes)} classes {classes}")
        want = {c: size // len(classes) for c in classes}
        short = {c: have[c] for c in classes if have[c] < want[c]}
        if short:
            raise DataError(
                f"subsample_train: balanced needs {size // len(classes)} train samples per class; too few for {short}"
            )
    else:
        exact = {c: size * have[c] / n_train for c in classes}
        want = {c: int(np.floor(exact[c])) for c in classes}
        left = size - sum(want.values())
        for c in sorted(classes, key=lambda c: (-(exact[c] - want[c]), c))[:left]:  # ties: class name
            want[c] += 1
    keep = ~is_train
    for c in classes:
        where = np.flatnonzero(is_train & (labels == c))
        pick = np.random.default_rng(derive_seed(seed, "subsample", mode, c)).choice(len(where), want[c], replace=False)
        keep[where[pick]] = True
    return table[keep].copy()


def cap_splits(table: pd.DataFrame, max_train: int, max_eval: int, seed: int) -> pd.DataFrame:
    """At most ``max_train`` train rows and ``max_eval`` valid and test rows each (0 = all), sampled per split
    with the split's own label mix (the ``natural`` rule), so a CPU-sized corpus keeps the real class skew."""
    parts = []
    for split, cap in (("train", max_train), ("valid", max_eval), ("test", max_eval)):
        rows = table[table["split"] == split]
        if cap and len(rows) > cap:
            rows = subsample_train(rows.assign(split="train"), cap, "natural", derive_seed(seed, "cap", split))
            rows = rows.assign(split=split)
        parts.append(rows)
    return pd.concat(parts).loc[lambda frame: frame.index.sort_values()]


def client_class_counts(assignment: pd.DataFrame, split: str = "train") -> pd.DataFrame:
    """Clients x classes sample counts of one split plus a ``total`` column, as NIID-Bench prints.

    Every client (all categories of a categorical ``client``, else every client seen in any split) and every
    class seen in any split is a row/column, even where the count is 0.
    """
    if split not in schema.SPLITS:
        raise DataError(f"client_class_counts: split={split!r}; allowed {list(schema.SPLITS)}")
    client = assignment["client"]
    clients = list(client.cat.categories) if isinstance(client.dtype, pd.CategoricalDtype) else sorted(set(client))
    classes = sorted(set(assignment["label"].astype(str)))
    rows = assignment[assignment["split"] == split]
    counts = pd.crosstab(rows["client"].astype(str), rows["label"].astype(str))
    counts = counts.reindex(index=clients, columns=classes, fill_value=0).astype(np.int64)
    counts.index.name, counts.columns.name = "client", None
    counts["total"] = counts.sum(axis=1)
    return counts


def skew_statistic(counts: pd.DataFrame) -> float:
    """Label skew of a clients x classes count table (``total`` column ignored): the sample-weighted mean over
    clients of the Jensen-Shannon distance (base 2, in [0, 1]) between the client's label distribution and the
    pooled one. 0 = every client has the global distribution; empty clients weigh nothing."""
    values = counts.drop(columns="total", errors="ignore").to_numpy(dtype=float)
    sizes = values.sum(axis=1)
    if sizes.sum() <= 0:
        raise DataError("skew_statistic: the count table holds no samples")
    pooled = values.sum(axis=0) / sizes.sum()
    local = values[sizes > 0] / sizes[sizes > 0, None]
    mid = (local + pooled) / 2

    def kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
        ratio = np.divide(p, q, out=np.ones_like(p), where=p > 0)
        return (p * np.log2(ratio)).sum(axis=1)

    distance = np.sqrt(np.clip((kl(local, mid) + kl(np.broadcast_to(pooled, local.shape), mid)) / 2, 0, None))
    return float((distance * sizes[sizes > 0]).sum() / sizes.sum())
