"""Extraction of one cache directory, all-or-nothing, and its records.

1. the archive is opened and every header read (:func:`.tar.open_archive_parts`);
2. every member is checked before anything is written (:func:`.safety._plan_members`);
3. the pre-validated members are copied into a staging folder next to the cache directory
   (``processed_datasets/.<key>.tmp-<owner>/``, see :mod:`stage2_data.publish`) straight from the
   archive file(s) with ``copy_file_range`` (in-kernel, no Python buffers; a ``pread``/``write``
   loop where the file system does not support it), then it is published in place
   (:func:`~stage2_data.publish.publish_dir`). A rerun first removes the staging folders of this
   cache key whose owner process is gone.

Member data is never held in memory: only the member headers (``TarInfo``) are.

The record (``reports/extraction/<cache_key>.json``) says what the extraction was made from (every
archive's verified sha256, :data:`EXTRACTOR_VERSION`) and what it left in place (file count, bytes,
and a digest of every file's path, size and mtime). :func:`check_extraction` compares it with the
archives' sha256 now and with one ``os.scandir`` walk of the cache directory (stats only, nothing is
read or hashed): an unchanged cache directory is neither re-extracted nor re-hashed, and anything
else is re-extracted with the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import layout
from ..errors import ArchiveError, Stage2Error
from ..fsutil import disk_full_as, require_free_space
from ..oserrors import fs_guard
from ..publish import atomic_write_bytes, atomic_write_json, current_umask, publish_dir, remove_stale, staging
from .safety import (
    REDOWNLOAD_FIX,
    _check_cache_key,
    _Plan,
    _plan_members,
    _unsafe_error,
    other_cache_key,
    profile_mismatch_error,
    quarantine_fix,
)
from .tar import _PartsTarFile, open_archive_parts

EXTRACTOR_VERSION = 1
"""Bump when extraction would leave different files for the same archive (names, bytes, modes,
times): every cache directory recorded by another version is then re-extracted."""

_CANCEL = threading.Event()  # set by cancel_extractions(): every extraction in this process stops


class ExtractionCancelled(Stage2Error):
    """The extraction was cancelled (:func:`cancel_extractions`, e.g. on a stop); nothing was
    published and its staging folder was removed."""


def cancel_extractions(cancel: bool = True) -> None:
    """Stop every extraction running in this process (``cancel=False`` lets extractions run again).

    An extraction checks this between members and between copy chunks, and raises
    :class:`ExtractionCancelled`: its staging folder is removed and nothing is published. Like
    ``stage2_data.acquire.cancel_downloads``: a stop calls it, because the main thread's interrupt
    does not reach the threads extractions run in."""
    if cancel:
        _CANCEL.set()
    else:
        _CANCEL.clear()


def check_cancel(archive: str) -> None:
    """Raise :class:`ExtractionCancelled` naming ``archive`` once :func:`cancel_extractions` was
    called: every unpacking of a tar in this process calls it between members (the kit's sidecars too)."""
    if _CANCEL.is_set():
        raise ExtractionCancelled(
            f"the extraction of {archive} was cancelled (a stop); nothing was published"
        )


@dataclass(frozen=True)
class TreeStat:
    """What a folder holds, from one ``os.scandir`` walk (stats only): entries that are not
    folders, their total size, and a sha256 of every such entry's (path, size, mtime_ns)."""

    files: int
    bytes: int
    digest: str


def scan_tree(root: Path) -> TreeStat | None:
    """:class:`TreeStat` of ``root`` (None when it is not a folder). Symbolic links are counted as
    files and not followed; temp names are counted too (a cache directory holds none)."""
    entries: list[tuple[str, int, int]] = []
    stack = [(os.fspath(root), "")]
    try:
        while stack:
            path, rel = stack.pop()
            with os.scandir(path) as it:
                for e in it:
                    name = f"{rel}{e.name}"
                    if e.is_dir(follow_symlinks=False):
                        stack.append((e.path, name + "/"))
                    else:
                        st = e.stat(follow_symlinks=False)
                        entries.append((name, st.st_size, st.st_mtime_ns))
    except (FileNotFoundError, NotADirectoryError):
        return None
    entries.sort()
    h = hashlib.sha256()
    for name, size, mtime in entries:
        h.update(f"{name}\0{size}\0{mtime}\n".encode("utf-8", "surrogateescape"))
    return TreeStat(len(entries), sum(e[1] for e in entries), h.hexdigest())


@dataclass
class ExtractionRecord:
    cache_key: str
    archives: list[str]
    files: int
    bytes: int
    frame_files: int
    rows: int
    total_trajectories: int
    seconds: float
    layout: str
    problems: list[str] = field(default_factory=list)
    # what the extraction was made from and with (absent from records of older versions)
    archive_sha256: dict[str, str] = field(default_factory=dict)  # archive path -> verified sha256
    extractor_version: int = 0
    tree_digest: str = ""  # TreeStat.digest of the cache directory as extracted

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExtractionRecord:
        return cls(
            cache_key=str(d["cache_key"]),
            archives=[str(a) for a in d["archives"]],
            files=int(d["files"]),
            bytes=int(d["bytes"]),
            frame_files=int(d["frame_files"]),
            rows=int(d["rows"]),
            total_trajectories=int(d["total_trajectories"]),
            seconds=float(d["seconds"]),
            layout=str(d["layout"]),
            problems=[str(p) for p in d.get("problems", [])],
            archive_sha256={str(k): str(v) for k, v in dict(d.get("archive_sha256") or {}).items()},
            extractor_version=int(d.get("extractor_version") or 0),
            tree_digest=str(d.get("tree_digest") or ""),
        )


def _write_members(
    tar: _PartsTarFile, plan: _Plan, tmp: Path, progress: Callable[[int], None] | None
) -> None:
    """Create the planned directories and files under ``tmp`` (which exists and is empty)."""
    reader = tar.reader
    assert reader is not None
    made: set[str] = {""}
    dir_fds: dict[str, int] = {}
    use_dir_fd = os.open in os.supports_dir_fd
    use_utime_fd = os.utime in os.supports_fd
    umask = current_umask()
    archive = tar.archive_name

    def step(n: int) -> None:  # between copy chunks: a cancellation point
        check_cancel(archive)
        if progress is not None:
            progress(n)

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)

    def ensure_dir(rel: str) -> None:
        if rel in made:
            return
        ensure_dir(rel.rpartition("/")[0])
        with contextlib.suppress(FileExistsError):
            os.mkdir(tmp / rel)
        made.add(rel)

    def open_dir(rel: str) -> int:
        fd = dir_fds.get(rel)
        if fd is None:
            if len(dir_fds) >= 64:
                for old in dir_fds.values():
                    os.close(old)
                dir_fds.clear()
            fd = os.open(tmp / rel, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
            dir_fds[rel] = fd
        return fd

    try:
        for rel, _m in plan.dirs:
            ensure_dir(rel)
        # Archive order = ascending offsets: the archive is read sequentially.
        for rel, m in plan.files:
            check_cancel(archive)  # between members
            parent, _, base = rel.rpartition("/")
            ensure_dir(parent)
            mode = m.mode & 0o755 | 0o600  # tarfile 'data' filter semantics
            if not m.mode & 0o100:
                mode &= ~0o111
            if use_dir_fd:
                fd = os.open(base, flags, mode, dir_fd=open_dir(parent))
            else:
                fd = os.open(tmp / rel, flags, mode)
            try:
                if m.size:
                    reader.copy_range_to(fd, m.offset_data, m.size, progress=step)
                if mode & umask:
                    os.fchmod(fd, mode)
                if use_utime_fd:
                    os.utime(fd, (m.mtime, m.mtime))
            finally:
                os.close(fd)
            if not use_utime_fd:
                os.utime(tmp / rel, (m.mtime, m.mtime))
    finally:
        for fd in dir_fds.values():
            os.close(fd)
    # Directory times last (deepest first), as tarfile does; directory modes are left to the
    # system default, as with tarfile's data filter.
    for rel, m in sorted(plan.dirs, key=lambda t: t[0], reverse=True):
        os.utime(tmp / rel, (m.mtime, m.mtime))


def extract_cache_dir(
    cache_key: str,
    archive_files: Sequence[Path],
    data_root: Path,
    *,
    progress: Callable[[int], None] | None = None,
    archive_sha256: Mapping[str, str | None] | None = None,
) -> ExtractionRecord:
    """Extract one cache directory's archive (a whole tar or all its split parts) into
    ``<data_root>/processed_datasets/<cache_key>/``, replacing an existing one atomically.

    ``progress`` is called with the number of member bytes just written (increments).
    ``archive_sha256`` (archive path -> its verified sha256, None if not verified) goes into the
    record, for :func:`check_extraction`, and chooses the fixes: an archive whose every part is
    verified is never "downloaded again" (its bytes would be the same).
    Raises ArchiveError (missing part, truncated/corrupt stream, an archive that holds another cache
    directory than the profile says), FileTypeError (not a tar: gzip, zstd, ...), UnsafeArchiveError
    (a refused member; nothing is written), DiskSpaceError or FileSystemError (read-only, permission
    denied, a file where a folder should be). Count mismatches are not errors here: they are in the
    returned record's ``problems`` (see :func:`inspect_cache_dir`).
    """
    _check_cache_key(cache_key)
    shas = list((archive_sha256 or {}).values())
    verified = all(shas) if shas else None
    with fs_guard(f"extracting {cache_key}", where=str(data_root)):
        return _extract(cache_key, archive_files, data_root, progress, archive_sha256, verified)


def _extract(
    cache_key: str,
    archive_files: Sequence[Path],
    data_root: Path,
    progress: Callable[[int], None] | None,
    archive_sha256: Mapping[str, str | None] | None,
    verified: bool | None,
) -> ExtractionRecord:
    t0 = time.monotonic()
    proc_root = layout.processed_root(data_root)
    final = layout.cache_dir(data_root, cache_key)
    record_path = layout.extraction_record_path(data_root, cache_key)
    remove_stale(proc_root, final=cache_key)  # a rerun after a failure or kill starts clean
    tar = open_archive_parts(archive_files, verified=verified)
    assert isinstance(tar, _PartsTarFile)
    with tar:
        archive = tar.archive_name
        plan = _plan_members(tar.getmembers(), cache_key)
        if plan.problems:
            if all("is outside the cache directory" in r for _, r in plan.problems):
                found = other_cache_key(tar.getmembers(), cache_key)
                if found is not None:
                    raise profile_mismatch_error(archive, found, cache_key)
            raise _unsafe_error(archive, plan.problems, verified=verified)
        total_bytes = sum(m.size for _, m in plan.files)
        proc_root.mkdir(parents=True, exist_ok=True)
        require_free_space(proc_root, total_bytes, f"extracting {archive} ({len(plan.files)} files)")
        with staging(final, sweep_stale=False) as tmp:  # removed if anything below fails
            try:
                with disk_full_as(
                    f"the disk at {proc_root} filled up while extracting {archive}.",
                    fix="free disk space or choose another --data-root, then re-run",
                ):
                    _write_members(tar, plan, tmp, progress)
                check_cancel(archive)  # the last point before the publish
            except EOFError as e:
                raise ArchiveError(
                    f"archive {archive} ended early while extracting: {e}.",
                    fix=quarantine_fix(archive) if verified else REDOWNLOAD_FIX,
                ) from e
            record_path.unlink(missing_ok=True)  # a record only ever describes what is in place
            publish_dir(tmp, final)
        archives = [p.name for p in tar.archive_parts]
    from .inspect import (
        inspect_cache_dir,  # pyarrow: imported when an extraction ends, not by the stat checks
    )

    info = inspect_cache_dir(final)
    tree = scan_tree(final)
    record = ExtractionRecord(
        cache_key=cache_key,
        archives=archives,
        files=len(plan.files),
        bytes=total_bytes,
        frame_files=len(info.frame_ids),
        rows=info.rows,
        total_trajectories=info.total_trajectories,
        seconds=round(time.monotonic() - t0, 3),
        layout=plan.layout,
        problems=list(info.problems),
        archive_sha256={k: v or "" for k, v in sorted((archive_sha256 or {}).items())},
        extractor_version=EXTRACTOR_VERSION,
        tree_digest=tree.digest if tree is not None else "",
    )
    atomic_write_json(record_path, record.to_dict())
    return record


def check_extraction(
    data_root: Path, cache_key: str, archive_sha256: Mapping[str, str | None]
) -> tuple[ExtractionRecord | None, str | None]:
    """(the record, None) when ``processed_datasets/<cache_key>/`` is what its record says and the
    record was made by this extractor from the archives ``archive_sha256`` names (archive path ->
    its verified sha256 now; None: not verified); else (the record or None, why it must be
    re-extracted). Costs a stat of the record and one ``os.scandir`` walk of the cache directory:
    nothing is read or hashed."""
    record = load_extraction_record(data_root, cache_key)
    if record is None:
        exists = layout.extraction_record_path(data_root, cache_key).exists()
        return None, "its extraction record is unreadable" if exists else "not extracted yet"
    if record.cache_key != cache_key:
        return record, f"its extraction record names cache key {record.cache_key!r}"
    if record.extractor_version != EXTRACTOR_VERSION:
        return record, (
            f"extracted by extractor version {record.extractor_version}, this is version {EXTRACTOR_VERSION}"
        )
    for path, sha in sorted(archive_sha256.items()):
        had = record.archive_sha256.get(path)
        if sha is None:
            return record, f"archive {path} is not verified (no matching .verified.json record)"
        if had is None:
            return record, f"archive {path} was not part of the last extraction"
        if had != sha:
            return (
                record,
                f"archive {path} changed: sha256 {sha}, extracted from {had or 'an unverified file'}",
            )
    gone = sorted(set(record.archive_sha256) - set(archive_sha256))
    if gone:
        return record, f"archive(s) {', '.join(gone)} no longer belong to this cache key"
    final = layout.cache_dir(data_root, cache_key)
    tree = scan_tree(final)
    if tree is None:
        return record, f"{final} is missing"
    if tree.files != record.files:
        return record, f"{final} holds {tree.files} files, its extraction record says {record.files}"
    if tree.bytes != record.bytes:
        return record, f"{final} holds {tree.bytes} bytes, its extraction record says {record.bytes}"
    if tree.digest != record.tree_digest:
        return record, f"{final}: a file was replaced, renamed or modified since it was extracted"
    return record, None


def load_extraction_record(data_root: Path, cache_key: str) -> ExtractionRecord | None:
    """The per-key record written by the last successful extraction, or None (absent/unreadable)."""
    p = layout.extraction_record_path(data_root, cache_key)
    try:
        return ExtractionRecord.from_dict(json.loads(p.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_extraction_report(data_root: Path, records: Sequence[ExtractionRecord]) -> Path:
    """Write ``extraction_report.json`` at the data root (atomically): one entry per cache key
    plus totals. Returns its path."""
    by_key: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.cache_key in by_key:
            raise ValueError(f"two extraction records for cache key {r.cache_key!r}")
        by_key[r.cache_key] = {
            "archives": list(r.archives),
            "layout": r.layout,
            "files": r.files,
            "bytes": r.bytes,
            "trajectories_found": r.frame_files,
            "rows": r.rows,
            "total_trajectories": r.total_trajectories,
            "seconds": r.seconds,
            "problems": list(r.problems),
        }
    report = {
        "cache_keys": dict(sorted(by_key.items())),
        "totals": {
            "cache_dirs": len(by_key),
            "archives": sum(len(r.archives) for r in records),
            "files": sum(r.files for r in records),
            "bytes": sum(r.bytes for r in records),
            "trajectories_found": sum(r.frame_files for r in records),
            "rows": sum(r.rows for r in records),
            "total_trajectories": sum(max(r.total_trajectories, 0) for r in records),
            "seconds": round(sum(r.seconds for r in records), 3),
            "problems": sum(len(r.problems) for r in records),
        },
    }
    path = layout.extraction_report_path(data_root)
    write_json_if_changed(path, report)
    return path


def write_json_if_changed(path: Path, obj: Any) -> bool:
    """Write ``obj`` as :func:`~stage2_data.publish.atomic_write_json` does, unless ``path`` already
    holds exactly those bytes (then nothing is written: its mtime stays). True when written."""
    data = (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    except OSError:
        pass
    atomic_write_bytes(path, data)
    return True
