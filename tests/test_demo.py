"""The deterministic demo generator (stage2_data/demo/): formats, determinism, exact totals."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import uuid
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pytest

from stage2_data.demo import (
    MARKER_NAME,
    QUARANTINED_ARCHIVE,
    SPLIT_CACHE_KEY,
    DemoPaths,
    generate_demo,
    generator,
    main,
    repin_profile,
    write_sidecar_sha256,
)
from stage2_data.demo.hubserver.repository import HUB_MARKER
from stage2_data.errors import Stage2Error
from stage2_data.formats.npz import ZIP_DATE_TIME, npz_bytes
from stage2_data.formats.sha256sums import parse_sha256sums, read_single_sha256_file
from stage2_data.hashing import sha256_file
from stage2_data.layout import FRAMES_PATH_RE, SIDECAR_PATH_RE, split_base
from stage2_data.profile import Profile, load_profile

ARROW_COLUMNS = {
    "id": pa.string(),
    "task": pa.string(),
    "data_source": pa.string(),
    "frames": pa.string(),
    "is_robot": pa.bool_(),
    "quality_label": pa.string(),
    "partial_success": pa.float32(),
    "num_frames": pa.int64(),
}
SIDECAR_KEYS = {"metadata_json", "raw_actions", "aligned_actions", "source_indices", "alignment_indices"}
RACER_NAMES = ["x", "y", "z", "qx", "qy", "qz", "qw", "gripper_open", "ignore_collision"]


# ---- helpers -----------------------------------------------------------------------------------
class _Concat(io.RawIOBase):
    """Read several files as one stream (the split RoboArena tar), without loading them."""

    def __init__(self, paths: list[Path]) -> None:
        self._files = [open(p, "rb") for p in paths]  # noqa: SIM115
        self._i = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self._i < len(self._files):
            n = self._files[self._i].readinto(b)
            if n:
                return n
            self._i += 1
        return 0

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def _open_archive(demo: DemoPaths, paths: list[str]) -> tarfile.TarFile:
    files = [demo.upstream / p for p in sorted(paths)]
    if len(files) == 1:
        return tarfile.open(files[0], mode="r:")
    stream: BinaryIO = io.BufferedReader(_Concat(files))  # type: ignore[arg-type]
    return tarfile.open(fileobj=stream, mode="r|")


def _cache_key_of_member(name: str) -> tuple[str, str]:
    parts = name.rstrip("/").split("/")
    if parts[0] == "processed_datasets":
        parts = parts[1:] or ["", "<prefix>"]
    return parts[0], "/".join(parts[1:])


def _scan_cache_dirs(demo: DemoPaths, prof: Profile, *, full: bool = False) -> dict[str, dict[str, Any]]:
    """Stream every active archive once; collect per cache key what the tests look at."""
    out: dict[str, dict[str, Any]] = {}
    for key, specs in prof.archives_by_cache_key().items():
        info: dict[str, Any] = {"frames": {}, "arrow": [], "dirs": set(), "names": [], "json": {}}
        with _open_archive(demo, [a.path for a in specs]) as tf:
            for m in tf:
                info["names"].append(m.name)
                assert m.uid == 0 and m.gid == 0 and m.uname == "" and m.gname == "", m.name
                assert m.mtime == info.setdefault("mtime", m.mtime)
                k, rel = _cache_key_of_member(m.name)
                if m.isdir():
                    info["dirs"].add(rel)
                    assert m.mode == 0o755
                    continue
                assert m.isfile() and m.mode == 0o644, m.name
                assert k == key, f"{m.name} is not under cache key {key}"
                f = tf.extractfile(m)
                assert f is not None
                data = f.read()
                if rel.startswith("frames/"):
                    info["frames"][rel] = (hashlib.sha256(data).hexdigest(), None if full else data)
                elif rel.endswith(".arrow"):
                    info["arrow"].append((rel, data))
                elif rel.endswith(".json"):
                    info["json"][rel] = json.loads(data)
                info["layout"] = "prefixed" if m.name.startswith("processed_datasets/") else "bare"
        out[key] = info
    return out


def _arrow_rows(info: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _rel, data in sorted(info["arrow"]):
        with pa.ipc.open_stream(io.BytesIO(data)) as reader:
            rows += reader.read_all().to_pylist()
    return rows


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _load_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _action_rows(demo: DemoPaths, prof: Profile) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for p in sorted(prof.kit_file("action_manifest_dir").glob("*.jsonl")):
        for r in _jsonl(p):
            assert r["source"] == p.stem
            rows.append(r)
    return rows


def _sidecar_members(prof: Profile) -> dict[str, bytes]:
    with tarfile.open(prof.kit_file("sidecar_archive"), mode="r:") as tf:
        out = {}
        for m in tf:
            if m.isfile():
                f = tf.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
        return out


# ---- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoPaths:
    return generate_demo(tmp_path_factory.mktemp("demo") / "out")


@pytest.fixture(scope="module")
def prof(demo: DemoPaths) -> Profile:
    return load_profile(demo.profile)


@pytest.fixture(scope="module")
def scan(demo: DemoPaths, prof: Profile) -> dict[str, dict[str, Any]]:
    return _scan_cache_dirs(demo, prof)


# ---- tests -------------------------------------------------------------------------------------
def test_npz_bytes_equal_zipfile_output() -> None:
    """The hand-written npz records are exactly what zipfile + numpy write (fixed timestamp)."""
    rng = np.random.default_rng(0)
    arrays = [
        ("frames", rng.integers(0, 4, size=(5, 48, 64, 3), dtype=np.uint8)),  # > 32 KiB: full window
        ("shape", np.asarray([5, 48, 64, 3], dtype=np.int64)),
        ("num_frames", np.asarray(5, dtype=np.int64)),
        ("metadata_json", np.array(json.dumps({"source": "racer", "note": "é"}))),
        ("raw_actions", rng.standard_normal((7, 9)).astype(np.float32)[:, ::2]),  # not C-contiguous
    ]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, arr in arrays:
            info = zipfile.ZipInfo(key + ".npy", date_time=ZIP_DATE_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3
            info.external_attr = 0o600 << 16
            with zf.open(info, "w") as f:
                np.lib.format.write_array(f, arr if arr.ndim == 0 else np.ascontiguousarray(arr))
    data = npz_bytes(arrays)
    assert data == buf.getvalue()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        assert all(i.date_time == ZIP_DATE_TIME for i in zf.infolist())
    z = _load_npz(data)
    for key, arr in arrays:
        np.testing.assert_array_equal(z[key], arr)
        assert z[key].dtype == arr.dtype and z[key].shape == arr.shape


def test_byte_identical_twice(demo: DemoPaths, tmp_path: Path) -> None:
    again = generate_demo(tmp_path / "again")
    a, b = _tree_digest(demo.root), _tree_digest(again.root)
    assert a == b
    assert len(a) > 20
    assert again.revision == demo.revision
    # a demo of another generator version is replaced by a fresh one, identical again
    marker = again.root / MARKER_NAME
    marker.write_text(marker.read_text().replace('"generator_version": ', '"generator_version": 1000'))
    (again.upstream / "README.md").write_text("stale")
    assert generate_demo(again.root) == again
    assert _tree_digest(again.root) == a
    assert not [p.name for p in tmp_path.iterdir() if p.name != "again"], "staging folders left behind"
    # the revision is a pure function of the upstream files (the folder's declaration of what it
    # mirrors is none of them: it names that revision)
    files = [p for p in sorted(demo.upstream.iterdir()) if p.name != HUB_MARKER]
    lines = "".join(f"{p.name}\0{sha256_file(p)}\n" for p in files)
    assert hashlib.sha1(lines.encode()).hexdigest() == demo.revision
    assert json.loads((demo.upstream / HUB_MARKER).read_text())["revision"] == demo.revision


def test_paths_and_idempotence(demo: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A complete demo is returned as it is (how fast: bench_demo.demo_regenerate_vs_generate)."""
    assert demo.upstream == demo.root / "upstream" and demo.kit_root == demo.root / "kit"
    assert demo.profile == demo.kit_root / "profile.toml" and demo.repo_id == "robometer/processed_datasets"
    marker = demo.root / MARKER_NAME
    before = marker.stat().st_mtime_ns
    with monkeypatch.context() as m:
        m.setattr(generator, "_generate_into", lambda *a: pytest.fail("a complete demo was generated again"))
        assert generate_demo(demo.root) == demo
    assert marker.stat().st_mtime_ns == before
    # a demo made before its upstream folder declared what it mirrors gets the declaration
    (demo.upstream / HUB_MARKER).unlink()
    with monkeypatch.context() as m:
        m.setattr(generator, "_generate_into", lambda *a: pytest.fail("a complete demo was generated again"))
        assert generate_demo(demo.root) == demo
    assert json.loads((demo.upstream / HUB_MARKER).read_text())["revision"] == demo.revision
    assert not list(demo.root.parent.glob(".out.*")), "a staging folder was left behind"
    # a folder that is not a demo is never replaced
    other = tmp_path / "mine"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(Stage2Error, match="not a demo folder"):
        generate_demo(other)
    assert (other / "precious.txt").read_text() == "keep me"


def test_size_under_50mb(demo: DemoPaths) -> None:
    total = sum(p.stat().st_size for p in demo.root.rglob("*") if p.is_file())
    assert total < 50 * 1024 * 1024


def test_profile_pins_match_upstream(demo: DemoPaths, prof: Profile) -> None:
    assert prof.name == "stage2_core_v1_demo"
    assert prof.source.repo_id == demo.repo_id and prof.source.revision == demo.revision
    assert prof.source.repo_type == "dataset"
    assert len(prof.archives) == prof.expected.archives == 14
    assert len(prof.cache_keys()) == prof.expected.cache_dirs == 13
    for a in prof.archives:
        f = demo.upstream / a.path
        assert a.size == f.stat().st_size, a.path
        assert a.sha256 == sha256_file(f), a.path
        assert split_base(a.path) == f"{a.cache_key}.tar"
    assert sorted(a.path for a in prof.archives if a.cache_key == SPLIT_CACHE_KEY) == [
        f"{SPLIT_CACHE_KEY}.tar.part-aa",
        f"{SPLIT_CACHE_KEY}.tar.part-ab",
    ]
    assert prof.quarantined_paths() == {QUARANTINED_ARCHIVE} and prof.quarantined[0].reason
    assert (demo.upstream / QUARANTINED_ARCHIVE).is_file()
    named = set(prof.archive_paths()) | prof.quarantined_paths()
    unnamed = {p.name for p in demo.upstream.iterdir()} - named
    assert {"README.md", "some_other_dataset.tar", HUB_MARKER} <= unnamed
    for key in ("pair_manifest", "subset_checksums", "action_manifest_dir", "sidecar_archive"):
        assert prof.kit_file(key).exists(), key
    assert prof.expected.action_width_by_source == {
        "autoeval": 7,
        "libero_success": 7,
        "roboarena": 8,
        "racer": 9,
    }


def test_every_tar_opens_and_both_layouts(demo: DemoPaths, prof: Profile, scan: dict[str, Any]) -> None:
    for extra in (QUARANTINED_ARCHIVE, "some_other_dataset.tar"):
        with tarfile.open(demo.upstream / extra) as tf:
            assert tf.getmembers()
    layouts = {info["layout"] for info in scan.values()}
    assert layouts == {"prefixed", "bare"}
    for key, info in scan.items():
        assert {"", "frames", "processed_dataset"} <= info["dirs"], key
        assert info["names"] == sorted(info["names"], key=lambda n: n.rstrip("/")), f"{key}: unsorted members"
    # one cache key has two arrow shards
    assert max(len(info["arrow"]) for info in scan.values()) == 2


def test_split_roboarena(demo: DemoPaths) -> None:
    aa = demo.upstream / f"{SPLIT_CACHE_KEY}.tar.part-aa"
    ab = demo.upstream / f"{SPLIT_CACHE_KEY}.tar.part-ab"
    whole = aa.read_bytes() + ab.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(whole)) as tf:
        members = tf.getmembers()
        offsets = [m.offset for m in members] + [m.offset_data for m in members]
        for m in members:
            if m.isfile():
                assert tf.extractfile(m).read()  # type: ignore[union-attr]
    cut = aa.stat().st_size
    assert cut % 512 != 0 and cut not in offsets, "the cut must not fall on a member boundary"
    assert any(m.offset_data < cut < m.offset_data + m.size for m in members), "cut inside a member's data"
    # the second part alone does not start with a tar header
    with pytest.raises(tarfile.ReadError), tarfile.open(ab, mode="r:"):
        pass
    # the first part alone is a truncated tar: reading it through fails, and it has no end marker
    with pytest.raises(tarfile.ReadError), tarfile.open(aa, mode="r:") as tf:
        for m in tf:
            if m.isfile():
                tf.extractfile(m).read()  # type: ignore[union-attr]
    assert aa.read_bytes()[-1024:] != bytes(1024)


def test_cache_dirs_arrow_and_frames(scan: dict[str, Any]) -> None:
    resolutions: dict[str, set[tuple[int, int]]] = {}
    for key, info in scan.items():
        ds = info["json"]["dataset_info.json"]
        assert set(ds) == {"dataset_path", "subset", "total_trajectories", "cache_timestamp", "config_hash"}
        assert key == ds["dataset_path"].replace("/", "_") + "_" + ds["subset"]
        for _rel, data in info["arrow"]:
            with pa.ipc.open_stream(io.BytesIO(data)) as reader:
                assert {f.name: f.type for f in reader.schema} == ARROW_COLUMNS
        state = info["json"]["processed_dataset/state.json"]
        assert sorted(d["filename"] for d in state["_data_files"]) == sorted(
            rel.split("/")[-1] for rel, _ in info["arrow"]
        )
        assert "features" in info["json"]["processed_dataset/dataset_info.json"]
        rows = _arrow_rows(info)
        assert len(rows) == ds["total_trajectories"] == len(info["frames"]), key
        assert 12 <= len(rows) <= 30
        res = set()
        for r in rows:
            assert uuid.UUID(r["id"]).version == 4 and str(uuid.UUID(r["id"])) == r["id"]
            assert r["frames"] == f"processed_datasets/{key}/frames/trajectory_{r['id']}.npz"
            assert r["quality_label"] in {"successful", "suboptimal", "failure"}
            assert r["partial_success"] is None or 0.0 <= r["partial_success"] <= 1.0
            _digest, data = info["frames"][f"frames/trajectory_{r['id']}.npz"]
            z = _load_npz(data)
            assert set(z) == {"frames", "shape", "num_frames"}
            frames = z["frames"]
            assert frames.dtype == np.uint8 and frames.ndim == 4 and frames.shape[3] == 3
            assert z["shape"].dtype == np.int64 and tuple(z["shape"]) == frames.shape
            assert z["num_frames"].dtype == np.int64 and z["num_frames"].shape == ()
            assert int(z["num_frames"]) == frames.shape[0] == r["num_frames"]
            assert 1 <= frames.shape[0] <= 32
            res.add(frames.shape[1:3])
        assert len(res) == 1, f"{key}: the resolution is a property of the cache key"
        resolutions[key] = res
    assert len(set().union(*resolutions.values())) >= 2
    lengths = {r["num_frames"] for info in scan.values() for r in _arrow_rows(info)}
    assert len(lengths) >= 5 and max(lengths) <= 32


def test_subset_checksums_match_frames(prof: Profile, scan: dict[str, Any]) -> None:
    entries = parse_sha256sums(prof.kit_file("subset_checksums"))
    assert [e.path for e in entries] == sorted(e.path for e in entries)
    for e in entries:
        m = FRAMES_PATH_RE.match(e.path)
        assert m, e.path
        digest, _data = scan[m.group("cache_key")]["frames"][f"frames/trajectory_{m.group('id')}.npz"]
        assert digest == e.digest, e.path
    pairs = _jsonl(prof.kit_file("pair_manifest"))
    used = {p[f"{side}_frames_path"] for p in pairs for side in ("chosen", "rejected")}
    assert used == {e.path for e in entries}


def test_pairs_no_leakage_same_key_and_task(prof: Profile, scan: dict[str, Any]) -> None:
    pairs = _jsonl(prof.kit_file("pair_manifest"))
    by_id = {r["id"]: (key, r) for key, info in scan.items() for r in _arrow_rows(info)}
    split_of: dict[str, str] = {}
    assert [p["pair_id"] for p in pairs] == [f"p{i:06d}" for i in range(1, len(pairs) + 1)]
    for p in pairs:
        assert set(p) == {
            "pair_id", "split", "task", "chosen_trajectory_id", "chosen_frames_path",
            "rejected_trajectory_id", "rejected_frames_path",
        }  # fmt: skip
        assert p["split"] in {"train", "val", "test"}
        keys = set()
        for side in ("chosen", "rejected"):
            tid = p[f"{side}_trajectory_id"]
            key, row = by_id[tid]
            keys.add(key)
            assert p[f"{side}_frames_path"] == row["frames"]
            assert row["task"] == p["task"]
            assert split_of.setdefault(tid, p["split"]) == p["split"], f"{tid} leaks across splits"
        assert len(keys) == 1
        assert p["chosen_trajectory_id"] != p["rejected_trajectory_id"]
    assert set(split_of.values()) == {"train", "val", "test"}
    assert (
        Counter(
            Counter(
                tid for p in pairs for tid in (p["chosen_trajectory_id"], p["rejected_trajectory_id"])
            ).values()
        )[2]
        > 0
    )


def test_sidecars_and_action_manifests(demo: DemoPaths, prof: Profile, scan: dict[str, Any]) -> None:
    digest, named = read_single_sha256_file(prof.kit_file("sidecar_archive_sha256"))
    assert named == prof.kit_file("sidecar_archive").name
    assert digest == sha256_file(prof.kit_file("sidecar_archive"))
    members = _sidecar_members(prof)
    rows = _action_rows(demo, prof)
    by_id = {r["id"]: (key, r) for key, info in scan.items() for r in _arrow_rows(info)}
    pair_ids = {
        p[f"{s}_trajectory_id"]
        for p in _jsonl(prof.kit_file("pair_manifest"))
        for s in ("chosen", "rejected")
    }
    statuses = Counter(r["status"] for r in rows)
    assert {"recovered", "source_has_no_actions", "rejected_refinement_no_consensus"} <= set(statuses)
    in_pairs = 0
    for r in rows:
        assert set(r) == {
            "stage2_trajectory_id",
            "source",
            "cache_key",
            "status",
            "sidecar_path",
            "sidecar_sha256",
        }
        key, traj = by_id[r["stage2_trajectory_id"]]
        assert key == r["cache_key"]
        in_pairs += r["stage2_trajectory_id"] in pair_ids
        if r["status"] != "recovered":
            assert r["sidecar_path"] is None and r["sidecar_sha256"] is None
            continue
        m = SIDECAR_PATH_RE.match(r["sidecar_path"])
        assert m and m.group("source") == r["source"] and m.group("id") == r["stage2_trajectory_id"]
        data = members[r["sidecar_path"]]
        assert hashlib.sha256(data).hexdigest() == r["sidecar_sha256"]
        z = _load_npz(data)
        assert set(z) == SIDECAR_KEYS
        meta = json.loads(str(z["metadata_json"]))
        assert z["metadata_json"].shape == () and z["metadata_json"].dtype.kind == "U"
        width = prof.expected.action_width_by_source[r["source"]]
        assert meta["source"] == r["source"] and meta["raw_width"] == width
        if r["source"] == "racer":
            assert meta["action_names"] == RACER_NAMES and traj["task"] == "insert_onto_square_peg"
        else:
            assert meta["action_convention"]
        raw, aligned = z["raw_actions"], z["aligned_actions"]
        assert raw.dtype == aligned.dtype == np.float32
        assert raw.ndim == 2 and raw.shape[1] == width and aligned.shape == (traj["num_frames"], width)
        assert z["source_indices"].dtype == np.int64 and z["source_indices"].shape == (raw.shape[0],)
        assert z["alignment_indices"].dtype == np.int64 and z["alignment_indices"].shape == (
            traj["num_frames"],
        )
        np.testing.assert_array_equal(aligned, raw[z["alignment_indices"]])
    assert 0 < in_pairs < len(rows)
    recovered = {r["sidecar_path"] for r in rows if r["status"] == "recovered"}
    assert recovered == set(members)


def test_counts_equal_expected(demo: DemoPaths, prof: Profile, scan: dict[str, Any]) -> None:
    e = prof.expected
    assert e.cache_dirs == len(scan) == 13
    assert e.trajectories == sum(len(_arrow_rows(info)) for info in scan.values())
    pairs = _jsonl(prof.kit_file("pair_manifest"))
    assert e.pair_rows == len(pairs) == 60
    assert e.unique_frame_files == len(parse_sha256sums(prof.kit_file("subset_checksums"))) == 100
    rows = _action_rows(demo, prof)
    assert e.action_manifest_rows == len(rows)
    by_source = Counter(r["source"] for r in rows if r["status"] == "recovered")
    assert e.sidecars_by_source == dict(by_source)
    assert e.resolved_sidecars == sum(by_source.values())
    assert set(by_source) == {"autoeval", "libero_success", "roboarena", "racer"}


def test_repin_after_mutation(demo: DemoPaths, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(demo.root, root)
    copy = DemoPaths(
        root, root / "upstream", root / "kit", root / "kit" / "profile.toml", demo.repo_id, demo.revision
    )
    before = load_profile(copy.profile)
    target = before.archives[3]
    with open(copy.upstream / target.path, "ab") as f:
        f.write(bytes(512))
    repin_profile(copy)
    after = load_profile(copy.profile)
    new = after.archive(target.path)
    assert new.sha256 == sha256_file(copy.upstream / target.path) != target.sha256
    assert new.size == target.size + 512  # type: ignore[operator]
    assert [a for a in after.archives if a.path != target.path] == [
        a for a in before.archives if a.path != target.path
    ]
    assert after.source.revision == before.source.revision and after.expected == before.expected


def test_write_sidecar_sha256(demo: DemoPaths, tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    shutil.copytree(demo.kit_root, kit)
    rel = "derived/action_sidecars_stage2_action_sidecar_v1.tar"
    old, _ = read_single_sha256_file(kit / (rel + ".sha256"))
    with open(kit / rel, "ab") as f:
        f.write(bytes(10240))
    write_sidecar_sha256(kit, rel)
    new, named = read_single_sha256_file(kit / (rel + ".sha256"))
    assert new == sha256_file(kit / rel) != old and named == Path(rel).name


def test_main_prints_paths(demo: DemoPaths, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(demo.root)]) == 0
    out = capsys.readouterr().out
    assert str(demo.profile) in out and demo.revision in out


# ---- the one full-cardinality test -------------------------------------------------------------
def _iter_action_rows(prof: Profile) -> Iterator[dict[str, Any]]:
    for p in sorted(prof.kit_file("action_manifest_dir").glob("*.jsonl")):
        yield from _jsonl(p)


@pytest.mark.slow
def test_full_cardinality_exact_totals(full_card_demo: tuple[DemoPaths, float]) -> None:
    demo, _ = full_card_demo  # generated once per session (conftest.py); how fast: bench_demo.py
    prof = load_profile(demo.profile)
    e = prof.expected
    assert prof.name == "stage2_core_v1_fullcard"
    assert (e.cache_dirs, e.archives, e.trajectories) == (13, 14, 53765)
    assert (e.pair_rows, e.unique_frame_files, e.action_manifest_rows, e.resolved_sidecars) == (
        2689, 4323, 23359, 20620,
    )  # fmt: skip
    assert e.sidecars_by_source == {
        "autoeval": 5939,
        "libero_success": 1709,
        "roboarena": 12379,
        "racer": 593,
    }
    for a in prof.archives:
        assert a.size == (demo.upstream / a.path).stat().st_size

    # recount everything from the files themselves
    scan = _scan_cache_dirs(demo, prof, full=True)
    traj_key: dict[str, str] = {}
    for key, info in scan.items():
        rows = _arrow_rows(info)
        assert len(rows) == info["json"]["dataset_info.json"]["total_trajectories"] == len(info["frames"])
        traj_key.update((r["id"], key) for r in rows)
    assert len(traj_key) == 53765
    pairs = _jsonl(prof.kit_file("pair_manifest"))
    assert len(pairs) == 2689
    split_of: dict[str, str] = {}
    for p in pairs:
        for side in ("chosen", "rejected"):
            tid = p[f"{side}_trajectory_id"]
            assert split_of.setdefault(tid, p["split"]) == p["split"]
        assert traj_key[p["chosen_trajectory_id"]] == traj_key[p["rejected_trajectory_id"]]
    assert len(split_of) == 4323
    sums = parse_sha256sums(prof.kit_file("subset_checksums"))
    assert len(sums) == 4323
    for s in sums:
        m = FRAMES_PATH_RE.match(s.path)
        assert (
            m
            and scan[m.group("cache_key")]["frames"][f"frames/trajectory_{m.group('id')}.npz"][0] == s.digest
        )
    rows = list(_iter_action_rows(prof))
    assert len(rows) == 23359
    per_source: dict[str, int] = defaultdict(int)
    for r in rows:
        assert traj_key[r["stage2_trajectory_id"]] == r["cache_key"]
        per_source[r["source"]] += r["status"] == "recovered"
    assert dict(per_source) == e.sidecars_by_source
    with tarfile.open(prof.kit_file("sidecar_archive")) as tf:
        counts = Counter(m.name.split("/")[1] for m in tf if m.isfile())
    assert dict(counts) == e.sidecars_by_source
