"""What an extraction or a sidecar unpack finds, in the folder it replaces, that it did not write:
moved aside into the data root's quarantine folder, never deleted.

A re-extraction publishes the new cache directory in place of the old one
(:func:`~stage2_data.publish.publish_dir`), then the old one is deleted. Before that, every entry of
the old folder is sorted out (:func:`foreign_entries`): a file the previous extraction wrote and
nobody changed (its record lists it with these very stats, or its bytes are the sha256 its record
or the new extraction has for that path) is deleted, it is re-created from the verified archive;
anything else (a file the record does not list, an edited file, a link, a folder of the user's) is
moved to ``<data_root>/quarantine/<UTC time>/<its path under the data root>`` (a folder holding
nothing the extractions wrote moves whole, by one rename), with the quarantine folder's
``moved.json`` saying from where and why (:func:`move_aside`). `stage2 list` shows it; only
`stage2 gc --quarantine` removes it.

Only the foreign entries move, not the whole old folder: a cache directory can be many GiB, and its
extracted files would sit in the quarantine folder as a second copy of what the new one holds
(until the user empties it) for the sake of a notes file; the user's own files are all that
cannot be made again.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..fsutil import shown
from ..publish.quarantine import quarantine_moves
from .extract import FileStat, hash_regular_file

#: What the previous extraction (unpack) recorded of a file: (sha256, (inode, size, mtime_ns, ctime_ns)),
#: by its path relative to the folder.
Recorded = Mapping[str, tuple[str, FileStat]]
#: What the new extraction (unpack) wrote at a path: (sha256, size).
Written = Mapping[str, tuple[str, int]]


def foreign_entries(old: Path, new: Path, recorded: Recorded, written: Written) -> list[str]:
    """The entries of ``old`` (a folder just replaced by ``new``) that are not a file the previous
    extraction wrote, unchanged, by path relative to ``old``: a regular file is the extraction's
    when ``recorded`` lists it with its stats now, or when its sha256 is the one ``recorded`` or
    ``written`` has for that path (only a file of that size is hashed); anything else is foreign.
    A folder that no recorded path is under and that ``new`` has no folder at is returned whole;
    any other folder is looked into. ``[""]`` (the whole of it) when ``old`` is not a folder."""
    if not stat.S_ISDIR(os.lstat(old).st_mode):
        return [""]
    recorded_dirs = {r.rsplit("/", i)[0] for r in recorded for i in range(1, r.count("/") + 1)}
    out: list[str] = []

    def ours(path: str, rel: str, st: os.stat_result) -> bool:
        if not stat.S_ISREG(st.st_mode):
            return False
        rec = recorded.get(rel)
        if rec is not None and tuple(rec[1]) == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            return True  # as the extraction left it (a change always gives a newer ctime)
        shas: set[str] = set()
        if rec is not None and rec[1][1] == st.st_size:
            shas.add(rec[0])
        new_file = written.get(rel)
        if new_file is not None and new_file[1] == st.st_size:
            shas.add(new_file[0])
        if not shas:
            return False
        try:
            sha, _ = hash_regular_file(path)
        except OSError:
            return False  # not readable now: kept
        return sha in shas

    def visit(path: str, rel: str) -> None:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            r = f"{rel}{e.name}"
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if r in recorded_dirs or (new / r).is_dir():
                    visit(e.path, r + "/")
                else:
                    out.append(r)
            elif not ours(e.path, r, st):
                out.append(r)

    visit(os.fspath(old), "")
    return out


def move_aside(
    data_root: Path, old: Path, under: str, rels: Sequence[str], reason: str
) -> list[tuple[Path, Path]]:
    """Move each of ``rels`` (paths relative to ``old``, a replaced folder whose place under the data
    root is ``under``) into a new quarantine folder, at ``<folder>/<under>/<rel>``; its
    ``moved.json`` says from where (``<data_root>/<under>/<rel>``, the path the user knew) and why.
    Returns [(that path, where it is now)]. An ``OSError`` is raised as a named error; what was moved
    before it is in ``moved.json`` too."""
    data_root = Path(data_root)
    return quarantine_moves(
        data_root,
        [(old / rel if rel else old, data_root / under / rel if rel else data_root / under) for rel in rels],
        reason,
        doing=f"moving what the build did not write in {data_root / under} aside",
    )


def set_aside_foreign(
    data_root: Path, old: Path, new: Path, recorded: Recorded, written: Written, reason: str
) -> list[str]:
    """:func:`foreign_entries` of ``old`` moved aside (:func:`move_aside`, keeping their paths under
    ``new``'s place in the data root); one ``<from> -> <to>`` line each (the build's ``moved_aside``
    form)."""
    under = new.relative_to(data_root).as_posix()
    moved = move_aside(data_root, old, under, foreign_entries(old, new, recorded, written), reason)
    return [f"{shown(a)} -> {shown(b)}" for a, b in moved]
