"""One shard of a store built: its rows decoded from their input files one at a time, each into a
padded row buffer its thread reuses, hashed and compressed straight away, while the Zarr group of
the shard is written; then every file hashed. What the writer runs per shard, on its own threads
(:func:`write_shard`) or in a worker process (:func:`build_shard`).

A shard's frames are never all in memory: a few rows are (one per thread, and the compressed rows
waiting to be written in order). Materialising whole shards would make every build touch (and the
kernel zero) two shards' worth of fresh memory: a visible share of the store step's CPU, and more
where first-touched memory is slow (a VM whose host reclaims free pages).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
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
from .shard_io import Rows, write_shard_group


def load_row(
    r: Row, frames: np.ndarray[Any, Any], actions: np.ndarray[Any, Any] | None
) -> tuple[str | None, list[str]]:
    """Decode one row into ``frames`` (its padded ``(Tmax, H, W, 3)`` row: the frames, then zeros)
    and ``actions`` (its ``(Tmax, Wmax)`` row, NaN already, or None); its ``frames_sha256``, or None
    and the problems found."""
    problems: list[str] = []
    fp = Path(r.spec.frames_path)
    try:
        if fp.suffix == ".npy":  # already decoded: a plain copy from the page cache
            f = np.load(fp, mmap_mode="r", allow_pickle=False)
            shape_arr = np.array(f.shape, dtype=np.int64)
            nf_arr = np.array(f.shape[0] if f.ndim else 0, dtype=np.int64)
        else:  # one read, each member inflated once (cheaper than numpy's np.load: docs/benchmarks.md)
            z = load_npz(fp, ("frames", "shape", "num_frames"), sha256=r.spec.frames_file_sha256)
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
    frames[: r.num_frames] = f
    frames[r.num_frames :] = 0  # (a reused buffer holds an earlier row past this one's length)
    digest = frames_sha256(frames[: r.num_frames])
    if actions is not None and r.action_width > 0 and r.spec.sidecar_path is not None:
        sp = Path(r.spec.sidecar_path)
        try:
            a = load_npz(sp, ("aligned_actions",), sha256=r.spec.sidecar_file_sha256)["aligned_actions"]
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
        actions[: r.num_frames, :w] = a32
    return digest, []


def write_shard(
    staging: Path, plan: ShardPlan, pool: ThreadPoolExecutor | None, workers: int
) -> tuple[dict[str, Any], list[str]]:
    """Write one shard as a Zarr group, its rows decoded as they are compressed (:class:`~.shard_io.Rows`,
    on ``pool``); its manifest entry (files listed with bytes and sha256) and its rows' frame
    digests. A row that cannot be decoded refuses the shard (StoreInputError naming every such row of
    it) once the others are done; what was written of it is left to the caller's staging clean-up."""
    rr = len(plan.rows)
    tmax = plan.tmax
    h, w = plan.hw
    wmax = plan.wmax
    row_shape = (1, tmax, h, w, 3)
    actions = np.full((rr, tmax, wmax), np.nan, dtype=np.float32) if wmax > 0 else None
    digests: list[str] = [""] * rr
    problems: list[list[str]] = [[] for _ in range(rr)]
    local = threading.local()

    def row(j: int) -> np.ndarray[Any, Any] | None:
        buf = getattr(local, "buf", None)
        if buf is None or buf.shape != row_shape:
            buf = local.buf = np.empty(row_shape, dtype=np.uint8)
        digest, probs = load_row(plan.rows[j], buf[0], None if actions is None else actions[j])
        if digest is None:
            problems[j] = probs
            return None
        digests[j] = digest
        return buf

    num_frames = np.array([r.num_frames for r in plan.rows], dtype=np.int32)
    widths = np.array([r.action_width for r in plan.rows], dtype=np.int16)
    rel_dir = shard_dir_name(plan.shard_id)
    default_blosc_split_mode()
    frames = Rows((rr, *row_shape[1:]), np.dtype(np.uint8), row)
    arrays, hashes = write_shard_group(staging / rel_dir, frames, num_frames, widths, actions, pool)
    found = [p for probs in problems for p in probs]
    if found:
        raise StoreInputError(
            "cannot build the VIN offline store", found, fix="correct the named inputs and build again"
        )
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
    return entry, digests


_POOL: ThreadPoolExecutor | None = None  # a worker process's threads, made on its first shard


def build_shard(staging: Path, plan: ShardPlan, workers: int) -> tuple[dict[str, Any], list[str]]:
    """One shard written in a worker process (its rows on ``workers`` threads of its own): the
    shard's manifest entry and its rows' frame digests."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="store-shard")
    return write_shard(staging, plan, _POOL, workers)
