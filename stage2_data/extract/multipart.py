"""Split parts of one tar stream, read in place: their order and a seekable view over them.

An upstream cache directory arrives as one uncompressed tar (``<cache_key>.tar``) or as split parts
of one tar stream (``<cache_key>.tar.part-aa``, ``-ab``, ..., or spelled ``.tar.partaa``, ``partab``,
...: upstream's own untar script accepts both; one archive uses one spelling). The parts are ordered and checked for
gaps (:func:`_order_parts`) and read through :class:`MultiPartReader`, a seekable view over the
concatenated parts, so no joined copy is written.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import io
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import layout
from ..errors import ArchiveError

_COPY_CHUNK = 64 * 1024 * 1024  # largest single copy_file_range call (also the progress granularity)
_BUF_SIZE = 1024 * 1024  # pread/write fallback buffer
_WINDOW = 8192  # MultiPartReader's cached window for small reads (tar headers)
_SMALL_READ = 1024


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
    seps = sorted({m.group("sep") for m in matches if m is not None})
    if len(seps) > 1:
        raise ArchiveError(
            f"split parts {[p.name for p in plist]} mix the spellings .tar.part-aa and .tar.partaa.",
            fix="pass the parts of one archive in one spelling (as the hub lists them); "
            "correct the [[archives]] paths of the profile to the hub's names",
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
    sep = seps[0]
    for i, m in enumerate(matches):
        assert m is not None
        expected = _gnu_split_suffix(i)
        if m.group("suffix") != expected:
            raise ArchiveError(
                f"archive {base}: split part {base}.part{sep}{expected} is missing "
                f"(parts given: {', '.join(names)}).",
                fix=f"download {base}.part{sep}{expected} (re-run the build to download the missing part), "
                "then extract again",
            )
    return plist
