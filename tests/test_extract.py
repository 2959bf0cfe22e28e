"""Tests of stage2_data.extract on real tar files built here with tarfile."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as pa_ipc
import pytest

from stage2_data import layout
from stage2_data.errors import ArchiveError, UnsafeArchiveError
from stage2_data.extract import (
    REDOWNLOAD_FIX,
    ExtractionRecord,
    MultiPartReader,
    extract_cache_dir,
    inspect_cache_dir,
    load_extraction_record,
    open_archive_parts,
    read_processed_rows,
    stray_entries,
    write_extraction_report,
)
from stage2_data.extract.multipart import _gnu_split_suffix
from stage2_data.extract.tar import _FastTarInfo

KEY = "demo_src_rfm_demo_train"
MTIME = 1_700_000_000


# --------------------------------------------------------------------------------------------------
# helpers: a valid cache directory as (relative path -> bytes), and tars of it
# --------------------------------------------------------------------------------------------------


def _npz_bytes(rng: np.random.Generator, t: int, h: int, w: int) -> bytes:
    frames = rng.integers(0, 256, size=(t, h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez_compressed(
        buf, frames=frames, shape=np.asarray(frames.shape, dtype=np.int64), num_frames=np.int64(t)
    )
    return buf.getvalue()


def _arrow_bytes(key: str, ids: list[str], *, file_format: bool = False) -> bytes:
    n = len(ids)
    table = pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "task": pa.array([f"task {i % 3}" for i in range(n)], pa.string()),
            "data_source": pa.array(["demo"] * n, pa.string()),
            "frames": pa.array([layout.frames_relpath(key, i) for i in ids], pa.string()),
            "is_robot": pa.array([True] * n, pa.bool_()),
            "quality_label": pa.array(
                [("successful", "suboptimal", "failure")[i % 3] for i in range(n)], pa.string()
            ),
            "partial_success": pa.array(
                [None if i % 4 == 0 else 0.25 * (i % 4) for i in range(n)], pa.float32()
            ),
            "num_frames": pa.array([2 + i % 3 for i in range(n)], pa.int64()),
        }
    )
    sink = io.BytesIO()
    opener = pa_ipc.new_file if file_format else pa_ipc.new_stream
    with opener(sink, table.schema) as w:
        # two batches, so readers must iterate
        half = max(1, n // 2)
        for batch in table.to_batches(max_chunksize=half):
            w.write_batch(batch)
    return sink.getvalue()


def cache_dir_files(
    key: str = KEY,
    n: int = 6,
    *,
    seed: int = 0,
    total: int | None = None,
    row_ids: list[str] | None = None,
    frame_ids: list[str] | None = None,
    shards: int = 2,
    file_format: bool = False,
    with_info: bool = True,
) -> dict[str, bytes]:
    """A valid (or deliberately inconsistent) cache directory: {path relative to it: content}."""
    rng = np.random.default_rng(seed)
    r = random.Random(seed)
    ids = [str(uuid.UUID(int=r.getrandbits(128), version=4)) for _ in range(n)]
    rows = ids if row_ids is None else row_ids
    frames = ids if frame_ids is None else frame_ids
    files: dict[str, bytes] = {}
    if with_info:
        info = {
            "dataset_path": f"demo/{key}",
            "subset": "train",
            "total_trajectories": len(ids) if total is None else total,
            "cache_timestamp": "2025-01-01T00:00:00",
            "config_hash": "abc123",
        }
        files["dataset_info.json"] = json.dumps(info).encode()
    files["index_mappings.json"] = json.dumps({"robot_trajectories": list(range(len(rows)))}).encode()
    per = max(1, -(-len(rows) // shards))
    chunks = [rows[i : i + per] for i in range(0, len(rows), per)] or [[]]
    for s, chunk in enumerate(chunks):
        files[f"processed_dataset/data-{s:05d}-of-{len(chunks):05d}.arrow"] = _arrow_bytes(
            key, chunk, file_format=file_format
        )
    files["processed_dataset/dataset_info.json"] = b"{}"
    files["processed_dataset/state.json"] = json.dumps({"_data_files": []}).encode()
    for i, tid in enumerate(frames):
        # sizes vary (and some are bigger than a few blocks) so split points fall mid-member
        files[f"frames/trajectory_{tid}.npz"] = _npz_bytes(
            rng,
            2 + i % 3,
            8 + 4 * (i % 2),
            12,
        )
    return files


def _add_file(tf: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mode = mode
    ti.mtime = MTIME
    tf.addfile(ti, io.BytesIO(data))


def _add_dir(tf: tarfile.TarInfo | tarfile.TarFile, name: str) -> None:
    assert isinstance(tf, tarfile.TarFile)
    ti = tarfile.TarInfo(name)
    ti.type = tarfile.DIRTYPE
    ti.mode = 0o755
    ti.mtime = MTIME
    tf.addfile(ti)


def build_tar(
    path: Path,
    files: dict[str, bytes],
    *,
    key: str = KEY,
    prefix: str | None = None,
    extra: Callable[[tarfile.TarFile], None] | None = None,
    fmt: int = tarfile.GNU_FORMAT,
) -> Path:
    """Write a cache-dir tar. ``prefix`` is the member prefix (default ``processed_datasets/<key>/``)."""
    pre = f"{layout.PROCESSED_DIR}/{key}/" if prefix is None else prefix
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt) as tf:
        if pre.startswith(layout.PROCESSED_DIR):
            _add_dir(tf, layout.PROCESSED_DIR)
        _add_dir(tf, pre.rstrip("/"))
        dirs = sorted({str(Path(p).parent) for p in files} - {"."})
        for d in dirs:
            _add_dir(tf, pre + d)
        for rel in sorted(files):
            _add_file(tf, pre + rel, files[rel])
        if extra is not None:
            extra(tf)
    return path


def split_file(path: Path, cuts: list[int], out_dir: Path) -> list[Path]:
    data = path.read_bytes()
    out_dir.mkdir(parents=True, exist_ok=True)
    bounds = [0, *cuts, len(data)]
    parts = []
    for i in range(len(bounds) - 1):
        p = out_dir / f"{path.name}.part-{_gnu_split_suffix(i)}"
        p.write_bytes(data[bounds[i] : bounds[i + 1]])
        parts.append(p)
    return parts


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def all_paths(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --------------------------------------------------------------------------------------------------
# MultiPartReader
# --------------------------------------------------------------------------------------------------


def test_multipart_reader_random_access_matches_concatenation(tmp_path: Path) -> None:
    rnd = random.Random(1234)
    sizes = [0, 1, 777, 4096, 0, 10_000, 3]
    blobs = [rnd.randbytes(s) for s in sizes]
    paths = []
    for i, b in enumerate(blobs):
        p = tmp_path / f"x.part-{i}"
        p.write_bytes(b)
        paths.append(p)
    whole = b"".join(blobs)
    with MultiPartReader(paths) as r:
        assert r.size == len(whole) and r.readable() and r.seekable() and not r.writable()
        assert r.read() == whole
        assert r.read(10) == b""
        for _ in range(2000):
            pos = rnd.randrange(0, len(whole) + 20)
            n = rnd.randrange(0, 1100) if rnd.random() < 0.5 else rnd.randrange(0, 12_000)
            how = rnd.randrange(4)
            if how == 0:
                assert r.seek(pos) == pos
            elif how == 1:
                assert r.seek(pos - r.tell(), io.SEEK_CUR) == pos
            else:
                assert r.seek(pos - len(whole), io.SEEK_END) == pos
            if how == 3:
                buf = bytearray(n)
                got = r.readinto(buf)
                assert bytes(buf[:got]) == whole[pos : pos + n]
            else:
                assert r.read(n) == whole[pos : pos + n]
            assert r.tell() == pos + len(whole[pos : pos + n])
        # direct copy of arbitrary ranges into a file descriptor
        out = tmp_path / "copy.bin"
        for _ in range(50):
            a = rnd.randrange(0, len(whole))
            b = rnd.randrange(a, len(whole) + 1)
            seen: list[int] = []
            with open(out, "wb") as f:
                r.copy_range_to(f.fileno(), a, b - a, progress=seen.append)
            assert out.read_bytes() == whole[a:b]
            assert sum(seen) == b - a
        with open(out, "wb") as f, pytest.raises(EOFError):
            r.copy_range_to(f.fileno(), len(whole) - 2, 5)
        # a buffered wrapper works too
        r.seek(0)
        assert io.BufferedReader(r, buffer_size=100).read() == whole
    assert r.closed


def _member_facts(tf: tarfile.TarFile) -> list[tuple[object, ...]]:
    return [(m.get_info(), m.offset, m.offset_data, dict(m.pax_headers), m.sparse) for m in tf.getmembers()]


def test_fast_header_parser_matches_tarfile(tmp_path: Path) -> None:
    """The fast header path must give exactly the TarInfo the stock parser gives, for every format."""
    long_dir = "processed_datasets/" + KEY + "/" + "d" * 90
    members: list[tuple[str, bytes, dict[str, object]]] = [
        (f"{KEY}/a.txt", tarfile.REGTYPE, {"mode": 0o644}),
        (
            f"{KEY}/exe",
            tarfile.REGTYPE,
            {"mode": 0o4755, "uid": 1000, "gid": 1000, "uname": "u", "gname": "g"},
        ),
        (f"{KEY}/sub", tarfile.DIRTYPE, {"mode": 0o755}),
        (long_dir + "/trajectory_" + "x" * 60 + ".npz", tarfile.REGTYPE, {}),  # prefix / long name
        (f"{KEY}/ünïcödé.json", tarfile.REGTYPE, {}),
        (f"{KEY}/big_uid", tarfile.REGTYPE, {"uid": 2**30, "mtime": 2**34}),  # base-256 in GNU, pax in PAX
        (f"{KEY}/old", tarfile.REGTYPE, {"mtime": -5}),
        (f"{KEY}/dev", tarfile.CHRTYPE, {"devmajor": 4, "devminor": 64}),
        (f"{KEY}/link", tarfile.SYMTYPE, {"linkname": "a.txt"}),
        (f"{KEY}/hard", tarfile.LNKTYPE, {"linkname": f"{KEY}/a.txt"}),
        (f"{KEY}/fifo", tarfile.FIFOTYPE, {}),
    ]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT):
        path = tmp_path / f"f{fmt}.tar"
        with tarfile.open(path, "w", format=fmt) as tf:
            for i, (name, type_, attrs) in enumerate(members):
                ti = tarfile.TarInfo(name)
                ti.type = type_
                ti.mtime = MTIME
                for k, v in attrs.items():
                    setattr(ti, k, v)
                data = b"x" * (i * 300) if type_ == tarfile.REGTYPE else b""
                ti.size = len(data)
                try:
                    tf.addfile(ti, io.BytesIO(data))
                except ValueError:
                    assert fmt == tarfile.USTAR_FORMAT  # ustar cannot hold some of these; skip them
        with tarfile.open(path) as stock, open_archive_parts([path]) as fast:
            assert _member_facts(fast) == _member_facts(stock)
            assert all(isinstance(m, _FastTarInfo) for m in fast.getmembers())
            assert len(fast.getmembers()) >= 8


def test_gnu_tar_and_split_made_archives(tmp_path: Path) -> None:
    """Archives made by GNU tar and split (as upstream ones are), both layouts."""
    if not (shutil.which("tar") and shutil.which("split")):
        pytest.skip("GNU tar/split not installed")
    files = cache_dir_files(n=5, seed=11)
    src = _write_tree(tmp_path / "src" / "processed_datasets" / KEY, files)
    for cwd, arg, lay in [(src.parent.parent, f"processed_datasets/{KEY}", "processed_datasets/<key>/"),
                          (src.parent, KEY, "<key>/")]:  # fmt: skip
        arch = tmp_path / lay.replace("/", "_").strip("_<>") / "archives"
        arch.mkdir(parents=True)
        tarpath = arch / f"{KEY}.tar"
        subprocess.run(["tar", "-cf", str(tarpath), arg], cwd=cwd, check=True)
        subprocess.run(["split", "-b", "9000", str(tarpath), f"{tarpath}.part-"], check=True)
        tarpath.unlink()
        parts = sorted(arch.glob("*.part-*"))
        assert len(parts) >= 3
        root = arch.parent / "data"
        rec = extract_cache_dir(KEY, parts, root)
        assert rec.layout == lay and rec.problems == []
        assert tree(layout.cache_dir(root, KEY)) == files


def test_gnu_split_suffixes() -> None:
    assert [_gnu_split_suffix(i) for i in (0, 1, 25, 26, 649, 650, 651)] == [
        "aa", "ab", "az", "ba", "yz", "zaaa", "zaab",
    ]  # fmt: skip


# --------------------------------------------------------------------------------------------------
# extraction: layouts, split parts, records
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prefix", [f"processed_datasets/{KEY}/", f"{KEY}/", f"./processed_datasets/{KEY}/", f"./{KEY}/"]
)
def test_both_layouts_normalise(tmp_path: Path, prefix: str) -> None:
    files = cache_dir_files()
    tar = build_tar(tmp_path / "archives" / f"{KEY}.tar", files, prefix=prefix)
    root = tmp_path / "data"
    seen: list[int] = []
    rec = extract_cache_dir(KEY, [tar], root, progress=seen.append)
    out = layout.cache_dir(root, KEY)
    assert tree(out) == files
    assert sorted(os.listdir(layout.processed_root(root))) == [KEY]
    # modes and times come from the archive
    some = out / "dataset_info.json"
    assert some.stat().st_mtime == MTIME and (some.stat().st_mode & 0o777) == 0o644
    assert (out / "frames").stat().st_mtime == MTIME
    assert rec.layout == ("<key>/" if prefix.lstrip("./").startswith(KEY) else "processed_datasets/<key>/")
    assert rec.files == len(files) and rec.bytes == sum(len(b) for b in files.values()) == sum(seen)
    assert (rec.frame_files, rec.rows, rec.total_trajectories, rec.problems) == (6, 6, 6, [])
    assert rec.archives == [f"{KEY}.tar"]
    on_disk = json.loads(layout.extraction_record_path(root, KEY).read_text())
    assert on_disk == rec.to_dict()
    assert load_extraction_record(root, KEY) == rec


def test_mixed_layout_member_by_member(tmp_path: Path) -> None:
    files = cache_dir_files(n=3)

    def extra(tf: tarfile.TarFile) -> None:
        _add_file(tf, f"{KEY}/extra/notes.txt", b"hello")

    tar = build_tar(tmp_path / "a" / f"{KEY}.tar", files, extra=extra)
    rec = extract_cache_dir(KEY, [tar], tmp_path / "data")
    assert rec.layout == "mixed"
    assert (layout.cache_dir(tmp_path / "data", KEY) / "extra" / "notes.txt").read_bytes() == b"hello"


def test_split_parts_extract_identically_without_joined_copy(tmp_path: Path) -> None:
    files = cache_dir_files(n=12, seed=3)
    whole = build_tar(tmp_path / "whole" / f"{KEY}.tar", files)
    size = whole.stat().st_size
    # cuts that are not block-aligned: inside member data and inside headers
    cuts = [size // 3 + 7, size // 3 + 700, 2 * size // 3 + 301]
    parts = split_file(whole, cuts, tmp_path / "data_split" / "archives")
    assert [p.name for p in parts][-1] == f"{KEY}.tar.part-ad"

    rec_whole = extract_cache_dir(KEY, [whole], tmp_path / "data_whole")
    before = {str(p) for p in (tmp_path / "data_split").rglob("*")}
    rec_split = extract_cache_dir(KEY, list(reversed(parts)), tmp_path / "data_split")  # any order
    assert (
        tree(layout.cache_dir(tmp_path / "data_split", KEY))
        == tree(layout.cache_dir(tmp_path / "data_whole", KEY))
        == files
    )
    assert rec_split.archives == [p.name for p in parts]
    assert (rec_split.files, rec_split.bytes, rec_split.rows) == (rec_whole.files, rec_whole.bytes, 12)
    # no joined copy anywhere in the data root: the only new files are the extracted tree and the record
    new = {str(p) for p in (tmp_path / "data_split").rglob("*") if p.is_file()} - before
    allowed_dirs = (
        str(layout.cache_dir(tmp_path / "data_split", KEY)),
        str(layout.reports_dir(tmp_path / "data_split")),
    )
    assert new and all(p.startswith(allowed_dirs) for p in new)
    assert all(os.path.getsize(p) < size for p in new)


def test_reextraction_replaces_and_cleans_stale_temp_dirs(tmp_path: Path) -> None:
    root = tmp_path / "data"
    proc = layout.processed_root(root)
    stale = proc / f".{KEY}.tmp-99999999"
    (stale / "frames").mkdir(parents=True)
    (stale / "frames" / "junk.npz").write_bytes(b"x")
    other_stale = proc / ".other_key.tmp-99999999"
    other_stale.mkdir()
    old = layout.cache_dir(root, KEY)
    old.mkdir()
    (old / "leftover.txt").write_text("from a previous extraction")
    files = cache_dir_files(n=2)
    extract_cache_dir(KEY, [build_tar(tmp_path / f"{KEY}.tar", files)], root)
    assert tree(old) == files  # replaced, not merged
    assert sorted(os.listdir(proc)) == [".other_key.tmp-99999999", KEY]  # only this key's stale dirs go


# --------------------------------------------------------------------------------------------------
# refusals: nothing is written
# --------------------------------------------------------------------------------------------------


def _special(name: str, type_: bytes, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tf: tarfile.TarFile) -> None:
        ti = tarfile.TarInfo(name)
        ti.type = type_
        ti.linkname = linkname
        ti.mtime = MTIME
        tf.addfile(ti)

    return add


def _file(name: str, data: bytes = b"evil") -> Callable[[tarfile.TarFile], None]:
    return lambda tf: _add_file(tf, name, data)


UNSAFE = {
    "absolute": (_file("/tmp/evil.txt"), "/tmp/evil.txt", "absolute path"),
    "dotdot": (_file(f"{KEY}/../../evil.txt"), f"{KEY}/../../evil.txt", "'..'"),
    "dotdot_inside": (_file(f"{KEY}/frames/../x.txt"), f"{KEY}/frames/../x.txt", "'..'"),
    "symlink": (
        _special(f"{KEY}/frames/link.npz", tarfile.SYMTYPE, "/etc/passwd"),
        "link.npz",
        "symbolic link",
    ),
    "symlink_inside": (_special(f"{KEY}/l", tarfile.SYMTYPE, "frames"), f"{KEY}/l", "symbolic link"),
    "hardlink": (
        _special(f"{KEY}/h.json", tarfile.LNKTYPE, f"processed_datasets/{KEY}/dataset_info.json"),
        f"{KEY}/h.json",
        "hard link",
    ),
    "chardev": (_special(f"{KEY}/dev", tarfile.CHRTYPE), f"{KEY}/dev", "character device"),
    "blockdev": (_special(f"{KEY}/blk", tarfile.BLKTYPE), f"{KEY}/blk", "block device"),
    "fifo": (_special(f"{KEY}/fifo", tarfile.FIFOTYPE), f"{KEY}/fifo", "FIFO"),
    "other_cache_key": (
        _file("processed_datasets/another_key/frames/trajectory_x.npz"),
        "processed_datasets/another_key/frames/trajectory_x.npz",
        "belongs to 'another_key'",
    ),
    "extra_top_level_folder": (_file("stuff/readme.txt"), "stuff/readme.txt", "outside the cache directory"),
    "top_level_file": (_file("readme.txt"), "readme.txt", "outside the cache directory"),
    "duplicate": (
        _file(f"processed_datasets/{KEY}/dataset_info.json", b"{}"),
        "dataset_info.json",
        "duplicate",
    ),
    "duplicate_other_layout": (
        _file(f"./{KEY}/index_mappings.json", b"{}"),
        "index_mappings.json",
        "duplicate",
    ),
    "file_as_cache_dir": (None, KEY, "not a directory"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_member_refused_and_nothing_written(tmp_path: Path, case: str) -> None:
    extra, member, reason = UNSAFE[case]
    files = cache_dir_files(n=3)
    tarpath = tmp_path / "archives" / f"{KEY}.tar"
    if case == "file_as_cache_dir":
        tarpath.parent.mkdir(parents=True)
        with tarfile.open(tarpath, "w") as tf:
            _add_file(tf, KEY, b"not a dir")
    else:
        build_tar(tarpath, files, extra=extra, fmt=tarfile.PAX_FORMAT)
    root = tmp_path / "data"
    # an existing good extraction must survive a refused archive untouched
    layout.cache_dir(root, KEY).mkdir(parents=True)
    (layout.cache_dir(root, KEY) / "keep.txt").write_text("keep")
    before = all_paths(root)
    with pytest.raises(UnsafeArchiveError) as ei:
        extract_cache_dir(KEY, [tarpath], root)
    msg = str(ei.value)
    assert f"{KEY}.tar" in msg and member in msg and reason in msg, msg
    assert ei.value.fix == REDOWNLOAD_FIX
    assert all_paths(root) == before  # no temp dir, no record, nothing extracted


def test_all_refused_members_are_reported_at_once(tmp_path: Path) -> None:
    def extra(tf: tarfile.TarFile) -> None:
        _special(f"{KEY}/a", tarfile.SYMTYPE, "x")(tf)
        _special(f"{KEY}/b", tarfile.FIFOTYPE)(tf)
        _file("other/c")(tf)

    tarpath = build_tar(tmp_path / f"{KEY}.tar", cache_dir_files(n=1), extra=extra)
    with pytest.raises(UnsafeArchiveError) as ei:
        extract_cache_dir(KEY, [tarpath], tmp_path / "data")
    msg = str(ei.value)
    assert f"'{KEY}/a'" in msg and f"'{KEY}/b'" in msg and "'other/c'" in msg and "2 more" in msg
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*"))


def test_split_parts_with_unsafe_member_refused(tmp_path: Path) -> None:
    whole = build_tar(
        tmp_path / f"{KEY}.tar", cache_dir_files(n=4), extra=_special(f"{KEY}/z", tarfile.SYMTYPE, "/")
    )
    parts = split_file(whole, [whole.stat().st_size // 2 + 5], tmp_path / "parts")
    with pytest.raises(UnsafeArchiveError, match="symbolic link"):
        extract_cache_dir(KEY, parts, tmp_path / "data")
    assert not (tmp_path / "data" / "processed_datasets").exists() or not any(
        (tmp_path / "data" / "processed_datasets").iterdir()
    )


# --------------------------------------------------------------------------------------------------
# truncated / corrupt / incomplete archives
# --------------------------------------------------------------------------------------------------


def _member_offsets(tarpath: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(tarpath) as tf:
        return tf.getmembers()


def test_truncated_tar_is_an_archive_error(tmp_path: Path) -> None:
    tarpath = build_tar(tmp_path / "src" / f"{KEY}.tar", cache_dir_files(n=5))
    data = tarpath.read_bytes()
    ms = [m for m in _member_offsets(tarpath) if m.isreg()]
    last = ms[-1]
    mid = ms[len(ms) // 2]
    cuts = {
        "mid_data": mid.offset_data + mid.size // 2,
        "mid_header": mid.offset + 100,
        "header_boundary": mid.offset,  # tarfile alone would silently stop here
        "after_last_member": last.offset_data + ((last.size + 511) // 512) * 512,  # no end marker
        "last_member_data": last.offset_data + last.size - 1,
        "tiny": 300,
    }
    for what, cut in cuts.items():
        bad = tmp_path / what / f"{KEY}.tar"
        bad.parent.mkdir()
        bad.write_bytes(data[:cut])
        root = tmp_path / what / "data"
        with pytest.raises(ArchiveError) as ei:
            extract_cache_dir(KEY, [bad], root)
        assert f"{KEY}.tar" in str(ei.value) and "truncated" in str(ei.value), (what, str(ei.value))
        assert ei.value.fix and "download" in ei.value.fix
        assert not root.exists() or not any(root.rglob("*")), what


def test_corrupt_header_in_the_middle(tmp_path: Path) -> None:
    tarpath = build_tar(tmp_path / f"{KEY}.tar", cache_dir_files(n=5))
    ms = [m for m in _member_offsets(tarpath) if m.isreg()]
    data = bytearray(tarpath.read_bytes())
    data[ms[4].offset + 10] ^= 0xFF  # breaks the header checksum; tarfile would stop listing silently
    tarpath.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="invalid tar header"):
        open_archive_parts([tarpath])


def test_missing_middle_part_is_named(tmp_path: Path) -> None:
    whole = build_tar(tmp_path / f"{KEY}.tar", cache_dir_files(n=6))
    size = whole.stat().st_size
    parts = split_file(whole, [size // 3 + 11, 2 * size // 3 + 13], tmp_path / "parts")
    with pytest.raises(ArchiveError) as ei:
        extract_cache_dir(KEY, [parts[0], parts[2]], tmp_path / "data")
    assert f"{KEY}.tar.part-ab" in str(ei.value) and "missing" in str(ei.value)
    with pytest.raises(ArchiveError, match=r"part-aa is missing"):
        open_archive_parts(parts[1:])
    # the file of a named part is gone
    parts[1].unlink()
    with pytest.raises(ArchiveError, match=r"part-ab is missing"):
        open_archive_parts(parts)
    assert not (tmp_path / "data").exists()


def test_wrong_parts_under_right_names_suggest_missing_part(tmp_path: Path) -> None:
    whole = build_tar(tmp_path / f"{KEY}.tar", cache_dir_files(n=6))
    size = whole.stat().st_size
    parts = split_file(whole, [size // 3 + 11, 2 * size // 3 + 13], tmp_path / "parts")
    # -ac renamed to -ab: the names are gap-free but the stream is not
    parts[2].rename(parts[1])
    with pytest.raises(ArchiveError) as ei:
        extract_cache_dir(KEY, parts[:2], tmp_path / "data")
    assert f"{KEY}.tar" in str(ei.value) and "missing or out of order" in str(ei.value)


def test_mixed_or_foreign_parts_refused(tmp_path: Path) -> None:
    a = tmp_path / "a.tar"
    a.write_bytes(b"")
    b = tmp_path / "b.tar.part-aa"
    b.write_bytes(b"")
    c = tmp_path / "c.tar.part-ab"
    c.write_bytes(b"")
    with pytest.raises(ArchiveError, match="mix a whole tar"):
        open_archive_parts([a, b])
    with pytest.raises(ArchiveError, match="different archives"):
        open_archive_parts([b, c])
    with pytest.raises(ArchiveError, match="a.tar is truncated or corrupt"):
        open_archive_parts([a])
    with pytest.raises(ArchiveError, match="invalid cache key"):
        extract_cache_dir("../x", [a], tmp_path)


# --------------------------------------------------------------------------------------------------
# inspection
# --------------------------------------------------------------------------------------------------


def _write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def test_inspect_consistent_dir(tmp_path: Path) -> None:
    d = _write_tree(tmp_path / KEY, cache_dir_files(n=7, shards=3))
    info = inspect_cache_dir(d)
    assert info.problems == []
    assert (info.cache_key, info.rows, info.total_trajectories) == (KEY, 7, 7)
    assert set(info.row_ids) == info.frame_ids and len(info.frame_ids) == 7
    table = read_processed_rows(d)
    assert table.num_rows == 7 and table.column("id").to_pylist() == info.row_ids
    sub = read_processed_rows(d, ["num_frames", "id"])
    assert sub.column_names == ["num_frames", "id"] and sub.column("id").to_pylist() == info.row_ids
    with pytest.raises(ArchiveError, match="no column"):
        read_processed_rows(d, ["nope"])


def test_inspect_arrow_file_format_fallback(tmp_path: Path) -> None:
    d = _write_tree(tmp_path / KEY, cache_dir_files(n=4, file_format=True))
    info = inspect_cache_dir(d)
    assert info.problems == [] and info.rows == 4
    assert read_processed_rows(d, ["id"]).num_rows == 4


def test_inspect_finds_count_mismatches(tmp_path: Path) -> None:
    base = cache_dir_files(n=4)
    ids = [k.split("_", 1)[1][:-4] for k in base if k.startswith("frames/")]
    # dataset_info disagrees with the files
    d1 = _write_tree(tmp_path / "a" / KEY, cache_dir_files(n=4, total=5))
    p1 = inspect_cache_dir(d1).problems
    assert any("total_trajectories=5 but 4 frame files" in p for p in p1)
    assert any("total_trajectories=5 but 4 processed_dataset rows" in p for p in p1)
    # a frame without a row (and so a count mismatch)
    d2 = _write_tree(tmp_path / "b" / KEY, cache_dir_files(n=4, row_ids=ids[:3], total=4))
    info2 = inspect_cache_dir(d2)
    assert info2.rows == 3 and len(info2.frame_ids) == 4
    assert any(f"frame file without a row, id: {ids[3]}" in p for p in info2.problems)
    assert any("4 frame files but 3 processed_dataset rows" in p for p in info2.problems)
    # a row without a frame file, a duplicate id, a stray file, no dataset_info.json
    d3 = _write_tree(
        tmp_path / "c" / KEY,
        cache_dir_files(n=4, row_ids=[*ids, ids[0]], frame_ids=ids[1:], with_info=False),
    )
    (d3 / "frames" / "notes.txt").write_text("x")
    p3 = inspect_cache_dir(d3).problems
    assert any(f"row without a frame file, id: {ids[0]}" in p for p in p3)
    assert any(f"duplicate row id: {ids[0]}" in p for p in p3)
    assert any("missing dataset_info.json" in p for p in p3)
    assert any("unexpected entry in frames/: notes.txt" in p for p in p3)
    assert inspect_cache_dir(d3).total_trajectories == -1


def test_extraction_records_problems_but_succeeds(tmp_path: Path) -> None:
    tar = build_tar(tmp_path / f"{KEY}.tar", cache_dir_files(n=3, total=9))
    rec = extract_cache_dir(KEY, [tar], tmp_path / "data")
    assert (rec.frame_files, rec.rows, rec.total_trajectories) == (3, 3, 9)
    assert any("total_trajectories=9" in p for p in rec.problems)


# --------------------------------------------------------------------------------------------------
# report, strays
# --------------------------------------------------------------------------------------------------


def test_extraction_report_content(tmp_path: Path) -> None:
    root = tmp_path / "data"
    k2 = "other_src_rfm_other"
    r1 = extract_cache_dir(KEY, [build_tar(tmp_path / f"{KEY}.tar", cache_dir_files(n=3))], root)
    t2 = build_tar(tmp_path / f"{k2}.tar", cache_dir_files(k2, n=5, seed=9), key=k2, prefix=f"{k2}/")
    parts = split_file(t2, [t2.stat().st_size // 2 + 3], tmp_path / "p")
    r2 = extract_cache_dir(k2, parts, root)
    path = write_extraction_report(root, [r2, r1])
    assert path == layout.extraction_report_path(root) == root / "extraction_report.json"
    doc = json.loads(path.read_text())
    assert list(doc["cache_keys"]) == sorted([KEY, k2])
    e1 = doc["cache_keys"][KEY]
    assert (e1["files"], e1["bytes"], e1["trajectories_found"], e1["total_trajectories"]) == (
        r1.files, r1.bytes, 3, 3,
    )  # fmt: skip
    assert isinstance(e1["seconds"], float) and e1["layout"] == "processed_datasets/<key>/"
    e2 = doc["cache_keys"][k2]
    assert e2["archives"] == [f"{k2}.tar.part-aa", f"{k2}.tar.part-ab"] and e2["layout"] == "<key>/"
    assert doc["totals"]["trajectories_found"] == 8 and doc["totals"]["cache_dirs"] == 2
    assert doc["totals"]["archives"] == 3 and doc["totals"]["bytes"] == r1.bytes + r2.bytes
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ValueError):
        write_extraction_report(root, [r1, r1])
    assert ExtractionRecord.from_dict(r2.to_dict()) == r2


def test_stray_entries(tmp_path: Path) -> None:
    root = tmp_path / "data"
    assert stray_entries(root, [KEY]) == []
    proc = layout.processed_root(root)
    (proc / KEY).mkdir(parents=True)
    (proc / "unexpected_key").mkdir()
    (proc / "notes.txt").write_text("x")
    (proc / ".hidden").mkdir()
    (proc / f".{KEY}.tmp-123").mkdir()
    (proc / f".{KEY}.old-456").mkdir()
    (proc / "expected_but_file").write_text("x")
    (proc / "linked").symlink_to(proc / KEY)
    assert stray_entries(root, [KEY, "expected_but_file", "linked", "absent"]) == [
        ".hidden",
        "expected_but_file",
        "notes.txt",
        "unexpected_key",
    ]


def test_names_with_a_trailing_newline_are_not_plain(tmp_path: Path) -> None:
    """The cache-key and plain-name patterns match whole names: ``re.match`` with ``$`` accepted a
    trailing newline ("key\\n"), which must be refused (a cache key) or go through tarfile's data
    filter (a member name)."""
    from stage2_data.extract.safety import _PLAIN_NAME_RE, CACHE_KEY_RE, _check_cache_key

    assert CACHE_KEY_RE.fullmatch("key") and not CACHE_KEY_RE.fullmatch("key\n")
    assert _PLAIN_NAME_RE.fullmatch("key/frames/a.npz") and not _PLAIN_NAME_RE.fullmatch("key/frames/a.npz\n")
    with pytest.raises(ArchiveError, match="invalid cache key 'key\\\\n'"):
        _check_cache_key("key\n")
    a = tmp_path / "key.tar"
    a.write_bytes(b"")
    with pytest.raises(ArchiveError, match="invalid cache key"):
        extract_cache_dir("key\n", [a], tmp_path / "root")
