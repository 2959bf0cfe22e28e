"""File-system helpers: free space, a full disk as a clear error, canonical JSON, ``human_bytes``,
starting a file's writeback early (``start_writeback``).

Atomic writes, staging folders and publication live in :mod:`stage2_data.publish`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import DiskSpaceError

__all__ = [
    "DISK_FULL_ERRNOS",
    "canonical_json",
    "disk_full_as",
    "free_bytes",
    "human_bytes",
    "require_free_space",
    "start_writeback",
]

WRITEBACK_EVERY = 8 * 1024 * 1024
"""Bytes a writer lets accumulate between two :func:`start_writeback` calls."""


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Start writing ``nbytes`` from ``offset`` of the file ``fd`` to disk, without waiting (Linux's
    ``sync_file_range(SYNC_FILE_RANGE_WRITE)``): the disk works while the writer goes on, and the
    fsync before publication has little left to wait for. False where this does not exist (the
    fsync then does it all); it never makes anything durable by itself."""
    if _sync_file_range is None or nbytes <= 0:
        return False
    return _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) == 0


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def free_bytes(path: Path) -> int:
    p = path
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def require_free_space(path: Path, needed: int, what: str) -> None:
    free = free_bytes(path)
    if free < needed:
        raise DiskSpaceError(
            f"not enough free disk at {path} for {what}: need {human_bytes(needed)}, "
            f"have {human_bytes(free)}.",
            fix=f"free {human_bytes(needed - free)} there or choose another --data-root",
        )


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


@contextlib.contextmanager
def disk_full_as(message: str, fix: str) -> Iterator[None]:
    """Raise a full disk or an exceeded quota (ENOSPC, EDQUOT) met inside the block as
    ``DiskSpaceError(message, fix=fix)``; any other error passes unchanged."""
    try:
        yield
    except OSError as e:
        if e.errno in DISK_FULL_ERRNOS:
            raise DiskSpaceError(message, fix=fix) from e
        raise


def human_bytes(n: float) -> str:
    """A byte count for people, in IEC units: ``512 B``, ``1.5 KiB``, ``3.2 MiB``, ``1.0 GiB``, ``2.0 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover
