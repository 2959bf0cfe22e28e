"""stage2_data.kit.sidecars and sidecar_facts: the sidecar tar (checksum, unsafe members, atomic unpack) and one
sidecar npz (object arrays refused, container variants), on the tiny kit (tests/helpers/kit.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.kit import (
    TAR_REL,
    A,
    B,
    build,
    rows_by_id,
    sidecar_npz,
    sidecar_rel,
    the_only_problem,
    write_sha_file,
    write_tar,
)

from stage2_data import kit
from stage2_data.errors import ChecksumMismatchError, KitError, UnsafeArchiveError


class Boom:
    """Unpickling this creates a folder: proof that a loader unpickled the array."""

    marker = ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.marker,))


def test_object_array_sidecar_is_refused_not_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    Boom.marker = str(marker)
    buf = io.BytesIO()
    np.savez(
        buf,
        metadata_json=np.array(json.dumps({"raw_width": 7})),
        raw_actions=np.array([Boom()], dtype=object),
        aligned_actions=np.zeros((5, 7)),
    )
    data = buf.getvalue()
    b = build(tmp_path / "root", lambda s: s.sidecars.__setitem__(sidecar_rel("autoeval", A[3]), data))
    join = kit.build_join_table(b.profile, b.data_root)
    the_only_problem(
        join.problems,
        [f"trajectory_{A[3]}.npz: key(s) raw_actions hold object (pickled) arrays", "not unpickled"],
    )
    assert not marker.exists()
    row = rows_by_id(join.table_path)[A[3]]
    assert row["sidecar_present"] is True and row["raw_width"] is None
    # control: the file really does run code when unpickled
    with np.load(b.data_root / "derived" / sidecar_rel("autoeval", A[3]), allow_pickle=True) as z:
        z["raw_actions"]
    assert marker.is_dir()


# ------------------------------------------------------------------------------------------------
# Sidecar archive safety
# ------------------------------------------------------------------------------------------------
def test_sidecar_tar_checksum_mismatch_unpacks_nothing(tmp_path: Path) -> None:
    b = build(tmp_path, unpack=False)
    tar = b.kit(TAR_REL)
    expected = (tar.parent / (tar.name + ".sha256")).read_text().split()[0]
    raw = bytearray(tar.read_bytes())
    raw[3000] ^= 0xFF  # inside the first member's data
    tar.write_bytes(bytes(raw))
    with pytest.raises(ChecksumMismatchError) as ei:
        kit.unpack_sidecars(b.profile, b.data_root)
    err = ei.value
    assert err.path == str(tar) and err.expected == expected
    assert err.actual == hashlib.sha256(bytes(raw)).hexdigest() != expected
    assert str(tar) in str(err) and err.fix and tar.name in err.fix
    assert not (b.data_root / "derived").exists()


def test_sidecar_sha_file_must_name_the_tar(tmp_path: Path) -> None:
    b = build(tmp_path, unpack=False)
    tar = b.kit(TAR_REL)
    write_sha_file(tar, "other.tar")
    with pytest.raises(KitError, match="names 'other.tar', not the archive"):
        kit.unpack_sidecars(b.profile, b.data_root)
    # a path prefix (sha256sum run from the kit root) is accepted
    write_sha_file(tar, "derived/" + tar.name)
    assert kit.unpack_sidecars(b.profile, b.data_root).files == 10


def _bad_member(kind: str) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(
        {
            "symlink": f"action_sidecars/autoeval/trajectory_{A[0]}.npz",
            "hardlink": f"action_sidecars/autoeval/trajectory_{A[0]}.npz",
            "dotdot": "action_sidecars/../../evil.npz",
            "absolute": "/tmp/evil.npz",
            "fifo": "action_sidecars/autoeval/fifo",
            "device": "action_sidecars/autoeval/dev",
            "no source": "action_sidecars/loose.npz",
            "outside": "elsewhere/trajectory_x.npz",
            "nested": "action_sidecars/autoeval/sub/trajectory_x.npz",
            "duplicate": sidecar_rel("roboarena", B[0]),
        }[kind]
    )
    if kind == "symlink":
        ti.type, ti.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "hardlink":
        ti.type, ti.linkname = tarfile.LNKTYPE, "/etc/passwd"
    elif kind == "fifo":
        ti.type = tarfile.FIFOTYPE
    elif kind == "device":
        ti.type = tarfile.CHRTYPE
    return ti


@pytest.mark.parametrize(
    "kind",
    [
        "symlink",
        "hardlink",
        "dotdot",
        "absolute",
        "fifo",
        "device",
        "no source",
        "outside",
        "nested",
        "duplicate",
    ],
)
def test_unsafe_sidecar_member_refused(tmp_path: Path, kind: str) -> None:
    b = build(tmp_path, unpack=False)
    tar = b.kit(TAR_REL)
    bad = _bad_member(kind)
    with tarfile.open(tar, "a") as tf:  # after the good members
        if bad.isreg():
            data = b"x" * 10
            bad.size = len(data)
            tf.addfile(bad, io.BytesIO(data))
        else:
            tf.addfile(bad)
    write_sha_file(tar)
    with pytest.raises(UnsafeArchiveError) as ei:
        kit.unpack_sidecars(b.profile, b.data_root)
    assert repr(bad.name) in str(ei.value)
    assert not (b.data_root / "derived").exists()


def test_refused_tar_leaves_previous_unpack_in_place(tmp_path: Path) -> None:
    b = build(tmp_path)
    before = sorted(p.name for p in (b.data_root / "derived" / "action_sidecars" / "autoeval").iterdir())
    tar = b.kit(TAR_REL)
    with tarfile.open(tar, "a") as tf:
        tf.addfile(_bad_member("symlink"))
    write_sha_file(tar)
    with pytest.raises(UnsafeArchiveError):
        kit.unpack_sidecars(b.profile, b.data_root)
    after = sorted(p.name for p in (b.data_root / "derived" / "action_sidecars" / "autoeval").iterdir())
    assert before == after and len(after) == 5
    assert sorted(p.name for p in (b.data_root / "derived").iterdir()) == [
        ".sidecars.index.json",
        ".sidecars.json",
        "action_sidecars",
    ]


def test_unpack_skips_when_already_done_and_redoes_on_change(tmp_path: Path) -> None:
    b = build(tmp_path)
    again = kit.unpack_sidecars(b.profile, b.data_root)
    assert again.skipped and again.files == 10 and again.by_source == {"autoeval": 5, "roboarena": 5}
    # a file removed from the unpacked tree: unpacked again
    victim = b.data_root / "derived" / sidecar_rel("autoeval", A[0])
    victim.unlink()
    redo = kit.unpack_sidecars(b.profile, b.data_root)
    assert not redo.skipped and victim.is_file()
    # a new tar (new sha256 file): unpacked again, the old tree replaced
    tar = b.kit(TAR_REL)
    write_tar(tar, {sidecar_rel("autoeval", A[0]): b"new"})
    write_sha_file(tar)
    new = kit.unpack_sidecars(b.profile, b.data_root)
    assert not new.skipped and new.files == 1
    assert [p.name for p in (b.data_root / "derived" / "action_sidecars").iterdir()] == ["autoeval"]
    assert victim.read_bytes() == b"new"


def test_sidecars_status_says_what_unpack_would_do(tmp_path: Path) -> None:
    """sidecars_status (the build's kit stage: skip its run?) agrees with unpack_sidecars' own skip,
    by stats and the tar's .sha256 file only."""
    b = build(tmp_path, unpack=False)
    assert "not unpacked" in (kit.sidecars_status(b.profile, b.data_root) or "")
    kit.unpack_sidecars(b.profile, b.data_root)
    assert kit.sidecars_status(b.profile, b.data_root) is None
    assert kit.unpack_sidecars(b.profile, b.data_root).skipped
    (b.data_root / "derived" / sidecar_rel("autoeval", A[0])).unlink()  # one file fewer
    assert kit.sidecars_status(b.profile, b.data_root) is not None
    kit.unpack_sidecars(b.profile, b.data_root)
    tar = b.kit(TAR_REL)
    write_tar(tar, {sidecar_rel("autoeval", A[0]): b"new"})
    write_sha_file(tar)  # another tar
    assert kit.sidecars_status(b.profile, b.data_root) is not None
    (tar.parent / (tar.name + ".sha256")).unlink()
    assert "cannot be checked" in (kit.sidecars_status(b.profile, b.data_root) or "")


def test_a_stop_cancels_the_unpack_and_publishes_nothing(tmp_path: Path) -> None:
    """A stop (cancel_extractions, as the stop guard calls it) ends the unpack between members: the
    staging folder is removed and nothing is published; once allowed again, it unpacks."""
    from stage2_data.extract import ExtractionCancelled, cancel_extractions

    b = build(tmp_path, unpack=False)
    cancel_extractions()
    try:
        with pytest.raises(ExtractionCancelled, match="cancelled"):
            kit.unpack_sidecars(b.profile, b.data_root)
    finally:
        cancel_extractions(False)
    derived = b.data_root / "derived"
    assert not derived.exists() or list(derived.iterdir()) == []  # no staging folder, nothing published
    assert kit.unpack_sidecars(b.profile, b.data_root).files == 10


def test_a_disk_full_while_unpacking_is_named_and_publishes_nothing(tmp_path: Path) -> None:
    """A real tmpfs data root with room for a few files only (nr_inodes): the unpack runs out of
    space mid-way (after the free-bytes check passed) and says so, naming the folder; nothing is
    published and no staging folder stays."""
    import subprocess

    from stage2_data.errors import DiskSpaceError

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for this test needs root")
    b = build(tmp_path / "kit", unpack=False)
    root = tmp_path / "root"
    root.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=8", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        with pytest.raises(DiskSpaceError) as ei:
            kit.unpack_sidecars(b.profile, root)
        assert str(root / "derived") in str(ei.value) and "nothing was published" in str(ei.value)
        assert ei.value.fix and "free disk space" in ei.value.fix
        derived = root / "derived"
        assert not derived.exists() or list(derived.iterdir()) == []
    finally:
        subprocess.run(["umount", str(root)], check=False)


def test_unpack_reads_members_in_chunks_with_exact_bytes_and_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members are read from the tar a chunk at a time (here: a chunk per member, the smallest);
    every file holds exactly its member's bytes and has mode 0o644 whatever the umask."""
    from stage2_data.kit import sidecars

    monkeypatch.setattr(sidecars, "_READ_CHUNK", 1)
    b = build(tmp_path, unpack=False)
    old = os.umask(0o077)
    try:
        res = kit.unpack_sidecars(b.profile, b.data_root)
    finally:
        os.umask(old)
    assert res.files == 10
    for rel, data in b.spec.sidecars.items():
        path = b.data_root / "derived" / rel
        assert path.read_bytes() == data and (path.stat().st_mode & 0o7777) == 0o644


def test_tar_cut_inside_a_member_is_not_readable_and_unpacks_nothing(tmp_path: Path) -> None:
    """A tar that ends inside its last member's data (its sha256 file regenerated to match) is
    refused as not a readable tar (tarfile's own words); nothing is written."""
    from stage2_data.errors import ArchiveError

    b = build(tmp_path, unpack=False)
    tar = b.kit(TAR_REL)
    with tarfile.open(tar) as tf:
        last = tf.getmembers()[-1]
    tar.write_bytes(tar.read_bytes()[: last.offset_data + last.size // 2])
    write_sha_file(tar)
    with pytest.raises(ArchiveError, match="not a readable tar"):
        kit.unpack_sidecars(b.profile, b.data_root)
    assert not (b.data_root / "derived" / "action_sidecars").exists()
    assert not (b.data_root / "derived" / kit.SIDECAR_INDEX).exists()


# ------------------------------------------------------------------------------------------------
# Sidecar container variants (the lean npz reader against numpy's own writer and other zips)
# ------------------------------------------------------------------------------------------------
def _rezip(
    npz: bytes, *, replace: dict[str, bytes] | None = None, comment: bytes = b"", method: int = 8
) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(npz))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=method) as dst:
        for name in src.namelist():
            dst.writestr(name, (replace or {}).get(name, src.read(name)))
        dst.comment = comment
    return out.getvalue()


def _npy_with_header(header: str, data: bytes) -> bytes:
    text = header.encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


def _stored_npz(source: str, width: int, n: int, t: int) -> bytes:
    return _rezip(sidecar_npz(source, width, n, t), method=zipfile.ZIP_STORED)


def _raw_bytes(source: str, width: int, n: int, t: int) -> bytes:
    """The raw actions of ``sidecar_npz(...)`` as bare little-endian bytes (the data its aligned
    rows are checked against)."""
    with np.load(io.BytesIO(sidecar_npz(source, width, n, t)), allow_pickle=False) as z:
        return np.ascontiguousarray(z["raw_actions"], dtype="<f4").tobytes()


def _structured_object_npz() -> bytes:
    buf = io.BytesIO()
    arr = np.zeros(2, dtype=[("a", "f4"), ("b", "O")])
    np.savez(
        buf, metadata_json=np.array('{"raw_width": 8}'), raw_actions=arr, aligned_actions=np.zeros((4, 8))
    )
    return buf.getvalue()


def _edited(edit: Callable[[dict[str, np.ndarray]], None]) -> bytes:
    """The B[1] sidecar (roboarena, width 8, 9 raw rows, 4 aligned) with ``edit`` applied to its
    arrays (the data checks: tests/test_faults_kit.py has the end-to-end rows)."""
    with np.load(io.BytesIO(sidecar_npz("roboarena", 8, 9, 4)), allow_pickle=False) as z:
        arrays = {k: z[k].copy() for k in z.files}
    edit(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _set(key: str, value: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict[str, np.ndarray]], None]:
    return lambda a: a.__setitem__(key, value(a[key]))


def _with_item(arr: np.ndarray, at: tuple[int, ...], value: float) -> np.ndarray:
    arr[at] = value
    return arr


def _float64_raw(a: dict[str, np.ndarray]) -> None:
    a["raw_actions"] = a["raw_actions"].astype(np.float64) + 1e-9  # float32(aligned) == float32(raw)
    a["aligned_actions"] = a["raw_actions"][a["alignment_indices"]].astype(np.float32)


VARIANTS: dict[str, tuple[Callable[[], bytes], int | None, str | None]] = {
    # name: (bytes of the B[1] sidecar (num_frames 4), expected raw_width, expected problem substring)
    "stored (np.savez)": (lambda: _stored_npz("roboarena", 8, 9, 4), 8, None),
    "zip comment (zipfile fallback)": (
        lambda: _rezip(sidecar_npz("roboarena", 8, 9, 4), comment=b"hi"),
        8,
        None,
    ),
    "reordered header keys (literal_eval)": (
        lambda: _rezip(
            sidecar_npz("roboarena", 8, 9, 4),
            replace={
                "raw_actions.npy": _npy_with_header(
                    "{'shape': (9, 8), 'fortran_order': False, 'descr': '<f4'}",
                    _raw_bytes("roboarena", 8, 9, 4),
                )
            },
        ),
        8,
        None,
    ),
    "structured dtype with an object field": (_structured_object_npz, None, "hold object (pickled) arrays"),
    "aligned NaN": (
        lambda: _edited(_set("aligned_actions", lambda x: _with_item(x, (1, 2), np.nan))),
        8,
        "aligned_actions holds 1 non-finite value(s) (NaN or inf; first at row 1, column 2)",
    ),
    "aligned -inf": (
        lambda: _edited(_set("aligned_actions", lambda x: _with_item(x, (3, 0), -np.inf))),
        8,
        "non-finite value(s) (NaN or inf; first at row 3, column 0)",
    ),
    "alignment index outside the raw actions": (
        lambda: _edited(_set("alignment_indices", lambda x: _with_item(x, (3,), 9))),
        8,
        "alignment_indices[3] = 9 is outside raw_actions' 9 rows",
    ),
    "negative alignment index": (
        lambda: _edited(_set("alignment_indices", lambda x: _with_item(x, (0,), -1))),
        8,
        "alignment_indices[0] = -1 is outside raw_actions' 9 rows",
    ),
    "aligned row that is not the raw row it indexes": (
        lambda: _edited(_set("aligned_actions", lambda x: _with_item(x, (2, 5), x[2, 5] + 1))),
        8,
        "aligned_actions row 2 differs from raw_actions row",
    ),
    "alignment indices of the wrong length": (
        lambda: _edited(_set("alignment_indices", lambda x: x[:3])),
        8,
        "alignment_indices is int64 (3,); expected (4,) integers, one per aligned_actions row",
    ),
    "source indices of the wrong length": (
        lambda: _edited(_set("source_indices", lambda x: x[:-1])),
        8,
        "source_indices is int64 (8,); expected (9,) integers, one per raw_actions row",
    ),
    "float32 aligned copy of float64 raw (consistent)": (lambda: _edited(_float64_raw), 8, None),
    "not a zip": (lambda: b"definitely not an npz file", None, "unreadable sidecar npz"),
    "truncated": (lambda: sidecar_npz("roboarena", 8, 9, 4)[:-40], None, "unreadable sidecar npz"),
    "corrupt metadata member": (
        lambda: _rezip(sidecar_npz("roboarena", 8, 9, 4), replace={"metadata_json.npy": b"\x93NUMPY\x09"}),
        8,
        "metadata_json.npy",
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sidecar_container_variants(tmp_path: Path, variant: str) -> None:
    make, width, problem = VARIANTS[variant]
    data = make()
    b = build(tmp_path, lambda s: s.sidecars.__setitem__(sidecar_rel("roboarena", B[1]), data))
    join = kit.build_join_table(b.profile, b.data_root)
    row = rows_by_id(join.table_path)[B[1]]
    assert row["raw_width"] == width
    if problem is None:
        assert join.problems == []
        assert (row["aligned_length"], row["length_ok"], row["width_ok"]) == (4, True, True)
    else:
        the_only_problem(join.problems, [f"trajectory_{B[1]}.npz", problem])
    assert row["sidecar_sha256_ok"] is True and row["sidecar_bytes"] == len(data)


def test_the_unpack_records_every_sidecars_sha256_and_stats(tmp_path: Path) -> None:
    """The index holds each sidecar's sha256 and (inode, size, mtime, ctime) as written; the record
    a content digest that depends on the bytes only."""
    from stage2_data.extract import content_digest_of

    b = build(tmp_path, unpack=False)
    kit.unpack_sidecars(b.profile, b.data_root)
    derived = b.data_root / "derived"
    index = json.loads((derived / ".sidecars.index.json").read_text())["files"]
    assert len(index) == 10
    for rel, e in index.items():
        st = (derived / rel).stat()
        assert e["sha256"] == hashlib.sha256((derived / rel).read_bytes()).hexdigest()
        assert [e["ino"], e["size"], e["mtime_ns"], e["ctime_ns"]] == [
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
        ]
    marker = json.loads((derived / ".sidecars.json").read_text())
    assert marker["content_digest"] == content_digest_of({r: e["sha256"] for r, e in index.items()})


def test_an_edited_sidecar_is_unpacked_again_a_touched_one_is_not(tmp_path: Path) -> None:
    """Stats changed, bytes not (a touch): up to date, the record refreshed once. Bytes changed with
    size and mtime restored: named, and unpack_sidecars unpacks again."""
    b = build(tmp_path, unpack=False)
    kit.unpack_sidecars(b.profile, b.data_root)
    derived = b.data_root / "derived"
    victim = derived / sidecar_rel("autoeval", A[0])
    st = victim.stat()
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert kit.sidecars_status(b.profile, b.data_root) is None
    marker = derived / ".sidecars.json"
    before = marker.stat().st_mtime_ns
    assert kit.sidecars_status(b.profile, b.data_root) is None
    assert marker.stat().st_mtime_ns == before  # refreshed once

    old = victim.read_bytes()
    data = bytearray(old)
    data[len(data) // 2] ^= 0x01
    st = victim.stat()
    with open(victim, "r+b") as f:
        f.write(data)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    why = kit.sidecars_status(b.profile, b.data_root) or ""
    assert str(victim) in why and "modified since it was unpacked" in why, why
    res = kit.unpack_sidecars(b.profile, b.data_root)
    assert not res.skipped and victim.read_bytes() == old
    assert kit.sidecars_status(b.profile, b.data_root) is None


def test_a_sidecar_tar_edited_in_place_is_refused_a_touched_one_is_not(tmp_path: Path) -> None:
    """The kit's sidecar tar with one byte changed, its size and mtime put back, is not taken for the
    tar unpacked (its ctime tells): hashed again, named against its .sha256 file, and the unpack
    refuses it as a first unpack does. A tar whose stats changed and bytes did not is hashed once,
    and the record takes its stats."""
    b = build(tmp_path, unpack=False)
    kit.unpack_sidecars(b.profile, b.data_root)
    tar = b.profile.kit_file("sidecar_archive")
    marker = b.data_root / "derived" / ".sidecars.json"

    os.utime(tar, ns=(tar.stat().st_atime_ns, tar.stat().st_mtime_ns))  # ctime moves, bytes do not
    assert kit.sidecars_status(b.profile, b.data_root) is None
    recorded = marker.stat().st_mtime_ns
    assert kit.sidecars_status(b.profile, b.data_root) is None
    assert marker.stat().st_mtime_ns == recorded  # the tar's new stats recorded once
    assert kit.unpack_sidecars(b.profile, b.data_root).skipped

    st = tar.stat()
    data = bytearray(tar.read_bytes())
    data[len(data) // 2] ^= 0x01
    with open(tar, "r+b") as f:
        f.write(data)
    os.utime(tar, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert tar.stat().st_size == st.st_size and tar.stat().st_mtime_ns == st.st_mtime_ns
    why = kit.sidecars_status(b.profile, b.data_root) or ""
    assert f"{tar} changed since it was unpacked" in why, why
    with pytest.raises(ChecksumMismatchError):
        kit.unpack_sidecars(b.profile, b.data_root)


def test_an_invalidated_sidecar_record_unpacks_again(tmp_path: Path) -> None:
    from stage2_data.kit.sidecars import invalidate_sidecars

    b = build(tmp_path, unpack=False)
    kit.unpack_sidecars(b.profile, b.data_root)
    assert invalidate_sidecars(b.data_root, "the subset byte check found X damaged")
    assert "found X damaged" in (kit.sidecars_status(b.profile, b.data_root) or "")
    assert not kit.unpack_sidecars(b.profile, b.data_root).skipped
    assert kit.sidecars_status(b.profile, b.data_root) is None


@pytest.mark.parametrize("entry", [None, [1], "x", {}])
def test_a_damaged_index_entry_means_unpack_again_never_a_crash(tmp_path: Path, entry: object) -> None:
    """An index entry that is not what the unpack wrote (any JSON value) makes the kit stage unpack
    again, naming the sidecar; it never raises."""
    b = build(tmp_path, unpack=False)
    kit.unpack_sidecars(b.profile, b.data_root)
    derived = b.data_root / "derived"
    path = derived / ".sidecars.index.json"
    doc = json.loads(path.read_text())
    rel = sorted(doc["files"])[0]
    doc["files"][rel] = entry
    path.write_text(json.dumps(doc))
    (derived / rel).touch()  # its stats differ from the record: the index entry is consulted
    why = kit.sidecars_status(b.profile, b.data_root)
    assert why is not None and str(derived / rel) in why
    assert not kit.unpack_sidecars(b.profile, b.data_root).skipped
    assert kit.sidecars_status(b.profile, b.data_root) is None


def test_a_reunpack_moves_aside_what_the_unpack_did_not_write(tmp_path: Path) -> None:
    """The sidecar folder an unpack replaces keeps nothing the user has: a file the record does not
    list and a sidecar edited since are moved into the data root's quarantine folder, under their
    path in the data root (``res.moved_aside`` says from where to where); a sidecar as unpacked is
    deleted, unpacked again."""
    b = build(tmp_path, unpack=False)
    kit.unpack_sidecars(b.profile, b.data_root)
    derived = b.data_root / "derived"
    base = derived / "action_sidecars"
    (base / "my_extra.txt").write_text("mine")
    (base / "autoeval" / "notes.txt").write_text("notes")
    (base / "mine").mkdir()
    (base / "mine" / "x.npz").write_text("x")
    edited = derived / sidecar_rel("roboarena", B[0])
    old = edited.read_bytes()
    data = bytearray(old)
    data[len(data) // 2] ^= 0x01
    edited.write_bytes(bytes(data))
    assert kit.sidecars_status(b.profile, b.data_root) is not None
    res = kit.unpack_sidecars(b.profile, b.data_root)
    assert not res.skipped and edited.read_bytes() == old
    q = b.data_root / "quarantine"
    (folder,) = q.iterdir()
    kept = {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.name != "moved.json"
    }
    assert kept == {
        "derived/action_sidecars/my_extra.txt": b"mine",
        "derived/action_sidecars/autoeval/notes.txt": b"notes",
        "derived/action_sidecars/mine/x.npz": b"x",
        f"derived/{sidecar_rel('roboarena', B[0])}": bytes(data),
    }
    doc = json.loads((folder / "moved.json").read_text())
    assert "never deleted" in doc["reason"]
    assert sorted(res.moved_aside) == sorted(f"{e['from']} -> {e['to']}" for e in doc["files"])
    assert f"{base / 'mine'} -> {folder / 'derived' / 'action_sidecars' / 'mine'}" in res.moved_aside
    assert sorted(p.name for p in base.iterdir()) == ["autoeval", "roboarena"]
    assert kit.sidecars_status(b.profile, b.data_root) is None
    again = kit.unpack_sidecars(b.profile, b.data_root, force=True)  # nothing foreign: nothing moved
    assert again.moved_aside == [] and len(list(q.iterdir())) == 1


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("files", 99, "action_sidecars holds 10 sidecars, the unpack wrote 99"),  # (the count check)
        ("bytes", 7, ".sidecars.json is inconsistent (it counts 7 bytes and its index's sidecars hold"),
        (
            "content_digest",
            "0" * 64,
            ".sidecars.json is inconsistent (its content_digest is not the digest of its sidecars' sha256",
        ),
    ],
)
@pytest.mark.parametrize("tree_digest", ["kept", "nulled"])
def test_a_sidecars_record_at_odds_with_its_index_is_unpacked_again(
    tmp_path: Path, field: str, value: object, said: str, tree_digest: str
) -> None:
    """The sidecars' record checks itself as an extraction record does: a file count, byte count or
    content_digest (what a store's input key folds in) that its index's sidecars do not give is
    named, the sidecars unpacked again and the record written right; a stats refresh (its
    tree_digest nulled) never carries it over."""
    b = build(tmp_path, unpack=False)
    kit.unpack_sidecars(b.profile, b.data_root)
    marker = b.data_root / "derived" / ".sidecars.json"
    doc = json.loads(marker.read_text())
    right = doc[field]
    doc[field] = value
    if tree_digest == "nulled":
        doc["tree_digest"] = None
    marker.write_text(json.dumps(doc))
    why = kit.sidecars_status(b.profile, b.data_root) or ""
    assert said in why, why
    assert json.loads(marker.read_text())[field] == value  # no refresh wrote it over
    assert not kit.unpack_sidecars(b.profile, b.data_root).skipped
    assert json.loads(marker.read_text())[field] == right
    assert kit.sidecars_status(b.profile, b.data_root) is None
