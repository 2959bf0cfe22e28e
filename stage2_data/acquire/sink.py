"""Where the received bytes go: written and hashed at the same time, over recycled buffers.

Each received buffer is written and hashed at the same time by two threads (``_BlockSink``), so
receiving, writing and hashing run on separate cores. Writeback is started as the file grows
(``sync_file_range``), so the fsync before publication waits for little.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from typing import Any

from ..fsutil import WRITEBACK_EVERY, start_writeback

BLOCK_SIZE = 1024 * 1024
"""Bytes per receive buffer: one socket read loop, one file write and one hash update each."""
DEPTH = 6
"""Receive buffers per download (in flight between receiving, writing and hashing)."""


class _BlockSink:
    """Receive, then write and hash at the same time, over recycled buffers.

    The receiving thread copies what it receives into a buffer (:meth:`feed`), each full one handed
    over (:meth:`commit`); one
    background thread writes it to the partial file while a second one feeds it to the sha256, and
    the buffer goes back to the free list when both are done with it. Writing and hashing release
    the GIL, so the three stages run on different cores, and no memory is allocated per block.
    Both stages see every committed block in order; after :meth:`close` without ``error``, the pair
    (``hashed``, ``hasher``) describes the partial file exactly (after a write error the digest
    may cover bytes that never reached the file: it must not be reused then).
    At most ``depth`` blocks are in flight (back-pressure: :meth:`take` waits for a free buffer).
    """

    def __init__(
        self,
        fd: int,
        offset: int,
        hasher: Any,
        *,
        block: int | None = None,
        depth: int | None = None,
    ) -> None:
        self._fd = fd
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(depth or DEPTH):  # recycled, never reallocated
            self._free.put(bytearray(block or BLOCK_SIZE))
        self._start(offset, hasher)

    def _start(self, offset: int, hasher: Any) -> None:
        self.hasher = hasher
        self.received = offset  # file offset once every committed block is written
        self.hashed = offset
        self._written = offset  # file offset of the writer
        self._flushed = offset  # writeback started up to here (see ``WRITEBACK_EVERY``)
        self.error: BaseException | None = None
        self._to_write: queue.SimpleQueue[tuple[bytearray, int] | None] = queue.SimpleQueue()
        self._to_hash: queue.SimpleQueue[tuple[bytearray, int] | None] = queue.SimpleQueue()
        self._users: dict[int, int] = {}  # id(buffer) -> stages (write, hash) not yet done with it
        self._lock = threading.Lock()
        self._cur: bytearray | None = None  # the buffer :meth:`feed` is filling
        self._fill = 0
        self._closed = False
        self._threads = [
            threading.Thread(target=self._write_loop, name="download-write", daemon=True),
            threading.Thread(target=self._hash_loop, name="download-hash", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def restart(self) -> None:
        """Start the file over: empty it and reset the digest (the server ignored a Range)."""
        self.close()
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._start(0, hashlib.sha256())

    # ----- background stages -----
    def _release(self, buf: bytearray) -> None:
        """One stage is done with ``buf``; the last one gives it back to the free list."""
        with self._lock:
            left = self._users.pop(id(buf)) - 1
            if left:
                self._users[id(buf)] = left
                return
        self._free.put(buf)

    def _write_block(self, view: memoryview) -> None:
        """Write ``view`` (the start of a buffer) at the writer's offset."""
        pos, n = 0, len(view)
        while pos < n:
            k = os.pwrite(self._fd, view[pos:], self._written)
            pos += k
            self._written += k
        if self._written - self._flushed >= WRITEBACK_EVERY:
            # the disk works while the download goes on: the final fsync has little left to do
            start_writeback(self._fd, self._flushed, self._written - self._flushed)
            self._flushed = self._written

    def _write_loop(self) -> None:
        while (item := self._to_write.get()) is not None:
            buf, n = item
            if self.error is None:  # after a failure nothing more is written: the file stays a prefix
                try:
                    self._write_block(memoryview(buf)[:n])
                except BaseException as e:
                    self.error = e
            self._release(buf)

    def _hash_loop(self) -> None:
        while (item := self._to_hash.get()) is not None:
            buf, n = item
            self.hasher.update(memoryview(buf)[:n])
            self.hashed += n
            self._release(buf)

    # ----- the receiving thread -----
    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def take(self) -> bytearray:
        """A free buffer to fill (waits while ``depth`` blocks are in flight)."""
        buf = self._free.get()
        if self.error is not None:
            self._free.put(buf)
            self._check()
        return buf

    def commit(self, buf: bytearray, n: int) -> None:
        """Hand over the first ``n`` bytes of ``buf`` (or give an empty buffer back)."""
        if n:
            self.received += n
            with self._lock:
                self._users[id(buf)] = 2
            self._to_write.put((buf, n))
            self._to_hash.put((buf, n))
        else:
            self._free.put(buf)

    def feed(self, data: bytes) -> int:
        """Copy bytes received elsewhere (the client's own chunks) into buffers; returns the bytes of
        the blocks committed by this call (0 while the current buffer is not full)."""
        committed = 0
        view = memoryview(data)
        while view:
            if self._cur is None:
                self._cur, self._fill = self.take(), 0
            k = min(len(view), len(self._cur) - self._fill)
            self._cur[self._fill : self._fill + k] = view[:k]
            self._fill += k
            view = view[k:]
            if self._fill == len(self._cur):
                committed += self._fill
                self.commit(self._cur, self._fill)
                self._cur = None
        return committed

    def flush(self) -> int:
        """Commit a partly filled :meth:`feed` buffer; returns its bytes."""
        n = 0
        if self._cur is not None:
            n = self._fill
            self.commit(self._cur, self._fill)
            self._cur = None
        return n

    def close(self, *, check: bool = True) -> None:
        """Write and hash every committed block, stop the threads; raise a write error if ``check``."""
        if not self._closed:
            self._closed = True
            self.flush()
            self._to_write.put(None)
            self._to_hash.put(None)
            for t in self._threads:
                t.join()
        if check:
            self._check()
