"""The writer: build a store from samples and pairs, shard by shard, and publish it atomically.

Plan (:mod:`.plan`), then per shard: decode its rows (in parallel) into padded arrays, write its Zarr
group (:mod:`.shard_io`), hash its files; then the metadata files and the manifest (:mod:`.commit`),
then publication (:mod:`stage2_data.publish`, or manifest-last on object storage).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from ..formats.npz import load_npz
from ..hashing import SHA256_RE, sha256_files_parallel
from ..publish import make_staging_dir, publish_dir
from ..storage import StoreLocation
from .commit import finish_manifest
from .determinism import canonical_zarr_json, default_blosc_split_mode
from .format import (
    DEFAULT_MAX_FRAMES,
    MANIFEST_NAME,
    PairSpec,
    SampleSpec,
    StoreInputError,
    frames_sha256,
    shard_dir_name,
)
from .inputs import check_actions_meta, check_frames_meta
from .plan import Row, ShardPlan, check_free_space_for_store, plan_shards
from .shard_io import write_shard_group
from .target import check_out_dir, check_remote_out, remove_stale_temp_dirs


def _check_profile(profile: Any, problems: list[str]) -> None:
    if not isinstance(profile, dict):
        problems.append("profile must be a dict with name, repo_id, revision")
        return
    for k in ("name", "repo_id", "revision"):
        if not isinstance(profile.get(k), str) or not profile.get(k):
            problems.append(f"profile[{k!r}] must be a non-empty string")
    extra = sorted(set(profile) - {"name", "repo_id", "revision"})
    if extra:
        problems.append(f"profile has unknown keys {extra}; only name, repo_id, revision are recorded")


def _check_inputs(inputs: Any, problems: list[str]) -> None:
    if not isinstance(inputs, dict):
        problems.append("inputs must be a dict {name: sha256}")
        return
    for k, v in inputs.items():
        if not isinstance(k, str) or not k:
            problems.append(f"inputs: name {k!r} must be a non-empty string")
        elif k.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", k):
            problems.append(
                f"inputs: name {k!r} is an absolute path; use a relative name (fingerprints are portable)"
            )
        if not isinstance(v, str) or not SHA256_RE.match(v):
            problems.append(f"inputs[{k!r}]: {v!r} is not a 64-hex lowercase sha256")


@dataclass
class _LoadedShard:
    frames: np.ndarray[Any, Any]
    actions: np.ndarray[Any, Any] | None
    digests: list[str]


class VinOfflineWriter:
    """Build a store at ``out_dir`` from samples and pairs, shard by shard, publish atomically.

    ``progress`` is called after each shard with the number of rows that shard wrote. ``max_frames``
    is the frame bound (the profile's): a longer trajectory is refused before anything is decoded.
    ``profile_path`` and ``data_root`` (optional) are recorded under ``manifest["local"]`` for
    :func:`rebuild_command`; they never enter the fingerprint.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | StoreLocation,
        *,
        profile: dict[str, Any],
        inputs: dict[str, str],
        rows_per_shard: int = 64,
        include_actions: bool = True,
        max_frames: int = DEFAULT_MAX_FRAMES,
        progress: Callable[[int], None] | None = None,
        profile_path: Path | None = None,
        data_root: Path | None = None,
        kit_root: Path | None = None,
        workers: int | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        problems: list[str] = []
        if not isinstance(rows_per_shard, int) or isinstance(rows_per_shard, bool) or rows_per_shard <= 0:
            problems.append(f"rows_per_shard must be a positive integer, got {rows_per_shard!r}")
        if not isinstance(include_actions, bool):
            problems.append(f"include_actions must be a bool, got {include_actions!r}")
        if not isinstance(max_frames, int) or isinstance(max_frames, bool) or max_frames <= 0:
            problems.append(f"max_frames must be a positive integer, got {max_frames!r}")
        if progress is not None and not callable(progress):
            problems.append("progress must be callable or None")
        _check_profile(profile, problems)
        _check_inputs(inputs, problems)
        self.location = StoreLocation.parse(out_dir, storage_options)
        out = self.location.root
        if self.location.is_local:
            check_out_dir(out, problems)
        else:
            check_remote_out(self.location, problems)
        if problems:
            raise StoreInputError(
                f"cannot write a VIN offline store at {self.location.url}",
                problems,
                fix="correct the named writer arguments",
            )
        self.out_dir = out
        self.profile = {k: profile[k] for k in ("name", "repo_id", "revision")}
        self.inputs = dict(inputs)
        self.rows_per_shard = rows_per_shard
        self.include_actions = include_actions
        self.max_frames = max_frames
        self.progress = progress
        self.local = {
            "profile_path": str(Path(profile_path).absolute()) if profile_path is not None else None,
            "data_root": str(Path(data_root).absolute()) if data_root is not None else None,
        }
        if kit_root is not None:
            self.local["kit_root"] = str(Path(kit_root).absolute())
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self._encode_pool: ThreadPoolExecutor | None = None

    # -- loading one shard's rows -------------------------------------------------------------------
    @staticmethod
    def _load_row(
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
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, zlib.error) as e:
            # zlib.error: a deflate stream corrupt behind an intact zip directory
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
            except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, zlib.error) as e:
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

    def _load_shard(self, plan: ShardPlan, pool: ThreadPoolExecutor) -> _LoadedShard:
        """Decode one shard's rows into its padded arrays (rows in parallel on ``pool``)."""
        rr = len(plan.rows)
        tmax = plan.tmax
        h, w = plan.hw
        wmax = plan.wmax
        frames = np.zeros((rr, tmax, h, w, 3), dtype=np.uint8)
        actions = np.full((rr, tmax, wmax), np.nan, dtype=np.float32) if wmax > 0 else None
        results = list(pool.map(self._load_row, plan.rows, range(rr), repeat(frames), repeat(actions)))
        problems = [p for _, probs in results for p in probs]
        if problems:
            raise StoreInputError(
                "cannot build the VIN offline store", problems, fix="correct the named inputs and build again"
            )
        return _LoadedShard(frames, actions, [d or "" for d, _ in results])

    def _write_shard(self, staging: Path, plan: ShardPlan, loaded: _LoadedShard) -> dict[str, Any]:
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
        arrays, hashes = write_shard_group(
            staging / rel_dir, frames, num_frames, widths, actions, self._encode_pool
        )
        rels = StoreLocation.parse(staging).tree_files(staging / rel_dir)
        rest = [staging / r for r in rels if str(staging / r) not in hashes]  # zarr.json and the like
        canonical_zarr_json(rest)
        hashes.update(sha256_files_parallel(rest, workers=self.workers))
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

    def write(self, samples: Sequence[SampleSpec], pairs: Sequence[PairSpec]) -> dict[str, Any]:
        """Build and publish the store; returns its manifest."""
        shards, rows, kept_pairs = plan_shards(
            samples, pairs, self.include_actions, self.rows_per_shard, self.max_frames
        )
        payload = sum(
            r.num_frames * r.height * r.width * 3 + r.num_frames * r.action_width * 4 + 6 for r in rows
        )
        remote = not self.location.is_local
        if remote:
            # Object storage: shards are written to a local scratch folder one at a time, uploaded,
            # and deleted there; the metadata files follow, then manifest.json LAST (the commit).
            staging = Path(tempfile.mkdtemp(prefix="stage2-store-upload-"))
            self.location.withdraw(MANIFEST_NAME)
        else:
            remove_stale_temp_dirs(self.out_dir)  # space held by killed builds counts as free
            check_free_space_for_store(self.out_dir, {"total": payload})
            staging = make_staging_dir(self.out_dir)
        try:
            shard_entries: list[dict[str, Any]] = []
            digests: dict[int, str] = {}
            # Pipelined: while shard k is compressed and written, shard k+1 is decoded in the
            # background (its rows in parallel). At most two shards are in memory at once.
            with (
                ThreadPoolExecutor(max_workers=self.workers) as pool,
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-prefetch") as prefetch,
            ):
                self._encode_pool = pool  # inner chunks are compressed in parallel on the same threads
                nxt = prefetch.submit(self._load_shard, shards[0], pool) if shards else None
                for k, plan in enumerate(shards):
                    assert nxt is not None
                    loaded = nxt.result()
                    nxt = (
                        prefetch.submit(self._load_shard, shards[k + 1], pool)
                        if k + 1 < len(shards)
                        else None
                    )
                    try:
                        shard_entries.append(self._write_shard(staging, plan, loaded))
                        if remote:
                            self._upload_shard(staging, shard_entries[-1])
                    except BaseException:
                        if nxt is not None:
                            nxt.cancel()
                        raise
                    for r, d in zip(plan.rows, loaded.digests, strict=True):
                        digests[r.sample_index] = d
                    del loaded
                    if self.progress is not None:
                        self.progress(len(plan.rows))
            key_to_index = {r.spec.sample_key: r.sample_index for r in rows}
            index_rows = [_index_row(r, digests[r.sample_index]) for r in rows]
            pairs_rows = [
                {
                    "pair_id": p.pair_id,
                    "split": p.split,
                    "task": p.task,
                    "chosen_sample_index": key_to_index[p.chosen_key],
                    "rejected_sample_index": key_to_index[p.rejected_key],
                }
                for p in kept_pairs
            ]
            manifest = finish_manifest(
                self.location if remote else StoreLocation.parse(staging),
                profile=self.profile,
                inputs=self.inputs,
                options={
                    "include_actions": self.include_actions,
                    "rows_per_shard": self.rows_per_shard,
                    "max_frames": self.max_frames,
                },
                shard_entries=shard_entries,
                index_rows=index_rows,
                pairs_rows=pairs_rows,
                local=self.local,
            )
            if not remote:
                publish_dir(staging, self.out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if remote:  # no manifest was written: best-effort removal of the uploaded objects
                with contextlib.suppress(Exception):
                    self.location.withdraw(MANIFEST_NAME)
            raise
        finally:
            if remote:
                shutil.rmtree(staging, ignore_errors=True)
        return manifest

    def _upload_shard(self, staging: Path, entry: dict[str, Any]) -> None:
        """Upload one shard folder written in the local scratch folder, then delete it there."""
        pairs = [(staging / f["path"], self.location.root / f["path"]) for f in entry["files"]]
        self.location.put_files(pairs, workers=max(4, self.workers))
        shutil.rmtree(staging / entry["dir"], ignore_errors=True)


def _index_row(r: Row, digest: str) -> dict[str, Any]:
    s = r.spec
    return {
        "sample_index": r.sample_index,
        "sample_key": s.sample_key,
        "cache_key": s.cache_key,
        "source": s.source,
        "task": s.task,
        "quality_label": s.quality_label,
        "partial_success": None if s.partial_success is None else float(s.partial_success),
        "is_robot": bool(s.is_robot),
        "split": r.split,
        "num_frames": r.num_frames,
        "frame_height": r.height,
        "frame_width": r.width,
        "shard_id": r.shard_id,
        "row": r.row,
        "frames_sha256": digest,
        "action_status": s.action_status,
        "action_width": r.action_width,
    }
