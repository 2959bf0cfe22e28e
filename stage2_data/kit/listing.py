"""What the data root holds, by name: one ``scandir`` per folder, no per-file ``stat`` unless sizes
are asked for."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from .. import layout


def list_files(d: Path) -> set[str] | None:
    """Names of the regular files (symlinks to files included) in ``d``; None when ``d`` is absent."""
    try:
        with os.scandir(d) as it:
            return {e.name for e in it if e.is_file()}
    except (FileNotFoundError, NotADirectoryError):
        return None


def file_sizes(d: Path, names: Iterable[str]) -> dict[str, int]:
    """{name: size} of those of ``names`` that exist in ``d``."""
    out: dict[str, int] = {}
    base = f"{os.fspath(d)}/"
    for n in names:
        with contextlib.suppress(FileNotFoundError):
            out[n] = os.stat(base + n).st_size
    return out


def sidecar_dirs(derived: Path) -> dict[str, set[str]]:
    """{source: {file names}} of ``derived/action_sidecars/<source>/``."""
    root = derived / layout.SIDECARS_DIR
    out: dict[str, set[str]] = {}
    try:
        with os.scandir(root) as it:
            sources = sorted(e.name for e in it if e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return out
    for s in sources:
        out[s] = list_files(root / s) or set()
    return out


def count_sidecar_files(derived: Path) -> int:
    return sum(len(v) for v in sidecar_dirs(derived).values())
