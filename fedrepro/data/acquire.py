"""Fetch the raw files (official URLs or a local mirror), verify every byte, publish atomically.

Checksums and sources live next to this module (``checksums.json``, ``sources.json``) so the
pipeline pins exactly the bytes that MANIFEST.md describes; tests inject their own tables. A user's own files are
declared in params (``data.own_files``: path under the mirror -> sha256), never by editing those tables, and are
read from ``data.mirror`` at any source.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Sequence

from tqdm import tqdm

from fedrepro.data.vertical import fate_files, own_vertical_sets
from fedrepro.errors import DataError
from fedrepro.io import atomic_dir, write_json

HERE = Path(__file__).resolve().parent
SOURCES = ("official", "mirror")
CHUNK = 1 << 20


def load_checksums() -> dict[str, dict[str, dict[str, Any]]]:
    """{collection: {relative path: {sha256, bytes, optional}}}, taken from MANIFEST.md."""
    with open(HERE / "checksums.json", encoding="utf-8") as handle:
        return json.load(handle)


def load_sources() -> dict[str, dict[str, dict[str, Any]]]:
    """{collection: {relative path: {url, [member, archive_sha256] | [repacked]}}}."""
    with open(HERE / "sources.json", encoding="utf-8") as handle:
        return json.load(handle)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_file(path: Path, rel: str, expected: dict[str, Any]) -> None:
    """A wrong byte anywhere must stop the pipeline before it trains on corrupted data."""
    actual = sha256_of(path)
    if actual != expected["sha256"]:
        raise DataError(f"{rel}: sha256 mismatch, expected {expected['sha256']}, got {actual}")
    size = path.stat().st_size
    if "bytes" in expected and size != expected["bytes"]:
        raise DataError(f"{rel}: size mismatch, expected {expected['bytes']} bytes, got {size}")


def own_checksums(own_files: Mapping[str, str]) -> dict[str, dict[str, dict[str, Any]]]:
    """The user's files as checksum entries, grouped by their collection folder (the path's first part)."""
    grouped: dict[str, dict[str, dict[str, Any]]] = {}
    for rel, sha in sorted(own_files.items()):
        grouped.setdefault(rel.split("/", 1)[0], {})[rel] = {"sha256": sha, "own": True}
    return grouped


def check_declared(vertical_sets: Mapping[str, Sequence[str] | None], declared: set[str], mirror: Path | None) -> None:
    """Every file a configured vertical set needs has a checksum, the package's or the user's. Without this an
    undeclared file was skipped by acquire and reported missing by prepare, though it sat in the mirror."""
    for name, hosts in vertical_sets.items():
        needed = fate_files(name, hosts, declared)
        if hosts is None and len(needed) == 1:
            raise DataError(
                f"params: data.vertical_sets.{name} = null, and no host file of it is declared; list its host "
                f"tags (for example {name}: [host]) and declare each file in data.own_files"
            )
        for rel in needed:
            if rel in declared:
                continue
            found = mirror is not None and (Path(mirror) / rel).is_file()
            seen = (
                f"; the copy in {mirror} has sha256 {sha256_of(Path(mirror) / rel)}"
                if found
                else f", and it is not in {mirror}"
            )
            raise DataError(
                f"params: data.vertical_sets.{name} needs {rel}, which has no checksum: declare it in "
                f"data.own_files as `{rel}: <sha256>` (sha256sum of your copy){seen}"
            )


def _mirror_dir(mirror: str | os.PathLike | None, why: str) -> Path:
    if mirror is None:
        raise DataError(f"params: {why} needs data.mirror, a local directory laid out like the public sources")
    if not Path(mirror).is_dir():
        raise DataError(f"params: data.mirror = {str(mirror)!r}: the directory does not exist")
    return Path(mirror)


def _copy_verified(src: Path, dest: Path, rel: str, meta: dict[str, Any]) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    verify_file(dest, rel, meta)


def _copy_from_mirror(mirror: Path, rel: str, meta: dict[str, Any], staging: Path) -> bool:
    """``rel`` from the mirror into ``staging``, verified; False when an optional file is absent. A required file that
    is absent stops the stage, naming it and the mirror (and that data.own_files declares it, for the user's own)."""
    src = mirror / PurePosixPath(rel)
    if not src.is_file():
        if meta.get("optional"):
            return False
        declared = "params: data.own_files declares it, but it is " if meta.get("own") else ""
        raise DataError(f"{rel}: {declared}missing from mirror {mirror}")
    _copy_verified(src, staging / PurePosixPath(rel), rel, meta)
    return True


def _manifest_entry(rel: str, meta: dict[str, Any], path: Path) -> dict[str, Any]:
    entry = {"path": rel, "sha256": meta["sha256"], "bytes": path.stat().st_size}
    return {**entry, "own": True} if meta.get("own") else entry


def acquire_own(
    own_files: Mapping[str, str],
    vertical_sets: Mapping[str, Sequence[str] | None],
    mirror: str | os.PathLike | None,
    staging: Path,
    checksums: dict | None = None,
) -> list[dict[str, Any]]:
    """The user's own files into ``staging`` at the embedded source, verified. A vertical set the package does not
    know, or whose guest the user declared, must be wholly declared. Returns the files' manifest entries."""
    known = {rel for files in (load_checksums() if checksums is None else checksums).values() for rel in files}
    users = {
        name: hosts
        for name, hosts in vertical_sets.items()
        if name in own_vertical_sets(vertical_sets, own_files) or fate_files(name, hosts, set())[0] not in known
    }
    if not own_files and not users:
        return []
    root = _mirror_dir(mirror, "data.own_files")
    check_declared(users, set(own_files), root)
    entries = []
    for rel, meta in sorted((rel, meta) for group in own_checksums(own_files).values() for rel, meta in group.items()):
        _copy_from_mirror(root, rel, meta, staging)
        entries.append(_manifest_entry(rel, meta, staging / PurePosixPath(rel)))
    return entries


def _download(url: str, dest: Path) -> None:
    """Stream one URL to ``dest``; any network failure becomes a DataError naming the URL."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as out:
            shutil.copyfileobj(response, out, CHUNK)
    except Exception as exc:  # URLError, HTTPError, timeouts, ... all mean the same to the user
        raise DataError(f"download failed for {url}: {exc}") from exc


def _fetch_official(rel: str, entry: dict[str, Any] | None, dest: Path, cache: dict[str, Path], scratch: Path) -> None:
    """Download one file; archive members (PyPI sdist) are fetched once and read from the archive."""
    if not entry or not entry.get("url"):
        raise DataError(f"{rel}: no official URL in sources.json; use data.source=mirror")
    url = entry["url"]
    if entry.get("repacked"):
        raise DataError(
            f"{rel}: re-packed from {url} ({entry['repacked']}); it cannot be verified against "
            "the manifest checksum when rebuilt, use data.source=mirror"
        )
    if "member" not in entry:
        _download(url, dest)
        return
    if url not in cache:
        archive = scratch / f"archive-{len(cache)}"
        _download(url, archive)
        if entry.get("archive_sha256") and sha256_of(archive) != entry["archive_sha256"]:
            raise DataError(f"{url}: sha256 mismatch, expected {entry['archive_sha256']}, got {sha256_of(archive)}")
        cache[url] = archive
    with tarfile.open(cache[url]) as tar:
        try:
            member = tar.extractfile(entry["member"])
        except KeyError:
            member = None
        if member is None:
            raise DataError(f"{url}: archive has no regular file {entry['member']!r} (needed for {rel})")
        with open(dest, "wb") as out:
            shutil.copyfileobj(member, out, CHUNK)


def acquire(
    collections: list[str],
    source: str,
    mirror: str | os.PathLike | None,
    out_dir: str | os.PathLike,
    progress: bool = True,
    checksums: dict | None = None,
    sources: dict | None = None,
    own_files: Mapping[str, str] | None = None,
    vertical_sets: Mapping[str, Sequence[str] | None] | None = None,
    own_collections: Sequence[str] = (),
) -> dict[str, Any]:
    """Copy/download every file of ``collections`` and the user's ``own_files`` into ``out_dir`` (same relative
    paths), verified. Every file the ``vertical_sets`` need must be declared (``check_declared``), and each of the
    user's ``own_collections`` must have files.

    Everything is staged in a temporary sibling directory and renamed at the end, so a missing or
    corrupted file leaves ``out_dir`` untouched. Optional files (licences, unused variants) may be
    absent from a mirror; they are reported, not fatal.
    """
    checksums = {c: dict(files) for c, files in (load_checksums() if checksums is None else checksums).items()}
    if source not in SOURCES:
        raise DataError(f"params: data.source = {source!r}; allowed {list(SOURCES)} (or embedded)")
    unknown = [c for c in collections if c not in checksums]
    if unknown:
        raise DataError(f"unknown collection(s) {unknown}; allowed {sorted(checksums)}")
    declared = own_checksums(own_files or {})
    for collection in own_collections:
        if collection not in declared:
            raise DataError(
                f"params: {collection!r} is a collection or corpus of your own (data.qa_layouts / "
                f"data.re_layouts), but data.own_files declares no file under {collection}/"
            )
    for collection, files in declared.items():
        checksums.setdefault(collection, {}).update(files)
        collections = list(dict.fromkeys([*collections, collection]))
    if source == "mirror" or own_files:
        mirror = _mirror_dir(mirror, "data.source = 'mirror'" if source == "mirror" else "data.own_files")
    if source != "mirror":
        sources = load_sources() if sources is None else sources
    check_declared(vertical_sets or {}, {rel for c in collections for rel in checksums[c]}, mirror)

    todo = [(c, rel, meta) for c in collections for rel, meta in sorted(checksums[c].items())]
    manifest: dict[str, Any] = {"source": source, "files": [], "collections": {}}
    for c in collections:
        manifest["collections"][c] = {"present": [], "missing_optional": []}
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as staging, tempfile.TemporaryDirectory(dir=out_dir.parent) as scratch:
        cache: dict[str, Path] = {}
        for coll, rel, meta in tqdm(todo, desc="acquire", unit="file", disable=not progress):
            dest = staging / PurePosixPath(rel)
            if source == "mirror" or meta.get("own"):
                if not _copy_from_mirror(mirror, rel, meta, staging):
                    manifest["collections"][coll]["missing_optional"].append(rel)
                    continue
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                _fetch_official(rel, sources.get(coll, {}).get(rel), dest, cache, Path(scratch))
                verify_file(dest, rel, meta)
            manifest["files"].append(_manifest_entry(rel, meta, dest))
            manifest["collections"][coll]["present"].append(rel)
        write_json(staging / "acquire_manifest.json", manifest)
    return manifest


def _inside(root: Path, candidate: Path) -> bool:
    return candidate == root or root in candidate.parents


def safe_extract(archive: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Extract a tar.gz/tgz/zip, refusing any member that would land or point outside ``dest``.

    Checks every member before writing anything, so a hostile archive leaves no files behind.
    Returns the member names.
    """
    archive, dest = Path(archive), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()

    def refuse(name: str, why: str) -> None:
        raise DataError(f"{archive}: refusing member {name!r} ({why})")

    def check_name(name: str) -> Path:
        if name.startswith(("/", "\\")) or PurePosixPath(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
            refuse(name, "absolute path")
        target = (root / name).resolve()
        if not _inside(root, target):
            refuse(name, "path escapes the destination")
        return target

    name = archive.name.lower()
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for m in members:
                target = check_name(m.name)
                if m.issym():
                    if PurePosixPath(m.linkname).is_absolute() or not _inside(
                        root, (target.parent / m.linkname).resolve()
                    ):
                        refuse(m.name, f"symlink to {m.linkname!r} outside the destination")
                elif m.islnk():
                    if PurePosixPath(m.linkname).is_absolute() or not _inside(root, (root / m.linkname).resolve()):
                        refuse(m.name, f"hard link to {m.linkname!r} outside the destination")
                elif not (m.isfile() or m.isdir()):
                    refuse(m.name, "device, fifo or other special member")
            tar.extractall(root, filter="data")
            return [m.name for m in members]
    if name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            for info in infos:
                check_name(info.filename)
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    refuse(info.filename, "symlink member")
            zf.extractall(root)
            return [i.filename for i in infos]
    raise DataError(f"{archive}: unsupported archive type; allowed .tar.gz, .tgz, .tar, .zip")
