"""Shard I/O: the Zarr v3 group of one shard folder, and "our shard layout" of its arrays.

Every array uses Zarr's sharding codec with the whole array as one shard (one file per array per
shard folder) and inner chunks split along axis 0 only (one row per chunk for frames and actions:
a row's whole ``(Tmax, H, W, 3)`` frame block), so a random access to one sample reads the shard
index plus that row's chunk only. Inner chunks are Blosc LZ4 clevel 5 (:func:`.format.compressor`).

:func:`shard_layout` is the ONE check that an array has this layout (sharding codec with shards ==
the array's shape, index at the end, codecs bytes + blosc + crc32c, index codecs bytes + crc32c,
chunks split along axis 0 only, little-endian). For such an array the shard object is written by this
module in one ``write`` (inner chunks compressed in parallel, each followed by the crc32c of its
compressed bytes, then the index of (offset, nbytes) uint64 pairs in C order and its crc32c, exactly
as the sharding spec lays it out: faster than zarr's own full-shard write, docs/benchmarks.md),
every chunk present (``write_empty_chunks``), and read back directly: the index once (checked
against its crc32c), then one ranged read per row, checked against its crc32c before it is decompressed
(:func:`chunk_intact`), or, for a chunk Blosc stored uncompressed, copied into the new array first
and checked over that copy (:func:`copy_intact`) before the array is returned
(:func:`decode_checked`). Anything else goes through zarr, whose crc32c codec checks the same bytes.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
from zarr.codecs import BloscCodec
from zarr.storage import LocalStore

from ..errors import StoreError
from ..fsutil import WRITEBACK_EVERY, start_writeback
from .determinism import single_threaded_blosc
from .format import (
    BLOCK_ACTIONS,
    BLOCK_FRAMES,
    BLOCK_NUM_FRAMES,
    BLOCK_WIDTH,
    StoreChecksumError,
)
from .zarr_meta import array_zarr_json, create_layout_array, group_zarr_json

#: an index entry (offset and nbytes) of an inner chunk that was never written
MISSING = 2**64 - 1
#: bytes after the index entries, and after every inner chunk: their crc32c
CRC_BYTES = 4
#: crc32c of any bytes followed by their own crc32c (little-endian): a chunk is intact iff its
#: crc32c, trailing checksum included, is this constant (one pass, no copy of the payload)
CRC32C_RESIDUE = 0x48674BC7


# ----- the layout ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardLayout:
    """An array in our shard layout: what is needed to write or read its single shard object."""

    key: str  # the shard object, relative to the array's folder
    inner: tuple[int, ...]  # the inner chunk shape: (rows per chunk, *the array's row shape)
    nchunks: int
    codec: Any  # numcodecs.Blosc with the array's blosc settings


def shard_layout(arr: Any) -> ShardLayout | None:
    """The layout of a zarr array when it is ours, else None (zarr then reads or writes it)."""
    import numcodecs
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    codecs = arr.metadata.codecs
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    sc = codecs[0]
    shape = tuple(int(x) for x in arr.shape)
    inner = tuple(int(x) for x in sc.chunk_shape)
    if (
        str(getattr(sc.index_location, "value", sc.index_location)) != "end"
        or [type(c) for c in sc.codecs] != [BytesCodec, BloscCodec, Crc32cCodec]
        or [type(c) for c in sc.index_codecs] != [BytesCodec, Crc32cCodec]
        or tuple(arr.shards) != shape
        or inner[1:] != shape[1:]
        or shape[0] % inner[0]
        or np.dtype(arr.dtype).byteorder == ">"
    ):
        return None
    bc = sc.codecs[1]
    assert isinstance(bc, BloscCodec)
    shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[str(getattr(bc.shuffle, "value", bc.shuffle))]
    cname = str(getattr(bc.cname, "value", bc.cname))
    codec = numcodecs.Blosc(cname=cname, clevel=int(bc.clevel), shuffle=shuffle, blocksize=int(bc.blocksize))
    key = arr.metadata.encode_chunk_key((0,) * len(shape))
    return ShardLayout(key, inner, shape[0] // inner[0], codec)


def index_size(nchunks: int) -> int:
    """Bytes of the index at the end of a shard object of ``nchunks`` inner chunks."""
    return 16 * nchunks + CRC_BYTES


def _crc32c(data: bytes) -> bytes:
    return int(crc32c.crc32c(data)).to_bytes(4, "little")


def chunk_intact(chunk: bytes | memoryview) -> bool:
    """Whether stored bytes (payload, then the crc32c of the payload) are intact, in one pass over any
    buffer (a ``memoryview`` of a mapped file too: no copy; the GIL is released for large ones)."""
    return len(chunk) >= CRC_BYTES and crc32c.crc32c(chunk) == CRC32C_RESIDUE


def encode_index(index: np.ndarray[Any, Any]) -> bytes:
    """The index of (offset, nbytes) ``<u8`` pairs, then its crc32c: the tail of a shard object."""
    idx = np.ascontiguousarray(index, dtype="<u8").tobytes()
    return idx + _crc32c(idx)


def decode_index(raw: bytes | memoryview, nchunks: int, path: Path | str) -> np.ndarray[Any, Any]:
    """The ``(nchunks, 2)`` index from a shard object's tail, checked against its crc32c (a copy:
    ``raw`` may be a view of a mapped file)."""
    if not chunk_intact(raw):
        raise StoreChecksumError(
            f"{path}: the shard index fails its crc32c (corrupt file).",
            fix="validate the store with --deep and rebuild it",
        )
    return np.frombuffer(raw[:-CRC_BYTES], dtype="<u8").reshape(nchunks, 2).copy()


def corrupt_chunks(
    read: Callable[[int, int], bytes | memoryview], size: int, nchunks: int, path: Path | str
) -> list[int]:
    """The inner chunks of a shard object of ``size`` bytes (``read(offset, length)`` reads it) that
    fail their crc32c, checked without decompressing anything; raises StoreChecksumError when the
    index itself is corrupt, StoreError when an index entry points outside the object."""
    nidx = index_size(nchunks)
    if size < nidx:
        raise StoreError(f"{path}: {size} bytes cannot hold the shard index of {nchunks} chunks.")
    index = decode_index(read(size - nidx, nidx), nchunks, path)
    bad: list[int] = []
    for k, (off, nbytes) in enumerate(index.tolist()):
        if off == MISSING and nbytes == MISSING:
            continue
        if off + nbytes > size - nidx:
            raise StoreError(f"{path}: inner chunk {k} lies outside the shard object (corrupt index).")
        if not chunk_intact(read(off, nbytes)):
            bad.append(k)
    return bad


#: Blosc (1.x) chunk header: 16 bytes (version, versionlz, flags, typesize, nbytes, blocksize,
#: cbytes); its flags byte's bit for "stored uncompressed" (MEMCPYED: the data follows the header
#: verbatim, unshuffled; what lz4 gives camera frames with sensor noise)
_BLOSC_HEADER = 16
_BLOSC_MEMCPYED = 0x02


def memcpyed_data(payload: bytes | memoryview, nbytes: int) -> memoryview | None:
    """The ``nbytes`` of data of a Blosc chunk (its crc32c cut off) that Blosc stored uncompressed,
    as a view of ``payload`` (no copy), or None when it is compressed. Only sizes are trusted here
    (the view never reaches past ``payload``): check the chunk's crc32c before its data is used."""
    if (
        len(payload) == _BLOSC_HEADER + nbytes
        and payload[2] & _BLOSC_MEMCPYED
        and int.from_bytes(payload[4:8], "little") == nbytes
    ):
        return memoryview(payload)[_BLOSC_HEADER:]
    return None


def copy_rows(
    payload: bytes | memoryview, row: tuple[int, ...], dtype: Any, n: int
) -> np.ndarray[Any, Any] | None:
    """The first ``n`` entries (along axis 0) of one Blosc chunk holding one padded row of shape
    ``row`` copied into a new array when Blosc stored the chunk uncompressed, else None. The
    chunk's crc32c is NOT checked here: check the copy with :func:`copy_intact` before using it."""
    dtype = np.dtype(dtype)
    data = memcpyed_data(payload, math.prod(row) * dtype.itemsize)
    if data is None:
        return None
    out = np.empty((n, *row[1:]), dtype=dtype)
    np.copyto(out.reshape(-1).view(np.uint8), np.frombuffer(data, np.uint8, count=out.nbytes))
    return out


def copy_intact(chunk: bytes | memoryview, copy: np.ndarray[Any, Any]) -> bool:
    """Whether a stored chunk (payload, then its crc32c) is intact, ``copy`` being a copy of the
    data after its Blosc header, or of their first part (:func:`copy_rows`): one crc32c over the
    header, the copy, the rest of the chunk and its crc32c, the same bytes :func:`chunk_intact`
    checks, but the bulk of them read from the copy, hot in the cache (a read from memory, then
    another from the cache, instead of two reads from memory)."""
    k = _BLOSC_HEADER + copy.nbytes
    if len(chunk) < k + CRC_BYTES:
        return False
    c = crc32c.crc32c(chunk[:_BLOSC_HEADER])
    c = crc32c.crc32c(copy.data, c)
    return int(crc32c.crc32c(chunk[k:], c)) == CRC32C_RESIDUE


def decode_rows(
    codec: Any, payload: bytes | memoryview, row: tuple[int, ...], dtype: Any, n: int
) -> np.ndarray[Any, Any]:
    """The first ``n`` entries (along axis 0) of one Blosc chunk holding one padded row of shape
    ``row`` (its crc32c already checked and cut off), as a new writable array: uncompressed
    (memcpyed) data is copied once, those ``n`` entries only (never the padding); a compressed
    chunk is decoded whole by Blosc (its padding decodes at memset speed, cheaper than splitting
    the chunk into blocks in Python) and its first ``n`` entries returned (a view of the row)."""
    copied = copy_rows(payload, row, dtype, n)
    return copied if copied is not None else _blosc_rows(codec, payload, row, dtype, n)


def _blosc_rows(
    codec: Any, payload: bytes | memoryview, row: tuple[int, ...], dtype: Any, n: int
) -> np.ndarray[Any, Any]:
    full = np.empty(row, dtype=dtype)
    codec.decode(payload, out=full)
    return full[:n]


def decode_prefix(
    codec: Any, payload: bytes | memoryview, row: tuple[int, ...], out: np.ndarray[Any, Any], n: int
) -> None:
    """The first ``n`` entries of one Blosc chunk holding one padded row of shape ``row`` (its crc32c
    already checked and cut off) decoded into ``out[:n]`` (``out`` C-contiguous, ``out.shape[1:] ==
    row[1:]``, ``n <= len(out)``): uncompressed (memcpyed) data is copied once, straight from
    ``payload``; a compressed chunk is decoded by Blosc into ``out`` itself when ``out`` has room
    for a whole row (``out[n:row[0]]`` then holds the row's stored padding: the caller owns what
    lies past ``n``), else into a row buffer whose first ``n`` entries are copied."""
    if not out.flags.c_contiguous:  # (reshape would copy: the bytes would land elsewhere)
        raise ValueError("decode_prefix needs a C-contiguous out")
    flat = out.reshape(-1).view(np.uint8)
    itemsize = out.dtype.itemsize
    data = memcpyed_data(payload, math.prod(row) * itemsize)
    if data is not None:
        k = n * math.prod(row[1:]) * itemsize
        np.copyto(flat[:k], np.frombuffer(data, np.uint8, count=k))
    elif out.shape[0] >= row[0]:
        codec.decode(payload, out=out[: row[0]])
    else:
        out[:n] = _blosc_rows(codec, payload, row, out.dtype, n)


# ----- writing -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rows:
    """An array given row by row instead of whole, for an array in our layout with one row per inner
    chunk (a shard's frames): ``shape`` and ``dtype`` of the whole array, and ``row(k)``, which makes
    row ``k`` as a ``(1, *shape[1:])`` array that stays valid until the same thread asks for another
    row (so a thread can reuse one buffer), or returns None for a row that could not be made (nothing
    is written for it: the caller, who knows why, refuses the shard). A shard's rows are then never
    all in memory at once: a few rows are, one per thread encoding."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    row: Callable[[int], np.ndarray[Any, Any] | None]


def _write_array(
    shard_dir: Path,
    name: str,
    data: np.ndarray[Any, Any] | Rows,
    inner: tuple[int, ...],
    fill: Any,
    hashes: dict[str, str],
    pool: ThreadPoolExecutor | None = None,
) -> None:
    """Write one array of a shard group: its ``zarr.json`` (:mod:`.zarr_meta`) and its single shard
    object, both hashed as written into ``hashes`` (by absolute path). An array not in our layout
    (:func:`shard_layout`) is written by zarr instead (its files are then not in ``hashes``); an
    array given as :class:`Rows` must be in our layout, one row per inner chunk."""
    shape = tuple(int(x) for x in data.shape)
    doc, kind = array_zarr_json(shape, inner, data.dtype, fill)
    tmpl = shard_layout(kind)
    if tmpl is None or inner[1:] != shape[1:] or shape[0] % inner[0]:  # not our layout
        if isinstance(data, Rows):
            raise ValueError(f"{name}: an array given row by row must be in our layout")
        single_threaded_blosc()
        arr = create_layout_array(LocalStore(shard_dir), shape, inner, data.dtype, fill, name=name)
        arr[...] = data  # the whole shard in one call (zarr's own, slower, path)
        return
    if isinstance(data, Rows):
        if inner[0] != 1:
            raise ValueError(f"{name}: an array given row by row must have one row per inner chunk")
        chunk: Callable[[int], np.ndarray[Any, Any] | None] = data.row
    else:
        whole, step = data, inner[0]

        def chunk(k: int) -> np.ndarray[Any, Any] | None:
            return whole[k * step : (k + 1) * step]

    folder = shard_dir / name
    folder.mkdir()
    _put(folder / "zarr.json", doc, hashes)
    layout = ShardLayout(tmpl.key, tuple(inner), shape[0] // inner[0], tmpl.codec)
    path = folder / layout.key
    hashes[str(path)] = _write_shard_blob(path, layout, chunk, pool)


def _put(path: Path, data: bytes, hashes: dict[str, str]) -> None:
    with open(path, "xb") as f:
        f.write(data)
    hashes[str(path)] = hashlib.sha256(data).hexdigest()


def _write_shard_blob(
    path: Path,
    layout: ShardLayout,
    chunk: Callable[[int], np.ndarray[Any, Any] | None],
    pool: ThreadPoolExecutor | None,
) -> str:
    """Write an array's single shard object directly, encoding the inner chunks (``chunk(k)``: the
    k-th, or None to leave it out) in parallel; returns its sha256, hashed as the bytes are
    written (the file is never read back for it).

    Streaming: chunks are made and encoded on ``pool`` with at most ``2 x workers`` in flight and
    written (and hashed) in order as they complete, so the compressed shard is never held in memory
    whole (nor, for :class:`Rows`, the array itself)."""
    codec, n = layout.codec, layout.nchunks
    single_threaded_blosc()

    def enc(k: int) -> tuple[bytes, bytes] | None:
        a = chunk(k)
        if a is None:
            return None
        # the chunk and its crc32c apart: joining them would copy every compressed byte once more
        b = bytes(codec.encode(np.ascontiguousarray(a)))
        return b, _crc32c(b)

    path.parent.mkdir(parents=True, exist_ok=True)
    index = np.full((n, 2), MISSING, dtype="<u8")
    h = hashlib.sha256()
    off = flushed = 0
    window = 2 * max(1, getattr(pool, "_max_workers", 1)) if pool is not None else 0
    inflight: deque[Future[tuple[bytes, bytes] | None]] = deque()
    with open(path, "wb") as f:
        try:
            for k in range(n):
                if pool is None:
                    got = enc(k)
                else:
                    while len(inflight) < window and k + len(inflight) < n:
                        inflight.append(pool.submit(enc, k + len(inflight)))
                    got = inflight.popleft().result()
                if got is None:
                    continue
                b, crc = got
                index[k] = (off, len(b) + CRC_BYTES)
                off += len(b) + CRC_BYTES
                f.write(b)
                f.write(crc)
                h.update(b)
                h.update(crc)
                del b, got
                if off - flushed >= WRITEBACK_EVERY:  # the disk writes while the next rows encode:
                    start_writeback(f.fileno(), flushed, off - flushed)  # the commit's fsync waits less
                    flushed = off
        except BaseException:  # an error or a stop: the chunks not started are not made
            for fut in inflight:
                fut.cancel()
            raise
        tail = encode_index(index)
        f.write(tail)
        h.update(tail)
    return h.hexdigest()


def write_shard_group(
    shard_dir: Path,
    frames: np.ndarray[Any, Any] | Rows,
    num_frames: np.ndarray[Any, Any],
    widths: np.ndarray[Any, Any],
    actions: np.ndarray[Any, Any] | None,
    pool: ThreadPoolExecutor | None = None,
) -> tuple[list[str], dict[str, str]]:
    """Write one shard group; returns the array names and the sha256 of the files this module wrote
    (by absolute path: every file, unless zarr wrote an array), which need not be read back. The
    frames may be given row by row (:class:`Rows`); they are written first, so an ``actions`` array
    those rows fill as they are made is complete when it is written."""
    shard_dir.mkdir(parents=True, exist_ok=False)
    hashes: dict[str, str] = {}
    _put(shard_dir / "zarr.json", group_zarr_json(), hashes)
    r, tmax, h, w, _ = frames.shape
    _write_array(shard_dir, BLOCK_FRAMES, frames, (1, tmax, h, w, 3), 0, hashes, pool)
    _write_array(shard_dir, BLOCK_NUM_FRAMES, num_frames, (r,), 0, hashes)
    group = shard_dir / BLOCK_WIDTH.rsplit("/", 1)[0]  # the "actions" group
    group.mkdir()
    _put(group / "zarr.json", group_zarr_json(), hashes)
    _write_array(shard_dir, BLOCK_WIDTH, widths, (r,), 0, hashes)
    names = [BLOCK_FRAMES, BLOCK_NUM_FRAMES, BLOCK_WIDTH]
    if actions is not None:
        _write_array(
            shard_dir, BLOCK_ACTIONS, actions, (1, tmax, actions.shape[2]), float("nan"), hashes, pool
        )
        names.append(BLOCK_ACTIONS)
    return sorted(names), hashes


# ----- reading -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DirectArray:
    path: Path  # the array's single shard object
    index: np.ndarray[Any, Any]  # (n, 2) uint64: offset, nbytes of each inner chunk (axis 0)
    codec: Any  # numcodecs.Blosc
    inner: tuple[int, ...]
    dtype: np.dtype[Any]
    fill: Any
    entries: list[tuple[int, int]]  # ``index`` as Python ints: (offset, nbytes) of each row's chunk


def direct_array(
    arr: Any,
    array_dir: Path,
    read_range: Callable[[Path, int, int], bytes | memoryview],
    size_of: Callable[[Path], int] = lambda p: p.stat().st_size,
) -> DirectArray | None:
    """The index of an array in our layout with one row per inner chunk (read once, verified with
    its crc32c), so that a row costs one ranged read; None for any other array (zarr reads it).
    Raises FileNotFoundError when the array's shard object is missing (``size_of``'s), StoreError
    when it is too short to hold its index, StoreChecksumError when the index fails its crc32c."""
    layout = shard_layout(arr)
    if layout is None or layout.inner[0] != 1:
        return None
    n = layout.nchunks
    path = array_dir / layout.key
    size = size_of(path)  # FileNotFoundError: a missing shard object (never "the fill value": every
    nidx = index_size(n)  # chunk is written, write_empty_chunks; the caller names the damage)
    if size < nidx:
        raise StoreError(f"{path}: {size} bytes cannot hold the shard index of {n} chunks.")
    index = decode_index(read_range(path, size - nidx, nidx), n, path)
    entries = [(int(o), int(b)) for o, b in index.tolist()]
    return DirectArray(path, index, layout.codec, layout.inner, np.dtype(arr.dtype), arr.fill_value, entries)


def uncompressed_size(d: DirectArray) -> int:
    """The stored size (Blosc header, data, crc32c) of a row chunk of ``d`` that Blosc stored
    uncompressed: a chunk of this size can be read straight into the array returned for it
    (:func:`split_checked`)."""
    return _BLOSC_HEADER + math.prod(d.inner[1:]) * d.dtype.itemsize + CRC_BYTES


def split_buffers(d: DirectArray, n: int) -> tuple[bytearray, np.ndarray[Any, Any], int]:
    """For a row chunk of ``d`` of :func:`uncompressed_size`: the buffers one read fills in order,
    the Blosc header (16 bytes), the new array of the row's first ``n`` entries (its data, read
    in place: no other copy), and the length of the rest (the padding entries and the crc32c)."""
    copy = np.empty((n, *d.inner[2:]), dtype=d.dtype)
    return bytearray(_BLOSC_HEADER), copy, uncompressed_size(d) - _BLOSC_HEADER - copy.nbytes


def split_checked(
    d: DirectArray, header: bytes | bytearray, copy: np.ndarray[Any, Any], rest: bytes | memoryview
) -> np.ndarray[Any, Any] | bool:
    """A row chunk of ``d`` read as :func:`split_buffers` lays it out: ``copy`` (the row's first
    entries) when the chunk is intact and Blosc stored it uncompressed; False when it fails its
    crc32c (nothing to return); True when it is intact but compressed after all (Blosc never makes
    a compressed chunk this long; then decode the joined bytes)."""
    c = crc32c.crc32c(header)
    c = crc32c.crc32c(copy.data, c)
    if int(crc32c.crc32c(rest, c)) != CRC32C_RESIDUE:
        return False
    nbytes = math.prod(d.inner[1:]) * d.dtype.itemsize
    if header[2] & _BLOSC_MEMCPYED and int.from_bytes(header[4:8], "little") == nbytes:
        return copy
    return True


def decode_checked(
    d: DirectArray, chunk: bytes | memoryview, n: int, out: np.ndarray[Any, Any] | None = None
) -> np.ndarray[Any, Any] | None:
    """The first ``n`` entries of one row of a direct array from its stored ``chunk`` (payload, then
    its crc32c): a new array (``out`` None), or decoded into ``out[:n]`` (:func:`decode_prefix`);
    None when the chunk fails its crc32c (then nothing is returned, and nothing decoded into
    ``out``). Blosc refusing intact bytes raises its RuntimeError / ValueError.

    A chunk Blosc compressed, and any chunk decoded into ``out``, is checked before it is decoded;
    a new array of a chunk stored uncompressed is copied first and checked over the copy
    (:func:`copy_intact`: the same bytes, the bulk read from the cache), returned only if intact."""
    payload = memoryview(chunk)[:-CRC_BYTES]
    row = d.inner[1:]
    copied = copy_rows(payload, row, d.dtype, n) if out is None else None
    if copied is not None:
        return copied if copy_intact(chunk, copied) else None
    if not chunk_intact(chunk):
        return None
    if out is None:
        return _blosc_rows(d.codec, payload, row, d.dtype, n)
    decode_prefix(d.codec, payload, row, out, n)
    return out
