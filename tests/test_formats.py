"""stage2_data.formats: the one parser/writer of npy/npz, processed_dataset Arrow, JSONL, sha256sums.

Everything is real: npz files written by numpy and zipfile, Arrow IPC stream/file files written by
pyarrow, checksum files in every spelling ``sha256sum`` writes (and, where it is installed, written
by ``sha256sum`` itself and checked by ``sha256sum -c``).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from stage2_data.errors import ProblemsError
from stage2_data.formats import FormatError, jsonl, npz, sha256sums
from stage2_data.formats import arrow as farrow


# ================================================================================================
# npy / npz
# ================================================================================================
def _arrays() -> list[tuple[str, np.ndarray[Any, Any]]]:
    """Deterministic arrays of many dtypes/shapes (no RNG: the golden digest must not move)."""
    return [
        ("empty", np.zeros((0,), np.int64)),
        ("ints", np.arange(10)),
        ("scalar", np.array(3.5)),
        ("text", np.array("x" * 50)),
        ("frames", (np.arange(5 * 8 * 6 * 3) % 251).astype(np.uint8).reshape(5, 8, 6, 3)),
        ("actions", (np.arange(28, dtype=np.float32) / 7).reshape(7, 4)),
        ("fortran", np.asfortranarray(np.arange(15, dtype=np.float64).reshape(3, 5))),
        ("strided", np.arange(120, dtype=np.float64).reshape(40, 3)[::2]),
        ("strings", np.array(["a", "bcd"])),
        ("bigendian", np.array([1, 2], dtype=">i4")),
        ("metadata_json", np.array(json.dumps({"raw_width": 7}, sort_keys=True))),
        ("large", (np.arange(300 * 300) % 5).astype(np.int16).reshape(300, 300)),
    ]


def _zipfile_npz(arrays: list[tuple[str, np.ndarray[Any, Any]]]) -> bytes:
    """What zipfile writes with the writer's documented settings (the reference for npz_bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, a in arrays:
            info = zipfile.ZipInfo(key + ".npy", date_time=npz.ZIP_DATE_TIME)
            info.create_system = 3
            info.external_attr = 0o600 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            b = io.BytesIO()
            np.lib.format.write_array(b, np.ascontiguousarray(a) if a.ndim else a, allow_pickle=False)
            zf.writestr(info, b.getvalue())
    return buf.getvalue()


def test_npy_bytes_equal_numpy_output() -> None:
    for key, a in _arrays():
        b = io.BytesIO()
        np.save(b, np.ascontiguousarray(a) if a.ndim else a, allow_pickle=False)
        assert npz.npy_bytes(a) == b.getvalue(), key
        back = np.load(io.BytesIO(npz.npy_bytes(a)), allow_pickle=False)
        assert back.dtype == a.dtype and np.array_equal(back, a), key


def test_npz_bytes_equal_zipfile_output_and_a_pinned_digest() -> None:
    arrays = _arrays()
    data = npz.npz_bytes(arrays)
    assert data == _zipfile_npz(arrays)
    # Pinned: the demo's fingerprint depends on these bytes being the same on every machine.
    assert hashlib.sha256(data).hexdigest() == GOLDEN_NPZ_SHA256
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        for key, a in arrays:
            assert z[key].dtype == a.dtype and np.array_equal(z[key], a), key
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        assert all(i.date_time == npz.ZIP_DATE_TIME for i in zf.infolist())


GOLDEN_NPZ_SHA256 = "ebc117b43c73820fc41f79561bd49be97868cf726d956bb6680a4a1b3a8f1048"


def test_object_arrays_are_never_written() -> None:
    with pytest.raises(TypeError, match="object arrays"):
        npz.npy_bytes(np.array([{"a": 1}], dtype=object))


@pytest.mark.parametrize("writer", ["npz_bytes", "savez", "savez_compressed"])
def test_npz_members_headers_and_bytes(tmp_path: Path, writer: str) -> None:
    arrays = _arrays()
    if writer == "npz_bytes":
        data = npz.npz_bytes(arrays)
    else:
        buf = io.BytesIO()
        getattr(np, writer)(buf, **dict(arrays))
        data = buf.getvalue()
    members = npz.npz_members(data)
    assert list(members) == [k for k, _ in arrays]
    for key, a in arrays:
        m = members[key]
        hdr = npz.member_header(data, m)
        shape, dtype, offset = hdr  # unpacks as a tuple too
        assert (shape, dtype) == (a.shape, a.dtype), key
        body = npz.member_bytes(data, m)
        assert offset == len(body) - a.nbytes
        assert npz.member_bytes(data, m, 64) == body[:64]
        whole = npz.member_array(data, m)
        assert whole.dtype == a.dtype and np.array_equal(whole, a), key
        assert npz.member_npy(data, m)[0] == hdr and np.array_equal(npz.member_npy(data, m)[1], a), key
    # the same through an open ZipFile (a file on disk): header only / small members whole
    p = tmp_path / "x.npz"
    p.write_bytes(data)
    with zipfile.ZipFile(p) as zf:
        for key, a in arrays:
            hdr = npz.read_member_header(zf, key + ".npy")
            assert (hdr.shape, hdr.dtype) == (a.shape, a.dtype)
            arr = npz.read_small_member(zf, key + ".npy")
            assert arr.dtype == a.dtype and np.array_equal(arr, a), key


def test_member_npy_whole_arrays_and_what_it_leaves_to_the_caller() -> None:
    """member_npy inflates a member once: its header and array (Fortran order read as numpy reads
    it); an object array or data longer than the shape needs gives no array (never unpickled; the
    caller names the problem); bytes that do not inflate are a FormatError naming the member."""
    f = np.asfortranarray(np.arange(12, dtype="<f4").reshape(3, 4))
    data = savez_compressed_bytes({"f": f, "o": np.array([{"a": 1}], dtype=object)})
    members = npz.npz_members(data)
    hdr, arr = npz.member_npy(data, members["f"])
    assert hdr.shape == (3, 4) and arr is not None and np.array_equal(arr, f)
    assert npz.member_npy(data, members["o"]) == (npz.member_header(data, members["o"]), None)
    long = npz.npy_bytes(np.arange(4, dtype="<i8")) + b"\0" * 8
    data2 = _zip_of({"x.npy": long})
    hdr2, arr2 = npz.member_npy(data2, npz.npz_members(data2)["x"])
    assert hdr2.shape == (4,) and arr2 is None
    bad = bytearray(savez_compressed_bytes({"y": np.arange(1000)}))
    m = npz.npz_members(bytes(bad))["y"]
    start = m.offset + 30 + len("y.npy")
    bad[start + 20 : start + 40] = b"\xff" * 20
    with pytest.raises(FormatError, match="y.npy"):
        npz.member_npy(bytes(bad), m, file="s.npz")


def _zip_of(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, body in members.items():
            zf.writestr(name, body)
    return buf.getvalue()


def savez_compressed_bytes(arrays: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def test_npy_file_header(tmp_path: Path) -> None:
    p = tmp_path / "f.npy"
    a = np.zeros((3, 4, 5, 3), np.uint8)
    np.save(p, a)
    h = npz.read_npy_file_header(p)
    assert (h.shape, h.dtype, h.offset) == (a.shape, a.dtype, p.stat().st_size - a.nbytes)
    # a header longer than the first read (a very long shape) is still read
    long = np.zeros((1,) * 40, np.uint8)
    np.save(p, long)
    assert npz.read_npy_file_header(p).shape == long.shape


def test_npy_header_variants_and_refusals() -> None:
    # version 2.0 and 3.0 headers
    for version in [(2, 0), (3, 0)]:
        b = io.BytesIO()
        np.lib.format.write_array(b, np.arange(3), version=version)
        assert npz.parse_npy_header(b.getvalue()).shape == (3,)
    # a header numpy did not spell exactly (other key order) goes through literal_eval
    raw = b"{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}"
    raw += b" " * (63 - (10 + len(raw)) % 64) + b"\n"
    hdr = npz.parse_npy_header(npz.NPY_MAGIC + b"\x01\x00" + len(raw).to_bytes(2, "little") + raw)
    assert hdr.shape == (2, 3) and hdr.dtype == np.float32
    with pytest.raises(FormatError, match="bad magic") as ei:
        npz.parse_npy_header(b"not npy at all", file="f.npz", member="a.npy")
    assert str(ei.value) == "f.npz: member 'a.npy': not a .npy member (bad magic)"
    assert ei.value.detail == "not a .npy member (bad magic)" and isinstance(ei.value, ValueError)
    with pytest.raises(FormatError, match="truncated"):
        npz.parse_npy_header(npz.npy_bytes(np.arange(3))[:20])
    with pytest.raises(FormatError, match="not a numpy header dict"):
        bad = b"{'descr': '<i8'}".ljust(54) + b"\n"
        npz.parse_npy_header(npz.NPY_MAGIC + b"\x01\x00" + len(bad).to_bytes(2, "little") + bad)
    # an object array: the header is read (so it can be refused), the data never unpickled
    b = io.BytesIO()
    np.save(b, np.array([1, "x"], dtype=object), allow_pickle=True)
    assert npz.parse_npy_header(b.getvalue()).dtype.hasobject


def test_npz_refusals(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="not a readable zip"):
        npz.npz_members(b"definitely not an npz file", file="x.npz")
    good = npz.npz_bytes([("a", np.arange(3))])
    with pytest.raises(FormatError, match="not a readable zip"):
        npz.npz_members(good[:-40])
    # a duplicate key, another compression method
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("a.npy", npz.npy_bytes(np.arange(2)))
        zf.writestr("a", b"x")
    with pytest.raises(FormatError, match="appears twice"):
        npz.npz_members(buf.getvalue())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_BZIP2) as zf:
        zf.writestr("a.npy", npz.npy_bytes(np.arange(2)))
    with pytest.raises(FormatError, match="compression method 12"):
        npz.npz_members(buf.getvalue())
    # a corrupted member: CRC checked when read whole
    m = npz.npz_members(good)["a"]
    bad = bytearray(good)
    bad[m.offset + 30 + len("a.npy") + 5] ^= 0xFF
    with pytest.raises(FormatError, match="a.npy") as ei:  # corrupt deflate data or a bad CRC: named
        npz.member_bytes(bytes(bad), m, file="x.npz")
    assert ei.value.member == "a.npy" and ei.value.file == "x.npz"
    with pytest.raises(FormatError, match="bad local header") as ei:
        npz.member_bytes(good, m._replace(offset=1), file="x.npz")
    assert ei.value.member == "a.npy" and ei.value.file == "x.npz"
    # an object array in a zip: refused by read_small_member, never unpickled
    p = tmp_path / "o.npz"
    np.savez(p, o=np.array([1, "x"], dtype=object))
    with zipfile.ZipFile(p) as zf, pytest.raises(FormatError, match="object"):
        npz.read_small_member(zf, "o.npy")


def test_a_corrupt_deflate_stream_is_a_format_error_on_every_path(tmp_path: Path) -> None:
    """The zip directory intact, the deflate data of frames.npy corrupt (not the CRC: the stream
    itself): in memory, through zipfile and through read_npz, a FormatError naming the file and
    member, never ``zlib.error``."""
    raw = npz.npy_bytes(np.arange(4000, dtype=np.int64))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("frames.npy", raw)
    data = bytearray(buf.getvalue())
    m = npz.npz_members(bytes(data))["frames"]
    start = m.offset + 30 + len("frames.npy")
    data[start : start + 8] = b"\xff" * 8  # an invalid block type at the very start
    p = tmp_path / "t.npz"
    p.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="corrupt deflate data") as ei:
        npz.member_bytes(bytes(data), m, file=p.name)
    assert ei.value.member == "frames.npy"
    with pytest.raises(FormatError, match="corrupt deflate data"):
        npz.member_header(bytes(data), m, file=p.name)
    with (
        zipfile.ZipFile(p) as zf,
        pytest.raises(FormatError, match=r"t.npz: member 'frames.npy': unreadable \(error"),
    ):
        npz.read_member_header(zf, "frames.npy")
    with pytest.raises(FormatError, match="frames.npy"):
        npz.read_npz(p)


def test_a_file_that_is_not_an_npz_says_what_it_is(tmp_path: Path) -> None:
    from stage2_data.errors import FileTypeError

    cases = {
        "gzip": __import__("gzip").compress(b"x" * 100, mtime=0),
        "a plain .npy": npz.npy_bytes(np.arange(3)),
        "an HTML page": b"<!DOCTYPE html><html>Sign in</html>",
    }
    for words, data in cases.items():
        p = tmp_path / "t.npz"
        p.write_bytes(data)
        with pytest.raises(
            FileTypeError, match=f"t.npz: is not an .npz \\(zip\\) file: its bytes are {words}"
        ):
            npz.read_npz(p)
        with pytest.raises(FileTypeError):
            npz.npz_members(data, file="t.npz")


def test_sniff_names_magic_bytes() -> None:
    from stage2_data.formats.sniff import sniff

    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        ti = tarfile.TarInfo("PK\x03\x04-looking name")  # a member name that starts like a zip
        tf.addfile(ti, io.BytesIO(b""))
    assert sniff(tar.getvalue()) == "tar"
    assert sniff(b"\x1f\x8b\x08\x00") == "gzip" and sniff(b"\x28\xb5\x2f\xfd....") == "zstd"
    assert sniff(b"BZh91AY") == "bzip2" and sniff(b"\xfd7zXZ\x00\x00") == "xz"
    assert (
        sniff(b"PK\x03\x04") == "zip" and sniff(b"ARROW1\x00\x00") == "arrow" and sniff(b"PAR1") == "parquet"
    )
    assert sniff(b"  <!doctype HTML>") == "html" and sniff(b"") == "empty" and sniff(b"\x00\x01\x02") is None


def test_jsonl_bytes_that_are_not_utf8_are_a_format_error(tmp_path: Path) -> None:
    data = b'{"a": 1}\n{"b": "\xff"}\n'
    with pytest.raises(FormatError, match="line 2: not UTF-8 text"):
        list(jsonl.iter_json_lines(data))
    p = tmp_path / "x.jsonl"
    p.write_bytes(data)
    with pytest.raises(FormatError, match="x.jsonl: line 2: not UTF-8 text"):
        list(jsonl.read_json_lines(p))
    assert [jl.utf8 for jl in jsonl.iter_json_lines(data, utf8_errors="line")] == [True, False]


# ================================================================================================
# processed_dataset Arrow
# ================================================================================================
def _table(ids: list[str], extra: bool = True) -> pa.Table:
    cols: dict[str, Any] = {"id": ids, "num_frames": [len(i) for i in ids]}
    if extra:
        cols["task"] = [f"t-{i}" for i in ids]
    return pa.table(cols).replace_schema_metadata({"huggingface": "{}"})


def _cache_dir(tmp_path: Path, shards: list[tuple[str, pa.Table, str]]) -> Path:
    d = tmp_path / "ck"
    (d / "processed_dataset").mkdir(parents=True)
    for name, t, fmt in shards:
        p = d / "processed_dataset" / name
        if fmt == "stream":
            with pa.ipc.new_stream(str(p), t.schema) as w:
                for b in t.to_batches(max_chunksize=2):
                    w.write_batch(b)
        else:
            with pa.ipc.new_file(str(p), t.schema) as fw:
                fw.write_table(t)
    (d / "processed_dataset" / "state.json").write_text("{}")
    return d


def test_arrow_stream_and_file_shards_in_name_order(tmp_path: Path) -> None:
    d = _cache_dir(
        tmp_path,
        [
            ("data-00001-of-00002.arrow", _table(["c", "d", "e"]), "file"),
            ("data-00000-of-00002.arrow", _table(["a", "b"]), "stream"),
        ],
    )
    assert [p.name for p in farrow.list_shards(d)] == [
        "data-00000-of-00002.arrow",
        "data-00001-of-00002.arrow",
    ]
    t = farrow.read_processed_table(d)
    assert t.column("id").to_pylist() == ["a", "b", "c", "d", "e"]
    sub = farrow.read_processed_table(d, ["num_frames", "id"])
    assert sub.column_names == ["num_frames", "id"] and sub.schema.metadata == {b"huggingface": b"{}"}
    with farrow.arrow_batches(farrow.list_shards(d)[0]) as (schema, batches):
        assert schema.names == ["id", "num_frames", "task"] and sum(b.num_rows for b in batches) == 2


def test_arrow_missing_column_policies(tmp_path: Path) -> None:
    d = _cache_dir(tmp_path, [("data-00000-of-00001.arrow", _table(["a", "b"], extra=False), "stream")])
    # the extraction's policy: an error naming the shard, the missing and the present columns
    with pytest.raises(FormatError, match=r"no column\(s\) 'task', 'nope' \(columns: id, num_frames\)") as ei:
        farrow.read_processed_table(d, ["id", "task", "nope"])
    assert ei.value.file is not None and ei.value.file.endswith("data-00000-of-00001.arrow")
    # the kit's policy: absent columns are left out, the caller reports each
    t = farrow.read_processed_table(d, ["id", "task", "num_frames"], missing="drop")
    assert t.column_names == ["id", "num_frames"] and t.num_rows == 2


def test_arrow_errors(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=r"no processed_dataset/\*\.arrow file"):
        farrow.read_processed_table(tmp_path / "absent")
    d = _cache_dir(tmp_path, [("data-00000-of-00002.arrow", _table(["a"]), "stream")])
    (d / "processed_dataset" / "data-00001-of-00002.arrow").write_bytes(b"garbage, not arrow")
    with pytest.raises(FormatError, match="not a readable Arrow IPC file"):
        farrow.read_processed_table(d)
    d2 = _cache_dir(
        tmp_path / "two",
        [("a.arrow", _table(["a"]), "stream"), ("b.arrow", _table(["b"], extra=False), "file")],
    )
    with pytest.raises(FormatError, match="different schemas"):
        farrow.read_processed_table(d2)
    with pytest.raises(FormatError, match="different schemas"):  # drop: one shard lacks a column
        farrow.read_processed_table(d2, ["id", "task"], missing="drop")


# ================================================================================================
# JSONL
# ================================================================================================
def test_jsonl_lf_lines_keep_unicode_separators_and_lone_cr() -> None:
    rows = [{"a": "x\u2028y"}, {"b": "é"}, {"c": 1}]
    data = jsonl.jsonl_bytes(rows)
    assert data == b'{"a":"x\xe2\x80\xa8y"}\n{"b":"\xc3\xa9"}\n{"c":1}\n'
    got = list(jsonl.iter_json_lines(data))
    assert [(g.line, g.value) for g in got] == [(1, rows[0]), (2, rows[1]), (3, rows[2])]
    assert all(g.is_object for g in got)
    # blank lines: skipped (the line numbers still count them), or kept as errors
    data = b'{"a":1}\n\n  \n{"b":2}\n[1]\n{bad\n'
    got = list(jsonl.iter_json_lines(data))
    assert [(g.line, g.ok, g.is_object) for g in got] == [
        (1, True, True),
        (4, True, True),
        (5, True, False),
        (6, False, False),
    ]
    assert got[-1].error == "Expecting property name enclosed in double quotes" and got[-1].column == 2
    kept = list(jsonl.iter_json_lines(data, skip_blank=False))
    assert [(g.line, g.error) for g in kept[1:3]] == [(2, "Expecting value"), (3, "Expecting value")]
    assert len(list(jsonl.iter_json_lines(b'{"a":"x"}\r{"b":1}\n'))) == 1  # a lone CR is no line break


def test_jsonl_universal_strip_mode_as_the_kit_reads(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_bytes(b'{"a":1}\r\n {"b":2} \r{"c":3} x\n"s"\n')
    got = list(jsonl.read_json_lines(p, newlines="universal", strip=True))
    assert [g.line for g in got] == [1, 2, 3, 4]
    assert got[1].value == {"b": 2} and got[1].text == '{"b":2}'
    assert got[2].error == "extra data after the JSON value" and got[2].column == 8
    assert got[3].ok and not got[3].is_object
    # the same lines as Python's own universal-newline iteration
    with open(p, encoding="utf-8") as f:
        assert [ln.rstrip("\n") for ln in f] == jsonl.split_lines(p.read_bytes(), newlines="universal")


def test_jsonl_lone_surrogate_escapes_are_a_per_line_problem(tmp_path: Path) -> None:
    """Well-formed JSON whose strings are not Unicode text (a \\uD800-\\uDFFF escape not part of a
    pair): a problem of its line, naming where it is, the escape and its column; every other line
    reads as usual, in both readings (the store's and the kit's)."""
    lines = [
        rb'{"pair_id": "p1", "task": "\ud800drawer"}',  # 1: high surrogate, alone
        rb'{"a": "\ud83d\ude00", "b": "x\uDC00"}',  # 2: a pair, then a lone low one (upper case)
        rb'{"a": "\\ud800"}',  # 3: an escaped backslash, then text: fine
        rb'{"e": {"k": [1, "\ud83d\ud83d\ude00"]}}',  # 4: nested; the first high one is alone
        rb'{"x\udfff": 1}',  # 5: in a key
        rb'["ok", "\ud800"]',  # 6: not an object
        rb'{"a": "\ud800\u0041"}',  # 7: a high one followed by another escape
        rb'{"a": "\ud83d\ude00"}',  # 8: a pair: fine
    ]
    data = b"\n".join(lines) + b"\n"
    for got in (
        list(jsonl.iter_json_lines(data)),
        list(jsonl.iter_json_lines(data, newlines="universal", strip=True, utf8_errors="line")),
    ):
        assert [(g.line, g.ok, g.unicode) for g in got] == [
            (1, False, False),
            (2, False, False),
            (3, True, True),
            (4, False, False),
            (5, False, False),
            (6, False, False),
            (7, False, False),
            (8, True, True),
        ]
        bad = {g.line: (g.error, g.column, g.key) for g in got if not g.unicode}
        tail = "which is not valid Unicode text"
        assert bad == {
            1: (f"field 'task' holds a lone surrogate (\\ud800), {tail}", 28, "task"),
            2: (f"field 'b' holds a lone surrogate (\\udc00), {tail}", 30, "b"),
            4: (f"field 'e' (at ['k'][1]) holds a lone surrogate (\\ud83d), {tail}", 18, "e"),
            5: (f"the name of field 'x\\udfff' holds a lone surrogate (\\udfff), {tail}", 4, "x\udfff"),
            6: (f"the line's value (at [1]) holds a lone surrogate (\\ud800), {tail}", 9, None),
            7: (f"field 'a' holds a lone surrogate (\\ud800), {tail}", 8, "a"),
        }
        assert all(g.value is None and not g.is_object for g in got if not g.unicode)
        assert got[2].value == {"a": "\\ud800"} and got[7].value == {"a": "\U0001f600"}
    # a message never holds the surrogate itself: it encodes as UTF-8
    for g in jsonl.iter_json_lines(data):
        (g.error or "").encode("utf-8")
    # a surrogate already in str input, and one deep in a value (the walk does not recurse)
    (g,) = jsonl.iter_json_lines('{"a": "raw \ud800"}')
    assert not g.unicode and g.column == 12 and g.key == "a"
    deep = "[" * 900 + '"\\udfff"' + "]" * 900
    (g,) = jsonl.iter_json_lines(deep)
    assert not g.unicode and g.error is not None and g.error.startswith("the line's value (at [0][0]")
    # read_json_lines: the same, from a file
    p = tmp_path / "s.jsonl"
    p.write_bytes(data)
    assert [g.line for g in jsonl.read_json_lines(p) if not g.unicode] == [1, 2, 4, 5, 6, 7]


def test_jsonl_writer_forms() -> None:
    row = {"b": "é", "a": None}
    assert jsonl.dumps_line(row) == '{"b":"é","a":null}\n'
    assert jsonl.dumps_line(row, compact=False) == json.dumps(row) + "\n" == '{"b": "\\u00e9", "a": null}\n'
    with pytest.raises(ValueError):
        jsonl.dumps_line({"x": float("nan")})


# ================================================================================================
# sha256sums
# ================================================================================================
H1 = hashlib.sha256(b"one").hexdigest()
H2 = hashlib.sha256(b"two").hexdigest()


@pytest.mark.parametrize(
    "text, expected",
    [
        (f"{H1}  a/b.npz\n{H2}  c d.npz\n", [(H1, "a/b.npz", 1), (H2, "c d.npz", 2)]),  # text mode
        (f"{H1} *a.bin\n", [(H1, "a.bin", 1)]),  # binary mode
        (f"{H1} a.bin\n", [(H1, "a.bin", 1)]),  # one space (accepted by sha256sum -c)
        (f"SHA256 (a (1).npz) = {H1}\n", [(H1, "a (1).npz", 1)]),  # --tag
        (f"SHA256(a) = {H1}\n", [(H1, "a", 1)]),
        (f"\\{H1}  new\\nline\\\\x\n", [(H1, "new\nline\\x", 1)]),  # escaped name
        (f"\\SHA256 (back\\\\slash) = {H1}\n", [(H1, "back\\slash", 1)]),
        (f"{H1.upper()}  A\r\n\r\n{H2}  ./b\r\n", [(H1, "A", 1), (H2, "./b", 3)]),  # upper hex, CRLF, ./ kept
        (f"# comment\n\n{H1}  x", [(H1, "x", 3)]),  # comment, blank, no final newline
        (f"{H1}  trailing space \n", [(H1, "trailing space ", 1)]),
        (f"{H1}  a\n{H2}  b\n{H1}  a\n", [(H1, "a", 1), (H2, "b", 2)]),  # a line repeated: kept once
        (f"{H1}  new\nline\0{H2} *b\\c\0", [(H1, "new\nline", 1), (H2, "b\\c", 2)]),  # sha256sum -z
    ],
)
def test_sha256sums_spellings(tmp_path: Path, text: str, expected: list[tuple[str, str, int]]) -> None:
    p = tmp_path / "SHA256SUMS"
    p.write_bytes(text.encode())
    got = sha256sums.parse_sha256sums(p)
    assert [(e.digest, e.path, e.line) for e in got] == expected


def test_sha256sums_problems_name_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "SHA256SUMS"
    bad_escape = "\\" + H1 + "  bad\\qescape"
    p.write_text(f"{H1}  a\nnot a line\n{H2}  a\n{H1[:-1]}  short\nMD5 (x) = {H1}\n{bad_escape}\n")
    with pytest.raises(ProblemsError) as ei:
        sha256sums.parse_sha256sums(p)
    assert ei.value.problems == [
        f"{p}:2: not '<64 hex>  <path>': 'not a line'",
        f"{p}:3: a listed again with another sha256 {H2} (line 1 says {H1})",
        f"{p}:4: not '<64 hex>  <path>': {H1[:-1] + '  short'!r}",
        f"{p}:5: not '<64 hex>  <path>': {'MD5 (x) = ' + H1!r}",
        f"{p}:6: not '<64 hex>  <path>': {bad_escape!r}",
    ]
    assert "regenerate SHA256SUMS with `sha256sum`" in str(ei.value)
    p.write_bytes(f"{H1}  ok\n{H2}  caf\xe9\n".encode("latin-1"))
    with pytest.raises(ProblemsError, match=r"SHA256SUMS:2: not UTF-8 text"):
        sha256sums.parse_sha256sums(p)
    with pytest.raises(FileNotFoundError):
        sha256sums.parse_sha256sums(tmp_path / "absent")


def test_single_sha256_file(tmp_path: Path) -> None:
    p = tmp_path / "x.tar.sha256"
    p.write_text(f"{H1}  x.tar\n")
    assert sha256sums.read_single_sha256_file(p) == (H1, "x.tar")
    p.write_text(f"{H1}  x.tar\n{H2}  y.tar\n")
    with pytest.raises(ProblemsError, match="expected exactly one line, found 2"):
        sha256sums.read_single_sha256_file(p)


def test_format_sha256sums_round_trips(tmp_path: Path) -> None:
    text = sha256sums.format_sha256sums([(H1, "a"), (H2, "b\\c\nd")])
    assert text == f"{H1}  a\n\\{H2}  b\\\\c\\nd\n"
    p = tmp_path / "S"
    p.write_text(text)
    assert [(e.digest, e.path) for e in sha256sums.parse_sha256sums(p)] == [(H1, "a"), (H2, "b\\c\nd")]


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="coreutils sha256sum not installed")
def test_what_sha256sum_writes_parses_and_checks(tmp_path: Path) -> None:
    names = ["plain.bin", "sp ace.bin", "back\\slash.bin", "new\nline.bin"]
    for i, n in enumerate(names):
        (tmp_path / n).write_bytes(bytes([i]) * 100)
    expected = {n: hashlib.sha256(bytes([i]) * 100).hexdigest() for i, n in enumerate(names)}
    for flags in ([], ["--binary"], ["--tag"]):
        out = subprocess.run(
            ["sha256sum", *flags, *names], cwd=tmp_path, capture_output=True, check=True
        ).stdout
        p = tmp_path / "SUMS"
        p.write_bytes(out)
        got = {e.path: e.digest for e in sha256sums.parse_sha256sums(p)}
        assert got == expected, flags
    # and what we write, sha256sum -c accepts
    p = tmp_path / "OURS"
    p.write_text(sha256sums.format_sha256sums([(d, n) for n, d in expected.items()]))
    subprocess.run(["sha256sum", "-c", "--quiet", p.name], cwd=tmp_path, check=True)
