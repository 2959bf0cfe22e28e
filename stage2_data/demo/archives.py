"""The demo's archives: which members go into each cache directory's tar and into the sidecar tar.

Each builder writes one tar (the RoboArena cache key's is cut in two parts) and returns the sha256
of the ``.npz`` members it wrote, which the kit's checksums and manifests are made from.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..hashing import sha256_bytes
from ..layout import PROCESSED_DIR, SIDECARS_DIR, frames_relpath, sidecar_relpath
from .content import HF_FEATURES, arrow_bytes, frame_npz_bytes, json_bytes, sidecar_npz_bytes
from .plan import ActionRow, Traj
from .spec import CACHE_TIMESTAMP, SPLIT_CACHE_KEY, SPLIT_PARTS, STATUS_RECOVERED, CacheKeySpec
from .tars import Producer, dir_entries, split_tar, write_tar


def _const(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def _cache_dir_entries(
    spec: CacheKeySpec, rows: Sequence[Traj], full: bool, frame_digests: dict[str, str]
) -> list[tuple[str, Producer]]:
    """Every member of one cache directory's tar; frame digests are recorded as they are produced."""
    top = f"{PROCESSED_DIR}/{spec.cache_key}" if spec.prefixed else spec.cache_key
    h, w = spec.res_full if full else spec.res_small
    entries: list[tuple[str, Producer]] = dir_entries(top)
    entries += [(f"{top}/frames", None), (f"{top}/processed_dataset", None)]
    info = {
        "dataset_path": spec.dataset_path,
        "subset": spec.subset,
        "total_trajectories": len(rows),
        "cache_timestamp": CACHE_TIMESTAMP,
        "config_hash": hashlib.sha256(f"{spec.dataset_path}/{spec.subset}".encode()).hexdigest()[:16],
    }
    entries.append((f"{top}/dataset_info.json", _const(json_bytes(info))))
    by_quality: dict[str, list[int]] = defaultdict(list)
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(rows):
        by_quality[t.quality].append(i)
        by_task[t.task].append(i)
    mappings = {
        "robot_trajectories": [i for i, t in enumerate(rows) if t.is_robot],
        "human_trajectories": [i for i, t in enumerate(rows) if not t.is_robot],
        "quality_indices": {k: v for k, v in sorted(by_quality.items())},
        "task_indices": {k: v for k, v in sorted(by_task.items())},
        "source_indices": {spec.data_source: list(range(len(rows)))},
    }
    entries.append((f"{top}/index_mappings.json", _const(json_bytes(mappings))))
    shards = max(1, min(spec.shards, len(rows)))
    bounds = [len(rows) * s // shards for s in range(shards + 1)]
    files: list[dict[str, str]] = []

    def arrow_producer(part: Sequence[Traj]) -> Callable[[], bytes]:
        return lambda: arrow_bytes(spec, part)

    for s in range(shards):
        fname = f"data-{s:05d}-of-{shards:05d}.arrow"
        files.append({"filename": fname})
        entries.append((f"{top}/processed_dataset/{fname}", arrow_producer(rows[bounds[s] : bounds[s + 1]])))
    hf_info = {"citation": "", "description": "", "features": HF_FEATURES, "homepage": "", "license": ""}
    entries.append((f"{top}/processed_dataset/dataset_info.json", _const(json_bytes(hf_info))))
    state: dict[str, Any] = {
        "_data_files": files,
        "_fingerprint": hashlib.sha256(("|".join(t.id for t in rows)).encode()).hexdigest()[:16],
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    entries.append((f"{top}/processed_dataset/state.json", _const(json_bytes(state))))

    def frame_producer(t: Traj) -> Callable[[], bytes]:
        def produce() -> bytes:
            data = frame_npz_bytes(t.id, t.num_frames, h, w)
            frame_digests[frames_relpath(spec.cache_key, t.id)] = sha256_bytes(data)
            return data

        return produce

    for t in rows:
        entries.append((f"{top}/frames/trajectory_{t.id}.npz", frame_producer(t)))
    return entries


def build_cache_tar(spec: CacheKeySpec, rows: list[Traj], full: bool, path: Path) -> dict[str, str]:
    """Write one cache directory's tar (split in parts for the RoboArena key); returns frame digests."""
    digests: dict[str, str] = {}
    entries = _cache_dir_entries(spec, rows, full, digests)
    if spec.cache_key == SPLIT_CACHE_KEY:
        whole = path.with_name(f".{path.name}.whole")
        write_tar(whole, entries)
        split_tar(whole, path.parent, path.name, SPLIT_PARTS)
    else:
        write_tar(path, entries)
    return digests


def build_sidecar_tar(action_rows: dict[str, list[ActionRow]], full: bool, path: Path) -> dict[str, str]:
    """Write the kit's sidecar tar; returns {sidecar_path: sha256}."""
    digests: dict[str, str] = {}
    entries: list[tuple[str, Producer]] = [(SIDECARS_DIR, None)]

    def producer(r: ActionRow, rel: str) -> Callable[[], bytes]:
        def produce() -> bytes:
            data = sidecar_npz_bytes(r, full)
            digests[rel] = sha256_bytes(data)
            return data

        return produce

    for src, rows in action_rows.items():
        entries.append((f"{SIDECARS_DIR}/{src}", None))
        for r in rows:
            if r.status == STATUS_RECOVERED:
                rel = sidecar_relpath(src, r.traj.id)
                entries.append((rel, producer(r, rel)))
    write_tar(path, entries)
    return digests
