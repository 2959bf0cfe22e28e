"""One writer kind at a time per data root: a ``flock`` on ``<data_root>/.stage2.lock``.

A build (``stage2 build``, ``pipelines.runner.build_all``; ``stage2 gc`` too) holds it
**exclusively** (:func:`data_root_lock`). Every step of a Dagster run that no build covers (a run
started from the UI, a schedule or a sensor, ``dagster job execute``, a script calling Dagster)
holds it **shared** for the step's duration (:func:`run_step_lock`, taken by
``assets/_common.py``): such runs go side by side (several steps of a run, several runs), never at
the same time as a build. Two builds, or a build and such a run, writing one data root at once
would race on the same downloads, cache directories and store; the one that comes second is refused
with an error naming the holder and the fix (a build, with ``timeout``, waits for the holder to
finish). A step of a run a build covers takes nothing: the run was launched by the build
(:data:`LAUNCHING_BUILD_ENV`; :func:`require_launching_build` checks before publication that the
build still holds the lock), or it executes in the build's own process (:func:`holds_data_root_lock`)
or in a process the build started (a step worker of its executor: the holder is an ancestor).

Telling the two kinds of holder apart relies on the kernel only: when the exclusive lock is
refused, a non-blocking shared probe succeeds exactly when the holders are shared ones. The
exclusive holder writes one JSON line (pid, host, start, command) into the lock file while it holds
it; each shared holder process writes ``<data_root>/.stage2.lock.d/<pid>.json`` (removed on
release), read only to name the holders in a message and trusted only while its process (pid and
start time) is alive.

The kernel releases a ``flock`` when its holder exits, however it exits (SIGKILL included), so a
lock left by a killed build or run never blocks the next one: there is no stale-lock clean-up to
get wrong (a killed shared holder's record is ignored as dead, and removed by the next holder). The
lock file itself is left in place (removing it would let two processes lock two different files of
the same name).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import layout
from ..errors import Stage2Error
from ..formats.sha256sums import read_regular_bytes
from ..fsutil import open_regular
from ..oserrors import fs_error
from .names import host_tag, owner_alive, proc_start_time

__all__ = [
    "LAUNCHING_BUILD_ENV",
    "BuildGoneError",
    "DataRootInUseError",
    "DataRootLockedError",
    "data_root_lock",
    "holder_words",
    "holds_data_root_lock",
    "lock_path",
    "read_holder",
    "read_shared_holders",
    "require_launching_build",
    "run_step_lock",
    "shared_holders_dir",
]

#: Set in the environment of the runs a build launches: the pid of the `stage2 build` that holds
#: the data root's lock for them (pipelines/launch.py)
LAUNCHING_BUILD_ENV = "STAGE2_BUILD_PID"

# Data roots this process holds: resolved path -> (thread that holds it, nesting depth).
_HELD: dict[Path, tuple[int, int]] = {}
_HELD_LOCK = threading.Lock()
# ... and the build id each wrote into the lock (the runs it starts carry it: stages.BUILD_TAG)
_BUILD_IDS: dict[Path, str] = {}

# Data roots this process holds shared (run_step_lock): resolved path -> [fd, holders in this
# process]. One flock and one record per process and data root, however many steps hold it.
_SHARED: dict[Path, list[int]] = {}
_SHARED_LOCK = threading.Lock()


def _forget_after_fork() -> None:
    """In a forked child, nothing is held by this process (its parent holds what the tables name;
    the child's copies of the shared descriptors are closed: the parent releases them)."""
    global _HELD_LOCK, _SHARED_LOCK
    _HELD_LOCK, _SHARED_LOCK = threading.Lock(), threading.Lock()
    _HELD.clear()
    _BUILD_IDS.clear()
    for fd, _count in _SHARED.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _SHARED.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


class DataRootLockedError(Stage2Error):
    """Another process holds the data root's lock; ``holder`` is what it wrote (may be empty)."""

    def __init__(self, message: str, *, holder: dict[str, Any], fix: str) -> None:
        self.holder = holder
        super().__init__(message, fix=fix)


def lock_path(data_root: Path) -> Path:
    return Path(data_root) / layout.LOCK_FILE


def _open_lock(path: Path, flags: int) -> int:
    """The lock file opened with ``flags``, never blocking: a FIFO, device, socket or folder at its
    path raises a FileSystemError naming the path (a ``flock`` takes a regular file only)."""
    return open_regular(
        path,
        flags,
        fix=f"remove it (rm {shlex.quote(str(path))}): the next build makes the lock file anew",
    )


def _command_line() -> str:
    """This process's command line as a holder records it (the program's base name, 300 chars)."""
    return " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300]


def shared_holders_dir(data_root: Path) -> Path:
    """``<data_root>/.stage2.lock.d/``: one ``<pid>.json`` per process holding the lock shared."""
    return Path(data_root) / (layout.LOCK_FILE + ".d")


def read_holder(data_root: Path) -> dict[str, Any]:
    """What the current holder wrote into the lock file ({} when nothing readable is there)."""
    try:
        data = json.loads(read_regular_bytes(lock_path(data_root)).decode("utf-8") or "{}")
    except (OSError, ValueError):  # a FIFO there too: never opened for reading, nothing blocks
        return {}
    return data if isinstance(data, dict) else {}


def _shared_probe(path: Path) -> bool | None:
    """A non-blocking shared ``flock`` probe of the lock file at ``path`` (the kernel's answer,
    whatever the records say): True when it would be granted, False when some process holds the
    lock exclusively (this one too, from another open file description), None when the file cannot
    be opened or the probe fails otherwise."""
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return False if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def _held_shared(data_root: Path) -> bool:
    """Whether the lock (which this process could not take exclusively) is held by shared holders
    only: a shared probe is granted exactly then."""
    return _shared_probe(lock_path(data_root)) is True


def holder_words(holder: dict[str, Any], *, unknown: str, prefix: str = "pid") -> str:
    """A lock holder's record in words: ``pid N on HOST, data root R, started T (LABEL or COMMAND)``, each
    part only when the record has it; ``unknown`` stands for the pid when none is recorded (the
    holder has not written its record yet). Used by every lock's refusal (:mod:`.store_lock` too)."""
    pid = holder.get("pid")
    who = f"{prefix} {pid}" if isinstance(pid, int) else unknown
    if holder.get("host"):
        who += f" on {holder['host']}"
    if holder.get("data_root"):
        who += f", data root {holder['data_root']}"
    if holder.get("started_at"):
        who += f", started {holder['started_at']}"
    what = holder.get("label") or holder.get("command")
    if what:
        who += f" ({what})"
    return who


def _in_parallel(command: str) -> str:
    """The refusal's way to go on meanwhile: another data root is one only for a build."""
    again = f"run `stage2 {command}` again"
    return f"{again}; for a build in parallel, use another --data-root" if command == "build" else again


def _shared_locked_error(data_root: Path, waited: float, command: str) -> DataRootLockedError:
    holders = read_shared_holders(data_root)
    named = [holder_words(h, unknown="a process whose pid is not recorded") for h in holders]
    who = "; ".join(named) if named else "its process is not recorded"
    waited_txt = f" after waiting {waited:g}s" if waited > 0 else ""
    return DataRootLockedError(
        f"data root {data_root} is in use by a run of the Dagster UI, a schedule or a sensor "
        f"(a step of it holds the lock shared: {who}); refused{waited_txt} so that `stage2 {command}` "
        f"never changes a data root while a run works in it (lock {lock_path(data_root)}).",
        holder={"shared": holders},
        fix=f"wait for that run to end (the UI's Runs page shows it), then {_in_parallel(command)}",
    )


def _locked_error(data_root: Path, waited: float, command: str) -> DataRootLockedError:
    if _held_shared(data_root):
        return _shared_locked_error(data_root, waited, command)
    holder = read_holder(data_root)
    pid = holder.get("pid")
    who = holder_words(holder, unknown="a process whose pid is not recorded yet")
    waited_txt = f" after waiting {waited:g}s" if waited > 0 else ""
    stop = f" (or stop it: `kill {pid}`)" if isinstance(pid, int) else ""
    return DataRootLockedError(
        f"data root {data_root} is in use by another build: {who}; refused{waited_txt} so that two "
        f"builds never write the same data root at once (lock {lock_path(data_root)}).",
        holder=holder,
        fix=f"wait for that build to finish{stop}, then {_in_parallel(command)}",
    )


class DataRootInUseError(DataRootLockedError):
    """A step of a run no build covers (the UI, a schedule, a sensor) could not take the data
    root's lock shared: a build (or ``stage2 gc``) holds it; the step wrote nothing."""


def _in_use_error(data_root: Path, holder: dict[str, Any]) -> DataRootInUseError:
    who = holder_words(holder, unknown="a build whose pid is not recorded yet", prefix="build pid")
    return DataRootInUseError(
        f"data root {data_root} is in use by {who}; this run wrote nothing (a run of the Dagster UI, "
        f"a schedule or a sensor never writes a data root while a build does: lock {lock_path(data_root)}).",
        holder=holder,
        fix="wait for that build to end, then re-execute this run from the UI; or use another data root",
    )


class BuildGoneError(Stage2Error):
    """A run launched by a build is about to publish, but that build no longer holds the data
    root's lock (it was killed): nothing is published."""


def _held_exclusively(path: Path) -> bool:
    """Whether some process holds the lock file at ``path`` exclusively now: a shared probe would
    block exactly then."""
    return _shared_probe(path) is False


def current_build_id(data_root: Path) -> str | None:
    """The id of the build that holds ``data_root``'s lock exclusively now (what it wrote into the
    lock file), from any process: the build's own, or a run it launched. None when no build holds
    it (a run of the UI, a schedule) or its record names none."""
    if not _held_exclusively(lock_path(Path(data_root))):
        return None
    build_id = read_holder(Path(data_root)).get("build_id")
    return build_id if isinstance(build_id, str) and build_id else None


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
    if _held_exclusively(path) and str(read_holder(Path(data_root)).get("pid")) == pid:
        return
    raise BuildGoneError(
        f"the build that launched this run (pid {pid}) no longer holds the data root's lock "
        f"({path}): it was stopped or killed, so this run publishes nothing",
        fix="run `stage2 build` again: it resumes from what was verified",
    )


@contextlib.contextmanager
def data_root_lock(
    data_root: Path, *, timeout: float = 0.0, poll: float = 0.2, command: str = "build"
) -> Iterator[Path]:
    """Hold ``<data_root>/.stage2.lock`` exclusively for the duration of the block.
    ``command``: the stage2 command that takes it (``build``, ``gc``), for the refusal's fix.

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
        fd = _open_lock(path, os.O_RDWR | os.O_CREAT)
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
                    raise _locked_error(root, round(waited, 1) if timeout > 0 else 0.0, command) from None
                time.sleep(min(poll, max(0.0, timeout - waited)))
        info = {
            "build_id": uuid.uuid4().hex,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": _command_line(),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode("utf-8"), 0)
        _remove_shared_records(root, keep_alive=False)  # no shared holder can hold it now: stale
        with _HELD_LOCK:
            _HELD[key] = (me, 1)
            _BUILD_IDS[key] = str(info["build_id"])
        try:
            yield path
        finally:
            with _HELD_LOCK:
                _HELD.pop(key, None)
                _BUILD_IDS.pop(key, None)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def held_build_id(data_root: Path) -> str | None:
    """The id this process wrote into ``data_root``'s lock while it holds it exclusively (the
    ``stage2/build`` tag of the runs it starts: :func:`run_step_lock`), else None."""
    with _HELD_LOCK:
        return _BUILD_IDS.get(Path(data_root).resolve())


def holds_data_root_lock(data_root: Path) -> bool:
    """Whether this process holds ``data_root``'s lock exclusively (:func:`data_root_lock`), in
    any of its threads: a step executed in the build's own process (``--run-in-process``) runs on
    a thread of its own."""
    key = Path(data_root).resolve()
    with _HELD_LOCK:
        return key in _HELD


def _parent_pid(pid: int) -> int:
    """The parent of ``pid`` (Linux ``/proc``; 0 when unknown)."""
    if pid == os.getpid():
        return os.getppid()
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _started_by(holder: dict[str, Any]) -> bool:
    """Whether the process that holds the lock exclusively (``holder``, what it wrote) is an
    ancestor of this one on this host: this process is a step worker its executor started (a
    multiprocess executor's worker, a local Dask cluster's), covered by its lock."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 1 or holder.get("host") != socket.gethostname():
        return False
    p = os.getpid()
    for _ in range(64):
        p = _parent_pid(p)
        if p <= 1:
            return False
        if p == pid:
            return True
    return False


def _record_path(data_root: Path, pid: int) -> Path:
    return shared_holders_dir(data_root) / f"{pid}.json"


def _read_record(path: Path) -> dict[str, Any] | None:
    """A shared holder's record if its process is alive (pid and start time), else None."""
    try:
        pid = int(path.name.removesuffix(".json"))
    except ValueError:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        data = {}  # being written, or cut short: judged by its name's pid alone
    if not isinstance(data, dict):
        data = {}
    start, host = data.get("start"), data.get("host_tag")
    start = start if isinstance(start, int) else 0
    host = host if isinstance(host, str) else None
    if not owner_alive(pid, start, host):
        return None
    return {**data, "pid": pid}


def read_shared_holders(data_root: Path) -> list[dict[str, Any]]:
    """The records of the processes that hold the data root's lock shared (pid, host, started_at,
    command, label), by pid; a record whose process is gone (killed: the kernel dropped its lock)
    is left out. What the lock's state is, only the lock says: these name its holders."""
    try:
        paths = sorted(shared_holders_dir(data_root).glob("*.json"))
    except OSError:
        return []
    found = [r for r in (_read_record(p) for p in paths) if r is not None]
    return sorted(found, key=lambda r: r["pid"])


def _remove_shared_records(data_root: Path, *, keep_alive: bool) -> None:
    """Remove the shared holders' records whose process is gone (all of them, ``keep_alive``
    False: under the exclusive lock no process holds it shared)."""
    folder = shared_holders_dir(data_root)
    try:
        paths = list(folder.glob("*.json"))
    except OSError:
        return
    for path in paths:
        if keep_alive and (path.name == f"{os.getpid()}.json" or _read_record(path) is not None):
            continue
        with contextlib.suppress(OSError):
            path.unlink()


def _acquire_shared(root: Path, label: str, build_id: str | None) -> bool:
    """Take the lock shared for this process (or count one more holder in it). False when the
    exclusive holder is the build whose run this is (it wrote ``build_id``) or an ancestor of this
    process (nothing taken). Raises DataRootInUseError."""
    key = root.resolve()
    with _SHARED_LOCK:
        held = _SHARED.get(key)
        if held is not None:
            held[1] += 1
            return True
        doing = f"cannot lock the data root {root} ({layout.LOCK_FILE}) for this run's step"
        try:
            fd = _open_lock_file(root)
        except OSError as e:
            raise fs_error(e, doing, where=str(root)) from None
        if fd is None:
            return True  # a data root no build has locked, this process cannot write: nothing to share
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise fs_error(e, doing, where=str(root)) from None
            holder = read_holder(root)
            if (build_id and holder.get("build_id") == build_id) or _started_by(holder):
                return False
            raise _in_use_error(root, holder) from None
        try:
            folder = shared_holders_dir(root)
            folder.mkdir(exist_ok=True)
            _remove_shared_records(root, keep_alive=True)
            record = {
                "pid": os.getpid(),
                "start": proc_start_time(os.getpid()),
                "host": socket.gethostname(),
                "host_tag": host_tag(),
                "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "command": _command_line(),
                "label": label[:300],
            }
            _record_path(root, os.getpid()).write_text(json.dumps(record, sort_keys=True) + "\n", "utf-8")
        except OSError as e:
            if e.errno not in _READ_ONLY_ERRNOS:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                raise fs_error(e, doing, where=str(root)) from None
            # a data root this process may read but not write (a read-only mount, another user's
            # folder): the lock is held all the same, only without the record that names its holder
        _SHARED[key] = [fd, 1]
        return True


# What opening or writing in a data root this process may only read raises.
_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def _open_lock_file(root: Path) -> int | None:
    """The data root's lock file opened for a shared lock (created if missing). A data root this
    process cannot write (a read-only mount: the verify job's steps only read) has its lock file
    opened read-only, which ``flock`` takes as well; None when it has none (no build ever ran
    there) and none can be made."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        return _open_lock(lock_path(root), os.O_RDONLY | os.O_CREAT)
    except OSError as e:
        if e.errno not in _READ_ONLY_ERRNOS or not root.is_dir():
            raise
    try:
        return _open_lock(lock_path(root), os.O_RDONLY)
    except FileNotFoundError:
        return None


def _release_shared(root: Path) -> None:
    key = root.resolve()
    with _SHARED_LOCK:
        held = _SHARED.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _SHARED[key]
        with contextlib.suppress(OSError):  # the record first: never a record without its lock
            _record_path(root, os.getpid()).unlink()
        with contextlib.suppress(OSError):
            fcntl.flock(held[0], fcntl.LOCK_UN)
        os.close(held[0])


@contextlib.contextmanager
def run_step_lock(data_root: Path, *, label: str = "", build_id: str | None = None) -> Iterator[str]:
    """The lock a step of a Dagster run holds while it works on ``data_root``; yields what covers
    the step:

    * ``"build"``: a build's exclusive lock does, and nothing is taken: the run was launched by a
      build (:data:`LAUNCHING_BUILD_ENV` set; the build's lock is checked again before publication,
      :func:`require_launching_build`), or this process holds the lock (a run executed in the
      build's process), or the holder is the build whose run this is (``build_id``, the run's
      ``stage2/build`` tag, is what it wrote into the lock: its steps on a Dask worker or a pod of
      another host too), or the holder is an ancestor of this process (a step worker the build's
      executor started);
    * ``"shared"``: any other run (the Dagster UI, a schedule, a sensor, ``dagster job execute``):
      the lock is taken shared, non-blocking, for the block. Runs go side by side; a build cannot
      start meanwhile (it is refused, naming the run: :class:`DataRootLockedError`).

    Raises :class:`DataRootInUseError` (naming the build: pid, host, start, command) at once when
    a build holds the lock: the step has written nothing. ``label`` (the run and step) goes into
    this process's record, for the message a build refused meanwhile prints."""
    root = Path(data_root)
    if os.environ.get(LAUNCHING_BUILD_ENV) or holds_data_root_lock(root):
        yield "build"
        return
    if not _acquire_shared(root, label, build_id):
        yield "build"
        return
    try:
        yield "shared"
    finally:
        _release_shared(root)
