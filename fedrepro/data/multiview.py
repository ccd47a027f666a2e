"""SS-VFNAS's own datasets, for users who have them: ModelNet40 multi-view renders and CheXpert.

Neither can be downloaded here (ModelNet40v1png is a multi-GB release; CheXpert needs Stanford's research use
agreement), so these loaders read a local copy in its published layout and return the same ``VerticalDataset``
as the digits and the FATE tables: one party per image, aligned by sample id, pixels as ``px_<row>_<col>``
columns of a grayscale ``image_size`` x ``image_size`` view (``shapes`` says so), the last party holding the labels.

ModelNet40v1png (the MVCNN release) is ``<root>/<class>/<train|test>/<class>_<object>_<view>.png`` with twelve
views 001-012 per object. The views are dealt out as in SS-VFNAS's released loader (``modelnet_view_groups``):
K = 2 pairs view i with view i + 6, the opposite side, for i = 1..6 (six samples per object); 3 <= K <= 6 gives
party j view j, and view j + 6 as the object's second sample.

CheXpert is ``<root>/CheXpert-v1.0-small/{train,valid}.csv`` (or the released code's ``aggr_*.csv``) with a
``Path`` column ``.../patient<id>/study<n>/view<m>_<frontal|lateral>.jpg`` and the 14 observation columns
(1 positive, 0 negative, -1 uncertain, blank not mentioned). Each party holds one image of the same patient
(a patient's first K images in file order); the targets are multi-label.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.data.vertical import VerticalDataset
from fedrepro.errors import DataError
from fedrepro.io import read_csv

MODELNET_VIEWS = 12
MODELNET_FILE = re.compile(r"^(?P<cls>.+)_(?P<obj>\d{4})_(?P<view>\d{3})\.png$")
CHEXPERT_OBSERVATIONS = (
    "No Finding",
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
)
CHEXPERT_PATIENT = re.compile(r"patient(?P<patient>\d+)")
# how an uncertain (-1) CheXpert label is read: the CheXpert paper's U-Zeros and U-Ones policies
UNCERTAIN_POLICIES = {"zeros": 0.0, "ones": 1.0}


def modelnet_view_groups(parties: int) -> list[list[int]]:
    """Per sample of an object, the 0-based view each of the K parties holds (see the module docstring)."""
    if not 2 <= parties <= MODELNET_VIEWS // 2:
        raise DataError(f"ModelNet40 views: parties={parties}; allowed 2..{MODELNET_VIEWS // 2}")
    if parties == 2:
        return [[start, start + MODELNET_VIEWS // 2] for start in range(MODELNET_VIEWS // 2)]
    return [[start + j for j in range(parties)] for start in (0, MODELNET_VIEWS // 2)]


def _grayscale_pixels(path: Path, image_size: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("L").resize((image_size, image_size), Image.BILINEAR), dtype=np.float32)
    except OSError as error:
        raise DataError(f"{path}: not a readable image ({error})") from error


def _pixel_frame(ids: list[str], images: list[np.ndarray], image_size: int) -> pd.DataFrame:
    pixels = np.stack(images).reshape(len(images), -1) / 255.0
    columns = [f"px_{r}_{c}" for r in range(image_size) for c in range(image_size)]
    return pd.concat([pd.Series(ids, name="sample_id"), pd.DataFrame(pixels, columns=columns)], axis=1)


def load_modelnet40(
    root: Path | str,
    parties: int,
    image_size: int = 32,
    max_objects_per_class: int = 0,
    splits: tuple[str, ...] = ("train", "test"),
) -> VerticalDataset:
    """ModelNet40v1png as K parties, one rendered view each (see ``modelnet_view_groups``), over the publisher's
    ``splits``; every sample remembers its object (``groups``) and its split (``release_split``).

    An object missing any view it needs is dropped and counted. ``max_objects_per_class`` > 0 keeps the first
    objects of each class and split (in object-number order), for a quick run on a large copy.
    """
    root = Path(root)
    for split in splits:
        if split not in ("train", "test"):
            raise DataError(f"ModelNet40: split {split!r}; allowed 'train', 'test'")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    for split in splits:
        if not classes or not all((root / name / split).is_dir() for name in classes):
            raise DataError(
                f"ModelNet40: no <class>/{split}/ folder for every class under {root} (expected the "
                "modelnet40v1png layout <class>/<train|test>/<class>_<object>_<view>.png)"
            )
    groups = modelnet_view_groups(parties)
    ids: list[str] = []
    objects_of: list[str] = []
    release: list[str] = []
    labels: list[int] = []
    views: list[list[np.ndarray]] = [[] for _ in range(parties)]
    incomplete = 0
    for label, name in enumerate(classes):
        for split in splits:
            objects: dict[str, dict[int, Path]] = {}
            for path in sorted((root / name / split).glob("*.png")):
                match = MODELNET_FILE.match(path.name)
                if match is None or match["cls"] != name:
                    raise DataError(f"ModelNet40: unexpected file {path} (expected {name}_<object>_<view>.png)")
                objects.setdefault(match["obj"], {})[int(match["view"]) - 1] = path
            kept = sorted(objects)[:max_objects_per_class] if max_objects_per_class > 0 else sorted(objects)
            for obj in kept:
                rendered = objects[obj]
                if any(v not in rendered for group in groups for v in group):
                    incomplete += 1
                    continue
                for group in groups:
                    ids.append(f"{name}_{obj}_v{group[0] + 1:02d}")
                    objects_of.append(f"{name}_{obj}")
                    release.append(split)
                    labels.append(label)
                    for party, view in enumerate(group):
                        views[party].append(_grayscale_pixels(rendered[view], image_size))
    if not ids:
        raise DataError(
            f"ModelNet40: no object under {root} has all views {sorted({v + 1 for g in groups for v in g})}"
        )
    frames = [_pixel_frame(ids, party_views, image_size) for party_views in views]
    counts = {split: release.count(split) for split in splits}
    notes = [
        f"ModelNet40v1png {'+'.join(splits)}: {len(classes)} classes, {len(ids) // len(groups)} objects x "
        f"{len(groups)} view groups {[[v + 1 for v in g] for g in groups]} = {len(ids)} samples {counts}; "
        f"grayscale {image_size}x{image_size}; party j holds view j of a group, the last party also the labels",
        f"objects dropped for a missing view: {incomplete}",
    ]
    return VerticalDataset(
        f"modelnet40-k{parties}",
        frames,
        np.asarray(labels, dtype=np.int64),
        parties - 1,
        "classification",
        notes,
        [(1, image_size, image_size)] * parties,
        [incomplete] * parties,
        groups=np.asarray(objects_of),
        release_split=np.asarray(release),
    )


def _chexpert_table(root: Path, split: str) -> tuple[pd.DataFrame, Path]:
    candidates = [root / f"aggr_{split}.csv", root / "CheXpert-v1.0-small" / f"{split}.csv", root / f"{split}.csv"]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise DataError(f"CheXpert: no {split} table; looked for {[str(p) for p in candidates]}")
    table = read_csv(found)
    missing = [c for c in ("Path", *CHEXPERT_OBSERVATIONS) if c not in table.columns]
    if missing:
        raise DataError(f"{found}: missing column(s) {missing}")
    return table, found


def load_chexpert(
    root: Path | str,
    parties: int,
    split: str = "train",
    image_size: int = 32,
    uncertain: str = "zeros",
    max_patients: int = 0,
) -> VerticalDataset:
    """CheXpert's ``split`` as K parties, each holding one image of the same patient (the patient's first K
    images in file order); patients with fewer than K images are dropped and counted. Labels are the 14
    observations as a multi-label 0/1 matrix: blank -> 0, uncertain -> ``uncertain`` ('zeros' | 'ones')."""
    root = Path(root)
    if parties < 2:
        raise DataError(f"CheXpert: parties={parties}; at least 2 (one image of the patient per party)")
    if uncertain not in UNCERTAIN_POLICIES:
        raise DataError(f"CheXpert: uncertain={uncertain!r}; allowed {sorted(UNCERTAIN_POLICIES)}")
    table, found = _chexpert_table(root, split)
    patients = table["Path"].map(lambda p: CHEXPERT_PATIENT.search(str(p)))
    if patients.isna().any():
        raise DataError(f"{found}: Path {table.loc[patients.isna(), 'Path'].iloc[0]!r} names no patient<id> folder")
    table = table.assign(patient=[m["patient"] for m in patients])
    grouped = [(pid, rows) for pid, rows in table.groupby("patient", sort=False)]
    kept = [(pid, rows.iloc[:parties]) for pid, rows in grouped if len(rows) >= parties]
    if max_patients > 0:
        kept = kept[:max_patients]
    if not kept:
        raise DataError(f"{found}: no patient has {parties} images")
    base = found.parent.parent if found.parent.name == "CheXpert-v1.0-small" else found.parent
    views: list[list[np.ndarray]] = [[] for _ in range(parties)]
    targets = []
    for _, rows in kept:
        for party, path in enumerate(rows["Path"]):
            views[party].append(_grayscale_pixels(base / path, image_size))
        observed = rows.iloc[0][list(CHEXPERT_OBSERVATIONS)].astype(float).fillna(0.0)
        targets.append(observed.replace(-1.0, UNCERTAIN_POLICIES[uncertain]).to_numpy())
    ids = [f"patient{pid}" for pid, _ in kept]
    frames = [_pixel_frame(ids, party_views, image_size) for party_views in views]
    dropped = len(grouped) - len(kept)
    notes = [
        f"CheXpert {found.name}: {len(kept)} patients with >= {parties} images (party j: the patient's image j; "
        f"labels from the first image's study), grayscale {image_size}x{image_size}",
        f"patients dropped (fewer than {parties} images, or past max_patients): {dropped}",
        f"14 observations multi-label: blank -> 0, uncertain -> {UNCERTAIN_POLICIES[uncertain]:g} (U-{uncertain})",
    ]
    return VerticalDataset(
        f"chexpert-k{parties}",
        frames,
        np.stack(targets).astype(np.float32),
        parties - 1,
        "multilabel",
        notes,
        [(1, image_size, image_size)] * parties,
        [dropped] * parties,
    )
