"""What every preview image shares: colours, fonts, text fitted to a width, frames made thumbnails,
and deterministic PNG bytes (no timestamp, no text chunk: the same pixels give the same bytes)."""

from __future__ import annotations

import io
import threading
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

BACKGROUND = (248, 248, 246)
INK = (32, 33, 36)
MUTED = (110, 112, 118)
RULE = (210, 210, 206)
FRAME_BG = (228, 228, 224)
BAR = (70, 118, 170)
#: the colour of a quality label (anything else is MUTED)
QUALITY_COLOURS = {
    "successful": (38, 132, 72),
    "success": (38, 132, 72),
    "suboptimal": (190, 120, 20),
    "failure": (190, 48, 48),
    "failed": (190, 48, 48),
}

Font = Any  # ImageFont.FreeTypeFont, or the bitmap font where Pillow has no FreeType


_fonts = threading.local()  # per thread: a FreeType face must not be used by two threads at once


def font(size: int) -> Font:
    """Pillow's own embedded font at ``size`` px (no font file on the system is used, so every
    machine draws the same glyphs); the bitmap default where Pillow was built without FreeType.
    Loaded once per thread and size (the UI's sheets are drawn on a few threads)."""
    loaded: dict[int, Font] = _fonts.__dict__.setdefault("by_size", {})
    if size not in loaded:
        try:
            loaded[size] = ImageFont.load_default(size=size)
        except (TypeError, ValueError, OSError, ImportError):  # pragma: no cover - Pillow without FreeType
            loaded[size] = ImageFont.load_default()
    return loaded[size]


def text_width(draw: ImageDraw.ImageDraw, text: str, f: Font) -> int:
    return int(draw.textlength(text, font=f))


def fit(draw: ImageDraw.ImageDraw, text: str, f: Font, width: int) -> str:
    """``text`` cut (with an ellipsis) to fit ``width`` pixels."""
    if text_width(draw, text, f) <= width:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix that fits with "…"
        mid = (lo + hi + 1) // 2
        if text_width(draw, text[:mid] + "…", f) <= width:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + "…"


def wrap(draw: ImageDraw.ImageDraw, text: str, f: Font, width: int, lines: int) -> list[str]:
    """``text`` wrapped on spaces into at most ``lines`` lines of ``width`` pixels (the last cut)."""
    words = text.split()
    out: list[str] = []
    cur = ""
    for i, w in enumerate(words):
        cand = f"{cur} {w}" if cur else w
        if text_width(draw, cand, f) <= width or not cur:
            cur = cand
            continue
        out.append(cur)
        cur = w
        if len(out) == lines - 1:
            cur = " ".join(words[i:])
            break
    if cur:
        out.append(cur)
    return [fit(draw, line, f, width) for line in out[:lines]] or [""]


def thumbnail(frame: np.ndarray[Any, Any], height: int, max_width: int) -> Image.Image:
    """One ``(H, W, 3)`` uint8 frame as an image ``height`` px high (its aspect kept; at most
    ``max_width`` wide). Never flipped or rotated: row 0 of the frame is the top of the image.
    Enlarged with nearest-neighbour (pixels stay sharp and true), reduced with area averaging."""
    h, w = int(frame.shape[0]), int(frame.shape[1])
    img = Image.fromarray(np.ascontiguousarray(frame[..., :3]), mode="RGB")
    scale = min(height / max(h, 1), max_width / max(w, 1))
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    if size == (w, h):
        return img
    return img.resize(size, Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.BOX)


def png_bytes(img: Image.Image) -> bytes:
    """The image as PNG bytes: deterministic (Pillow writes no time or text chunk unless asked).
    zlib level 3 rather than the default 6: the sheets are drawn on the store step's critical path,
    and level 3 encodes them much faster for a few percent more bytes."""
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=3)
    return buf.getvalue()


def stack(images: list[Image.Image], gap: int = 0) -> Image.Image:
    """``images`` one under the other on the background, left-aligned."""
    width = max((im.width for im in images), default=1)
    height = sum(im.height for im in images) + gap * max(0, len(images) - 1)
    out = Image.new("RGB", (width, max(1, height)), BACKGROUND)
    y = 0
    for im in images:
        out.paste(im, (0, y))
        y += im.height + gap
    return out
