"""Published stores are read-only on disk: every write bit is taken off their files and folders (the
read and execute bits stay as the umask left them), so a stray write by a user's tool fails instead of damaging a
verified store. Removing such a tree (``gc``, a store moved aside, a replaced version) first gives
its folders their owner's write bit back: unlinking needs write permission on the folder only.

Root ignores these bits; they guard against accidents, not against an adversary. The publication
gate (stage2_data/store/gate.py) is what proves a store's bytes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

_WRITE_BITS = 0o222


def _walk(root: Path) -> list[tuple[str, bool]]:
    """(path, is_dir) of ``root`` and every entry under it (symlinks are not followed)."""
    out: list[tuple[str, bool]] = [(str(root), True)]
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_symlink():
                    continue
                is_dir = e.is_dir(follow_symlinks=False)
                out.append((e.path, is_dir))
                if is_dir:
                    stack.append(e.path)
    return out


def make_read_only(root: Path) -> int:
    """Take the write bits off every file and folder under ``root`` (folders last, so the walk can
    still read them). A mode already right is left alone: a chmod changes the ctime, which the
    publication gate's record covers. Returns how many entries changed."""
    changed = 0
    for path, _ in sorted(_walk(root), key=lambda e: e[1]):  # files first, then folders
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if mode & _WRITE_BITS:
            os.chmod(path, mode & ~_WRITE_BITS)
            changed += 1
    return changed


def make_writable(root: Path) -> None:
    """Give every folder under ``root`` (and ``root``) its owner's write bit back, so the tree can be
    renamed across folders and removed."""
    if not root.is_dir() or root.is_symlink():
        return
    for path, is_dir in _walk(root):
        if is_dir:
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if not mode & stat.S_IWUSR:
                os.chmod(path, mode | stat.S_IWUSR | stat.S_IXUSR)


def remove_tree(p: Path) -> None:
    """Remove a folder tree, read-only folders included (missing is fine)."""
    with contextlib.suppress(OSError):  # as rmtree below: the caller checks what is left
        make_writable(p)
    shutil.rmtree(p, ignore_errors=True)
