"""Two ways a reader went past its contract (docs/spec/vin-store.md, "Reader rules"; docs/training.md).

* A store file replaced by a FIFO (``sample_index.jsonl``, ``splits/train.npy``, a shard's
  ``zarr.json``, a shard object, ``manifest.json``) made the reader, the dataset and ``stage2
  summary`` wait for ever on the FIFO's open: the reader now names it (what it is, the rebuild
  command), opening nothing but regular files. Each case runs in a process of its own with a
  timeout: the failure before the fix is a hang.
* A dataset (reader, selection) read on after ``close()``, without its lease: ``stage2 gc`` could
  remove its store under it, and the next read blamed a damaged store. A read after ``close()`` is
  now a ReaderClosedError, whatever is cached; ``with`` blocks and pickled copies (loader workers)
  work as before, and a pickled copy of a closed dataset is closed too.

Real stores built by the writer, real FIFOs, real leases; nothing of the reader mocked.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
from helpers.cli import python, stage2
from test_store import copy_store

from stage2_data.loader import Selection
from stage2_data.storage import StoreLocation
from stage2_data.store import VinOfflineDataset, VinOfflineStoreReader
from stage2_data.store.reader import ReaderClosedError
from stage2_data.store.retention import collect_stores

#: seconds a child process may take to open a store and read it (a hang is what fails)
TIMEOUT = 90


def _shard_object(store: Path, shard: int, array: str) -> Path:
    d = store / "shards" / f"shard-{shard:06d}" / array / "c"
    (obj,) = [p for p in d.rglob("*") if p.is_file()]
    return obj


def _fifo(path: Path) -> None:
    """``path`` (a file of a store copy) replaced by a FIFO nothing ever writes to."""
    path.unlink()
    os.mkfifo(path)


# what a child process does with the store: open a dataset of the train split, then read every
# sample of the store (shard 0 first), printing the error it meets
_READ_ALL = """
import sys
from stage2_data.store import VinOfflineDataset
try:
    ds = VinOfflineDataset(sys.argv[1], split="train")
    r = ds.reader
    for i in range(len(r)):
        r.read_frames(i)
        r.read_actions(i)
    ds[0]
except Exception as e:
    print(type(e).__name__)
    print(e)
    sys.exit(3)
print("read everything")
"""


@pytest.mark.parametrize(
    "rel",
    [
        "sample_index.jsonl",
        "splits/train.npy",
        "pairs.jsonl",
        "shards/shard-000000/zarr.json",
        "shards/shard-000000/frames/zarr.json",
        "frames-object",
        "manifest.json",
    ],
)
def test_a_fifo_in_a_store_is_named_never_waited_on(tmp_path: Path, store: Path, rel: str) -> None:
    s = copy_store(store, tmp_path / "s")
    path = _shard_object(s, 0, "frames") if rel == "frames-object" else s / rel
    _fifo(path)
    code = _READ_ALL.replace("ds[0]", "r.pairs()") if rel == "pairs.jsonl" else _READ_ALL
    ran = python(code, str(s), timeout=TIMEOUT)  # (TimeoutExpired: the reader waits on the FIFO)
    assert ran.returncode == 3, (ran.stdout, ran.stderr)
    kind, msg = ran.stdout.split("\n", 1)
    want = "StoreError" if rel == "manifest.json" else "StoreChecksumError"
    assert kind == want, ran.stdout
    for part in (str(path), "is a FIFO, not a regular file", "nothing was read from it", "Fix:", "rebuild"):
        assert part in msg, (part, msg)
    if rel == "frames-object":  # a shard object: named with its shard, array and sample too
        assert "shard shards/shard-000000, array frames, sample 0 (" in msg, msg


def test_a_fifo_in_a_store_fails_summary_and_validate_by_name(tmp_path: Path, store: Path) -> None:
    s = copy_store(store, tmp_path / "s")
    _fifo(s / "sample_index.jsonl")
    ran = stage2("summary", str(s), timeout=TIMEOUT)
    assert ran.returncode != 0
    out = ran.stdout + ran.stderr
    assert f"{s / 'sample_index.jsonl'} is a FIFO, not a regular file" in out, out
    assert "rebuild" in out, out
    ran = stage2("validate", str(s), timeout=TIMEOUT)  # (already so: reported as a FIFO, nothing read)
    assert ran.returncode != 0 and "FIFO" in ran.stdout + ran.stderr


def test_a_missing_table_is_still_named_missing(tmp_path: Path, store: Path) -> None:
    """(What the FIFO check must not change: a file that is not there is missing, a damaged store.)"""
    s = copy_store(store, tmp_path / "s")
    (s / "splits" / "train.npy").unlink()
    with pytest.raises(Exception, match=r"train\.npy: missing; the manifest lists it") as e:
        VinOfflineDataset(s, split="train")
    assert type(e.value).__name__ == "StoreChecksumError"


# ----- a closed dataset reads nothing -------------------------------------------------------------------
PROFILE = "demo_v1"


def _published(tmp_path: Path, store: Path, *names: str) -> Path:
    """``stores/<profile>/`` holding a copy of ``store`` under each of ``names``, the last one
    published as ``current`` (a build's way); returns the profile's folder."""
    profile_root = tmp_path / "stores" / PROFILE
    profile_root.mkdir(parents=True)
    for name in names:
        shutil.copytree(store, profile_root / name)
        StoreLocation.parse(profile_root).publish_current(name)
    return profile_root


def _closed(e: pytest.ExceptionInfo[ReaderClosedError], store: Path) -> None:
    msg = str(e.value)
    for part in (str(store.resolve()), "this dataset was closed", "lease", "Fix: open it again"):
        assert part in msg, (part, msg)


def test_a_closed_dataset_reads_nothing_even_once_gc_removed_its_store(tmp_path: Path, store: Path) -> None:
    profile_root = _published(tmp_path, store, "v1-0000000000000001")
    a = profile_root / "v1-0000000000000001"
    ds = VinOfflineDataset(profile_root / "current", split="train")
    first = ds[0]
    assert ds.reader.lease is not None and ds.reader.lease.held and not ds.closed
    shutil.copytree(store, profile_root / "v1-0000000000000002")  # a rebuild: current moves on
    StoreLocation.parse(profile_root).publish_current("v1-0000000000000002")
    assert {e.name: e.action for e in collect_stores(profile_root, keep=0).entries}[
        "v1-0000000000000001"
    ] == "kept"
    ds.close()
    assert ds.closed and ds.reader.lease is None
    for read in (
        lambda: ds[0],  # (its frames and sample index were read and cached before the close)
        lambda: ds[1],
        lambda: next(iter(ds)),
        lambda: ds.reader.read_frames(0),
        lambda: ds.reader.read_actions(0),
        lambda: ds.reader.sample(0),
        lambda: ds.reader.sample_index,
        lambda: ds.reader.split("val"),
        lambda: ds.reader.pairs(),
    ):
        with pytest.raises(ReaderClosedError) as e:
            read()
        _closed(e, a)
    assert len(ds) == int(ds.indices.shape[0]) > 0 and first["num_frames"] > 0  # (known, not read)
    # no lease any more: gc removes the store, and the dataset still says it was closed
    assert {e.name: e.action for e in collect_stores(profile_root, keep=0).entries}[
        "v1-0000000000000001"
    ] == "removed"
    assert not a.exists()
    with pytest.raises(ReaderClosedError) as e:
        ds[1]
    _closed(e, a)
    ds.close()  # (closing twice is harmless)


def test_a_closed_selection_and_its_deferred_frames_read_nothing(tmp_path: Path, store: Path) -> None:
    profile_root = _published(tmp_path, store, "v1-0000000000000001")
    sel = Selection(profile_root / "current", "train")
    deferred = sel.item(0, defer_frames=True)["frames"]
    sel[0]
    sel.close()
    for read in (lambda: sel[0], lambda: sel.item(0, defer_frames=True), lambda: deferred.read_into(None)):
        with pytest.raises(ReaderClosedError) as e:
            read()
        _closed(e, profile_root / "v1-0000000000000001")


def test_with_blocks_and_pickled_copies_keep_working(tmp_path: Path, store: Path) -> None:
    profile_root = _published(tmp_path, store, "v1-0000000000000001")
    current = profile_root / "current"
    with VinOfflineDataset(current, split="train") as ds:
        want = ds[0]["frames"].tobytes()
        clone = pickle.loads(pickle.dumps(ds))  # a spawn worker's copy: its own lease
    with pytest.raises(ReaderClosedError):
        ds[0]
    assert clone.reader.lease is not None and clone.reader.lease.held and not clone.closed
    assert clone[0]["frames"].tobytes() == want  # (its original closed: the copy reads on, leased)
    clone.close()
    with pytest.raises(ReaderClosedError):
        clone[0]
    # a pickled copy of a closed dataset is closed: no lease taken, nothing read (as a fork's copy)
    again = pickle.loads(pickle.dumps(ds))
    assert again.closed and again.reader.lease is None
    with pytest.raises(ReaderClosedError):
        again[0]
    # ... and a reader opened again reads
    with VinOfflineStoreReader(current) as r:
        assert r.read_frames(int(ds.indices[0])).tobytes() == want
