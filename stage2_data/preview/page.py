"""A store's preview page (what ``stage2 preview`` writes): a title band, the length histogram, then
one contact sheet per source (or the one asked for); and writing it as a PNG, whole or not at all."""

from __future__ import annotations

import errno
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from ..errors import PreviewError
from ..fsutil import check_output_path
from ..publish import UMASK_MODE, atomic_write_bytes
from ._draw import BACKGROUND, INK, MUTED, RULE, fit, font, png_bytes, stack
from .histogram import length_histogram
from .sheet import DEFAULT_N, THUMB_HEIGHT, Cell, Sheet, check_n, check_source, contact_sheet, known_sources

TITLE_HEIGHT = 52
GAP = 8


@dataclass
class Preview:
    """A store's preview: the page, its parts, and the PNG bytes of the page (deterministic)."""

    store: str
    fingerprint: str | None
    image: Image.Image
    histogram: Image.Image
    sheets: list[Sheet] = field(default_factory=list)
    #: the top of each sheet on the page (px)
    offsets: list[int] = field(default_factory=list)

    @property
    def sources(self) -> list[str]:
        return [s.source for s in self.sheets]

    def cells(self) -> list[Cell]:
        """Where every frame is drawn on the page (each sheet's cells, moved to its place)."""
        return [
            Cell(c.sample_index, c.frame, (c.box[0], c.box[1] + top, c.box[2], c.box[3] + top))
            for sheet, top in zip(self.sheets, self.offsets, strict=True)
            for c in sheet.cells
        ]

    def png(self) -> bytes:
        return png_bytes(self.image)


def store_preview(
    reader: Any, source: str | None = None, n: int = DEFAULT_N, *, thumb_height: int = THUMB_HEIGHT
) -> Preview:
    """The preview of the store ``reader`` reads: every source's contact sheet (``n`` trajectories
    each), or only ``source``'s; the histogram covers the same samples. Raises PreviewError for an
    unknown source or ``n`` < 1 (before any frame is read)."""
    rows = reader.sample_index
    check_n(n)
    sources = [check_source(rows, source)] if source is not None else known_sources(rows)
    lengths = [int(r["num_frames"]) for r in rows if source is None or r["source"] == source]
    hist = length_histogram(lengths, label=source or "all sources")
    sheets = [contact_sheet(reader, s, n, thumb_height=thumb_height) for s in sources]
    name = Path(str(reader.resolved).rstrip("/")).name
    fp = reader.fingerprint
    width = max([hist.width, *(s.image.width for s in sheets)])
    band = Image.new("RGB", (width, TITLE_HEIGHT), BACKGROUND)
    draw = ImageDraw.Draw(band)
    title, small = font(18), font(12)
    head = f"{name} · {len(rows)} samples · {len(known_sources(rows))} sources"
    draw.text((10, 8), fit(draw, head, title, width - 20), fill=INK, font=title)
    sub = f"fingerprint {fp[:16] if fp else '-'} · {reader.resolved}"
    draw.text((10, 32), fit(draw, sub, small, width - 20), fill=MUTED, font=small)
    draw.line([(0, TITLE_HEIGHT - 1), (width, TITLE_HEIGHT - 1)], fill=RULE, width=1)
    parts = [band, hist, *(s.image for s in sheets)]
    page = stack(parts, gap=GAP)
    tops = [sum(im.height + GAP for im in parts[:k]) for k in range(2, len(parts))]
    return Preview(str(reader.resolved), fp, page, hist, sheets, tops)


def default_out(reader: Any, source: str | None = None) -> Path:
    """Where ``stage2 preview`` writes without ``--out``: ``stage2-preview-<store>[-<source>].png`` in
    the working directory (never inside the store: a store is immutable)."""
    name = Path(str(reader.resolved).rstrip("/")).name or "store"
    tail = f"-{_safe(source)}" if source else ""
    return Path(f"stage2-preview-{_safe(name)}{tail}.png")


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def resolve_out(out: str | os.PathLike[str] | None, reader: Any, source: str | None = None) -> Path:
    """The file to write: ``out``; inside ``out`` (with the default name) when it is a folder; the
    default name in the working directory when None. Raises PreviewError when it cannot be written
    (its folder missing or not a folder, or not writable), before anything is drawn."""
    return out_path(out, default_out(reader, source), "sheet.png")


def out_path(out: str | os.PathLike[str] | None, default: Path, example: str) -> Path:
    """``--out`` as a file to write: ``out``; ``default``'s name inside ``out`` when it is a folder
    (or ends with a slash: a folder, made when it does not exist yet); ``default`` when None.
    PreviewError (its fix naming ``--out ./<example>``) when its folder is missing, not a folder, or
    not writable; PreviewError too when it is not safe to replace (``fsutil.check_output_path``: a
    link, a special file, a path inside a store), or when its suffix is not ``default``'s (the bytes
    written are always that format)."""
    path = default if out is None else Path(out)
    fix = f"pass --out a file in an existing, writable folder (e.g. --out ./{example})"
    if out is not None and os.fspath(out).endswith(("/", os.sep)) and not path.is_dir():
        _make_out_folder(path, fix)  # a trailing slash: a folder, created when it is new
    if path.is_dir():
        path = path / default.name
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise PreviewError(f"--out {path}: cannot write there: {parent} {what}.", fix=fix)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PreviewError(f"--out {path}: cannot write there: {parent} is not writable.", fix=fix)
    path = check_output_path(path, option="--out", error=PreviewError)  # what stands there first
    if path.suffix.lower() != default.suffix:  # the bytes are always this format, whatever the name
        raise PreviewError(
            f"--out {path}: this writes a {default.suffix[1:].upper()} file, and the name says "
            f"{path.suffix or 'no format'}.",
            fix=f"name it with {default.suffix} (e.g. --out {shlex.quote(str(path.with_suffix(default.suffix)))})",
        )
    return path


def _make_out_folder(folder: Path, fix: str) -> None:
    """``--out FOLDER/`` (a trailing slash) that is not a folder yet: made (with its missing parents)
    once nothing is there and it lies in no store; PreviewError otherwise."""
    if folder.exists() or folder.is_symlink():
        raise PreviewError(f"--out {folder}/: {folder} is not a folder.", fix=fix)
    check_output_path(folder, option="--out", kind="folder", error=PreviewError)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise PreviewError(f"--out {folder}/: cannot make that folder: {reason}.", fix=fix) from None


def write_png(path: Path, data: bytes) -> Path:
    """``data`` written to ``path`` atomically (a temp next to it, renamed); PreviewError when the
    system refuses (permissions, a full disk, a read-only file system)."""
    try:
        atomic_write_bytes(path, data, mode=UMASK_MODE)
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        fix = "free some disk there" if err.errno == errno.ENOSPC else "choose another --out"
        raise PreviewError(f"--out {path}: cannot write it: {reason}.", fix=fix) from None
    return path
