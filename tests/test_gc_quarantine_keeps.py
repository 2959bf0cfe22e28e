"""`stage2 gc STORES_DIR --quarantine` removes exactly what stage2 moved into the quarantine folder
(what each move folder's moved.json records) and lists it; everything else there (a user's notes at
the top, a file put into a move's folder, a folder with no moved.json) is kept and named, in the dry
run and the real run alike, and the quarantine folder stays. A link stage2 moved aside is removed as
a link (listed, its target never followed).

The quarantine folder is filled by stage2's own moves (``quarantine_files``, what a build calls), not
by a build: the rows are about what gc does with it, through the `stage2` command.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from helpers.cli import stage2

from stage2_data import layout
from stage2_data.publish.quarantine import quarantine_files


def _store_files(store: Path, listed: list[str], unlisted: tuple[str, ...] = ()) -> None:
    """A store's folder: each of ``listed`` (10 bytes) and its ``manifest.json`` listing them; each of
    ``unlisted`` written too (files its manifest does not list)."""
    for rel in [*listed, *unlisted]:
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / rel).write_bytes(b"x" * 10)
    entries: list[dict[str, Any]] = [{"path": rel, "bytes": 10, "sha256": "0" * 64} for rel in listed]
    top = [e for e in entries if not e["path"].startswith("shards/")]
    shard = [e for e in entries if e["path"].startswith("shards/")]
    doc = {"format": "stage2-vin-offline-store", "files": top, "shards": [{"id": 0, "files": shard}]}
    (store / "manifest.json").write_text(json.dumps(doc))


def _filled(tmp_path: Path) -> dict[str, Any]:
    """A data root whose quarantine folder holds what stage2 moved there (a store that failed the
    gate, an archive and its record, a cache folder's link) and a user's files beside them."""
    root = tmp_path / "root"
    (root / layout.STORES_DIR).mkdir(parents=True)
    store = root / layout.STORES_DIR / "p" / "v2-abc"
    _store_files(store, ["shards/shard-000000/frames/c/0"])
    (moved_store,) = quarantine_files(root, [store], "failed the publication gate")
    archive = layout.archive_path(root, "a.tar")
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"y" * 7)
    record = layout.verified_record_path(root, "a.tar")
    record.write_text("{}")
    moved_archive, moved_record = quarantine_files(root, [archive, record], "disagreed with its pin")
    target = tmp_path / "users-cache"  # a user's folder a link in the data root named
    target.mkdir()
    (target / "precious.bin").write_bytes(b"keep me")
    link = root / "cache" / "hf"
    link.parent.mkdir()
    link.symlink_to(target, target_is_directory=True)
    (moved_link,) = quarantine_files(root, [link], "a symbolic link where a folder goes")
    assert moved_link.is_symlink()

    q = layout.quarantine_root(root)
    readme = q / "README-mine.txt"
    readme.write_text("my notes")
    store_folder = moved_store.relative_to(q).parts[0]
    inside = q / store_folder / "mine.txt"  # a user's file inside a stage2 move folder
    inside.write_text("mine too")
    archive_folder = moved_archive.relative_to(q).parts[0]
    beside = moved_archive.parent / "notes.txt"  # next to the archive stage2 moved there
    beside.write_text("about a.tar")
    by_hand = q / "by-hand" / "old.txt"  # a folder with no moved.json
    by_hand.parent.mkdir()
    by_hand.write_text("old")
    return {
        "root": root,
        "q": q,
        "moved": [moved_store, moved_archive, moved_record, moved_link],
        "user": [readme, inside, beside, by_hand],
        "kept_lines": [
            "kept (not moved there by stage2): quarantine/README-mine.txt",
            f"quarantine/{store_folder}/mine.txt",
            f"quarantine/{archive_folder}/archives/notes.txt",
            "quarantine/by-hand/",
        ],
        "target": target,
    }


def _removal_lines(stdout: str, verb: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.startswith(f"  {verb}  ")]


def test_gc_quarantine_keeps_and_names_what_stage2_did_not_move(tmp_path: Path) -> None:
    f = _filled(tmp_path)
    root, q = f["root"], f["q"]
    stores = root / layout.STORES_DIR

    dry = stage2("gc", str(stores), "--quarantine", "--dry-run")
    assert dry.returncode == 0, dry.tail()
    for line in f["kept_lines"]:  # each kept item named, and why
        assert line in dry.stdout, dry.stdout
    kept = [ln for ln in dry.stdout.splitlines() if ln.startswith("  kept (")]
    assert len(kept) == 4 and all("not moved there by stage2" in ln for ln in kept), dry.stdout
    would = _removal_lines(dry.stdout, "would remove")
    assert len(would) == 4, dry.stdout  # the store (one line), the archive, its record, the link
    for moved in f["moved"]:
        rel = moved.relative_to(q).as_posix()
        assert any(rel in ln for ln in would), (rel, dry.stdout)
    assert not any(re.search(r"mine|notes|by-hand|old\.txt", ln) for ln in would), dry.stdout
    assert all(os.path.lexists(p) for p in f["moved"] + f["user"])  # a dry run removes nothing

    js = stage2("gc", str(stores), "--quarantine", "--dry-run", "--json")
    assert js.returncode == 0, js.tail()
    doc = js.json()["quarantine"]
    assert {k["rel"] for k in doc["kept"]} == {
        "quarantine/README-mine.txt",
        *(p.relative_to(root).as_posix() for p in f["user"][1:3]),
        "quarantine/by-hand",
    }, doc["kept"]

    gc = stage2("gc", str(stores), "--quarantine")
    assert gc.returncode == 0, gc.tail()
    removed = _removal_lines(gc.stdout, "removed")
    assert len(removed) == 4, gc.stdout
    link_rel = f["moved"][3].relative_to(q).as_posix()
    assert any(link_rel in ln for ln in removed), gc.stdout  # the link: listed when removed
    for line in f["kept_lines"]:
        assert line in gc.stdout, gc.stdout
    assert not any(os.path.lexists(p) for p in f["moved"]), gc.stdout
    for p in f["user"]:  # the user's files survive, byte for byte
        assert p.is_file(), (p, gc.stdout)
    assert f["user"][0].read_text() == "my notes"
    assert (f["target"] / "precious.bin").read_bytes() == b"keep me"  # the link never followed
    assert q.is_dir()
    # the move folders' records are gone with what they recorded; the user's files stay where they were
    assert not list(q.glob("*/moved.json")), sorted(q.rglob("*"))

    again = stage2("gc", str(stores), "--quarantine")  # nothing of stage2's left: all kept, named
    assert again.returncode == 0, again.tail()
    assert not _removal_lines(again.stdout, "removed"), again.stdout
    assert all(p.is_file() for p in f["user"])
    assert "quarantine/README-mine.txt" in again.stdout, again.stdout


def test_gc_quarantine_never_follows_a_link_on_the_way_to_a_recorded_path(tmp_path: Path) -> None:
    """A move folder whose ``archives`` was replaced by a link to a user's folder holding a file of
    the recorded name: the link is kept (named), the user's file is never reached."""
    root = tmp_path / "root"
    (root / layout.STORES_DIR).mkdir(parents=True)
    archive = layout.archive_path(root, "a.tar")
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"y")
    (moved,) = quarantine_files(root, [archive], "disagreed with its pin")
    users = tmp_path / "users"
    users.mkdir()
    (users / "a.tar").write_bytes(b"the user's")
    moved.unlink()
    moved.parent.rmdir()
    moved.parent.symlink_to(users, target_is_directory=True)

    gc = stage2("gc", str(root / layout.STORES_DIR), "--quarantine")
    assert gc.returncode == 0, gc.tail()
    assert (users / "a.tar").read_bytes() == b"the user's"
    assert moved.parent.is_symlink()
    rel = moved.parent.relative_to(root).as_posix()
    assert f"kept (not moved there by stage2: its moved.json does not record it): {rel}" in gc.stdout, (
        gc.stdout
    )


STORE_FILES = [
    "sample_index.jsonl",
    "pairs.jsonl",
    "splits/all.npy",
    "shards/shard-000000/zarr.json",
    "shards/shard-000000/frames/zarr.json",
    "shards/shard-000000/frames/c/0/0/0/0/0",
    "shards/shard-000000/actions/zarr.json",
    "shards/shard-000000/actions/aligned/c/0/0/0",
]


def test_gc_quarantine_removes_a_stores_own_files_and_keeps_a_note_put_inside_it(tmp_path: Path) -> None:
    """A store moved aside whole (it failed the publication gate) is one unit of its moved.json,
    but a note the user put inside its folder is not the store's: gc --quarantine removes the
    files its manifest lists, its manifest.json and the folders left empty, and keeps and names
    everything else in it, dry run and real run. A file shaped like the store's own (a chunk, a
    split) that its manifest does not list is kept too: it removed one a user had put there,
    judging by the name (as retention once did), where retention now keeps such a store whole."""
    root = tmp_path / "root"
    store = root / layout.STORES_DIR / "p" / "v2-abc"
    _store_files(store, STORE_FILES, unlisted=("splits/train.npy", "shards/shard-000000/num_frames/c/0"))
    assert (store / "splits" / "train.npy").is_file()
    (moved,) = quarantine_files(root, [store], "failed the publication gate")
    q = layout.quarantine_root(root)
    notes = moved / "MY_NOTES.txt"
    notes.write_text("why this store failed")
    result = moved / "my_analysis" / "result.csv"
    result.parent.mkdir()
    result.write_text("a,b\n1,2\n")
    beside = moved / "shards" / "shard-000000" / "notes.txt"  # inside a folder of the store
    beside.write_text("mine")
    user = [notes, result, beside]
    rel = moved.relative_to(root).as_posix()
    # shaped as the store's files, not listed: a folder holding nothing listed is one entry
    shaped = ["splits/train.npy", "shards/shard-000000/num_frames"]
    named = [
        f"{rel}/MY_NOTES.txt",
        f"{rel}/my_analysis/",
        f"{rel}/shards/shard-000000/notes.txt",
        f"{rel}/splits/train.npy",
        f"{rel}/shards/shard-000000/num_frames/",
    ]
    stores = str(root / layout.STORES_DIR)

    dry = stage2("gc", stores, "--quarantine", "--dry-run")
    assert dry.returncode == 0, dry.tail()
    (would,) = _removal_lines(dry.stdout, "would remove")
    assert "folder of 9 file(s)" in would, dry.stdout  # 8 listed, the manifest
    for line in named:
        assert any(
            ln.startswith("  kept (not the store's") and ln.endswith(line) for ln in dry.stdout.splitlines()
        ), (
            line,
            dry.stdout,
        )
    js = stage2("gc", stores, "--quarantine", "--dry-run", "--json").json()["quarantine"]
    assert {k["rel"] for k in js["kept"]} == {
        f"{rel}/MY_NOTES.txt",
        f"{rel}/my_analysis",
        f"{rel}/shards/shard-000000/notes.txt",
        *(f"{rel}/{s}" for s in shaped),
    }
    assert len(js["files"]) == 9 and not any("notes" in f["path"].lower() for f in js["files"]), js
    assert (moved / "manifest.json").is_file() and all(p.is_file() for p in user)

    gc = stage2("gc", stores, "--quarantine")
    assert gc.returncode == 0, gc.tail()
    (removed,) = _removal_lines(gc.stdout, "removed")
    assert "folder of 9 file(s)" in removed, gc.stdout
    for line in named:
        assert line in gc.stdout, gc.stdout
    assert notes.read_text() == "why this store failed" and result.read_text() == "a,b\n1,2\n"
    assert beside.read_text() == "mine"
    left = sorted(p.relative_to(moved).as_posix() for p in moved.rglob("*"))
    assert left == [
        "MY_NOTES.txt",
        "my_analysis",
        "my_analysis/result.csv",
        "shards",
        "shards/shard-000000",
        "shards/shard-000000/notes.txt",
        "shards/shard-000000/num_frames",
        "shards/shard-000000/num_frames/c",
        "shards/shard-000000/num_frames/c/0",
        "splits",
        "splits/train.npy",
    ], left
    assert not list(q.glob("*/moved.json"))


def test_gc_quarantine_keeps_a_store_whose_manifest_cannot_be_read_whole(tmp_path: Path) -> None:
    """A store moved aside whose manifest.json is not JSON (or missing): nothing in it can be told
    to be the store's, so gc --quarantine keeps the whole folder, names it and why, and keeps its
    moved.json (stage2 list still says why it was moved); every run says so again."""
    root = tmp_path / "root"
    bad = root / layout.STORES_DIR / "p" / "v2-bad"
    _store_files(bad, STORE_FILES)
    (bad / "manifest.json").write_text("{not json")
    gone = root / layout.STORES_DIR / "p" / "v2-nomanifest"
    _store_files(gone, STORE_FILES)
    (gone / "manifest.json").unlink()
    (moved_bad,) = quarantine_files(root, [bad], "failed the publication gate")
    (moved_gone,) = quarantine_files(root, [gone], "failed the publication gate")
    q = layout.quarantine_root(root)
    before = sorted(p.relative_to(q).as_posix() for p in q.rglob("*"))
    assert len([p for p in before if p.endswith("moved.json")]) == 2
    stores = str(root / layout.STORES_DIR)
    for _ in range(2):
        gc = stage2("gc", stores, "--quarantine")
        assert gc.returncode == 0, gc.tail()
        assert not _removal_lines(gc.stdout, "removed"), gc.stdout
        for moved, why in ((moved_bad, "not JSON"), (moved_gone, "there is none")):
            rel = moved.relative_to(root).as_posix()
            line = next(ln for ln in gc.stdout.splitlines() if ln.rstrip("/").endswith(rel))
            assert "manifest.json cannot be read" in line and why in line and "kept whole" in line, gc.stdout
        assert sorted(p.relative_to(q).as_posix() for p in q.rglob("*")) == before
