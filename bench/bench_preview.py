"""Seeing a store's frames: ``stage2 preview``'s page (length histogram and a contact sheet per
source, as PNG bytes) against what a user would otherwise script to look at the same trajectories.

* ``preview_page_vs_script_frames_to_png``: 192 image-like trajectories (T <= 32, 128x128) in 6
  sources; the page decodes 3 trajectories per source (18 of 192, never the whole store), draws
  them with their text and the histogram, and encodes one PNG. The baseline is the minimal script a
  user writes instead: for the same 18 trajectories, ``read_frames`` and each first / middle / last
  frame saved as its own PNG with Pillow (no layout, no text, no histogram). ``limit_s`` bounds the
  page's time itself (well under a second).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from PIL import Image

from bench.bench_store import INPUTS, PROFILE, make_upstream
from bench.run import best_alternating, entry
from stage2_data.preview import frame_indices, store_preview
from stage2_data.store import VinOfflineStoreReader, VinOfflineWriter

SOURCES = 6


def preview_page_vs_script_frames_to_png(workdir: Path) -> list[dict[str, Any]]:
    n = int(os.environ.get("BENCH_PREVIEW_TRAJ", "192"))
    samples, pairs, _ = make_upstream(workdir / "up", n, npy=False)
    samples = [dataclasses.replace(s, source=f"source_{i % SOURCES}") for i, s in enumerate(samples)]
    out = workdir / "store"
    VinOfflineWriter(out, profile=PROFILE, inputs=INPUTS, rows_per_shard=64).write(samples, pairs)
    reader = VinOfflineStoreReader(out)
    pngs: list[bytes] = []

    def ours() -> None:
        pngs.append(store_preview(reader).png())

    shown = [int(r["sample_index"]) for sh in store_preview(reader, n=3).sheets for r in sh.samples]
    out_dir = workdir / "frames"
    out_dir.mkdir(exist_ok=True)

    def baseline() -> None:
        for i in shown:
            frames = reader.read_frames(i)
            for k in frame_indices(len(frames)):
                Image.fromarray(frames[k]).save(out_dir / f"{i}_{k}.png")

    ours()  # warm both (page cache, shard indexes, the font), then the best of 3 each
    baseline()
    best_ours, best_base = best_alternating(ours, baseline)
    assert len(set(pngs)) == 1  # the same store gives the same PNG bytes, every time
    page = store_preview(reader)
    reader.close()
    return [
        entry(
            "preview_page_vs_script_frames_to_png",
            best_ours,
            "a script: read_frames of the same 18 trajectories, first / middle / last frame each saved "
            "as a PNG with Pillow",
            best_base,
            5.0,
            limit_s=1.0,
            samples=n,
            decoded=sum(len(s.samples) for s in page.sheets),
            png_bytes=len(pngs[0]),
            page_px=f"{page.image.width}x{page.image.height}",
        )
    ]


BENCHMARKS = [preview_page_vs_script_frames_to_png]
