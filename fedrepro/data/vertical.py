"""Vertically partitioned data for SS-VFNAS: parties hold different features of the same, aligned samples.

SS-VFNAS's own data (ModelNet40 views, CheXpert) is not available offline; the FATE hetero CSVs are the real
substitute and scikit-learn's digits (each 8x8 image split into halves, K = 2, or quarters, K = 4) the embedded
default. Image parties carry their view's shape (channels, height, width) in ``shapes`` so that a consumer can
fold the flat pixel columns back into images; tabular parties have ``None`` there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fedrepro.errors import DataError
from fedrepro.io import read_csv

LABEL_COLUMNS = ("y", "label", "motor_speed", "doctorco")
ID_COLUMNS = ("id", "sid", "idx")
# FATE runs these as regression (continuous targets / counts, see MANIFEST); everything else is classification.
REGRESSION_SETS = {"motor", "motor_mini", "student", "dvisits"}
# host files of each mirrored FATE set (MANIFEST): the parties K = guest + hosts when every host file is taken
FATE_HOSTS = {
    "breast": 1,
    "breast_mini": 1,
    "default_credit": 1,
    "dvisits": 1,
    "ionosphere_scale": 1,
    "motor": 3,
    "motor_mini": 1,
    "student": 1,
}
# SS-VFNAS's digits: the prepared set for each number of parties
DIGITS = "digits"
DIGITS_VIEWS = {2: "digits-halves", 4: "digits-quarters"}
# ModelNet40's rendered views (fedrepro.data.multiview), prepared at these K when data.modelnet40_dir is set
MODELNET40 = "modelnet40"
MODELNET40_VIEWS = {2: "modelnet40-k2", 4: "modelnet40-k4"}


def vertical_views(dataset: str, hosts: Sequence[str] | None = None) -> dict[int, str]:
    """K -> the prepared vertical set that runs ``dataset`` with K parties: the digits in halves (2) or quarters
    (4); ModelNet40 at 2 or 4 views; a FATE set at guest + its hosts (``hosts`` as in ``data.vertical_sets``;
    None = every host file). Empty when the number of hosts is unknown."""
    if dataset == DIGITS:
        return dict(DIGITS_VIEWS)
    if dataset == MODELNET40:
        return dict(MODELNET40_VIEWS)
    count = len(hosts) if hosts is not None else FATE_HOSTS.get(dataset)
    return {1 + count: dataset} if count else {}


@dataclass
class VerticalDataset:
    name: str
    parties: list[pd.DataFrame]
    labels: np.ndarray
    label_party: int
    task: str
    notes: list[str] = field(default_factory=list)
    shapes: list[tuple[int, ...] | None] = field(default_factory=list)
    """per party: the (C, H, W) of an image view whose pixels are its feature columns in row-major order, or None"""
    dropped: list[int] = field(default_factory=list)
    """per party: ids it held that are not in every other party (dropped by the alignment); empty = not recorded"""
    groups: np.ndarray | None = None
    """per row: the group it belongs to (e.g. the 3-D object whose views it shows); splits keep a group together"""
    release_split: np.ndarray | None = None
    """per row: the publisher's split ("train" / "test"), kept as the test split; None = split by the pipeline"""

    def shape(self, party: int) -> tuple[int, ...] | None:
        return self.shapes[party] if party < len(self.shapes) else None


def _prefix(name: str) -> str:
    """'breast' -> 'breast_hetero', 'breast_mini' -> 'breast_hetero_mini' (FATE's file naming)."""
    if "_hetero" in name:
        return name
    return f"{name[:-5]}_hetero_mini" if name.endswith("_mini") else f"{name}_hetero"


def fate_files(name: str, hosts: Sequence[str] | None, declared: set[str]) -> list[str]:
    """The raw files a FATE set needs, as paths under the mirror: its guest, then its hosts (the ``hosts`` tags, or
    every declared ``<prefix>_host*.csv`` when None, as ``load_fate`` globs them)."""
    prefix = _prefix(name)
    guest = f"fate_vfl/{prefix}_guest.csv"
    if hosts is not None:
        return [guest] + [f"fate_vfl/{prefix}_{tag}.csv" for tag in hosts]
    return [guest] + sorted(path for path in declared if PurePosixPath(path).match(f"fate_vfl/{prefix}_host*.csv"))


def own_vertical_sets(vertical_sets: Mapping[str, Sequence[str] | None], own_files: Mapping[str, str]) -> dict:
    """The sets of ``data.vertical_sets`` whose guest file the user declared in ``data.own_files``: prepared at any
    source, the embedded one included (the public FATE sets need the mirror or the internet)."""
    return {name: hosts for name, hosts in vertical_sets.items() if fate_files(name, hosts, set())[0] in own_files}


def _read(path: Path) -> tuple[pd.DataFrame, str]:
    if not path.is_file():
        raise DataError(f"missing FATE file {path}")
    frame = read_csv(path)
    if frame.empty:
        raise DataError(f"{path}: a header row and no data rows; expected one row per sample")
    key = frame.columns[0]
    if key not in ID_COLUMNS:
        raise DataError(f"{path}: first column is {key!r}; expected one of {list(ID_COLUMNS)}")
    if frame[key].duplicated().any():
        raise DataError(
            f"{path}: duplicate ids in column {key!r}, e.g. {frame.loc[frame[key].duplicated(), key].iloc[0]}"
        )
    return frame.rename(columns={key: "sample_id"}), key


def load_fate(
    raw_dir: Path | str, name: str, hosts: Sequence[str] | None = None, task: str | None = None
) -> VerticalDataset:
    """A FATE hetero set: guest (party 0, labels) + the chosen hosts (default: every ``*_hetero_host*.csv``).

    ``hosts`` are file tags such as ``["host", "host_1"]``. Rows are the inner join on the id column, in guest
    order; ids on one side only are counted in ``notes``.
    """
    raw_dir = Path(raw_dir)
    base = raw_dir / "fate_vfl" if (raw_dir / "fate_vfl").is_dir() else raw_dir
    prefix = _prefix(name)
    guest_path = base / f"{prefix}_guest.csv"
    if hosts is None:
        host_paths = sorted(base.glob(f"{prefix}_host*.csv"))
        if not host_paths:
            raise DataError(f"missing FATE file {base / f'{prefix}_host.csv'} (no host file for {name!r})")
    else:
        host_paths = [base / f"{prefix}_{tag}.csv" for tag in hosts]
    guest, key = _read(guest_path)
    found = [c for c in LABEL_COLUMNS if c in guest.columns]
    if len(found) != 1:
        raise DataError(f"{guest_path}: expected exactly one label column of {list(LABEL_COLUMNS)}, found {found}")
    label_col = found[0]
    frames = [guest] + [_read(p)[0] for p in host_paths]
    common = set(guest["sample_id"])
    for frame in frames[1:]:
        common &= set(frame["sample_id"])
    notes = [
        f"FATE {prefix}: guest {guest_path.name} (id column {key!r}, label {label_col!r}) + hosts "
        f"{[p.name for p in host_paths]}; inner join on id keeps {len(common)} rows"
    ]
    dropped = []
    for path, frame in zip([guest_path, *host_paths], frames):
        only = len(set(frame["sample_id"]) - common)
        dropped.append(only)
        notes.append(f"{path.name}: {len(frame)} rows, {only} id(s) not in every other party (dropped)")
    order = guest.loc[guest["sample_id"].isin(common), "sample_id"]
    parties = [f.set_index("sample_id").loc[order].reset_index() for f in frames]
    y = parties[0].pop(label_col).to_numpy()
    seen: dict[str, int] = {}
    copies = []
    for k, party in enumerate(parties):
        for col in party.columns[1:]:
            if col in seen and np.array_equal(parties[seen[col]][col].to_numpy(), party[col].to_numpy()):
                copies.append(f"{col} (parties {seen[col]},{k})")
            seen.setdefault(col, k)
    if copies:  # e.g. motor: host = host_1 + host_2, so taking all three hosts repeats features
        notes.append(f"identical feature columns held by two parties: {copies}; choose hosts to avoid this")
    if task is None:
        task = "regression" if name in REGRESSION_SETS or not np.all(np.mod(y, 1) == 0) else "classification"
    if task == "classification":
        values, y = np.unique(y, return_inverse=True)
        notes.append(
            f"classification: {len(values)} classes, label values {values.tolist()} coded 0..{len(values) - 1}"
        )
    elif task == "regression":
        y = y.astype(np.float64)
        notes.append(f"regression target {label_col!r}: {len(np.unique(y))} distinct values")
    else:
        raise DataError(f"load_fate: task={task!r}; allowed 'classification', 'regression'")
    return VerticalDataset(name, parties, y, 0, task, notes, [None] * len(parties), dropped)


def _digits_views(name: str, views: list[tuple[range, range]], description: str) -> VerticalDataset:
    """scikit-learn's bundled 8x8 digits cut into rectangular views (rows, columns), one per party; the last
    party holds the labels. Pixel columns are ``px_<row>_<col>`` in row-major order within each view."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images  # (n, 8, 8)
    ids = pd.Series(np.arange(len(images)), name="sample_id")
    parties = []
    for rows, cols in views:
        feats = {f"px_{r}_{c}": images[:, r, c] for r in rows for c in cols}
        parties.append(pd.concat([ids, pd.DataFrame(feats)], axis=1))
    notes = [
        f"scikit-learn load_digits: {len(images)} 8x8 images, 10 classes; {description}; the last party also holds "
        "the labels; pixel values 0-16, unscaled"
    ]
    shapes: list[tuple[int, ...] | None] = [(1, len(rows), len(cols)) for rows, cols in views]
    return VerticalDataset(
        name, parties, digits.target.astype(np.int64), len(views) - 1, "classification", notes, shapes, [0] * len(views)
    )


def digits_halves() -> VerticalDataset:
    """scikit-learn's bundled 8x8 digits: party 0 sees columns 0-3, party 1 columns 4-7 and holds the labels."""
    return _digits_views(
        "digits-halves",
        [(range(0, 8), range(0, 4)), (range(0, 8), range(4, 8))],
        "party 0 = left half (columns 0-3), party 1 = right half (columns 4-7)",
    )


def digits_quarters() -> VerticalDataset:
    """The same digits in four 4x4 quadrants: party 0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right
    (and the labels)."""
    low, high = range(0, 4), range(4, 8)
    return _digits_views(
        "digits-quarters",
        [(low, low), (low, high), (high, low), (high, high)],
        "party 0 = top-left, 1 = top-right, 2 = bottom-left, 3 = bottom-right 4x4 quadrant",
    )


def vertical_statistics(ds: VerticalDataset) -> pd.DataFrame:
    """One row per party: rows, feature count, whether it holds the labels, and the class count."""
    classes = len(np.unique(ds.labels)) if ds.task == "classification" else 0
    return pd.DataFrame(
        [
            {
                "party": k,
                "rows": len(p),
                "features": p.shape[1] - 1,
                "label_party": k == ds.label_party,
                "classes": classes,
                "task": ds.task,
            }
            for k, p in enumerate(ds.parties)
        ]
    )
