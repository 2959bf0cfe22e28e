"""Extraction of one cache directory, all-or-nothing, and its records.

1. the archive is opened and every header read (:func:`.tar.open_archive_parts`);
2. every member is checked before anything is written (:func:`.safety._plan_members`);
3. the pre-validated members are copied into a staging folder next to the cache directory
   (``processed_datasets/.<key>.tmp-<owner>/``, see :mod:`stage2_data.publish`) straight from the
   archive file(s) with ``copy_file_range`` (in-kernel, no Python buffers; a ``pread``/``write``
   loop where the file system does not support it), then it is published in place
   (:func:`~stage2_data.publish.publish_dir`). A rerun first removes the staging folders of this
   cache key whose owner process is gone. The replaced cache directory is deleted, but not what
   its record says the last extraction did not write, unchanged (a user's files, an edited file):
   that is moved aside into the data root's quarantine folder first (:mod:`.aside`), and the
   returned record's ``moved_aside`` says from where to where.

Member data is never held in memory: only the member headers (``TarInfo``) are.

The record (``reports/extraction/<cache_key>.json``) says what the extraction was made from (every
archive's verified sha256, :data:`EXTRACTOR_VERSION`) and what it left in place: every file's sha256
(hashed while the extraction writes, from the file just written) and its stats then (inode, size,
mtime_ns, ctime_ns), a digest of those stats (``tree_digest``) and a digest of the content
(``content_digest``: the sorted (path, sha256) of every file). :func:`check_extraction` compares it
with the archives' sha256 now and with one ``os.scandir`` walk of the cache directory: when every
file's stats equal the record's, nothing is read or hashed; a file whose stats differ is hashed again
and compared with its recorded sha256 (equal: the record's stats are refreshed; different, missing or
extra: the cache directory is re-extracted, naming the file). A check that found an extracted file
damaged (the subset byte check) marks the record (:func:`invalidate_extraction`): the next check
re-extracts whatever the stats say.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from .. import layout
from ..errors import ArchiveError, Stage2Error
from ..formats.sha256sums import file_kind, read_regular_bytes
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

EXTRACTOR_VERSION = 2
"""Bump when extraction would leave different files for the same archive (names, bytes, modes,
times) or the record changes form: every cache directory recorded by another version is then
re-extracted (version 2: the record holds every file's sha256 and stats)."""

#: A change made within this long of a file's recorded ctime could keep that ctime (the kernel's
#: file timestamps advance by clock ticks: 1-10 ms): a record is written only once this long has
#: passed since the newest ctime it holds, so any later change gives a newer ctime.
_RACY_NS = 10_000_000
_HASH_BLOCK = 4 * 1024 * 1024
_OPEN_FLAGS = (
    os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)

log = logging.getLogger(__name__)

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


#: A file's stats as the record keeps them: (inode, size, mtime_ns, ctime_ns).
FileStat = tuple[int, int, int, int]


class NotRegularFile(OSError):
    """An entry where a regular file was expected (a FIFO, device, socket, link or folder)."""


def hash_regular_file(path: str | os.PathLike[str]) -> tuple[str, FileStat]:
    """sha256 of a regular file and its stats (taken on the open file, before it is read). Never
    opens anything else, never blocks (``O_NONBLOCK``, ``O_NOFOLLOW``): a FIFO, device, socket,
    link or folder raises :class:`NotRegularFile` naming what it is."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"{os.fspath(path)} is {file_kind(st.st_mode)}, not a regular file")
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{os.fspath(path)} is {file_kind(st.st_mode)}, not a regular file")
        h = hashlib.sha256()
        buf = bytearray(min(_HASH_BLOCK, max(st.st_size, 1)))
        view = memoryview(buf)
        while n := os.readv(fd, [buf]):
            h.update(view[:n])
    finally:
        os.close(fd)
    return h.hexdigest(), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def walk_stats(root: Path) -> dict[str, tuple[int, int, int, int, bool]] | None:
    """(inode, size, mtime_ns, ctime_ns, is a regular file) of every entry under ``root`` that is
    not a folder, by path relative to ``root``; one ``os.scandir`` walk, nothing read (None when
    ``root`` is not a folder). Symbolic links are entries, not followed."""
    out: dict[str, tuple[int, int, int, int, bool]] = {}
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
                        out[name] = (
                            st.st_ino,
                            st.st_size,
                            st.st_mtime_ns,
                            st.st_ctime_ns,
                            stat.S_ISREG(st.st_mode),
                        )
    except (FileNotFoundError, NotADirectoryError):
        return None
    return out


def stats_digest(stats: Mapping[str, Sequence[int]]) -> str:
    """sha256 of the sorted (path, inode, size, mtime_ns, ctime_ns) of every file: equal digests,
    equal stats (what lets an unchanged cache directory be up to date without a read)."""
    h = hashlib.sha256()
    for name in sorted(stats):
        ino, size, mtime, ctime = stats[name][:4]
        h.update(f"{name}\0{ino}\0{size}\0{mtime}\0{ctime}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def content_digest_of(shas: Mapping[str, str]) -> str:
    """sha256 of the sorted (relative path, sha256) of every file: ``path\0sha256\n`` lines, paths
    sorted by their code points, encoded as UTF-8 (docs/spec/kit-format.md)."""
    h = hashlib.sha256()
    for name in sorted(shas):
        h.update(f"{name}\0{shas[name]}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


@dataclass(frozen=True)
class TreeStat:
    """What a folder holds, from one ``os.scandir`` walk (stats only): entries that are not
    folders, their total size, and :func:`stats_digest` of them."""

    files: int
    bytes: int
    digest: str


def scan_tree(root: Path) -> TreeStat | None:
    """:class:`TreeStat` of ``root`` (None when it is not a folder). Symbolic links are counted as
    files and not followed; temp names are counted too (a cache directory holds none)."""
    stats = walk_stats(root)
    if stats is None:
        return None
    return TreeStat(len(stats), sum(v[1] for v in stats.values()), stats_digest(stats))


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
    tree_digest: str = ""  # stats_digest of the cache directory's files (as extracted or refreshed)
    content_digest: str = ""  # content_digest_of every file's sha256
    # every file: path relative to the cache directory -> [sha256, inode, size, mtime_ns, ctime_ns]
    entries: dict[str, list[Any]] = field(default_factory=dict)
    invalidated: str = ""  # set by a check that found an extracted file damaged: re-extract
    # not written to the record: what this extraction moved aside from the cache directory it
    # replaced (a user's files or edits; "<from> -> <to>" lines, see .aside)
    moved_aside: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["moved_aside"]
        return d

    def file_stats(self) -> dict[str, FileStat]:
        return {k: (int(v[1]), int(v[2]), int(v[3]), int(v[4])) for k, v in self.entries.items()}

    def sha256_of(self, rel: str) -> str | None:
        """The recorded sha256 of the file at ``rel`` (relative to the cache directory)."""
        e = self.entries.get(rel)
        return str(e[0]) if e else None

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
            content_digest=str(d.get("content_digest") or ""),
            entries={str(k): list(v) for k, v in dict(d.get("entries") or {}).items()},
            invalidated=str(d.get("invalidated") or ""),
        )


def _write_members(
    tar: _PartsTarFile,
    plan: _Plan,
    tmp: Path,
    progress: Callable[[int], None] | None,
    written: Callable[[str], None] | None = None,
) -> None:
    """Create the planned directories and files under ``tmp`` (which exists and is empty);
    ``written(rel)`` is called once each file is complete (its bytes, mode and times set)."""
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
            if written is not None:
                written(rel)
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
    trust_record: bool = True,
) -> ExtractionRecord:
    """Extract one cache directory's archive (a whole tar or all its split parts) into
    ``<data_root>/processed_datasets/<cache_key>/``, replacing an existing one atomically.

    ``progress`` is called with the number of member bytes just written (increments).
    ``archive_sha256`` (archive path -> its verified sha256, None if not verified) goes into the
    record, for :func:`check_extraction`, and chooses the fixes: an archive whose every part is
    verified is never "downloaded again" (its bytes would be the same).
    ``trust_record`` False (``--reverify``): the previous extraction's record does not say which
    files of the old folder were the extraction's; only a file equal to what this extraction wrote
    at its path is, and anything else is moved aside.
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
        return _extract(cache_key, archive_files, data_root, progress, archive_sha256, verified, trust_record)


def _extract(
    cache_key: str,
    archive_files: Sequence[Path],
    data_root: Path,
    progress: Callable[[int], None] | None,
    archive_sha256: Mapping[str, str | None] | None,
    verified: bool | None,
    trust_record: bool = True,
) -> ExtractionRecord:
    t0 = time.monotonic()
    proc_root = layout.processed_root(data_root)
    final = layout.cache_dir(data_root, cache_key)
    record_path = layout.extraction_record_path(data_root, cache_key)
    remove_stale(proc_root, final=cache_key)  # a rerun after a failure or kill starts clean
    # read before the record is removed
    previous = _recorded_files(record_path, cache_key) if trust_record else {}
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
            # Every file is hashed from the staging folder as soon as it is written (on threads,
            # beside the in-kernel copy of the next members; its bytes are still in the page cache).
            pool = _hash_pool()
            futures: dict[str, Future[tuple[str, FileStat]]] = {}
            tmp_s = os.fspath(tmp)

            def written(rel: str) -> None:
                futures[rel] = pool.submit(hash_regular_file, f"{tmp_s}/{rel}")

            try:
                try:
                    with disk_full_as(
                        f"the disk at {proc_root} filled up while extracting {archive}.",
                        fix="free disk space or choose another --data-root, then re-run",
                    ):
                        _write_members(tar, plan, tmp, progress, written)
                    check_cancel(archive)  # the last point before the publish
                except EOFError as e:
                    raise ArchiveError(
                        f"archive {archive} ended early while extracting: {e}.",
                        fix=quarantine_fix(archive) if verified else REDOWNLOAD_FIX,
                    ) from e
                hashed = {rel: f.result() for rel, f in futures.items()}
            except BaseException:
                for f in futures.values():
                    f.cancel()
                wait(futures.values())  # nothing reads the staging folder once it is removed
                raise
            record_path.unlink(missing_ok=True)  # a record only ever describes what is in place
            moved: list[str] = []

            def keep(old: Path) -> None:  # what the last extraction did not write is moved aside
                from .aside import set_aside_foreign

                written_now = {rel: (sha, st[1]) for rel, (sha, st) in hashed.items()}
                reason = (
                    f"not what the previous extraction of cache directory {cache_key} wrote (a file "
                    f"its record does not list, or one changed since) when it was extracted again "
                    f"from {archive}: moved aside, never deleted"
                )
                moved.extend(set_aside_foreign(data_root, old, final, previous, written_now, reason))

            publish_dir(tmp, final, keep=keep)
            for line in moved:
                log.warning("cache_dir[%s]: not written by its extraction; moved aside: %s", cache_key, line)
        archives = [p.name for p in tar.archive_parts]
    from .inspect import (
        inspect_cache_dir,  # pyarrow: imported when an extraction ends, not by the stat checks
    )

    info = inspect_cache_dir(final)
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
        tree_digest=stats_digest({rel: st for rel, (_, st) in hashed.items()}),
        content_digest=content_digest_of({rel: sha for rel, (sha, _) in hashed.items()}),
        entries={rel: [sha, *st] for rel, (sha, st) in sorted(hashed.items())},
        moved_aside=moved,
    )
    _settle(hashed)
    atomic_write_json(record_path, record.to_dict())
    return record


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _hash_pool() -> ThreadPoolExecutor:
    """The threads that hash extracted files (hashlib releases the GIL), one a core and at most 4,
    started once per process and shared by every extraction (starting threads per cache directory
    cost more than hashing a small one)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            n = max(1, min(4, os.cpu_count() or 1))
            _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="extract-hash")
        return _POOL


def _settle(hashed: Mapping[str, tuple[str, FileStat]]) -> None:
    settle_ctimes(max((st[3] for _, st in hashed.values()), default=0))


def settle_ctimes(newest_ctime_ns: int) -> None:
    """Wait (at most :data:`_RACY_NS`) until the newest ctime a record is about to hold is that old:
    a change of a file after the record is written then always gives it a newer ctime than the
    record's (file timestamps advance by clock ticks)."""
    wait = newest_ctime_ns + _RACY_NS - time.time_ns()
    if wait > 0:
        time.sleep(min(wait, _RACY_NS) / 1e9)


def check_extraction(
    data_root: Path,
    cache_key: str,
    archive_sha256: Mapping[str, str | None],
    *,
    held: list[Path] | None = None,
) -> tuple[ExtractionRecord | None, str | None]:
    """(the record, None) when ``processed_datasets/<cache_key>/`` holds what its record says and the
    record was made by this extractor from the archives ``archive_sha256`` names (archive path ->
    its verified sha256 now; None: not verified); else (the record or None, why it must be
    re-extracted, naming the file).

    Costs a read of the record and one ``os.scandir`` walk of the cache directory when every file's
    (inode, size, mtime_ns, ctime_ns) equals the record's. A file whose stats differ is hashed again:
    when its sha256 is still the recorded one, the record's stats are refreshed (written) and the
    cache directory is up to date; else it must be re-extracted. With ``held`` (a dry run), that
    refresh is not written: the record's path is appended to ``held``."""
    path = layout.extraction_record_path(data_root, cache_key)
    record, record_stat = _load_record(path)
    if record is None:
        return None, "its extraction record is unreadable" if path.exists() else "not extracted yet"
    if record.cache_key != cache_key:
        return record, f"its extraction record names cache key {record.cache_key!r}"
    if record.extractor_version != EXTRACTOR_VERSION:
        return record, (
            f"extracted by extractor version {record.extractor_version}, this is version {EXTRACTOR_VERSION}"
        )
    if record.invalidated:
        return record, record.invalidated
    inconsistent = _inconsistency(record)
    if inconsistent:
        return record, f"its extraction record {path} is inconsistent ({inconsistent})"
    for apath, sha in sorted(archive_sha256.items()):
        had = record.archive_sha256.get(apath)
        if sha is None:
            return record, f"archive {apath} is not verified (no matching .verified.json record)"
        if had is None:
            return record, f"archive {apath} was not part of the last extraction"
        if had != sha:
            return (
                record,
                f"archive {apath} changed: sha256 {sha}, extracted from {had or 'an unverified file'}",
            )
    gone = sorted(set(record.archive_sha256) - set(archive_sha256))
    if gone:
        return record, f"archive(s) {', '.join(gone)} no longer belong to this cache key"
    final = layout.cache_dir(data_root, cache_key)
    stats = walk_stats(final)
    if stats is None:
        return record, f"{final} is missing"
    if len(stats) == len(record.entries) and stats_digest(stats) == record.tree_digest:
        return record, None  # every file's stats are the recorded ones: nothing read
    reason, refreshed = _compare_files(final, record, stats)
    if reason is not None:
        return record, reason
    if held is not None:
        held.append(path)
    else:
        _refresh(path, record_stat, record, refreshed)
    return record, None


def _recorded_files(path: Path, cache_key: str) -> dict[str, tuple[str, FileStat]]:
    """What the record at ``path`` says the last extraction of ``cache_key`` wrote: (sha256,
    stats) by path in the cache directory ({} when there is no record of that key to trust)."""
    record, _ = _load_record(path)
    if record is None or record.cache_key != cache_key or _inconsistency(record):
        return {}
    stats = record.file_stats()
    return {r: (str(e[0]), stats[r]) for r, e in record.entries.items()}


def _inconsistency(record: ExtractionRecord) -> str:
    """What in ``record`` disagrees with its own entries (a damaged record), or ""."""
    try:
        shas = {r: str(e[0]) for r, e in record.entries.items()}
        size = sum(int(e[2]) for e in record.entries.values())
        record.file_stats()
    except (IndexError, TypeError, ValueError):
        return "an entry is not [sha256, inode, size, mtime_ns, ctime_ns]"
    if len(shas) != record.files:
        return f"it counts {record.files} files and lists {len(shas)}"
    if size != record.bytes:
        return f"it counts {record.bytes} bytes and its files hold {size}"
    if content_digest_of(shas) != record.content_digest:
        return "its content_digest is not the digest of its files' sha256"
    return ""


def _compare_files(
    final: Path, record: ExtractionRecord, stats: Mapping[str, tuple[int, int, int, int, bool]]
) -> tuple[str | None, dict[str, FileStat]]:
    """(why ``final`` is not what ``record`` says, or None; every file's stats now). Files whose
    stats differ from the record's are hashed again."""
    recorded = record.file_stats()
    missing = sorted(set(recorded) - set(stats))
    extra = sorted(set(stats) - set(recorded))
    if missing or extra:
        what = [f"{final / r} is missing" for r in missing[:3]] + [
            f"{final / r} was not extracted" for r in extra[:3]
        ]
        more = len(missing) + len(extra) - len(what)
        return (
            f"{final} holds {len(stats)} files, its extraction record says {len(recorded)} "
            f"({'; '.join(what)}{f'; and {more} more' if more > 0 else ''})",
            {},
        )
    odd = sorted(r for r, st in stats.items() if not st[4])
    if odd:
        return f"{final / odd[0]} is not a regular file (a file was replaced since it was extracted)", {}
    total = sum(st[1] for st in stats.values())
    resized = sorted(r for r, st in stats.items() if st[1] != recorded[r][1])
    if resized:
        r = resized[0]
        return (
            f"{final} holds {total} bytes, its extraction record says {record.bytes}: {final / r} is "
            f"{stats[r][1]} bytes, extracted as {recorded[r][1]}",
            {},
        )
    now: dict[str, FileStat] = {r: st[:4] for r, st in stats.items()}
    for r in sorted(r for r in stats if now[r] != recorded[r]):
        try:
            sha, st = hash_regular_file(final / r)
        except OSError as e:
            return f"{final / r} cannot be read to compare it with its extraction record ({e})", {}
        if sha != record.sha256_of(r):
            return (
                f"{final}: a file was replaced, renamed or modified since it was extracted: {final / r} "
                f"has sha256 {sha}, extracted as {record.sha256_of(r)}",
                {},
            )
        now[r] = st
    return None, now


def _refresh(
    path: Path, record_stat: FileStat | None, record: ExtractionRecord, now: Mapping[str, FileStat]
) -> None:
    """Write ``record`` with the files' stats ``now`` (their content was found unchanged), unless
    the record file changed since it was read (an extraction wrote a newer one meanwhile)."""
    _settle({r: ("", st) for r, st in now.items()})
    for r, st in now.items():
        record.entries[r] = [record.entries[r][0], *st]
    record.tree_digest = stats_digest(now)
    if _stat_of(path) != record_stat:
        return
    with contextlib.suppress(OSError):  # a read-only data root: the check still holds, unrecorded
        atomic_write_json(path, record.to_dict())


def invalidate_extraction(data_root: Path, cache_key: str, why: str) -> bool:
    """Mark the extraction record of ``cache_key`` as not to be trusted (a check found an extracted
    file damaged): :func:`check_extraction` then says ``why`` and the cache directory is extracted
    again, whatever its stats say. True when a record was marked."""
    path = layout.extraction_record_path(data_root, cache_key)
    record, _ = _load_record(path)
    if record is None:
        return False
    record.invalidated = why
    atomic_write_json(path, record.to_dict())
    return True


def _stat_of(path: Path) -> FileStat | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _load_record(path: Path) -> tuple[ExtractionRecord | None, FileStat | None]:
    """The record at ``path`` and the record file's stats (None, None: absent or unreadable; a
    FIFO, device or folder there is unreadable, never opened for reading: nothing blocks)."""
    before = _stat_of(path)
    try:  # msgspec: a record holds an entry per file (tens of thousands), decoded faster than json
        return ExtractionRecord.from_dict(msgspec.json.decode(read_regular_bytes(path))), before
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, msgspec.DecodeError):
        return None, None


def load_extraction_record(data_root: Path, cache_key: str) -> ExtractionRecord | None:
    """The per-key record written by the last successful extraction, or None (absent/unreadable)."""
    return _load_record(layout.extraction_record_path(data_root, cache_key))[0]


def reported_extraction(rec: ExtractionRecord) -> dict[str, Any]:
    """One cache key's entry in the extraction report: the counts and ``problems`` the extract
    stage checks, and the rest the report shows (what a no-op build compares a record by)."""
    return {
        "archives": list(rec.archives),
        "layout": rec.layout,
        "files": rec.files,
        "bytes": rec.bytes,
        "trajectories_found": rec.frame_files,
        "rows": rec.rows,
        "total_trajectories": rec.total_trajectories,
        "seconds": rec.seconds,
        "problems": list(rec.problems),
    }


def write_extraction_report(data_root: Path, records: Sequence[ExtractionRecord]) -> Path:
    """Write ``extraction_report.json`` at the data root (atomically): one entry per cache key
    plus totals. Returns its path."""
    by_key: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.cache_key in by_key:
            raise ValueError(f"two extraction records for cache key {r.cache_key!r}")
        by_key[r.cache_key] = reported_extraction(r)
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
