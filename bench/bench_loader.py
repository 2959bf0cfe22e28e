"""The store from the trainer's side: one shuffled epoch of padded batches against loading the npz files.

* ``loader_epoch_vs_npz_epoch``: one shuffled epoch (``ResolutionBatches``, batch 8, seed 0) of a
  ``Selection`` through :func:`stage2_data.loader.collate` in 2 worker processes that persist across
  epochs, as trainers run them (a ``torch.utils.data.DataLoader(num_workers=2,
  persistent_workers=True)`` when torch is importable, else ``PoolLoader(workers=2,
  persistent_workers=True)``; fork), every batch received by this process; against what a trainer
  without the store runs: ``np.load(npz)["frames"]`` of the same trajectories' upstream compressed
  ``.npz`` (the files that fed the store), in the same order, in this process. Both warm (each run
  once untimed first: for ours that first epoch starts the workers), best of 2, alternating.

  Worker start-up is NOT in ``ours_s`` (it was until the workers persisted); it is reported apart:
  ``fresh_workers_epoch_s`` is the best of 2 epochs each through a new loader (2 workers started,
  then ended, inside the timing: what ``ours_s`` measured before), ``ratio_fresh_workers`` its ratio,
  and ``worker_startup_s`` = ``fresh_workers_epoch_s - ours_s``. Also reported: the same npz loads
  split over a 2-process pool (``baseline_2proc_s``), so the ratio at equal parallelism is visible.

Workload: ``BENCH_LOADER_TRAJ`` (default 256) trajectories of (T <= 32, 128, 128, 3) image-like
uint8 frames (bench/bench_store.py's ``make_upstream``), built into a store of 64-row shards.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_store import read_bench_store
from bench.run import best_alternating, entry, timed
from stage2_data.loader import PoolLoader, ResolutionBatches, Selection, collate

BATCH = 8


def _load_npz(paths: Sequence[str]) -> int:
    total = 0
    for p in paths:
        with np.load(p) as z:
            total += int(z["frames"].shape[0])
    return total


def loader_epoch_vs_npz_epoch(workdir: Path) -> list[dict[str, Any]]:
    n = int(os.environ.get("BENCH_LOADER_TRAJ", "256"))
    samples, store = read_bench_store(workdir, n)
    sel = Selection(store)
    npz_of = {s.sample_key: str(s.frames_path) for s in samples}
    torch_here = importlib.util.find_spec("torch") is not None
    via = "torch DataLoader(num_workers=2)" if torch_here else "PoolLoader(workers=2)"
    frames_seen: list[int] = []

    def make_loader(persistent: bool) -> Any:
        order = ResolutionBatches(sel.resolutions, BATCH, seed=0)
        if torch_here:
            from torch.utils.data import DataLoader

            return DataLoader(
                sel,
                batch_sampler=order,
                collate_fn=collate,
                num_workers=2,
                persistent_workers=persistent,
                multiprocessing_context="fork",
            )
        return PoolLoader(sel, order, workers=2, context="fork", persistent_workers=persistent)

    persistent = make_loader(True)

    def ours() -> None:
        frames_seen.append(sum(int(b["lengths"].sum()) for b in persistent))

    def fresh() -> None:
        loader = make_loader(False)
        frames_seen.append(sum(int(b["lengths"].sum()) for b in loader))

    epoch = [p for b in ResolutionBatches(sel.resolutions, BATCH, seed=0) for p in b]
    paths = [npz_of[sel.sample_keys[p]] for p in epoch]

    def baseline() -> None:
        frames_seen.append(_load_npz(paths))

    ours()  # warm both (page cache, imports), then the best of 2, alternating
    baseline()
    best_ours, best_base = best_alternating(ours, baseline, repeat=2)
    if hasattr(persistent, "close"):
        persistent.close()
    fresh()  # warm
    best_fresh = min(timed(fresh) for _ in range(2))
    assert len(set(frames_seen)) == 1, frames_seen  # both read every frame of the epoch

    halves = [paths[0::2], paths[1::2]]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_load_npz, halves)  # warm
        base_2proc = min(timed(pool.map, _load_npz, halves) for _ in range(2))
    decoded = int(sel.lengths.sum()) * 128 * 128 * 3
    sel.close()
    return [
        entry(
            "loader_epoch_vs_npz_epoch",
            best_ours,
            "np.load(npz)['frames'] of the same trajectories, same order",
            best_base,
            0.1,
            via=via + ", persistent workers",
            samples=len(epoch),
            batch_size=BATCH,
            decoded_bytes=decoded,
            ours_MB_per_s=round(decoded / 1e6 / best_ours, 1),
            baseline_2proc_s=round(base_2proc, 4),
            ratio_vs_2proc_npz=round(best_ours / base_2proc, 3),
            fresh_workers_epoch_s=round(best_fresh, 4),
            ratio_fresh_workers=round(best_fresh / best_base, 3),
            worker_startup_s=round(best_fresh - best_ours, 4),
        )
    ]


BENCHMARKS = [loader_epoch_vs_npz_epoch]
