"""SS-VFNAS's vertical partitions: align the parties' rows by id, cap, split once, scale each party's own features.

* Alignment is a plain intersection of the sample ids every party (and the label table) holds, in the first
  party's row order. It is NOT a private set intersection (FATE offers one: RSA- or ECDH-based PSI); every party
  here would learn the others' ids. The ids each side loses are counted.
* The splits are made once per (dataset, K), stratified by label and seeded by ``data.seed`` and the dataset (so
  the digits' halves and quarters split the same images the same way): ``test`` (held out,
  only reported), and the training rows cut into ``train`` (the weights) and ``valid`` (the search-valid half the
  alphas are fitted on, as DARTS and the paper do). Retraining uses train + valid.
* A set with a publisher's split (ModelNet40's train/test folders: ``release_split`` in labels.parquet) keeps its
  test rows as ``test``; a set whose rows come in groups (ModelNet40's views of one object: ``group``) is capped
  and split by whole groups, so no object is seen in two splits.
* Each party scales only its own columns, from its own training rows (train + valid): images are divided by their
  largest training pixel value, table columns are z-scored (a constant column is centred only). Nothing crosses.

Files per partition folder: ``party_<j>.parquet`` (``sample_id`` + float32 feature columns), ``labels.parquet``
(``sample_id``, ``label`` coded 0..C-1), ``splits.parquet`` (``sample_id``, ``split``) and ``summary.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedrepro.errors import DataError
from fedrepro.io import read_json, read_table, write_json, write_table
from fedrepro.seeding import derive_seed

SPLITS = ("train", "valid", "test")
ALIGNMENT = (
    "plain intersection of the sample ids every party holds (not a private set intersection: each party "
    "would see the others' ids)"
)


def align(frames: list[pd.DataFrame], labels: pd.DataFrame) -> tuple[list[pd.DataFrame], pd.DataFrame, list[int]]:
    """Keep the ids every party and the label table hold, in the first party's order; return the aligned frames,
    the aligned labels and, per party, how many of its ids were dropped."""
    for k, frame in enumerate(frames):
        if frame["sample_id"].duplicated().any():
            raise DataError(
                f"party {k}: duplicate sample ids, e.g. "
                f"{frame.loc[frame['sample_id'].duplicated(), 'sample_id'].iloc[0]}"
            )
    common = set(labels["sample_id"])
    for frame in frames:
        common &= set(frame["sample_id"])
    if not common:
        raise DataError("the parties share no sample id")
    order = frames[0].loc[frames[0]["sample_id"].isin(common), "sample_id"]
    dropped = [len(set(frame["sample_id"]) - common) for frame in frames]
    aligned = [frame.set_index("sample_id").loc[order].reset_index() for frame in frames]
    return aligned, labels.set_index("sample_id").loc[order].reset_index(), dropped


def _per_class(labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Each class's row positions, shuffled by ``rng`` (classes in sorted order)."""
    return [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]


def stratified_cap(labels: np.ndarray, max_samples: int, seed: int, name: str) -> np.ndarray:
    """Sorted row positions of a seeded sample of ``max_samples`` rows keeping the label mix (all rows if 0 or more
    than there are). Each class keeps round(share x max_samples) rows, at least one."""
    n = len(labels)
    if max_samples == 0 or max_samples >= n:
        return np.arange(n)
    rng = np.random.default_rng(derive_seed(seed, "ssvfnas-cap", name))
    keep = [rows[: max(1, round(len(rows) * max_samples / n))] for rows in _per_class(labels, rng)]
    return np.sort(np.concatenate(keep))


def stratified_splits(
    labels: np.ndarray,
    test_fraction: float,
    valid_fraction: float,
    seed: int,
    name: str,
    check: tuple[str, ...] = SPLITS,
) -> np.ndarray:
    """The split of each row: per class, round(test_fraction x n_c) rows to test, then round(valid_fraction x the
    rest) to valid, the remainder to train; seeded by (seed, name). The splits in ``check`` must not be empty."""
    rng = np.random.default_rng(derive_seed(seed, "ssvfnas-split", name))
    split = np.empty(len(labels), dtype=object)
    for rows in _per_class(labels, rng):
        n_test = int(round(len(rows) * test_fraction))
        n_valid = int(round((len(rows) - n_test) * valid_fraction))
        split[rows[:n_test]] = "test"
        split[rows[n_test : n_test + n_valid]] = "valid"
        split[rows[n_test + n_valid :]] = "train"
    for name_ in check:
        if not (split == name_).any():
            raise DataError(f"{name}: the {name_} split is empty ({len(labels)} rows); change ssvfnas.split")
    return split


def grouped_cap_and_splits(
    labels: np.ndarray,
    groups: np.ndarray | None,
    release: np.ndarray | None,
    max_samples: int,
    test_fraction: float,
    valid_fraction: float,
    seed: int,
    name: str,
) -> tuple[np.ndarray, np.ndarray]:
    """(kept row positions, split of each kept row). Without groups or a release split this is ``stratified_cap``
    then ``stratified_splits`` on rows. With ``groups`` both act on whole groups (a group's label is its first
    row's); with ``release`` the publisher's test rows are the test split and train/valid are drawn from the rest."""
    if groups is None and release is None:
        keep = stratified_cap(labels, max_samples, seed, name)
        return keep, stratified_splits(labels[keep], test_fraction, valid_fraction, seed, name)
    groups = np.arange(len(labels)) if groups is None else groups
    units, first, of_row = np.unique(groups, return_index=True, return_inverse=True)
    unit_labels = labels[first]
    unit_cap = 0 if max_samples == 0 else max(1, int(np.ceil(max_samples * len(units) / len(labels))))
    kept_units = stratified_cap(unit_labels, unit_cap, seed, name)
    if release is None:
        unit_split = np.empty(len(units), dtype=object)
        unit_split[kept_units] = stratified_splits(unit_labels[kept_units], test_fraction, valid_fraction, seed, name)
    else:
        unit_release = release[first]
        if (release != unit_release[of_row]).any():
            raise DataError(f"{name}: a group has rows in both the publisher's train and test splits")
        unit_split = np.empty(len(units), dtype=object)
        kept_test = kept_units[unit_release[kept_units] == "test"]
        kept_train = kept_units[unit_release[kept_units] != "test"]
        unit_split[kept_test] = "test"
        unit_split[kept_train] = stratified_splits(
            unit_labels[kept_train], 0.0, valid_fraction, seed, name, check=("train", "valid")
        )
        if not len(kept_test):
            raise DataError(
                f"{name}: the publisher's test split is empty after the cap; raise ssvfnas.split.max_samples"
            )
    keep = np.flatnonzero(np.isin(of_row, kept_units))
    return keep, unit_split[of_row[keep]]


def scale(features: np.ndarray, training: np.ndarray, image: bool) -> tuple[np.ndarray, str]:
    """A party's own features scaled from its own training rows; returns the scaled float32 array and what was done."""
    fit = features[training]
    if image:
        top = float(np.abs(fit).max()) or 1.0
        return (features / top).astype(np.float32), f"pixels divided by {top:g} (largest training pixel)"
    mean, std = fit.mean(axis=0), fit.std(axis=0)
    constant = int((std == 0).sum())
    std = np.where(std == 0, 1.0, std)
    return ((features - mean) / std).astype(np.float32), (
        "z-score per column on the training rows"
        + (f" ({constant} constant column(s) centred only)" if constant else "")
    )


def build_partition(
    prepared: Path, dataset: str, parties: int, test_fraction: float, valid_fraction: float, max_samples: int, seed: int
) -> tuple[list[pd.DataFrame], pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """(party tables, labels, splits, summary) of one (dataset, K) from its prepared vertical folder."""
    prepared = Path(prepared)
    meta = read_json(prepared / "meta.json")
    paths = sorted(prepared.glob("party_*.parquet"), key=lambda p: int(p.stem.split("_")[1]))
    if len(paths) != parties:
        raise DataError(f"{prepared} holds {len(paths)} parties, not the K = {parties} the grid asks for")
    if meta.get("task") != "classification":
        raise DataError(f"{prepared}: task {meta.get('task')!r}; SS-VFNAS's grid runs classification sets only")
    name = f"{dataset}-k{parties}"
    frames, labels, dropped = align([read_table(p) for p in paths], read_table(prepared / "labels.parquet"))
    codes, coded = np.unique(labels["label"].to_numpy(), return_inverse=True)
    groups = labels["group"].to_numpy() if "group" in labels else None
    release = labels["release_split"].to_numpy() if "release_split" in labels else None
    # seeded by the dataset: every K of it gets the same rows and the same splits
    keep, split = grouped_cap_and_splits(
        coded, groups, release, max_samples, test_fraction, valid_fraction, seed, dataset
    )
    frames = [f.iloc[keep].reset_index(drop=True) for f in frames]
    ids, coded = frames[0]["sample_id"].to_numpy(), coded[keep]
    training = split != "test"
    shapes = meta.get("shapes") or [None] * parties
    tables, scaling, features = [], [], []
    for k, frame in enumerate(frames):
        columns = [c for c in frame.columns if c != "sample_id"]
        values, how = scale(frame[columns].to_numpy(dtype=np.float64), training, shapes[k] is not None)
        if shapes[k] is not None and int(np.prod(shapes[k])) != len(columns):
            raise DataError(f"{paths[k]}: {len(columns)} columns do not fill the image shape {shapes[k]}")
        tables.append(pd.concat([frame[["sample_id"]], pd.DataFrame(values, columns=columns)], axis=1))
        scaling.append(how)
        features.append(len(columns))
    label_table = pd.DataFrame({"sample_id": ids, "label": coded.astype(np.int64)})
    split_table = pd.DataFrame({"sample_id": ids, "split": split.astype(str)})
    prepared_alignment = meta.get("alignment", {})
    summary = {
        "name": name,
        "dataset": dataset,
        "parties": parties,
        "prepared": prepared.name,
        "seed": seed,
        "label_party": int(meta["label_party"]),
        "task": "classification",
        "classes": len(codes),
        "label_values": [v.item() if hasattr(v, "item") else v for v in codes],
        "shapes": shapes,
        "kinds": ["conv" if s is not None else "mlp" for s in shapes],
        "features": features,
        "scaling": scaling,
        "alignment": {
            "method": ALIGNMENT,
            "prepare": {
                "rows": prepared_alignment.get("rows"),
                "dropped_per_party": prepared_alignment.get("dropped_per_party"),
            },
            "partition": {"rows": len(labels), "dropped_per_party": dropped},
        },
        "cap": {"max_samples": max_samples, "rows_kept": len(ids)},
        "splits": {s: int((split == s).sum()) for s in SPLITS},
        "label_counts": {s: np.bincount(coded[split == s], minlength=len(codes)).tolist() for s in SPLITS},
        "fractions": {
            "test": "the publisher's test split" if release is not None else test_fraction,
            "valid_of_training": valid_fraction,
        },
        **({"grouped_by": "group (no group is in two splits)"} if groups is not None else {}),
    }
    return tables, label_table, split_table, summary


def write_partition(
    folder: Path, tables: list[pd.DataFrame], labels: pd.DataFrame, splits: pd.DataFrame, summary: dict
) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for k, table in enumerate(tables):
        write_table(folder / f"party_{k}.parquet", table)
    write_table(folder / "labels.parquet", labels)
    write_table(folder / "splits.parquet", splits)
    write_json(folder / "summary.json", summary)
