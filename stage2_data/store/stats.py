"""What a store holds, counted: the manifest's ``stats`` record (written with the store) and
:func:`collect_vin_offline_dataset_stats` (counts and bytes per block, from the manifest and the disk).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..storage import StoreLocation
from .format import (
    BLOCK_ACTIONS,
    BLOCK_FRAMES,
    BLOCK_NAMES,
    BLOCK_NUM_FRAMES,
    BLOCK_WIDTH,
    MANIFEST_NAME,
    SPLIT_NAMES,
    block_of,
)
from .reader import VinOfflineStoreReader


def _per_split(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    return {sp: sum(1 for r in rows if r["split"] == sp) for sp in SPLIT_NAMES}


def _with_actions(rows: Sequence[dict[str, Any]]) -> int:
    return sum(1 for r in rows if int(r["action_width"]) > 0)


def _resolutions(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    return dict(sorted(Counter(f"{r['frame_height']}x{r['frame_width']}" for r in rows).items()))


def _frames_per_sample(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    nfs = [int(r["num_frames"]) for r in rows]
    return {
        "min": min(nfs) if nfs else 0,
        "mean": (sum(nfs) / len(nfs)) if nfs else 0.0,
        "max": max(nfs) if nfs else 0,
        "total": sum(nfs),
    }


def manifest_stats(
    index_rows: Sequence[dict[str, Any]],
    pairs_rows: Sequence[dict[str, Any]],
    shards: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """``manifest["stats"]``: counts, frames per sample, resolutions, and bytes per block (payload,
    stored with padding, compressed) from the sample index and the shard entries."""
    payload = dict.fromkeys(BLOCK_NAMES, 0)
    stored = dict.fromkeys(BLOCK_NAMES, 0)
    compressed = dict.fromkeys([*BLOCK_NAMES, "group_metadata"], 0)
    for r in index_rows:
        t = int(r["num_frames"])
        payload[BLOCK_FRAMES] += t * int(r["frame_height"]) * int(r["frame_width"]) * 3
        payload[BLOCK_ACTIONS] += t * int(r["action_width"]) * 4
    payload[BLOCK_NUM_FRAMES] = 4 * len(index_rows)
    payload[BLOCK_WIDTH] = 2 * len(index_rows)
    for sh in shards:
        rr = int(sh["num_rows"])
        tmax, h, w, c = (int(x) for x in sh["frame_shape"])
        stored[BLOCK_FRAMES] += rr * tmax * h * w * c
        stored[BLOCK_NUM_FRAMES] += 4 * rr
        stored[BLOCK_WIDTH] += 2 * rr
        stored[BLOCK_ACTIONS] += rr * tmax * int(sh["action_width_max"]) * 4
        for f in sh["files"]:
            compressed[block_of(Path(f["path"]).parts[2:])] += int(f["bytes"])
    for d in (payload, stored, compressed):
        d["total"] = sum(d.values())
    fps = _frames_per_sample(index_rows)
    return {
        "samples": len(index_rows),
        "pairs": len(pairs_rows),
        "shards": len(shards),
        "per_split": _per_split(index_rows),
        "pairs_per_split": {sp: sum(1 for p in pairs_rows if p["split"] == sp) for sp in SPLIT_NAMES},
        "per_source": dict(sorted(Counter(str(r["source"]) for r in index_rows).items())),
        "with_actions": _with_actions(index_rows),
        "frames_per_sample": {**fps, "mean": round(fps["mean"], 6)},
        "resolutions": _resolutions(index_rows),
        "payload_bytes": payload,
        "stored_bytes_uncompressed": stored,
        "compressed_bytes": compressed,
    }


def collect_vin_offline_dataset_stats(
    path: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Counts per split and source, pairs, samples with actions, frames per sample, and bytes per
    block: uncompressed (from the manifest: payload and stored with padding) and on disk (stat)."""
    reader = VinOfflineStoreReader(path, storage_options)
    loc = reader.location
    rows = reader.sample_index
    m = reader.manifest
    on_disk = dict.fromkeys([*BLOCK_NAMES, "group_metadata"], 0)
    for sh in m["shards"]:
        for f in sh["files"]:
            p = reader.path / f["path"]
            with contextlib.suppress(FileNotFoundError):
                on_disk[block_of(Path(f["path"]).parts[2:])] += loc.size(p)
    meta_bytes = 0
    for rel in [f["path"] for f in m.get("files", [])] + [MANIFEST_NAME]:
        with contextlib.suppress(FileNotFoundError):
            meta_bytes += loc.size(reader.path / rel)
    on_disk["metadata_files"] = meta_bytes
    on_disk["total"] = sum(on_disk.values())
    per_split_source: dict[str, dict[str, int]] = {sp: {} for sp in SPLIT_NAMES}
    for r in rows:
        d = per_split_source.setdefault(r["split"], {})
        d[r["source"]] = d.get(r["source"], 0) + 1
    stats = m.get("stats", {})
    return {
        "path": loc.url,
        "format": m["format"],
        "version": m["version"],
        "fingerprint": m.get("fingerprint"),
        "profile": m.get("profile"),
        "samples": len(rows),
        "shards": len(m["shards"]),
        "pairs": len(reader.pairs()),
        "pairs_per_split": dict(Counter(p["split"] for p in reader.pairs())),
        "per_split": _per_split(rows),
        "per_source": dict(sorted(Counter(r["source"] for r in rows).items())),
        "per_split_source": {k: dict(sorted(v.items())) for k, v in per_split_source.items()},
        "with_actions": _with_actions(rows),
        "action_widths": {
            str(k): v for k, v in sorted(Counter(int(r["action_width"]) for r in rows).items())
        },
        "resolutions": _resolutions(rows),
        "frames_per_sample": {k: v for k, v in _frames_per_sample(rows).items() if k != "total"},
        "bytes": {
            "payload_uncompressed": stats.get("payload_bytes"),
            "stored_uncompressed": stats.get("stored_bytes_uncompressed"),
            "compressed_in_manifest": stats.get("compressed_bytes"),
            "on_disk": on_disk,
        },
    }
