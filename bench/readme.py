"""Write the benchmark page's table and plot from bench/results.json.

``python -m bench.readme`` (run by ``make bench``) replaces the block between
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` of docs/benchmarks.md with
:func:`bench.run.render_table` and writes docs/assets/bench/ratios.svg (:func:`render_svg`): each
benchmark with a target, its ratio (ours / baseline) against that target on a log scale.
tests/test_docs.py checks that both match results.json. The SVG is written by hand (no plotting
library is a dependency): the same results always give the same bytes.
"""

from __future__ import annotations

import json
import math
import re
from html import escape
from pathlib import Path
from typing import Any

from bench.run import render_table

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results.json"
PAGE = REPO / "docs" / "benchmarks.md"
PLOT = REPO / "docs" / "assets" / "bench" / "ratios.svg"
BLOCK = re.compile(r"<!-- bench:begin -->\n.*?<!-- bench:end -->", re.S)

# The plot's geometry (pixels) and its log-scale domain (ratios outside it sit at its edge).
LABEL_W, PLOT_W, VALUE_W = 330, 360, 160
ROW_H, TOP, BOTTOM = 22, 46, 40
LOG_MIN, LOG_MAX = -3, 1  # 0.001 .. 10
MET, MISSED, TARGET, GRID, TEXT = "#2e7d32", "#c62828", "#1a237e", "#d0d0d0", "#222222"


def page_block(doc: dict[str, Any]) -> str:
    """The block of docs/benchmarks.md (markers included) for results ``doc``."""
    return f"<!-- bench:begin -->\n{render_table(doc)}\n<!-- bench:end -->"


def _x(ratio: float) -> float:
    """The x of ``ratio`` on the plot's log axis, clamped to the domain."""
    exp = math.log10(ratio) if ratio > 0 else LOG_MIN
    exp = min(max(exp, LOG_MIN), LOG_MAX)
    return LABEL_W + (exp - LOG_MIN) / (LOG_MAX - LOG_MIN) * PLOT_W


def render_svg(doc: dict[str, Any]) -> str:
    """The plot: one row per benchmark that has a ratio target, its ratio as a dot (green when met,
    red when not) on a bar from the axis, the target as a dark tick, on a log scale."""
    rows = [r for r in doc["results"] if r.get("target") is not None]
    width = LABEL_W + PLOT_W + VALUE_W
    height = TOP + len(rows) * ROW_H + BOTTOM
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="8" y="18" font-size="14" font-weight="bold" fill="{TEXT}">'
        "Benchmark ratios (ours / baseline) against their targets, log scale</text>",
        f'<text x="8" y="36" fill="{TEXT}">dot: the ratio measured (green: target met, red: missed); '
        "tick: the target; lower is better</text>",
    ]
    plot_bottom = TOP + len(rows) * ROW_H
    for exp in range(LOG_MIN, LOG_MAX + 1):
        x = _x(10.0**exp)
        label = f"{10.0**exp:g}"
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 4}" x2="{x:.1f}" y2="{plot_bottom}" stroke="{GRID}"/>')
        out.append(
            f'<text x="{x:.1f}" y="{plot_bottom + 16}" text-anchor="middle" fill="{TEXT}">{label}</text>'
        )
    out.append(
        f'<text x="{LABEL_W + PLOT_W / 2:.1f}" y="{plot_bottom + 32}" text-anchor="middle" '
        f'fill="{TEXT}">ratio (ours / baseline)</text>'
    )
    for i, r in enumerate(rows):
        y = TOP + i * ROW_H + ROW_H / 2
        ratio, target = float(r["ratio"]), float(r["target"])
        met = bool(r.get("meets_target"))
        colour = MET if met else MISSED
        x0, xr, xt = _x(10.0**LOG_MIN), _x(ratio), _x(target)
        name = escape(str(r["name"]))
        out += [
            f'<text x="{LABEL_W - 8}" y="{y + 4:.1f}" text-anchor="end" fill="{TEXT}">{name}</text>',
            f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{xr:.1f}" y2="{y:.1f}" stroke="{colour}" '
            'stroke-width="3" stroke-opacity="0.35"/>',
            f'<line x1="{xt:.1f}" y1="{y - 8:.1f}" x2="{xt:.1f}" y2="{y + 8:.1f}" stroke="{TARGET}" '
            'stroke-width="3"/>',
            f'<circle cx="{xr:.1f}" cy="{y:.1f}" r="5" fill="{colour}"/>',
            f'<text x="{LABEL_W + PLOT_W + 10}" y="{y + 4:.1f}" fill="{colour}">'
            f"{ratio:g} (≤ {target:g}){'' if met else ' missed'}</text>",
        ]
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    doc = json.loads(RESULTS.read_text())
    PAGE.write_text(BLOCK.sub(lambda _: page_block(doc), PAGE.read_text(), count=1))
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    PLOT.write_text(render_svg(doc))


if __name__ == "__main__":
    main()
