"""The contact sheet of one source: a few of its trajectories, each as its first, middle and last
frame beside its task text, quality label, length and resolution.

Cheap and bounded: only the ``n`` trajectories shown are decoded (never the whole store), chosen
evenly over the source's samples in store order, so the same store always gives the same sheet
(and the same PNG bytes). Frames are drawn as stored, never flipped: a source that is upside down
looks upside down here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image, ImageDraw

from ..errors import PreviewError
from ._draw import (
    BACKGROUND,
    FRAME_BG,
    INK,
    MUTED,
    QUALITY_COLOURS,
    RULE,
    fit,
    font,
    thumbnail,
    wrap,
)

DEFAULT_N = 3  # trajectories per source
THUMB_HEIGHT = 96  # px: the height of one frame on the sheet
MAX_N = 64  # the most trajectories of one source on a sheet (a sheet stays an image, not a dump)
PAD = 10
TEXT_WIDTH = 330
HEADER = 46
CAPTION = 16
TEXT_HEIGHT = 90  # px: the five lines of text beside a sample's frames


@dataclass(frozen=True)
class Cell:
    """Where one frame of one sample is drawn on a sheet: ``box`` is (left, top, right, bottom)."""

    sample_index: int
    frame: int
    box: tuple[int, int, int, int]


@dataclass
class Sheet:
    """One source's contact sheet: the image, the samples shown (their index rows, in order), where
    each frame is drawn, and how many samples the source has in all."""

    source: str
    image: Image.Image
    samples: list[dict[str, Any]] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)
    total: int = 0


def known_sources(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every source of a store's sample index, sorted."""
    return sorted({str(r["source"]) for r in rows})


def check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PreviewError(
            f"--n {n!r}: the number of trajectories per source must be at least 1.",
            fix=f"pass --n 1 or more (default {DEFAULT_N}; at most {MAX_N} are shown)",
        )
    return min(n, MAX_N)


def check_source(rows: Sequence[dict[str, Any]], source: str, where: str = "the store") -> str:
    known = known_sources(rows)
    if source not in known:
        raise PreviewError(
            f"--source {source!r}: {where} has no sample of that source; its sources are: "
            f"{', '.join(known) or '(none)'}.",
            fix=f"pass one of them, e.g. --source {known[0]}" if known else "build a store with samples",
        )
    return source


def pick_samples(rows: Sequence[dict[str, Any]], source: str, n: int) -> list[dict[str, Any]]:
    """``n`` samples of ``source`` spread evenly over its samples in store order (all when it has
    ``n`` or fewer): the first, then every ``len/n``-th."""
    mine = [r for r in rows if r["source"] == source]
    n = check_n(n)
    if len(mine) <= n:
        return mine
    return [mine[(k * len(mine)) // n] for k in range(n)]


def frame_indices(num_frames: int) -> list[int]:
    """First, middle and last frame (fewer for a sample of one or two frames)."""
    t = max(1, int(num_frames))
    return sorted({0, (t - 1) // 2, t - 1})


def contact_sheet(reader: Any, source: str, n: int = DEFAULT_N, *, thumb_height: int = THUMB_HEIGHT) -> Sheet:
    """The contact sheet of ``source`` in the store ``reader`` reads (a ``VinOfflineStoreReader``):
    ``n`` trajectories (see :func:`pick_samples`), each a row of its first / middle / last frame and
    its text. Raises PreviewError for an unknown source or ``n`` < 1."""
    rows = reader.sample_index
    check_source(rows, source)
    chosen = pick_samples(rows, source, n)
    total = sum(1 for r in rows if r["source"] == source)
    max_thumb_w = 2 * thumb_height
    thumbs: list[list[tuple[int, Image.Image]]] = []
    for r in chosen:
        frames = reader.read_frames(int(r["sample_index"]))
        thumbs.append(
            [(i, thumbnail(frames[i], thumb_height, max_thumb_w)) for i in frame_indices(len(frames))]
        )
    col_w = max((im.width for row in thumbs for _, im in row), default=thumb_height)
    cols = 3
    text_x = PAD + cols * (col_w + PAD) + PAD
    width = text_x + TEXT_WIDTH + PAD
    row_h = max(thumb_height + CAPTION, TEXT_HEIGHT) + PAD
    height = HEADER + len(chosen) * row_h + PAD
    img = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(img)
    title, small, body = font(17), font(12), font(13)
    draw.text((PAD, 8), fit(draw, source, title, width - 2 * PAD), fill=INK, font=title)
    sub = f"{len(chosen)} of {total} trajectories · first / middle / last frame"
    draw.text((PAD, 28), fit(draw, sub, small, width - 2 * PAD), fill=MUTED, font=small)
    draw.line([(0, HEADER - 4), (width, HEADER - 4)], fill=RULE, width=1)
    cells: list[Cell] = []
    for k, (r, row) in enumerate(zip(chosen, thumbs, strict=True)):
        y = HEADER + k * row_h
        for c in range(cols):
            x = PAD + c * (col_w + PAD)
            draw.rectangle([x, y, x + col_w - 1, y + thumb_height - 1], fill=FRAME_BG)
            if c >= len(row):
                continue
            i, im = row[c]
            ox, oy = x + (col_w - im.width) // 2, y + (thumb_height - im.height) // 2
            img.paste(im, (ox, oy))
            cells.append(Cell(int(r["sample_index"]), i, (ox, oy, ox + im.width, oy + im.height)))
            draw.text((x, y + thumb_height + 2), f"t={i}", fill=MUTED, font=small)
        _sample_text(draw, r, text_x, y, (small, body))
        if k:
            draw.line([(PAD, y - PAD // 2), (width - PAD, y - PAD // 2)], fill=RULE, width=1)
    return Sheet(source, img, list(chosen), cells, total)


def _sample_text(
    draw: ImageDraw.ImageDraw, r: dict[str, Any], x: int, y: int, fonts: tuple[Any, Any]
) -> None:
    small, body = fonts
    w = TEXT_WIDTH
    draw.text((x, y), fit(draw, f"#{r['sample_index']}  {r['sample_key']}", small, w), fill=MUTED, font=small)
    task = str(r.get("task") or "(no task text)")
    for j, line in enumerate(wrap(draw, task, body, w, 2)):
        draw.text((x, y + 17 + 17 * j), line, fill=INK, font=body)
    quality = str(r.get("quality_label") or "(no quality label)")
    draw.text((x, y + 53), fit(draw, quality, body, w), fill=QUALITY_COLOURS.get(quality, MUTED), font=body)
    partial = r.get("partial_success")
    if partial is not None:
        qx = x + int(draw.textlength(quality, font=body)) + 10
        draw.text((qx, y + 55), f"partial success {float(partial):.2f}", fill=MUTED, font=small)
    width = int(r.get("action_width") or 0)
    facts = f"{r['num_frames']} frames · {r['frame_height']}x{r['frame_width']} · {r['split']} · " + (
        f"actions {width} wide" if width else "no actions"
    )
    draw.text((x, y + 74), fit(draw, facts, small, w), fill=MUTED, font=small)
