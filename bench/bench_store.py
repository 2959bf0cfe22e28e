"""The VIN offline store: build throughput, random-read latency, and build memory.

* ``store_build_vs_np_save``: build a store from ALREADY-DECODED frames vs ``np.save`` of the same
  arrays. "Already decoded" = each trajectory's frames pre-decoded once (untimed) into an
  uncompressed ``.npy`` (the writer accepts ``.npy`` frame files: read with a plain copy from the page
  cache, no inflate), so the figure measures the store writing (copy into the shard buffer, per-row
  sha256, Blosc, Zarr sharding, per-file sha256, fsync), not zlib. The baseline writes the same
  arrays (held in memory) with ``np.save``, one file per trajectory; both runs end with their files
  fsynced (the store always fsyncs: it is published atomically and durably), and the baseline
  without fsync is reported as well.
* ``store_read_vs_npz_load``: random-order reads of single samples (``reader.read_frames(i)``, every
  chunk checked against its crc32c) vs ``np.load(npz)["frames"]`` of the same trajectories' upstream
  compressed ``.npz``; both warm, best of 5 passes each, alternating.
* ``store_read_checksum_cost``: the same reads vs the same direct reads (the row's chunk read in
  place from the reader's mapping of the shard file, its ``T`` frames decoded into a fresh array as
  the reader does: :func:`~stage2_data.store.shard_io.decode_rows`) without the crc32c check: what
  the checksums cost a warm read.
* ``npz_load_vs_numpy``: what the store writer reads a trajectory with
  (:func:`~stage2_data.formats.npz.load_npz`: one read, the member inflated by ISA-L, its size and
  CRC-32 checked) vs ``np.load(npz)["frames"]`` (zipfile + zlib) of the same upstream ``.npz``
  files; both warm, one thread, best of 5 passes each, alternating, on two workloads (this module's
  noisy frames, which deflate barely compresses, and the demo's, ~3x). Inflating the frames is the
  store step's largest cost at the real scale (~100 GiB of deflated frames).
* ``store_build_peak_memory``: peak RSS of a build (a fresh subprocess each, ``ru_maxrss``) for N and
  4N trajectories from the upstream ``.npz``; flat means within 10%.

Workload: frames (T <= 32, 128, 128, 3) uint8 of synthetic but image-like content (smooth colour
fields, moving shapes, sensor noise: it compresses like camera frames, not like random bytes).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.run import best_alternating, entry
from stage2_data.store import PairSpec, SampleSpec, VinOfflineStoreReader, VinOfflineWriter
from stage2_data.store.shard_io import decode_rows

H = W = 128
TMAX = 32
PROFILE = {"name": "bench", "repo_id": "bench/processed_datasets", "revision": "b" * 40}
INPUTS = {"kit/pairs.jsonl": "1" * 64}
REPO = Path(__file__).resolve().parent.parent


def _tid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


def make_frames(i: int, t: int) -> np.ndarray:
    """Image-like frames: a smooth colour field, a moving square and disc, mild sensor noise."""
    rng = np.random.default_rng(i)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    base = np.stack(
        [
            127 + 100 * np.sin(xx / (17 + 3 * c) + rng.uniform(0, 6)) * np.cos(yy / (23 + 5 * c))
            for c in range(3)
        ],
        axis=-1,
    )
    frames = np.empty((t, H, W, 3), dtype=np.uint8)
    color = rng.integers(0, 256, size=3)
    for k in range(t):
        img = base.copy()
        x0, y0 = (7 + 3 * k + i) % (W - 24), (11 + 2 * k) % (H - 24)
        img[y0 : y0 + 24, x0 : x0 + 24] = color
        img[((yy - 64) ** 2 + (xx - (k * 4) % W) ** 2) < 100] = 255 - color
        frames[k] = np.clip(img + rng.normal(0, 3, size=img.shape), 0, 255).astype(np.uint8)
    return frames


def make_upstream(
    root: Path, n: int, *, npy: bool
) -> tuple[list[SampleSpec], list[PairSpec], list[np.ndarray]]:
    """n trajectories as upstream compressed .npz (and, if ``npy``, pre-decoded .npy); pairs by twos."""
    samples, arrays = [], []
    (root / "npz").mkdir(parents=True, exist_ok=True)
    if npy:
        (root / "npy").mkdir(parents=True, exist_ok=True)
    splits = ("train", "val", "test")
    for i in range(n):
        t = TMAX if i % 3 else 16 + i % 16
        fr = make_frames(i, t)
        key = _tid(i)
        npz = root / "npz" / f"trajectory_{key}.npz"
        np.savez_compressed(npz, frames=fr, shape=np.array(fr.shape, dtype=np.int64), num_frames=np.int64(t))
        path = npz
        if npy:
            path = root / "npy" / f"trajectory_{key}.npy"
            np.save(path, fr)
            arrays.append(fr)
        samples.append(
            SampleSpec(
                key,
                "cache",
                "bench",
                "task",
                "successful",
                None,
                True,
                splits[(i // 2) % 3],
                path,
                None,
                None,
            )
        )
    pairs = [
        PairSpec(f"p{i:06d}", samples[i].split, "task", samples[i].sample_key, samples[i + 1].sample_key)
        for i in range(0, n - 1, 2)
    ]
    return samples, pairs, arrays


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def store_build_vs_np_save(workdir: Path) -> list[dict[str, Any]]:
    n = int(os.environ.get("BENCH_STORE_TRAJ", "720"))  # 720 x ~1.4 MiB = ~1 GiB decoded
    samples, pairs, arrays = make_upstream(workdir / "up", n, npy=True)
    decoded = sum(a.nbytes for a in arrays)
    os.sync()
    best_ours, best_base, best_base_nosync = float("inf"), float("inf"), float("inf")
    for rep in range(2):
        out = workdir / f"store{rep}"
        t = time.perf_counter()
        VinOfflineWriter(out, profile=PROFILE, inputs=INPUTS, rows_per_shard=64).write(samples, pairs)
        best_ours = min(best_ours, time.perf_counter() - t)
        os.sync()
        bdir = workdir / f"npsave{rep}"
        bdir.mkdir()
        t = time.perf_counter()
        for s, a in zip(samples, arrays, strict=True):
            np.save(bdir / f"{s.sample_key}.npy", a)
        nosync = time.perf_counter() - t
        _fsync_tree(bdir)
        best_base = min(best_base, time.perf_counter() - t)
        best_base_nosync = min(best_base_nosync, nosync)
        os.sync()
    on_disk = sum(p.stat().st_size for p in (workdir / "store1").rglob("*") if p.is_file())
    return [
        entry(
            "store_build_vs_np_save",
            best_ours,
            "np.save of the same arrays (+fsync)",
            best_base,
            2.0,
            trajectories=n,
            decoded_bytes=decoded,
            store_bytes_on_disk=on_disk,
            ours_MB_per_s=round(decoded / 1e6 / best_ours, 1),
            baseline_MB_per_s=round(decoded / 1e6 / best_base, 1),
            baseline_without_fsync_s=round(best_base_nosync, 4),
            ratio_vs_np_save_without_fsync=round(best_ours / best_base_nosync, 3),
            input="pre-decoded .npy (untimed decode)",
        )
    ]


def read_bench_store(workdir: Path, n: int) -> tuple[list[SampleSpec], Path]:
    """``n`` trajectories' npz files (:func:`make_upstream`, not pre-decoded) and the store of 64-row
    shards built from them: what the read, decode and loader benchmarks read."""
    samples, pairs, _ = make_upstream(workdir / "up", n, npy=False)
    out = workdir / "store"
    VinOfflineWriter(out, profile=PROFILE, inputs=INPUTS, rows_per_shard=64).write(samples, pairs)
    return samples, out


def np_load_frames(paths: list[str] | list[Path]) -> None:
    """The baseline read: ``np.load(npz)["frames"]`` of every file."""
    for p in paths:
        with np.load(p) as z:
            z["frames"]


def store_read_vs_npz_load(workdir: Path) -> list[dict[str, Any]]:
    n = int(os.environ.get("BENCH_STORE_READ_TRAJ", "192"))
    samples, out = read_bench_store(workdir, n)
    reader = VinOfflineStoreReader(out)
    by_key = {s.sample_key: s.frames_path for s in samples}
    order = list(range(reader.num_samples))
    random.Random(0).shuffle(order)
    npz_paths = [by_key[reader.sample_index[i]["sample_key"]] for i in order]

    def ours() -> None:
        for i in order:
            reader.read_frames(i)

    def baseline() -> None:
        np_load_frames(npz_paths)

    # warm both (page cache, zarr metadata), then the best of 5 passes each, alternating: a read is
    # ~0.15 ms of memory traffic (crc32c, copy), so other jobs on the machine move single passes by 10%
    ours()
    baseline()
    best_ours, best_base = best_alternating(ours, baseline, repeat=5)
    # equality of what both return (outside the timing)
    for i, p in zip(order[:8], npz_paths[:8], strict=True):
        with np.load(p) as z:
            assert np.array_equal(reader.read_frames(i), z["frames"])
    return [
        entry(
            "store_read_vs_npz_load",
            best_ours,
            "np.load(npz)['frames'] of the same trajectories",
            best_base,
            0.03,
            reads=len(order),
            ours_ms_per_sample=round(1000 * best_ours / len(order), 3),
            baseline_ms_per_sample=round(1000 * best_base / len(order), 3),
            checksums="crc32c of every chunk read",
        )
    ]


def _npz_load_entry(name: str, paths: list[str], workload: str) -> dict[str, Any]:
    from stage2_data.formats.npz import load_npz

    def ours() -> None:
        for p in paths:
            load_npz(p, ("frames",))

    ours()
    np_load_frames(paths)
    best_ours, best_base = best_alternating(ours, lambda: np_load_frames(paths), repeat=5)
    raw = packed = 0
    for p in paths:  # the same arrays (outside the timing)
        with np.load(p) as z:
            want = z["frames"]
        assert np.array_equal(load_npz(p, ("frames",))["frames"], want)
        raw += want.nbytes
        packed += os.path.getsize(p)
    return entry(
        name,
        best_ours,
        "np.load(npz)['frames'] (zipfile + zlib) of the same files",
        best_base,
        None,
        workload=workload,
        files=len(paths),
        inflated_bytes=raw,
        deflate_ratio=round(raw / packed, 2),
        ours_MB_s=round(raw / best_ours / 1e6, 1),
        baseline_MB_s=round(raw / best_base / 1e6, 1),
    )


def npz_load_vs_numpy(workdir: Path) -> list[dict[str, Any]]:
    """Two workloads: this module's image-like frames (their sensor noise leaves deflate almost
    nothing to do: stored blocks, a copy either way) and the demo's frames, scaled up as the whole
    build benchmark scales them (deflate ~3x)."""
    import tarfile

    from bench.bench_noop import scaled_demo

    n = int(os.environ.get("BENCH_STORE_READ_TRAJ", "192"))
    samples, _ = read_bench_store(workdir, n)
    scale = float(os.environ.get("BENCH_NPZ_DEMO_SCALE", "4"))
    demo = scaled_demo(workdir / "demo", scale, full_cardinality=False)
    for tar in sorted(demo.upstream.rglob("*.tar")):  # (the split cache dir's parts are left out)
        with tarfile.open(tar) as tf:
            tf.extractall(workdir / "demo-frames", filter="data")
    frames = sorted(str(p) for p in (workdir / "demo-frames").rglob("trajectory_*.npz"))
    return [
        _npz_load_entry("npz_load_vs_numpy", [s.frames_path for s in samples], "image-like, noisy"),
        _npz_load_entry(
            "npz_load_vs_numpy_demo_frames", frames, f"the demo's frames, x{scale:g} in height and width"
        ),
    ]


def store_read_checksum_cost(workdir: Path) -> list[dict[str, Any]]:
    n = int(os.environ.get("BENCH_STORE_READ_TRAJ", "192"))
    samples, out = read_bench_store(workdir, n)
    reader = VinOfflineStoreReader(out)
    order = list(range(reader.num_samples))
    random.Random(0).shuffle(order)
    rows = [reader.sample_index[i] for i in order]

    def ours() -> None:
        for i in order:
            reader.read_frames(i)

    def unchecked() -> None:  # the reader's direct path (its T frames decoded), less the crc32c check
        for r in rows:
            d = reader._direct(int(r["shard_id"]), "frames")
            assert d is not None
            off, nbytes = d.entries[int(r["row"])]
            payload = memoryview(reader._read_range(d.path, off, nbytes))[:-4]
            decode_rows(d.codec, payload, d.inner[1:], d.dtype, int(r["num_frames"]))

    ours()
    unchecked()
    best_ours, best_base = best_alternating(ours, unchecked, repeat=5)
    chunk_bytes = sum(reader._direct(int(r["shard_id"]), "frames").entries[int(r["row"])][1] for r in rows)  # type: ignore[union-attr]
    return [
        entry(
            "store_read_checksum_cost",
            best_ours,
            "the same direct reads without the crc32c check",
            best_base,
            1.1,
            reads=len(order),
            chunk_MB_per_read=round(chunk_bytes / len(order) / 1e6, 3),
            checksum_us_per_read=round(1e6 * (best_ours - best_base) / len(order), 1),
            ours_ms_per_sample=round(1000 * best_ours / len(order), 3),
            note="crc32c (the crc32c package, hardware) over each chunk's stored bytes: a compressed "
            "chunk's read in place from the mapped shard file before Blosc, a chunk Blosc stored "
            "uncompressed over its header, the copy just made of its frames and the rest (the same "
            "bytes, the bulk from the cache); the frames are image-like with sensor noise, which lz4 "
            "barely compresses, so the checksum covers ~the decoded size; it runs at the speed of a "
            "plain read of the same bytes",
        )
    ]


def store_decode_check_vs_npz_load_sha256(workdir: Path) -> list[dict[str, Any]]:
    """``validate --decode`` (every sample decoded by the reader and hashed against its
    frames_sha256, padding checked, plus the structural validation) vs what a user would do to
    check the same content without the store: np.load every trajectory's npz and sha256 its frames."""
    from stage2_data.hashing import sha256_bytes
    from stage2_data.store import validate_vin_offline_store

    n = int(os.environ.get("BENCH_STORE_READ_TRAJ", "192"))
    samples, out = read_bench_store(workdir, n)
    npz_paths = [s.frames_path for s in samples]

    def digests() -> list[str]:
        found = []
        for p in npz_paths:
            with np.load(p) as z:
                found.append(sha256_bytes(np.ascontiguousarray(z["frames"]).data))
        return found

    want = digests()  # also warms the page cache

    def ours() -> None:
        assert validate_vin_offline_store(out, decode=True) == []

    def baseline() -> None:
        assert digests() == want

    ours()
    best_ours, best_base = best_alternating(ours, baseline)
    rows = VinOfflineStoreReader(out).sample_index
    by_key = {r["sample_key"]: r["frames_sha256"] for r in rows}
    assert [by_key[s.sample_key] for s in samples] == want  # the same digests, both ways
    return [
        entry(
            "store_decode_check_vs_npz_load_sha256",
            best_ours,
            "np.load(npz)['frames'] + sha256 of the same trajectories",
            best_base,
            0.5,
            samples=n,
        )
    ]


def publish_gate_vs_store_build(workdir: Path) -> list[dict[str, Any]]:
    """The publication gate on a store already there (what a reused, re-published or resumed store
    costs: every file hashed, the content recomputed, every sample decoded) vs building that store
    from its upstream npz files as a build's store step does (the writer, then the same gate: no
    store is published without it). Warm page cache for both, alternating, best of 3."""
    from stage2_data.storage import StoreLocation
    from stage2_data.store.gate import publication_gate

    n = int(os.environ.get("BENCH_STORE_READ_TRAJ", "192"))
    samples, pairs, _ = make_upstream(workdir / "up", n, npy=False)
    built = workdir / "gate_store"
    VinOfflineWriter(built, profile=PROFILE, inputs=INPUTS, rows_per_shard=64).write(samples, pairs)
    reps = iter(range(1000))

    def ours() -> None:
        assert publication_gate(StoreLocation.parse(built)).passed

    def baseline() -> None:
        out = workdir / f"gate_build{next(reps)}"
        VinOfflineWriter(out, profile=PROFILE, inputs=INPUTS, rows_per_shard=64).write(samples, pairs)
        assert publication_gate(StoreLocation.parse(out)).passed

    ours()
    best_ours, best_base = best_alternating(ours, baseline)
    on_disk = sum(p.stat().st_size for p in built.rglob("*") if p.is_file())
    return [
        entry(
            "publish_gate_vs_store_build",
            best_ours,
            "building the same store (writer + the same gate)",
            best_base,
            0.3,
            samples=n,
            store_bytes_on_disk=on_disk,
            gate_MB_per_s=round(on_disk / 1e6 / best_ours, 1),
        )
    ]


_MEM_CHILD = r"""
import json, pickle, sys
from pathlib import Path
from stage2_data.store import VinOfflineWriter

def hwm_kib():
    # VmHWM: this process's peak RSS. Unlike ru_maxrss it starts afresh at exec (ru_maxrss keeps the
    # parent's high-water mark across fork+exec, which would hide the build's own peak).
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

a = pickle.loads(Path(sys.argv[1]).read_bytes())
before = hwm_kib()
VinOfflineWriter(Path(a["out"]), profile=a["profile"], inputs=a["inputs"], rows_per_shard=64).write(a["samples"], a["pairs"])
print(json.dumps({"peak_rss_kib": hwm_kib(), "before_kib": before}))
"""


def _peak_build(workdir: Path, samples: list[SampleSpec], pairs: list[PairSpec], tag: str) -> dict[str, int]:
    import pickle

    args = workdir / f"{tag}.pkl"
    args.write_bytes(
        pickle.dumps(
            {
                "out": str(workdir / f"store-{tag}"),
                "profile": PROFILE,
                "inputs": INPUTS,
                "samples": samples,
                "pairs": pairs,
            }
        )
    )
    out = subprocess.run(
        [sys.executable, "-c", _MEM_CHILD, str(args)], capture_output=True, text=True, cwd=REPO, check=True
    )
    doc: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def store_build_peak_memory(workdir: Path) -> list[dict[str, Any]]:
    n = int(os.environ.get("BENCH_STORE_MEM_TRAJ", "160"))
    samples, pairs, _ = make_upstream(workdir / "up", 4 * n, npy=False)
    small_pairs = [p for p in pairs if int(p.pair_id[1:]) < n - 1]
    t = time.perf_counter()
    small = _peak_build(workdir, samples[:n], small_pairs, "n")
    t_small = time.perf_counter() - t
    t = time.perf_counter()
    big = _peak_build(workdir, samples, pairs, "4n")
    t_big = time.perf_counter() - t
    growth = big["peak_rss_kib"] / small["peak_rss_kib"]
    return [
        {
            "name": "store_build_peak_memory",
            "ours_s": round(t_big, 4),
            "baseline": f"the same build with {n} trajectories (peak RSS)",
            "baseline_s": round(t_small, 4),
            "ratio": round(growth, 3),
            "target": 1.1,
            "meets_target": growth <= 1.1,
            "trajectories": [n, 4 * n],
            "peak_rss_MiB": [round(small["peak_rss_kib"] / 1024, 1), round(big["peak_rss_kib"] / 1024, 1)],
            "rss_before_build_MiB": [
                round(small["before_kib"] / 1024, 1),
                round(big["before_kib"] / 1024, 1),
            ],
            "note": "ratio = peak RSS at 4N / peak RSS at N (ours_s/baseline_s are the two build times)",
        }
    ]


BENCHMARKS = [
    store_build_vs_np_save,
    store_read_vs_npz_load,
    npz_load_vs_numpy,
    store_read_checksum_cost,
    store_decode_check_vs_npz_load_sha256,
    publish_gate_vs_store_build,
    store_build_peak_memory,
]
