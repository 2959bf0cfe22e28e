"""One shard of a store built: its rows loaded from their input files into padded arrays, then its
Zarr group written and every file hashed. What the writer runs per shard, on its own threads
(:func:`load_shard`, :func:`write_shard`) or in a worker process (:func:`build_shard`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from ..formats.npz import load_npz
from ..hashing import sha256_files_parallel
from ..storage import StoreLocation
from .determinism import canonical_zarr_json, default_blosc_split_mode
from .format import StoreInputError, frames_sha256, shard_dir_name
from .inputs import check_actions_meta, check_frames_meta
from .plan import Row, ShardPlan
from .shard_io import write_shard_group


@dataclass
class LoadedShard:
    frames: np.ndarray[Any, Any]
    actions: np.ndarray[Any, Any] | None
    digests: list[str]


def load_row(
    r: Row, j: int, frames: np.ndarray[Any, Any], actions: np.ndarray[Any, Any] | None
) -> tuple[str | None, list[str]]:
    problems: list[str] = []
    fp = Path(r.spec.frames_path)
    try:
        if fp.suffix == ".npy":  # already decoded: a plain copy from the page cache
            f = np.load(fp, mmap_mode="r", allow_pickle=False)
            shape_arr = np.array(f.shape, dtype=np.int64)
            nf_arr = np.array(f.shape[0] if f.ndim else 0, dtype=np.int64)
        else:  # one read, each member inflated once (numpy's np.load: ~5x the time per file)
            z = load_npz(fp, ("frames", "shape", "num_frames"))
            f, shape_arr, nf_arr = z["frames"], z["shape"], z["num_frames"]
    except (OSError, ValueError, EOFError) as e:  # load_npz: FormatError (a ValueError) or OSError
        return None, [
            f"{fp}: unreadable frames npz ({type(e).__name__}: {e}); object/pickled arrays are not allowed"
        ]
    info = check_frames_meta(fp, tuple(f.shape), f.dtype, shape_arr, nf_arr, problems)
    if info is None:
        return None, problems
    if (info.num_frames, info.height, info.width) != (r.num_frames, r.height, r.width):
        return None, [f"{fp}: changed while the store was being built (shape {f.shape})"]
    frames[j, : r.num_frames] = f
    digest = frames_sha256(frames[j, : r.num_frames])
    if actions is not None and r.action_width > 0 and r.spec.sidecar_path is not None:
        sp = Path(r.spec.sidecar_path)
        try:
            a = load_npz(sp, ("aligned_actions",))["aligned_actions"]
        except (OSError, ValueError) as e:
            return None, [f"{sp}: unreadable sidecar npz ({type(e).__name__}: {e})"]
        w = check_actions_meta(sp, tuple(a.shape), a.dtype, r.num_frames, problems)
        if w is None:
            return None, problems
        if w != r.action_width:
            return None, [f"{sp}: changed while the store was being built (width {w})"]
        with np.errstate(over="ignore"):  # beyond float32: inf, refused next
            a32 = a.astype(np.float32)
        bad = np.argwhere(~np.isfinite(a32))
        if bad.size:
            t0, c0 = (int(x) for x in bad[0])
            return None, [
                f"{sp}: trajectory {r.spec.sample_key}: aligned_actions holds {len(bad)} non-finite "
                f"value(s) (NaN or inf, or beyond float32; first at row {t0}, column {c0}): actions "
                "must be finite numbers (repair the sidecar, or mark the row as not recovered)"
            ]
        actions[j, : r.num_frames, :w] = a32
    return digest, []


def load_shard(plan: ShardPlan, pool: ThreadPoolExecutor) -> LoadedShard:
    """Decode one shard's rows into its padded arrays (rows in parallel on ``pool``)."""
    rr = len(plan.rows)
    tmax = plan.tmax
    h, w = plan.hw
    wmax = plan.wmax
    frames = np.zeros((rr, tmax, h, w, 3), dtype=np.uint8)
    actions = np.full((rr, tmax, wmax), np.nan, dtype=np.float32) if wmax > 0 else None
    results = list(pool.map(load_row, plan.rows, range(rr), repeat(frames), repeat(actions)))
    problems = [p for _, probs in results for p in probs]
    if problems:
        raise StoreInputError(
            "cannot build the VIN offline store", problems, fix="correct the named inputs and build again"
        )
    return LoadedShard(frames, actions, [d or "" for d, _ in results])


def write_shard(
    staging: Path, plan: ShardPlan, loaded: LoadedShard, pool: ThreadPoolExecutor | None, workers: int
) -> dict[str, Any]:
    """Write one decoded shard as a Zarr group; its files listed with bytes and sha256."""
    frames, actions = loaded.frames, loaded.actions
    rr = len(plan.rows)
    tmax = plan.tmax
    h, w = plan.hw
    wmax = plan.wmax
    num_frames = np.array([r.num_frames for r in plan.rows], dtype=np.int32)
    widths = np.array([r.action_width for r in plan.rows], dtype=np.int16)
    rel_dir = shard_dir_name(plan.shard_id)
    default_blosc_split_mode()
    arrays, hashes = write_shard_group(staging / rel_dir, frames, num_frames, widths, actions, pool)
    rels = StoreLocation.parse(staging).tree_files(staging / rel_dir)
    rest = [staging / r for r in rels if str(staging / r) not in hashes]  # zarr.json and the like
    canonical_zarr_json(rest)
    hashes.update(sha256_files_parallel(rest, workers=workers))
    entry = {
        "id": plan.shard_id,
        "dir": rel_dir,
        "row_start": plan.row_start,
        "num_rows": rr,
        "frame_shape": [tmax, h, w, 3],
        "action_width_max": wmax,
        "arrays": arrays,
        "files": [
            {"path": r, "bytes": (staging / r).stat().st_size, "sha256": hashes[str(staging / r)]}
            for r in rels
        ],
    }
    return entry


_POOL: ThreadPoolExecutor | None = None  # a worker process's threads, made on its first shard


def build_shard(staging: Path, plan: ShardPlan, workers: int) -> tuple[dict[str, Any], list[str]]:
    """One shard loaded and written in a worker process (its rows and chunks on ``workers`` threads
    of its own): the shard's manifest entry and its rows' frame digests."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="store-shard")
    loaded = load_shard(plan, _POOL)
    return write_shard(staging, plan, loaded, _POOL, workers), loaded.digests
