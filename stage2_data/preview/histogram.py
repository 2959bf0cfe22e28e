"""The length histogram: how many samples have how many frames, drawn from the sample index alone
(no frame is read, so it is cheap at any store size)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw

from ._draw import BACKGROUND, BAR, INK, MUTED, RULE, fit, font

WIDTH, HEIGHT = 560, 220
MAX_BINS = 40  # one bar per length up to this many distinct lengths, else this many equal bins
LEFT, RIGHT, TOP, BOTTOM = 48, 14, 40, 34


@dataclass(frozen=True)
class Bins:
    """``counts[k]`` samples have a length in ``[starts[k], starts[k] + width)``."""

    starts: list[int]
    width: int
    counts: list[int]


def length_bins(lengths: Sequence[int], max_bins: int = MAX_BINS) -> Bins:
    if not lengths:
        return Bins([], 1, [])
    lo, hi = min(lengths), max(lengths)
    width = max(1, math.ceil((hi - lo + 1) / max_bins))
    nbins = (hi - lo) // width + 1
    counts = [0] * nbins
    for v in lengths:
        counts[(v - lo) // width] += 1
    return Bins([lo + k * width for k in range(nbins)], width, counts)


def _median(values: Sequence[int]) -> float:
    s = sorted(values)
    m = len(s) // 2
    return float(s[m]) if len(s) % 2 else (s[m - 1] + s[m]) / 2


def length_histogram(lengths: Sequence[int], *, label: str = "all sources") -> Image.Image:
    """A bar chart of ``lengths`` (frames per sample), titled with their count, min, median, mean
    and max; ``label`` says whose lengths they are."""
    img = Image.new("RGB", (WIDTH, HEIGHT), BACKGROUND)
    draw = ImageDraw.Draw(img)
    title, small = font(14), font(11)
    n = len(lengths)
    head = f"frames per sample · {label} · {n} samples"
    if n:
        head += (
            f" · min {min(lengths)} · median {_median(lengths):g} · mean {sum(lengths) / n:.1f}"
            f" · max {max(lengths)}"
        )
    draw.text((10, 10), fit(draw, head, title, WIDTH - 20), fill=INK, font=title)
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    draw.line([(x0, y1), (x1, y1)], fill=RULE, width=1)
    draw.line([(x0, y0), (x0, y1)], fill=RULE, width=1)
    bins = length_bins(lengths)
    if not bins.counts:
        draw.text((x0 + 10, (y0 + y1) // 2), "no samples", fill=MUTED, font=small)
        return img
    peak = max(bins.counts)
    slot = (x1 - x0) / len(bins.counts)
    for k, c in enumerate(bins.counts):
        if c:
            top = y1 - round((y1 - y0) * c / peak)
            left = x0 + round(k * slot) + 1
            right = max(left, x0 + round((k + 1) * slot) - 1)
            draw.rectangle([left, top, right, y1 - 1], fill=BAR)
    draw.text((6, y0 - 6), str(peak), fill=MUTED, font=small)
    draw.text((6, y1 - 12), "0", fill=MUTED, font=small)
    # x labels: the first, last and a few between (the start of their bin)
    ticks = sorted({0, len(bins.counts) - 1, *range(0, len(bins.counts), max(1, len(bins.counts) // 6))})
    last_right = -1
    for k in ticks:
        text = (
            str(bins.starts[k]) if bins.width == 1 else f"{bins.starts[k]}–{bins.starts[k] + bins.width - 1}"
        )
        cx = x0 + round((k + 0.5) * slot)
        w = int(draw.textlength(text, font=small))
        left = min(max(x0, cx - w // 2), x1 - w)
        if left <= last_right + 4:
            continue
        draw.text((left, y1 + 4), text, fill=MUTED, font=small)
        last_right = left + w
    axis = "frames per sample" + ("" if bins.width == 1 else f" (bins of {bins.width})")
    draw.text((x0, y1 + 18), axis, fill=MUTED, font=small)
    return img
