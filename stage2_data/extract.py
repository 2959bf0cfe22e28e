"""Safe extraction of whole and split tars into ``<DATA_ROOT>/processed_datasets/<cache_key>/``,
and inspection of an extracted cache directory.

An upstream cache directory arrives as one uncompressed tar (``<cache_key>.tar``) or as split parts
of one tar stream (``<cache_key>.tar.part-aa``, ``-ab``, ...). Split parts are read in place through
:class:`MultiPartReader`, a seekable view over the concatenated parts, so no joined copy is written.

Extraction is all-or-nothing:

1. the archive is opened in random-access mode and every header is read (:func:`open_archive_parts`);
   a truncated or corrupt stream is an :class:`~stage2_data.errors.ArchiveError`;
2. every member is checked before anything is written: only regular files and directories inside
   the cache directory, in either member layout (``processed_datasets/<key>/...`` or ``<key>/...``),
   no absolute path, no ``..``, no link, no device, no FIFO, no duplicate; the checks are
   gathered and reported at once as an :class:`~stage2_data.errors.UnsafeArchiveError`; Python's
   ``tarfile.data_filter`` is applied on top as defense in depth;
3. the pre-validated members are copied into ``processed_datasets/.<key>.tmp-<pid>/`` straight from
   the archive file(s) with ``copy_file_range`` (in-kernel, no Python buffers; a ``pread``/``write``
   loop where the file system does not support it), then the folder is renamed into place.

Member data is never held in memory: only the member headers (``TarInfo``) are.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import io
import json
import os
import re
import shutil
import stat
import struct
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pyarrow as pa
import pyarrow.ipc as pa_ipc

from . import layout
from .errors import ArchiveError, UnsafeArchiveError
from .fsutil import atomic_write_json, disk_full_as, publish_dir, require_free_space

__all__ = [
    "CacheDirInfo",
    "ExtractionRecord",
    "MultiPartReader",
    "extract_cache_dir",
    "inspect_cache_dir",
    "load_extraction_record",
    "open_archive_parts",
    "read_processed_rows",
    "stray_entries",
    "write_extraction_report",
]

CACHE_KEY_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*$")
LAYOUT_PREFIXED = "processed_datasets/<key>/"
LAYOUT_BARE = "<key>/"
LAYOUT_MIXED = "mixed"
# Our own temporary folders inside processed_datasets/: ours (.<key>.tmp-<pid>) and publish_dir's
# moved-aside previous version (.<key>.old-<pid>).
TEMP_DIR_RE = re.compile(r"^\.(?P<key>.+)\.(?:tmp|old)-\d+$")

REDOWNLOAD_FIX = (
    "if the archive is not the pinned upstream file, delete it and re-run the build to download it again; "
    "if it is (its .verified.json record matches the pin), the upstream file itself is bad: list it under "
    "[[quarantined]] in the profile (or pin another revision) and report it upstream"
)
_COPY_CHUNK = 64 * 1024 * 1024  # largest single copy_file_range call (also the progress granularity)
_BUF_SIZE = 1024 * 1024  # pread/write fallback buffer
_WINDOW = 8192  # MultiPartReader's cached window for small reads (tar headers)
_SMALL_READ = 1024
# Defense in depth: besides our own checks, a member must pass Python's tarfile 'data' filter. It
# runs in the planning step, before anything exists on disk, against a folder that does not exist
# (so its checks are about the names alone: our destination is a fresh folder we create and that
# never holds a link). Members that are plainly safe by a strict whitelist (a regular file or
# directory whose every name component starts with a letter, digit or '_' and uses only
# [A-Za-z0-9_.-]) skip it: the filter provably accepts them, and it costs ~30 us a member.
_FILTER_ROOT = "/.stage2-extract-check"
_PLAIN_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)
_PLAIN_NAME_RE = re.compile(r"^(?:\./)?[A-Za-z0-9_][\w.\-]*(?:/[A-Za-z0-9_][\w.\-]*)*/?$", re.ASCII)
_MAX_LISTED = 100  # per-kind cap on listed ids in inspection problems (the count is always given)


# --------------------------------------------------------------------------------------------------
# A seekable view over several files
# --------------------------------------------------------------------------------------------------


class MultiPartReader(io.RawIOBase):
    """A seekable, read-only binary view over several files concatenated in the given order.

    Reads use ``pread`` on each part (no shared file position), so a large read spanning parts is
    one system call per part. :meth:`copy_range_to` copies a byte range into another file
    descriptor without passing the bytes through Python.
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        super().__init__()
        if not paths:
            raise ValueError("MultiPartReader needs at least one file")
        self.paths = [Path(p) for p in paths]
        self.name = str(self.paths[0])
        self._fds: list[int] = []
        self._starts: list[int] = []
        self._sizes: list[int] = []
        total = 0
        try:
            for p in self.paths:
                fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                self._fds.append(fd)
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise IsADirectoryError(errno.EISDIR, "not a regular file", str(p))
                self._starts.append(total)
                self._sizes.append(st.st_size)
                total += st.st_size
        except BaseException:
            self._close_fds()
            raise
        self._size = total
        self._pos = 0
        self._win = b""
        self._win_start = 0
        self._copy_file_range_ok = hasattr(os, "copy_file_range")

    # io protocol --------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._size

    @property
    def part_sizes(self) -> list[int]:
        return list(self._sizes)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if pos < 0:
            raise OSError(errno.EINVAL, f"negative seek position {pos}")
        self._pos = pos
        return pos

    def _locate(self, pos: int) -> tuple[int, int]:
        """(part index, offset in that part) of a position < size; skips empty parts."""
        i = bisect.bisect_right(self._starts, pos) - 1
        return i, pos - self._starts[i]

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        mv = memoryview(buffer).cast("B")
        want = len(mv)
        done = 0
        while done < want and self._pos < self._size:
            i, off = self._locate(self._pos)
            n = min(want - done, self._sizes[i] - off)
            got = os.preadv(self._fds[i], [mv[done : done + n]], off)
            if got <= 0:
                raise OSError(errno.EIO, f"{self.paths[i]} shrank while being read (at byte {off})")
            done += got
            self._pos += got
        return done

    def read(self, size: int | None = -1) -> bytes:
        if size is not None and 0 <= size <= _SMALL_READ:  # fast path: inside the cached window
            k = self._pos - self._win_start
            if k >= 0 and k + size <= len(self._win):
                self._pos += size
                return self._win[k : k + size]
        self._checkClosed()
        if size is None or size < 0:
            size = max(0, self._size - self._pos)
        size = min(size, max(0, self._size - self._pos))
        if size == 0:
            return b""
        pos = self._pos
        if size <= _SMALL_READ:  # tar headers: served from a small aligned window (one pread)
            w = self._win
            if not (self._win_start <= pos and pos + size <= self._win_start + len(w)):
                start = pos - pos % _WINDOW
                if pos + size > start + _WINDOW:
                    start = pos
                n = min(_WINDOW, self._size - start)
                i, off = self._locate(start)
                if off + n <= self._sizes[i]:
                    w = os.pread(self._fds[i], n, off)
                else:
                    buf = bytearray(n)
                    self._pos = start
                    w = bytes(buf[: self.readinto(buf)])
                if len(w) < n:
                    raise OSError(errno.EIO, f"{self.paths[i]} shrank while being read (at byte {off})")
                self._win, self._win_start = w, start
            k = pos - self._win_start
            self._pos = pos + size
            return w[k : k + size]
        i, off = self._locate(pos)
        if off + size <= self._sizes[i]:  # the common case: one part, one copy
            data = os.pread(self._fds[i], size, off)
            if len(data) < size:
                raise OSError(errno.EIO, f"{self.paths[i]} shrank while being read (at byte {off})")
            self._pos += size
            return data
        buf = bytearray(size)
        n = self.readinto(buf)
        return bytes(buf[:n])

    def readall(self) -> bytes:
        return self.read(-1)

    def _close_fds(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        self._win, self._win_start = b"", -1
        if not self.closed:
            self._close_fds()
        super().close()

    # direct copy --------------------------------------------------------------------------------

    def copy_range_to(
        self, dst_fd: int, offset: int, length: int, *, progress: Callable[[int], None] | None = None
    ) -> None:
        """Append bytes ``[offset, offset + length)`` of the concatenation to ``dst_fd`` (at its file
        position). Uses ``copy_file_range`` where the kernel and file systems allow, else a
        ``pread``/``write`` loop with a fixed buffer. Raises ``EOFError`` if the parts end early."""
        self._checkClosed()
        if offset + length > self._size:
            raise EOFError(f"byte range {offset}+{length} ends past the end of the data ({self._size})")
        pos, end = offset, offset + length
        buf: memoryview | None = None
        while pos < end:
            i, off = self._locate(pos)
            n = min(end - pos, self._sizes[i] - off, _COPY_CHUNK)
            got = 0
            if self._copy_file_range_ok:
                try:
                    got = os.copy_file_range(self._fds[i], dst_fd, n, off)
                except OSError as e:
                    if e.errno not in (
                        errno.EXDEV,
                        errno.ENOSYS,
                        errno.EINVAL,
                        errno.EOPNOTSUPP,
                        errno.EPERM,
                    ):
                        raise
                    self._copy_file_range_ok = False
                    got = 0
            if got <= 0:  # fallback (or a file system on which copy_file_range copies nothing)
                if buf is None:
                    buf = memoryview(bytearray(min(_BUF_SIZE, max(n, 1))))
                k = min(n, len(buf))
                got = os.preadv(self._fds[i], [buf[:k]], off)
                if got <= 0:
                    raise EOFError(f"{self.paths[i]} ends at byte {off}, before its recorded size")
                _write_all(dst_fd, buf[:got])
            pos += got
            if progress is not None:
                progress(got)


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        n = os.write(fd, data)
        data = data[n:]


# --------------------------------------------------------------------------------------------------
# Opening whole and split archives
# --------------------------------------------------------------------------------------------------


def _gnu_split_suffix(index: int) -> str:
    """The ``index``-th suffix GNU ``split`` gives with its default (auto-widening) suffixes:
    aa, ab, ..., yz, zaaa, ..., zyzz, zzaaaa, ..."""
    prefix, width = "", 2
    while True:
        cap = 25 * 26 ** (width - 1)  # bodies that do not start with 'z'
        if index < cap:
            body = ""
            for _ in range(width):
                index, r = divmod(index, 26)
                body = chr(ord("a") + r) + body
            return prefix + body
        index -= cap
        prefix += "z"
        width += 1


_HEADER = struct.Struct("100s8s8s8s12s12s8s1s100s8x32s32s8s8s155s")  # ustar/GNU header up to byte 500
_CHKSUM = slice(148, 156)


class _FastTarInfo(tarfile.TarInfo):
    """TarInfo whose header parsing has a fast path for the common header (plain octal numbers,
    unsigned checksum, not old-GNU sparse); anything else goes to the stock ``frombuf``, which
    the fast path matches field for field (tested)."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        if len(buf) != tarfile.BLOCKSIZE or buf[156:157] == tarfile.GNUTYPE_SPARSE:
            return super().frombuf(buf, encoding, errors)
        try:
            (name, mode, uid, gid, size, mtime, chk, type_, linkname, uname, gname, dmaj, dmin, prefix) = (
                _HEADER.unpack_from(buf)
            )
            # Plain octal numbers, NUL/space padded. Anything else (a NUL inside, GNU base-256
            # numbers) raises ValueError and goes to the stock parser.
            chksum = int(chk.rstrip(b"\0 ") or b"0", 8)
            if chksum != 256 + sum(buf) - sum(buf[_CHKSUM]):
                return super().frombuf(buf, encoding, errors)
            obj = cls()
            obj.name = name.split(b"\0", 1)[0].decode(encoding, errors)
            obj.mode = int(mode.rstrip(b"\0 ") or b"0", 8)
            obj.uid = int(uid.rstrip(b"\0 ") or b"0", 8)
            obj.gid = int(gid.rstrip(b"\0 ") or b"0", 8)
            obj.size = int(size.rstrip(b"\0 ") or b"0", 8)
            obj.mtime = int(mtime.rstrip(b"\0 ") or b"0", 8)
            obj.chksum = chksum
            obj.type = type_
            obj.linkname = linkname.split(b"\0", 1)[0].decode(encoding, errors)
            obj.uname = uname.split(b"\0", 1)[0].decode(encoding, errors)
            obj.gname = gname.split(b"\0", 1)[0].decode(encoding, errors)
            obj.devmajor = int(dmaj.rstrip(b"\0 ") or b"0", 8)
            obj.devminor = int(dmin.rstrip(b"\0 ") or b"0", 8)
            pre = prefix.split(b"\0", 1)[0].decode(encoding, errors)
        except (ValueError, UnicodeError):
            return super().frombuf(buf, encoding, errors)
        if obj.type == tarfile.AREGTYPE and obj.name.endswith("/"):
            obj.type = tarfile.DIRTYPE
        if obj.isdir():
            obj.name = obj.name.rstrip("/")
        if pre and obj.type not in tarfile.GNU_TYPES:
            obj.name = pre + "/" + obj.name
        return obj


class _PartsTarFile(tarfile.TarFile):
    """A TarFile that owns its MultiPartReader: closing the tar closes the parts."""

    tarinfo = _FastTarInfo
    reader: MultiPartReader | None = None
    archive_name: str = ""
    archive_parts: list[Path]

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.reader is not None:
                self.reader.close()

    def __exit__(
        self, typ: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        # TarFile.__exit__ does not call close() when leaving on an exception.
        try:
            super().__exit__(typ, value, tb)
        finally:
            if self.reader is not None:
                self.reader.close()


def _archive_label(paths: Sequence[Path]) -> tuple[str, bool]:
    """(archive name for messages, is split)."""
    names = [p.name for p in paths]
    split = any(layout.SPLIT_PART_RE.match(n) for n in names)
    return (layout.split_base(names[0]) if split else names[0]), split


def _order_parts(paths: Sequence[Path]) -> list[Path]:
    """Sort parts by name and check they are one gap-free split sequence (or one whole tar)."""
    plist = [Path(p) for p in paths]
    if not plist:
        raise ArchiveError("no archive files given.", fix="pass the archive's file (or all its split parts)")
    if len(plist) == 1 and not layout.SPLIT_PART_RE.match(plist[0].name):
        return plist
    plist.sort(key=lambda p: p.name)
    matches = [layout.SPLIT_PART_RE.match(p.name) for p in plist]
    whole = [p.name for p, m in zip(plist, matches, strict=True) if m is None]
    if whole:
        raise ArchiveError(
            f"archive files {[p.name for p in plist]} mix a whole tar ({', '.join(whole)}) with split parts.",
            fix="pass either one whole tar or all the split parts (<name>.tar.part-aa, -ab, ...) of one tar",
        )
    bases = sorted({m.group("base") for m in matches if m is not None})
    if len(bases) > 1:
        raise ArchiveError(
            f"split parts {[p.name for p in plist]} belong to different archives ({', '.join(bases)}).",
            fix="pass the parts of one archive at a time",
        )
    base = bases[0]
    names = [p.name for p in plist]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ArchiveError(
            f"archive {base}: part(s) {', '.join(dups)} given twice ({[str(p) for p in plist]}).",
            fix="pass each split part once",
        )
    for i, m in enumerate(matches):
        assert m is not None
        expected = _gnu_split_suffix(i)
        if m.group("suffix") != expected:
            raise ArchiveError(
                f"archive {base}: split part {base}.part-{expected} is missing "
                f"(parts given: {', '.join(names)}).",
                fix=f"download {base}.part-{expected} (re-run the build to download the missing part), "
                "then extract again",
            )
    return plist


def open_archive_parts(paths: Sequence[Path]) -> tarfile.TarFile:
    """Open a whole tar, or the split parts of one tar (sorted by name, checked for gaps), in
    random-access mode over a :class:`MultiPartReader`, and read every member header.

    The returned TarFile has all its members loaded (``getmembers()`` is free) and has been checked
    to end with an end-of-archive block: a truncated or corrupt stream raises ArchiveError naming
    the archive. Closing the TarFile closes the part files.
    """
    plist = _order_parts(paths)
    name, split = _archive_label(plist)
    for p in plist:
        if not p.is_file():
            what = "split part" if split else "archive"
            raise ArchiveError(
                f"archive {name}: {what} {p} is missing or not a file.",
                fix="re-run the build to download it again",
            )
    try:
        reader = MultiPartReader(plist)
    except OSError as e:
        raise ArchiveError(
            f"archive {name}: cannot read {e.filename or plist}: {e.strerror or e}.",
            fix="check the file's permissions, or delete it and re-run the build to download it again",
        ) from e
    corrupt_fix = (
        f"delete {name} (all its parts) and re-run the build to download it again"
        if split
        else f"delete {name} and re-run the build to download it again"
    )
    hint = (
        f" The split parts ({', '.join(p.name for p in plist)}) may be incomplete, missing or out of order."
        if split
        else ""
    )
    tar: _PartsTarFile | None = None
    try:
        try:
            tar = _PartsTarFile.open(fileobj=reader, mode="r:")  # type: ignore[assignment]
            assert isinstance(tar, _PartsTarFile)
            tar.reader = reader
            tar.archive_name = name
            tar.archive_parts = plist
            members = tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ArchiveError(
                f"archive {name} is truncated or corrupt ({reader.size} bytes): {e}.{hint}",
                fix=corrupt_fix,
            ) from e
        problem = _check_end_of_archive(reader, tar.offset, members)
        if problem:
            raise ArchiveError(f"archive {name} is truncated or corrupt: {problem}.{hint}", fix=corrupt_fix)
    except BaseException:
        if tar is not None:
            tar.reader = None
            with contextlib.suppress(Exception):
                tar.close()
        reader.close()
        raise
    return tar


def _check_end_of_archive(reader: MultiPartReader, end: int, members: Sequence[tarfile.TarInfo]) -> str:
    """'' if the member list ended on an end-of-archive (zero) block, else what is wrong.

    tarfile stops listing silently on a header that is cut off or fails its checksum anywhere
    but at the very start; this is where such a stream is caught."""
    for m in members:
        if m.isreg() and m.offset_data + m.size > reader.size:
            return f"member {m.name!r} needs bytes up to {m.offset_data + m.size} but the data ends at {reader.size}"
    reader.seek(end)
    block = reader.read(tarfile.BLOCKSIZE)
    if len(block) == 0:
        return (
            f"the stream ends at byte {end} without the end-of-archive marker (after {len(members)} members)"
        )
    if len(block) < tarfile.BLOCKSIZE:
        return f"the stream ends inside a header at byte {end} (after {len(members)} members)"
    if block.count(0) != tarfile.BLOCKSIZE:
        return f"invalid tar header at byte {end} (after {len(members)} members)"
    return ""


# --------------------------------------------------------------------------------------------------
# Member validation
# --------------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    dirs: list[tuple[str, tarfile.TarInfo]]  # (path relative to the cache dir, member)
    files: list[tuple[str, tarfile.TarInfo]]
    layout: str
    problems: list[tuple[str, str]]  # (member name, reason)


def _member_type_problem(m: tarfile.TarInfo) -> str:
    if m.issym():
        return f"is a symbolic link (-> {m.linkname!r}); links are refused"
    if m.islnk():
        return f"is a hard link (-> {m.linkname!r}); links are refused"
    if m.ischr():
        return "is a character device"
    if m.isblk():
        return "is a block device"
    if m.isfifo():
        return "is a FIFO"
    if m.issparse():
        return "is a sparse file"
    if not (m.isreg() or m.isdir()):
        return f"has unsupported member type {m.type!r} (only regular files and directories are allowed)"
    return ""


def _plan_members(members: Sequence[tarfile.TarInfo], cache_key: str) -> _Plan:
    problems: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    dirs: list[tuple[str, tarfile.TarInfo]] = []
    files: list[tuple[str, tarfile.TarInfo]] = []
    layouts: set[str] = set()
    for m in members:
        name = m.name
        reason = _member_type_problem(m)
        if reason:
            problems.append((name, reason))
            continue
        if name.startswith("/"):
            problems.append((name, "has an absolute path"))
            continue
        comps = [c for c in name.split("/") if c not in ("", ".")]
        if ".." in comps:
            problems.append((name, "has a '..' path component"))
            continue
        if not comps:  # "./" itself
            if not m.isdir():
                problems.append((name, "is not a directory"))
            continue
        if comps[0] == layout.PROCESSED_DIR:
            if len(comps) == 1:
                if not m.isdir():
                    problems.append((name, f"is not a directory but is named {layout.PROCESSED_DIR!r}"))
                continue
            if comps[1] != cache_key:
                problems.append(
                    (name, f"is outside the cache directory: it belongs to {comps[1]!r}, not {cache_key!r}")
                )
                continue
            rest = comps[2:]
            layouts.add(LAYOUT_PREFIXED)
        elif comps[0] == cache_key:
            rest = comps[1:]
            layouts.add(LAYOUT_BARE)
        else:
            problems.append(
                (
                    name,
                    f"is outside the cache directory: top-level entry {comps[0]!r} is neither "
                    f"{cache_key!r} nor '{layout.PROCESSED_DIR}/{cache_key}'",
                )
            )
            continue
        if not rest:
            if not m.isdir():
                problems.append((name, "is not a directory but names the cache directory itself"))
            continue
        rel = "/".join(rest)
        if rel in seen:
            problems.append((name, f"is a duplicate: same path as the earlier member {seen[rel]!r}"))
            continue
        seen[rel] = name
        if not (m.type in _PLAIN_TYPES and _PLAIN_NAME_RE.match(name)):
            try:  # defense in depth: Python's own 'data' extraction filter must agree
                tarfile.data_filter(m, _FILTER_ROOT)
            except tarfile.FilterError as e:
                problems.append((name, f"is refused by tarfile's data filter: {e}"))
                continue
        (dirs if m.isdir() else files).append((rel, m))
    file_paths = {rel for rel, _ in files}
    for rel, m in [*dirs, *files]:
        parts = rel.split("/")
        for k in range(1, len(parts)):
            anc = "/".join(parts[:k])
            if anc in file_paths:
                problems.append((m.name, f"lies under {anc!r}, which is a regular file in the archive"))
                break
    if not layouts:
        lay = LAYOUT_PREFIXED
    elif len(layouts) == 1:
        lay = next(iter(layouts))
    else:
        lay = LAYOUT_MIXED
    return _Plan(dirs=dirs, files=files, layout=lay, problems=problems)


def _unsafe_error(archive: str, problems: Sequence[tuple[str, str]]) -> UnsafeArchiveError:
    first_name, first_reason = problems[0]
    msg = f"unsafe archive {archive}: member {first_name!r} {first_reason}"
    if len(problems) > 1:
        shown = "; ".join(f"{n!r} {r}" for n, r in problems[1:20])
        more = f"; ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        msg += f"; and {len(problems) - 1} more refused member(s): {shown}{more}"
    return UnsafeArchiveError(msg + ". Nothing was extracted.", fix=REDOWNLOAD_FIX)


# --------------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------------


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
        )


def _check_cache_key(cache_key: str) -> None:
    if not CACHE_KEY_RE.match(cache_key) or cache_key == layout.PROCESSED_DIR:
        raise ArchiveError(
            f"invalid cache key {cache_key!r}: it must be one folder name ({CACHE_KEY_RE.pattern}).",
            fix="fix the cache_key of this archive in the profile",
        )


def _temp_dir_name(cache_key: str) -> str:
    return f".{cache_key}.tmp-{os.getpid()}"


def _remove_stale_temp_dirs(proc_root: Path, cache_key: str) -> None:
    """Remove temporary folders of this cache key left by an earlier failed or killed run."""
    if not proc_root.is_dir():
        return
    pat = re.compile(rf"^\.{re.escape(cache_key)}\.(?:tmp|old)-\d+$")
    for entry in os.scandir(proc_root):
        if pat.match(entry.name):
            p = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _current_umask() -> int | None:
    """The process umask, read without changing it (Linux); None if unknown."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


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
    umask = _current_umask()
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
                    reader.copy_range_to(fd, m.offset_data, m.size, progress=progress)
                if umask is None or mode & umask:
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
) -> ExtractionRecord:
    """Extract one cache directory's archive (a whole tar or all its split parts) into
    ``<data_root>/processed_datasets/<cache_key>/``, replacing an existing one atomically.

    ``progress`` is called with the number of member bytes just written (increments).
    Raises ArchiveError (missing part, truncated/corrupt stream), UnsafeArchiveError (a refused
    member; nothing is written) or DiskSpaceError. Count mismatches are not errors here: they
    are in the returned record's ``problems`` (see :func:`inspect_cache_dir`).
    """
    _check_cache_key(cache_key)
    t0 = time.monotonic()
    proc_root = layout.processed_root(data_root)
    final = layout.cache_dir(data_root, cache_key)
    record_path = layout.extraction_record_path(data_root, cache_key)
    _remove_stale_temp_dirs(proc_root, cache_key)  # a rerun after a failure or kill starts clean
    tar = open_archive_parts(archive_files)
    assert isinstance(tar, _PartsTarFile)
    with tar:
        archive = tar.archive_name
        tmp = proc_root / _temp_dir_name(cache_key)
        plan = _plan_members(tar.getmembers(), cache_key)
        if plan.problems:
            raise _unsafe_error(archive, plan.problems)
        total_bytes = sum(m.size for _, m in plan.files)
        proc_root.mkdir(parents=True, exist_ok=True)
        require_free_space(proc_root, total_bytes, f"extracting {archive} ({len(plan.files)} files)")
        os.mkdir(tmp)
        try:
            try:
                with disk_full_as(
                    f"the disk at {proc_root} filled up while extracting {archive}.",
                    fix="free disk space or choose another --data-root, then re-run",
                ):
                    _write_members(tar, plan, tmp, progress)
            except EOFError as e:
                raise ArchiveError(
                    f"archive {archive} ended early while extracting: {e}.", fix=REDOWNLOAD_FIX
                ) from e
            record_path.unlink(missing_ok=True)  # a record only ever describes what is in place
            publish_dir(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        archives = [p.name for p in tar.archive_parts]
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
    )
    atomic_write_json(record_path, record.to_dict())
    return record


def load_extraction_record(data_root: Path, cache_key: str) -> ExtractionRecord | None:
    """The per-key record written by the last successful extraction, or None (absent/unreadable)."""
    p = layout.extraction_record_path(data_root, cache_key)
    try:
        return ExtractionRecord.from_dict(json.loads(p.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


# --------------------------------------------------------------------------------------------------
# Cache directory inspection
# --------------------------------------------------------------------------------------------------


@dataclass
class CacheDirInfo:
    """What an extracted cache directory holds. ``total_trajectories`` is -1 when
    ``dataset_info.json`` is missing or unreadable (that is then one of the ``problems``)."""

    cache_key: str
    frame_ids: set[str]
    rows: int
    row_ids: list[str]
    total_trajectories: int
    problems: list[str]


def _arrow_shards(cache_dir: Path) -> list[Path]:
    d = cache_dir / "processed_dataset"
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if p.suffix == ".arrow" and p.is_file()), key=lambda p: p.name)


@contextlib.contextmanager
def _arrow_batches(path: Path) -> Iterator[tuple[pa.Schema, Iterator[pa.RecordBatch]]]:
    """Record batches of an Arrow IPC file, stream format (what ``save_to_disk`` writes) or file
    format; memory-mapped, one batch at a time."""
    with pa.memory_map(str(path), "r") as source:
        magic = source.read(6)
        source.seek(0)
        if magic == b"ARROW1":
            freader = pa_ipc.open_file(source)
            yield freader.schema, (freader.get_batch(i) for i in range(freader.num_record_batches))
        else:
            sreader = pa_ipc.open_stream(source)
            yield sreader.schema, iter(sreader)


def _listed(kind: str, ids: Sequence[str]) -> list[str]:
    out = [f"{kind}: {i}" for i in ids[:_MAX_LISTED]]
    if len(ids) > _MAX_LISTED:
        out.append(f"{kind}: ... and {len(ids) - _MAX_LISTED} more")
    return out


def inspect_cache_dir(cache_dir: Path) -> CacheDirInfo:
    """Count and cross-check an extracted cache directory: ``dataset_info.json``'s
    ``total_trajectories``, ``frames/trajectory_<ID>.npz`` files and the ids of the
    ``processed_dataset/*.arrow`` rows. Every disagreement is a line of ``problems``."""
    cache_dir = Path(cache_dir)
    key = cache_dir.name
    problems: list[str] = []
    if not cache_dir.is_dir():
        return CacheDirInfo(key, set(), 0, [], -1, [f"{key}: cache directory {cache_dir} does not exist"])

    total = -1
    info_path = cache_dir / "dataset_info.json"
    if not info_path.is_file():
        problems.append(f"{key}: missing dataset_info.json")
    else:
        try:
            doc = json.loads(info_path.read_text(encoding="utf-8"))
            t = doc.get("total_trajectories") if isinstance(doc, dict) else None
            if isinstance(t, int) and not isinstance(t, bool) and t >= 0:
                total = t
            else:
                problems.append(f"{key}: dataset_info.json has no valid total_trajectories (got {t!r})")
        except (OSError, ValueError) as e:
            problems.append(f"{key}: dataset_info.json is not valid JSON: {e}")

    frame_ids: set[str] = set()
    frames_dir = cache_dir / layout.FRAMES_SUBDIR
    if not frames_dir.is_dir():
        problems.append(f"{key}: missing {layout.FRAMES_SUBDIR}/ folder")
    else:
        odd: list[str] = []
        with os.scandir(frames_dir) as it:
            for entry in it:
                m = layout.FRAME_FILE_RE.match(entry.name)
                if m and entry.is_file(follow_symlinks=False):
                    frame_ids.add(m.group("id"))
                else:
                    odd.append(entry.name)
        problems.extend(_listed(f"{key}: unexpected entry in {layout.FRAMES_SUBDIR}/", sorted(odd)))

    row_ids: list[str] = []
    shards = _arrow_shards(cache_dir)
    if not shards:
        problems.append(f"{key}: no processed_dataset/*.arrow files")
    for shard in shards:
        rel = f"processed_dataset/{shard.name}"
        try:
            with _arrow_batches(shard) as (schema, batches):
                if "id" not in schema.names:
                    problems.append(f"{key}: {rel} has no 'id' column (columns: {', '.join(schema.names)})")
                    continue
                for batch in batches:
                    col = batch.column("id")
                    if col.null_count:
                        problems.append(f"{key}: {rel} has {col.null_count} row(s) with a null id")
                    row_ids.extend(str(v) for v in col.to_pylist() if v is not None)
        except (OSError, pa.ArrowException) as e:
            problems.append(f"{key}: {rel} is not a readable Arrow IPC file: {e}")

    rows = len(row_ids)
    counts: dict[str, int] = {}
    for rid in row_ids:
        counts[rid] = counts.get(rid, 0) + 1
    dups = sorted(rid for rid, c in counts.items() if c > 1)
    problems.extend(_listed(f"{key}: duplicate row id", dups))
    n_frames = len(frame_ids)
    if total >= 0 and total != n_frames:
        problems.append(f"{key}: dataset_info.json total_trajectories={total} but {n_frames} frame files")
    if total >= 0 and total != rows:
        problems.append(
            f"{key}: dataset_info.json total_trajectories={total} but {rows} processed_dataset rows"
        )
    if n_frames != rows:
        problems.append(f"{key}: {n_frames} frame files but {rows} processed_dataset rows")
    row_set = set(counts)
    problems.extend(_listed(f"{key}: frame file without a row, id", sorted(frame_ids - row_set)))
    problems.extend(_listed(f"{key}: row without a frame file, id", sorted(row_set - frame_ids)))
    return CacheDirInfo(
        cache_key=key,
        frame_ids=frame_ids,
        rows=rows,
        row_ids=row_ids,
        total_trajectories=total,
        problems=problems,
    )


def read_processed_rows(cache_dir: Path, columns: Sequence[str] | None = None) -> pa.Table:
    """All Arrow shards of ``processed_dataset/`` concatenated in file-name order (only
    ``columns`` if given, in that order)."""
    cache_dir = Path(cache_dir)
    shards = _arrow_shards(cache_dir)
    fix = f"delete {cache_dir} and re-run the build to extract it again from the pinned archive"
    if not shards:
        raise ArchiveError(f"{cache_dir}: no processed_dataset/*.arrow files.", fix=fix)
    tables: list[pa.Table] = []
    for shard in shards:
        try:
            with _arrow_batches(shard) as (schema, batches):
                if columns is not None:
                    missing = [c for c in columns if c not in schema.names]
                    if missing:
                        raise ArchiveError(
                            f"{shard}: no column(s) {', '.join(map(repr, missing))} "
                            f"(columns: {', '.join(schema.names)}).",
                            fix=fix,
                        )
                    cols = list(columns)
                    out_schema = pa.schema([schema.field(c) for c in cols], metadata=schema.metadata)
                    selected = [
                        pa.RecordBatch.from_arrays([b.column(c) for c in cols], schema=out_schema)
                        for b in batches
                    ]
                    tables.append(pa.Table.from_batches(selected, schema=out_schema))
                else:
                    tables.append(pa.Table.from_batches(list(batches), schema=schema))
        except (OSError, pa.ArrowException) as e:
            raise ArchiveError(f"{shard}: not a readable Arrow IPC file: {e}.", fix=fix) from e
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid as e:
        raise ArchiveError(
            f"{cache_dir}: processed_dataset shards have different schemas: {e}.", fix=fix
        ) from e


# --------------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------------


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
    atomic_write_json(path, report)
    return path


def stray_entries(data_root: Path, expected_cache_keys: Iterable[str]) -> list[str]:
    """Names in ``processed_datasets/`` that are not an expected cache directory (a directory, or
    a link to one), sorted. Our own temporary folders (``.<key>.tmp-<pid>``, ``.<key>.old-<pid>``)
    are ignored."""
    root = layout.processed_root(data_root)
    if not root.is_dir():
        return []
    expected = set(expected_cache_keys)
    out: list[str] = []
    with os.scandir(root) as it:
        for entry in it:
            if TEMP_DIR_RE.match(entry.name):
                continue
            if entry.name in expected and entry.is_dir(follow_symlinks=True):
                continue
            out.append(entry.name)
    return sorted(out)
