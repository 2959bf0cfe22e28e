"""O(change) profile updates: adding one cache directory to a profile whose store is published.

* ``add_cache_dir_vs_full_rebuild``: what the store step does when a profile gains one cache directory
  (``stage2_data.store.extend.write_or_extend`` with the published store: a sidecar store of the new
  trajectories, merged by hard-linking the old shards and copying the new ones, then the decode
  validation every new store gets before it is published) vs a full build of the same bigger profile
  (the writer over every trajectory, then the same validation). Both read the same upstream ``.npz``
  frames (image-like 128x128, T <= 32); ``BENCH_EXTEND_DIRS`` cache directories of
  ``BENCH_EXTEND_PER_DIR`` trajectories are published first, one more is added.

The decode validation reads every sample of the new store in both cases (it is O(store), the writing
is O(change)): ``ours_write_s`` / ``full_write_s`` report the writing alone.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.bench_store import make_upstream
from bench.run import entry
from stage2_data.storage import StoreLocation
from stage2_data.store import PairSpec, SampleSpec, validate_vin_offline_store
from stage2_data.store.extend import write_or_extend

PROFILE = {"name": "bench_extend", "repo_id": "bench/processed_datasets", "revision": "c" * 40}


def _inputs(dirs: int) -> dict[str, str]:
    return {f"archive/cache_{d:02d}.tar": f"{d + 1:064x}" for d in range(dirs)}


def _build(
    stores: Path, name: str, samples: list[SampleSpec], pairs: list[PairSpec], dirs: int
) -> tuple[float, float, str]:
    """(write seconds, validate seconds, update line) of one store step over ``stores``."""
    root = StoreLocation.parse(stores)
    out = root.child(name)
    t = time.perf_counter()
    update = write_or_extend(
        out, root.current(), samples, pairs, profile=PROFILE, inputs=_inputs(dirs), rows_per_shard=64
    )
    t1 = time.perf_counter()
    problems = validate_vin_offline_store(out, decode=True)
    t2 = time.perf_counter()
    assert problems == [], problems
    root.publish_current(name)
    return t1 - t, t2 - t1, update


def add_cache_dir_vs_full_rebuild(workdir: Path) -> dict[str, Any]:
    k = int(os.environ.get("BENCH_EXTEND_DIRS", "8"))
    per = int(os.environ.get("BENCH_EXTEND_PER_DIR", "32"))
    samples, _, _ = make_upstream(workdir / "up", (k + 1) * per, npy=False)
    # pairs inside each cache dir (consecutive trajectories of one split)
    pairs = []
    for d in range(k + 1):
        ss = samples[d * per : (d + 1) * per]
        by_split: dict[str, list[SampleSpec]] = {}
        for s in ss:
            by_split.setdefault(s.split, []).append(s)
        for sp, group in sorted(by_split.items()):
            pairs += [
                PairSpec(f"p{d:02d}{sp}{j:04d}", sp, "task", group[j].sample_key, group[j + 1].sample_key)
                for j in range(0, len(group) - 1, 2)
            ]
    old_n = k * per
    old_keys = {s.sample_key for s in samples[:old_n]}
    old_pairs = [p for p in pairs if p.chosen_key in old_keys and p.rejected_key in old_keys]
    best: dict[str, tuple[float, float]] = {}
    update = ""
    for rep in range(2):
        for mode in ("ours", "full"):
            stores = workdir / f"{mode}{rep}"
            if mode == "ours":  # the published store of the K-dir profile (untimed)
                _build(stores, "old", samples[:old_n], old_pairs, k)
            os.sync()
            w, v, up = _build(stores, "new", samples, pairs, k + 1)
            if mode == "ours":
                assert up.startswith("extended "), up
                update = up
            else:
                assert up.startswith("rebuilt: "), up
            if mode not in best or w + v < sum(best[mode]):
                best[mode] = (w, v)
            shutil.rmtree(stores, ignore_errors=True)
    (ow, ov), (fw, fv) = best["ours"], best["full"]
    return entry(
        "add_cache_dir_vs_full_rebuild",
        ow + ov,
        f"full rebuild of the same {k + 1}-dir profile (writer + decode validation)",
        fw + fv,
        None,
        cache_dirs_before=k,
        trajectories_before=old_n,
        trajectories_added=per,
        ours_write_s=round(ow, 3),
        ours_validate_s=round(ov, 3),
        full_write_s=round(fw, 3),
        full_validate_s=round(fv, 3),
        write_ratio=round(ow / fw, 3) if fw else None,
        update=update,
    )


BENCHMARKS = [add_cache_dir_vs_full_rebuild]
