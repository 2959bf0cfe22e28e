"""The target of a build or a merge: what may be replaced there, and clearing an object-storage prefix.

A local ``out_dir`` must be absent, empty, or a store (which the new one replaces atomically); an
object-storage prefix must be empty, a store, or the leftovers of an interrupted upload (replaced:
``StoreLocation.withdraw`` deletes the manifest first, then the rest).

Publication (:mod:`stage2_data.publish`): a local store is written into a sibling staging folder
``.<name>.tmp-<pid>-<start>-<host>-<rand>``, the manifest last, then swapped in atomically
(``renameat2(RENAME_EXCHANGE)``, or a rename-aside fallback); a writer first deletes the staging
folders of writers that are gone (killed builds).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from ..publish import remove_stale, stale_temps
from ..storage import StoreLocation
from .format import MANIFEST_NAME, PAIRS_NAME, SAMPLE_INDEX_NAME, SHARDS_DIR, SPLITS_DIR, STORE_FORMAT
from .manifest import load_manifest


def _store_format(loc: StoreLocation) -> Any:
    """The ``format`` named by the manifest at ``loc``; None without a readable manifest."""
    manifest = load_manifest(loc).manifest
    return None if manifest is None else manifest.get("format")


def check_out_dir(out_dir: Path, problems: list[str]) -> None:
    if out_dir.is_symlink() and not out_dir.exists():
        problems.append(f"out_dir {out_dir} is a dangling symlink")
        return
    if out_dir.exists():
        if not out_dir.is_dir():
            problems.append(f"out_dir {out_dir} exists and is not a folder")
        elif any(out_dir.iterdir()) and _store_format(StoreLocation.parse(out_dir)) != STORE_FORMAT:
            problems.append(
                f"out_dir {out_dir} is a non-empty folder that is not a VIN offline store; "
                "refusing to replace it (choose another folder or remove it)"
            )
    anc = nearest_existing(out_dir.parent)
    if not anc.is_dir():
        problems.append(f"cannot create {out_dir.parent}: {anc} is not a folder")
    elif (why := not_writable(anc)) is not None:
        what, make = unwritable_reason(why)
        problems.append(f"cannot create {out_dir}: {anc} is not writable ({what}: {make})")


def nearest_existing(path: Path) -> Path:
    """``path`` when it exists, else the nearest path above it that does: the folder that creating
    ``path`` (and the folders missing above it) writes into."""
    anc = Path(path)
    while not anc.exists() and anc.parent != anc:
        anc = anc.parent
    return anc


def not_writable(folder: Path) -> OSError | None:
    """Why this process cannot create anything in the folder ``folder``, as the ``OSError`` a write
    there raises, naming the folder: ``EROFS`` for a read-only file system or a read-only (bind)
    mount, which stops root too; ``EACCES`` for want of write (or search) permission. None when it
    can."""
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    code = errno.EROFS if read_only else errno.EACCES
    return OSError(code, os.strerror(code), str(folder))


def unwritable_reason(err: OSError) -> tuple[str, str]:
    """What :func:`not_writable`'s error says, in words, and what makes the folder writable."""
    if err.errno == errno.EROFS:
        return "a read-only file system", "remount it read-write"
    return "no write permission for this user", "give this user write access to it"


#: what a store prefix may hold; anything else under an object-storage target is not ours to delete
_STORE_TOP_NAMES = frozenset({MANIFEST_NAME, SAMPLE_INDEX_NAME, PAIRS_NAME, SPLITS_DIR, SHARDS_DIR})


def check_remote_out(loc: StoreLocation, problems: list[str]) -> None:
    """An object-storage target: empty, a store, or the leftovers of an interrupted upload (only
    store names, no manifest): those are replaced. Anything else is refused."""
    try:
        names = loc.listdir_names(loc.root)
    except OSError as e:
        problems.append(f"cannot list {loc.url}: {e}")
        return
    foreign = sorted(names - _STORE_TOP_NAMES)
    if foreign:
        problems.append(
            f"{loc.url} holds objects that are not part of a VIN offline store ({foreign[:5]}); "
            "refusing to replace it (choose another prefix or remove them)"
        )
    elif MANIFEST_NAME in names and _store_format(loc) != STORE_FORMAT:
        problems.append(
            f"{loc.url} holds a manifest.json that is not a VIN offline store's; refusing to replace it"
        )


def stale_temp_dirs(out_dir: str | os.PathLike[str]) -> list[Path]:
    """The staging (``.<name>.tmp-*``) and replaced (``.<name>.old-*``) folders next to ``out_dir``
    whose writer is gone (killed builds); the folders of a live writer on this machine are never
    listed (:mod:`stage2_data.publish`)."""
    out = Path(out_dir).absolute()
    return stale_temps(out.parent, final=out.name, dirs_only=True)


def remove_stale_temp_dirs(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Delete what :func:`stale_temp_dirs` lists; returns the removed folders."""
    out = Path(out_dir).absolute()
    return remove_stale(out.parent, final=out.name, dirs_only=True)
