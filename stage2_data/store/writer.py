"""The writer: build a store from samples and pairs, shard by shard, and publish it atomically.

Plan (:mod:`.plan`), then per shard: write its Zarr group (:mod:`.shard_io`), its rows decoded, hashed
and compressed on a few threads as they are written (:mod:`.shard_build`: a few rows in memory, never
the shard), and hash its files; then the metadata files and the manifest (:mod:`.commit`),
then publication (:mod:`stage2_data.publish`, or manifest-last on object storage).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from ..errors import Stage2Error
from ..hashing import SHA256_RE
from ..oserrors import fs_error
from ..publish import make_staging_dir, publish_dir
from ..storage import StoreLocation
from .commit import finish_manifest
from .format import (
    DEFAULT_MAX_FRAMES,
    MANIFEST_NAME,
    PairSpec,
    SampleSpec,
    StoreInputError,
)
from .plan import Row, ShardPlan, check_free_space_for_store, plan_shards
from .shard_build import build_shard, write_shard
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


class VinOfflineWriter:
    """Build a store at ``out_dir`` from samples and pairs, shard by shard, publish atomically.

    ``progress`` is called after each shard with the number of rows that shard wrote. ``max_frames``
    is the frame bound (the profile's): a longer trajectory is refused before anything is decoded.
    ``processes`` > 1 writes the shards of a local store in that many worker processes (where the
    ``forkserver`` start method exists, this process may have children (not a daemonic process,
    such as a dask worker's), and there are at least two shards a process).
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
        processes: int = 1,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        problems: list[str] = []
        if not isinstance(rows_per_shard, int) or isinstance(rows_per_shard, bool) or rows_per_shard <= 0:
            problems.append(f"rows_per_shard must be a positive integer, got {rows_per_shard!r}")
        if not isinstance(include_actions, bool):
            problems.append(f"include_actions must be a bool, got {include_actions!r}")
        if not isinstance(max_frames, int) or isinstance(max_frames, bool) or max_frames <= 0:
            problems.append(f"max_frames must be a positive integer, got {max_frames!r}")
        if not isinstance(processes, int) or isinstance(processes, bool) or processes <= 0:
            problems.append(f"processes must be a positive integer, got {processes!r}")
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
                fix="each problem says what to change: an argument of the writer, or the output folder "
                "or prefix (make it writable, choose another, or move what is in it aside)",
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
        self.processes = processes

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
            digests: dict[int, str] = {}
            if (
                not remote
                and self.processes > 1
                and len(shards) >= 2 * self.processes
                and "forkserver" in multiprocessing.get_all_start_methods()
                and not multiprocessing.current_process().daemon  # (a dask worker: no children)
            ):
                shard_entries = self._write_shards_in_processes(staging, shards, digests)
            else:
                shard_entries = self._write_shards(staging, shards, digests, remote)
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
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if remote:  # no manifest was written: best-effort removal of the uploaded objects
                with contextlib.suppress(Exception):
                    self.location.withdraw(MANIFEST_NAME)
            if isinstance(exc, OSError) and not isinstance(exc, Stage2Error):
                # a write's OSError often carries no file name: name the store being written
                where = self.location.url if remote else str(self.out_dir)
                raise fs_error(exc, f"writing the store {where}", where=where) from exc
            raise
        finally:
            if remote:
                shutil.rmtree(staging, ignore_errors=True)
        return manifest

    def _write_shards(
        self, staging: Path, shards: Sequence[ShardPlan], digests: dict[int, str], remote: bool
    ) -> list[dict[str, Any]]:
        """Every shard written in this process, in order (each shard's rows decoded, hashed and
        compressed on ``workers`` threads as they are written); their manifest entries."""
        entries: list[dict[str, Any]] = []
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="store-rows") as pool:
            for plan in shards:
                entry, shard_digests = write_shard(staging, plan, pool, self.workers)
                entries.append(entry)
                if remote:
                    self._upload_shard(staging, entry)
                self._shard_done(plan, shard_digests, digests)
        return entries

    def _write_shards_in_processes(
        self, staging: Path, shards: Sequence[ShardPlan], digests: dict[int, str]
    ) -> list[dict[str, Any]]:
        """Every shard written by ``processes`` worker processes (one shard a task, at most one in
        memory per process: the shards' Python work does not share one GIL); their manifest
        entries, in shard order. The workers are forked from a fork server that imports only
        :mod:`.shard_build` (never forked from this process, whose other threads may hold locks, and
        never re-running the caller's ``__main__`` as spawned processes do), and hold the same library
        settings (:mod:`.determinism`), so a shard's bytes are the same whoever writes it. A failure
        or a stop cancels the shards not started and waits for the running ones (one shard each)."""
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([build_shard.__module__])
        workers = max(1, self.workers // self.processes)
        entries: dict[int, dict[str, Any]] = {}
        with ProcessPoolExecutor(max_workers=self.processes, mp_context=ctx) as ex:
            futs = {ex.submit(build_shard, staging, plan, workers): plan for plan in shards}
            try:
                for fut in as_completed(futs):
                    plan = futs[fut]
                    entries[plan.shard_id], shard_digests = fut.result()
                    self._shard_done(plan, shard_digests, digests)
            except BaseException:
                ex.shutdown(wait=True, cancel_futures=True)
                raise
        return [entries[plan.shard_id] for plan in shards]

    def _shard_done(self, plan: ShardPlan, shard_digests: list[str], digests: dict[int, str]) -> None:
        for r, d in zip(plan.rows, shard_digests, strict=True):
            digests[r.sample_index] = d
        if self.progress is not None:
            self.progress(len(plan.rows))

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
