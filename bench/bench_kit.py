"""Kit verification benchmarks (issue 4).

- ``verify_vs_sha256sum``: ``kit.verify_subset_bytes`` (threads, hashlib's SHA-NI code) against
  ``sha256sum -c`` on the same SHA256SUMS over 4,323 files x 256 KiB = 1.06 GiB (the real subset's
  file count). Both read from the page cache (each runs once untimed first); best of 3.
- ``link_check_full_cardinality_vs_stat_loop``: ``kit.link_check`` of the full-cardinality demo
  (2,689 pairs, 23,359 action rows, 4,323 frames files, 20,620 sidecars; manifests parsed and
  checked, every path resolved) against a bare ``os.stat`` loop over the same 24,943 absolute paths
  (prepared beforehand) in one process; best of 15, interleaved.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.profiles import KIT_PATHS, profile_data
from bench.run import best_alternating, entry
from stage2_data import kit, layout
from stage2_data.profile import Profile, parse_profile

N_FILES = 4323
FILE_BYTES = 256 * 1024
CACHE_KEYS = [f"bench_cache_key_{i:02d}" for i in range(13)]


def _byte_check_kit(work: Path) -> tuple[Profile, Path]:
    """A data root with N_FILES frames files of FILE_BYTES random bytes, and a kit naming them."""
    data_root, kit_root = work / "data", work / "kit"
    sums_path, pairs_path = kit_root / KIT_PATHS["subset_checksums"], kit_root / KIT_PATHS["pair_manifest"]
    sums_path.parent.mkdir(parents=True)
    rng = np.random.default_rng(4)
    rels: list[str] = []
    sums: list[str] = []
    for i in range(N_FILES):
        ck = CACHE_KEYS[i % len(CACHE_KEYS)]
        rel = layout.frames_relpath(ck, str(uuid.UUID(int=i + 1, version=4)))
        path = data_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = rng.bytes(FILE_BYTES)
        path.write_bytes(data)
        rels.append(rel)
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {rel}\n")
    sums_path.write_text("".join(sums))
    pairs = []
    for k in range(0, N_FILES, 2):
        a, b = rels[k], rels[k + 1] if k + 1 < N_FILES else rels[0]
        pairs.append(
            {
                "pair_id": f"p{k // 2 + 1:06d}",
                "split": "train",
                "task": "bench",
                "chosen_trajectory_id": layout.FRAMES_PATH_RE.match(a).group("id"),  # type: ignore[union-attr]
                "chosen_frames_path": a,
                "rejected_trajectory_id": layout.FRAMES_PATH_RE.match(b).group("id"),  # type: ignore[union-attr]
                "rejected_frames_path": b,
            }
        )
    pairs_path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    profile = parse_profile(
        profile_data(
            "bench_bytes",
            {"repo_id": "org/processed_datasets", "revision": "b" * 40},
            [{"path": f"{ck}.tar", "cache_key": ck} for ck in CACHE_KEYS],
            expected={
                "cache_dirs": len(CACHE_KEYS),
                "archives": len(CACHE_KEYS),
                "trajectories": N_FILES,
                "pair_rows": len(pairs),
                "unique_frame_files": N_FILES,
            },
        )
    ).with_kit_root(kit_root)
    return profile, data_root


def verify_vs_sha256sum(work: Path) -> dict[str, Any]:
    profile, data_root = _byte_check_kit(work)
    sums = profile.kit_file("subset_checksums")
    total = N_FILES * FILE_BYTES

    def ours() -> None:
        rep = kit.verify_subset_bytes(profile, data_root)
        if not rep.ok or rep.matched != N_FILES or rep.bytes != total:
            raise RuntimeError(f"verify_subset_bytes failed: {rep.details[:3]}")

    def baseline() -> None:
        proc = subprocess.run(["sha256sum", "-c", "--quiet", str(sums)], cwd=data_root, capture_output=True)
        if proc.returncode != 0:
            raise RuntimeError(f"sha256sum -c failed: {proc.stderr[-500:]!r}")

    ours()  # warm the page cache and the imports for both
    baseline()
    best_ours, best_base = best_alternating(ours, baseline)
    return entry(
        "verify_vs_sha256sum",
        best_ours,
        "sha256sum -c (coreutils, one process)",
        best_base,
        0.25,
        files=N_FILES,
        bytes=total,
        ours_MB_s=round(total / 1e6 / best_ours, 1),
        baseline_MB_s=round(total / 1e6 / best_base, 1),
        threads=max(2, os.cpu_count() or 2),
        cpus=os.cpu_count(),
    )


def link_check_full_cardinality_vs_stat_loop(work: Path) -> dict[str, Any]:
    from stage2_data.demo import generate_demo
    from stage2_data.extract import extract_cache_dir
    from stage2_data.profile import load_profile

    demo = generate_demo(work / "demo", full_cardinality=True)
    profile = load_profile(demo.profile)
    data_root = work / "data"
    for key, specs in profile.archives_by_cache_key().items():
        extract_cache_dir(key, [demo.upstream / a.path for a in specs], data_root)
    kit.unpack_sidecars(profile, data_root)

    pairs, _ = kit.load_pairs(profile.kit_file("pair_manifest"))
    actions, _ = kit.load_action_manifests(profile.kit_file("action_manifest_dir"))
    root = str(data_root.resolve())
    frames = sorted({f"{root}/{fp}" for r in pairs for _, fp in r.trajectories()})
    sidecars = [f"{root}/{layout.DERIVED_DIR}/{a.sidecar_path}" for a in actions if a.sidecar_path]
    paths = frames + sidecars
    del pairs, actions

    def stat_loop() -> None:
        for p in paths:
            os.stat(p)

    rep = kit.link_check(profile, data_root)
    totals = (rep.pair_rows, rep.unique_frame_files, rep.action_manifest_rows, rep.resolved_sidecars)
    if rep.problems or totals != (2689, 4323, 23359, 20620):
        raise RuntimeError(f"link check of the full-cardinality demo failed: {totals} {rep.problems[:3]}")
    stat_loop()
    best_ours = best_base = best_fs = float("inf")
    for _ in range(15):
        t = time.perf_counter()
        r = kit.link_check(profile, data_root)
        best_ours = min(best_ours, time.perf_counter() - t)
        best_fs = min(best_fs, r.fs_seconds)
        t = time.perf_counter()
        stat_loop()
        best_base = min(best_base, time.perf_counter() - t)
    return entry(
        "link_check_full_cardinality_vs_stat_loop",
        best_ours,
        f"os.stat loop over the same {len(paths)} paths (one process)",
        best_base,
        2.0,
        paths=len(paths),
        ours_fs_part_s=round(best_fs, 4),
        ours_parse_part_s=round(best_ours - best_fs, 4),
        pair_rows=totals[0],
        action_manifest_rows=totals[2],
    )


BENCHMARKS = [verify_vs_sha256sum, link_check_full_cardinality_vs_stat_loop]
