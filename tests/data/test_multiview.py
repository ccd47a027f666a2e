"""ModelNet40 multi-view and CheXpert loaders on small fixtures written in the releases' published layouts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedrepro.data.multiview import CHEXPERT_OBSERVATIONS, load_chexpert, load_modelnet40, modelnet_view_groups
from fedrepro.data.prepare import empty_statistics, write_modelnet40
from fedrepro.errors import DataError
from fedrepro.ssvfnas.partition import build_partition


def _png(path, value: int, size: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size), value, dtype=np.uint8), mode="L").save(path)


def _modelnet(root, missing: tuple[str, str, int] | None = None, objects: int = 2):
    """Two classes x (train: objects 1..n, test: the next object) x 12 views; each view a flat gray of
    10 * view + object number."""
    for name in ("airplane", "chair"):
        for split, numbers in (("train", range(1, objects + 1)), ("test", [objects + 1])):
            for obj in numbers:
                for view in range(1, 13):
                    if missing == (name, f"{obj:04d}", view):
                        continue
                    _png(root / name / split / f"{name}_{obj:04d}_{view:03d}.png", 10 * view + obj)
    return root


def test_modelnet_view_groups_follow_the_released_loader():
    assert modelnet_view_groups(2) == [[i, i + 6] for i in range(6)]
    assert modelnet_view_groups(4) == [[0, 1, 2, 3], [6, 7, 8, 9]]
    with pytest.raises(DataError, match="parties=7"):
        modelnet_view_groups(7)


def test_modelnet40_deals_one_view_per_party_aligned_by_object(tmp_path):
    ds = load_modelnet40(_modelnet(tmp_path / "modelnet40v1png"), parties=2, image_size=4)
    assert ds.name == "modelnet40-k2" and ds.task == "classification" and ds.label_party == 1
    assert len(ds.labels) == 2 * 3 * 6 and set(ds.labels) == {0, 1}
    assert ds.shapes == [(1, 4, 4), (1, 4, 4)]
    assert ds.parties[0].iloc[0]["sample_id"] == ds.parties[1].iloc[0]["sample_id"] == "airplane_0001_v01"
    # party 0 holds view 1 (gray 11), party 1 the opposite view 7 (gray 71), scaled to [0, 1]
    assert np.allclose(ds.parties[0].iloc[0, 1:].to_numpy(float), 11 / 255)
    assert np.allclose(ds.parties[1].iloc[0, 1:].to_numpy(float), 71 / 255)
    assert list(ds.groups[:7]) == ["airplane_0001"] * 6 + ["airplane_0002"]
    assert (ds.release_split == "test").sum() == 2 * 6 and set(ds.groups[ds.release_split == "test"]) == {
        "airplane_0003",
        "chair_0003",
    }


def test_modelnet40_drops_an_object_missing_a_view_and_counts_it(tmp_path):
    ds = load_modelnet40(_modelnet(tmp_path / "m", missing=("chair", "0002", 9)), parties=4, image_size=4)
    assert len(ds.labels) == 5 * 2  # five complete objects, two view groups each
    assert ds.dropped == [1, 1, 1, 1]
    assert "dropped for a missing view: 1" in " ".join(ds.notes)


def test_modelnet40_errors_name_the_layout(tmp_path):
    (tmp_path / "m" / "chair" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="<class>/test/"):
        load_modelnet40(tmp_path / "m", parties=2)
    _png(tmp_path / "n" / "chair" / "train" / "chair_one.png", 1)
    with pytest.raises(DataError, match="chair_one.png"):
        load_modelnet40(tmp_path / "n", parties=2, splits=("train",))


def test_modelnet40_through_prepare_and_partition_keeps_objects_whole_and_the_test_split(tmp_path):
    """The pipeline's path: prepare writes the views with group and release split, the partition keeps the
    publisher's test objects as test and never puts one object's views in two splits."""
    stats = empty_statistics()
    write_modelnet40(tmp_path / "prepared", _modelnet(tmp_path / "m", objects=6), 4, 0, stats)
    assert set(stats["vertical"]) == {"modelnet40-k2", "modelnet40-k4"}
    _, labels, splits, summary = build_partition(
        tmp_path / "prepared" / "vertical" / "modelnet40-k2", "modelnet40", 2, 0.2, 0.5, 0, seed=0
    )
    objects = labels["sample_id"].str.rsplit("_", n=1).str[0]
    per_object = splits.assign(object=objects).groupby("object")["split"].nunique()
    assert (per_object == 1).all()
    test_objects = set(objects[splits["split"] == "test"])
    assert test_objects == {"airplane_0007", "chair_0007"}
    assert summary["splits"]["valid"] > 0 and summary["splits"]["train"] > 0
    assert summary["fractions"]["test"] == "the publisher's test split"


def _chexpert(root, rows: list[tuple[str, dict]]):
    folder = root / "CheXpert-v1.0-small"
    records = []
    for path, labels in rows:
        _png(root / path, 100)
        records.append({"Path": path, "Sex": "Female", **{o: labels.get(o) for o in CHEXPERT_OBSERVATIONS}})
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(records).to_csv(folder / "train.csv", index=False)
    return root


def test_chexpert_gives_each_party_one_image_of_the_same_patient(tmp_path):
    prefix = "CheXpert-v1.0-small/train"
    root = _chexpert(
        tmp_path,
        [
            (f"{prefix}/patient00001/study1/view1_frontal.jpg", {"Cardiomegaly": 1.0, "Edema": -1.0}),
            (f"{prefix}/patient00001/study1/view2_lateral.jpg", {"Cardiomegaly": 1.0, "Edema": -1.0}),
            (f"{prefix}/patient00002/study1/view1_frontal.jpg", {"No Finding": 1.0}),
            (f"{prefix}/patient00003/study1/view1_frontal.jpg", {"Pneumonia": 0.0}),
            (f"{prefix}/patient00003/study2/view1_frontal.jpg", {"Pneumonia": 1.0}),
        ],
    )
    ds = load_chexpert(root, parties=2, image_size=4)
    assert ds.task == "multilabel" and ds.labels.shape == (2, 14)
    assert list(ds.parties[0]["sample_id"]) == ["patient00001", "patient00003"]
    assert ds.dropped == [1, 1]  # patient00002 has one image
    cardiomegaly, edema = CHEXPERT_OBSERVATIONS.index("Cardiomegaly"), CHEXPERT_OBSERVATIONS.index("Edema")
    assert ds.labels[0, cardiomegaly] == 1 and ds.labels[0, edema] == 0  # uncertain -> 0 (U-Zeros)
    assert load_chexpert(root, parties=2, image_size=4, uncertain="ones").labels[0, edema] == 1
    assert ds.labels[1].sum() == 0  # patient00003's first study: Pneumonia negative


def test_chexpert_errors_name_the_file_and_field(tmp_path):
    with pytest.raises(DataError, match="no train table"):
        load_chexpert(tmp_path, parties=2)
    (tmp_path / "aggr_train.csv").write_text("Path,Edema\nx/patient1/a.jpg,1\n")
    with pytest.raises(DataError, match="aggr_train.csv: missing column"):
        load_chexpert(tmp_path, parties=2)
    with pytest.raises(DataError, match="uncertain='maybe'"):
        load_chexpert(tmp_path, parties=2, uncertain="maybe")
