"""One store writer at a time per local stores folder outside a data root: a ``flock`` on
``<stores folder>/<profile>/.stage2-writer.lock``.

A data root's own stores (``<data_root>/stores/<profile>/``) are written under the data root's lock
(:mod:`.lock`) alone. A stores folder given as ``--store-url file:///...`` is no data root's: two
builds of two data roots may name the same one, and without a lock of its own one build's failed
gate removed the store the other had just published there. The store step holds this lock from
the moment it looks for a store of its inputs until its store is published (or not) and the
retention policy has run; a second writer is refused with the holder and the fix. The kernel
releases a ``flock`` when its holder exits, however it exits, so a killed build never blocks the
next one. The lock file stays (removing it would let two writers lock two files of one name); its
name starts with a dot, so no listing of stores counts it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from ..errors import Stage2Error
from ..fsutil import open_regular
from .lock import holder_words

__all__ = ["STORE_LOCK_FILE", "StoresInUseError", "stores_folder_lock"]

STORE_LOCK_FILE = ".stage2-writer.lock"


class StoresInUseError(Stage2Error):
    """Another build writes stores into the same stores folder."""

    could_not_run = True


def _holder(fd: int) -> str:
    """Who holds the lock, in words, from what it wrote into the file."""
    record: object = {}
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(os.pread(fd, 4096, 0).decode("utf-8") or "{}")
    return holder_words(
        record if isinstance(record, dict) else {}, unknown="a process that has not said who it is yet"
    )


@contextlib.contextmanager
def stores_folder_lock(folder: Path, data_root: Path) -> Iterator[None]:
    """Hold ``folder``'s writer lock (``folder``: a profile's stores folder) for the block, or raise
    :class:`StoresInUseError` naming the build that holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / STORE_LOCK_FILE
    fd = open_regular(
        path,
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,  # a link there is never followed: ELOOP
        fix=f"remove it (rm {shlex.quote(str(path))}): the next build makes the lock file anew",
    )
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoresInUseError(
                f"the stores folder {folder} is being written by another build ({_holder(fd)}); "
                f"refused so that neither build removes or replaces the other's store (lock {path})",
                fix="wait for that build to end, then run this one again (what it built is kept: it "
                "resumes at the store); or give each build a --store-url of its own",
            ) from None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "data_root": str(data_root),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
        yield
    finally:
        os.close(fd)
