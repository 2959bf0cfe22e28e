"""Local shard files opened read-only, once each: what the strict reader reads a local store through.

A file is opened the first time it is read and stays open for the reader's life, at most ``limit``
files at once (the least recently used closed first); a read is ONE ``preadv`` of the bytes asked
for, into buffers the caller gives (the new array a sample's frames are returned in, or the
reader's own buffer), so a read costs one system call and the copy out of the page cache that an
array of the caller's needs anyway.

Files are read, never mapped. A mapping of a file that shrinks
under it (a store truncated by hand, a damaged disk, a copy still being written) kills the
process with SIGBUS at the first access past the new end: no Python exception, no named error,
whatever the reader checks beforehand (a check of the size races the truncation). A read past the
end is a short read instead, which the reader names (``StoreChecksumError``: the store, the
shard, the array and the sample). Store files are never rewritten in place (a rebuild publishes a
new folder; gc unlinks, which an open file survives), so a file, once open, is the store's.

A read takes the lock only to find (or open) its file and to count itself in and out: a file is
closed only once no read of it is in flight (an eviction by another thread marks it, the last
read closes it), so a file number is never reused under a read.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..fsutil import open_regular


class _Open:
    __slots__ = ("closing", "fd", "users")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.closing = False


def preadv_full(fd: int, buffers: Sequence[Any], offset: int) -> int:
    """``preadv`` into ``buffers`` (writable, C-contiguous byte buffers) at ``offset`` until they
    are full or the file ends; returns the bytes read (fewer than asked: the file ends first)."""
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if len(v)]
    total = 0
    while views:
        n = os.preadv(fd, views, offset + total)
        if n <= 0:
            break
        total += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]
    return total


class ShardFiles:
    """Files open read-only, once each, at most ``limit`` at once (least recently used closed
    first). ``paths`` lists the files open now, least recently used first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: OrderedDict[Path, _Open] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def paths(self) -> list[Path]:
        with self._lock:
            return list(self._open)

    def read_into(self, path: Path, offset: int, buffers: Sequence[Any]) -> int:
        """Fill ``buffers`` with the bytes of ``path`` from ``offset`` on (one ``preadv``); returns
        the bytes read, fewer than the buffers hold when the file ends first. Raises
        FileNotFoundError (and other OSErrors) of the file."""
        f = self._acquire(path)
        try:
            return preadv_full(f.fd, buffers, offset)
        finally:
            self._release(f)

    def _acquire(self, path: Path) -> _Open:
        with self._lock:
            f = self._open.get(path)
            if f is not None:
                self._open.move_to_end(path)
                f.users += 1
                return f
        # never a wait on a FIFO that replaced the file since the reader looked at it: named
        fd = open_regular(path, os.O_RDONLY, fix="the store is damaged: rebuild it (stage2 build)")
        with self._lock:
            f = self._open.get(path)
            if f is not None:  # another thread opened it meanwhile: keep that one
                os.close(fd)
                self._open.move_to_end(path)
            else:
                f = self._open[path] = _Open(fd)
                while len(self._open) > self.limit:
                    _, old = self._open.popitem(last=False)
                    self._retire(old)
            f.users += 1
            return f

    def _release(self, f: _Open) -> None:
        with self._lock:
            f.users -= 1
            if f.closing and f.users == 0:
                self._close_fd(f)

    def _retire(self, f: _Open) -> None:
        """(lock held) Close ``f`` now, or when its last read in flight ends."""
        f.closing = True
        if f.users == 0:
            self._close_fd(f)

    @staticmethod
    def _close_fd(f: _Open) -> None:
        if f.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(f.fd)
            f.fd = -1

    def close(self) -> None:
        """Close every file (one still being read is closed when its read ends)."""
        with self._lock:
            while self._open:
                _, f = self._open.popitem()
                self._retire(f)
