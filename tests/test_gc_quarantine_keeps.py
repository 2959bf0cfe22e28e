"""`stage2 gc STORES_DIR --quarantine` removes exactly what stage2 moved into the quarantine folder
(what each move folder's moved.json records) and lists it; everything else there (a user's notes at
the top, a file put into a move's folder, a folder with no moved.json) is kept and named, in the dry
run and the real run alike, and the quarantine folder stays. A link stage2 moved aside is removed as
a link (listed, its target never followed).

The quarantine folder is filled by stage2's own moves (``quarantine_files``, what a build calls), not
by a build: the rows are about what gc does with it, through the `stage2` command.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from helpers.cli import stage2

from stage2_data import layout
from stage2_data.publish.quarantine import quarantine_files


def _filled(tmp_path: Path) -> dict[str, Any]:
    """A data root whose quarantine folder holds what stage2 moved there (a store that failed the
    gate, an archive and its record, a cache folder's link) and a user's files beside them."""
    root = tmp_path / "root"
    (root / layout.STORES_DIR).mkdir(parents=True)
    store = root / layout.STORES_DIR / "p" / "v2-abc"
    for rel in ("manifest.json", "shards/shard-000000/frames/c/0"):
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / rel).write_bytes(b"x" * 10)
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
