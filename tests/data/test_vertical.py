"""Vertical datasets: FATE hetero CSVs on invented files, the digits halves default, and the mirror sets."""

from pathlib import Path

import numpy as np
import pytest

from fedrepro.data.vertical import digits_halves, digits_quarters, load_fate, vertical_statistics
from fedrepro.errors import DataError

MIRROR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "raw"


def write(path: Path, header: str, rows: list[str]):
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")


def test_fate_fixture_join_and_hosts(tmp_path):
    write(tmp_path / "toy_hetero_guest.csv", "id,x0,label", ["5,0.1,2", "7,0.2,0", "9,0.3,1", "11,0.4,2"])
    write(tmp_path / "toy_hetero_host.csv", "id,x0,x1", ["9,1,2", "5,3,4", "7,5,6", "13,7,8"])
    write(tmp_path / "toy_hetero_host_1.csv", "id,z", ["7,1", "5,2", "9,3", "11,4"])
    ds = load_fate(tmp_path, "toy")
    assert ds.label_party == 0 and ds.task == "classification" and len(ds.parties) == 3
    assert [p["sample_id"].tolist() for p in ds.parties] == [[5, 7, 9]] * 3  # guest order, inner join
    assert ds.parties[1]["x1"].tolist() == [4, 6, 2] and "label" not in ds.parties[0].columns
    assert ds.labels.tolist() == [2, 0, 1]  # label values 0,1,2 coded in sorted order
    assert any("toy_hetero_host.csv: 4 rows, 1 id" in n for n in ds.notes)
    assert any("toy_hetero_guest.csv: 4 rows, 1 id" in n for n in ds.notes)
    assert ds.dropped == [1, 1, 1] and ds.shapes == [None] * 3  # 11 (guest, host_1), 13 (host)
    one = load_fate(tmp_path, "toy", hosts=["host_1"])
    assert len(one.parties) == 2 and one.parties[1].columns.tolist() == ["sample_id", "z"]
    stats = vertical_statistics(ds)
    assert stats["features"].tolist() == [1, 2, 1] and stats["classes"].iloc[0] == 3
    with pytest.raises(DataError, match="toy_hetero_host_9.csv"):
        load_fate(tmp_path, "toy", hosts=["host_9"])
    with pytest.raises(DataError, match="nope_hetero_guest.csv"):
        write(tmp_path / "nope_hetero_host.csv", "id,a", ["1,1"])
        load_fate(tmp_path, "nope")


def test_fate_regression_detected(tmp_path):
    write(tmp_path / "m_hetero_guest.csv", "idx,motor_speed,a", ["1,0.5,1", "2,-1.25,2"])
    write(tmp_path / "m_hetero_host.csv", "idx,b", ["1,3", "2,4"])
    ds = load_fate(tmp_path, "m")
    assert ds.task == "regression" and ds.labels.dtype == np.float64


def test_digits_halves():
    ds = digits_halves()
    assert ds.name == "digits-halves" and ds.label_party == 1
    assert [p.shape for p in ds.parties] == [(1797, 33), (1797, 33)] and ds.labels.shape == (1797,)
    assert ds.parties[0].columns[1] == "px_0_0" and ds.parties[1].columns[1] == "px_0_4"
    assert len(np.unique(ds.labels)) == 10
    assert ds.shapes == [(1, 8, 4), (1, 8, 4)] and ds.dropped == [0, 0]


def test_digits_quarters_are_the_four_quadrants_of_the_same_images():
    halves, quarters = digits_halves(), digits_quarters()
    assert quarters.name == "digits-quarters" and quarters.label_party == 3 and len(quarters.parties) == 4
    assert quarters.shapes == [(1, 4, 4)] * 4 and np.array_equal(quarters.labels, halves.labels)
    assert [p.shape for p in quarters.parties] == [(1797, 17)] * 4
    assert quarters.parties[1].columns[1] == "px_0_4" and quarters.parties[2].columns[1] == "px_4_0"
    # the quadrants tile each image: the left half is the top-left over the bottom-left quadrant, row-major
    left = halves.parties[0].drop(columns="sample_id").to_numpy().reshape(-1, 8, 4)
    top_left = quarters.parties[0].drop(columns="sample_id").to_numpy().reshape(-1, 4, 4)
    bottom_left = quarters.parties[2].drop(columns="sample_id").to_numpy().reshape(-1, 4, 4)
    assert np.array_equal(left, np.concatenate([top_left, bottom_left], axis=1))


# published counts (MANIFEST): rows, guest features, features per host, classes (0 = regression)
FATE_SETS = {
    "breast": (569, 10, [20], 2),
    "breast_mini": (569, 3, [3], 2),
    "default_credit": (30000, 13, [10], 2),
    "dvisits": (5190, 3, [9], 0),
    "ionosphere_scale": (351, 15, [19], 2),
    "motor": (800, 4, [7, 3, 4], 0),
    "motor_mini": (800, 3, [3], 0),
    "student": (395, 6, [7], 0),
}


@pytest.mark.mirror
@pytest.mark.parametrize("name", sorted(FATE_SETS))
def test_mirror_fate(name):
    if not (MIRROR / "fate_vfl").is_dir():
        pytest.skip(f"raw-data mirror not found at {MIRROR / 'fate_vfl'}")
    rows, guest, hosts, classes = FATE_SETS[name]
    ds = load_fate(MIRROR, name)
    stats = vertical_statistics(ds)
    assert stats["rows"].tolist() == [rows] * (1 + len(hosts))
    assert stats["features"].tolist() == [guest, *hosts]
    assert ds.task == ("classification" if classes else "regression")
    if classes:
        assert len(np.unique(ds.labels)) == classes
    if name == "breast":
        assert np.bincount(ds.labels).tolist() == [212, 357]
