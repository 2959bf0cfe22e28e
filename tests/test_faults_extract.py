"""The fault matrix, archive rows: hostile or broken tars, written with ``tarfile`` into a private copy
of the demo's upstream and re-pinned (so the failure is the intended one, not a sha mismatch), are
refused by the extraction stage (``cache_dir``) by name, and nothing is extracted.

The matrix: tests/faults_table.py (rows), tests/helpers/faults.py (what every row asserts).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.built import build as build_cli
from helpers.built import build_once, copy_built, fingerprint
from helpers.cli import Ran, stage2
from helpers.faults import (
    SMALL,
    SPLIT,
    Member,
    Prepared,
    converge,
    copy_root,
    demo_hub,
    download,
    fault_cases,
    forget_archive,
    hostile_archive,
    member,
    no_store,
    outside,
    read_members,
    refused,
    resolve_gets,
    restore,
    run_cfg,
    said,
    save,
    write_members,
)
from helpers.final import FINAL_STAGE

from stage2_data import checks as C
from stage2_data import layout
from stage2_data.demo import DemoPaths, repin_profile
from stage2_data.hashing import sha256_file
from stage2_data.profile import load_profile
from stage2_pipelines.runs import run_selection

pytestmark = pytest.mark.usefixtures("fault_instance")


def _extract_refused(
    prepared: Prepared,
    demo: DemoPaths,
    tmp_path: Path,
    key: str,
    paths: list[str],
    *names: str,
    check: str | None = None,
) -> tuple[dict[str, Any], Path, dict[str, Any]]:
    """Download the (re-pinned) archive(s) of ``key`` and extract them: the extraction must be refused."""
    root = copy_root(prepared, tmp_path / "root")
    for p in paths:
        forget_archive(root, p)
    shutil.rmtree(layout.cache_dir(root, key))
    before = outside(tmp_path, root)
    download(demo, root, paths)
    r = run_selection(run_cfg(demo, root), ["cache_dir"], key)
    refused(r, *names, check=check)
    assert outside(tmp_path, root) == before
    no_store(root)
    return r, root, run_cfg(demo, root)


def _rerun_archive(demo: DemoPaths, root: Path, saved: dict[Path, bytes], paths: list[str], key: str) -> None:
    """Put the upstream file(s) and the profile back: the repaired archive(s), and only they, are
    downloaded again (by the cache key's ``archive_file`` partition), and the cache key extracts."""
    restore(saved)
    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        assert run_selection(cfg, ["archive_file"], key)["success"]
        r = run_selection(cfg, ["cache_dir"], key)
        assert r["success"] and all(c["passed"] for c in r["checks"]), said(r)
        assert sorted(resolve_gets(hub)) == sorted(paths)


@dataclass(frozen=True)
class Unsafe:
    """Members added to the small tar, and what the refusal names besides "unsafe archive <name>",
    "Nothing was extracted" and the fix."""

    members: Callable[[str, str], list[Member]]  # (the tar's top folder, an absolute path outside)
    names: tuple[str, ...]  # "{evil}" stands for the repr of that absolute path


@fault_cases(
    arc_absolute=Unsafe(lambda top, evil: [member(evil)], ("{evil}", "has an absolute path")),
    arc_dotdot=Unsafe(lambda top, evil: [member(f"{top}/../../evil")], ("/../../evil", "'..'")),
    arc_link=Unsafe(
        lambda top, evil: [
            member(f"{top}/frames/evil", None, type=tarfile.SYMTYPE, linkname="/etc/passwd"),
            member(f"{top}/evil_hard", None, type=tarfile.LNKTYPE, linkname="../../../etc/passwd"),
        ],
        ("is a symbolic link", "/etc/passwd", "is a hard link", "links are refused"),
    ),
    arc_device=Unsafe(
        lambda top, evil: [
            member(f"{top}/evil_dev", None, type=tarfile.CHRTYPE, devmajor=1, devminor=3),
            member(f"{top}/evil_fifo", None, type=tarfile.FIFOTYPE),
        ],
        ("evil_dev", "is a character device", "evil_fifo", "is a FIFO"),
    ),
    arc_duplicate=Unsafe(
        lambda top, evil: [member(f"{top}/dataset_info.json", b'{"total_trajectories": 1}')],
        ("dataset_info.json", "is a duplicate"),
    ),
    arc_extra_top=Unsafe(
        lambda top, evil: [
            member("other_folder", None, type=tarfile.DIRTYPE),
            member("other_folder/x.json", b"{}"),
        ],
        ("other_folder", "outside the cache directory", SMALL),
    ),
)
def test_fault_arc_unsafe(prepared: Prepared, demo: DemoPaths, tmp_path: Path, case: Unsafe) -> None:
    evil = str(tmp_path / "evil")
    saved = save(demo.upstream / f"{SMALL}.tar", demo.profile)
    path = hostile_archive(demo, SMALL, lambda ms, top: ms + case.members(top, evil))
    _, root, cfg = _extract_refused(
        prepared,
        demo,
        tmp_path,
        SMALL,
        [path],
        f"unsafe archive {path}",
        "Nothing was extracted",
        "Fix:",
        "[[quarantined]]",
        *(n.format(evil=repr(evil)) for n in case.names),
    )
    proc = layout.processed_root(root)
    assert not layout.cache_dir(root, SMALL).exists()
    assert not [p.name for p in proc.iterdir() if p.name.startswith(".")]  # no temp folder left
    # the files a hostile member aims at were never written
    assert not (tmp_path / "evil").exists() and not (root / "evil").exists()
    _rerun_archive(demo, root, saved, [path], SMALL)


def test_fault_arc_truncated(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    path = f"{SMALL}.tar"
    f = demo.upstream / path
    original = f.read_bytes()
    f.write_bytes(original[: len(original) // 2 + 100])
    repin_profile(demo)
    r, root, _ = _extract_refused(
        prepared, demo, tmp_path, SMALL, [path], path, "truncated or corrupt", "Fix:", "sha256 matches the pin",
        "[[quarantined]]",
    )  # fmt: skip
    assert "download it again" not in said(r)  # verified: the same bytes would come again
    assert not layout.cache_dir(root, SMALL).exists()
    _restore_and_converge(prepared, demo, root, f, original)


def test_fault_arc_compressed(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """A `.tar` that is gzip-compressed upstream, pinned as such: the compression is named, and the
    fix is the profile (an uncompressed tar, or quarantine), never "download it again"."""
    path = f"{SMALL}.tar"
    f = demo.upstream / path
    original = f.read_bytes()
    f.write_bytes(gzip.compress(original, mtime=0))
    repin_profile(demo)
    r, root, _ = _extract_refused(
        prepared, demo, tmp_path, SMALL, [path], f"archive {path} is not a tar: its bytes are gzip-compressed",
        "Fix:", "uncompressed tar", "[[quarantined]]",
    )  # fmt: skip
    assert "download it again" not in said(r) and "Traceback" not in said(r)
    assert not layout.cache_dir(root, SMALL).exists()
    _restore_and_converge(prepared, demo, root, f, original)


def test_fault_arc_wrong_cache_key(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """A profile entry whose cache_key is not the folder its (verified) archive holds: the fix is the
    profile's cache_key; nothing is extracted, nothing downloaded again."""
    path = f"{SMALL}.tar"
    good = demo.profile.read_text()
    block = _archive_block(good, path)
    demo.profile.write_text(
        good.replace(block, block.replace(f'cache_key = "{SMALL}"', 'cache_key = "renamed_key"'))
    )
    root = copy_root(prepared, tmp_path / "root")
    shutil.rmtree(layout.cache_dir(root, SMALL))
    before = outside(tmp_path, root)
    r = run_selection(run_cfg(demo, root), ["cache_dir"], "renamed_key")
    text = refused(
        r, f"archive {path} holds the cache directory {SMALL!r}, but the profile lists it for cache_key 'renamed_key'",
        f'set cache_key = "{SMALL}"', "Nothing was extracted",
    )  # fmt: skip
    assert "download it again" not in text.split("; downloading it again gives the same bytes")[0]
    assert "quarantined" not in text
    assert not layout.cache_dir(root, "renamed_key").exists()
    assert outside(tmp_path, root) == {
        **before,
        "demo/kit/profile.toml": outside(tmp_path, root)["demo/kit/profile.toml"],
    }
    demo.profile.write_text(good)
    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        converge(prepared, cfg, root, [("cache_dir", SMALL)])
        assert resolve_gets(hub) == []


def _archive_block(profile_text: str, path: str) -> str:
    """The profile's ``[[archives]]`` block of ``path`` (with the blank line after it)."""
    i = profile_text.index(f'path = "{path}"') - len("[[archives]]\n")
    return profile_text[i : profile_text.index("\n\n", i) + 2]


def test_fault_arc_missing_part(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    aa, ab = f"{SPLIT}.tar.part-aa", f"{SPLIT}.tar.part-ab"
    root = copy_root(prepared, tmp_path / "root")
    forget_archive(root, ab)
    shutil.rmtree(layout.cache_dir(root, SPLIT))
    before = outside(tmp_path, root)
    r = run_selection(run_cfg(demo, root), ["cache_dir"], SPLIT)
    refused(r, ab, "missing", "Fix:", "download it again")
    # left out of the profile: the parts present are read as one (truncated) stream
    good = demo.profile.read_text()
    demo.profile.write_text(_expected(good.replace(_archive_block(good, ab), ""), "archives", -1))
    r = run_selection(run_cfg(demo, root), ["cache_dir"], SPLIT)
    refused(r, f"{SPLIT}.tar", "truncated or corrupt", aa, "missing or out of order", "Fix:")
    demo.profile.write_text(good)
    assert not layout.cache_dir(root, SPLIT).exists()
    assert outside(tmp_path, root) == {
        **before,
        "demo/kit/profile.toml": outside(tmp_path, root)["demo/kit/profile.toml"],
    }
    no_store(root)
    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        # the split cache key's partition: the missing part only is downloaded (aa stays verified)
        assert run_selection(cfg, ["archive_file"], SPLIT)["success"]
        assert run_selection(cfg, ["cache_dir"], SPLIT)["success"]
        assert resolve_gets(hub) == [ab]


def test_fault_arc_parts_order(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    aa, ab = f"{SPLIT}.tar.part-aa", f"{SPLIT}.tar.part-ab"
    root = copy_root(prepared, tmp_path / "root")
    # 1. listed out of order in the profile: name order is used, the extraction is the clean one
    good = demo.profile.read_text()
    blk_aa, blk_ab = _archive_block(good, aa), _archive_block(good, ab)
    swapped = good.replace(blk_aa, "@@AA@@").replace(blk_ab, blk_aa).replace("@@AA@@", blk_ab)
    demo.profile.write_text(swapped)
    listed = [a.path for a in load_profile(demo.profile).archives]
    assert listed.index(ab) < listed.index(aa)
    r = run_selection(run_cfg(demo, root), ["cache_dir"], SPLIT)
    assert r["success"], said(r)
    clean = {p.name: sha256_file(p) for p in (layout.cache_dir(prepared.root, SPLIT) / "frames").iterdir()}
    assert {p.name: sha256_file(p) for p in (layout.cache_dir(root, SPLIT) / "frames").iterdir()} == clean
    demo.profile.write_text(good)
    # 2. contents swapped upstream (each part holds the other's bytes), pinned as such
    a_bytes, b_bytes = (demo.upstream / aa).read_bytes(), (demo.upstream / ab).read_bytes()
    (demo.upstream / aa).write_bytes(b_bytes)
    (demo.upstream / ab).write_bytes(a_bytes)
    repin_profile(demo)
    shutil.rmtree(root)
    _, root, _ = _extract_refused(
        prepared,
        demo,
        tmp_path,
        SPLIT,
        [aa, ab],
        f"{SPLIT}.tar",
        "truncated or corrupt",
        "out of order",
        "Fix:",
    )
    (demo.upstream / aa).write_bytes(a_bytes)
    (demo.upstream / ab).write_bytes(b_bytes)
    repin_profile(demo)
    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        for asset in ("archive_file", "cache_dir"):  # one partition holds both parts
            assert run_selection(cfg, [asset], SPLIT)["success"]
        assert sorted(resolve_gets(hub)) == [aa, ab]


def test_fault_arc_info_totals(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    def bump(ms: list[Member], top: str) -> list[Member]:
        out = []
        for m, data in ms:
            if m.name == f"{top}/dataset_info.json":
                doc = json.loads(data or b"{}")
                doc["total_trajectories"] += 1
                data = json.dumps(doc).encode()
                m.size = len(data)
            out.append((m, data))
        return out

    saved = save(demo.upstream / f"{SMALL}.tar", demo.profile)
    path = hostile_archive(demo, SMALL, bump)
    n = len(load_profile(demo.profile).archives_by_cache_key()[SMALL])
    assert n == 1
    r, root, cfg = _extract_refused(
        prepared,
        demo,
        tmp_path,
        SMALL,
        [path],
        SMALL,
        "dataset_info.json",
        "total_trajectories",
        check=C.CACHE_DIR_COUNTS_CONSISTENT,
    )
    # run on its own (as from the UI), the final stage refuses too: nothing is published
    r = run_selection(cfg, FINAL_STAGE)
    refused(r, SMALL, "dataset_info.json")
    assert "vin_store" not in r["materialized"]
    no_store(root)
    _rerun_archive(demo, root, saved, [path], SMALL)


def _tree(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_fault_arc_part_spelling(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """Upstream's other spelling of split parts (``.tar.partaa``): downloaded, ordered and extracted
    as ``.tar.part-aa`` is; mixing the two spellings in one archive is refused by name."""
    from stage2_data.errors import ArchiveError
    from stage2_data.extract.multipart import _order_parts

    old = [f"{SPLIT}.tar.part-aa", f"{SPLIT}.tar.part-ab"]
    new = [f"{SPLIT}.tar.partaa", f"{SPLIT}.tar.partab"]
    for o, n in zip(old, new, strict=True):
        (demo.upstream / o).rename(demo.upstream / n)
    demo.profile.write_text(demo.profile.read_text().replace(".tar.part-a", ".tar.parta"))
    assert [a.path for a in load_profile(demo.profile).archives_by_cache_key()[SPLIT]] == new
    root = copy_root(prepared, tmp_path / "root")
    clean = _tree(layout.cache_dir(root, SPLIT))
    for p in old:
        forget_archive(root, p)
    shutil.rmtree(layout.cache_dir(root, SPLIT))
    assert sorted(download(demo, root, new)) == new
    r = run_selection(run_cfg(demo, root), ["cache_dir"], SPLIT)
    assert r["success"], said(r)
    assert _tree(layout.cache_dir(root, SPLIT)) == clean
    mixed = [layout.archive_path(root, new[0]), tmp_path / old[1]]
    with pytest.raises(ArchiveError, match=r"mix the spellings \.tar\.part-aa and \.tar\.partaa"):
        _order_parts(mixed)
    with pytest.raises(ArchiveError, match=rf"split part {SPLIT}\.tar\.partab is missing"):
        _order_parts([layout.archive_path(root, new[0]), tmp_path / f"{SPLIT}.tar.partac"])


def _restore_and_converge(prepared: Prepared, demo: DemoPaths, root: Path, f: Path, original: bytes) -> None:
    """The upstream archive ``f`` back as it was and re-pinned: the next build downloads it again
    (its pin changed) and extracts it; the data root converges."""
    path = f.relative_to(demo.upstream).as_posix()
    f.write_bytes(original)
    repin_profile(demo)
    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        converge(prepared, cfg, root, [("archive_file", SMALL), ("cache_dir", SMALL)])
        assert resolve_gets(hub) == [path]


# ----- records that cover content: what a build extracted, changed in place ---------------------
# These rows drive `stage2 build` as a user runs it (a subprocess) on a copy of a root that a
# `stage2 build` filled, so the copy holds every record a real build writes.
TOTO = "jesbu1_toto_rfm_toto"  # a whole-tar cache key whose arrow rows hold short task texts


@pytest.fixture(scope="module")
def built(prepared: Prepared, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_once(prepared, tmp_path_factory.mktemp("built-extract") / "root")


def _settled_copy(prepared: Prepared, built: Path, dst: Path) -> Path:
    """A copy of the built root, built once more: its records now hold the copy's own inodes and
    ctimes (a copy's files are all re-hashed once), so a change after this is one file's."""
    root = copy_built(built, dst)
    r = build_cli(prepared.demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    return root


def _edit_in_place(path: Path, edit: Callable[[bytearray], None]) -> bytes:
    """Change ``path``'s bytes without changing its size, then set its atime and mtime back (what
    a same-size edit with the times restored leaves: only the ctime and the bytes tell). Returns
    the bytes it held."""
    st = path.stat()
    old = path.read_bytes()
    data = bytearray(old)
    edit(data)
    assert len(data) == len(old) and bytes(data) != old
    with open(path, "r+b") as f:  # in place: the same inode
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    return old


def _extract_reason(demo: DemoPaths, root: Path, key: str) -> str | None:
    from stage2_data.acquire import verified_sha256s
    from stage2_data.extract import check_extraction

    return check_extraction(root, key, verified_sha256s(load_profile(demo.profile), root, key))[1]


def _stage_line(r: Ran, word: str) -> str:
    return next((ln for ln in r.stderr.splitlines() if ln.startswith("[") and word in ln), "")


def test_fault_arc_non_utf8_name_in_cache_dir(prepared: Prepared, built: Path, tmp_path: Path) -> None:
    """A user's file whose name is not UTF-8 in a cache directory: the build said "internal error:
    UnicodeEncodeError", exited 1, and its record of the move was never written (QA). It is moved
    aside like any file the extraction did not write, its move recorded and said with the odd byte
    shown as \\xfe (by `stage2 list` too), and the store is the clean one."""
    demo = prepared.demo
    root = _settled_copy(prepared, built, tmp_path / "root")
    frames = layout.cache_dir(root, TOTO) / layout.FRAMES_SUBDIR
    odd = os.fsdecode(bytes(frames) + b"/x\xfe.npz")
    Path(odd).write_bytes(b"m3\n")
    r = build_cli(demo.profile, root)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    assert "internal error" not in out and "Traceback" not in out, out
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("moved aside:")), "")
    assert f"{frames}/x\\xfe.npz -> " in line, r.stdout
    (moved,) = [p for p in layout.quarantine_root(root).rglob("*.npz") if p.read_bytes() == b"m3\n"]
    assert os.fsencode(moved).endswith(b"/x\xfe.npz")
    record = json.loads((moved.parents[3] / "moved.json").read_text(encoding="ascii"))
    assert [f["from"] for f in record["files"]] == [odd]
    listed = stage2("list", str(demo.profile), "--data-root", str(root), "--json")
    assert listed.returncode == 0 and listed.json()["quarantine"]["moved"], listed.tail()
    # the text listing shows the odd byte as the build did, never the raw byte to the terminal
    text = stage2("list", str(demo.profile), "--data-root", str(root))
    assert text.returncode == 0 and "frames/x\\xfe.npz  3 B" in text.stdout, text.tail()


def test_fault_arc_extracted_edit(prepared: Prepared, built: Path, tmp_path: Path) -> None:
    """A same-size edit of an extracted arrow file (a task text, mtime restored) is found by its
    changed ctime and sha256, named, and extracted again: the store stays the clean one."""
    demo = prepared.demo
    root = _settled_copy(prepared, built, tmp_path / "root")
    arrow = sorted((layout.cache_dir(root, TOTO) / "processed_dataset").glob("*.arrow"))[0]

    def retask(data: bytearray) -> None:
        i = data.find(b"scoop the beans")
        assert i >= 0
        data[i : i + 5] = b"SCOOP"

    old = _edit_in_place(arrow, retask)
    why = _extract_reason(demo, root, TOTO)
    assert why is not None and str(arrow) in why and "modified since it was extracted" in why, why
    r = build_cli(demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    assert "up to date" not in _stage_line(r, "extract"), r.stderr
    assert arrow.read_bytes() == old  # extracted again from its verified archive
    assert _extract_reason(demo, root, TOTO) is None


def test_fault_arc_extracted_flip_reverify(prepared: Prepared, built: Path, tmp_path: Path) -> None:
    """A flipped byte of an extracted frame file with its extraction record forged to match (the
    entry's stats and sha256, the record's digests): neither the stats nor a hash against the record
    can see it. `stage2 build --reverify` trusts no record of the build's own: it extracts every
    cache directory again from its verified archives, so the clean content is published, and the
    flipped file (not what its extraction wrote) is moved aside, never deleted."""
    from stage2_data.extract import content_digest_of, load_extraction_record, stats_digest
    from stage2_data.hashing import sha256_file

    demo = prepared.demo
    root = _settled_copy(prepared, built, tmp_path / "root")
    sums = load_profile(demo.profile).kit_file("subset_checksums")
    rel = next(
        line.split("  ", 1)[1]
        for line in sums.read_text().splitlines()
        if f"/{SMALL}/{layout.FRAMES_SUBDIR}/" in line
    )
    frame = root / rel

    def flip(data: bytearray) -> None:
        data[len(data) // 2] ^= 0xFF

    old = _edit_in_place(frame, flip)
    flipped = frame.read_bytes()
    # the record forged to hold the file as it is now: its stats, its sha256, both digests
    record_path = layout.extraction_record_path(root, SMALL)
    doc = json.loads(record_path.read_text())
    inner = rel.split(f"{SMALL}/", 1)[1]
    st = frame.stat()
    doc["entries"][inner] = [sha256_file(frame), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    doc["tree_digest"] = stats_digest({k: v[1:] for k, v in doc["entries"].items()})
    doc["content_digest"] = content_digest_of({k: v[0] for k, v in doc["entries"].items()})
    record_path.write_text(json.dumps(doc))
    assert _extract_reason(demo, root, SMALL) is None  # the record cannot see it

    r = build_cli(demo.profile, root, "--reverify")
    out = r.stdout + r.stderr
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    assert "internal error" not in out and "Traceback" not in out, out
    assert "up to date" not in _stage_line(r, "extract"), r.stderr
    assert frame.read_bytes() == old  # extracted again from its verified archive
    rec = load_extraction_record(root, SMALL)
    assert rec is not None and rec.sha256_of(inner) == sha256_file(frame)
    kept = [p for p in layout.quarantine_root(root).rglob(frame.name) if p.is_file()]
    assert [p.read_bytes() for p in kept] == [flipped], kept
    assert _extract_reason(demo, root, SMALL) is None


def _add_archive(demo: DemoPaths, path: str, key: str, trajectories: int) -> None:
    """List ``path`` (in the demo's upstream) under [[archives]] for ``key``, pinned, and count it
    (and its ``trajectories``) in the profile's [expected] table."""
    text = (
        demo.profile.read_text(encoding="utf-8") + f'\n[[archives]]\npath = "{path}"\ncache_key = "{key}"\n'
    )
    # counted first: a profile whose totals contradict its entries does not load (nor pin)
    for name, more in (("archives", 1), ("cache_dirs", 1), ("trajectories", trajectories)):
        text = _expected(text, name, more)
    demo.profile.write_text(text, encoding="utf-8")
    repin_profile(demo)


def _expected(text: str, name: str, more: int) -> str:
    """``text`` (a profile) with its [expected] ``name`` total changed by ``more``."""
    n = int(re.findall(rf"^{name} = (\d+)$", text, re.M)[0])
    return re.sub(rf"^{name} = \d+$", f"{name} = {n + more}", text, count=1, flags=re.M)


def _frame_count(tar: Path) -> int:
    return sum(1 for m, _ in read_members(tar) if m.name.endswith(".npz"))


def test_fault_arc_dup_trajectory_ids(
    prepared: Prepared, demo: DemoPaths, built: Path, tmp_path: Path
) -> None:
    """A new cache directory repeating the trajectory ids of another is a named error (which ids,
    which two cache directories), not trajectories counted twice."""
    dup = "zz_libero_copy"
    members = read_members(demo.upstream / f"{SMALL}.tar")
    for m, _ in members:  # the same members under another top folder: another cache key
        m.name = m.name.replace(SMALL, dup, 1)
    write_members(demo.upstream / f"{dup}.tar", members)
    saved = save(demo.profile)
    _add_archive(demo, f"{dup}.tar", dup, _frame_count(demo.upstream / f"{dup}.tar"))
    root = copy_built(built, tmp_path / "root")
    with demo_hub(demo) as hub:
        r = build_cli(demo.profile, root, endpoint=hub.url)
    out = r.stdout + r.stderr
    assert r.returncode == 1, r.tail()
    a_id = next(p.name for p in (layout.cache_dir(root, SMALL) / layout.FRAMES_SUBDIR).iterdir())
    assert f"{layout.cache_dir(root, dup)} repeats" in out and str(layout.cache_dir(root, SMALL)) in out, out
    assert a_id.removeprefix("trajectory_").removesuffix(".npz") in out, out
    assert "internal error" not in out, out
    restore(saved)
    r = build_cli(demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()


def test_fault_arc_removed_cache_key(
    prepared: Prepared, demo: DemoPaths, built: Path, tmp_path: Path
) -> None:
    """A cache key the build extracted and the profile no longer lists is moved to
    unused/processed_datasets/ by the next build (nothing deleted, never overwritten), which
    passes; an entry of processed_datasets/ the build did not make fails no_stray_entries by name."""
    extra_key = "some_other_dataset"  # in the demo's upstream, not in its profile
    saved = save(demo.profile)
    _add_archive(demo, f"{extra_key}.tar", extra_key, _frame_count(demo.upstream / f"{extra_key}.tar"))
    root = copy_built(built, tmp_path / "root")
    with demo_hub(demo) as hub:
        r = build_cli(demo.profile, root, endpoint=hub.url)
    assert r.returncode == 0, r.tail()
    cdir = layout.cache_dir(root, extra_key)
    files = sorted(p.relative_to(cdir) for p in cdir.rglob("*"))
    assert files and layout.extraction_record_path(root, extra_key).is_file()
    restore(saved)  # the key removed from the profile
    unused = layout.unused_root(root) / layout.PROCESSED_DIR
    (unused / extra_key).mkdir(parents=True)  # taken: the move picks another name
    foreign = layout.processed_root(root) / "my_notes"  # not made by a build
    foreign.mkdir()
    (foreign / "a.txt").write_text("mine")
    r = build_cli(demo.profile, root)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and str(foreign) in out and C.NO_STRAY_ENTRIES in out, r.tail()
    moved = unused / f"{extra_key}.1"
    failed = [ln for ln in out.splitlines() if "failed check" in ln]
    assert "internal error" not in out and not [ln for ln in failed if str(cdir) in ln], out
    assert f"moved aside:  {cdir} -> {moved}" in r.stdout, r.stdout  # the summary says where it went
    assert (foreign / "a.txt").read_text() == "mine"
    assert not cdir.exists()
    assert sorted(p.relative_to(moved) for p in moved.rglob("*")) == files
    assert list((unused / extra_key).iterdir()) == []
    assert (layout.unused_root(root) / layout.REPORTS_DIR / "extraction" / f"{extra_key}.1.json").is_file()
    # `stage2 list` shows both folders under unused/ with their files and size, and says who removes them
    listed = stage2("list", str(demo.profile), "--data-root", str(root), "--json")
    assert listed.returncode == 0, listed.tail()
    doc = listed.json()["unused"]
    size = sum(p.stat().st_size for p in moved.rglob("*") if p.is_file())
    assert doc["folder"] == str(layout.unused_root(root)) and doc["bytes"] == size
    assert [(d["path"], d["cache_key"], d["files"], d["size"]) for d in doc["dirs"]] == [
        (str(unused / extra_key), extra_key, 0, 0),
        (str(moved), extra_key, len([f for f in files if (moved / f).is_file()]), size),
    ]
    text = stage2("list", str(demo.profile), "--data-root", str(root)).stdout
    assert "stage2 gc <data_root>/stores --unused" in text and f"  {extra_key}.1/  " in text, text
    # `stage2 gc --unused` removes what a build moved there (a dry run first), never the folder the
    # user made (no extraction record beside it), nor what the user put into the moved folder: only
    # the files its extraction record lists go
    record = layout.unused_root(root) / layout.REPORTS_DIR / "extraction" / f"{extra_key}.1.json"
    notes, result = moved / "MY_NOTES.txt", moved / "my_analysis" / "result.csv"
    n_extracted = len([f for f in files if (moved / f).is_file()])
    notes.write_text("mine\n")
    result.parent.mkdir()
    result.write_text("a,b\n")
    stores = str(root / layout.STORES_DIR)
    dry = stage2("gc", stores, "--unused", "--dry-run", "--json")
    assert dry.returncode == 0, dry.tail()
    gone = dry.json()["unused"]
    assert [d["path"] for d in gone["dirs"]] == [str(moved)] and gone["bytes"] == size, gone
    assert [d["path"] for d in gone["kept"]] == [str(unused / extra_key)] and gone["removed_dirs"] == 0
    assert moved.is_dir() and record.is_file()
    r = stage2("gc", stores, "--unused")
    assert r.returncode == 0, r.tail()
    assert f"removed  {extra_key}.1 (cache key {extra_key}): {n_extracted} file(s)" in r.stdout, r.stdout
    assert f"kept  {extra_key}: no extraction record" in r.stdout, r.stdout
    for kept in (notes, result.parent):
        assert f"{kept.relative_to(root)}" in r.stdout, r.stdout
    assert not record.exists() and (unused / extra_key).is_dir()
    assert sorted(p.relative_to(moved).as_posix() for p in moved.rglob("*")) == [
        "MY_NOTES.txt",
        "my_analysis",
        "my_analysis/result.csv",
    ]
    assert notes.read_text() == "mine\n" and result.read_text() == "a,b\n"
    listed = stage2("list", str(demo.profile), "--data-root", str(root), "--json").json()["unused"]
    assert [d["path"] for d in listed["dirs"]] == [str(unused / extra_key), str(moved)], listed
    shutil.move(foreign, tmp_path / "my_notes")
    r = build_cli(demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()


def _listed_aside(profile: Path, root: Path) -> dict[str, str]:
    """What `stage2 list --json` says was moved aside into the quarantine folder: each moved
    item's path under the data root before the move -> its reason."""
    r = stage2("list", str(profile), "--data-root", str(root), "--json")
    assert r.returncode == 0, r.tail()
    return {m["original"]: m["reason"] for m in json.loads(r.stdout)["quarantine"]["moved"]}


def test_a_reextraction_moves_the_users_files_aside_never_deletes_them(
    prepared: Prepared, built: Path, tmp_path: Path
) -> None:
    """A file and a folder of the user's in a cache directory make it extracted again (they are not
    what its extraction wrote); the build passes, and they are moved into the data root's quarantine
    folder under their path (`stage2 list` shows them), never deleted; the extracted files are not
    moved (they are made again from the verified archive)."""
    from stage2_data.extract import load_extraction_record

    demo = prepared.demo
    key = "jesbu1_epic_rfm_epic"
    root = copy_built(built, tmp_path / "root")
    cdir = layout.cache_dir(root, key)
    (cdir / "my_notes.txt").write_text("notes\n")
    (cdir / "mine").mkdir()
    (cdir / "mine" / "e.pt").write_text("x\n")
    r = build_cli(demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    rec = load_extraction_record(root, key)
    assert rec is not None and {p.name for p in cdir.iterdir()} == {r.split("/", 1)[0] for r in rec.entries}
    (folder,) = layout.quarantine_root(root).iterdir()
    under = folder / layout.PROCESSED_DIR / key
    assert (under / "my_notes.txt").read_text() == "notes\n"
    assert (under / "mine" / "e.pt").read_text() == "x\n"
    assert sorted(p.relative_to(under).as_posix() for p in under.rglob("*")) == [
        "mine",
        "mine/e.pt",
        "my_notes.txt",
    ]
    listed = _listed_aside(demo.profile, root)
    assert sorted(listed) == [
        f"{layout.PROCESSED_DIR}/{key}/mine",
        f"{layout.PROCESSED_DIR}/{key}/my_notes.txt",
    ]
    assert all(key in why and "never deleted" in why for why in listed.values()), listed
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("moved aside:")]  # the build says where
    assert len(said) == 2 and all(str(under) in ln for ln in said), r.stdout


def test_fault_arc_verified_record_forged(prepared: Prepared, built: Path, tmp_path: Path) -> None:
    """A verified archive with a byte flipped and its ``.verified.json`` forged to match (the new
    inode, size, mtime and ctime, the pin's sha256), and its cache directory's extraction record
    removed: the record says the bytes are the pin's, and no stat can tell. The extraction, which
    no step of this build had hashed the archive for, hashes it again first: refused by name, the
    archive and its record moved to quarantine (never deleted), nothing extracted from it; the next
    build downloads it again and publishes the clean store."""
    demo = prepared.demo
    root = _settled_copy(prepared, built, tmp_path / "root")
    (spec, *_) = load_profile(demo.profile).archives_by_cache_key()[SMALL]
    archive = layout.archive_path(root, spec.path)

    def flip(data: bytearray) -> None:
        data[len(data) // 2] ^= 0x01

    _edit_in_place(archive, flip)
    flipped = archive.read_bytes()
    record_path = layout.verified_record_path(root, spec.path)
    doc = json.loads(record_path.read_text())
    st = archive.stat()
    doc.update(inode=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)
    record_path.write_text(json.dumps(doc))
    layout.extraction_record_path(root, SMALL).unlink()
    cache_dir_before = sorted(p.name for p in layout.cache_dir(root, SMALL).iterdir())

    r = build_cli(demo.profile, root)
    out = r.stdout + r.stderr
    assert r.returncode == 1, r.tail()
    assert "internal error" not in out and "Traceback" not in out, out
    assert f"sha256 mismatch for {spec.path}" in out and "though its record" in out, out
    (kept,) = [p for p in layout.quarantine_root(root).rglob(archive.name) if p.is_file()]
    assert kept.read_bytes() == flipped and (kept.parent / record_path.name).is_file()
    assert str(kept) in out, out
    assert not archive.exists()
    assert sorted(p.name for p in layout.cache_dir(root, SMALL).iterdir()) == cache_dir_before

    with demo_hub(demo) as hub:
        again = build_cli(demo.profile, root, endpoint=hub.url)
    assert again.returncode == 0 and fingerprint(again) == prepared.fingerprint, again.tail()
    assert sha256_file(archive) == spec.sha256


def test_fault_kit_sidecar_flip_reverify(prepared: Prepared, built: Path, tmp_path: Path) -> None:
    """A flipped byte of an unpacked action sidecar with the unpack's index and record forged to
    match (the entry's stats and sha256, the record's content digest): `stage2 build --reverify`
    unpacks the sidecars again from the kit's verified tar, and the flipped file, which the
    unpack's index no longer says was its own, is moved aside, never deleted."""
    from stage2_data.extract import content_digest_of
    from stage2_data.kit.sidecar_facts import SIDECAR_INDEX, SIDECAR_MARKER

    demo = prepared.demo
    root = _settled_copy(prepared, built, tmp_path / "root")
    derived = layout.derived_root(root)
    sidecar = sorted((derived / layout.SIDECARS_DIR).rglob("*.npz"))[0]
    rel = sidecar.relative_to(derived).as_posix()

    def flip(data: bytearray) -> None:
        data[len(data) // 2] ^= 0xFF

    old = _edit_in_place(sidecar, flip)
    flipped = sidecar.read_bytes()
    index_path, marker_path = derived / SIDECAR_INDEX, derived / SIDECAR_MARKER
    index = json.loads(index_path.read_text())
    st = sidecar.stat()
    index["files"][rel].update(
        sha256=sha256_file(sidecar),
        ino=st.st_ino,
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        ctime_ns=st.st_ctime_ns,
    )
    index_path.write_text(json.dumps(index, sort_keys=True))
    marker = json.loads(marker_path.read_text())
    marker["content_digest"] = content_digest_of({r: str(e["sha256"]) for r, e in index["files"].items()})
    marker_path.write_text(json.dumps(marker))

    r = build_cli(demo.profile, root, "--reverify")
    out = r.stdout + r.stderr
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    assert "internal error" not in out and "Traceback" not in out, out
    assert sidecar.read_bytes() == old  # unpacked again from the kit's tar
    kept = [p for p in layout.quarantine_root(root).rglob(rel) if p.is_file()]
    assert [p.read_bytes() for p in kept] == [flipped], kept
