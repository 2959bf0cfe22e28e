"""``.npy`` / ``.npz``: the one reader of npy headers and zip members, and the one deterministic writer.

Reading never unpickles and never decompresses more than it needs:

* :func:`parse_npy_header` reads the header of a ``.npy`` (a Python literal) from its first bytes:
  numpy's exact dict spelling by a regex, anything else through ``ast.literal_eval`` (literals
  only). Object dtypes are reported, never loaded.
* :func:`npz_members` lists the members of an npz held in memory from the zip central directory
  (a fast path for the plain zips numpy writes; ``zipfile`` for anything else), refusing encrypted
  members, other compression methods and duplicates; :func:`member_bytes` inflates one member
  (or its first ``limit`` bytes); :func:`member_header` reads one member's npy header.
* :func:`load_npz` reads an npz file in one read and returns the arrays of the keys asked for,
  each member inflated once, its header parsed here (no ``zipfile``, no ``ast``): what the store
  writer and the input inspection use for the many small files of a build.
* :func:`read_member_header` / :func:`read_small_member` do the same through an open
  :class:`zipfile.ZipFile` (large files on disk: only the header is inflated), and
  :func:`read_npy_file_header` for a plain ``.npy`` file.

Writing (:func:`npy_bytes`, :func:`npz_bytes`) gives byte-identical output for the same arrays on
every machine: numpy's own ``.npy`` bytes (C order), and a zip as ``numpy.savez_compressed`` lays it
out but with a fixed timestamp (:data:`ZIP_DATE_TIME`), fixed attributes and no zip64 fields.

Every parse error is a :class:`~stage2_data.formats.FormatError` (a ``ValueError``) naming the
member (and the file, when the caller passes ``file=``): whatever the bytes (a corrupt deflate
stream, a bad local header, an odd header value), nothing else escapes from a read (``zlib.error``,
``struct.error``, ``zipfile.BadZipFile``, ... are turned into it). Bytes that are not a zip at all
are a :class:`~stage2_data.errors.FileTypeError` saying what they are (gzip, a plain ``.npy``, ...).
"""

from __future__ import annotations

import ast
import contextlib
import errno
import hashlib
import io
import math
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
from isal import isal_zlib  # ISA-L's inflate: the same bytes as zlib's, faster (docs/benchmarks.md)

from ..errors import FileTypeError, FormatError, Stage2Error
from .sniff import describe, sniff

__all__ = [
    "NPY_HEADER_READ",
    "NPY_MAGIC",
    "NPY_MAX_HEADER",
    "ZIP_DATE_TIME",
    "NpyHeader",
    "ZipMember",
    "member_array",
    "member_bytes",
    "member_header",
    "member_npy",
    "load_npz",
    "npy_bytes",
    "npz_bytes",
    "npz_members",
    "open_npz",
    "parse_npy_header",
    "read_member_header",
    "read_npy_file_header",
    "read_npz",
    "read_small_member",
    "zip_members",
]

NPY_MAGIC = b"\x93NUMPY"
NPY_MAX_HEADER = 10000  # numpy's own default max_header_size
NPY_HEADER_READ = NPY_MAX_HEADER + 16  # enough bytes for any header numpy accepts
_FIRST_READ = 256  # numpy's headers are padded to 64 bytes: one small read nearly always suffices

# numpy writes this exact dict literal; anything else goes through ast.literal_eval (literals only).
_NPY_DICT_RE = re.compile(
    r"^\{'descr': '(?P<descr>[^'\\]+)', 'fortran_order': (?P<fortran>True|False), "
    r"'shape': \((?P<shape>[0-9, ]*)\), *\} *\n?$"
)


class NpyHeader(NamedTuple):
    """What a ``.npy`` header says. Unpacks as ``shape, dtype, offset`` (offset: where the data starts)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    offset: int


def parse_npy_header(raw: bytes, *, file: str | None = None, member: str | None = None) -> NpyHeader:
    """The header of a ``.npy`` from its first bytes (at least the whole header).

    Only the header (a literal) is parsed; no array data is interpreted, nothing is unpickled.
    Raises FormatError (bad magic, unsupported version, truncated or oversized header, not a
    numpy header dict); a malformed literal may also raise SyntaxError/TypeError/MemoryError from
    ``ast.literal_eval``, as numpy's own reader does."""
    return _parse_npy_header(raw, file=file, member=member)[0]


def _parse_npy_header(raw: bytes, *, file: str | None, member: str | None) -> tuple[NpyHeader, bool]:
    """:func:`parse_npy_header` and the header's ``fortran_order``."""

    def bad(detail: str) -> FormatError:
        return FormatError(detail, file=file, member=member)

    if raw[:6] != NPY_MAGIC:
        raise bad("not a .npy member (bad magic)")
    major = raw[6] if len(raw) > 7 else 0
    if major == 1 and len(raw) >= 10:
        (hlen,) = struct.unpack_from("<H", raw, 8)
        start, enc = 10, "latin1"
    elif major in (2, 3) and len(raw) >= 12:
        (hlen,) = struct.unpack_from("<I", raw, 8)
        start, enc = 12, "latin1" if major == 2 else "utf8"
    else:
        raise bad(f"unsupported or truncated .npy header (version {major})")
    if hlen > NPY_MAX_HEADER or len(raw) < start + hlen:
        raise bad(f"truncated or oversized .npy header ({hlen} bytes)")
    try:
        text = raw[start : start + hlen].decode(enc)
    except UnicodeDecodeError as e:
        raise bad(f".npy header is not {enc} text ({e.reason} at byte {start + e.start})") from None
    m = _NPY_DICT_RE.fullmatch(text)
    if m is not None:
        dtype = _dtype(m.group("descr"), bad)
        try:
            shape = tuple(int(x) for x in m.group("shape").replace(" ", "").split(",") if x)
        except ValueError:  # more digits than int() takes
            raise bad(f".npy header shape is not a tuple of ints: {m.group('shape')[:80]!r}") from None
        fortran = m.group("fortran") == "True"
    else:
        try:
            d = ast.literal_eval(text)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
            raise bad(f".npy header is not a Python literal ({type(e).__name__}): {text[:80]!r}") from None
        if not isinstance(d, dict) or not {"descr", "shape", "fortran_order"} <= set(d):
            raise bad(f".npy header is not a numpy header dict: {text[:80]!r}")
        shape_v = d["shape"]
        if not isinstance(shape_v, tuple) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape_v
        ):
            raise bad(f".npy header shape is not a tuple of non-negative ints: {str(shape_v)[:80]}")
        dtype = _dtype(d["descr"], bad)
        shape = shape_v
        if not isinstance(d["fortran_order"], bool):
            raise bad(f".npy header fortran_order is not a bool: {str(d['fortran_order'])[:40]}")
        fortran = d["fortran_order"]
    return NpyHeader(shape, dtype, start + hlen), fortran


def _dtype(descr: Any, bad: Any) -> np.dtype[Any]:
    """The dtype an npy header's ``descr`` names, or FormatError (numpy raises TypeError,
    ValueError, KeyError, ... for a descr it does not know)."""
    try:
        if isinstance(descr, str):
            return np.dtype(descr)
        return np.lib.format.descr_to_dtype(descr)  # type: ignore[no-any-return]
    except Exception as e:  # noqa: BLE001 - a foreign parser's any error is "not a dtype"
        raise bad(f".npy header descr {str(descr)[:60]!r} is not a dtype ({type(e).__name__})") from None


# ----- zip members of an npz held in memory -------------------------------------------------------
class ZipMember(NamedTuple):
    """One entry of a zip central directory."""

    name: str
    flag: int
    method: int
    crc: int
    csize: int
    usize: int
    offset: int  # of the local file header


_CD_ENTRY = struct.Struct("<4s6H3I5HII")  # a zip central-directory entry (46 bytes)


def _zip_members_fast(data: bytes) -> list[ZipMember] | None:
    """The central directory of a plain zip (no archive comment, no zip64 fields), as numpy
    writes small npz files; None for anything else (then zipfile parses it)."""
    eocd = len(data) - 22
    if eocd < 0 or data[eocd : eocd + 4] != b"PK\x05\x06":
        return None
    _sig, disk, cd_disk, n_disk, n_total, _cd_size, cd_off, _clen = struct.unpack_from(
        "<IHHHHIIH", data, eocd
    )
    if disk or cd_disk or n_disk != n_total or n_total == 0xFFFF or cd_off >= eocd:
        return None
    out: list[ZipMember] = []
    pos = cd_off
    for _ in range(n_total):
        if pos + 46 > eocd:
            return None
        f = _CD_ENTRY.unpack_from(data, pos)
        if f[0] != b"PK\x01\x02" or 0xFFFFFFFF in (f[8], f[9], f[16]):
            return None
        nlen, xlen, clen = f[10], f[11], f[12]
        try:
            name = data[pos + 46 : pos + 46 + nlen].decode("utf-8" if f[3] & 0x800 else "cp437")
        except UnicodeDecodeError:
            return None
        out.append(ZipMember(name, f[3], f[4], f[7], f[8], f[9], f[16]))
        pos += 46 + nlen + xlen + clen
    return out


def zip_members(data: bytes, *, file: str | None = None) -> list[ZipMember]:
    """Every entry of the zip ``data``, in central-directory order. Raises FormatError when
    ``data`` is not a readable zip."""
    members = _zip_members_fast(data)
    if members is not None:
        return members
    _not_a_zip(data[:512], file)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return [
                ZipMember(
                    zi.filename,
                    zi.flag_bits,
                    zi.compress_type,
                    zi.CRC,
                    zi.compress_size,
                    zi.file_size,
                    zi.header_offset,
                )
                for zi in zf.infolist()
            ]
    except Exception as e:  # noqa: BLE001 - zipfile raises many kinds on odd bytes
        raise FormatError(f"not a readable zip ({_why(e)})", file=file) from None


def _why(e: BaseException) -> str:
    text = str(e)[:200]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _not_a_zip(head: bytes, file: str | None) -> None:
    """FileTypeError when the first bytes say another format than zip (an npz is a zip)."""
    kind = sniff(head)
    if kind is not None and kind != "zip":
        raise FileTypeError(
            f"is not an .npz (zip) file: its bytes are {describe(kind)}", found=kind, file=file
        )


def npz_members(data: bytes, *, file: str | None = None) -> dict[str, ZipMember]:
    """The members of an npz by key (``frames.npy`` -> ``frames``; a name without ``.npy`` is its
    own key). Refuses encrypted members, compression methods numpy never writes (only stored and
    deflated are read) and a key that appears twice."""
    out: dict[str, ZipMember] = {}
    for m in zip_members(data, file=file):
        if m.flag & 0x1:
            raise FormatError("encrypted", file=file, member=m.name)
        if m.method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise FormatError(
                f"uses zip compression method {m.method} (numpy writes 0 or 8)", file=file, member=m.name
            )
        key = m.name[:-4] if m.name.endswith(".npy") else m.name
        if key in out:
            raise FormatError("appears twice", file=file, member=m.name)
        out[key] = m
    return out


_INFLATE_ERROR: type[Exception] = isal_zlib.error  # type: ignore[assignment]  # (its stub: an instance)


def member_bytes(data: bytes, m: ZipMember, limit: int | None = None, *, file: str | None = None) -> bytes:
    """The (decompressed) bytes of one member: all of them (size and CRC checked), or at most
    ``limit``. Raises FormatError for a bad local header, a truncated member, a corrupt deflate
    stream or a bad CRC."""
    off = m.offset
    if off < 0 or off + 30 > len(data) or data[off : off + 4] != b"PK\x03\x04":
        raise FormatError("bad local header", file=file, member=m.name)
    n, x = struct.unpack_from("<HH", data, off + 26)
    start = off + 30 + n + x
    if start + m.csize > len(data):
        raise FormatError("truncated", file=file, member=m.name)
    comp = memoryview(data)[start : start + m.csize]
    if m.method == zipfile.ZIP_STORED:
        out = bytes(comp if limit is None else comp[:limit])
    else:
        try:
            if limit is None:  # one buffer of the size the zip names (no growing, no copy); deflate
                # expands at most 1032:1, so a corrupt size cannot ask for more than that
                out = isal_zlib.decompress(comp, -15, max(1, min(m.usize, 1032 * len(comp) + 64)))
            else:
                out = isal_zlib.decompressobj(-15).decompress(comp, limit)
        except _INFLATE_ERROR as e:
            raise FormatError(f"corrupt deflate data ({e})", file=file, member=m.name) from None
    if limit is None and (len(out) != m.usize or isal_zlib.crc32(out) != m.crc):
        raise FormatError("corrupt (size or CRC)", file=file, member=m.name)
    return out


def member_header(data: bytes, m: ZipMember, *, file: str | None = None) -> NpyHeader:
    """The npy header of one member of an in-memory npz (inflates a few hundred bytes)."""
    head = member_bytes(data, m, _FIRST_READ, file=file)
    try:
        return parse_npy_header(head, file=file, member=m.name)
    except FormatError:
        if len(head) < _FIRST_READ:
            raise
    return parse_npy_header(member_bytes(data, m, NPY_HEADER_READ, file=file), file=file, member=m.name)


def member_array(data: bytes, m: ZipMember, *, file: str | None = None) -> np.ndarray[Any, Any]:
    """The whole array of one member of an in-memory npz, inflated once, its header parsed by
    :func:`parse_npy_header` (numpy's ``read_array`` parses it again with ``ast.literal_eval``,
    which weighs on a small member). Object arrays are refused, never unpickled; any
    problem of the bytes is a FormatError naming the file and member."""
    body = member_bytes(data, m, file=file)
    hdr, fortran = _parse_npy_header(body, file=file, member=m.name)
    return _array_from(body, hdr, fortran, file=file, member=m.name)


def load_npz(
    path: str | os.PathLike[str], keys: Iterable[str], *, sha256: str | None = None
) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays ``keys`` of an npz file, read with one ``read`` and each member inflated once, its
    size and CRC checked (:func:`member_bytes`; object arrays refused). The arrays are read-only views
    of the inflated bytes: copy what you keep. A missing key is a FormatError naming the keys there
    are. ``sha256``: the file's bytes must have it (the very bytes decoded, hashed as read), else a
    FormatError naming both. Raises OSError (the file cannot be read) or FormatError / FileTypeError
    (its bytes)."""
    file = os.fspath(path)
    with open(file, "rb") as f:
        data = f.read()
    if sha256 is not None and (got := hashlib.sha256(data).hexdigest()) != sha256:
        raise FormatError(f"has sha256 {got}, not the {sha256} its record holds", file=file)
    members = npz_members(data, file=file)
    out: dict[str, np.ndarray[Any, Any]] = {}
    for key in keys:
        m = members.get(key)
        if m is None:
            raise FormatError(f"has no key {key!r} (keys: {', '.join(sorted(members))})", file=file)
        body = member_bytes(data, m, file=file)
        hdr, fortran = _parse_npy_header(body, file=file, member=m.name)
        out[key] = _array_from(body, hdr, fortran, file=file, member=m.name, copy=False)
    return out


def member_npy(
    data: bytes, m: ZipMember, *, file: str | None = None
) -> tuple[NpyHeader, np.ndarray[Any, Any] | None]:
    """The header of one member and its whole array, inflated once; the array is None when its
    dtype holds objects (never unpickled) or its data is not exactly what the shape needs (the
    caller names that). Raises FormatError for bytes that do not inflate or parse."""
    body = member_bytes(data, m, file=file)
    hdr, fortran = _parse_npy_header(body, file=file, member=m.name)
    if hdr.dtype.hasobject or len(body) != hdr.offset + math.prod(hdr.shape) * hdr.dtype.itemsize:
        return hdr, None
    return hdr, _array_from(body, hdr, fortran, file=file, member=m.name)


# ----- through zipfile / from files on disk -------------------------------------------------------
def _read_header_from(f: Any, *, file: str | None, member: str | None) -> NpyHeader:
    head = f.read(_FIRST_READ)
    try:
        return parse_npy_header(head, file=file, member=member)
    except FormatError:
        if len(head) < _FIRST_READ:
            raise
    return parse_npy_header(head + f.read(NPY_HEADER_READ - len(head)), file=file, member=member)


@contextlib.contextmanager
def _zip_read(zf: zipfile.ZipFile, name: str) -> Iterator[None]:
    """Whatever ``zipfile`` raises while reading member ``name`` (a corrupt deflate stream:
    ``zlib.error``; a bad local header or CRC: ``BadZipFile``; an unknown compression method:
    ``NotImplementedError``; encryption: ``RuntimeError``; a cut stream: ``EOFError``; ...) as
    FormatError naming the file and member. KeyError (no such member) and OSError pass, but for
    EINVAL: a seek to a negative offset an odd header value asked for."""
    try:
        yield
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        raise FormatError(f"unreadable ({_why(e)})", file=zf.filename, member=name) from None
    except (KeyError, Stage2Error):
        raise
    except Exception as e:  # noqa: BLE001 - any error of a foreign parser on odd bytes
        raise FormatError(f"unreadable ({_why(e)})", file=zf.filename, member=name) from None


def read_member_header(zf: zipfile.ZipFile, name: str) -> NpyHeader:
    """The npy header of member ``name`` (e.g. ``frames.npy``) of an open zip; only the header is
    inflated. Raises KeyError (no such member), OSError, or FormatError."""
    with _zip_read(zf, name), zf.open(name) as f:
        return _read_header_from(f, file=zf.filename, member=name)


def read_small_member(zf: zipfile.ZipFile, name: str) -> np.ndarray[Any, Any]:
    """The whole array of member ``name`` of an open zip (for small keys: ``shape``, ``num_frames``).
    Object (pickled) arrays are refused with FormatError, never unpickled; so is a short member."""
    with _zip_read(zf, name):
        with zf.open(name) as f:
            body = f.read()
        hdr, fortran = _parse_npy_header(body, file=zf.filename, member=name)
        return _array_from(body, hdr, fortran, file=zf.filename, member=name)


def open_npz(path: str | os.PathLike[str]) -> zipfile.ZipFile:
    """An npz file opened as a zip. Raises OSError, FileTypeError (the bytes are another format:
    gzip, a plain ``.npy``, ...) or FormatError (not a readable zip)."""
    file = os.fspath(path)
    try:
        return zipfile.ZipFile(file)
    except OSError as e:
        if e.errno != errno.EINVAL:  # EINVAL: a seek to a negative offset the bytes asked for
            raise
        raise FormatError(f"not a readable zip ({_why(e)})", file=file) from None
    except Exception as e:  # noqa: BLE001 - BadZipFile, struct.error, ValueError, ... on odd bytes
        with open(file, "rb") as f:
            _not_a_zip(f.read(512), file)
        raise FormatError(f"not a readable zip ({_why(e)})", file=file) from None


def read_npz(
    path: str | os.PathLike[str], keys: Iterable[str] | None = None
) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays of an npz file by key (every ``<key>.npy`` member, or only ``keys``), each read
    and checked like :func:`read_small_member`: any problem of the bytes is a FormatError naming the
    file and member (a missing key too), never ``zlib.error``, never a pickle. Raises OSError."""
    with open_npz(path) as zf:
        names = {n[:-4]: n for n in zf.namelist() if n.endswith(".npy")}
        out: dict[str, np.ndarray[Any, Any]] = {}
        for key in names if keys is None else keys:
            if key not in names:
                raise FormatError(f"has no key {key!r} (keys: {', '.join(sorted(names))})", file=zf.filename)
            out[key] = read_small_member(zf, names[key])
        return out


def _array_from(
    body: bytes, hdr: NpyHeader, fortran: bool, *, file: str | None, member: str | None, copy: bool = True
) -> np.ndarray[Any, Any]:
    if hdr.dtype.hasobject:
        raise FormatError("holds an object (pickled) array; refused, not unpickled", file=file, member=member)
    count = math.prod(hdr.shape)  # Python ints: a huge shape cannot overflow
    if len(body) - hdr.offset < count * hdr.dtype.itemsize:
        raise FormatError(
            f"holds {len(body) - hdr.offset} data bytes, fewer than its shape {hdr.shape} needs",
            file=file,
            member=member,
        )
    flat = np.frombuffer(body, dtype=hdr.dtype, count=count, offset=hdr.offset)
    arr = flat.reshape(hdr.shape[::-1]).transpose() if fortran else flat.reshape(hdr.shape)
    return arr.copy() if copy else arr


def read_npy_file_header(path: str | os.PathLike[str]) -> NpyHeader:
    """The header of a plain ``.npy`` file (reads at most ~10 KB). Raises OSError or FormatError."""
    with open(path, "rb") as f:
        return _read_header_from(f, file=os.fspath(path), member=None)


# ----- the deterministic writer --------------------------------------------------------------------
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_ZIP_DOSDATE = (ZIP_DATE_TIME[0] - 1980) << 9 | ZIP_DATE_TIME[1] << 5 | ZIP_DATE_TIME[2]
_ZIP_DOSTIME = ZIP_DATE_TIME[3] << 11 | ZIP_DATE_TIME[4] << 5 | ZIP_DATE_TIME[5] // 2
_ZIP_VERSION = 20  # deflate, no zip64
_ZIP_EXTERNAL_ATTR = 0o600 << 16
_ZIP_CREATE_SYSTEM = 3  # unix
_NPY_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}


def npy_bytes(arr: np.ndarray[Any, Any]) -> bytes:
    """``numpy.lib.format.write_array`` output for the array in C order (header cached). Equal to
    what ``np.save`` writes for a C-contiguous array. Object arrays are refused (TypeError)."""
    a = np.asarray(arr)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    if a.dtype.hasobject:
        raise TypeError("npy_bytes: object arrays are never written (they would need pickle)")
    key = (a.dtype.str, a.shape)
    header = _NPY_HEADERS.get(key)
    if header is None:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, a, allow_pickle=False)  # type: ignore[no-untyped-call]
        full = buf.getvalue()
        header = full[: len(full) - a.nbytes]
        _NPY_HEADERS[key] = header
    return header + a.tobytes()


def npz_bytes(arrays: Iterable[tuple[str, np.ndarray[Any, Any]]]) -> bytes:
    """An ``.npz`` as ``numpy.savez_compressed`` writes it (one deflated ``<key>.npy`` entry per array),
    but with a fixed zip timestamp (1980-01-01 00:00:00) and without zip64 extra fields.

    The bytes equal what ``zipfile`` writes for ``ZipInfo(date_time=ZIP_DATE_TIME)``,
    ``create_system=3``, ``external_attr=0o600 << 16``, ``ZIP_DEFLATED`` (see tests/test_demo.py);
    writing the records directly is much faster than ``zipfile``, which the full-cardinality demo
    needs (it writes tens of thousands of these)."""
    out = bytearray()
    central = bytearray()
    count = 0
    for key, arr in arrays:
        name = (key + ".npy").encode("ascii")
        data = npy_bytes(arr)
        crc = zlib.crc32(data)
        # A window just larger than the data (+ zlib's 262-byte lookahead) gives the same deflate
        # stream as the default 32 KiB window, with a much cheaper setup for tiny arrays.
        bits = max(9, min(15, (len(data) + 262).bit_length()))
        comp = zlib.compress(data, zlib.Z_DEFAULT_COMPRESSION, -bits)
        offset = len(out)
        out += struct.pack(
            "<4s2B4HL2L2H", b"PK\x03\x04", _ZIP_VERSION, 0, 0, zipfile.ZIP_DEFLATED,
            _ZIP_DOSTIME, _ZIP_DOSDATE, crc, len(comp), len(data), len(name), 0,
        )  # fmt: skip
        out += name
        out += comp
        central += struct.pack(
            "<4s4B4HL2L5H2L", b"PK\x01\x02", _ZIP_VERSION, _ZIP_CREATE_SYSTEM, _ZIP_VERSION, 0, 0,
            zipfile.ZIP_DEFLATED, _ZIP_DOSTIME, _ZIP_DOSDATE, crc, len(comp), len(data), len(name),
            0, 0, 0, 0, _ZIP_EXTERNAL_ATTR, offset,
        )  # fmt: skip
        central += name
        count += 1
    cd_offset = len(out)
    out += central
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(central), cd_offset, 0)
    if len(out) >= 0xFFFFFFFF:
        raise ValueError("npz_bytes: archive too large for a non-zip64 npz")
    return bytes(out)
