"""Where each archive stands locally: its ``.verified.json`` record, and the free disk the rest of
the build needs.

Only a file whose sha256 equals its pin is published as ``archives/<path>``, next to a verification
record ``archives/<path>.verified.json`` (path, size, inode, mtime_ns, ctime_ns, sha256, the source
it was verified from: repo_type, repo_id, revision; verified_at). A later call that finds a record
matching the file's (inode, size, mtime_ns, ctime_ns) and the pinned sha256 trusts the file without
reading it. Any other stat means the bytes may have changed (size and mtime can be restored after
an edit; the ctime cannot): the file is re-hashed, never trusted and never deleted
(``check_existing``). A record of another source than the profile's (``record_origin``: a repo or
revision changed in the profile) makes the download step ask the hub, as a first download does,
before the file stands for the new source.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from .. import layout
from ..formats.sha256sums import read_regular_bytes
from ..fsutil import human_bytes, require_free_space
from ..hashing import sha256_file
from ..oserrors import fs_error
from ..profile import ArchiveSpec, Profile
from ..publish import atomic_write_json
from ..publish.lock import current_build_id

log = logging.getLogger(__name__)

EXTRACTION_FACTOR = 1.15
"""Extracted bytes per archive byte (tars are uncompressed; file-system overhead for many small
files). With it, archives + extraction = 2.15 x archive bytes: 230 GiB for 107 GiB (kit-format §5)."""


@dataclass
class ArchiveState:
    path: str
    state: Literal["missing", "partial", "verified", "unverified"]
    bytes_local: int
    size: int | None  # the pinned size
    sha256: str | None  # the verified sha256 (from the record) when verified, else None
    origin: tuple[Any, Any, Any] | None = None  # the record's source (``record_origin``) when verified


def _read_record(record: Path) -> dict[str, Any] | None:
    """The record at ``record``; None when absent or unreadable. Something there that is not a
    regular file (a FIFO: never opened for reading, nothing blocks) is unreadable: the archive is
    then unverified, hashed again, and its record written anew in its place."""
    try:
        data = json.loads(read_regular_bytes(record).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _record_matches(rec: dict[str, Any] | None, spec: ArchiveSpec, st: os.stat_result) -> bool:
    return (
        rec is not None
        and spec.pinned
        and rec.get("path") == spec.path
        and rec.get("size") == spec.size == st.st_size
        and rec.get("inode") == st.st_ino
        and rec.get("mtime_ns") == st.st_mtime_ns
        and rec.get("ctime_ns") == st.st_ctime_ns
        and rec.get("sha256") == spec.sha256
    )


#: (repo_type, repo_id, revision): the source a verified archive came from
Origin = tuple[str, str, str]


class _Source(Protocol):
    @property
    def repo_type(self) -> str: ...
    @property
    def repo_id(self) -> str: ...
    @property
    def revision(self) -> str: ...


def source_origin(source: _Source) -> Origin:
    """What an archive's record names as the source it was verified from: the profile's ``[source]``
    or the hub source made from it."""
    return (source.repo_type, source.repo_id, source.revision)


def _origin(rec: dict[str, Any]) -> tuple[Any, Any, Any]:
    return (rec.get("repo_type"), rec.get("repo_id"), rec.get("revision"))


def record_origin(data_root: Path, spec: ArchiveSpec) -> tuple[Any, Any, Any] | None:
    """The source the archive's record says it was verified from (``None`` fields for a record of
    an earlier stage2, which kept the revision only); None without a record."""
    rec = _read_record(layout.verified_record_path(data_root, spec.path))
    return None if rec is None else _origin(rec)


def set_record_origin(data_root: Path, spec: ArchiveSpec, origin: Origin) -> None:
    """The archive's record, now naming ``origin`` (the hub confirmed the file there)."""
    path = layout.verified_record_path(data_root, spec.path)
    rec = _read_record(path)
    if rec is not None:
        rec.update(zip(("repo_type", "repo_id", "revision"), origin, strict=True))
        atomic_write_json(path, rec)


def _write_record(data_root: Path, spec: ArchiveSpec, final: Path, sha256: str, origin: Origin) -> None:
    st = final.stat()
    repo_type, repo_id, revision = origin
    atomic_write_json(
        layout.verified_record_path(data_root, spec.path),
        {
            "path": spec.path,
            "size": st.st_size,
            "inode": st.st_ino,
            "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns,
            "sha256": sha256,
            "repo_type": repo_type,
            "repo_id": repo_id,
            "revision": revision,
            "verified_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            # the build that hashed these bytes (None outside a build): an extraction in another
            # build hashes them again (:func:`hashed_by_this_build`)
            "build_id": current_build_id(data_root),
        },
    )


def hashed_by_this_build(data_root: Path, spec: ArchiveSpec) -> bool:
    """Whether the archive's ``.verified.json`` was written by the build that holds the data root
    now: its bytes were hashed against the pin by this build. A record of an earlier build (or of
    a run outside a build) says only what stats the bytes had when some build hashed them; a record
    edited together with the archive would say the same."""
    build = current_build_id(data_root)
    rec = _read_record(layout.verified_record_path(data_root, spec.path))
    return build is not None and rec is not None and rec.get("build_id") == build


def archive_state(data_root: Path, spec: ArchiveSpec) -> ArchiveState:
    """Where an archive stands locally, without hashing: verified (a matching record), unverified
    (the final file without a matching record), partial (a download in progress) or missing."""
    final = layout.archive_path(data_root, spec.path)
    part = layout.partial_path(data_root, spec.path)
    try:
        st = final.stat()
    except FileNotFoundError:
        st = None
    if st is not None:
        rec = _read_record(layout.verified_record_path(data_root, spec.path))
        if _record_matches(rec, spec, st):
            assert rec is not None
            return ArchiveState(spec.path, "verified", st.st_size, spec.size, spec.sha256, _origin(rec))
        return ArchiveState(spec.path, "unverified", st.st_size, spec.size, None)
    try:
        return ArchiveState(spec.path, "partial", part.stat().st_size, spec.size, None)
    except FileNotFoundError:
        return ArchiveState(spec.path, "missing", 0, spec.size, None)


def remaining_download_bytes(data_root: Path, spec: ArchiveSpec) -> int:
    """The archive bytes a build downloads for ``spec`` (of its pinned size; an unpinned archive
    counts 0): none when verified, the rest of a partial download, the whole archive when it is
    missing, and when what stands where it goes is not verified (no record matching its stats) and
    is not a regular file of the pinned size (truncated or longer, a folder, a FIFO): a build moves
    it aside (kept under the data root: its bytes stay on this disk) and downloads the archive in
    full. A regular file of the pinned size is hashed first and downloaded again only when it does
    not match its pin, which only hashing tells: it counts 0, as a copied data root's archives
    (another inode, the same bytes) must (should its bytes differ, a download that fills the disk
    is a named error that keeps what it wrote)."""
    st = archive_state(data_root, spec)
    size = spec.size or 0
    if st.state == "verified":
        return 0
    if st.state == "partial":
        return max(0, size - st.bytes_local)
    if st.state == "unverified" and _regular_size(data_root, spec) == spec.size:
        return 0  # hashed first: downloaded again only if it does not match its pin
    return size


def _regular_size(data_root: Path, spec: ArchiveSpec) -> int | None:
    """The size of the regular file at the archive's path (a link followed, as a download opens
    it), or None (none there, or not a regular file)."""
    try:
        st = layout.archive_path(data_root, spec.path).stat()
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _extraction_kept(data_root: Path, cache_key: str, specs: list[ArchiveSpec]) -> bool:
    """Whether a build keeps the extraction of ``cache_key`` once every archive of it is verified
    at its pin (what the acquire stage leaves): its folder is there and its record (read, not
    hashed) was made by this extractor, is not invalidated and names exactly these archives with
    their pinned sha256. Else the build extracts it (again). A file of the folder changed since its
    record is found by the extract stage's check, not here (no walk, no hashing)."""
    from ..extract import EXTRACTOR_VERSION, load_extraction_record

    if not layout.cache_dir(data_root, cache_key).is_dir():
        return False
    rec = load_extraction_record(data_root, cache_key)
    return (
        rec is not None
        and rec.cache_key == cache_key
        and rec.extractor_version == EXTRACTOR_VERSION
        and not rec.invalidated
        and dict(rec.archive_sha256) == {a.path: a.sha256 for a in specs}
    )


def required_free_parts(profile: Profile, data_root: Path) -> tuple[int, int]:
    """(archive bytes a build will still download: :func:`remaining_download_bytes`, a regular
    file of the pinned size not verified counted 0: a build hashes it and downloads nothing when
    it matches, which a copied or moved data root's archives (another inode) and archives placed
    for an offline build do; bytes the extraction of every cache key the build extracts
    (again) will write: ``EXTRACTION_FACTOR`` x its archive bytes, for every key whose extraction
    it does not keep (:func:`_extraction_kept`: no record or no folder, another extractor's, an
    invalidated one, or one of other archives or sha256 than the pins). What a free-disk check,
    ``stage2 list`` and ``stage2 build --dry-run`` count. An unpinned archive counts 0: pin first."""
    remaining = sum(remaining_download_bytes(data_root, a) for a in profile.archives)
    extraction = 0
    for key, specs in profile.archives_by_cache_key().items():
        if not _extraction_kept(data_root, key, specs):
            extraction += int(sum(a.size or 0 for a in specs) * EXTRACTION_FACTOR)
    return remaining, extraction


def required_free_bytes(profile: Profile, data_root: Path) -> int:
    """Free disk the rest of the build needs (:func:`required_free_parts`): the archive bytes it may
    still download, plus ``EXTRACTION_FACTOR`` x the archive bytes of every cache key it extracts
    (again). (An unpinned archive counts 0: pin first.)"""
    return sum(required_free_parts(profile, data_root))


def require_build_space(profile: Profile, data_root: Path) -> int:
    """Refuse (DiskSpaceError naming the bytes needed, the bytes free and the data root) when the free
    disk at ``data_root`` is below what the rest of the build needs; returns the bytes needed."""
    data_root = Path(data_root)
    download, extraction = required_free_parts(profile, data_root)
    needed = download + extraction
    if needed:
        big = max(profile.archives, key=lambda a: a.size or 0)
        require_free_space(
            data_root,
            needed,
            f"the rest of the build of profile {profile.name} ({needed} bytes: {human_bytes(download)} of "
            f"archives to download + {human_bytes(extraction)} to extract)",
            largest=(f"archive {big.path}", big.size or 0),
        )
    return needed


@dataclass(frozen=True)
class LocalFile:
    """A final archive file that disagrees with its pin: what it holds (hashed) and its record."""

    path: Path
    size: int
    sha256: str
    record: dict[str, Any] | None  # its ``.verified.json`` as read (None: absent or unreadable)


def check_existing(
    spec: ArchiveSpec, data_root: Path, final: Path, origin: Origin, reverify: bool
) -> str | LocalFile:
    """The pinned sha256 when the final file is good: its record matches its (inode, size,
    mtime_ns, ctime_ns) (nothing read), or it is re-hashed equal to its pin (its record rewritten).
    Otherwise the file as hashed (``LocalFile``): nothing is moved or deleted here; the caller asks
    which side is wrong (``download._settle``)."""
    record = layout.verified_record_path(data_root, spec.path)
    st = final.stat()
    rec = _read_record(record)
    if not reverify and _record_matches(rec, spec, st):
        return str(spec.sha256)
    try:
        digest = sha256_file(final)
    except OSError as e:
        raise fs_error(e, f"reading {final} to check it against its pin") from e
    if st.st_size == spec.size and digest == spec.sha256:
        _write_record(data_root, spec, final, digest, origin)
        return digest
    return LocalFile(final, st.st_size, digest, rec)


def verified_sha256s(profile: Profile, data_root: Path, cache_key: str) -> dict[str, str | None]:
    """archive path -> its pinned sha256 when its ``.verified.json`` record matches the file (a stat
    and a small read; nothing hashed), else None; for the archives of ``cache_key``."""
    return {
        a.path: (a.sha256 if archive_state(data_root, a).state == "verified" else None)
        for a in profile.archives_by_cache_key()[cache_key]
    }
