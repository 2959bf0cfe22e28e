"""The one module that owns hashing: file digests and a hashing writer (SHA256SUMS parsing lives in
:mod:`stage2_data.formats.sha256sums`)."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

# SHA256SUMS parsing lives in formats.sha256sums; re-exported here for today's callers.
from .formats.sha256sums import ChecksumEntry, parse_sha256sums, read_single_sha256_file

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
BUF_SIZE = 8 * 1024 * 1024


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None) -> str:
    """sha256 of a file, read in 8 MiB blocks (hashlib releases the GIL, so threads scale)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        # A buffer sized to the file: allocating 8 MiB per small file costs more than hashing it.
        buf = bytearray(max(1, min(BUF_SIZE, os.fstat(f.fileno()).st_size + 1)))
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            if progress is not None:
                progress(n)
    return h.hexdigest()


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
    """A sha256 object fed with an existing partial file's bytes (used when resuming)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            chunk = f.read(BUF_SIZE)
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
    return h, size


__all__ = [
    "BUF_SIZE",
    "SHA256_RE",
    "ChecksumEntry",
    "HashingWriter",
    "hasher_of_prefix",
    "parse_sha256sums",
    "read_single_sha256_file",
    "sha256_bytes",
    "sha256_file",
    "sha256_files_parallel",
]
