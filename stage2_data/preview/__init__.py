"""Seeing a store's frames: a contact sheet per source (first / middle / last frame of a few
trajectories, with task text and quality label), the length histogram, the page ``stage2 preview``
writes, and the same images as the ``vin_store`` asset's metadata. Pillow only; no Dagster.

Cheap (only the trajectories shown are decoded), deterministic (the same store gives the same PNG
bytes) and faithful (frames are never flipped or recoloured; small frames are enlarged pixel for
pixel).
"""

from __future__ import annotations

from ._draw import png_bytes
from .histogram import Bins, length_bins, length_histogram
from .page import Preview, default_out, resolve_out, store_preview, write_png
from .report import markdown_image, open_markdown, open_snippet, preview_metadata
from .sheet import (
    DEFAULT_N,
    MAX_N,
    Cell,
    Sheet,
    contact_sheet,
    frame_indices,
    known_sources,
    pick_samples,
)

__all__ = [
    "DEFAULT_N",
    "MAX_N",
    "Bins",
    "Cell",
    "Preview",
    "Sheet",
    "contact_sheet",
    "default_out",
    "frame_indices",
    "known_sources",
    "length_bins",
    "length_histogram",
    "markdown_image",
    "open_markdown",
    "open_snippet",
    "pick_samples",
    "png_bytes",
    "preview_metadata",
    "resolve_out",
    "store_preview",
    "write_png",
]
