"""The store's preview as materialization metadata people read (the ``vin_store`` asset shows it):
the contact sheets and the length histogram as Markdown images (``data:image/png;base64``), and
where the store is published with the three lines of Python that open it.

Dagster-free: the values are ``{"__markdown__": text}``, which the asset layer turns into Markdown
metadata. Bounded: at most :data:`UI_MAX_SOURCES` sheets of :data:`UI_N` trajectories each,
and :data:`UI_MAX_CHARS` of images (the sources left out are named).
"""

from __future__ import annotations

import base64
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..fsutil import python_str
from ._draw import png_bytes
from .histogram import length_histogram
from .sheet import contact_sheet, known_sources

UI_N = 3  # trajectories per source on the asset's page
PREVIEW_THREADS = min(4, os.cpu_count() or 1)
UI_THUMB_HEIGHT = 64
UI_MAX_SOURCES = 16  # more sources are named, and `stage2 preview --source S` draws any of them
#: the most characters of images in ``contact_sheets`` (base64: 3/4 of it is PNG bytes). The UI
#: loads them with the asset's page, and every materialization keeps them in the event log.
UI_MAX_CHARS = 1_200_000


def markdown_image(png: bytes, alt: str) -> str:
    """A Markdown image embedding ``png``: ``![alt](data:image/png;base64,...)``."""
    alt = alt.replace("[", "(").replace("]", ")")
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"


def open_snippet(published: str, storage_options: bool = False) -> str:
    """The three lines of Python that open the store published at ``published`` (the core install
    is enough); the path is a string literal that runs whatever its characters."""
    opts = ", storage_options={...}" if storage_options else ""
    return (
        "from stage2_data.store import VinOfflineDataset\n"
        f'ds = VinOfflineDataset({python_str(published)}, split="train"{opts})\n'
        "sample = ds[0]  # frames uint8 (T, H, W, 3), actions, task, quality_label, source, ..."
    )


def open_markdown(published: str, store: str, storage_options: bool = False) -> str:
    """Where the store is published (and the folder that is now), how to open it, how to look at it;
    short enough for the UI to show it inline (it folds Markdown of 1000 characters or more)."""
    now = store.rstrip("/").rsplit("/", 1)[-1]
    return (
        f"**Published at** `{published}` (now `{now}`). Open it in Python (no Dagster needed):\n\n"
        f"```python\n{open_snippet(published, storage_options)}\n```\n\n"
        f"See its frames: `stage2 preview {published}`"
    )


def preview_metadata(
    reader: Any, *, n: int = UI_N, max_sources: int = UI_MAX_SOURCES, max_chars: int = UI_MAX_CHARS
) -> dict[str, Any]:
    """``contact_sheets`` (one image per source, in source order, at most ``max_sources`` and
    ``max_chars`` of images; the sources left out are named) and ``length_histogram`` of the store
    ``reader`` reads, as Markdown metadata values."""
    rows = reader.sample_index
    sources = known_sources(rows)

    def sheet_image(s: str) -> str:
        sheet = contact_sheet(reader, s, n, thumb_height=UI_THUMB_HEIGHT)
        return markdown_image(png_bytes(sheet.image), f"contact sheet of {s}")

    # Drawn on a few threads (decoding, resizing and PNG encoding release the interpreter lock, and
    # the sheets are on the store step's critical path), and
    # taken in source order until the budget is spent, so the result is the sequential one.
    parts: list[str] = []
    used = 0
    with ThreadPoolExecutor(max_workers=PREVIEW_THREADS, thread_name_prefix="stage2-preview") as pool:
        hist = pool.submit(lambda: length_histogram([int(r["num_frames"]) for r in rows]))
        drawn = [pool.submit(sheet_image, s) for s in sources[:max_sources]]
        for i, f in enumerate(drawn):
            image = f.result()
            if parts and used + len(image) > max_chars:
                for later in drawn[i:]:
                    later.cancel()
                break
            parts.append(image)
            used += len(image)
        hist_png = png_bytes(hist.result())
    if len(parts) < len(sources):
        rest = sources[len(parts) :]
        parts.append(
            f"…and {len(rest)} more source(s) ({', '.join(rest)}): see them with "
            "`stage2 preview STORE --source S`"
        )
    return {
        "length_histogram": {"__markdown__": markdown_image(hist_png, "frames per sample")},
        "contact_sheets": {"__markdown__": "\n\n".join(parts) or "(the store has no samples)"},
    }
