"""The extraction record covers content: every extracted file's sha256 and its (inode, size,
mtime_ns, ctime_ns). check_extraction reads nothing when the stats match, hashes again a file whose
stats changed (refreshing the record when its bytes did not change, naming it when they did), and
a failed check's mark is never overlooked. Also: kit inputs that are not regular files are refused
from their stats, never opened."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.errors import FileSystemError, ProfileError
from stage2_data.extract import (
    EXTRACTOR_VERSION,
    check_extraction,
    content_digest_of,
    extract_cache_dir,
    hash_regular_file,
    invalidate_extraction,
    load_extraction_record,
    scan_tree,
)
from stage2_data.formats.sha256sums import parse_sha256sums, read_regular_bytes
from stage2_data.hashing import sha256_file
from stage2_data.profile import load_profile

KEY = "jesbu1_toto_rfm_toto"


def _extracted(demo: DemoPaths, root: Path) -> tuple[dict[str, str | None], Path]:
    prof = load_profile(demo.profile)
    specs = prof.archives_by_cache_key()[KEY]
    shas: dict[str, str | None] = {a.path: a.sha256 for a in specs}
    extract_cache_dir(KEY, [demo.upstream / a.path for a in specs], root, archive_sha256=shas)
    return shas, layout.cache_dir(root, KEY)


def _same_size_edit(path: Path) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_record_holds_every_files_sha256_and_stats(demo_cache: DemoPaths, tmp_path: Path) -> None:
    _, cdir = _extracted(demo_cache, tmp_path)
    rec = load_extraction_record(tmp_path, KEY)
    assert rec is not None and rec.extractor_version == EXTRACTOR_VERSION == 2
    files = sorted(str(p.relative_to(cdir)) for p in cdir.rglob("*") if p.is_file())
    assert sorted(rec.entries) == files and rec.files == len(files)
    for rel, (sha, ino, size, mtime, ctime) in rec.entries.items():
        st = (cdir / rel).stat()
        assert sha == sha256_file(cdir / rel)
        assert (ino, size, mtime, ctime) == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    assert rec.content_digest == content_digest_of({r: e[0] for r, e in rec.entries.items()})
    tree = scan_tree(cdir)
    assert tree is not None and tree.digest == rec.tree_digest


def test_content_digest_is_the_content_not_the_stats(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """Two extractions of one archive (other inodes, other ctimes): one content digest."""
    _extracted(demo_cache, tmp_path / "a")
    _extracted(demo_cache, tmp_path / "b")
    a, b = load_extraction_record(tmp_path / "a", KEY), load_extraction_record(tmp_path / "b", KEY)
    assert a is not None and b is not None
    assert a.content_digest == b.content_digest and a.tree_digest != b.tree_digest


def test_unchanged_stats_read_nothing(
    demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shas, _ = _extracted(demo_cache, tmp_path)
    from stage2_data.extract import extract as extract_mod

    def no_hash(*a: object, **k: object) -> None:
        raise AssertionError("a file was hashed")

    monkeypatch.setattr(extract_mod, "hash_regular_file", no_hash)
    record = layout.extraction_record_path(tmp_path, KEY)
    before = record.stat().st_mtime_ns
    assert check_extraction(tmp_path, KEY, shas)[1] is None
    assert record.stat().st_mtime_ns == before  # not written


def test_a_touched_file_is_hashed_again_and_the_record_refreshed(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """Stats changed, bytes not: up to date, and the record takes the new stats (once)."""
    shas, cdir = _extracted(demo_cache, tmp_path)
    f = sorted((cdir / layout.FRAMES_SUBDIR).iterdir())[0]
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert check_extraction(tmp_path, KEY, shas)[1] is None
    rec = load_extraction_record(tmp_path, KEY)
    assert rec is not None and rec.entries[str(f.relative_to(cdir))][3] == st.st_mtime_ns + 1_000_000_000
    record = layout.extraction_record_path(tmp_path, KEY)
    before = record.stat().st_mtime_ns
    assert check_extraction(tmp_path, KEY, shas)[1] is None
    assert record.stat().st_mtime_ns == before  # refreshed once: now the stats match


def test_a_same_size_edit_with_mtime_restored_is_named(demo_cache: DemoPaths, tmp_path: Path) -> None:
    shas, cdir = _extracted(demo_cache, tmp_path)
    for victim in (sorted((cdir / "processed_dataset").glob("*.arrow"))[0], cdir / "dataset_info.json"):
        _same_size_edit(victim)
        why = check_extraction(tmp_path, KEY, shas)[1] or ""
        assert str(victim) in why and "modified since it was extracted" in why, why
        _extracted(demo_cache, tmp_path)  # extracted again: up to date
        assert check_extraction(tmp_path, KEY, shas)[1] is None


def test_a_fifo_in_place_of_a_file_is_named_never_opened(demo_cache: DemoPaths, tmp_path: Path) -> None:
    shas, cdir = _extracted(demo_cache, tmp_path)
    f = cdir / "dataset_info.json"
    f.unlink()
    os.mkfifo(f)
    result: list[str | None] = []
    t = threading.Thread(target=lambda: result.append(check_extraction(tmp_path, KEY, shas)[1]), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "check_extraction blocked on a FIFO"
    assert result and str(f) in (result[0] or "") and "not a regular file" in (result[0] or "")
    with pytest.raises(OSError, match="is a FIFO, not a regular file"):
        hash_regular_file(f)


def test_an_invalidated_record_is_never_up_to_date(demo_cache: DemoPaths, tmp_path: Path) -> None:
    shas, _ = _extracted(demo_cache, tmp_path)
    assert invalidate_extraction(tmp_path, KEY, "the subset byte check found X damaged")
    assert check_extraction(tmp_path, KEY, shas)[1] == "the subset byte check found X damaged"
    assert not invalidate_extraction(tmp_path, "no_such_key", "x")


def test_a_record_of_version_1_is_extracted_again(demo_cache: DemoPaths, tmp_path: Path) -> None:
    shas, _ = _extracted(demo_cache, tmp_path)
    path = layout.extraction_record_path(tmp_path, KEY)
    doc = json.loads(path.read_text())
    doc["extractor_version"] = 1
    for k in ("entries", "content_digest"):
        del doc[k]
    path.write_text(json.dumps(doc))
    assert (
        check_extraction(tmp_path, KEY, shas)[1]
        == f"extracted by extractor version 1, this is version {EXTRACTOR_VERSION}"
    )


@pytest.mark.parametrize("kind", ["FIFO", "folder", "device"])
def test_kit_files_that_are_not_regular_are_refused_by_stat(demo: DemoPaths, kind: str) -> None:
    prof = load_profile(demo.profile)
    sums = prof.kit_file("subset_checksums")
    sums.unlink()
    if kind == "FIFO":
        os.mkfifo(sums)
    elif kind == "folder":
        sums.mkdir()
    else:
        os.symlink("/dev/null", sums)
    said = {"FIFO": "a FIFO", "folder": "a folder", "device": "a character device"}[kind]
    with pytest.raises(ProfileError, match=rf"\[kit\] subset_checksums: .* is {said}, not a regular file"):
        load_profile(demo.profile)
    with pytest.raises(FileSystemError, match=f"is {said}, not a regular file"):
        parse_sha256sums(sums)
    with pytest.raises(FileSystemError, match=f"is {said}, not a regular file"):
        read_regular_bytes(sums)


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("files", 99, "it counts 99 files and lists"),
        ("bytes", 7, "it counts 7 bytes and its files hold"),
        ("content_digest", "0" * 64, "its content_digest is not the digest of its files' sha256"),
    ],
)
def test_a_record_at_odds_with_itself_is_extracted_again(
    demo_cache: DemoPaths, tmp_path: Path, field: str, value: object, said: str
) -> None:
    shas, _ = _extracted(demo_cache, tmp_path)
    path = layout.extraction_record_path(tmp_path, KEY)
    doc = json.loads(path.read_text())
    doc[field] = value
    path.write_text(json.dumps(doc))
    why = check_extraction(tmp_path, KEY, shas)[1] or ""
    assert f"its extraction record {path} is inconsistent ({said}" in why, why


@pytest.mark.parametrize("damage", ["delete", "null"])
def test_a_damaged_record_is_named_by_the_extraction_report(
    demo_cache: DemoPaths, tmp_path: Path, damage: str
) -> None:
    """Every key of the record deleted or nulled in turn: the extraction report (a step that may run
    on its own) names the record and the partition to materialize; it never raises."""
    from stage2_data.steps.acquire import step_extraction_report

    _extracted(demo_cache, tmp_path)
    path = layout.extraction_record_path(tmp_path, KEY)
    doc = json.loads(path.read_text())
    prof = load_profile(demo_cache.profile)
    for key in doc:
        bad = dict(doc)
        if damage == "delete":
            del bad[key]
        else:
            bad[key] = None
        path.write_text(json.dumps(bad))
        res = step_extraction_report(prof, tmp_path)
        text = json.dumps(res.metadata, default=str) + " ".join(str(c) for c in res.checks)
        if load_extraction_record(tmp_path, KEY) is None:
            assert f"{path}: extraction record unreadable (materialize cache_dir[{KEY}])" in text, key


def _quarantined(root: Path) -> dict[str, bytes]:
    """Every file of the quarantine folder (moved.json left out), by its path under its folder."""
    q = layout.quarantine_root(root)
    return {
        p.relative_to(q).as_posix().split("/", 1)[1]: p.read_bytes()
        for p in sorted(q.rglob("*"))
        if p.is_file() and p.name != "moved.json"
    }


@pytest.mark.parametrize("with_record", [True, False])
def test_a_reextraction_moves_aside_what_its_extraction_did_not_write(
    demo_cache: DemoPaths, tmp_path: Path, with_record: bool
) -> None:
    """The cache directory an extraction replaces keeps nothing the user has: a file its record does
    not list (a folder of them moves whole) and a file edited since are moved into the quarantine
    folder, under their path in the data root, and the record returned says from where to where;
    an extracted file whose bytes are unchanged (touched or not) is deleted, made again. Without a
    record, a file whose bytes are what the new extraction writes there counts as extracted."""
    shas, cdir = _extracted(demo_cache, tmp_path)
    files = sorted(p for p in cdir.rglob("*") if p.is_file())
    edited, touched = files[0], files[1]
    before = edited.read_bytes()
    _same_size_edit(edited)
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    (cdir / "my_notes.txt").write_text("notes")
    (cdir / "mine").mkdir()
    (cdir / "mine" / "e.pt").write_text("x")
    (cdir / layout.FRAMES_SUBDIR / "mine.npz").write_text("y")  # in a folder the extraction makes
    if not with_record:
        layout.extraction_record_path(tmp_path, KEY).unlink()
    prof = load_profile(demo_cache.profile)
    specs = prof.archives_by_cache_key()[KEY]
    rec = extract_cache_dir(KEY, [demo_cache.upstream / a.path for a in specs], tmp_path, archive_sha256=shas)

    under = f"{layout.PROCESSED_DIR}/{KEY}"
    moved = _quarantined(tmp_path)
    assert sorted(moved) == sorted(
        f"{under}/{r}"
        for r in (edited.relative_to(cdir).as_posix(), "my_notes.txt", "mine/e.pt", "frames/mine.npz")
    )
    assert moved[f"{under}/my_notes.txt"] == b"notes" and moved[f"{under}/mine/e.pt"] == b"x"
    assert moved[f"{under}/{edited.relative_to(cdir).as_posix()}"] != before  # the user's edit, kept
    (folder,) = layout.quarantine_root(tmp_path).iterdir()
    doc = json.loads((folder / "moved.json").read_text())
    assert "never deleted" in doc["reason"]
    assert sorted(rec.moved_aside) == sorted(f"{e['from']} -> {e['to']}" for e in doc["files"])
    assert f"{cdir / 'mine'} -> {folder / under / 'mine'}" in rec.moved_aside  # the folder, whole
    assert f"{cdir / 'my_notes.txt'} -> {folder / under / 'my_notes.txt'}" in rec.moved_aside
    # the cache directory is what the archive holds, and its record says so (without "moved_aside")
    assert edited.read_bytes() == before and not (cdir / "my_notes.txt").exists()
    assert check_extraction(tmp_path, KEY, shas)[1] is None
    assert "moved_aside" not in json.loads(layout.extraction_record_path(tmp_path, KEY).read_text())
    # an extraction over an untouched cache directory moves nothing
    rec = extract_cache_dir(KEY, [demo_cache.upstream / a.path for a in specs], tmp_path, archive_sha256=shas)
    assert rec.moved_aside == [] and len(list(layout.quarantine_root(tmp_path).iterdir())) == 1
