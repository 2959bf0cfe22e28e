"""Tests of the immutable VIN offline store: real npz inputs, real zarr on disk, tensorstore interop."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore, WrapperStore

from stage2_data.errors import (
    DiskSpaceError,
    StoreError,
    StoreNotFoundError,
    StoreValidationError,
    StoreVersionError,
)
from stage2_data.store import (
    OFFLINE_DATASET_VERSION,
    SAMPLE_INDEX_FIELDS,
    STORE_FORMAT,
    PairSpec,
    SampleSpec,
    StoreInputError,
    VinOfflineDataset,
    VinOfflineStoreReader,
    VinOfflineWriter,
    check_free_space_for_store,
    collect_vin_offline_dataset_stats,
    estimate_store_bytes,
    merge_vin_offline_stores,
    pad_slack,
    raise_if_invalid,
    rebuild_command,
    store_fingerprint,
    validate_vin_offline_store,
)

PROFILE = {"name": "demo_v1", "repo_id": "org/processed_datasets", "revision": "a" * 40}
INPUTS = {"manifests/pairs.jsonl": "1" * 64, "archives/demo.tar": "2" * 64}
RES_A = (8, 10)
RES_B = (6, 12)


@dataclass
class Upstream:
    samples: list[SampleSpec]
    pairs: list[PairSpec]
    frames: dict[str, np.ndarray]
    actions: dict[str, np.ndarray | None]


def tid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


def frames_npz(
    path: Path, frames: np.ndarray, *, shape: Sequence[int] | None = None, num_frames: int | None = None
) -> Path:
    """A trajectory npz as upstream writes it (``frames``, ``shape``, ``num_frames``); ``shape`` and
    ``num_frames`` are the frames' own unless given (a bad input)."""
    np.savez_compressed(
        path,
        frames=frames,
        shape=np.array(frames.shape if shape is None else shape, dtype=np.int64),
        num_frames=np.int64(len(frames) if num_frames is None else num_frames),
    )
    return path


def make_upstream(root: Path, ids: Sequence[int], *, seed: int = 0) -> Upstream:
    """Trajectory npz files (two resolutions, T in 1..32) and sidecars of widths 7 and 9 (some none)."""
    rng = np.random.default_rng(seed)
    samples, frames, actions = [], {}, {}
    splits = ("train", "val", "test")
    for i in ids:
        key = tid(i)
        h, w = RES_A if i % 3 else RES_B
        t = int(rng.integers(1, 33)) if i % 5 else 32
        fr = rng.integers(0, 256, size=(t, h, w, 3), dtype=np.uint8)
        source = "autoeval" if i % 2 else "racer"
        fpath = root / "processed_datasets" / f"cache_{source}" / "frames" / f"trajectory_{key}.npz"
        fpath.parent.mkdir(parents=True, exist_ok=True)
        frames_npz(fpath, fr)
        sidecar: Path | None = None
        act: np.ndarray | None = None
        if i % 4 != 0:
            width = 7 if source == "autoeval" else 9
            act = rng.normal(size=(t, width))  # float64 upstream
            sidecar = root / "derived" / "action_sidecars" / source / f"trajectory_{key}.npz"
            sidecar.parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(
                sidecar,
                metadata_json=np.array(json.dumps({"source": source, "raw_width": width})),
                raw_actions=act,
                aligned_actions=act,
                source_indices=np.arange(t, dtype=np.int64),
                alignment_indices=np.arange(t, dtype=np.int64),
            )
        samples.append(
            SampleSpec(
                sample_key=key,
                cache_key=f"cache_{source}",
                source=source,
                task=f"task {i % 3}",
                quality_label=("successful", "suboptimal", "failure")[i % 3],
                partial_success=None if i % 7 == 0 else round(0.1 * (i % 10), 3),
                is_robot=True,
                split=splits[(i // 2) % 3],
                frames_path=fpath,
                sidecar_path=sidecar,
                action_status="recovered" if sidecar else "source_has_no_actions",
            )
        )
        frames[key] = fr
        actions[key] = act
    pairs = []
    by_split: dict[str, list[SampleSpec]] = {}
    for s in samples:
        by_split.setdefault(s.split, []).append(s)
    for sp, ss in sorted(by_split.items()):
        for k in range(len(ss) - 1):
            pid = f"p_{ss[k].sample_key[:8]}_{ss[k + 1].sample_key[:8]}"
            pairs.append(PairSpec(pid, sp, ss[k].task, ss[k].sample_key, ss[k + 1].sample_key))
    return Upstream(samples, pairs, frames, actions)


def build(out: Path, up: Upstream, **kw: Any) -> dict[str, Any]:
    kw.setdefault("rows_per_shard", 3)
    writer = VinOfflineWriter(
        out,
        profile=PROFILE,
        inputs=INPUTS,
        profile_path=out.parent / "profile.toml",
        data_root=out.parent / "data_root",
        **kw,
    )
    return writer.write(up.samples, up.pairs)


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ----- round trip ---------------------------------------------------------------------------------------
def test_round_trip_bytes_and_padding(store: Path, up: Upstream) -> None:
    reader = VinOfflineStoreReader(store)
    m = reader.manifest
    assert m["format"] == STORE_FORMAT and m["version"] == OFFLINE_DATASET_VERSION
    assert reader.num_samples == len(up.samples) == m["stats"]["samples"]
    assert [r["sample_index"] for r in reader.sample_index] == list(range(reader.num_samples))
    for i, row in enumerate(reader.sample_index):
        assert tuple(row) == SAMPLE_INDEX_FIELDS
        key = row["sample_key"]
        want = up.frames[key]
        got = reader.read_frames(i)
        assert got.dtype == np.uint8 and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        assert row["frames_sha256"] == hashlib.sha256(want.tobytes()).hexdigest()
        act = reader.read_actions(i)
        if up.actions[key] is None:
            assert act is None and row["action_width"] == 0
        else:
            exp = up.actions[key].astype(np.float32)
            assert act is not None and act.dtype == np.float32
            assert act.tobytes() == exp.tobytes()
            assert row["action_width"] == exp.shape[1]
        spec = next(s for s in up.samples if s.sample_key == key)
        assert (row["source"], row["task"], row["split"], row["partial_success"]) == (
            spec.source,
            spec.task,
            spec.split,
            spec.partial_success,
        )
        # padding, read straight from the shard arrays
        g = zarr.open_group(store / m["shards"][row["shard_id"]]["dir"], mode="r")
        t = row["num_frames"]
        assert not np.any(g["frames"][row["row"], t:])
        assert g["num_frames"][row["row"]] == t
        assert g["actions/width"][row["row"]] == row["action_width"]
        if "actions/aligned" in m["shards"][row["shard_id"]]["arrays"]:
            a = g["actions/aligned"][row["row"]]
            assert np.all(np.isnan(a[t:])) and np.all(np.isnan(a[:, row["action_width"] :]))
            assert not np.any(np.isnan(a[:t, : row["action_width"]]))
    assert validate_vin_offline_store(store) == []
    assert validate_vin_offline_store(store, deep=True) == []
    # ordinary permissions (readable by the training jobs of other users), not mkdtemp/mkstemp's 0700/0600
    umask = os.umask(0o022)
    os.umask(umask)
    assert store.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (store / "manifest.json").stat().st_mode & 0o777 == 0o666 & ~umask
    # splits: sorted int64, disjoint, union == all
    parts = [reader.split(s) for s in ("train", "val", "test")]
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)
    assert sorted(np.concatenate(parts).tolist()) == reader.split("all").tolist()
    # pairs point at the right samples
    keys = {p.pair_id: p for p in up.pairs}
    assert [p["pair_id"] for p in reader.pairs()] == sorted(keys)
    for p in reader.pairs():
        assert reader.sample_index[p["chosen_sample_index"]]["sample_key"] == keys[p["pair_id"]].chosen_key
        assert (
            reader.sample_index[p["rejected_sample_index"]]["sample_key"] == keys[p["pair_id"]].rejected_key
        )


def test_layout_one_resolution_per_shard_and_order(store: Path, up: Upstream) -> None:
    reader = VinOfflineStoreReader(store)
    rows = reader.sample_index
    # by cache directory, then resolution, then length (shards group similar lengths), then key
    order = [
        (r["cache_key"], (r["frame_height"], r["frame_width"]), r["num_frames"], r["sample_key"])
        for r in rows
    ]
    assert order == sorted(order)
    sizes_by_group: dict[tuple[str, tuple[int, int]], list[int]] = {}
    lengths_by_group: dict[tuple[str, tuple[int, int]], list[list[int]]] = {}
    for sh in reader.manifest["shards"]:
        mine = rows[sh["row_start"] : sh["row_start"] + sh["num_rows"]]
        groups = {(r["cache_key"], (r["frame_height"], r["frame_width"])) for r in mine}
        assert len(groups) == 1  # one cache directory, one resolution
        (group,) = groups
        hw = group[1]
        assert sh["frame_shape"] == [max(r["num_frames"] for r in mine), *hw, 3]
        assert sh["action_width_max"] == max(r["action_width"] for r in mine)
        sizes_by_group.setdefault(group, []).append(sh["num_rows"])
        g = zarr.open_group(store / sh["dir"], mode="r")
        assert g["frames"].shape == (sh["num_rows"], *sh["frame_shape"])
        # padding is bounded: no short sample is padded to a much longer one
        ts = [r["num_frames"] for r in mine]
        assert max(ts) - min(ts) <= pad_slack(min(ts))
        lengths_by_group.setdefault(group, []).append(ts)
    assert {hw for _key, hw in sizes_by_group} == {RES_A, RES_B}
    for group, sizes in sizes_by_group.items():
        assert all(1 <= s <= 3 for s in sizes)
        # a shard ends full, or where the next sample would break the padding bound
        shards_ts = lengths_by_group[group]
        for cur, nxt in zip(shards_ts, shards_ts[1:], strict=False):
            assert len(cur) == 3 or nxt[0] > cur[0] + pad_slack(cur[0])
    assert {b["name"]: b["materialized"] for b in reader.manifest["blocks"]} == {
        "frames": True,
        "num_frames": True,
        "actions/aligned": True,
        "actions/width": True,
    }


def test_fingerprint_identical_across_folders(tmp_path: Path, up: Upstream, store: Path) -> None:
    # the same inputs copied elsewhere, built into another folder: same fingerprint, same bytes
    up2_root = tmp_path / "elsewhere"
    shutil.copytree(Path(up.samples[0].frames_path).parents[3], up2_root)
    old_root = str(Path(up.samples[0].frames_path).parents[3])
    moved = Upstream(
        [
            replace(
                s,
                frames_path=Path(str(s.frames_path).replace(old_root, str(up2_root))),
                sidecar_path=Path(str(s.sidecar_path).replace(old_root, str(up2_root)))
                if s.sidecar_path
                else None,
            )
            for s in reversed(up.samples)  # input order must not matter either
        ],
        list(reversed(up.pairs)),
        up.frames,
        up.actions,
    )
    m2 = build(tmp_path / "other" / "store2", moved)
    m1 = json.loads((store / "manifest.json").read_text())
    assert m2["fingerprint"] == m1["fingerprint"]
    assert store_fingerprint(store) == m1["fingerprint"]
    assert store_fingerprint(tmp_path / "other" / "store2") == m2["fingerprint"]
    for sh1, sh2 in zip(m1["shards"], m2["shards"], strict=True):
        assert sh1["files"] == sh2["files"]
    # no time or path in any zarr.json
    for zj in store.rglob("zarr.json"):
        text = zj.read_text()
        assert str(store.parent) not in text and "/tmp" not in text
        assert not re.search(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}:\d{2}", text)
        assert json.loads(text)["attributes"] == {}


# ----- strict reader -------------------------------------------------------------------------------------
def test_version_refused_with_rebuild_command(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    m = json.loads((s / "manifest.json").read_text())
    m["version"] = 1
    (s / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreVersionError) as ei:
        VinOfflineStoreReader(s)
    msg = str(ei.value)
    assert f"Unsupported VIN offline store version: 1. Expected {OFFLINE_DATASET_VERSION}." in msg
    cmd = rebuild_command(s, m)
    assert cmd in msg and ei.value.fix is not None and cmd in ei.value.fix
    assert cmd.split()[:2] == ["stage2", "build"]
    assert f"--profile {store.parent / 'profile.toml'}" in cmd
    assert f"--data-root {store.parent / 'data_root'}" in cmd
    with pytest.raises(StoreVersionError):
        VinOfflineDataset(s)
    assert any("Unsupported VIN offline store version: 1" in p for p in validate_vin_offline_store(s))


def test_rebuild_command_infers_data_root_from_layout(tmp_path: Path) -> None:
    p = tmp_path / "dr" / "stores" / "demo_v1" / "0123456789abcdef"
    cmd = rebuild_command(p, {"format": STORE_FORMAT, "version": 0})
    assert cmd == f"stage2 build --profile PROFILE.toml --data-root {tmp_path / 'dr'}"


def test_rebuild_command_of_a_store_on_object_storage_names_its_recorded_data_root(tmp_path: Path) -> None:
    """A store on object storage, given as its location (what the reader and the table reads hold):
    the data root is the one its writer recorded, never one made of the bucket's name (QA saw
    `--data-root <cwd>/bucket1`), and the build writes to the same stores URL."""
    from stage2_data.storage import StoreLocation

    manifest = {"local": {"data_root": str(tmp_path / "dr"), "profile_path": str(tmp_path / "p.toml")}}
    want = f"stage2 build --profile {tmp_path / 'p.toml'} --data-root {tmp_path / 'dr'} --store-url "
    url = "s3://bucket1/stores/demo_v1/v2-0123456789abcdef"
    options = "  # with a --storage-option KEY=VALUE for each option you read it with"
    assert rebuild_command(url, manifest) == want + "s3://bucket1/stores" + options
    loc = StoreLocation.parse("memory://bucket1/stores/demo_v1/v2-0123456789abcdef")
    assert rebuild_command(loc, manifest) == want + loc.url.rsplit("/", 2)[0] + options
    assert "bucket1/stores/demo_v1" in loc.url and not loc.is_local


def test_missing_manifest_is_refused(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    (s / "manifest.json").unlink()
    with pytest.raises(StoreNotFoundError) as ei:
        VinOfflineStoreReader(s)
    assert isinstance(ei.value, FileNotFoundError)
    assert str(s) in str(ei.value) and "incomplete or not a store" in str(ei.value)
    with pytest.raises(FileNotFoundError):
        VinOfflineDataset(tmp_path / "nowhere")
    assert validate_vin_offline_store(s) == [f"{s / 'manifest.json'}: missing (incomplete or not a store)"]


# ----- validation ----------------------------------------------------------------------------------------
def test_validate_gathers_all_problems(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    (s / "splits" / "val.npy").unlink()
    # wrong dtype: shard 0's num_frames rewritten as int64
    st = LocalStore(s / "shards" / "shard-000000")
    old = zarr.open_array(st, path="num_frames", mode="r")[...]
    zarr.create_array(st, name="num_frames", data=old.astype(np.int64), overwrite=True)
    # duplicate sample key
    lines = (s / "sample_index.jsonl").read_text().splitlines()
    r0, r1 = json.loads(lines[0]), json.loads(lines[1])
    r1["sample_key"] = r0["sample_key"]
    lines[1] = json.dumps(r1)
    (s / "sample_index.jsonl").write_text("\n".join(lines) + "\n")

    problems = validate_vin_offline_store(s)
    joined = "\n".join(problems)
    assert "val.npy: missing split file" in joined
    assert "shard-000000/num_frames: dtype int64; expected int32" in joined
    assert f"duplicate sample keys ['{r0['sample_key']}']" in joined
    with pytest.raises(StoreValidationError) as ei:
        raise_if_invalid(s)
    assert len(ei.value.problems) == len(problems) >= 3
    # read-only: validation wrote nothing
    assert not (s / "splits" / "val.npy").exists()


def test_validation_finds_flipped_byte(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    shard_file = s / "shards" / "shard-000001" / "frames" / "c" / "0" / "0" / "0" / "0" / "0"
    data = bytearray(shard_file.read_bytes())
    data[len(data) // 3] ^= 0x01
    shard_file.write_bytes(bytes(data))
    # same size: the chunk's crc32c sees it (plain validation; tests/test_store_integrity.py), and so
    # does the deep check's sha256
    plain = validate_vin_offline_store(s)
    assert len(plain) == 1 and str(shard_file) in plain[0] and "crc32c" in plain[0], plain
    deep = validate_vin_offline_store(s, deep=True)
    assert any(str(shard_file) in p and "sha256" in p for p in deep)
    assert any("fingerprint" in p for p in deep)


# ----- atomic publication --------------------------------------------------------------------------------
def test_interrupted_writer_leaves_previous_store(tmp_path: Path, up: Upstream, store: Path) -> None:
    out = copy_store(store, tmp_path / "store")
    before = json.loads((out / "manifest.json").read_text())
    seen: list[Path] = []

    def boom(n: int) -> None:
        staging = [p for p in tmp_path.iterdir() if p.name.startswith(".store.tmp-")]
        assert len(staging) == 1
        seen.append(staging[0])
        with pytest.raises(StoreNotFoundError):  # a half store is never accepted
            VinOfflineStoreReader(staging[0])
        assert VinOfflineStoreReader(out).manifest["fingerprint"] == before["fingerprint"]
        raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        build(out, up, progress=boom)
    assert seen and not seen[0].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    assert json.loads((out / "manifest.json").read_text()) == before
    assert validate_vin_offline_store(out, deep=True) == []


def test_rebuild_replaces_existing_store(tmp_path: Path, up: Upstream) -> None:
    out = tmp_path / "store"
    build(out, up)
    reader = VinOfflineStoreReader(out)
    m = build(out, up, rows_per_shard=5)
    assert (
        VinOfflineStoreReader(out).manifest["fingerprint"]
        == m["fingerprint"]
        != reader.manifest["fingerprint"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


# ----- merge ---------------------------------------------------------------------------------------------
def test_merge_equals_fresh_build_and_keeps_base(tmp_path: Path) -> None:
    base_up = make_upstream(tmp_path / "u1", range(1, 11), seed=1)
    side_up = make_upstream(tmp_path / "u2", range(20, 27), seed=2)
    base = tmp_path / "base"
    side = tmp_path / "side"
    build(base, base_up)
    build(side, side_up, rows_per_shard=2)
    base_files = {
        p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (base / "shards").rglob("*") if p.is_file()
    }

    merged = tmp_path / "merged"
    mm = merge_vin_offline_stores(base, side, merged)
    assert validate_vin_offline_store(merged, deep=True) == []
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in base_files} == base_files
    assert validate_vin_offline_store(base, deep=True) == []
    nb = len(json.loads((base / "manifest.json").read_text())["shards"])
    assert [s["id"] for s in mm["shards"]] == list(range(len(mm["shards"])))
    assert len(mm["shards"]) == nb + len(json.loads((side / "manifest.json").read_text())["shards"])

    union = Upstream(
        base_up.samples + side_up.samples,
        base_up.pairs + side_up.pairs,
        {**base_up.frames, **side_up.frames},
        {**base_up.actions, **side_up.actions},
    )
    fresh = tmp_path / "fresh"
    build(fresh, union)
    rm, rf = VinOfflineStoreReader(merged), VinOfflineStoreReader(fresh)
    assert rm.num_samples == rf.num_samples == 17
    skip = {"sample_index", "shard_id", "row"}
    fresh_by_key = {r["sample_key"]: i for i, r in enumerate(rf.sample_index)}
    for i, row in enumerate(rm.sample_index):
        j = fresh_by_key[row["sample_key"]]
        assert {k: v for k, v in row.items() if k not in skip} == {
            k: v for k, v in rf.sample_index[j].items() if k not in skip
        }
        assert rm.read_frames(i).tobytes() == rf.read_frames(j).tobytes()
        a, b = rm.read_actions(i), rf.read_actions(j)
        assert (a is None and b is None) or (a is not None and b is not None and a.tobytes() == b.tobytes())

    def pairs_by_key(r: VinOfflineStoreReader) -> list[tuple[str, ...]]:
        return [
            (
                p["pair_id"],
                p["split"],
                p["task"],
                r.sample_index[p["chosen_sample_index"]]["sample_key"],
                r.sample_index[p["rejected_sample_index"]]["sample_key"],
            )
            for p in r.pairs()
        ]

    assert pairs_by_key(rm) == pairs_by_key(rf)
    for sp in ("train", "val", "test"):
        assert sorted(rm.sample_index[i]["sample_key"] for i in rm.split(sp)) == sorted(
            rf.sample_index[i]["sample_key"] for i in rf.split(sp)
        )
    assert mm["stats"]["per_split"] == rf.manifest["stats"]["per_split"]


def test_merge_refusals(tmp_path: Path) -> None:
    base_up = make_upstream(tmp_path / "u1", range(1, 8), seed=1)
    base = tmp_path / "base"
    build(base, base_up)
    # overlapping keys
    over = make_upstream(tmp_path / "u2", range(5, 10), seed=1)
    side = tmp_path / "side"
    build(side, over)
    with pytest.raises(StoreInputError) as ei:
        merge_vin_offline_stores(base, side, tmp_path / "m")
    assert "sample keys are in both stores" in str(ei.value) and tid(5) in str(ei.value)
    # another profile repo
    other = make_upstream(tmp_path / "u3", range(30, 34), seed=3)
    side2 = tmp_path / "side2"
    VinOfflineWriter(side2, profile={**PROFILE, "repo_id": "org/other"}, inputs=INPUTS).write(
        other.samples, other.pairs
    )
    with pytest.raises(StoreInputError, match="profile repo differs"):
        merge_vin_offline_stores(base, side2, tmp_path / "m")
    # another version
    side3 = copy_store(side2, tmp_path / "side3")
    m = json.loads((side3 / "manifest.json").read_text())
    m["version"] = OFFLINE_DATASET_VERSION + 1
    (side3 / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreVersionError):
        merge_vin_offline_stores(base, side3, tmp_path / "m")
    with pytest.raises(StoreError, match="immutable"):
        merge_vin_offline_stores(base, side, base)
    assert not (tmp_path / "m").exists()
    assert validate_vin_offline_store(base, deep=True) == []


# ----- interop -------------------------------------------------------------------------------------------
def test_interop_zarr_and_tensorstore(store: Path) -> None:
    ts = pytest.importorskip("tensorstore")
    m = json.loads((store / "manifest.json").read_text())
    n_arrays = 0
    for sh in m["shards"]:
        g = zarr.open_group(store / sh["dir"], mode="r")
        assert sorted(g.array_keys()) == ["frames", "num_frames"]
        assert sorted(g["actions"].array_keys()) == sorted(
            a.split("/")[1] for a in sh["arrays"] if a.startswith("actions/")
        )
        for name in sh["arrays"]:
            via_zarr = np.asarray(g[name][...])
            t = ts.open(
                {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(store / sh["dir"] / name)}},
                read=True,
            ).result()
            via_ts = t.read().result()
            assert via_ts.dtype == via_zarr.dtype and via_ts.shape == via_zarr.shape
            assert via_ts.tobytes() == via_zarr.tobytes()
            n_arrays += 1
    assert n_arrays >= 4 * len(m["shards"]) - 1


# ----- dataset -------------------------------------------------------------------------------------------
def test_dataset_per_split(store: Path, up: Upstream) -> None:
    total = 0
    for sp in ("train", "val", "test"):
        ds = VinOfflineDataset(store, split=sp)
        want = sorted(s.sample_key for s in up.samples if s.split == sp)
        assert len(ds) == len(want)
        got = []
        for i in range(len(ds)):
            item = ds[i]
            assert item["split"] == sp
            assert item["frames"].shape == up.frames[item["sample_key"]].shape
            assert item["actions"].dtype == np.float32 and item["actions"].shape[0] == item["num_frames"]
            assert item["actions"].shape[1] == item["action_width"]
            got.append(item["sample_key"])
        assert sorted(got) == want
        assert ds[-1]["sample_key"] == got[-1]
        with pytest.raises(IndexError):
            ds[len(ds)]
        total += len(ds)
    assert len(VinOfflineDataset(store)) == total == len(up.samples)


def test_reader_pickles_for_worker_processes(store: Path) -> None:
    import pickle

    ds = VinOfflineDataset(store, split="train")
    first = ds[0]["frames"]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.reader._groups == {}
    assert clone[0]["frames"].tobytes() == first.tobytes()


# ----- estimates and stats -------------------------------------------------------------------------------
def test_estimate_matches_manifest(store: Path, up: Upstream) -> None:
    est = estimate_store_bytes(up.samples + up.samples[:2])  # duplicates count once
    m = json.loads((store / "manifest.json").read_text())
    payload = m["stats"]["payload_bytes"]
    assert est == payload
    stored = m["stats"]["stored_bytes_uncompressed"]
    assert stored["frames"] >= est["frames"] and stored["total"] < 3 * est["total"]
    no_act = estimate_store_bytes(up.samples, include_actions=False)
    assert no_act["actions/aligned"] == 0 and no_act["frames"] == est["frames"]
    check_free_space_for_store(store, est)
    with pytest.raises(DiskSpaceError):
        check_free_space_for_store(store, {"total": 1 << 62})


def test_stats(store: Path, up: Upstream) -> None:
    st = collect_vin_offline_dataset_stats(store)
    assert st["samples"] == len(up.samples)
    assert st["pairs"] == len(up.pairs)
    assert st["per_split"] == {sp: sum(s.split == sp for s in up.samples) for sp in ("train", "val", "test")}
    assert st["per_source"] == {"autoeval": 7, "racer": 7}
    assert st["with_actions"] == sum(a is not None for a in up.actions.values())
    nfs = [f.shape[0] for f in up.frames.values()]
    assert st["frames_per_sample"] == {"min": min(nfs), "mean": sum(nfs) / len(nfs), "max": max(nfs)}
    on_disk = st["bytes"]["on_disk"]
    assert on_disk["frames"] > 0 and on_disk["frames"] == st["bytes"]["compressed_in_manifest"]["frames"]
    assert st["bytes"]["stored_uncompressed"]["frames"] >= st["bytes"]["payload_uncompressed"]["frames"]


# ----- random access -------------------------------------------------------------------------------------
class CountingStore(WrapperStore[LocalStore]):
    """Records every get (key, byte range) that reaches the local store."""

    def __init__(self, store: LocalStore, log: list[tuple[str, Any]] | None = None) -> None:
        super().__init__(store)
        self.log: list[tuple[str, Any]] = log if log is not None else []

    def _with_store(self, store: LocalStore) -> CountingStore:
        return type(self)(store, self.log)

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        buf = await self._store.get(key, prototype, byte_range)
        self.log.append((key, byte_range, 0 if buf is None else len(buf)))
        return buf

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> Any:
        key_ranges = list(key_ranges)
        out = await self._store.get_partial_values(prototype, key_ranges)
        for (k, r), b in zip(key_ranges, out, strict=True):
            self.log.append((k, r, 0 if b is None else len(b)))
        return out


def test_random_access_reads_only_its_chunk(store: Path) -> None:
    log: list[tuple[str, Any, int]] = []
    file_reads: list[tuple[Path, int, int]] = []

    class CountingReader(VinOfflineStoreReader):
        def _open_store(self, shard_dir: Path) -> Any:
            return CountingStore(LocalStore(shard_dir, read_only=True), log)

        def _read_into(self, path: Path, offset: int, buffers: Any) -> None:
            file_reads.append((path, offset, sum(memoryview(b).nbytes for b in buffers)))
            super()._read_into(path, offset, buffers)

    reader = CountingReader(store)
    # a sample in the middle of a full shard
    i = next(
        k
        for k, r in enumerate(reader.sample_index)
        if r["row"] == 1 and reader.manifest["shards"][r["shard_id"]]["num_rows"] == 3
    )
    row = reader.sample_index[i]
    sh = reader.manifest["shards"][row["shard_id"]]
    frames = reader.read_frames(i)
    shard_file = store / sh["dir"] / "frames" / "c" / "0" / "0" / "0" / "0" / "0"
    raw = shard_file.read_bytes()
    # the shard index (end of file): R entries of (offset, nbytes) uint64 + crc32c
    nidx = 16 * sh["num_rows"] + 4
    index = np.frombuffer(raw[-nidx:-4], dtype="<u8").reshape(-1, 2)
    off, nbytes = (int(x) for x in index[row["row"]])
    # zarr read only metadata; the data came from two ranged reads: the index, then this row's chunk
    assert {k for k, _, _ in log} <= {"zarr.json", "frames/zarr.json"}
    assert file_reads == [(shard_file, len(raw) - nidx, nidx), (shard_file, off, nbytes)]
    assert frames.tobytes() == VinOfflineStoreReader(store).read_frames(i).tobytes()
    g = zarr.open_group(store / sh["dir"], mode="r")  # zarr's own path gives the same bytes
    assert frames.tobytes() == g["frames"][row["row"], : row["num_frames"]].tobytes()
    # a second sample of the same shard: no metadata, no index read again: only its own chunk
    log.clear()
    file_reads.clear()
    reader.read_frames(i + 1)
    off2, nbytes2 = (int(x) for x in index[row["row"] + 1])
    assert log == []
    assert file_reads == [(shard_file, off2, nbytes2)]


def test_corrupt_shard_index_is_refused(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    shard_file = s / "shards" / "shard-000000" / "frames" / "c" / "0" / "0" / "0" / "0" / "0"
    data = bytearray(shard_file.read_bytes())
    data[-10] ^= 0xFF  # inside the index
    shard_file.write_bytes(bytes(data))
    with pytest.raises(StoreError) as ei:
        VinOfflineStoreReader(s).read_frames(0)
    assert str(shard_file) in str(ei.value) and "crc32c" in str(ei.value)


# ----- bad inputs ----------------------------------------------------------------------------------------
def test_bad_inputs_are_gathered_and_named(tmp_path: Path, up: Upstream) -> None:
    bad_dtype = frames_npz(tmp_path / "bad_dtype.npz", np.zeros((2, 4, 4, 3), np.float32))
    bad_shape = frames_npz(
        tmp_path / "bad_shape.npz", np.zeros((2, 4, 4, 3), np.uint8), shape=(3, 4, 4, 3), num_frames=3
    )
    obj = tmp_path / "object.npz"
    np.savez(obj, frames=np.array([object()], dtype=object), shape=np.array([1]), num_frames=np.int64(1))
    s0, s1, s2, s3 = up.samples[:4]
    samples = [
        replace(s0, frames_path=bad_dtype),
        replace(s1, frames_path=bad_shape),
        replace(s2, frames_path=obj),
        s3,
        replace(s3, task="another task"),  # same key, different data
    ]
    pairs = [
        PairSpec("x1", "train", "t", s3.sample_key, s0.sample_key),
        PairSpec("x2", "val", "t", s3.sample_key, s1.sample_key),  # leakage of s3
        PairSpec("x3", "train", "t", s3.sample_key, "missing-key"),
    ]
    with pytest.raises(StoreInputError) as ei:
        VinOfflineWriter(tmp_path / "out", profile=PROFILE, inputs=INPUTS).write(samples, pairs)
    msg = str(ei.value)
    assert f"{bad_dtype}: 'frames' has dtype float32; expected uint8" in msg
    assert f"{bad_shape}: 'shape' says (3, 4, 4, 3)" in msg
    assert str(obj) in msg
    assert f"sample {s3.sample_key!r} appears twice with different data (fields task)" in msg
    assert f"split leakage: trajectory {s3.sample_key!r}" in msg
    assert "'missing-key' is not among the samples" in msg
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_writer_arguments_checked_up_front(tmp_path: Path) -> None:
    (tmp_path / "notastore").mkdir()
    (tmp_path / "notastore" / "precious.txt").write_text("keep me")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreInputError) as ei:
        VinOfflineWriter(
            tmp_path / "notastore", profile={"name": "x"}, inputs={"/abs/path": "zz"}, rows_per_shard=0
        )
    msg = str(ei.value)
    for needle in (
        "rows_per_shard must be a positive integer",
        "profile['repo_id']",
        "absolute path",
        "is not a 64-hex",
        "not a VIN offline store; refusing to replace",
    ):
        assert needle in msg
    with pytest.raises(StoreInputError, match="cannot create"):
        VinOfflineWriter(tmp_path / "afile" / "sub" / "store", profile=PROFILE, inputs=INPUTS)
    assert (tmp_path / "notastore" / "precious.txt").read_text() == "keep me"


def test_without_actions(tmp_path: Path, up: Upstream) -> None:
    out = tmp_path / "noact"
    m = build(out, up, include_actions=False, rows_per_shard=64)
    assert {b["name"]: b["materialized"] for b in m["blocks"]}["actions/aligned"] is False
    assert m["options"] == {"include_actions": False, "rows_per_shard": 64, "max_frames": 32}
    per_res = [sum(1 for f in up.frames.values() if f.shape[1:3] == r) for r in (RES_B, RES_A)]
    by_res: dict[tuple[int, ...], int] = {}
    for sh in m["shards"]:  # shards of one resolution split by length only (64 rows fit)
        by_res[tuple(sh["frame_shape"][1:3])] = by_res.get(tuple(sh["frame_shape"][1:3]), 0) + sh["num_rows"]
    assert list(by_res) == [RES_B, RES_A]  # (6, 12) sorts before (8, 10)
    assert list(by_res.values()) == per_res
    assert not list(out.rglob("aligned"))
    reader = VinOfflineStoreReader(out)
    assert all(reader.read_actions(i) is None for i in range(reader.num_samples))
    assert validate_vin_offline_store(out, deep=True) == []
    # a stored store directory has no leftover temporary folders
    assert sorted(os.listdir(tmp_path)) == ["noact"]


def test_a_corrupt_deflate_stream_is_a_named_problem(tmp_path: Path, up: Upstream) -> None:
    """A frames npz whose zip directory and npy header are intact but whose deflate data is not:
    the header inspection passes, loading the frames fails; a named problem, never zlib.error."""
    import zipfile

    src = up.samples[0].frames_path
    bad = tmp_path / "corrupt.npz"
    data = bytearray(Path(src).read_bytes())
    with zipfile.ZipFile(src) as z:
        info = z.getinfo("frames.npy")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for i in range(start + info.compress_size // 2, start + info.compress_size - 8):
        data[i] ^= 0x5A  # the back half of the stream: the npy header inflates, the frames do not
    bad.write_bytes(bytes(data))
    samples = [replace(up.samples[0], frames_path=bad), *up.samples[1:]]
    with pytest.raises(StoreInputError) as ei:
        VinOfflineWriter(tmp_path / "out", profile=PROFILE, inputs=INPUTS).write(samples, up.pairs)
    assert f"{bad}: unreadable frames npz (" in str(ei.value), str(ei.value)
    assert not (tmp_path / "out").exists()


def test_fingerprint_does_not_depend_on_blosc_threads(tmp_path: Path) -> None:
    """Blosc's output for a compressible chunk depends on its thread count when it compresses with
    its own threads (``numcodecs.blosc.use_threads``, ``set_nthreads``: process-wide settings another
    library may change). The writer compresses single-threaded whatever they say, so the same
    inputs give the same bytes on a machine with any number of cores."""
    import numcodecs.blosc

    rng = np.random.default_rng(3)
    up = make_upstream(tmp_path / "up", range(6))
    samples = []
    for s in up.samples:  # compressible frames of 1 MiB+ a chunk (Blosc splits them into blocks)
        t = len(up.frames[s.sample_key])  # the sidecars' length
        fr = rng.integers(0, 4, size=(t, 96, 128, 3), dtype=np.uint8)
        samples.append(replace(s, frames_path=frames_npz(tmp_path / f"{s.sample_key}.npz", fr)))
    up = Upstream(samples, up.pairs, {}, up.actions)
    saved = (numcodecs.blosc.use_threads, numcodecs.blosc.get_nthreads())
    try:
        numcodecs.blosc.use_threads, _ = False, numcodecs.blosc.set_nthreads(1)
        one = build(tmp_path / "one", up)["fingerprint"]
        numcodecs.blosc.use_threads, _ = True, numcodecs.blosc.set_nthreads(4)
        four = build(tmp_path / "four", up)["fingerprint"]
    finally:
        numcodecs.blosc.use_threads = saved[0]
        numcodecs.blosc.set_nthreads(saved[1])
    assert one == four
