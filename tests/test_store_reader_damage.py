"""A damaged store is a named error wherever it is read, never wrong values, never a dead process
(docs/spec/vin-store.md, "Reader rules", changelog 2026-12-05 (4)).

* a shard object (a chunk file) that is missing raises StoreChecksumError naming the store, the
  shard, the array and the sample, through the reader, the dataset, the loader's collate and its
  worker processes, on a local disk and on S3: zarr would read it as the fill value (zero frames,
  NaN actions), while a store's writer writes every chunk;
* a shard file truncated while a reader has it open is a named error, not SIGBUS (the reader reads
  with pread; a mapping of a truncated file kills the process);
* validation, at every level, names every file of the store the manifest does not list, wherever it
  is (not only under ``shards/``), on a local disk and on S3, and so does the publication gate.

Real stores built by the writer, real files removed or truncated; nothing of the reader mocked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.cli import python, stage2
from test_store import INPUTS, PROFILE, Upstream, copy_store, make_upstream
from test_store_backends import make_bucket, s3_endpoint  # noqa: F401 - the S3 server fixture

from stage2_data.loader import PoolLoader, Selection, collate
from stage2_data.storage import StoreLocation
from stage2_data.store import (
    StoreChecksumError,
    VinOfflineDataset,
    VinOfflineStoreReader,
    VinOfflineWriter,
    validate_vin_offline_store,
)
from stage2_data.store.gate import publication_gate
from stage2_data.store.shard_io import MISSING, encode_index, index_size

#: the arrays a sample's read goes to directly (zarr's fill value: zero frames, NaN actions)
ARRAYS = ("frames", "actions/aligned")


def _shard_object(store: Path, shard: int, array: str) -> Path:
    d = store / "shards" / f"shard-{shard:06d}" / array / "c"
    (obj,) = [p for p in d.rglob("*") if p.is_file()]
    return obj


def _with_actions(reader: VinOfflineStoreReader, min_rows: int = 1) -> tuple[int, int]:
    """(shard, sample) of the first sample with actions in a shard of at least ``min_rows`` rows."""
    for i, r in enumerate(reader.sample_index):
        sh = reader.manifest["shards"][r["shard_id"]]
        if int(r["action_width"]) > 0 and int(sh["num_rows"]) >= min_rows and int(r["row"]) == 0:
            return int(r["shard_id"]), i
    raise AssertionError("no sample with actions in the store")


def _named(
    e: pytest.ExceptionInfo[StoreChecksumError], store: Any, shard: int, array: str, i: int, key: str
) -> str:
    msg = str(e.value)
    for part in (
        str(store),
        f"shard-{shard:06d}",
        f"array {array}",
        f"sample {i} ({key})",
        "missing",
        "Fix:",
    ):
        assert part in msg, (part, msg)
    return msg


# ----- a missing chunk file -----------------------------------------------------------------------
@pytest.mark.parametrize("array", ARRAYS)
def test_a_missing_shard_object_is_named_by_every_read_never_the_fill_value(
    tmp_path: Path, store: Path, array: str
) -> None:
    s = copy_store(store, tmp_path / "s")
    with VinOfflineStoreReader(s) as r:
        shard, i = _with_actions(r)
        key = r.sample_index[i]["sample_key"]
        t, (h, w) = int(r.sample_index[i]["num_frames"]), r.read_frames(i).shape[1:3]
    _shard_object(s, shard, array).unlink()

    reader = VinOfflineStoreReader(s)
    reads: list[Callable[[], object]] = [lambda: reader.sample(i)]
    if array == "frames":
        reads += [
            lambda: reader.read_frames(i),
            lambda: reader.read_frames_into(i, np.zeros((t, h, w, 3), np.uint8)),
        ]
    else:
        reads += [lambda: reader.read_actions(i)]
    for read in reads:
        with pytest.raises(StoreChecksumError) as ei:
            read()
        _named(ei, s, shard, array, i, key)
    reader.close()

    with VinOfflineDataset(s) as ds:  # the dataset, and the loader's collate over its items
        pos = int(np.nonzero(ds.indices == i)[0][0])
        with pytest.raises(StoreChecksumError) as ei:
            ds[pos]
        _named(ei, s, shard, array, i, key)
    with Selection(s) as sel:
        pos = sel.sample_keys.index(key)
        with pytest.raises(StoreChecksumError) as ei:
            collate([sel.item(pos, defer_frames=True)])
        _named(ei, s, shard, array, i, key)


@pytest.mark.parametrize("rel", ["sample_index.jsonl", "pairs.jsonl", "splits/train.npy"])
def test_a_missing_metadata_file_is_named_with_the_rebuild(tmp_path: Path, store: Path, rel: str) -> None:
    """A metadata file the manifest lists, removed: the dataset opened (its length is the
    manifest's) and then raised a bare FileNotFoundError at every read, and `stage2 summary` said
    "create the missing folder". Both name the file, the store and the rebuild now."""
    s = copy_store(store, tmp_path / "s")
    (s / rel).unlink()
    with pytest.raises(StoreChecksumError) as ei, VinOfflineDataset(s, split="train") as ds:
        ds.reader.sample_index, ds.reader.pairs(), ds.reader.split("train")
    assert f"{s / rel}: missing; the manifest lists it" in str(ei.value), str(ei.value)
    assert "rebuild it: stage2 build" in str(ei.value)
    if rel == "sample_index.jsonl":  # what `stage2 summary` reads
        r = stage2("summary", str(s))
        assert r.returncode != 0 and f"{s / rel}: missing" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "create the missing folder" not in r.stderr


def test_a_missing_shard_object_is_named_in_a_loader_worker(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    with VinOfflineStoreReader(s) as r:
        shard, i = _with_actions(r)
        key = r.sample_index[i]["sample_key"]
    _shard_object(s, shard, "frames").unlink()
    with Selection(s) as sel:
        pos = sel.sample_keys.index(key)
        with pytest.raises(StoreChecksumError) as ei:
            list(PoolLoader(sel, [[pos]], workers=1, context="fork"))
    _named(ei, s, shard, "frames", i, key)


def test_a_missing_chunk_read_through_zarr_is_named(tmp_path: Path, store: Path) -> None:
    """An array the reader reads through zarr (not in the direct layout: ``num_frames`` of a shard
    of several rows, one inner chunk, as ``validate --decode`` reads rows): zarr finds the chunk
    absent and would give the fill value; the reader's store refuses it."""
    s = copy_store(store, tmp_path / "s")
    with VinOfflineStoreReader(s) as r:
        shard, i = _with_actions(r, min_rows=2)
        key = r.sample_index[i]["sample_key"]
        assert r._direct(shard, "num_frames") is None  # zarr reads it
    _shard_object(s, shard, "num_frames").unlink()
    with VinOfflineStoreReader(s) as reader:
        with pytest.raises(StoreChecksumError) as ei:
            reader._padded_row(shard, "num_frames", 0)
        msg = _named(ei, s, shard, "num_frames", i, key)
        assert "num_frames/c/0 is missing (listed in the manifest" in msg, msg


def test_a_row_the_shard_index_lists_no_chunk_for_is_named(tmp_path: Path, store: Path) -> None:
    """An index entry "never written" (offset and size all ones), its crc32c intact: zarr would give
    the fill value for that row; a store's writer writes every chunk, so the reader refuses it."""
    s = copy_store(store, tmp_path / "s")
    with VinOfflineStoreReader(s) as r:
        shard, i = _with_actions(r)
        key = r.sample_index[i]["sample_key"]
        nrows = int(r.manifest["shards"][shard]["num_rows"])
    obj = _shard_object(s, shard, "frames")
    data = obj.read_bytes()
    nidx = index_size(nrows)
    index = np.frombuffer(data[-nidx:-4], dtype="<u8").reshape(nrows, 2).copy()
    index[0] = (MISSING, MISSING)
    obj.write_bytes(data[:-nidx] + encode_index(index))
    with VinOfflineStoreReader(s) as reader, pytest.raises(StoreChecksumError) as ei:
        reader.read_frames(i)
    msg = str(ei.value)
    assert f"sample {i} ({key})" in msg and "lists no chunk" in msg, msg
    # `validate --decode` decodes every row: the row is named under its shard, path and text apart
    found = validate_vin_offline_store(s, decode=True)
    said = [p for p in found if "cannot decode" in p]
    assert said and f"shard-{shard:06d}: cannot decode" in said[0], found


def _s3_store(endpoint: str, tmp_path: Path, trajectories: int) -> StoreLocation:
    """A store of ``trajectories`` trajectories (3 rows a shard) written to a new bucket of the
    loopback S3 server, as its location."""
    up: Upstream = make_upstream(tmp_path / "up", range(1, trajectories + 1))
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    url = f"s3://{make_bucket(endpoint)}/stores/s"
    VinOfflineWriter(url, profile=PROFILE, inputs=INPUTS, storage_options=options, rows_per_shard=3).write(
        up.samples, up.pairs
    )
    return StoreLocation.parse(url, options)


def test_a_missing_shard_object_on_s3_is_named(s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    loc = _s3_store(s3_endpoint, tmp_path, 8)
    url, options = loc.url, loc.storage_options
    with VinOfflineStoreReader(loc) as r:
        shard, i = _with_actions(r)
        key = r.sample_index[i]["sample_key"]
        entry = r.manifest["shards"][shard]
    for f in entry["files"]:
        if f["path"].startswith(f"{entry['dir']}/frames/c/") or f["path"].startswith(
            f"{entry['dir']}/actions/aligned/c/"
        ):
            loc.delete(loc.root / f["path"])
    loc.invalidate()
    with VinOfflineStoreReader(url, options) as reader:
        for array, read in (("frames", reader.read_frames), ("actions/aligned", reader.read_actions)):
            with pytest.raises(StoreChecksumError) as ei:
                read(i)
            _named(ei, url, shard, array, i, key)
    with VinOfflineDataset(url, storage_options=options) as ds:
        pos = int(np.nonzero(ds.indices == i)[0][0])
        with pytest.raises(StoreChecksumError) as ei:
            ds[pos]
        _named(ei, url, shard, "frames", i, key)


# ----- a file truncated under an open reader ----------------------------------------------------------
_TRUNCATE = """
import json, os, sys
from stage2_data.store import VinOfflineStoreReader, StoreChecksumError
store, obj, first, second = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = VinOfflineStoreReader(store)
r.read_frames(first)  # the shard file is open (or mapped) now
os.truncate(obj, 0)
try:
    r.read_frames(second)
    print(json.dumps({"error": None}))
except StoreChecksumError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


def test_a_shard_file_truncated_while_open_is_named_not_sigbus(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    with VinOfflineStoreReader(s) as r:
        shard, first = _with_actions(r, min_rows=2)
        second = first + 1
        key = r.sample_index[second]["sample_key"]
    obj = _shard_object(s, shard, "frames")
    ran = python(_TRUNCATE, str(s), str(obj), str(first), str(second), timeout=120)
    assert ran.returncode == 0, f"exit {ran.returncode} (-7: SIGBUS): {ran.tail()}"
    got = ran.last_json()
    assert got["error"] == "StoreChecksumError", got
    for part in (str(s), f"shard-{shard:06d}", "array frames", f"sample {second} ({key})", "truncated"):
        assert part in got["message"], (part, got)


def test_a_shard_file_too_short_for_its_index_is_named(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    with VinOfflineStoreReader(s) as r:
        shard, i = _with_actions(r)
        key = r.sample_index[i]["sample_key"]
    obj = _shard_object(s, shard, "frames")
    obj.write_bytes(obj.read_bytes()[:10])
    with VinOfflineStoreReader(s) as reader, pytest.raises(StoreChecksumError) as ei:
        reader.read_frames(i)
    msg = str(ei.value)
    for part in (f"shard-{shard:06d}", "array frames", f"sample {i} ({key})", "truncated"):
        assert part in msg, (part, msg)


# ----- files the manifest does not list ----------------------------------------------------------------
def _add_strays(put: Any) -> list[str]:
    rels = ["extra.txt", "splits/evil.npy", "sample_index.jsonl.bak"]
    for rel in rels:
        put(rel, b"not the store's\n")
    return rels


def _named_strays(problems: list[str], shown: str, rels: list[str]) -> None:
    for rel in rels:
        assert any(p == f"{shown}/{rel}: file not listed in the manifest" for p in problems), (rel, problems)


def test_validation_names_every_file_the_manifest_does_not_list(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    assert validate_vin_offline_store(s, deep=True) == []
    rels = _add_strays(lambda rel, data: (s / rel).write_bytes(data))
    for deep, decode in ((False, False), (True, False), (False, True)):
        _named_strays(validate_vin_offline_store(s, deep=deep, decode=decode), str(s), rels)
    ran = stage2("validate", "--deep", str(s))
    assert ran.returncode != 0 and "extra.txt: file not listed in the manifest" in ran.stdout + ran.stderr
    gate = publication_gate(StoreLocation.parse(s))  # the gate is deep validation: it names them too
    assert not gate.passed
    _named_strays(gate.problems, str(s), rels)


def test_validation_names_unlisted_files_on_s3(s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    loc = _s3_store(s3_endpoint, tmp_path, 5)
    url, options = loc.url, loc.storage_options
    assert validate_vin_offline_store(loc, deep=True) == []
    rels = _add_strays(lambda rel, data: loc.write_bytes(loc.root / rel, data))
    loc.invalidate()
    for deep in (False, True):
        _named_strays(validate_vin_offline_store(StoreLocation.parse(url, options), deep=deep), url, rels)
