"""The bytes of the demo's files: frames and sidecar ``.npz``, ``processed_dataset`` Arrow streams, JSON.

Pixel noise and action values come from ``hashlib.shake_128`` seeded by the trajectory id, so each
file depends only on its own trajectory.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..formats.npz import npz_bytes
from ..layout import frames_relpath
from .plan import ActionRow, Traj
from .spec import ACTION_SOURCES, GENERATOR_VERSION, CacheKeySpec

HF_FEATURES: dict[str, Any] = {
    "id": {"dtype": "string", "_type": "Value"},
    "task": {"dtype": "string", "_type": "Value"},
    "data_source": {"dtype": "string", "_type": "Value"},
    "frames": {"dtype": "string", "_type": "Value"},
    "is_robot": {"dtype": "bool", "_type": "Value"},
    "quality_label": {"dtype": "string", "_type": "Value"},
    "partial_success": {"dtype": "float32", "_type": "Value"},
    "num_frames": {"dtype": "int64", "_type": "Value"},
}
ARROW_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("task", pa.string()),
        pa.field("data_source", pa.string()),
        pa.field("frames", pa.string()),
        pa.field("is_robot", pa.bool_()),
        pa.field("quality_label", pa.string()),
        pa.field("partial_success", pa.float32()),
        pa.field("num_frames", pa.int64()),
    ],
    metadata={"huggingface": json.dumps({"info": {"features": HF_FEATURES}}, sort_keys=True)},
)
ARROW_BATCH_ROWS = 1000


def json_bytes(obj: Any) -> bytes:
    """A JSON file as the upstream cache writes it: indented, sorted keys, one final newline."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


# ---- frames ------------------------------------------------------------------------------------
def _frames_array(tid: str, t: int, h: int, w: int) -> np.ndarray:
    seed = hashlib.sha256(tid.encode()).digest()
    y = np.arange(h, dtype=np.int32)[:, None, None]
    x = np.arange(w, dtype=np.int32)[None, :, None]
    c = np.arange(3, dtype=np.int32)[None, None, :]
    base = (x * (160 // max(w, 1)) + y * (120 // max(h, 1)) + c * 60 + seed[0]).astype(np.int32)
    shift = (np.arange(t, dtype=np.int32) * (seed[1] % 7 + 1))[:, None, None, None]
    noise_u8 = np.frombuffer(hashlib.shake_128(seed).digest(t * h * w * 3), dtype=np.uint8)
    noise = (noise_u8 & 3).astype(np.int32).reshape(t, h, w, 3)
    return ((base[None] + shift + noise) % 256).astype(np.uint8)


def frame_npz_bytes(tid: str, t: int, h: int, w: int) -> bytes:
    """One ``frames/trajectory_<id>.npz``: ``t`` RGB frames of ``h`` x ``w`` pixels."""
    frames = _frames_array(tid, t, h, w)
    return npz_bytes(
        [
            ("frames", frames),
            ("shape", np.asarray(frames.shape, dtype=np.int64)),
            ("num_frames", np.asarray(t, dtype=np.int64)),
        ]
    )


# ---- sidecars ----------------------------------------------------------------------------------
def sidecar_npz_bytes(row: ActionRow, full: bool) -> bytes:
    """The action sidecar of one recovered action-manifest row."""
    src = ACTION_SOURCES[row.source]
    t = row.traj.num_frames
    seed = hashlib.sha256(f"sidecar/{row.traj.id}".encode()).digest()
    extra = seed[0] % (2 if full else t + 4)
    n = t + extra
    w = src.raw_width
    raw_u8 = np.frombuffer(hashlib.shake_128(seed).digest(n * w), dtype=np.uint8).reshape(n, w)
    raw = ((raw_u8.astype(np.float32) - 127.5) / 255.0).astype(np.float32)
    if src.name == "racer":
        q = raw[:, 3:7] + np.float32(0.01)
        raw[:, 3:7] = q / np.linalg.norm(q, axis=1, keepdims=True)
        raw[:, 7] = (raw_u8[:, 7] > 127).astype(np.float32)
        raw[:, 8] = (raw_u8[:, 8] > 200).astype(np.float32)
    else:
        raw[:, -1] = (raw_u8[:, -1] > 127).astype(np.float32)
    start = int.from_bytes(seed[2:4], "big") % 500
    source_indices = np.arange(start, start + n, dtype=np.int64)
    alignment = np.round(np.linspace(0, n - 1, t)).astype(np.int64) if t > 1 else np.zeros(1, np.int64)
    aligned = raw[alignment].astype(np.float32)
    meta = {
        "source": src.name,
        "cache_key": row.traj.cache_key,
        "stage2_trajectory_id": row.traj.id,
        "action_names": list(src.action_names) if src.action_names else None,
        "action_convention": src.convention,
        "raw_width": w,
        "num_raw_steps": n,
        "num_aligned_frames": t,
        "alignment": {
            "method": "nearest_timestamp",
            "notes": "aligned_actions[i] = raw_actions[alignment_indices[i]]; one row per kept frame; "
            "source_indices are the step indices in the upstream episode",
        },
        "generator": f"stage2_data.demo v{GENERATOR_VERSION}",
    }
    return npz_bytes(
        [
            ("metadata_json", np.array(json.dumps(meta, sort_keys=True))),
            ("raw_actions", raw),
            ("aligned_actions", aligned),
            ("source_indices", source_indices),
            ("alignment_indices", alignment),
        ]
    )


# ---- processed_dataset -------------------------------------------------------------------------
def arrow_bytes(spec: CacheKeySpec, rows: Sequence[Traj]) -> bytes:
    """One ``processed_dataset`` Arrow stream file holding ``rows`` (batches of ``ARROW_BATCH_ROWS``)."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, ARROW_SCHEMA) as writer:
        for i in range(0, len(rows), ARROW_BATCH_ROWS):
            chunk = rows[i : i + ARROW_BATCH_ROWS]
            batch = pa.record_batch(
                [
                    pa.array([t.id for t in chunk], pa.string()),
                    pa.array([t.task for t in chunk], pa.string()),
                    pa.array([spec.data_source] * len(chunk), pa.string()),
                    pa.array([frames_relpath(spec.cache_key, t.id) for t in chunk], pa.string()),
                    pa.array([t.is_robot for t in chunk], pa.bool_()),
                    pa.array([t.quality for t in chunk], pa.string()),
                    pa.array([t.partial for t in chunk], pa.float32()),
                    pa.array([t.num_frames for t in chunk], pa.int64()),
                ],
                schema=ARROW_SCHEMA,
            )
            writer.write_batch(batch)
    return sink.getvalue()
