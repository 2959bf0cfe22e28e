"""Removing the temps that killed writers left: only those whose owner is gone.

A temp name (see :mod:`.names`) records its owner; a temp is *stale* when that owner is dead (no
such process on this host, or its pid now belongs to a later process). A live owner's temps are
never touched, nor another host's. Legacy names are judged by what they record: a pid-only name
by its pid; an ownerless ``mkstemp`` name only when the caller says it may (``unowned=True``:
it holds the data root's lock, so nothing of the product is writing there).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .. import layout
from .names import parse_temp_name
from .readonly import remove_tree

__all__ = ["data_root_temp_folders", "remove_stale", "stale_temps", "sweep_data_root"]


def stale_temps(
    folder: Path, *, final: str | None = None, unowned: bool = False, dirs_only: bool = False
) -> list[Path]:
    """The stale temps directly in ``folder`` (of the final name ``final`` when given), sorted by
    name. ``unowned`` includes ownerless legacy temps; ``dirs_only`` lists folders only (no file,
    no link)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out: list[Path] = []
    for e in entries:
        t = parse_temp_name(e.name)
        if t is None or (final is not None and t.final != final):
            continue
        if dirs_only and not e.is_dir(follow_symlinks=False):
            continue
        if t.owned and t.alive():
            continue
        if not t.owned and not unowned:
            continue
        out.append(Path(e.path))
    return out


def _remove(p: Path) -> bool:
    if p.is_dir() and not p.is_symlink():
        remove_tree(p)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return not (p.exists() or p.is_symlink())


def remove_stale(
    folder: Path, *, final: str | None = None, unowned: bool = False, dirs_only: bool = False
) -> list[Path]:
    """Remove what :func:`stale_temps` lists; returns what was removed."""
    return [p for p in stale_temps(folder, final=final, unowned=unowned, dirs_only=dirs_only) if _remove(p)]


def data_root_temp_folders(data_root: Path) -> list[Path]:
    """The folders of a data root where the product makes temps: the root, ``archives/`` (verified
    records; ``archives/.partial`` is not a temp: downloads resume from it), ``derived/``,
    ``processed_datasets/``, ``tables/``, ``reports/``, ``reports/extraction/`` and each
    ``stores/<profile>/``."""
    root = Path(data_root)
    folders = [root, root / layout.ARCHIVES_DIR, root / layout.DERIVED_DIR, root / layout.PROCESSED_DIR]
    folders += [root / layout.TABLES_DIR, root / layout.REPORTS_DIR, root / layout.REPORTS_DIR / "extraction"]
    stores = root / layout.STORES_DIR
    if stores.is_dir():
        folders += sorted(p for p in stores.iterdir() if p.is_dir() and not p.is_symlink())
    return folders


def sweep_data_root(data_root: Path) -> list[Path]:
    """Remove the temps killed builds left anywhere in the data root (store staging, sidecar
    staging, extraction temp folders, half-written files and links): those of dead owners, and the
    ownerless legacy ones. Call it only while holding the data root's lock. Returns what was removed."""
    removed: list[Path] = []
    for folder in data_root_temp_folders(data_root):
        removed += remove_stale(folder, unowned=True)
    return removed
