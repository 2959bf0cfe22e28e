"""Deterministic tar writing, and cutting one tar stream into parts.

Tars are GNU format with members sorted by name, a fixed mtime, uid/gid 0, empty uname/gname and
fixed modes; member bytes are produced lazily, one at a time (memory bounded).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path

TAR_MTIME = 1724587200  # 2024-08-25T12:00:00Z
TAR_FORMAT = tarfile.GNU_FORMAT

Producer = Callable[[], bytes] | None  # None: a directory member


def _tarinfo(name: str, size: int | None) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mtime = TAR_MTIME
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    if size is None:
        ti.type = tarfile.DIRTYPE
        ti.mode = 0o755
        ti.size = 0
    else:
        ti.type = tarfile.REGTYPE
        ti.mode = 0o644
        ti.size = size
    return ti


def write_tar(path: Path, entries: Iterable[tuple[str, Producer]]) -> None:
    """Write a deterministic tar: members sorted by name, produced lazily (memory bounded)."""
    ordered = sorted(entries, key=lambda e: e[0])
    with tarfile.open(path, mode="w", format=TAR_FORMAT, encoding="utf-8") as tf:
        for name, producer in ordered:
            if producer is None:
                tf.addfile(_tarinfo(name + "/", None))
            else:
                data = producer()
                tf.addfile(_tarinfo(name, len(data)), io.BytesIO(data))


def dir_entries(path: str) -> list[tuple[str, Producer]]:
    """A directory member for ``path`` and for each of its parents."""
    parts = path.split("/")
    return [("/".join(parts[: i + 1]), None) for i in range(len(parts))]


def split_tar(whole: Path, out_dir: Path, base: str, suffixes: tuple[str, str]) -> list[Path]:
    """Cut one tar stream in two, inside the data of the member that spans the middle.

    The parts are ``<out_dir>/<base>.<suffix>``; ``whole`` is deleted."""
    total = whole.stat().st_size
    cut = None
    with tarfile.open(whole, mode="r:") as tf:
        best: tuple[int, int] | None = None
        for m in tf:
            if m.isfile() and m.size >= 4:
                mid = m.offset_data + m.size // 2
                d = abs(mid - total // 2)
                if best is None or d < best[0]:
                    best = (d, mid)
        if best is not None:
            cut = best[1]
    if cut is None:
        raise RuntimeError(f"demo: cannot split {whole}: no file member")
    if cut % 512 == 0:
        cut += 1
    paths = [out_dir / f"{base}.{suffixes[0]}", out_dir / f"{base}.{suffixes[1]}"]
    with open(whole, "rb") as src:
        for path, n in ((paths[0], cut), (paths[1], total - cut)):
            with open(path, "wb") as dst:
                left = n
                while left:
                    chunk = src.read(min(left, 8 << 20))
                    if not chunk:
                        raise RuntimeError(f"demo: {whole} shrank while splitting")
                    dst.write(chunk)
                    left -= len(chunk)
    whole.unlink()
    return paths
