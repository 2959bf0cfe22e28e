"""`stage2 gc STORES_DIR --unused` removes exactly the files a cache directory's extraction record
lists (as the extraction wrote them) and that record; everything else in the folder the build moved
to unused/ whole (a user's notes, a folder of results, a file changed since it was extracted) is kept
and named, in the dry run and the real run alike. A folder whose record lists no file is kept whole.

The folder is moved by the build's own code (``move_aside_unused``), with an extraction record
written as an extraction writes it (every file's sha256 and stats).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers.cli import stage2

from stage2_data import layout
from stage2_data.extract.extract import ExtractionRecord, hash_regular_file
from stage2_data.extract.inspect import move_aside_unused

KEY = "cache_a"
EXTRACTED = {
    "dataset_info.json": b'{"total_trajectories": 2}',
    "frames/trajectory_0.npz": b"f" * 1000,
    "frames/trajectory_1.npz": b"g" * 500,
    "processed_dataset/data-00000.arrow": b"a" * 300,
}


def _extracted(root: Path) -> Path:
    """processed_datasets/<KEY> as an extraction leaves it, with its record (every file's sha256
    and stats), then moved to unused/ by the build's code (the profile no longer lists it)."""
    cdir = layout.cache_dir(root, KEY)
    entries = {}
    for rel, data in EXTRACTED.items():
        (cdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (cdir / rel).write_bytes(data)
        sha, st = hash_regular_file(cdir / rel)
        entries[rel] = [sha, *st]
    rec = ExtractionRecord(
        cache_key=KEY,
        archives=[f"{KEY}.tar"],
        files=len(EXTRACTED),
        bytes=sum(map(len, EXTRACTED.values())),
        frame_files=2,
        rows=2,
        total_trajectories=2,
        seconds=0.1,
        layout="cache",
        entries=entries,
    )
    path = layout.extraction_record_path(root, KEY)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec.to_dict()))
    (layout.stores_root(root, "p")).mkdir(parents=True)
    ((src, moved),) = move_aside_unused(root, [])
    assert src == cdir and not cdir.exists()
    return moved


def test_gc_unused_removes_only_what_the_extraction_record_lists(tmp_path: Path) -> None:
    root = tmp_path / "root"
    moved = _extracted(root)
    record = layout.extraction_record_path(layout.unused_root(root), moved.name)
    assert record.is_file()
    notes = moved / "MY_NOTES.txt"
    notes.write_text("what I found")
    result = moved / "my_analysis" / "result.csv"
    result.parent.mkdir()
    result.write_text("a,b\n")
    beside = moved / "frames" / "mine.txt"  # in a folder of the extraction's
    beside.write_text("mine")
    edited = moved / "dataset_info.json"  # the user's edit of an extracted file: not the extraction's
    edited.write_bytes(b'{"total_trajectories": 3}')
    rel = moved.relative_to(root).as_posix()
    named = {
        f"{rel}/MY_NOTES.txt": "not written by its extraction",
        f"{rel}/my_analysis/": "a folder its extraction record lists nothing in",
        f"{rel}/frames/mine.txt": "not written by its extraction",
        f"{rel}/dataset_info.json": "changed since it was extracted",
    }
    stores = str(root / layout.STORES_DIR)

    dry = stage2("gc", stores, "--unused", "--dry-run")
    assert dry.returncode == 0, dry.tail()
    assert f"would remove  {moved.name} (cache key {KEY}): 3 file(s), 1.8 KiB" in dry.stdout, dry.stdout
    for path, why in named.items():
        assert any(ln.startswith(f"  kept ({why}") and ln.endswith(path) for ln in dry.stdout.splitlines()), (
            path,
            dry.stdout,
        )
    doc = stage2("gc", stores, "--unused", "--dry-run", "--json").json()["unused"]
    assert [(d["files"], d["size"]) for d in doc["dirs"]] == [(3, 1800)], doc
    assert {k["rel"] for k in doc["kept_entries"]} == {p.rstrip("/") for p in named}, doc
    assert notes.is_file() and record.is_file() and (moved / "frames" / "trajectory_0.npz").is_file()

    gc = stage2("gc", stores, "--unused")
    assert gc.returncode == 0, gc.tail()
    assert f"removed  {moved.name} (cache key {KEY}): 3 file(s)" in gc.stdout, gc.stdout
    for path in named:
        assert path in gc.stdout, gc.stdout
    assert not record.exists()
    assert notes.read_text() == "what I found" and result.read_text() == "a,b\n"
    assert beside.read_text() == "mine" and edited.read_bytes() == b'{"total_trajectories": 3}'
    left = sorted(p.relative_to(moved).as_posix() for p in moved.rglob("*"))
    assert left == [
        "MY_NOTES.txt",
        "dataset_info.json",
        "frames",
        "frames/mine.txt",
        "my_analysis",
        "my_analysis/result.csv",
    ], left  # processed_dataset/ went with its only file

    again = stage2("gc", stores, "--unused")  # no record now: the folder is the user's, kept whole
    assert again.returncode == 0, again.tail()
    assert f"kept  {moved.name}: no extraction record" in again.stdout, again.stdout
    assert notes.is_file()


def test_gc_unused_removes_the_whole_folder_when_nothing_else_is_there(tmp_path: Path) -> None:
    root = tmp_path / "root"
    moved = _extracted(root)
    gc = stage2("gc", str(root / layout.STORES_DIR), "--unused")
    assert gc.returncode == 0, gc.tail()
    assert f"removed  {moved.name} (cache key {KEY}): 4 file(s)" in gc.stdout and "kept" not in gc.stdout
    assert not moved.exists() and (layout.unused_root(root) / layout.PROCESSED_DIR).is_dir()


def test_gc_unused_keeps_a_folder_whose_record_lists_no_file_whole(tmp_path: Path) -> None:
    root = tmp_path / "root"
    moved = _extracted(root)
    record = layout.extraction_record_path(layout.unused_root(root), moved.name)
    doc = json.loads(record.read_text())
    doc["entries"] = {}  # a record of an older version: no file listed
    record.write_text(json.dumps(doc))
    gc = stage2("gc", str(root / layout.STORES_DIR), "--unused")
    assert gc.returncode == 0, gc.tail()
    rel = moved.relative_to(root).as_posix()
    assert "kept (its extraction record lists no file" in gc.stdout and f"{rel}/" in gc.stdout, gc.stdout
    assert record.is_file() and sorted(os.listdir(moved)) == [
        "dataset_info.json",
        "frames",
        "processed_dataset",
    ]
