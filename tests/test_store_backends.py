"""One suite, two backends: the store on local disk and on a real S3 API (moto's server on 127.0.0.1).

The S3 server is started once per session in this process (``moto.server.ThreadedMotoServer`` on
an ephemeral loopback port) and stopped at the end; every test gets a bucket of its own. The store
goes through s3fs and zarr's ``FsspecStore`` exactly as it would against AWS or MinIO.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from test_store import INPUTS, PROFILE, Upstream, make_upstream

from stage2_data.errors import StoreError, StoreNotFoundError, StoreVersionError
from stage2_data.storage import StoreLocation
from stage2_data.store import (
    BLOCK_NAMES,
    MANIFEST_NAME,
    VinOfflineDataset,
    VinOfflineStoreReader,
    VinOfflineWriter,
    collect_vin_offline_dataset_stats,
    merge_vin_offline_stores,
    raise_if_invalid,
    store_fingerprint,
    validate_vin_offline_store,
)

moto_server = pytest.importorskip("moto.server", reason="moto[server] is a dev dependency (pyproject)")
pytest.importorskip("s3fs", reason="s3fs is a dev dependency (pyproject)")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def make_bucket(endpoint: str) -> str:
    import boto3

    bucket = f"t-{uuid.uuid4().hex[:16]}"
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    client.create_bucket(Bucket=bucket)
    return bucket


@dataclass
class Backend:
    name: str
    base: str  # a folder or an s3:// prefix; stores go under it
    options: dict[str, Any]

    def target(self, name: str) -> str:
        return f"{self.base}/{name}"

    def loc(self, name: str) -> StoreLocation:
        return StoreLocation.parse(self.target(name), self.options)


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        return Backend("local", str(tmp_path / "stores"), {})
    endpoint = request.getfixturevalue("s3_endpoint")
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    return Backend("s3", f"s3://{make_bucket(endpoint)}/stores", options)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"), range(1, 12))


def build(b: Backend, name: str, up: Upstream, **kw: Any) -> dict[str, Any]:
    kw.setdefault("rows_per_shard", 4)
    writer = VinOfflineWriter(
        b.target(name), profile=PROFILE, inputs=INPUTS, storage_options=b.options or None, **kw
    )
    return writer.write(up.samples, up.pairs)


def test_round_trip_validate_and_fingerprint(backend: Backend, up: Upstream) -> None:
    m = build(backend, "s", up)
    target, opts = backend.target("s"), backend.options
    reader = VinOfflineStoreReader(target, opts)
    assert reader.num_samples == len(up.samples)
    for i, row in enumerate(reader.sample_index):
        key = row["sample_key"]
        assert reader.read_frames(i).tobytes() == up.frames[key].tobytes()
        want = up.actions[key]
        got = reader.read_actions(i)
        if want is None:
            assert got is None
        else:
            assert got is not None and np.array_equal(got, want.astype(np.float32))
    clone = pickle.loads(pickle.dumps(reader))  # DataLoader workers get a pickled reader
    assert clone.read_frames(3).tobytes() == reader.read_frames(3).tobytes()
    ds = VinOfflineDataset(target, "train", storage_options=opts)
    assert len(ds) == len(reader.split("train")) and ds[0]["frames"].dtype == np.uint8
    assert validate_vin_offline_store(target, storage_options=opts) == []
    assert validate_vin_offline_store(target, deep=True, storage_options=opts) == []
    assert store_fingerprint(target, opts) == m["fingerprint"]


def test_same_fingerprint_on_both_backends(tmp_path: Path, s3_endpoint: str, up: Upstream) -> None:
    local = Backend("local", str(tmp_path), {})
    s3 = Backend("s3", "", {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": s3_endpoint}})
    s3.base = f"s3://{make_bucket(s3_endpoint)}/x"
    assert build(local, "a", up)["fingerprint"] == build(s3, "a", up)["fingerprint"]


def test_deep_validation_finds_a_flipped_byte(backend: Backend, up: Upstream) -> None:
    m = build(backend, "s", up)
    loc = backend.loc("s")
    rel = m["shards"][1]["files"][-1]["path"]
    assert rel.endswith("/zarr.json"), rel  # metadata: no crc32c covers it, its sha256 does
    data = bytearray(loc.read_bytes(loc.root / rel))
    data[len(data) // 3] ^= 0xFF
    loc.write_bytes(loc.root / rel, bytes(data))
    loc.invalidate()
    # same size: hashing sees it, at every level (the reader hashes a shard's metadata too)
    for deep in (False, True):
        problems = validate_vin_offline_store(loc, deep=deep)
        assert any(rel in p and "sha256" in p for p in problems), (deep, problems)
    with pytest.raises(StoreError, match="is invalid"):
        raise_if_invalid(loc, deep=True)


def test_decode_validation_checks_every_sample(backend: Backend, up: Upstream) -> None:
    """``decode``: each sample's frames against its frames_sha256, zeros past num_frames, NaN past
    the action length and width; problems name the shard, the rows and the sample keys."""
    m = build(backend, "s", up)
    loc = backend.loc("s")
    assert validate_vin_offline_store(loc, decode=True) == []
    text = loc.read_bytes(loc.root / "sample_index.jsonl").decode()
    rows = [json.loads(line) for line in text.splitlines()]
    # 1. a frames_sha256 that the decoded frames do not give (same size: only decoding sees it)
    victim = rows[5]
    edited = text.replace(victim["frames_sha256"], "0" * 64).encode()
    loc.write_bytes(loc.root / "sample_index.jsonl", edited)
    loc.invalidate()
    # plain validation checks the file read whole against the manifest's sha256 ...
    assert [p for p in validate_vin_offline_store(loc) if "sample_index.jsonl: sha256" in p]
    # ... so the manifest records the edited file: then only decoding sees the frames disagree
    manifest = json.loads(loc.read_bytes(loc.root / MANIFEST_NAME))
    (entry,) = [f for f in manifest["files"] if f["path"] == "sample_index.jsonl"]
    entry["sha256"] = hashlib.sha256(edited).hexdigest()
    loc.write_bytes(loc.root / MANIFEST_NAME, json.dumps(manifest).encode())
    loc.invalidate()
    assert validate_vin_offline_store(loc) == []
    problems = validate_vin_offline_store(loc, decode=True)
    assert len(problems) == 1 and "frames_sha256" in problems[0] and victim["sample_key"] in problems[0]

    # 2. padding that is not zero / not NaN, written through zarr: a row shorter than its shard's
    # Tmax, and a row narrower than its shard's action width (shards are cut by length: any shard)
    def groups(sh: dict) -> Any:
        return zarr.open_group(
            store=loc.zarr_store(loc.root / sh["dir"], read_only=False), mode="r+", zarr_format=3
        )

    def rows_of(sh: dict) -> list[tuple[int, dict]]:
        return [(j, rows[sh["row_start"] + j]) for j in range(sh["num_rows"])]

    sh, short, srow = next(
        (sh, j, r) for sh in m["shards"] for j, r in rows_of(sh) if r["num_frames"] < sh["frame_shape"][0]
    )
    groups(sh)["frames"][short, srow["num_frames"]] = 7
    ash, narrow, nrow = next(
        (sh, j, r)
        for sh in m["shards"]
        if "actions/aligned" in sh["arrays"]
        for j, r in rows_of(sh)
        if r["action_width"] < sh["action_width_max"]
    )  # a row narrower than its shard's actions (one without a sidecar: width 0)
    groups(ash)["actions/aligned"][narrow, 0, ash["action_width_max"] - 1] = 0.0  # past the row's width
    loc.invalidate()
    problems = validate_vin_offline_store(loc, decode=True)
    pad = [p for p in problems if "past num_frames" in p]
    assert len(pad) == 1 and sh["dir"] in pad[0] and srow["sample_key"] in pad[0], problems
    nan = [p for p in problems if "NaN padding" in p]
    assert len(nan) == 1 and nrow["sample_key"] in nan[0], problems


def test_stats(backend: Backend, up: Upstream) -> None:
    m = build(backend, "s", up)
    st = collect_vin_offline_dataset_stats(backend.target("s"), backend.options)
    assert st["samples"] == len(up.samples) and st["shards"] == len(m["shards"])
    assert st["path"] == backend.loc("s").url
    on_disk = st["bytes"]["on_disk"]
    for name in BLOCK_NAMES:
        assert on_disk[name] == m["stats"]["compressed_bytes"][name]
    assert on_disk["metadata_files"] > sum(f["bytes"] for f in m["files"])  # + manifest.json


def test_strict_version_and_missing_manifest(backend: Backend, up: Upstream) -> None:
    build(backend, "s", up)
    loc = backend.loc("s")
    mpath = loc.root / MANIFEST_NAME
    manifest = json.loads(loc.read_bytes(mpath))
    loc.write_bytes(mpath, json.dumps({**manifest, "version": 1}).encode())
    loc.invalidate()
    with pytest.raises(StoreVersionError, match="Unsupported VIN offline store version: 1. Expected 2"):
        VinOfflineStoreReader(loc)
    loc.delete(mpath)
    loc.invalidate()
    with pytest.raises(StoreNotFoundError, match="manifest.json is missing"):
        VinOfflineStoreReader(loc)
    assert any("missing" in p for p in validate_vin_offline_store(loc))
    with pytest.raises(StoreNotFoundError):
        store_fingerprint(loc)


def test_interrupted_upload_leaves_nothing_that_validates(backend: Backend, up: Upstream) -> None:
    calls: list[int] = []

    def boom(n: int) -> None:
        calls.append(n)
        if len(calls) == 2:  # two shards are written (uploaded on S3), the third never is
            raise KeyboardInterrupt("killed mid-write")

    with pytest.raises(KeyboardInterrupt):
        build(backend, "s", up, progress=boom)
    loc = backend.loc("s")
    loc.invalidate()
    assert not loc.is_file(loc.root / MANIFEST_NAME)
    with pytest.raises(StoreNotFoundError):
        VinOfflineStoreReader(loc)
    assert validate_vin_offline_store(loc) != []
    # the writer removed what it had written (locally: its staging folder, never at the target)
    assert loc.tree_files(loc.root) == []
    m = build(backend, "s", up)
    if loc.is_local:
        return  # a killed local writer leaves only a `.s.tmp-*` sibling (tests/test_store.py)
    # On S3 a writer killed before it could clean up (SIGKILL) leaves data objects without
    # manifest.json: never a store, and the rerun replaces them.
    loc.delete(loc.root / MANIFEST_NAME)
    loc.invalidate()
    assert loc.tree_files(loc.root) != []
    with pytest.raises(StoreNotFoundError):
        VinOfflineStoreReader(loc)
    assert validate_vin_offline_store(loc) != []
    assert build(backend, "s", up)["fingerprint"] == m["fingerprint"]
    assert validate_vin_offline_store(loc, deep=True) == []


def test_current_is_withdrawn_only_when_it_names_the_folder(backend: Backend, up: Upstream) -> None:
    """``withdraw_current(name)``: the publication goes when it names ``name`` (a store about to be
    written there again), and stays when it names another store; nothing is current afterwards."""
    build(backend, "one", up)
    build(backend, "two", up)
    stores = StoreLocation.parse(backend.base, backend.options)
    stores.publish_current("one")
    assert not stores.withdraw_current("two")
    current = stores.current()
    assert current is not None and current.root.name == "one"
    assert stores.withdraw_current("one")
    assert stores.current() is None
    assert not stores.withdraw_current("one")  # nothing left to withdraw


def test_foreign_prefix_is_refused(backend: Backend, up: Upstream) -> None:
    loc = backend.loc("s")
    loc.write_bytes(loc.root / "notes.txt", b"not a store")
    loc.invalidate()
    with pytest.raises(StoreError, match="refusing to replace it"):
        build(backend, "s", up)
    assert loc.read_bytes(loc.root / "notes.txt") == b"not a store"


def test_merge_equals_fresh_build(backend: Backend, tmp_path: Path) -> None:
    base_up = make_upstream(tmp_path / "u1", range(1, 8), seed=1)
    side_up = make_upstream(tmp_path / "u2", range(20, 24), seed=2)
    build(backend, "base", base_up)
    build(backend, "side", side_up, rows_per_shard=2)
    mm = merge_vin_offline_stores(
        backend.target("base"), backend.target("side"), backend.target("merged"), backend.options
    )
    assert validate_vin_offline_store(backend.target("merged"), True, backend.options) == []
    union = Upstream(
        base_up.samples + side_up.samples,
        base_up.pairs + side_up.pairs,
        {**base_up.frames, **side_up.frames},
        {**base_up.actions, **side_up.actions},
    )
    # the fresh build is made on local disk: the content does not depend on the backend (see
    # test_same_fingerprint_on_both_backends), and it keeps this test's S3 traffic down
    fresh = Backend("local", str(tmp_path / "fresh"), {})
    build(fresh, "fresh", union)
    rm = VinOfflineStoreReader(backend.target("merged"), backend.options)
    rf = VinOfflineStoreReader(fresh.target("fresh"))
    assert rm.num_samples == rf.num_samples == 11
    assert len(mm["shards"]) == len(rm.manifest["shards"])
    fresh_by_key = {r["sample_key"]: i for i, r in enumerate(rf.sample_index)}
    for i, row in enumerate(rm.sample_index):
        j = fresh_by_key[row["sample_key"]]
        assert rm.read_frames(i).tobytes() == rf.read_frames(j).tobytes()
        a, b = rm.read_actions(i), rf.read_actions(j)
        assert (a is None and b is None) or (a is not None and b is not None and a.tobytes() == b.tobytes())
    assert mm["stats"]["per_split"] == rf.manifest["stats"]["per_split"]
    assert validate_vin_offline_store(backend.target("base"), False, backend.options) == []


def test_plain_zarr_reads_every_array(backend: Backend, up: Upstream) -> None:
    """Interop: zarr alone (LocalStore / FsspecStore over the URL) reads what the reader reads."""
    m = build(backend, "s", up)
    loc = backend.loc("s")
    reader = VinOfflineStoreReader(loc)
    for sh in m["shards"]:
        if loc.is_local:
            store: Any = zarr.storage.LocalStore(loc.root / sh["dir"], read_only=True)
        else:
            store = zarr.storage.FsspecStore.from_url(
                f"{loc.url}/{sh['dir']}", storage_options=backend.options, read_only=True
            )
            assert type(store).__name__ == "FsspecStore"
        g = zarr.open_group(store=store, mode="r", zarr_format=3)
        names = sorted(sh["arrays"])
        for name in names:
            arr = g[name]
            assert tuple(arr.shape)[0] == sh["num_rows"]
        frames = np.asarray(g["frames"][...])
        nf = np.asarray(g["num_frames"][...])
        for r in range(sh["num_rows"]):
            i = sh["row_start"] + r
            assert frames[r, : nf[r]].tobytes() == reader.read_frames(i).tobytes()
            if "actions/aligned" in names:
                w = int(np.asarray(g["actions/width"][r]))
                got = reader.read_actions(i)
                if w:
                    assert got is not None
                    assert np.asarray(g["actions/aligned"][r, : nf[r], :w]).tobytes() == got.tobytes()


def test_cli_validate_and_summary(backend: Backend, up: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    """`stage2 validate|summary` take a URL and `--storage-option KEY=VALUE` (JSON values)."""
    from stage2_data.cli import main

    m = build(backend, "s", up)
    opts = [
        f"--storage-option={k}={v if isinstance(v, str) else json.dumps(v)}"
        for k, v in backend.options.items()
    ]
    assert main(["validate", backend.target("s"), "--deep", "--decode", *opts]) == 0
    out = capsys.readouterr().out
    assert "is valid" in out and "deep:" in out and "decode:" in out
    assert main(["summary", backend.target("s"), "--json", *opts]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["samples"] == len(up.samples) and st["fingerprint"] == m["fingerprint"]
    loc = backend.loc("s")
    loc.delete(loc.root / MANIFEST_NAME)
    loc.invalidate()
    assert main(["validate", backend.target("s"), "--json", *opts]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "StoreNotFoundError"
