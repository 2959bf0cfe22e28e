"""An ``OSError`` from the file system as a named error: what was being done, the path, and a fix
that works.

The file system refuses in a handful of ways a user can fix: a read-only file system, permission
denied, no space left, a file where a folder should be (or a folder where a file should be), a
name too long, too many open files. :func:`fs_error` turns one ``OSError`` into a
:class:`~stage2_data.errors.FileSystemError` (or a :class:`~stage2_data.errors.DiskSpaceError` for
a full disk) naming the path and the fix; :func:`fs_guard` does it for a block. Errors of the
family that are also ``OSError`` (``DiskSpaceError``, ``StoreNotFoundError``) pass through as they
are.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from .errors import DiskSpaceError, FileSystemError, Stage2Error
from .fsutil import file_kind, not_a_folder_on

__all__ = ["fs_error", "fs_guard"]

_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _paths(e: OSError) -> str:
    names = [n for n in (e.filename, e.filename2) if n is not None]
    return " -> ".join(str(n) for n in names)


# What a path that exists but is no folder is, by its mode (anything else is a "file")
def _in_the_way(e: OSError) -> tuple[str, str] | None:
    """The component of ``e``'s path that exists but is not a folder (links followed), the one a
    "Not a directory" or "File exists" is about, and what it is (``fsutil.file_kind``);
    None when every component that exists is a folder. The error names the deepest path it was
    given (``<data root>/archives/x.tar``), but the component in the way may lie far above it. A
    "File exists" of a link or a rename is about its destination (the second path) alone."""
    names = (
        (e.filename2,) if e.errno == errno.EEXIST and e.filename2 is not None else (e.filename, e.filename2)
    )
    for name in names:
        if not isinstance(name, (str, bytes, os.PathLike)) or not os.fspath(name):
            continue  # none, or a file descriptor: no path to walk
        # a link to nothing is not what "Not a directory" or "File exists" is about: the caller's
        # own message names it, with its own fix
        found = not_a_folder_on(Path(os.fsdecode(name)), broken_links=False)
        if found is not None:
            return str(found[0]), found[1]
    return None


def fs_error(e: OSError, doing: str, *, where: str | None = None) -> Stage2Error:
    """``e`` as one line: ``<doing>: <path>: <what the system said>.`` (``doing`` may be empty) and
    the fix. ``where`` names the folder to change (e.g. the data root) when the fix is "choose
    another one"."""
    if isinstance(e, Stage2Error):
        return e
    path = _paths(e) or (where or "")
    code = e.errno
    reason = e.strerror or str(e) or type(e).__name__
    # "<doing>: <path>: <reason>."; without ``doing`` (the caller's line already names the command)
    # "<path>: <reason>."
    msg = ": ".join(part for part in (doing, path, f"{reason}.") if part)
    other = f" (or choose another folder than {where})" if where else ""
    if code in _FULL:
        full = f"the disk is full{f' at {path}' if path else ''}."
        return DiskSpaceError(f"{doing}: {full}" if doing else full, fix="free disk space, then re-run")
    if code == errno.EROFS:
        fix = f"remount the file system read-write{other}, then re-run"
    elif code in (errno.EACCES, errno.EPERM):
        fix = f"give this user write (and read) access to {path or 'that path'}{other}, then re-run"
    elif code in (errno.ENOTDIR, errno.EEXIST) and (blocker := _in_the_way(e)) is not None:
        found, kind = blocker
        # ``doing`` may be the option that gave the path (``--data-root``): the one to change
        instead = f"another {doing}" if doing.startswith("--") else where and f"another folder than {where}"
        if kind == file_kind(stat.S_IFREG):
            fix = (
                f"a file stands where a folder is needed: {found}; move or delete that file"
                f"{f' (or choose {instead})' if instead else ''}, then re-run"
            )
        else:  # a device, a pipe, a socket: never to be deleted, so the path is what must change
            fix = (
                f"{found} is {kind}, not a folder: leave it as it is and choose "
                f"{instead or 'a path that does not go through it'}, then re-run"
            )
    elif code in (errno.ENOTDIR, errno.EEXIST):
        fix = (
            f"a file stands where a folder is needed on the path {path or ''}: move or delete that file"
            f"{other}, then re-run"
        )
    elif code == errno.EISDIR:
        fix = f"a folder stands where a file is needed ({path}): move or delete that folder, then re-run"
    elif code == errno.ENOENT:
        fix = f"create the missing folder{other}, then re-run"
    elif code == errno.ENAMETOOLONG:
        fix = "use a shorter path (e.g. a data root closer to /)"
    elif code in (errno.EMFILE, errno.ENFILE):
        fix = "raise the open-files limit (`ulimit -n 65536`), then re-run"
    else:
        fix = f"check the file system at {path or where or 'that path'}, then re-run"
    return FileSystemError(msg, fix=fix)


@contextlib.contextmanager
def fs_guard(doing: str, *, where: str | None = None) -> Iterator[None]:
    """Run the block; an ``OSError`` that is not already of the family leaves it as
    :func:`fs_error` names it."""
    try:
        yield
    except Stage2Error:
        raise
    except OSError as e:
        raise fs_error(e, doing, where=where) from e
