"""File-system helpers: free space, a full disk as a clear error, canonical JSON, ``human_bytes``.

Atomic writes and publication live in :mod:`stage2_data.publish` (one temp-name format, owner
liveness, ``renameat2``); the names below (``atomic_write_*``, ``fsync_dir``, ``staging_dir``,
``publish_dir``, ``atomic_symlink``) are kept for today's callers and delegate there.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import DiskSpaceError
from .publish.atomic import (
    atomic_symlink,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    fsync_dir,
    publish_dir,
    staging,
)

__all__ = [
    "DISK_FULL_ERRNOS",
    "atomic_symlink",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "canonical_json",
    "disk_full_as",
    "free_bytes",
    "fsync_dir",
    "human_bytes",
    "publish_dir",
    "require_free_space",
    "staging_dir",
]


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@contextlib.contextmanager
def staging_dir(final: Path, *, keep_on_error: bool = False) -> Iterator[Path]:
    """A temporary sibling folder of ``final`` (mode 0o700, as ``mkdtemp`` made it); removed on
    error unless ``keep_on_error``. Use :func:`stage2_data.publish.staging` in new code."""
    with staging(final, mode=0o700, keep_on_error=keep_on_error) as tmp:
        yield tmp


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
