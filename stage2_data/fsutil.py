"""File-system helpers: free space, a full disk as a clear error, canonical JSON, ``human_bytes``,
starting a file's writeback early (``start_writeback``), and the one check of an output path a user
gives (``check_output_path``: a regular file or nothing, never a link, a device or a store's file),
and the opening of a file that must be a regular one without ever blocking on a FIFO
(``open_regular``).

Atomic writes, staging folders and publication live in :mod:`stage2_data.publish`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import DiskSpaceError, FileSystemError, Stage2Error

__all__ = [
    "DISK_FULL_ERRNOS",
    "canonical_json",
    "check_output_path",
    "disk_full_as",
    "free_bytes",
    "human_bytes",
    "open_regular",
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


def _disk_usage(path: Path) -> Any:
    """``shutil.disk_usage`` of the disk ``path`` is (or will be) on: its nearest existing folder."""
    p = path
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p)


def free_bytes(path: Path) -> int:
    return int(_disk_usage(path).free)


def require_free_space(path: Path, needed: int, what: str, *, largest: tuple[str, int] | None = None) -> None:
    """DiskSpaceError when the free disk at ``path`` is below ``needed`` bytes. ``largest``: the
    biggest single item of ``needed`` (its name, its bytes), named when it alone exceeds the whole
    disk: then it is more likely a typo than a disk to free."""
    free = free_bytes(path)
    if free < needed:
        fix = f"free {human_bytes(needed - free)} there or choose another --data-root"
        if largest is not None:
            total = _disk_usage(path).total
            if largest[1] > total:
                fix = (
                    f"{largest[0]} alone is pinned at {human_bytes(largest[1])}, more than the whole disk "
                    f"({human_bytes(total)}): correct its size in the profile if that is a typo "
                    "(`stage2 pin PROFILE --check` compares every pin with the hub); else " + fix
                )
        raise DiskSpaceError(
            f"not enough free disk at {path} for {what}: need {human_bytes(needed)}, "
            f"have {human_bytes(free)}.",
            fix=fix,
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


def tree_usage(root: Path, *, unique: bool = False) -> tuple[int, int]:
    """(files, bytes) of the files under ``root``, links not followed (``unique``: only files with
    no other hard link, what removing the tree frees). A file that vanishes meanwhile is skipped."""
    files = total = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, n))
                if not unique or st.st_nlink <= 1:
                    files += 1
                    total += st.st_size
    return files, total


def human_bytes(n: float) -> str:
    """A byte count for people, in IEC units: ``512 B``, ``1.5 KiB``, ``3.2 MiB``, ``1.0 GiB``, ``2.0 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


# What marks a folder as a store (its manifest beside its samples, or a Zarr group's metadata) and a
# folder as a data root (its lock file): ``layout`` and ``store.format`` name the same files.
_STORE_MANIFEST = "manifest.json"
_STORE_MARKS = ("sample_index.jsonl", "shards")
_ZARR_METADATA = "zarr.json"
_DATA_ROOT_MARK = ".stage2.lock"
_STORES_DIR = "stores"

_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def python_str(text: str) -> str:
    """``text`` (a path a snippet shows) as a Python string literal that pastes and runs whatever
    its characters (``"``, ``'``, backslashes): ``repr``'s, in double quotes unless ``text`` holds
    one, as the docs show the snippet."""
    quoted = repr(text)
    return f'"{quoted[1:-1]}"' if quoted[0] == "'" and '"' not in text else quoted


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in words, as every message names it: "a regular
    file", "a folder", "a symbolic link", "a FIFO", "a character device", ..."""
    return next((what for test, what in _KINDS if test(mode)), "a special file")


def not_a_folder_on(path: Path, *, broken_links: bool = True) -> tuple[Path, str] | None:
    """The first component of ``path``, from the root down (links followed), that exists and is
    not a folder, and what it is (:func:`file_kind`; "a broken symbolic link" for a link to
    nothing, unless ``broken_links`` is False: the walk then ends there as at a missing one): what
    stands where a folder is needed. None when every component that exists is a folder (the rest
    can still be made under them), or one cannot be read."""
    for part in (*reversed(path.parents), path):
        try:
            mode = os.stat(part).st_mode
        except FileNotFoundError:
            return (part, "a broken symbolic link") if broken_links and part.is_symlink() else None
        except OSError:  # unreadable: nothing to name here; the caller's own error says what
            return None
        if not stat.S_ISDIR(mode):
            return part, file_kind(mode)
    return None


def open_regular(
    path: str | os.PathLike[str],
    flags: int,
    mode: int = 0o644,
    *,
    fix: str = "",
    refuse: Callable[[int], Exception] | None = None,
) -> int:
    """A descriptor of the regular file at ``path`` opened with ``flags`` (``O_CREAT`` among them
    makes it if nothing is there), never blocking: what is there is stat'ed before it is opened (a
    device is never opened), opened with ``O_NONBLOCK`` (cleared once it is known to be a regular
    file) and checked again on the open descriptor (``fstat``: it may have been replaced). Anything
    but a regular file raises ``refuse(st_mode)``; by default a FIFO, device or socket raises
    :class:`~stage2_data.errors.FileSystemError` naming the path and what it is, with ``fix``, and
    a folder ``IsADirectoryError`` (as opening one for writing does: ``fs_error`` names it). Any
    other ``OSError`` of the open is raised as it is."""

    def check(st_mode: int) -> None:
        if stat.S_ISREG(st_mode):
            return
        if refuse is not None:
            raise refuse(st_mode)
        if stat.S_ISDIR(st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        raise _not_regular(path, st_mode, fix)

    with contextlib.suppress(FileNotFoundError):
        check(os.stat(path).st_mode)
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError:
        # replaced since the stat (a FIFO opened for writing with no reader: ENXIO): named by kind
        try:
            st_mode = os.stat(path).st_mode
        except OSError:
            st_mode = stat.S_IFREG
        check(st_mode)
        raise
    try:
        check(os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_regular(path: str | os.PathLike[str], mode: int, fix: str) -> FileSystemError:
    return FileSystemError(
        f"{os.fspath(path)} is {file_kind(mode)}, not a regular file: it was left as it is, nothing read or "
        "written.",
        fix=fix,
    )


def _store_holding(folder: Path, *, stores_dir: bool = True) -> tuple[Path, str] | None:
    """The store (or Zarr hierarchy; or, with ``stores_dir``, the data root's ``stores/``) that
    ``folder`` is or lies in, and what it is; None if none."""
    for d in (folder, *folder.parents):
        try:
            if (d / _ZARR_METADATA).exists():
                return d, "the Zarr store"
            if (d / _STORE_MANIFEST).exists() and any((d / m).exists() for m in _STORE_MARKS):
                return d, "the store"
            if stores_dir and d.name == _STORES_DIR and (d.parent / _DATA_ROOT_MARK).exists():
                return d, "the data root's stores folder"
        except OSError:  # a folder that cannot be looked into is no store of ours
            continue
    return None


def check_output_path(
    path: str | os.PathLike[str],
    *,
    option: str = "--out",
    kind: str = "file",
    error: type[Stage2Error] = Stage2Error,
) -> Path:
    """``path``, a user-given output that a command replaces by renaming a temp over it, once it is
    known to be safe to replace; ``error`` (naming ``option``, the path and a fix) otherwise.

    ``kind="file"`` (``stage2 preview``, ``stage2 export-rrd``): nothing there yet, or a regular
    file. Refused: a symbolic link (the rename would replace the link, not what it points at), a
    folder, a FIFO, a device, a socket; a path inside a store (a folder holding a store's
    ``manifest.json`` or a ``zarr.json``) or inside a data root's ``stores/``: a store is
    immutable, and a file renamed into it (its own ``manifest.json``) would destroy it.

    ``kind="folder"`` (a new store's folder): nothing there yet, or a folder that is not a store and
    lies in none; a link, a file or a special file is refused."""
    p = Path(path)
    want = stat.S_ISREG if kind == "file" else stat.S_ISDIR
    fix = f"pass {option} a new {kind} name outside any store"
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise error(f"{option} {p}: cannot look at it: {reason}.", fix=fix) from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(p)
        except OSError:
            target = "?"
        raise error(
            f"{option} {p} is a symbolic link (to {target}): writing there would replace the link, not "
            "what it points at.",
            fix=f"pass {option} a new {kind} name (or, to replace what the link points at, that path)",
        )
    if st is not None and not want(st.st_mode):
        raise error(f"{option} {p} is {file_kind(st.st_mode)}, not a {kind} to replace.", fix=fix)
    parent = p.parent if str(p.parent) else Path(".")
    inside = _store_holding(Path(os.path.realpath(parent)), stores_dir=kind == "file")
    if inside is None and kind == "folder" and st is not None:
        inside = _store_holding(Path(os.path.realpath(p)), stores_dir=False)
    if inside is not None and kind == "folder" and inside[0] == Path(os.path.realpath(p)):
        raise error(f"{option} {p} is a store: a store is immutable, never replaced.", fix=fix)
    if inside is not None:
        where, what = inside
        raise error(
            f"{option} {p} is inside {what} {where}: a store is immutable, and what is written there "
            "could replace its own files.",
            fix=f"pass {option} a path outside {where}",
        )
    return p


def shown(path: str | os.PathLike[str]) -> str:
    """``path`` as text that any terminal, log or JSON writer takes: a name that is not UTF-8 (held
    by Python as surrogate escapes) shows its odd bytes as ``\\xNN``; any other path is unchanged."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")
