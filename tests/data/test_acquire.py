"""acquire(): verified, atomic copies; safe_extract(): hostile archives are refused."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from fedrepro.data.acquire import acquire, acquire_own, load_checksums, load_sources, safe_extract
from fedrepro.errors import DataError

MIRROR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "raw"
FILES = {"toy/a.txt": b"alpha\n", "toy/sub/b.bin": b"\x00\x01beta"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def mirror(tmp_path):
    """A two-file fake mirror plus the checksum table describing it (and one optional file it lacks)."""
    root = tmp_path / "mirror"
    for rel, data in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    table = {"toy": {rel: {"sha256": sha(d), "bytes": len(d), "optional": False} for rel, d in FILES.items()}}
    table["toy"]["toy/LICENSE"] = {"sha256": sha(b"x"), "bytes": 1, "optional": True}
    return root, table


def test_mirror_happy_path(mirror, tmp_path):
    root, table = mirror
    out = tmp_path / "out"
    manifest = acquire(["toy"], "mirror", root, out, progress=False, checksums=table)
    for rel, data in FILES.items():
        assert (out / rel).read_bytes() == data
    assert {f["path"] for f in manifest["files"]} == set(FILES)
    assert manifest["collections"]["toy"]["missing_optional"] == ["toy/LICENSE"]
    assert (out / "acquire_manifest.json").is_file()


def test_corrupted_file_names_both_hashes(mirror, tmp_path):
    root, table = mirror
    (root / "toy/a.txt").write_bytes(b"tampered\n")
    with pytest.raises(DataError) as err:
        acquire(["toy"], "mirror", root, tmp_path / "out", progress=False, checksums=table)
    msg = str(err.value)
    assert "toy/a.txt" in msg and sha(b"alpha\n") in msg and sha(b"tampered\n") in msg


def test_missing_file_names_file_and_mirror(mirror, tmp_path):
    root, table = mirror
    (root / "toy/sub/b.bin").unlink()
    with pytest.raises(DataError, match="toy/sub/b.bin") as err:
        acquire(["toy"], "mirror", root, tmp_path / "out", progress=False, checksums=table)
    assert str(root) in str(err.value)


def test_failure_leaves_previous_output_untouched(mirror, tmp_path):
    root, table = mirror
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("previous run")
    (root / "toy/sub/b.bin").write_bytes(b"bad")  # fails after toy/a.txt was already copied
    with pytest.raises(DataError):
        acquire(["toy"], "mirror", root, out, progress=False, checksums=table)
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror", "out"]  # no temp dirs left


def test_unknown_collection_lists_allowed(mirror, tmp_path):
    root, table = mirror
    with pytest.raises(DataError, match=r"unknown collection.*\['toy'\]"):
        acquire(["nope"], "mirror", root, tmp_path / "out", progress=False, checksums=table)


def test_official_download_with_file_urls(mirror, tmp_path):
    """The download path is real urllib code; file:// URLs exercise it without a network."""
    root, table = mirror
    del table["toy"]["toy/LICENSE"]
    sources = {"toy": {rel: {"url": (root / rel).as_uri()} for rel in FILES}}
    acquire(["toy"], "official", None, tmp_path / "out", progress=False, checksums=table, sources=sources)
    assert (tmp_path / "out/toy/sub/b.bin").read_bytes() == FILES["toy/sub/b.bin"]
    bad_url = (tmp_path / "nowhere.txt").as_uri()
    sources["toy"]["toy/a.txt"]["url"] = bad_url
    with pytest.raises(DataError, match="download failed for " + bad_url):
        acquire(["toy"], "official", None, tmp_path / "out2", progress=False, checksums=table, sources=sources)
    assert not (tmp_path / "out2").exists()


GUEST, HOST = b"id,y,x0\n1,0,0.5\n2,1,0.25\n", b"id,x1\n1,3\n2,4\n"
CLINIC = {"fate_vfl/clinic_hetero_guest.csv": GUEST, "fate_vfl/clinic_hetero_host.csv": HOST}


def _with_clinic(root: Path) -> dict[str, str]:
    """The user's own FATE-style table in the mirror, and its data.own_files declaration."""
    for rel, data in CLINIC.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return {rel: sha(data) for rel, data in CLINIC.items()}


def test_own_files_declared_in_params_are_copied_and_checked_beside_the_known_ones(mirror, tmp_path):
    root, table = mirror
    own = _with_clinic(root)
    manifest = acquire(
        ["toy"],
        "mirror",
        root,
        tmp_path / "out",
        progress=False,
        checksums=table,
        own_files=own,
        vertical_sets={"clinic": ["host"]},
    )
    assert (tmp_path / "out/fate_vfl/clinic_hetero_host.csv").read_bytes() == HOST
    assert {f["path"] for f in manifest["files"] if f.get("own")} == set(CLINIC)
    assert "fate_vfl" not in table  # the injected table is not edited


def test_an_own_file_that_differs_from_its_declared_sha256_is_refused(mirror, tmp_path):
    root, table = mirror
    own = _with_clinic(root)
    (root / "fate_vfl/clinic_hetero_host.csv").write_bytes(b"id,x1\n1,3\n")
    with pytest.raises(
        DataError,
        match=f"fate_vfl/clinic_hetero_host.csv: sha256 mismatch, expected {own['fate_vfl/clinic_hetero_host.csv']}",
    ):
        acquire(["toy"], "mirror", root, tmp_path / "out", progress=False, checksums=table, own_files=own)
    assert not (tmp_path / "out").exists()


def test_a_vertical_set_with_an_undeclared_file_names_it_and_how_to_declare_it(mirror, tmp_path):
    """The file sits in the mirror but nobody declared it: acquire used to skip it and prepare said it was missing."""
    root, table = mirror
    own = _with_clinic(root)
    del own["fate_vfl/clinic_hetero_host.csv"]
    with pytest.raises(DataError) as error:
        acquire(
            ["toy"],
            "mirror",
            root,
            tmp_path / "out",
            progress=False,
            checksums=table,
            own_files=own,
            vertical_sets={"clinic": ["host"]},
        )
    assert str(error.value) == (
        "params: data.vertical_sets.clinic needs fate_vfl/clinic_hetero_host.csv, which has no checksum: declare it in "
        "data.own_files as `fate_vfl/clinic_hetero_host.csv: <sha256>` (sha256sum of your copy); the copy in "
        f"{root} has sha256 {sha(HOST)}"
    )
    with pytest.raises(DataError, match=r"data.vertical_sets.clinic = null, and no host file of it is declared"):
        acquire(
            ["toy"],
            "mirror",
            root,
            tmp_path / "out",
            progress=False,
            checksums=table,
            own_files=own,
            vertical_sets={"clinic": None},
        )


def test_own_files_come_from_the_mirror_at_the_official_and_embedded_sources(mirror, tmp_path):
    root, table = mirror
    own = _with_clinic(root)
    del table["toy"]["toy/LICENSE"]
    sources = {"toy": {rel: {"url": (root / rel).as_uri()} for rel in FILES}}
    acquire(
        ["toy"],
        "official",
        root,
        tmp_path / "out",
        progress=False,
        checksums=table,
        sources=sources,
        own_files=own,
        vertical_sets={"clinic": None},
    )  # null hosts: every declared clinic_hetero_host*.csv
    assert (tmp_path / "out/fate_vfl/clinic_hetero_guest.csv").read_bytes() == GUEST
    staging = tmp_path / "embedded"
    entries = acquire_own(own, {"clinic": ["host"], "breast": None}, root, staging)  # breast is the package's: left out
    assert [e["path"] for e in entries] == sorted(CLINIC) and (staging / "fate_vfl/clinic_hetero_host.csv").is_file()
    with pytest.raises(DataError, match="data.vertical_sets.clinic needs fate_vfl/clinic_hetero_host_2.csv"):
        acquire_own(own, {"clinic": ["host", "host_2"]}, root, tmp_path / "embedded2")
    with pytest.raises(
        DataError, match="data.vertical_sets.clinic needs fate_vfl/clinic_hetero_guest.csv, which has no checksum"
    ):
        acquire_own({}, {"clinic": ["host"]}, root, tmp_path / "embedded3")  # a set the package does not know
    (root / "fate_vfl/clinic_hetero_host.csv").unlink()
    with pytest.raises(
        DataError, match="fate_vfl/clinic_hetero_host.csv: params: data.own_files declares it, but it is missing"
    ):
        acquire_own(own, {"clinic": ["host"]}, root, tmp_path / "embedded4")  # the same words as at the other sources


def test_a_collection_of_your_own_without_declared_files_is_refused(mirror, tmp_path):
    root, table = mirror
    with pytest.raises(
        DataError,
        match=r"'bank_faq' is a collection or corpus of your own .* data.own_files declares no "
        r"file under bank_faq/",
    ):
        acquire(
            ["toy"], "mirror", root, tmp_path / "out", progress=False, checksums=table, own_collections=["bank_faq"]
        )


def test_official_member_of_archive(tmp_path):
    """Files shipped inside an archive (the PyPI sdist) are read out of the downloaded archive."""
    data = b"answers"
    archive = tmp_path / "pkg.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("pkg-1.0/answers.json.gz")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    table = {"t": {"t/answers.json.gz": {"sha256": sha(data), "bytes": len(data)}}}
    sources = {
        "t": {
            "t/answers.json.gz": {
                "url": archive.as_uri(),
                "member": "pkg-1.0/answers.json.gz",
                "archive_sha256": sha(archive.read_bytes()),
            }
        }
    }
    acquire(["t"], "official", None, tmp_path / "out", progress=False, checksums=table, sources=sources)
    assert (tmp_path / "out/t/answers.json.gz").read_bytes() == data


def test_packaged_tables_are_consistent():
    checksums, sources = load_checksums(), load_sources()
    assert set(checksums) == {"insuranceqa", "medquad", "bioasq", "fiqa", "privacyqa", "pgr", "chemprot", "fate_vfl"}
    for coll, files in checksums.items():
        assert set(files) == set(sources[coll])
        assert all(rel.startswith(coll + "/") and len(m["sha256"]) == 64 for rel, m in files.items())


# ----------------------------------------------------------------------------- safe_extract


def make_tar(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return path


def file_member(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info


def link_member(name: str, target: str, kind=tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    "bad",
    [
        file_member("../evil.txt"),
        file_member("ok/../../evil.txt"),
        file_member("/tmp/evil.txt"),
        link_member("link", "../../etc"),
        link_member("link", "/etc/passwd"),
        link_member("hard", "../outside.txt", tarfile.LNKTYPE),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "symlink-rel", "symlink-abs", "hardlink"],
)
def test_malicious_tar_refused(tmp_path, bad):
    archive = make_tar(tmp_path / "bad.tar.gz", [file_member("good.txt"), bad])
    dest = tmp_path / "dest"
    with pytest.raises(DataError) as err:
        safe_extract(archive, dest)
    assert "bad.tar.gz" in str(err.value) and bad.name in str(err.value)
    assert list(dest.iterdir()) == []  # checked before anything is written


@pytest.mark.parametrize("name", ["../evil.txt", "/abs/evil.txt", "a/../../evil.txt"])
def test_malicious_zip_refused(tmp_path, name):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("good.txt", "ok")
        zf.writestr(zipfile.ZipInfo(name), "evil")
    with pytest.raises(DataError, match="bad.zip") as err:
        safe_extract(archive, tmp_path / "dest")
    assert name in str(err.value)
    assert not (tmp_path / "evil.txt").exists()


def test_safe_extract_benign(tmp_path):
    archive = make_tar(tmp_path / "ok.tgz", [file_member("d/a.xml"), link_member("d/l", "a.xml")])
    assert safe_extract(archive, tmp_path / "dest") == ["d/a.xml", "d/l"]
    assert (tmp_path / "dest/d/a.xml").read_bytes() == b"x"
    zpath = tmp_path / "ok.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("z/b.txt", "b")
    safe_extract(zpath, tmp_path / "zdest")
    assert (tmp_path / "zdest/z/b.txt").read_text() == "b"


# ----------------------------------------------------------------------------- real mirror


@pytest.mark.mirror
def test_real_mirror_verifies(tmp_path):
    if not MIRROR.is_dir():
        pytest.skip(f"raw-data mirror not found at {MIRROR}")
    collections = list(load_checksums())
    manifest = acquire(collections, "mirror", MIRROR, tmp_path / "raw", progress=False)
    assert len(manifest["files"]) == 114
    assert all(not v["missing_optional"] for v in manifest["collections"].values())
