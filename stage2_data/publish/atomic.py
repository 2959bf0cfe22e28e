"""Atomic publication on a local file system: stage under a temp name, then swap into place.

* :func:`staging` / :func:`make_staging_dir`: a sibling folder ``.<final>.tmp-<owner>`` (see
  :mod:`.names`), after removing the temps of ``final`` that dead owners left;
* :func:`publish_dir`: put a complete staging folder at ``final``. When ``final`` exists the two are
  swapped with ``renameat2(RENAME_EXCHANGE)`` (Linux), so there is no instant without a complete
  version at ``final``; where that call is unavailable the old one is renamed aside
  (``.<final>.old-<owner>``), the new one renamed in (a window of two renames during which
  ``final`` is absent, never half-written). The old version is deleted afterwards (``keep`` first
  moves out of it what must not be deleted);
* :func:`atomic_symlink`: point a link at a new target (temp link + rename);
* :func:`atomic_write_bytes` / ``_text`` / ``_json``: a file written under a temp name, fsynced,
  renamed over ``final``.

Every rename is followed by an fsync of the folder. Object storage has no rename: its protocol
(data first, the manifest last, then the ``CURRENT`` object) lives with
:class:`stage2_data.storage.StoreLocation`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..fsutil import disk_full_as
from .names import temp_path
from .readonly import remove_tree
from .sweep import remove_stale

__all__ = [
    "UMASK_MODE",
    "atomic_symlink",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "current_umask",
    "fsync_dir",
    "make_staging_dir",
    "publish_dir",
    "remove_path",
    "rename_exchange",
    "staging",
]

#: ``mode`` of :func:`atomic_write_bytes` meaning "ordinary file permissions" (0o666 & ~umask).
UMASK_MODE = -1


def fsync_dir(path: Path) -> None:
    """fsync a folder (its entries' renames become durable); errors are ignored."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def current_umask() -> int:
    """The process umask: read from ``/proc/self/status`` (Linux; thread-safe), else by setting it
    and back."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def rename_exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2``). False when the call is unavailable
    here (another OS, an old kernel, a file system without it); other errors raise OSError."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def remove_path(p: Path) -> None:
    """Remove a file, a link or a folder tree (missing is fine)."""
    if p.is_symlink() or p.is_file():
        p.unlink(missing_ok=True)
    else:
        remove_tree(p)


def make_staging_dir(final: Path, *, mode: int = 0o777, sweep_stale: bool = True) -> Path:
    """Create ``.<final>.tmp-<owner>`` next to ``final`` (``mode`` minus the umask, set explicitly)
    after removing the temps of ``final`` whose owner is gone (``sweep_stale``)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if sweep_stale:
        remove_stale(final.parent, final=final.name)
    tmp = temp_path(final, "tmp")
    tmp.mkdir(mode=mode)
    os.chmod(tmp, mode & ~current_umask())
    return tmp


@contextlib.contextmanager
def staging(
    final: Path, *, mode: int = 0o777, keep_on_error: bool = False, sweep_stale: bool = True
) -> Iterator[Path]:
    """A staging folder for ``final`` (:func:`make_staging_dir`), removed when the block raises
    (unless ``keep_on_error``). The block publishes it (:func:`publish_dir`) when complete; a
    staging folder left unpublished at a normal exit is removed too."""
    tmp = make_staging_dir(final, mode=mode, sweep_stale=sweep_stale)
    try:
        yield tmp
    except BaseException:
        if not keep_on_error:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if tmp.exists() or tmp.is_symlink():
        remove_path(tmp)


def publish_dir(tmp: Path, final: Path, *, keep: Callable[[Path], None] | None = None) -> None:
    """Move a complete staging folder ``tmp`` to ``final``; an existing ``final`` (folder, file or
    link) stays complete until the swap and is deleted after it.

    ``keep``, when given, is called with the old version (at a temp name, complete) once ``final``
    holds the new one and before the old one is deleted: it moves out of it whatever must not be
    deleted (a user's files). When it raises, the swap is undone (the old version back at
    ``final``, the new one at ``tmp``) and its error is raised: nothing of the old version is
    deleted."""
    if final.exists() or final.is_symlink():
        if rename_exchange(tmp, final):
            fsync_dir(final.parent)
            old = tmp  # now holds the old version

            def undo() -> None:
                if not rename_exchange(tmp, final):  # pragma: no cover - it worked a moment ago
                    raise OSError(errno.ENOSYS, "renameat2(RENAME_EXCHANGE) is unavailable", str(final))
        else:
            old = temp_path(final, "old")
            os.replace(final, old)
            os.replace(tmp, final)

            def undo() -> None:
                os.replace(final, tmp)
                os.replace(old, final)

        if keep is not None:
            try:
                keep(old)
            except BaseException:
                undo()
                fsync_dir(final.parent)
                raise
        remove_path(old)
    else:
        os.replace(tmp, final)
        fsync_dir(final.parent)


def atomic_symlink(target: str, link: Path) -> None:
    """Point ``link`` at ``target`` atomically (a temp link, then a rename over ``link``)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(link, "tmp")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(link.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Write ``path`` whole or not at all: a temp file next to it, fsynced, renamed over it.

    ``mode`` is the new file's permission bits before the umask: 0o600 by default (what
    ``mkstemp`` gave), :data:`UMASK_MODE` for ordinary permissions (0o666 minus the umask)."""
    p = Path(path)
    # a full disk is named with the file and the fix wherever it is met (a build's records, a
    # report), not as a bare "[Errno 28] No space left on device"
    with disk_full_as(
        f"the disk is full at {p.parent}: could not write {p.name} ({len(data)} bytes)",
        fix=f"free space on the disk that holds {p.parent} (`df -h {p.parent}`), then run again "
        "(what was built is kept)",
    ):
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(p, "tmp")
        perm = 0o666 if mode == UMASK_MODE else mode
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), perm)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def atomic_write_text(path: str | os.PathLike[str], text: str, *, mode: int = 0o600) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(
    path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, mode: int = 0o600
) -> None:
    """``obj`` as sorted, indented JSON (UTF-8 kept) plus a final newline, written atomically. A
    file name that is not UTF-8 (held as surrogate escapes) is written as ``\\udcXX`` escapes, which
    read back to the same name."""
    text = json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False) + "\n"
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = (json.dumps(obj, indent=indent, sort_keys=True) + "\n").encode("ascii")
    atomic_write_bytes(path, data, mode=mode)
