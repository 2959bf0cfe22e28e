"""The one module that owns hashing: file digests and a hashing writer (SHA256SUMS parsing lives in
:mod:`stage2_data.formats.sha256sums`)."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from .fsutil import open_regular

# A whole lower-case hex sha256 (``\Z``: ``$`` would also accept a trailing newline).
SHA256_RE = re.compile(r"\A[0-9a-f]{64}\Z")
BUF_SIZE = 8 * 1024 * 1024  # a block of a streamed read
HASH_BLOCK = 4 * 1024 * 1024  # the per-thread read buffer of the file hashers
_thread_state = threading.local()


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_buffer() -> bytearray:
    """This thread's read buffer, allocated once and reused for every file: a fresh buffer per file
    costs page faults that, for small files, exceed the hashing itself."""
    buf: bytearray | None = getattr(_thread_state, "buf", None)
    if buf is None:
        buf = _thread_state.buf = bytearray(HASH_BLOCK)
    return buf


def _feed_file(
    h: hashlib._Hash, path: str | os.PathLike[str], progress: Callable[[int], None] | None = None
) -> int:
    """Feed a file's bytes into ``h``; returns how many there were. Only a regular file (a link to
    one is followed): a FIFO, device or socket there is a FileSystemError naming it, never a read
    that blocks (``fsutil.open_regular``)."""
    buf = _hash_buffer()
    view = memoryview(buf)
    size = 0
    fd = open_regular(
        path, os.O_RDONLY, fix="remove it, or put there the regular file it stands for, and re-run"
    )
    try:
        while n := os.readv(fd, [buf]):
            h.update(view[:n])
            size += n
            if progress is not None:
                progress(n)
    finally:
        os.close(fd)
    return size


def sha256_file_and_size(
    path: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None
) -> tuple[str, int]:
    """sha256 and size of a file, read in blocks into a per-thread buffer (hashlib releases the GIL
    while it hashes, so threads hash in parallel). ``progress(n)`` is called after each block."""
    h = hashlib.sha256()
    size = _feed_file(h, path, progress)
    return h.hexdigest(), size


def sha256_file(path: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None) -> str:
    """sha256 of a file (see :func:`sha256_file_and_size`)."""
    return sha256_file_and_size(path, progress=progress)[0]


def sha256_files_parallel(
    paths: Iterable[str | os.PathLike[str]], *, workers: int | None = None
) -> dict[str, str]:
    """Hash many files across threads; returns {str(path): digest}. Missing files raise."""
    plist = [str(p) for p in paths]
    workers = workers or max(2, (os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(plist, pool.map(sha256_file, plist), strict=True))


class HashingWriter:
    """A writable binary file that hashes every byte written, so a download is hashed in one pass.

    It supports what a resumable downloader needs: ``tell``, ``seek`` back to the start of the
    download (which resets the digest) and ``truncate``.
    """

    def __init__(self, f: BinaryIO, *, prefix_hasher: hashlib._Hash | None = None) -> None:
        self._f = f
        self._h = prefix_hasher if prefix_hasher is not None else hashlib.sha256()
        self._base = f.tell()
        self.bytes_written = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = self._f.write(data)
        self._h.update(data)
        self.bytes_written += len(data)
        return n if n is not None else len(data)

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        pos = self._f.seek(offset, whence)
        if pos == 0:
            self._h = hashlib.sha256()
            self.bytes_written = 0
        elif pos != self._base + self.bytes_written:
            raise OSError(f"HashingWriter cannot seek to {pos}: the digest covers bytes up to the end only")
        return pos

    def truncate(self, size: int | None = None) -> int:
        return self._f.truncate(size)

    def flush(self) -> None:
        self._f.flush()

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    # Attributes some HTTP code probes for.
    @property
    def name(self) -> str:
        return getattr(self._f, "name", "<hashing-writer>")


def hasher_of_prefix(path: str | os.PathLike[str]) -> tuple[hashlib._Hash, int]:
    """A sha256 object fed with an existing partial file's bytes (used when resuming), and their count."""
    h = hashlib.sha256()
    return h, _feed_file(h, path)


__all__ = [
    "BUF_SIZE",
    "HASH_BLOCK",
    "SHA256_RE",
    "HashingWriter",
    "hasher_of_prefix",
    "sha256_bytes",
    "sha256_file",
    "sha256_file_and_size",
    "sha256_files_parallel",
]
