"""A deterministic corpus of mutated inputs, one per byte region of each format the product reads.

:func:`corpus` yields :class:`Case` objects (a format, the region, the mutation, the bytes) from a
seed: the same seed gives the same corpus on every machine. The base inputs are small, valid
files made here (an npz as the store reads it, Arrow IPC stream and file shards, JSON Lines, a
profile, a cache directory's tar); each is cut into named regions (for an npz: local header, npy
header, deflate data, central directory, end record; for a tar: header fields and data; ...), and
each region gets mutations: a byte flipped or set to an odd value (0x00, 0xff, 0x7f, 0x80), a
4-byte field set to 0, 0xffffffff or 0x7fffffff, a truncation, bytes inserted or deleted, the
region duplicated.

The tests (tests/test_corpus.py) feed every case to the product's readers and assert that each
ends in success or an error of the exception family, never another exception.
"""

from __future__ import annotations

import io
import json
import random
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.ipc as pa_ipc

from stage2_data.formats.npz import npy_bytes, npz_bytes

KEY = "corpus_key"
FRAMES_MEMBER = f"{KEY}/frames/trajectory_t0.npz"
REVISION = "0123456789abcdef0123456789abcdef01234567"


@dataclass(frozen=True)
class Case:
    fmt: str  # "npz" | "npy_header" | "arrow_stream" | "arrow_file" | "jsonl" | "toml" | "tar"
    region: str
    mutation: str
    data: bytes

    @property
    def id(self) -> str:
        return f"{self.fmt}:{self.region}:{self.mutation}"


# ----- base inputs -----------------------------------------------------------------------------------
def frames_arrays(t: int = 2, h: int = 4, w: int = 4) -> list[tuple[str, np.ndarray]]:
    frames = (np.arange(t * h * w * 3) % 251).astype(np.uint8).reshape(t, h, w, 3)
    return [
        ("frames", frames),
        ("shape", np.asarray(frames.shape, dtype=np.int64)),
        ("num_frames", np.asarray(t, dtype=np.int64)),
    ]


def base_npz() -> bytes:
    return npz_bytes(frames_arrays())


def npz_with_member(raw_npy: bytes, name: str = "frames.npy") -> bytes:
    """An npz whose member ``name`` holds ``raw_npy`` as given (deflated, CRC right): a mutated npy
    header inside an otherwise valid zip."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, arr in frames_arrays():
            data = raw_npy if f"{key}.npy" == name else npy_bytes(arr)
            zf.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


def base_table(rows: int = 3) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(["t0", "t1", "t2"][:rows]),
            "task": pa.array(["pick", "place", "push"][:rows]),
            "frames": pa.array([[1, 2], [3], []][:rows], type=pa.list_(pa.int32())),
        }
    )


def arrow_bytes(kind: str, rows: int = 3) -> bytes:
    sink = io.BytesIO()
    table = base_table(rows)
    writer = pa_ipc.new_file if kind == "file" else pa_ipc.new_stream
    with writer(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def base_jsonl() -> bytes:
    rows = [
        {"pair_id": "p1", "split": "train", "n": 1, "x": [1, 2.5, None]},
        {"pair_id": "p2", "split": "val", "s": "é\u2028ü"},
        {"pair_id": "p3", "split": "test", "nested": {"a": {"b": True}}},
    ]
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def base_toml() -> bytes:
    return f"""name = "corpus_profile"
description = "a profile for the corpus"

[source]
repo_id = "org/data"
revision = "{REVISION}"

[kit]
pair_manifest = "manifests/pairs.jsonl"
subset_checksums = "manifests/SHA256SUMS"
action_manifest_dir = "derived/action_manifests"
sidecar_archive = "derived/sidecars.tar"
sidecar_archive_sha256 = "derived/sidecars.tar.sha256"

[[archives]]
path = "{KEY}.tar"
cache_key = "{KEY}"
size = 10240
sha256 = "{"ab" * 32}"

[[quarantined]]
path = "bad.tar"
reason = "broken upstream"

[expected]
cache_dirs = 1
archives = 1
trajectories = 1
pair_rows = 0
unique_frame_files = 1
action_manifest_rows = 0
resolved_sidecars = 0
""".encode()


def base_tar() -> bytes:
    """A cache directory's tar as upstream writes one: folders, dataset_info.json, one frames npz,
    one Arrow shard."""
    files = {
        f"{KEY}/dataset_info.json": json.dumps({"total_trajectories": 1}).encode(),
        FRAMES_MEMBER: base_npz(),
        f"{KEY}/processed_dataset/data-00000-of-00001.arrow": arrow_bytes("stream", rows=1),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for d in (KEY, f"{KEY}/frames", f"{KEY}/processed_dataset"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
            tf.addfile(ti)
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 1_700_000_000
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


# ----- regions -----------------------------------------------------------------------------------------
Region = tuple[str, int, int]  # (name, start, end)


def npz_regions(data: bytes) -> list[Region]:
    out: list[Region] = []
    pos = 0
    k = 0
    while data[pos : pos + 4] == b"PK\x03\x04":
        csize, _usize, nlen, xlen = struct.unpack_from("<IIHH", data, pos + 18)
        start = pos + 30 + nlen + xlen
        out.append((f"local_header{k}", pos, start))
        out.append((f"deflate{k}", start, start + csize))
        pos = start + csize
        k += 1
    eocd = data.rindex(b"PK\x05\x06")
    out.append(("central_directory", pos, eocd))
    out.append(("end_record", eocd, len(data)))
    return out


def npy_header_regions(raw: bytes) -> list[Region]:
    (hlen,) = struct.unpack_from("<H", raw, 8)
    return [("magic_version", 0, 10), ("header_dict", 10, 10 + hlen), ("array_data", 10 + hlen, len(raw))]


def arrow_regions(data: bytes, kind: str) -> list[Region]:
    n = len(data)
    if kind == "file":
        return [("magic", 0, 8), ("schema", 8, min(n, 8 + 200)), ("body", 200, n - 40), ("footer", n - 40, n)]
    return [("schema", 0, min(n, 200)), ("body", 200, n - 8), ("eos", n - 8, n)]


def line_regions(data: bytes) -> list[Region]:
    out: list[Region] = []
    pos = 0
    for k, line in enumerate(data.split(b"\n")[:-1]):
        out.append((f"line{k + 1}", pos, pos + len(line) + 1))
        pos += len(line) + 1
    return out


def tar_regions(data: bytes) -> list[Region]:
    out: list[Region] = []
    pos = 0
    k = 0
    while pos + 512 <= len(data) and data[pos : pos + 512].strip(b"\0"):
        size = int(data[pos + 124 : pos + 136].rstrip(b"\0 ") or b"0", 8)
        for field, a, b in (("name", 0, 100), ("mode", 100, 108), ("size", 124, 136), ("chksum", 148, 156),
                            ("type", 156, 157), ("magic", 257, 265), ("prefix", 345, 500)):  # fmt: skip
            out.append((f"header{k}.{field}", pos + a, pos + b))
        data_end = pos + 512 + (size + 511) // 512 * 512
        if size:
            out.append((f"data{k}", pos + 512, pos + 512 + size))
        pos = data_end
        k += 1
    out.append(("end_blocks", pos, len(data)))
    return out


# ----- mutations ---------------------------------------------------------------------------------------
Mutation = Callable[[bytes, int, int, random.Random], tuple[str, bytes]]


def _flip(d: bytes, a: int, b: int, rng: random.Random) -> tuple[str, bytes]:
    i = rng.randrange(a, max(a + 1, b))
    i = min(i, len(d) - 1)
    return f"flip@{i}", d[:i] + bytes([d[i] ^ (1 << rng.randrange(8))]) + d[i + 1 :]


def _set(value: int) -> Mutation:
    def m(d: bytes, a: int, b: int, rng: random.Random) -> tuple[str, bytes]:
        i = min(rng.randrange(a, max(a + 1, b)), len(d) - 1)
        return f"set{value:02x}@{i}", d[:i] + bytes([value]) + d[i + 1 :]

    return m


def _word(value: int) -> Mutation:
    def m(d: bytes, a: int, b: int, rng: random.Random) -> tuple[str, bytes]:
        i = min(rng.randrange(a, max(a + 1, b)), max(0, len(d) - 4))
        return f"u32={value:#x}@{i}", d[:i] + struct.pack("<I", value) + d[i + 4 :]

    return m


def _truncate(d: bytes, a: int, b: int, rng: random.Random) -> tuple[str, bytes]:
    i = rng.randrange(a, max(a + 1, b))
    return f"truncate@{i}", d[:i]


def _insert(d: bytes, a: int, b: int, rng: random.Random) -> tuple[str, bytes]:
    i = rng.randrange(a, max(a + 1, b))
    extra = bytes(rng.randrange(256) for _ in range(rng.choice((1, 3, 17))))
    return f"insert{len(extra)}@{i}", d[:i] + extra + d[i:]


def _delete(d: bytes, a: int, b: int, rng: random.Random) -> tuple[str, bytes]:
    i = rng.randrange(a, max(a + 1, b))
    n = rng.choice((1, 4, 64))
    return f"delete{n}@{i}", d[:i] + d[i + n :]


def _duplicate(d: bytes, a: int, b: int, rng: random.Random) -> tuple[str, bytes]:
    return f"dup[{a}:{b}]", d[:b] + d[a:b] + d[b:]


def _random_region(d: bytes, a: int, b: int, rng: random.Random) -> tuple[str, bytes]:
    return f"random[{a}:{b}]", d[:a] + bytes(rng.randrange(256) for _ in range(b - a)) + d[b:]


MUTATIONS: tuple[Mutation, ...] = (
    _flip, _flip, _set(0x00), _set(0xFF), _set(0x7F), _set(0x80), _word(0), _word(0xFFFFFFFF),
    _word(0x7FFFFFFF), _truncate, _insert, _delete, _duplicate, _random_region,
)  # fmt: skip

# Whole-file substitutions: a file that is not what its name says.
SUBSTITUTES: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda d: __import__("gzip").compress(d, mtime=0),
    "zstd_magic": lambda d: b"\x28\xb5\x2f\xfd" + d,
    "html": lambda d: b"<!DOCTYPE html><html><body>Sign in</body></html>\n",
    "empty": lambda d: b"",
    "zeros": lambda d: b"\0" * 1024,
    "parquet_magic": lambda d: b"PAR1" + d[4:],
}


def _mutate(
    fmt: str, base: bytes, regions: list[Region], rng: random.Random, per_region: int
) -> Iterator[Case]:
    for name, a, b in regions:
        if b <= a:
            continue
        for _ in range(per_region):
            mut = rng.choice(MUTATIONS)
            what, data = mut(base, a, b, rng)
            yield Case(fmt, name, what, data)
    for what, sub in SUBSTITUTES.items():
        yield Case(fmt, "whole", what, sub(base))


def corpus(seed: int = 14, per_region: int = 12) -> Iterator[Case]:
    """Every case, deterministically from ``seed``."""
    rng = random.Random(seed)
    npz = base_npz()
    yield from _mutate("npz", npz, npz_regions(npz), rng, per_region)
    raw = npy_bytes(frames_arrays()[0][1])
    for c in _mutate("npy_header", raw, npy_header_regions(raw), rng, per_region):
        yield Case(c.fmt, c.region, c.mutation, npz_with_member(c.data))
    # a corrupt deflate stream with the zip directory intact (CRC and sizes kept)
    comp = bytearray(zlib.compress(raw, 6)[2:-4])
    for i in range(0, len(comp), max(1, len(comp) // per_region)):
        bad = bytearray(comp)
        bad[i] ^= 0xFF
        yield Case("npz", "deflate_stream", f"xor@{i}", _replace_deflate(npz_with_member(raw), bytes(bad)))
    for kind in ("stream", "file"):
        data = arrow_bytes(kind)
        yield from _mutate(f"arrow_{kind}", data, arrow_regions(data, kind), rng, per_region)
    jl = base_jsonl()
    yield from _mutate("jsonl", jl, line_regions(jl), rng, per_region)
    toml = base_toml()
    yield from _mutate("toml", toml, line_regions(toml), rng, max(2, per_region // 4))
    tar = base_tar()
    yield from _mutate("tar", tar, tar_regions(tar), rng, max(2, per_region // 3))


def _replace_deflate(npz: bytes, stream: bytes) -> bytes:
    """``npz`` with the deflate data of its first member (frames.npy) replaced by ``stream`` of the
    same length: the local header, the CRC and the central directory stay as they were."""
    csize, _u, nlen, xlen = struct.unpack_from("<IIHH", npz, 18)
    start = 30 + nlen + xlen
    assert len(stream) <= csize
    stream = stream + b"\0" * (csize - len(stream))
    return npz[:start] + stream + npz[start + csize :]
