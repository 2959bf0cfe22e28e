"""One build at a time per data root: an exclusive ``flock`` on ``<data_root>/.stage2.lock``.

Two builds writing one data root at once would race on the same downloads, cache directories and
store; the second one is refused with an error naming the holder (pid, host, start time, command)
and the fix, or, with ``timeout``, waits for the holder to finish.

The kernel releases a ``flock`` when its holder exits, however it exits (SIGKILL included), so a
lock left by a killed build never blocks the next one: there is no stale-lock clean-up to get
wrong. The lock file itself is left in place (removing it would let two processes lock two
different files of the same name); the holder writes one JSON line into it while it holds it.

Only what takes the lock is protected: ``stage2 build`` (``pipelines.runner.build_all``) does; a
run started by hand from the Dagster UI does not.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import layout
from ..errors import Stage2Error
from ..oserrors import fs_error

__all__ = [
    "LAUNCHING_BUILD_ENV",
    "BuildGoneError",
    "DataRootLockedError",
    "data_root_lock",
    "lock_path",
    "read_holder",
    "require_launching_build",
]

#: Set in the environment of the runs a build launches: the pid of the `stage2 build` that holds
#: the data root's lock for them (pipelines/launch.py)
LAUNCHING_BUILD_ENV = "STAGE2_BUILD_PID"

# Data roots this process holds: resolved path -> (thread that holds it, nesting depth).
_HELD: dict[Path, tuple[int, int]] = {}
_HELD_LOCK = threading.Lock()


class DataRootLockedError(Stage2Error):
    """Another process holds the data root's lock; ``holder`` is what it wrote (may be empty)."""

    def __init__(self, message: str, *, holder: dict[str, Any], fix: str) -> None:
        self.holder = holder
        super().__init__(message, fix=fix)


def lock_path(data_root: Path) -> Path:
    return Path(data_root) / layout.LOCK_FILE


def read_holder(data_root: Path) -> dict[str, Any]:
    """What the current holder wrote into the lock file ({} when nothing readable is there)."""
    try:
        data = json.loads(lock_path(data_root).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _locked_error(data_root: Path, waited: float) -> DataRootLockedError:
    holder = read_holder(data_root)
    pid = holder.get("pid")
    who = f"pid {pid}" if isinstance(pid, int) else "a process whose pid is not recorded yet"
    if holder.get("host"):
        who += f" on {holder['host']}"
    if holder.get("started_at"):
        who += f", started {holder['started_at']}"
    if holder.get("command"):
        who += f" ({holder['command']})"
    waited_txt = f" after waiting {waited:g}s" if waited > 0 else ""
    stop = f" (or stop it: `kill {pid}`)" if isinstance(pid, int) else ""
    return DataRootLockedError(
        f"data root {data_root} is in use by another build: {who}; refused{waited_txt} so that two "
        f"builds never write the same data root at once (lock {lock_path(data_root)}).",
        holder=holder,
        fix=f"wait for that build to finish{stop}, then run again; "
        "for a build in parallel, use another --data-root",
    )


class BuildGoneError(Stage2Error):
    """A run launched by a build is about to publish, but that build no longer holds the data
    root's lock (it was killed): nothing is published."""


def require_launching_build(data_root: Path) -> None:
    """In a run launched by `stage2 build` (:data:`LAUNCHING_BUILD_ENV` set), raise BuildGoneError
    unless that build still holds the data root's lock. The build holds the lock for its runs; a
    build killed by SIGKILL (or the OOM killer) releases it at once while a run it launched may go
    on, and such a run must not publish into a data root another build may now hold. Elsewhere (a
    run launched from the UI, a build's own process) nothing is checked."""
    pid = os.environ.get(LAUNCHING_BUILD_ENV)
    if not pid:
        return
    path = lock_path(Path(data_root))
    held = False
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            held = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    if held and str(read_holder(Path(data_root)).get("pid")) == pid:
        return
    raise BuildGoneError(
        f"the build that launched this run (pid {pid}) no longer holds the data root's lock "
        f"({path}): it was stopped or killed, so this run publishes nothing",
        fix="run `stage2 build` again: it resumes from what was verified",
    )


@contextlib.contextmanager
def data_root_lock(data_root: Path, *, timeout: float = 0.0, poll: float = 0.2) -> Iterator[Path]:
    """Hold ``<data_root>/.stage2.lock`` exclusively for the duration of the block.

    ``timeout`` 0 (the default) refuses at once when another process holds it; a positive
    ``timeout`` waits up to that many seconds. Raises DataRootLockedError naming the holder, or a
    FileSystemError (read-only, permission denied, a file where the data root should be) naming
    the path and the fix.
    The data root is created if needed. Re-entrant in the thread that holds it (a build that
    calls ``build_all`` again for the same data root); any other thread or process is refused.
    """
    root = Path(data_root)
    path = lock_path(root)
    doing = f"cannot lock the data root {root} ({path.name})"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise fs_error(e, doing, where=str(root)) from None
    key = root.resolve()
    me = threading.get_ident()
    with _HELD_LOCK:
        held = _HELD.get(key)
        if held is not None and held[0] == me:
            _HELD[key] = (me, held[1] + 1)
    if held is not None and held[0] == me:
        try:
            yield path
        finally:
            with _HELD_LOCK:
                _HELD[key] = (me, _HELD[key][1] - 1)
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as e:
        raise fs_error(e, doing, where=str(root)) from None
    try:
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise fs_error(e, doing, where=str(root)) from None
                waited = time.monotonic() - t0
                if waited >= timeout:
                    raise _locked_error(root, round(waited, 1) if timeout > 0 else 0.0) from None
                time.sleep(min(poll, max(0.0, timeout - waited)))
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode("utf-8"), 0)
        with _HELD_LOCK:
            _HELD[key] = (me, 1)
        try:
            yield path
        finally:
            with _HELD_LOCK:
                _HELD.pop(key, None)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
