"""The immutable VIN offline store (format v1): writer, strict reader, dataset, validation, stats, merge.

The contract is ``shared/spec/vin-store.md``. In short::

    <store>/
      manifest.json            written LAST, atomically: its presence means "complete"
      sample_index.jsonl       one row per sample, in sample_index order
      pairs.jsonl              one row per pair, pointing at sample indices (sorted by pair_id)
      splits/{all,train,val,test}.npy   int64, sorted
      shards/shard-000000/     a Zarr v3 group per shard: frames, num_frames, actions/aligned, actions/width

Design choices (recorded in the manifest where they matter):

* Sample order: rows are grouped by frame resolution (H, W) (groups in ascending (H, W)), then
  sorted by ``sample_key`` inside a group. Shards hold ``rows_per_shard`` rows of ONE resolution
  (the last shard of a group may be smaller); ``Tmax`` of a shard is the longest sample in it.
* Every array uses Zarr's sharding codec with the whole array as one shard (one file per array per
  shard folder) and one inner chunk per row (a row's whole ``(Tmax, H, W, 3)`` frame block), so a
  random access to one sample reads the shard index plus that row's chunk only. Inner chunks are
  Blosc LZ4 clevel 5 (no shuffle for uint8 frames, byte shuffle otherwise). zarr writes the array
  metadata; the shard object itself is written by this module in one ``write`` (inner chunks
  compressed in parallel, then the index and its crc32c, exactly as the sharding spec lays it out:
  zarr's own full-shard write measured ~4x slower), every chunk present (``write_empty_chunks``).
  No consolidated metadata.
* ``actions/width`` (int16) is always present (0 where a trajectory has no sidecar, or when the
  store is built with ``include_actions=False``). ``actions/aligned`` is optional: present in a shard
  only when at least one of its rows has actions (``action_width_max > 0`` in the shard entry); the
  block is ``materialized`` when any shard holds it.
* A sample's split is the split of the pairs that use it (two splits = leakage = error). A sample no
  pair uses keeps its declared ``SampleSpec.split``; a declared split that contradicts its pairs is
  an error.
* Machine-dependent facts (the profile path and the data root, used by :func:`rebuild_command`) live
  under ``manifest["local"]``, which the fingerprint excludes together with ``created_at`` and
  ``fingerprint``.
* Publication: everything is written into a sibling folder ``.<name>.tmp-<pid>-<start>-<host>-<rand>``,
  the manifest last (a writer first deletes such folders whose owner process is gone: killed builds);
  then, if ``out_dir`` exists, the two folders are swapped atomically with ``renameat2(RENAME_EXCHANGE)``
  (Linux) so there is no instant without a complete store at ``out_dir``; where that call is not
  available the old store is renamed aside, the new one renamed in (a window of two ``rename`` calls
  during which ``out_dir`` is absent, never half-written), and the old one deleted.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import io
import json
import math
import operator
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import uuid
import zipfile
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec
from zarr.storage import LocalStore

from . import __version__
from .errors import ProblemsError, StoreError, StoreNotFoundError, StoreValidationError, StoreVersionError
from .fsutil import atomic_write_json, canonical_json, fsync_dir, require_free_space
from .hashing import SHA256_RE, sha256_bytes, sha256_files_parallel
from .storage import StoreLocation, is_url

OFFLINE_DATASET_VERSION: int = 1
STORE_FORMAT = "stage2-vin-offline-store"
WRITER_PACKAGE = "stage2-data"

MANIFEST_NAME = "manifest.json"
SAMPLE_INDEX_NAME = "sample_index.jsonl"
PAIRS_NAME = "pairs.jsonl"
SPLITS_DIR = "splits"
SHARDS_DIR = "shards"
SPLIT_NAMES = ("train", "val", "test")
SPLIT_FILES = ("all", *SPLIT_NAMES)

BLOCK_FRAMES = "frames"
BLOCK_NUM_FRAMES = "num_frames"
BLOCK_ACTIONS = "actions/aligned"
BLOCK_WIDTH = "actions/width"
BLOCK_NAMES = (BLOCK_FRAMES, BLOCK_NUM_FRAMES, BLOCK_ACTIONS, BLOCK_WIDTH)
BLOCK_DTYPES = {
    BLOCK_FRAMES: "uint8",
    BLOCK_NUM_FRAMES: "int32",
    BLOCK_ACTIONS: "float32",
    BLOCK_WIDTH: "int16",
}
BLOCK_ROW_SHAPES: dict[str, list[Any]] = {
    BLOCK_FRAMES: ["Tmax", "H", "W", 3],
    BLOCK_NUM_FRAMES: [],
    BLOCK_ACTIONS: ["Tmax", "Wmax"],
    BLOCK_WIDTH: [],
}
OPTIONAL_BLOCKS = frozenset({BLOCK_ACTIONS})

COMPRESSOR_DESC = "blosc lz4 clevel 5; no shuffle for uint8 frames, byte shuffle for the other blocks"
MAX_ACTION_WIDTH = int(np.iinfo(np.int16).max)

SAMPLE_INDEX_FIELDS = (
    "sample_index",
    "sample_key",
    "cache_key",
    "source",
    "task",
    "quality_label",
    "partial_success",
    "is_robot",
    "split",
    "num_frames",
    "frame_height",
    "frame_width",
    "shard_id",
    "row",
    "frames_sha256",
    "action_status",
    "action_width",
)
PAIR_FIELDS = ("pair_id", "split", "task", "chosen_sample_index", "rejected_sample_index")
MANIFEST_TYPES: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "version": int,
    "created_at": str,
    "profile": dict,
    "inputs": dict,
    "writer": dict,
    "blocks": list,
    "codec": dict,
    "options": dict,
    "shards": list,
    "files": list,
    "stats": dict,
    "fingerprint": str,
}
#: manifest keys left out of the fingerprint: time, the fingerprint itself, this machine's paths.
FINGERPRINT_EXCLUDED = ("created_at", "fingerprint", "local")


class StoreInputError(ProblemsError, StoreError):
    """The inputs of a store build (samples, pairs, frame files, sidecars) have problems."""


# ----- public dataclasses -------------------------------------------------------------------------
@dataclass(frozen=True)
class SampleSpec:
    """One trajectory to put into the store."""

    sample_key: str  # the trajectory id
    cache_key: str
    source: str
    task: str
    quality_label: str
    partial_success: float | None
    is_robot: bool
    split: str  # train | val | test
    frames_path: Path  # the upstream trajectory .npz (frames uint8 (T,H,W,3), shape, num_frames), or an
    # already-decoded .npy holding frames alone (read with a plain copy: no inflate)
    sidecar_path: Path | None  # the action sidecar .npz (aligned_actions float (T,W)), or None
    action_status: str | None


@dataclass(frozen=True)
class PairSpec:
    pair_id: str
    split: str
    task: str
    chosen_key: str
    rejected_key: str


# ----- small helpers ------------------------------------------------------------------------------
def shard_dir_name(shard_id: int) -> str:
    return f"{SHARDS_DIR}/shard-{shard_id:06d}"


def _compressor(dtype: np.dtype[Any]) -> BloscCodec:
    """LZ4 (decodes at ~2 GB/s a core). Bitshuffle was measured: on camera-like uint8 frames it saves
    ~10% of the bytes but encodes 4x and decodes 5x slower, so frames get no shuffle at all (byte
    shuffle is a no-op on 1-byte items); the numeric blocks get byte shuffle."""
    return BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle" if dtype.itemsize == 1 else "shuffle")


def _codec_record() -> dict[str, Any]:
    return {
        "zarr_format": 3,
        "sharding": True,
        "shard": "one shard per array per shard folder (all R rows)",
        "inner_chunk": {
            BLOCK_FRAMES: [1, "Tmax", "H", "W", 3],
            BLOCK_NUM_FRAMES: ["R"],
            BLOCK_ACTIONS: [1, "Tmax", "Wmax"],
            BLOCK_WIDTH: ["R"],
        },
        "compressor": COMPRESSOR_DESC,
        "write_empty_chunks": True,
        "consolidated_metadata": False,
    }


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _jsonl_bytes(rows: Sequence[dict[str, Any]]) -> bytes:
    return "".join(
        json.dumps(r, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n" for r in rows
    ).encode("utf-8")


def _npy_bytes(arr: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _write_file(loc: StoreLocation, rel: str, data: bytes) -> dict[str, Any]:
    p = loc.root / rel
    if not loc.is_local:
        loc.write_bytes(p, data)  # one PUT per object
        return {"path": rel, "bytes": len(data), "sha256": sha256_bytes(data)}
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"path": rel, "bytes": len(data), "sha256": sha256_bytes(data)}


def _read_jsonl(path: Path, loc: StoreLocation | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    loc = loc or StoreLocation.parse(path.parent)
    where = loc.display(path)
    for lineno, line in enumerate(_lines(loc, path), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise StoreError(f"{where}:{lineno}: not valid JSON ({e.msg}).") from None
        if not isinstance(row, dict):
            raise StoreError(f"{where}:{lineno}: not a JSON object.")
        rows.append(row)
    return rows


def _tree_files(root: Path, sub: Path) -> list[str]:
    """Every regular file under ``sub``, as posix paths relative to ``root``, sorted."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(sub):
        dirnames.sort()
        for name in filenames:
            out.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(out)


def _fsync_files(root: Path, rels: Sequence[str]) -> None:
    for rel in rels:
        fd = os.open(root / rel, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    dirs = {(root / rel).parent for rel in rels}
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def _block_of(rel_in_shard: Sequence[str]) -> str:
    """Which block a file of a shard folder belongs to (parts relative to the shard folder)."""
    if len(rel_in_shard) >= 2 and rel_in_shard[0] == "actions" and rel_in_shard[1] in ("aligned", "width"):
        return f"actions/{rel_in_shard[1]}"
    if len(rel_in_shard) >= 2 and rel_in_shard[0] in (BLOCK_FRAMES, BLOCK_NUM_FRAMES):
        return rel_in_shard[0]
    return "group_metadata"


# ----- npz headers (no decompression of the big arrays) ---------------------------------------------
@dataclass(frozen=True)
class _NpyHeader:
    shape: tuple[int, ...]
    dtype: np.dtype[Any]


def _member_header(zf: zipfile.ZipFile, member: str) -> _NpyHeader:
    """Read only the ``.npy`` header of one npz member (a few hundred bytes are inflated)."""
    with zf.open(member) as f:
        version = np.lib.format.read_magic(f)  # type: ignore[no-untyped-call]
        if version == (1, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_1_0(f)  # type: ignore[no-untyped-call]
        else:
            shape, _fortran, dtype = np.lib.format.read_array_header_2_0(f)  # type: ignore[no-untyped-call]
    return _NpyHeader(tuple(int(s) for s in shape), np.dtype(dtype))


def _small_member(zf: zipfile.ZipFile, member: str) -> np.ndarray[Any, Any]:
    with zf.open(member) as f:
        arr: np.ndarray[Any, Any] = np.lib.format.read_array(f, allow_pickle=False)  # type: ignore[no-untyped-call]
    return arr


@dataclass(frozen=True)
class _FramesInfo:
    num_frames: int
    height: int
    width: int


def _inspect_frames_npz(path: Path, problems: list[str]) -> _FramesInfo | None:
    """Check a trajectory npz from its headers and small keys; append problems naming the file."""
    n0 = len(problems)
    if Path(path).suffix == ".npy":  # already decoded frames (T, H, W, 3) uint8, e.g. a pre-decoded cache
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)  # type: ignore[no-untyped-call]
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _fortran, dtype = read(f)
        except FileNotFoundError:
            problems.append(f"{path}: frames file does not exist")
            return None
        except (OSError, ValueError, EOFError) as e:
            problems.append(f"{path}: not a readable .npy ({e})")
            return None
        shape = tuple(int(x) for x in shape)
        arr_shape = np.array(shape, dtype=np.int64)
        return _check_frames_meta(
            path,
            shape,
            np.dtype(dtype),
            arr_shape,
            np.array(shape[0] if shape else 0, dtype=np.int64),
            problems,
        )
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            for key in ("frames", "shape", "num_frames"):
                if f"{key}.npy" not in names:
                    problems.append(
                        f"{path}: missing key {key!r} (a trajectory npz holds frames, shape, num_frames)"
                    )
            if len(problems) > n0:
                return None
            hdr = _member_header(zf, "frames.npy")
            shape_arr = _small_member(zf, "shape.npy")
            nf_arr = _small_member(zf, "num_frames.npy")
    except FileNotFoundError:
        problems.append(f"{path}: frames file does not exist")
        return None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        problems.append(f"{path}: not a readable npz ({e})")
        return None
    except ValueError as e:
        problems.append(f"{path}: refused ({e}); object/pickled arrays are not allowed")
        return None
    return _check_frames_meta(path, hdr.shape, hdr.dtype, shape_arr, nf_arr, problems)


def _check_frames_meta(
    path: Path,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    shape_arr: np.ndarray[Any, Any],
    nf_arr: np.ndarray[Any, Any],
    problems: list[str],
) -> _FramesInfo | None:
    n0 = len(problems)
    if dtype.hasobject:
        problems.append(f"{path}: 'frames' holds objects; expected uint8")
    elif dtype != np.uint8:
        problems.append(f"{path}: 'frames' has dtype {dtype}; expected uint8")
    if len(shape) != 4 or shape[3] != 3:
        problems.append(f"{path}: 'frames' has shape {shape}; expected (T, H, W, 3)")
    elif min(shape) <= 0:
        problems.append(f"{path}: 'frames' has an empty shape {shape}")
    if shape_arr.dtype.kind not in "iu" or shape_arr.ndim != 1:
        problems.append(f"{path}: 'shape' is not a 1-D integer array")
    elif tuple(int(x) for x in shape_arr) != shape:
        problems.append(f"{path}: 'shape' says {tuple(int(x) for x in shape_arr)} but 'frames' is {shape}")
    if nf_arr.dtype.kind not in "iu" or nf_arr.size != 1:
        problems.append(f"{path}: 'num_frames' is not an integer scalar")
    elif len(shape) >= 1 and int(nf_arr.reshape(())) != shape[0]:
        problems.append(f"{path}: 'num_frames' says {int(nf_arr.reshape(()))} but 'frames' holds {shape[0]}")
    if len(problems) > n0:
        return None
    return _FramesInfo(shape[0], shape[1], shape[2])


def _inspect_sidecar_npz(path: Path, num_frames: int | None, problems: list[str]) -> int | None:
    """Width of a sidecar's ``aligned_actions`` (T, W), from its header; problems name the file."""
    try:
        with zipfile.ZipFile(path) as zf:
            if "aligned_actions.npy" not in zf.namelist():
                problems.append(f"{path}: missing key 'aligned_actions'")
                return None
            hdr = _member_header(zf, "aligned_actions.npy")
    except FileNotFoundError:
        problems.append(f"{path}: sidecar file does not exist")
        return None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        problems.append(f"{path}: not a readable npz ({e})")
        return None
    return _check_actions_meta(path, hdr.shape, hdr.dtype, num_frames, problems)


def _check_actions_meta(
    path: Path, shape: tuple[int, ...], dtype: np.dtype[Any], num_frames: int | None, problems: list[str]
) -> int | None:
    n0 = len(problems)
    if dtype.kind != "f":
        problems.append(f"{path}: 'aligned_actions' has dtype {dtype}; expected a float array")
    if len(shape) != 2:
        problems.append(f"{path}: 'aligned_actions' has shape {shape}; expected (T, W)")
    else:
        if num_frames is not None and shape[0] != num_frames:
            problems.append(
                f"{path}: 'aligned_actions' has {shape[0]} rows but the trajectory has {num_frames} frames"
            )
        if not 1 <= shape[1] <= MAX_ACTION_WIDTH:
            problems.append(f"{path}: 'aligned_actions' width {shape[1]} is outside 1..{MAX_ACTION_WIDTH}")
    if len(problems) > n0:
        return None
    return shape[1]


# ----- planning ---------------------------------------------------------------------------------------
@dataclass
class _Row:
    spec: SampleSpec
    split: str
    num_frames: int
    height: int
    width: int
    action_width: int  # 0 when no sidecar or actions not included
    sample_index: int = -1
    shard_id: int = -1
    row: int = -1


@dataclass
class _ShardPlan:
    shard_id: int
    row_start: int
    rows: list[_Row]

    @property
    def tmax(self) -> int:
        return max(r.num_frames for r in self.rows)

    @property
    def hw(self) -> tuple[int, int]:
        return self.rows[0].height, self.rows[0].width

    @property
    def wmax(self) -> int:
        return max(r.action_width for r in self.rows)


def _dedupe_samples(samples: Sequence[SampleSpec], problems: list[str]) -> dict[str, SampleSpec]:
    by_key: dict[str, SampleSpec] = {}
    for s in samples:
        if not isinstance(s, SampleSpec):
            problems.append(f"samples: {s!r} is not a SampleSpec")
            continue
        old = by_key.get(s.sample_key)
        if old is None:
            by_key[s.sample_key] = s
        elif old != s:
            diff = [f.name for f in fields(SampleSpec) if getattr(old, f.name) != getattr(s, f.name)]
            problems.append(
                f"sample {s.sample_key!r} appears twice with different data (fields {', '.join(diff)})"
            )
    return by_key


def _assign_splits(
    by_key: dict[str, SampleSpec], pairs: Sequence[PairSpec], problems: list[str]
) -> tuple[dict[str, str], list[PairSpec]]:
    pair_splits: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    seen_pairs: dict[str, PairSpec] = {}
    kept: list[PairSpec] = []
    for p in pairs:
        if not isinstance(p, PairSpec):
            problems.append(f"pairs: {p!r} is not a PairSpec")
            continue
        if p.pair_id in seen_pairs:
            if seen_pairs[p.pair_id] != p:
                problems.append(f"pair {p.pair_id!r} appears twice with different data")
            continue
        seen_pairs[p.pair_id] = p
        ok = True
        if p.split not in SPLIT_NAMES:
            problems.append(f"pair {p.pair_id!r}: split {p.split!r} is not one of {', '.join(SPLIT_NAMES)}")
            ok = False
        for role, key in (("chosen", p.chosen_key), ("rejected", p.rejected_key)):
            if key not in by_key:
                problems.append(f"pair {p.pair_id!r}: {role} trajectory {key!r} is not among the samples")
                ok = False
        if p.chosen_key == p.rejected_key:
            problems.append(
                f"pair {p.pair_id!r}: chosen and rejected are the same trajectory {p.chosen_key!r}"
            )
            ok = False
        if ok:
            pair_splits[p.chosen_key][p.split].append(p.pair_id)
            pair_splits[p.rejected_key][p.split].append(p.pair_id)
            kept.append(p)
    split_of: dict[str, str] = {}
    for key, s in by_key.items():
        used = pair_splits.get(key)
        if used and len(used) > 1:
            detail = "; ".join(f"{sp}: {', '.join(sorted(ids)[:3])}" for sp, ids in sorted(used.items()))
            problems.append(
                f"split leakage: trajectory {key!r} is used by pairs of several splits ({detail})"
            )
            continue
        if used:
            (sp,) = used
            if s.split != sp:
                problems.append(f"sample {key!r}: declared split {s.split!r} but its pairs are in {sp!r}")
                continue
            split_of[key] = sp
        elif s.split not in SPLIT_NAMES:
            problems.append(f"sample {key!r}: split {s.split!r} is not one of {', '.join(SPLIT_NAMES)}")
        else:
            split_of[key] = s.split
    return split_of, sorted(kept, key=lambda p: p.pair_id)


def _check_spec_fields(s: SampleSpec, problems: list[str]) -> None:
    for name in ("sample_key", "cache_key", "source", "task", "quality_label"):
        if not isinstance(getattr(s, name), str):
            problems.append(f"sample {s.sample_key!r}: {name} must be a string")
    if not s.sample_key:
        problems.append(f"a sample has an empty sample_key (frames {s.frames_path})")
    if s.partial_success is not None and (
        not isinstance(s.partial_success, int | float) or not math.isfinite(float(s.partial_success))
    ):
        problems.append(
            f"sample {s.sample_key!r}: partial_success {s.partial_success!r} is not a finite number"
        )
    if not isinstance(s.is_robot, bool | np.bool_):
        problems.append(f"sample {s.sample_key!r}: is_robot must be a bool")


def _plan(
    samples: Sequence[SampleSpec], pairs: Sequence[PairSpec], include_actions: bool, rows_per_shard: int
) -> tuple[list[_ShardPlan], list[_Row], list[PairSpec]]:
    problems: list[str] = []
    by_key = _dedupe_samples(samples, problems)
    if not by_key and not problems:
        problems.append("no samples to write")
    split_of, kept_pairs = _assign_splits(by_key, pairs, problems)
    rows: list[_Row] = []
    for key in sorted(by_key):
        s = by_key[key]
        _check_spec_fields(s, problems)
        info = _inspect_frames_npz(Path(s.frames_path), problems)
        width = 0
        if include_actions and s.sidecar_path is not None:
            w = _inspect_sidecar_npz(Path(s.sidecar_path), info.num_frames if info else None, problems)
            width = w or 0
        if info is not None and key in split_of:
            rows.append(_Row(s, split_of[key], info.num_frames, info.height, info.width, width))
    if problems:
        raise StoreInputError(
            "cannot build the VIN offline store",
            problems,
            fix="correct the named inputs (pair manifest, frame files, sidecars) and build again",
        )
    groups: dict[tuple[int, int], list[_Row]] = defaultdict(list)
    for r in rows:
        groups[(r.height, r.width)].append(r)
    shards: list[_ShardPlan] = []
    ordered: list[_Row] = []
    for hw in sorted(groups):
        grp = sorted(groups[hw], key=lambda r: r.spec.sample_key)
        for start in range(0, len(grp), rows_per_shard):
            chunk = grp[start : start + rows_per_shard]
            plan = _ShardPlan(len(shards), len(ordered), chunk)
            for j, r in enumerate(chunk):
                r.sample_index = len(ordered)
                r.shard_id = plan.shard_id
                r.row = j
                ordered.append(r)
            shards.append(plan)
    return shards, ordered, kept_pairs


# ----- estimate ----------------------------------------------------------------------------------------
def estimate_store_bytes(samples: Sequence[SampleSpec], *, include_actions: bool = True) -> dict[str, int]:
    """Uncompressed payload bytes per block (unpadded), from npz headers only, plus ``total``.

    Frames are never decompressed: only each ``.npy`` member's header is read. The numbers equal
    ``manifest["stats"]["payload_bytes"]`` of the store these samples build; the stored arrays add
    zero/NaN padding up to each shard's ``Tmax`` (which compresses to almost nothing).
    """
    problems: list[str] = []
    by_key = _dedupe_samples(samples, problems)
    out = dict.fromkeys(BLOCK_NAMES, 0)
    for key in sorted(by_key):
        s = by_key[key]
        info = _inspect_frames_npz(Path(s.frames_path), problems)
        if info is None:
            continue
        out[BLOCK_FRAMES] += info.num_frames * info.height * info.width * 3
        out[BLOCK_NUM_FRAMES] += 4
        out[BLOCK_WIDTH] += 2
        if include_actions and s.sidecar_path is not None:
            w = _inspect_sidecar_npz(Path(s.sidecar_path), info.num_frames, problems)
            if w:
                out[BLOCK_ACTIONS] += info.num_frames * w * 4
    if problems:
        raise StoreInputError(
            "cannot estimate the VIN offline store size",
            problems,
            fix="correct the named frame files or sidecars",
        )
    out["total"] = sum(out[b] for b in BLOCK_NAMES)
    return out


def check_free_space_for_store(out_dir: Path, estimate: dict[str, int], *, margin: float = 1.05) -> None:
    """Refuse (DiskSpaceError) when the folder that will hold ``out_dir`` lacks ``total * margin`` bytes.

    The uncompressed payload is an upper bound of what Blosc writes for real data; the margin covers
    metadata and padding. An existing store at ``out_dir`` stays until the new one is complete, so
    this free space is needed on top of it.
    """
    needed = int(estimate["total"] * margin) + (1 << 20)
    require_free_space(Path(out_dir).parent, needed, f"the VIN offline store {out_dir}")


# ----- zarr writing ------------------------------------------------------------------------------------
def _write_array(
    store: LocalStore,
    name: str,
    data: np.ndarray[Any, Any],
    inner: tuple[int, ...],
    fill: Any,
    pool: ThreadPoolExecutor | None = None,
) -> tuple[Path, str] | None:
    """Create one array of a shard group; returns (shard object, its sha256) when this module wrote
    the shard object itself (hashed while written), None when zarr wrote it."""
    arr = zarr.create_array(
        store=store,
        name=name,
        shape=data.shape,
        chunks=inner,
        shards=data.shape,
        dtype=data.dtype,
        compressors=_compressor(data.dtype),
        fill_value=fill,
        config={"write_empty_chunks": True},
        zarr_format=3,
    )
    written = _write_shard_blob(store, arr, data, inner, pool)
    if written is None:
        arr[...] = data  # the whole shard in one call (zarr's own, slower, path)
    return written


def _write_shard_blob(
    store: LocalStore,
    arr: Any,
    data: np.ndarray[Any, Any],
    inner: tuple[int, ...],
    pool: ThreadPoolExecutor | None,
) -> tuple[Path, str] | None:
    """Write the array's single shard object directly (Zarr v3 sharding spec: the encoded inner
    chunks, then the index of (offset, nbytes) uint64 pairs in C order, then its crc32c), encoding the
    inner chunks in parallel. zarr's own full-shard write measured ~70 MB/s here against ~300+ for
    this. Only for the layout this module creates (chunks split along axis 0 only, index at the end,
    codecs bytes + blosc); returns None (nothing written) for anything else.

    Streaming: chunks are encoded on ``pool`` with at most ``2 x workers`` in flight and written (and
    hashed) in order as they complete, so the compressed shard is never held in memory whole."""
    import google_crc32c
    import numcodecs
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    codecs = arr.metadata.codecs
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    sc = codecs[0]
    if (
        str(getattr(sc.index_location, "value", sc.index_location)) != "end"
        or [type(c) for c in sc.codecs] != [BytesCodec, BloscCodec]
        or [type(c) for c in sc.index_codecs] != [BytesCodec, Crc32cCodec]
        or tuple(sc.chunk_shape) != tuple(inner)
        or tuple(inner[1:]) != tuple(data.shape[1:])
        or data.dtype.byteorder == ">"
    ):
        return None
    bc = sc.codecs[1]
    assert isinstance(bc, BloscCodec)
    shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[str(getattr(bc.shuffle, "value", bc.shuffle))]
    cname = str(getattr(bc.cname, "value", bc.cname))
    codec = numcodecs.Blosc(cname=cname, clevel=int(bc.clevel), shuffle=shuffle, blocksize=int(bc.blocksize))
    step = inner[0]
    n = -(-data.shape[0] // step) if data.shape[0] else 0
    if n * step != data.shape[0]:
        return None

    def enc(k: int) -> bytes:
        return bytes(codec.encode(np.ascontiguousarray(data[k * step : (k + 1) * step])))

    key = arr.metadata.encode_chunk_key((0,) * data.ndim)
    path = Path(str(store.root)) / arr.path / key
    path.parent.mkdir(parents=True, exist_ok=True)
    index = np.empty((n, 2), dtype="<u8")
    h = hashlib.sha256()
    off = 0
    window = 2 * max(1, getattr(pool, "_max_workers", 1)) if pool is not None else 0
    inflight: deque[Future[bytes]] = deque()
    with open(path, "wb") as f:
        for k in range(n):
            if pool is None:
                b = enc(k)
            else:
                while len(inflight) < window and k + len(inflight) < n:
                    inflight.append(pool.submit(enc, k + len(inflight)))
                b = inflight.popleft().result()
            index[k] = (off, len(b))
            off += len(b)
            f.write(b)
            h.update(b)
            del b
        idx = index.tobytes()
        crc = np.uint32(google_crc32c.value(idx)).astype("<u4").tobytes()
        f.write(idx + crc)
        h.update(idx + crc)
    return path, h.hexdigest()


def _write_shard_group(
    shard_dir: Path,
    frames: np.ndarray[Any, Any],
    num_frames: np.ndarray[Any, Any],
    widths: np.ndarray[Any, Any],
    actions: np.ndarray[Any, Any] | None,
    pool: ThreadPoolExecutor | None = None,
) -> tuple[list[str], dict[str, str]]:
    """Write one shard group; returns the array names and the sha256 of the shard objects this
    module wrote (by absolute path), which need not be read back to be hashed."""
    shard_dir.mkdir(parents=True, exist_ok=False)
    store = LocalStore(shard_dir)
    root = zarr.open_group(store=store, mode="w", zarr_format=3)
    r, tmax, h, w, _ = frames.shape
    written = [
        _write_array(store, BLOCK_FRAMES, frames, (1, tmax, h, w, 3), 0, pool),
        _write_array(store, BLOCK_NUM_FRAMES, num_frames, (r,), 0),
    ]
    root.create_group("actions")
    written.append(_write_array(store, BLOCK_WIDTH, widths, (r,), 0))
    names = [BLOCK_FRAMES, BLOCK_NUM_FRAMES, BLOCK_WIDTH]
    if actions is not None:
        written.append(
            _write_array(store, BLOCK_ACTIONS, actions, (1, tmax, actions.shape[2]), float("nan"), pool)
        )
        names.append(BLOCK_ACTIONS)
    return sorted(names), {str(w[0]): w[1] for w in written if w is not None}


# ----- publication -------------------------------------------------------------------------------------
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _rename_exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2). False when the call is unavailable here."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _remove_path(p: Path) -> None:
    if p.is_symlink() or p.is_file():
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p, ignore_errors=True)


def _publish(staging: Path, final: Path) -> None:
    """Put a complete staging folder at ``final``; an old store stays readable until then."""
    if final.exists() or final.is_symlink():
        if _rename_exchange(staging, final):
            fsync_dir(final.parent)
            _remove_path(staging)  # now holds the old store
        else:
            old = final.with_name(_owned_name(final.name, "old"))
            os.replace(final, old)
            os.replace(staging, final)
            fsync_dir(final.parent)
            _remove_path(old)
    else:
        os.replace(staging, final)
        fsync_dir(final.parent)


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


def _proc_start_time(pid: int) -> int:
    """Start time of process ``pid`` (clock ticks since boot, Linux ``/proc``); 0 when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    try:  # the command name (field 2) may hold spaces and parentheses: split after the last ')'
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return 0


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


#: ``.<name>.tmp-<pid>-<start>-<host>-<rand>`` (staging) and ``.<name>.old-...`` (a replaced store being
#: deleted): the owner's pid, its start time (so a reused pid is not mistaken for the owner) and host.
_OWNED_RE = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-(?P<start>\d+)-(?P<host>[0-9a-f]{8})-[0-9a-f]+$"
)


def _owned_name(out_name: str, kind: str) -> str:
    pid = os.getpid()
    return f".{out_name}.{kind}-{pid}-{_proc_start_time(pid)}-{_host_tag()}-{uuid.uuid4().hex[:12]}"


def _owner_alive(pid: int, start: int, host: str) -> bool:
    """Whether the process that made a temp folder may still be running (True when unsure)."""
    if host != _host_tag():
        return True  # another machine's writer (shared file system): never ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    except OSError:
        return True
    now = _proc_start_time(pid)
    return not (start and now and now != start)  # a different start time: the pid was reused


def stale_temp_dirs(out_dir: str | os.PathLike[str]) -> list[Path]:
    """The ``.<name>.tmp-*`` / ``.<name>.old-*`` siblings of ``out_dir`` whose writer is gone
    (killed builds); the folders of a live writer on this machine are never listed."""
    out = Path(out_dir).absolute()
    parent = out.parent
    if not parent.is_dir():
        return []
    stale: list[Path] = []
    for child in sorted(parent.iterdir()):
        m = _OWNED_RE.match(child.name)
        if m is None or m["name"] != out.name or child.is_symlink() or not child.is_dir():
            continue
        if not _owner_alive(int(m["pid"]), int(m["start"]), m["host"]):
            stale.append(child)
    return stale


def remove_stale_temp_dirs(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Delete what :func:`stale_temp_dirs` lists; returns the removed folders."""
    removed = []
    for d in stale_temp_dirs(out_dir):
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(d)
    return removed


def _make_staging(out_dir: Path) -> Path:
    """``.<name>.tmp-<pid>-...`` next to ``out_dir`` (ordinary folder permissions), after removing the
    staging folders that killed writers left there."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(out_dir)
    staging = out_dir.with_name(_owned_name(out_dir.name, "tmp"))
    staging.mkdir(mode=0o777)
    os.chmod(staging, 0o777 & ~_umask())
    return staging


def _check_out_dir(out_dir: Path, problems: list[str]) -> None:
    if out_dir.is_symlink() and not out_dir.exists():
        problems.append(f"out_dir {out_dir} is a dangling symlink")
        return
    if out_dir.exists():
        if not out_dir.is_dir():
            problems.append(f"out_dir {out_dir} exists and is not a folder")
        elif any(out_dir.iterdir()):
            m = out_dir / MANIFEST_NAME
            fmt = None
            with contextlib.suppress(OSError, ValueError):
                fmt = json.loads(m.read_text(encoding="utf-8")).get("format")
            if fmt != STORE_FORMAT:
                problems.append(
                    f"out_dir {out_dir} is a non-empty folder that is not a VIN offline store; "
                    "refusing to replace it (choose another folder or remove it)"
                )
    anc = out_dir.parent
    while not anc.exists():
        if anc.parent == anc:
            break
        anc = anc.parent
    if not anc.is_dir():
        problems.append(f"cannot create {out_dir.parent}: {anc} is not a folder")
    elif not os.access(anc, os.W_OK | os.X_OK):
        problems.append(f"cannot create {out_dir} : {anc} is not writable")


#: what a store prefix may hold; anything else under an object-storage target is not ours to delete
_STORE_TOP_NAMES = frozenset({MANIFEST_NAME, SAMPLE_INDEX_NAME, PAIRS_NAME, SPLITS_DIR, SHARDS_DIR})


def _check_remote_out(loc: StoreLocation, problems: list[str]) -> None:
    """An object-storage target: empty, a store, or the leftovers of an interrupted upload (only
    store names, no manifest): those are replaced. Anything else is refused."""
    try:
        names = loc.listdir_names(loc.root)
    except OSError as e:
        problems.append(f"cannot list {loc.url}: {e}")
        return
    foreign = sorted(names - _STORE_TOP_NAMES)
    if foreign:
        problems.append(
            f"{loc.url} holds objects that are not part of a VIN offline store ({foreign[:5]}); "
            "refusing to replace it (choose another prefix or remove them)"
        )
    elif MANIFEST_NAME in names:
        fmt = None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fmt = json.loads(loc.read_bytes(loc.root / MANIFEST_NAME)).get("format")
        if fmt != STORE_FORMAT:
            problems.append(
                f"{loc.url} holds a manifest.json that is not a VIN offline store's; refusing to replace it"
            )


def _clear_remote(loc: StoreLocation) -> None:
    """Un-commit first (delete the manifest: from then on no reader sees a store), then the rest."""
    loc.delete(loc.root / MANIFEST_NAME)
    loc.delete_tree(loc.root)
    loc.invalidate()


# ----- manifest ----------------------------------------------------------------------------------------
def _blocks_record(materialized_actions: bool) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "dtype": BLOCK_DTYPES[name],
            "row_shape": BLOCK_ROW_SHAPES[name],
            "optional": name in OPTIONAL_BLOCKS,
            "materialized": materialized_actions if name == BLOCK_ACTIONS else True,
        }
        for name in BLOCK_NAMES
    ]


def _fingerprint_of(manifest: dict[str, Any], files: Sequence[tuple[str, str]]) -> str:
    body = {k: v for k, v in manifest.items() if k not in FINGERPRINT_EXCLUDED}
    doc = {"files": sorted([list(f) for f in files]), "manifest": body}
    return hashlib.sha256(canonical_json(doc).encode("utf-8")).hexdigest()


def _manifest_data_files(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    out = [(f["path"], f["sha256"]) for f in manifest.get("files", [])]
    for sh in manifest.get("shards", []):
        out += [(f["path"], f["sha256"]) for f in sh.get("files", [])]
    return out


def _stats(
    index_rows: Sequence[dict[str, Any]],
    pairs_rows: Sequence[dict[str, Any]],
    shards: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    nfs = [int(r["num_frames"]) for r in index_rows]
    payload = dict.fromkeys(BLOCK_NAMES, 0)
    stored = dict.fromkeys(BLOCK_NAMES, 0)
    compressed = dict.fromkeys([*BLOCK_NAMES, "group_metadata"], 0)
    for r in index_rows:
        t = int(r["num_frames"])
        payload[BLOCK_FRAMES] += t * int(r["frame_height"]) * int(r["frame_width"]) * 3
        payload[BLOCK_ACTIONS] += t * int(r["action_width"]) * 4
    payload[BLOCK_NUM_FRAMES] = 4 * len(index_rows)
    payload[BLOCK_WIDTH] = 2 * len(index_rows)
    for sh in shards:
        rr = int(sh["num_rows"])
        tmax, h, w, c = (int(x) for x in sh["frame_shape"])
        stored[BLOCK_FRAMES] += rr * tmax * h * w * c
        stored[BLOCK_NUM_FRAMES] += 4 * rr
        stored[BLOCK_WIDTH] += 2 * rr
        stored[BLOCK_ACTIONS] += rr * tmax * int(sh["action_width_max"]) * 4
        for f in sh["files"]:
            compressed[_block_of(Path(f["path"]).parts[2:])] += int(f["bytes"])
    for d in (payload, stored, compressed):
        d["total"] = sum(d.values())
    return {
        "samples": len(index_rows),
        "pairs": len(pairs_rows),
        "shards": len(shards),
        "per_split": {sp: sum(1 for r in index_rows if r["split"] == sp) for sp in SPLIT_NAMES},
        "pairs_per_split": {sp: sum(1 for p in pairs_rows if p["split"] == sp) for sp in SPLIT_NAMES},
        "per_source": dict(sorted(Counter(str(r["source"]) for r in index_rows).items())),
        "with_actions": sum(1 for r in index_rows if int(r["action_width"]) > 0),
        "frames_per_sample": {
            "min": min(nfs) if nfs else 0,
            "mean": round(sum(nfs) / len(nfs), 6) if nfs else 0.0,
            "max": max(nfs) if nfs else 0,
            "total": sum(nfs),
        },
        "resolutions": dict(
            sorted(Counter(f"{r['frame_height']}x{r['frame_width']}" for r in index_rows).items())
        ),
        "payload_bytes": payload,
        "stored_bytes_uncompressed": stored,
        "compressed_bytes": compressed,
    }


def _write_metadata_files(
    root: StoreLocation, index_rows: Sequence[dict[str, Any]], pairs_rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    files = [
        _write_file(root, SAMPLE_INDEX_NAME, _jsonl_bytes(index_rows)),
        _write_file(root, PAIRS_NAME, _jsonl_bytes(pairs_rows)),
    ]
    n = len(index_rows)
    splits = {"all": np.arange(n, dtype=np.int64)}
    for sp in SPLIT_NAMES:
        splits[sp] = np.array([r["sample_index"] for r in index_rows if r["split"] == sp], dtype=np.int64)
    for name in SPLIT_FILES:
        files.append(_write_file(root, f"{SPLITS_DIR}/{name}.npy", _npy_bytes(np.sort(splits[name]))))
    return files


def _finish_manifest(
    target: StoreLocation,
    *,
    profile: dict[str, Any],
    inputs: dict[str, str],
    options: dict[str, Any],
    shard_entries: list[dict[str, Any]],
    index_rows: list[dict[str, Any]],
    pairs_rows: list[dict[str, Any]],
    local: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    files = _write_metadata_files(target, index_rows, pairs_rows)
    staging = target.root
    manifest: dict[str, Any] = {
        "format": STORE_FORMAT,
        "version": OFFLINE_DATASET_VERSION,
        "created_at": _utc_now(),
        "profile": dict(profile),
        "inputs": dict(sorted(inputs.items())),
        "writer": {"package": WRITER_PACKAGE, "version": __version__},
        "blocks": _blocks_record(any(int(s["action_width_max"]) > 0 for s in shard_entries)),
        "codec": _codec_record(),
        "options": options,
        "shards": shard_entries,
        "files": files,
        "stats": _stats(index_rows, pairs_rows, shard_entries),
        "local": local,
    }
    if extra:
        manifest.update(extra)
    manifest["fingerprint"] = _fingerprint_of(manifest, _manifest_data_files(manifest))
    all_rel = [f["path"] for f in files] + [f["path"] for s in shard_entries for f in s["files"]]
    if target.is_local:
        _fsync_files(staging, all_rel)
    target.invalidate()
    problems = _validate(target, manifest, deep=False)
    if problems:
        raise StoreValidationError(
            f"the store just written in {target.display(staging)} is invalid (a writer bug)",
            problems,
            fix="report this; nothing was published",
        )
    if target.is_local:
        atomic_write_json(staging / MANIFEST_NAME, manifest)  # LAST: its presence means complete
        os.chmod(staging / MANIFEST_NAME, 0o666 & ~_umask())  # mkstemp gives 0600
        fsync_dir(staging)
    else:  # object storage: one PUT, LAST; the commit marker (no rename exists there)
        body = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        target.write_bytes(staging / MANIFEST_NAME, body.encode("utf-8"))
        target.invalidate()
    return manifest


# ----- writer ------------------------------------------------------------------------------------------
def _check_profile(profile: Any, problems: list[str]) -> None:
    if not isinstance(profile, dict):
        problems.append("profile must be a dict with name, repo_id, revision")
        return
    for k in ("name", "repo_id", "revision"):
        if not isinstance(profile.get(k), str) or not profile.get(k):
            problems.append(f"profile[{k!r}] must be a non-empty string")
    extra = sorted(set(profile) - {"name", "repo_id", "revision"})
    if extra:
        problems.append(f"profile has unknown keys {extra}; only name, repo_id, revision are recorded")


def _check_inputs(inputs: Any, problems: list[str]) -> None:
    if not isinstance(inputs, dict):
        problems.append("inputs must be a dict {name: sha256}")
        return
    for k, v in inputs.items():
        if not isinstance(k, str) or not k:
            problems.append(f"inputs: name {k!r} must be a non-empty string")
        elif k.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", k):
            problems.append(
                f"inputs: name {k!r} is an absolute path; use a relative name (fingerprints are portable)"
            )
        if not isinstance(v, str) or not SHA256_RE.match(v):
            problems.append(f"inputs[{k!r}]: {v!r} is not a 64-hex lowercase sha256")


@dataclass
class _LoadedShard:
    frames: np.ndarray[Any, Any]
    actions: np.ndarray[Any, Any] | None
    digests: list[str]


class VinOfflineWriter:
    """Build a store at ``out_dir`` from samples and pairs, shard by shard, publish atomically.

    ``progress`` is called after each shard with the number of rows that shard wrote.
    ``profile_path`` and ``data_root`` (optional) are recorded under ``manifest["local"]`` for
    :func:`rebuild_command`; they never enter the fingerprint.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | StoreLocation,
        *,
        profile: dict[str, Any],
        inputs: dict[str, str],
        rows_per_shard: int = 64,
        include_actions: bool = True,
        progress: Callable[[int], None] | None = None,
        profile_path: Path | None = None,
        data_root: Path | None = None,
        kit_root: Path | None = None,
        workers: int | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        problems: list[str] = []
        if not isinstance(rows_per_shard, int) or isinstance(rows_per_shard, bool) or rows_per_shard <= 0:
            problems.append(f"rows_per_shard must be a positive integer, got {rows_per_shard!r}")
        if not isinstance(include_actions, bool):
            problems.append(f"include_actions must be a bool, got {include_actions!r}")
        if progress is not None and not callable(progress):
            problems.append("progress must be callable or None")
        _check_profile(profile, problems)
        _check_inputs(inputs, problems)
        self.location = StoreLocation.parse(out_dir, storage_options)
        out = self.location.root
        if self.location.is_local:
            _check_out_dir(out, problems)
        else:
            _check_remote_out(self.location, problems)
        if problems:
            raise StoreInputError(
                f"cannot write a VIN offline store at {self.location.url}",
                problems,
                fix="correct the named writer arguments",
            )
        self.out_dir = out
        self.profile = {k: profile[k] for k in ("name", "repo_id", "revision")}
        self.inputs = dict(inputs)
        self.rows_per_shard = rows_per_shard
        self.include_actions = include_actions
        self.progress = progress
        self.local = {
            "profile_path": str(Path(profile_path).absolute()) if profile_path is not None else None,
            "data_root": str(Path(data_root).absolute()) if data_root is not None else None,
        }
        if kit_root is not None:
            self.local["kit_root"] = str(Path(kit_root).absolute())
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self._encode_pool: ThreadPoolExecutor | None = None

    # -- loading one shard's rows -------------------------------------------------------------------
    @staticmethod
    def _load_row(
        r: _Row, j: int, frames: np.ndarray[Any, Any], actions: np.ndarray[Any, Any] | None
    ) -> tuple[str | None, list[str]]:
        problems: list[str] = []
        fp = Path(r.spec.frames_path)
        try:
            if fp.suffix == ".npy":  # already decoded: a plain copy from the page cache
                f = np.load(fp, mmap_mode="r", allow_pickle=False)
                shape_arr = np.array(f.shape, dtype=np.int64)
                nf_arr = np.array(f.shape[0] if f.ndim else 0, dtype=np.int64)
            else:
                with np.load(fp, allow_pickle=False) as z:
                    f = z["frames"]
                    shape_arr = z["shape"]
                    nf_arr = z["num_frames"]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
            return None, [f"{fp}: cannot load ({e}); object/pickled arrays are not allowed"]
        info = _check_frames_meta(fp, tuple(f.shape), f.dtype, shape_arr, nf_arr, problems)
        if info is None:
            return None, problems
        if (info.num_frames, info.height, info.width) != (r.num_frames, r.height, r.width):
            return None, [f"{fp}: changed while the store was being built (shape {f.shape})"]
        frames[j, : r.num_frames] = f
        digest = frames_sha256(frames[j, : r.num_frames])
        if actions is not None and r.action_width > 0 and r.spec.sidecar_path is not None:
            sp = Path(r.spec.sidecar_path)
            try:
                with np.load(sp, allow_pickle=False) as z:
                    a = z["aligned_actions"]
            except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
                return None, [f"{sp}: cannot load ({e})"]
            w = _check_actions_meta(sp, tuple(a.shape), a.dtype, r.num_frames, problems)
            if w is None:
                return None, problems
            if w != r.action_width:
                return None, [f"{sp}: changed while the store was being built (width {w})"]
            actions[j, : r.num_frames, :w] = a.astype(np.float32)
        return digest, []

    def _load_shard(self, plan: _ShardPlan, pool: ThreadPoolExecutor) -> _LoadedShard:
        """Decode one shard's rows into its padded arrays (rows in parallel on ``pool``)."""
        rr = len(plan.rows)
        tmax = plan.tmax
        h, w = plan.hw
        wmax = plan.wmax
        frames = np.zeros((rr, tmax, h, w, 3), dtype=np.uint8)
        actions = np.full((rr, tmax, wmax), np.nan, dtype=np.float32) if wmax > 0 else None
        results = list(pool.map(self._load_row, plan.rows, range(rr), repeat(frames), repeat(actions)))
        problems = [p for _, probs in results for p in probs]
        if problems:
            raise StoreInputError(
                "cannot build the VIN offline store", problems, fix="correct the named inputs and build again"
            )
        return _LoadedShard(frames, actions, [d or "" for d, _ in results])

    def _write_shard(self, staging: Path, plan: _ShardPlan, loaded: _LoadedShard) -> dict[str, Any]:
        """Write one decoded shard as a Zarr group; its files listed with bytes and sha256."""
        frames, actions = loaded.frames, loaded.actions
        rr = len(plan.rows)
        tmax = plan.tmax
        h, w = plan.hw
        wmax = plan.wmax
        num_frames = np.array([r.num_frames for r in plan.rows], dtype=np.int32)
        widths = np.array([r.action_width for r in plan.rows], dtype=np.int16)
        rel_dir = shard_dir_name(plan.shard_id)
        arrays, hashes = _write_shard_group(
            staging / rel_dir, frames, num_frames, widths, actions, self._encode_pool
        )
        rels = _tree_files(staging, staging / rel_dir)
        rest = [staging / r for r in rels if str(staging / r) not in hashes]  # zarr.json and the like
        hashes.update(sha256_files_parallel(rest, workers=self.workers))
        entry = {
            "id": plan.shard_id,
            "dir": rel_dir,
            "row_start": plan.row_start,
            "num_rows": rr,
            "frame_shape": [tmax, h, w, 3],
            "action_width_max": wmax,
            "arrays": arrays,
            "files": [
                {"path": r, "bytes": (staging / r).stat().st_size, "sha256": hashes[str(staging / r)]}
                for r in rels
            ],
        }
        return entry

    def write(self, samples: Sequence[SampleSpec], pairs: Sequence[PairSpec]) -> dict[str, Any]:
        """Build and publish the store; returns its manifest."""
        shards, rows, kept_pairs = _plan(samples, pairs, self.include_actions, self.rows_per_shard)
        payload = sum(
            r.num_frames * r.height * r.width * 3 + r.num_frames * r.action_width * 4 + 6 for r in rows
        )
        remote = not self.location.is_local
        if remote:
            # Object storage: shards are written to a local scratch folder one at a time, uploaded,
            # and deleted there; the metadata files follow, then manifest.json LAST (the commit).
            staging = Path(tempfile.mkdtemp(prefix="stage2-store-upload-"))
            _clear_remote(self.location)
        else:
            remove_stale_temp_dirs(self.out_dir)  # space held by killed builds counts as free
            check_free_space_for_store(self.out_dir, {"total": payload})
            staging = _make_staging(self.out_dir)
        try:
            shard_entries: list[dict[str, Any]] = []
            digests: dict[int, str] = {}
            # Pipelined: while shard k is compressed and written, shard k+1 is decoded in the
            # background (its rows in parallel). At most two shards are in memory at once.
            with (
                ThreadPoolExecutor(max_workers=self.workers) as pool,
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-prefetch") as prefetch,
            ):
                self._encode_pool = pool  # inner chunks are compressed in parallel on the same threads
                nxt = prefetch.submit(self._load_shard, shards[0], pool) if shards else None
                for k, plan in enumerate(shards):
                    assert nxt is not None
                    loaded = nxt.result()
                    nxt = (
                        prefetch.submit(self._load_shard, shards[k + 1], pool)
                        if k + 1 < len(shards)
                        else None
                    )
                    try:
                        shard_entries.append(self._write_shard(staging, plan, loaded))
                        if remote:
                            self._upload_shard(staging, shard_entries[-1])
                    except BaseException:
                        if nxt is not None:
                            nxt.cancel()
                        raise
                    for r, d in zip(plan.rows, loaded.digests, strict=True):
                        digests[r.sample_index] = d
                    del loaded
                    if self.progress is not None:
                        self.progress(len(plan.rows))
            key_to_index = {r.spec.sample_key: r.sample_index for r in rows}
            index_rows = [_index_row(r, digests[r.sample_index]) for r in rows]
            pairs_rows = [
                {
                    "pair_id": p.pair_id,
                    "split": p.split,
                    "task": p.task,
                    "chosen_sample_index": key_to_index[p.chosen_key],
                    "rejected_sample_index": key_to_index[p.rejected_key],
                }
                for p in kept_pairs
            ]
            manifest = _finish_manifest(
                self.location if remote else StoreLocation.parse(staging),
                profile=self.profile,
                inputs=self.inputs,
                options={"include_actions": self.include_actions, "rows_per_shard": self.rows_per_shard},
                shard_entries=shard_entries,
                index_rows=index_rows,
                pairs_rows=pairs_rows,
                local=self.local,
            )
            if not remote:
                _publish(staging, self.out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if remote:  # no manifest was written: best-effort removal of the uploaded objects
                with contextlib.suppress(Exception):
                    _clear_remote(self.location)
            raise
        finally:
            if remote:
                shutil.rmtree(staging, ignore_errors=True)
        return manifest

    def _upload_shard(self, staging: Path, entry: dict[str, Any]) -> None:
        """Upload one shard folder written in the local scratch folder, then delete it there."""
        pairs = [(staging / f["path"], self.location.root / f["path"]) for f in entry["files"]]
        self.location.put_files(pairs, workers=max(4, self.workers))
        shutil.rmtree(staging / entry["dir"], ignore_errors=True)


def frames_sha256(frames: np.ndarray[Any, Any]) -> str:
    """A sample's ``frames_sha256``: sha256 of its ``num_frames`` frames as C-contiguous uint8
    (T, H, W, 3) bytes, padding excluded. The writer records it; validation and readers recompute it."""
    return sha256_bytes(np.ascontiguousarray(frames, dtype=np.uint8).data)


def _index_row(r: _Row, digest: str) -> dict[str, Any]:
    s = r.spec
    return {
        "sample_index": r.sample_index,
        "sample_key": s.sample_key,
        "cache_key": s.cache_key,
        "source": s.source,
        "task": s.task,
        "quality_label": s.quality_label,
        "partial_success": None if s.partial_success is None else float(s.partial_success),
        "is_robot": bool(s.is_robot),
        "split": r.split,
        "num_frames": r.num_frames,
        "frame_height": r.height,
        "frame_width": r.width,
        "shard_id": r.shard_id,
        "row": r.row,
        "frames_sha256": digest,
        "action_status": s.action_status,
        "action_width": r.action_width,
    }


# ----- strict reader -----------------------------------------------------------------------------------
def rebuild_command(path: str | os.PathLike[str], manifest: dict[str, Any] | None) -> str:
    """The command that rebuilds the store at ``path`` with the current writer.

    The data root is the one the store lives in when ``path`` follows the layout
    ``<DATA_ROOT>/stores/<profile>/<id>`` (so a moved or copied data root rebuilds itself, not the
    place it was built in); otherwise the one recorded in ``manifest["local"]``. The profile path (and
    the kit root when it was not the profile's folder) come from ``manifest["local"]``; without them
    a ``PROFILE.toml`` placeholder is printed. No ``--endpoint``: archives already verified in the
    data root are never requested again, so the command runs offline; missing ones come from the
    real hub (add ``--endpoint URL`` for a mirror).
    """
    local = manifest.get("local") if isinstance(manifest, dict) else None
    profile_path = local.get("profile_path") if isinstance(local, dict) else None
    data_root = local.get("data_root") if isinstance(local, dict) else None
    kit_root = local.get("kit_root") if isinstance(local, dict) else None
    p = Path(path).absolute()
    # (object storage: the data root recorded by the writer, if any)
    if not is_url(os.fspath(path)) and len(p.parents) >= 3 and p.parent.parent.name == "stores":
        data_root = str(p.parents[2])
    if not isinstance(data_root, str) or not data_root:
        data_root = "DATA_ROOT"
    if not isinstance(profile_path, str) or not profile_path:
        profile_path = "PROFILE.toml"
    cmd = ["stage2", "build", "--profile", profile_path, "--data-root", data_root]
    if isinstance(kit_root, str) and kit_root and Path(kit_root) != Path(profile_path).parent:
        cmd += ["--kit-root", kit_root]
    return shlex.join(cmd)


def _load_manifest_strict(loc: StoreLocation) -> dict[str, Any]:
    path = loc.url
    mpath = loc.display(loc.root / MANIFEST_NAME)
    if not loc.is_file(loc.root / MANIFEST_NAME):
        raise StoreNotFoundError(
            f"no complete VIN offline store at {path}: {MANIFEST_NAME} is missing (incomplete or not a store).",
            fix=f"build it: {rebuild_command(path, None)}",
        )
    try:
        manifest = json.loads(loc.read_bytes(loc.root / MANIFEST_NAME).decode("utf-8"))
    except (OSError, ValueError) as e:
        raise StoreError(
            f"{mpath}: unreadable manifest ({e}).", fix=f"rebuild: {rebuild_command(path, None)}"
        ) from None
    if not isinstance(manifest, dict):
        raise StoreError(
            f"{mpath}: the manifest is not a JSON object.", fix=f"rebuild: {rebuild_command(path, None)}"
        )
    fmt = manifest.get("format")
    if fmt != STORE_FORMAT:
        raise StoreVersionError(
            f"Unsupported VIN offline store format: {fmt!r}. Expected {STORE_FORMAT!r}.",
            fix=f"rebuild the store with the current writer: {rebuild_command(path, manifest)}",
        )
    version = manifest.get("version")
    if type(version) is not int or version != OFFLINE_DATASET_VERSION:
        raise StoreVersionError(
            f"Unsupported VIN offline store version: {version}. Expected {OFFLINE_DATASET_VERSION}.",
            fix=f"rebuild the store with the current writer: {rebuild_command(path, manifest)}",
        )
    return manifest


_MISSING = 2**64 - 1


@dataclass(frozen=True)
class _DirectArray:
    path: Path  # the array's single shard object
    index: np.ndarray[Any, Any]  # (n, 2) uint64: offset, nbytes of each inner chunk (axis 0)
    codec: Any  # numcodecs.Blosc
    inner: tuple[int, ...]
    dtype: np.dtype[Any]
    fill: Any


def _direct_array(
    arr: Any,
    array_dir: Path,
    read_range: Callable[[Path, int, int], bytes],
    size_of: Callable[[Path], int] = lambda p: p.stat().st_size,
) -> _DirectArray | None:
    """Parse the index of an array written by :func:`_write_shard_blob` (verified with its crc32c)."""
    import google_crc32c
    import numcodecs
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    codecs = arr.metadata.codecs
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    sc = codecs[0]
    inner = tuple(int(x) for x in sc.chunk_shape)
    if (
        str(getattr(sc.index_location, "value", sc.index_location)) != "end"
        or [type(c) for c in sc.codecs] != [BytesCodec, BloscCodec]
        or [type(c) for c in sc.index_codecs] != [BytesCodec, Crc32cCodec]
        or tuple(arr.shards) != tuple(arr.shape)
        or inner[0] != 1
        or inner[1:] != tuple(arr.shape[1:])
        or arr.dtype.byteorder == ">"
    ):
        return None
    n = int(arr.shape[0])
    path = array_dir / arr.metadata.encode_chunk_key((0,) * len(arr.shape))
    try:
        size = size_of(path)
    except FileNotFoundError:
        return None  # never written: zarr gives the fill value
    nidx = 16 * n + 4
    if size < nidx:
        raise StoreError(f"{path}: {size} bytes cannot hold the shard index of {n} chunks.")
    raw = read_range(path, size - nidx, nidx)
    crc = np.uint32(google_crc32c.value(raw[:-4])).astype("<u4").tobytes()
    if crc != raw[-4:]:
        raise StoreError(
            f"{path}: the shard index fails its crc32c (corrupt file).",
            fix="validate the store with --deep and rebuild it",
        )
    index = np.frombuffer(raw[:-4], dtype="<u8").reshape(n, 2)
    bc = sc.codecs[1]
    assert isinstance(bc, BloscCodec)
    codec = numcodecs.Blosc(cname=str(getattr(bc.cname, "value", bc.cname)), clevel=int(bc.clevel))
    return _DirectArray(path, index, codec, inner, np.dtype(arr.dtype), arr.fill_value)


class VinOfflineStoreReader:
    """Strict reader: refuses a store without ``manifest.json`` or of another format/version.

    Shard groups are opened lazily (one ``zarr.open_group`` per shard on first use, then cached).
    Arrays with the layout this module writes are read directly: the shard index once per shard
    (checked against its crc32c, then cached), then ONE ranged read of the sample's own inner chunk,
    decoded with Blosc into a fresh array; anything else is read through zarr.
    """

    def __init__(
        self, path: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
    ) -> None:
        self.location = StoreLocation.parse(path, storage_options)
        #: the local folder, or ``bucket/prefix`` on object storage (``location.url`` names it)
        self.path = self.location.root
        self.manifest: dict[str, Any] = _load_manifest_strict(self.location)
        self._shards: list[dict[str, Any]] = list(self.manifest.get("shards", []))
        self._sample_index: list[dict[str, Any]] | None = None
        self._pairs: list[dict[str, Any]] | None = None
        self._splits: dict[str, np.ndarray[Any, Any]] = {}
        self._groups: dict[int, Any] = {}
        self._arrays: dict[tuple[int, str], Any] = {}
        self._direct_cache: dict[tuple[int, str], _DirectArray | None] = {}
        self._pid = os.getpid()

    # pickling (DataLoader workers): drop open zarr handles, reopen lazily in the worker.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_groups"] = {}
        state["_arrays"] = {}
        state["_direct_cache"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    @property
    def num_samples(self) -> int:
        return sum(int(s["num_rows"]) for s in self._shards)

    def __len__(self) -> int:
        return self.num_samples

    @property
    def sample_index(self) -> list[dict[str, Any]]:
        if self._sample_index is None:
            rows = _read_jsonl(self.path / SAMPLE_INDEX_NAME, self.location)
            if len(rows) != self.num_samples:
                raise StoreError(
                    f"{self.path / SAMPLE_INDEX_NAME}: {len(rows)} rows but the manifest has {self.num_samples}.",
                    fix=f"validate the store (`validate_vin_offline_store`) and rebuild: "
                    f"{rebuild_command(self.path, self.manifest)}",
                )
            self._sample_index = rows
        return self._sample_index

    def split(self, name: str) -> np.ndarray[Any, Any]:
        if name not in SPLIT_FILES:
            raise KeyError(f"unknown split {name!r}; expected one of {', '.join(SPLIT_FILES)}")
        if name not in self._splits:
            raw = self.location.read_bytes(self.path / SPLITS_DIR / f"{name}.npy")
            arr = np.load(io.BytesIO(raw), allow_pickle=False)
            self._splits[name] = np.asarray(arr, dtype=np.int64)
        return self._splits[name]

    def pairs(self) -> list[dict[str, Any]]:
        if self._pairs is None:
            self._pairs = _read_jsonl(self.path / PAIRS_NAME, self.location)
        return self._pairs

    # -- zarr access ---------------------------------------------------------------------------------
    def _open_store(self, shard_dir: Path) -> Any:
        """The zarr store of one shard folder (a hook: tests wrap it to count reads)."""
        return self.location.zarr_store(shard_dir, read_only=True)

    def _group(self, shard_id: int) -> Any:
        if self._pid != os.getpid():  # forked: zarr handles of the parent are not reused
            self._groups = {}
            self._arrays = {}
            self._direct_cache = {}
            self._pid = os.getpid()
        g = self._groups.get(shard_id)
        if g is None:
            entry = self._shards[shard_id]
            g = zarr.open_group(
                store=self._open_store(self.path / entry["dir"]),
                mode="r",
                zarr_format=3,
                use_consolidated=False,
            )
            self._groups[shard_id] = g
        return g

    def _array(self, shard_id: int, name: str) -> Any:
        g = self._group(shard_id)
        a = self._arrays.get((shard_id, name))
        if a is None:
            a = g[name]
            self._arrays[(shard_id, name)] = a
        return a

    # -- direct shard reads ------------------------------------------------------------------------
    def _read_range(self, path: Path, offset: int, length: int) -> bytes:
        """``length`` bytes of ``path`` at ``offset`` (a hook: tests wrap it to count reads)."""
        data = self.location.read_range(path, offset, length)
        if len(data) != length:
            raise StoreError(
                f"{path}: truncated ({len(data)} of {length} bytes at offset {offset}).",
                fix=f"validate the store with --deep and rebuild it: {rebuild_command(self.path, self.manifest)}",
            )
        return data

    def _direct(self, shard_id: int, name: str) -> _DirectArray | None:
        """The shard index of one array, read once and cached, when the array has the layout this
        module writes (else None: zarr reads it). A sample then costs one read of its own chunk."""
        key = (shard_id, name)
        if key in self._direct_cache:
            return self._direct_cache[key]
        arr = self._array(shard_id, name)
        d = _direct_array(
            arr, self.path / self._shards[shard_id]["dir"] / name, self._read_range, self.location.size
        )
        self._direct_cache[key] = d
        return d

    def _read_row(self, shard_id: int, name: str, row: int) -> np.ndarray[Any, Any] | None:
        d = self._direct(shard_id, name)
        if d is None:
            return None
        off, nbytes = (int(x) for x in d.index[row])
        out = np.empty(d.inner, dtype=d.dtype)
        if off == _MISSING and nbytes == _MISSING:  # an empty chunk (never written by this module)
            out[...] = d.fill
            return out[0]
        d.codec.decode(self._read_range(d.path, off, nbytes), out=out)
        return out[0]

    def _padded_row(self, shard_id: int, name: str, row: int) -> np.ndarray[Any, Any]:
        """One whole row of an array (padding included), decoded as :meth:`read_frames` decodes it."""
        direct = self._read_row(shard_id, name, row)
        if direct is not None:
            return direct
        return np.asarray(self._array(shard_id, name)[row])

    def _row(self, i: int) -> dict[str, Any]:
        i = operator.index(i)
        n = self.num_samples
        if not 0 <= i < n:
            raise IndexError(f"sample index {i} out of range [0, {n})")
        return self.sample_index[i]

    def read_frames(self, i: int) -> np.ndarray[Any, Any]:
        meta = self._row(i)
        shard_id, row, t = int(meta["shard_id"]), int(meta["row"]), int(meta["num_frames"])
        direct = self._read_row(shard_id, BLOCK_FRAMES, row)
        if direct is not None:
            return direct[:t]
        out: np.ndarray[Any, Any] = self._array(shard_id, BLOCK_FRAMES)[row, :t]
        return out

    def read_actions(self, i: int) -> np.ndarray[Any, Any] | None:
        meta = self._row(i)
        width = int(meta["action_width"])
        entry = self._shards[int(meta["shard_id"])]
        if width <= 0 or int(entry["action_width_max"]) <= 0:
            return None
        shard_id, row, t = int(meta["shard_id"]), int(meta["row"]), int(meta["num_frames"])
        direct = self._read_row(shard_id, BLOCK_ACTIONS, row)
        if direct is not None:
            return direct[:t, :width]
        out: np.ndarray[Any, Any] = self._array(shard_id, BLOCK_ACTIONS)[row, :t, :width]
        return out

    def sample(self, i: int) -> dict[str, Any]:
        meta = self._row(i)
        return {
            "frames": self.read_frames(i),
            "actions": self.read_actions(i),
            "num_frames": int(meta["num_frames"]),
            "meta": meta,
        }


class VinOfflineDataset:
    """Map-style dataset over one split (or all samples); usable as a PyTorch dataset.

    ``ds[i]`` is a dict: ``frames`` uint8 (T, H, W, 3), ``actions`` float32 (T, W) (``(T, 0)`` when
    the sample has no actions, so every item has the same keys and types), ``num_frames``,
    ``action_width`` and the sample-index metadata (sample_index, sample_key, split, task, ...).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | StoreLocation,
        split: str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.reader = VinOfflineStoreReader(path, storage_options)
        self.split = split
        self.indices = self.reader.split(split if split is not None else "all")

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = operator.index(i)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for a dataset of {n} samples")
        s = self.reader.sample(int(self.indices[i]))
        meta = s["meta"]
        actions = s["actions"]
        if actions is None:
            actions = np.zeros((s["num_frames"], 0), dtype=np.float32)
        item: dict[str, Any] = {k: meta[k] for k in SAMPLE_INDEX_FIELDS}
        item.update({"frames": s["frames"], "actions": actions, "num_frames": s["num_frames"]})
        return item

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]


# ----- validation --------------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate_manifest_fields(m: dict[str, Any], problems: list[str], where: str) -> None:
    for key, typ in MANIFEST_TYPES.items():
        if key not in m:
            problems.append(f"{where}: missing field {key!r}")
        elif not isinstance(m[key], typ) or (typ is int and isinstance(m[key], bool)):
            problems.append(f"{where}: field {key!r} has the wrong type ({type(m[key]).__name__})")
    if m.get("format") != STORE_FORMAT:
        problems.append(f"{where}: format {m.get('format')!r}; expected {STORE_FORMAT!r}")
    if m.get("version") != OFFLINE_DATASET_VERSION or not _is_int(m.get("version")):
        problems.append(
            f"{where}: Unsupported VIN offline store version: {m.get('version')}. Expected {OFFLINE_DATASET_VERSION}."
        )
    prof = m.get("profile")
    if isinstance(prof, dict):
        for k in ("name", "repo_id", "revision"):
            if not isinstance(prof.get(k), str) or not prof.get(k):
                problems.append(f"{where}: profile.{k} missing or empty")
    inputs = m.get("inputs")
    if isinstance(inputs, dict):
        for k, v in inputs.items():
            if not isinstance(v, str) or not SHA256_RE.match(v):
                problems.append(f"{where}: inputs[{k!r}] is not a sha256")
    writer = m.get("writer")
    if isinstance(writer, dict):
        for k in ("package", "version"):
            if not isinstance(writer.get(k), str):
                problems.append(f"{where}: writer.{k} missing")
    blocks = m.get("blocks")
    if isinstance(blocks, list):
        by_name = {b.get("name"): b for b in blocks if isinstance(b, dict)}
        for name in BLOCK_NAMES:
            b = by_name.get(name)
            if b is None:
                problems.append(f"{where}: block {name!r} is not described in 'blocks'")
                continue
            if b.get("dtype") != BLOCK_DTYPES[name]:
                problems.append(
                    f"{where}: block {name!r} dtype {b.get('dtype')!r}; expected {BLOCK_DTYPES[name]!r}"
                )
            if bool(b.get("optional")) != (name in OPTIONAL_BLOCKS):
                problems.append(f"{where}: block {name!r} optional flag is wrong")
            if name not in OPTIONAL_BLOCKS and b.get("materialized") is not True:
                problems.append(f"{where}: required block {name!r} is not materialized")
        extra = sorted(set(by_name) - set(BLOCK_NAMES), key=str)
        if extra:
            problems.append(f"{where}: unknown blocks {extra}")
    fp = m.get("fingerprint")
    if isinstance(fp, str) and not SHA256_RE.match(fp):
        problems.append(f"{where}: fingerprint is not a sha256")


def _validate_shard_entries(m: dict[str, Any], problems: list[str], where: str) -> list[dict[str, Any]]:
    good: list[dict[str, Any]] = []
    shards: list[Any] = m["shards"] if isinstance(m.get("shards"), list) else []
    row_start = 0
    for k, sh in enumerate(shards):
        tag = f"{where}: shards[{k}]"
        if not isinstance(sh, dict):
            problems.append(f"{tag} is not an object")
            continue
        bad = len(problems)
        if sh.get("id") != k:
            problems.append(f"{tag}: id {sh.get('id')!r}; expected {k}")
        if sh.get("dir") != shard_dir_name(k):
            problems.append(f"{tag}: dir {sh.get('dir')!r}; expected {shard_dir_name(k)!r}")
        if sh.get("row_start") != row_start:
            problems.append(f"{tag}: row_start {sh.get('row_start')!r}; expected {row_start}")
        nr_raw: Any = sh.get("num_rows")
        nr: int = nr_raw if _is_int(nr_raw) and nr_raw > 0 else 0
        if nr == 0:
            problems.append(f"{tag}: num_rows {nr_raw!r} is not a positive integer")
        fs = sh.get("frame_shape")
        if not (
            isinstance(fs, list) and len(fs) == 4 and all(_is_int(x) and x > 0 for x in fs) and fs[3] == 3
        ):
            problems.append(f"{tag}: frame_shape {fs!r} is not [Tmax, H, W, 3]")
        aw: Any = sh.get("action_width_max")
        if not _is_int(aw) or int(aw) < 0:
            problems.append(f"{tag}: action_width_max {aw!r} is not a non-negative integer")
        files = sh.get("files")
        if not isinstance(files, list) or not all(
            isinstance(f, dict)
            and isinstance(f.get("path"), str)
            and _is_int(f.get("bytes"))
            and isinstance(f.get("sha256"), str)
            for f in files
        ):
            problems.append(f"{tag}: files is not a list of {{path, bytes, sha256}}")
        row_start += nr
        if len(problems) == bad:
            good.append(sh)
    return good


def _validate_index(
    loc: StoreLocation, m: dict[str, Any], shards: list[dict[str, Any]], problems: list[str]
) -> list[dict[str, Any]]:
    root = loc.root
    ipath_p = root / SAMPLE_INDEX_NAME
    ipath = loc.display(ipath_p)
    if not loc.is_file(ipath_p):
        problems.append(f"{ipath}: missing")
        return []
    rows: list[dict[str, Any]] = []
    if True:
        for lineno, line in enumerate(_lines(loc, ipath_p), start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"{ipath}:{lineno}: not valid JSON ({e.msg})")
                continue
            if not isinstance(row, dict):
                problems.append(f"{ipath}:{lineno}: not a JSON object")
                continue
            if set(row) != set(SAMPLE_INDEX_FIELDS):
                missing = sorted(set(SAMPLE_INDEX_FIELDS) - set(row))
                extra = sorted(set(row) - set(SAMPLE_INDEX_FIELDS))
                problems.append(f"{ipath}:{lineno}: fields differ (missing {missing}, unexpected {extra})")
                continue
            rows.append(row)
    n_manifest = sum(int(s["num_rows"]) for s in shards)
    stats: dict[str, Any] = m["stats"] if isinstance(m.get("stats"), dict) else {}
    if len(rows) != n_manifest:
        problems.append(f"{ipath}: {len(rows)} rows but the manifest's shards hold {n_manifest}")
    if stats.get("samples") != len(rows):
        problems.append(
            f"{loc.display(root / MANIFEST_NAME)}: stats.samples {stats.get('samples')!r} but {len(rows)} index rows"
        )
    keys = Counter(r["sample_key"] for r in rows)
    dups = sorted(k for k, c in keys.items() if c > 1)
    if dups:
        problems.append(f"{ipath}: duplicate sample keys {dups[:10]}{' ...' if len(dups) > 10 else ''}")
    by_id = {int(s["id"]): s for s in shards}
    for pos, r in enumerate(rows):
        tag = f"{ipath}:{pos + 1}"
        if r["sample_index"] != pos:
            problems.append(f"{tag}: sample_index {r['sample_index']!r}; expected {pos}")
        if r["split"] not in SPLIT_NAMES:
            problems.append(f"{tag}: split {r['split']!r} is not one of {', '.join(SPLIT_NAMES)}")
        if not isinstance(r["frames_sha256"], str) or not SHA256_RE.match(r["frames_sha256"]):
            problems.append(f"{tag}: frames_sha256 is not a sha256")
        sh = by_id.get(r["shard_id"]) if _is_int(r["shard_id"]) else None
        if sh is None:
            problems.append(f"{tag}: shard_id {r['shard_id']!r} is not a shard of the manifest")
            continue
        tmax, h, w, _ = sh["frame_shape"]
        if not _is_int(r["row"]) or not 0 <= r["row"] < sh["num_rows"] or sh["row_start"] + r["row"] != pos:
            problems.append(f"{tag}: row {r['row']!r} of shard {sh['id']} does not hold sample {pos}")
        if not _is_int(r["num_frames"]) or not 1 <= r["num_frames"] <= tmax:
            problems.append(f"{tag}: num_frames {r['num_frames']!r} outside 1..{tmax} (shard Tmax)")
        if (r["frame_height"], r["frame_width"]) != (h, w):
            problems.append(
                f"{tag}: resolution {r['frame_height']}x{r['frame_width']} differs from shard {sh['id']} ({h}x{w})"
            )
        if not _is_int(r["action_width"]) or not 0 <= r["action_width"] <= sh["action_width_max"]:
            problems.append(f"{tag}: action_width {r['action_width']!r} outside 0..{sh['action_width_max']}")
    return rows


def _validate_splits(
    loc: StoreLocation, m: dict[str, Any], rows: list[dict[str, Any]], problems: list[str]
) -> None:
    root = loc.root
    n = len(rows)
    loaded: dict[str, np.ndarray[Any, Any]] = {}
    for name in SPLIT_FILES:
        pp = root / SPLITS_DIR / f"{name}.npy"
        p = loc.display(pp)
        if not loc.is_file(pp):
            problems.append(f"{p}: missing split file")
            continue
        try:
            arr = np.load(io.BytesIO(loc.read_bytes(pp)), allow_pickle=False)
        except (OSError, ValueError) as e:
            problems.append(f"{p}: unreadable ({e})")
            continue
        if arr.dtype != np.int64 or arr.ndim != 1:
            problems.append(f"{p}: dtype {arr.dtype} ndim {arr.ndim}; expected 1-D int64")
            continue
        if arr.size and (np.any(np.diff(arr) <= 0)):
            problems.append(f"{p}: not sorted strictly increasing")
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            problems.append(f"{p}: indices outside [0, {n})")
        loaded[name] = arr
    sets = {k: set(v.tolist()) for k, v in loaded.items()}
    for i, a in enumerate(SPLIT_NAMES):
        for b in SPLIT_NAMES[i + 1 :]:
            if a in sets and b in sets and sets[a] & sets[b]:
                problems.append(f"splits {a} and {b} overlap on {len(sets[a] & sets[b])} samples")
    if all(k in sets for k in SPLIT_FILES):
        union = sets["train"] | sets["val"] | sets["test"]
        if union != sets["all"]:
            problems.append("splits: train ∪ val ∪ test differs from all")
    if "all" in loaded and not np.array_equal(loaded["all"], np.arange(n, dtype=np.int64)):
        problems.append(f"{loc.display(root / SPLITS_DIR / 'all.npy')}: is not 0..{n - 1}")
    per_split = (m.get("stats") or {}).get("per_split") if isinstance(m.get("stats"), dict) else None
    for sp in SPLIT_NAMES:
        if sp not in sets:
            continue
        want = {r["sample_index"] for r in rows if r["split"] == sp}
        if sets[sp] != want:
            problems.append(
                f"splits/{sp}.npy: {len(sets[sp] ^ want)} samples disagree with sample_index.jsonl's split column"
            )
        if isinstance(per_split, dict) and per_split.get(sp) != len(sets[sp]):
            problems.append(
                f"stats.per_split.{sp} {per_split.get(sp)!r} but splits/{sp}.npy has {len(sets[sp])}"
            )


def _validate_pairs(
    loc: StoreLocation, m: dict[str, Any], rows: list[dict[str, Any]], problems: list[str]
) -> None:
    root = loc.root
    pp = root / PAIRS_NAME
    p = loc.display(pp)
    if not loc.is_file(pp):
        problems.append(f"{p}: missing")
        return
    n = len(rows)
    count = 0
    seen: set[str] = set()
    if True:
        for lineno, line in enumerate(_lines(loc, pp), start=1):
            tag = f"{p}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"{tag}: not valid JSON ({e.msg})")
                continue
            count += 1
            if not isinstance(row, dict) or set(row) != set(PAIR_FIELDS):
                problems.append(f"{tag}: fields differ from {list(PAIR_FIELDS)}")
                continue
            if row["pair_id"] in seen:
                problems.append(f"{tag}: duplicate pair_id {row['pair_id']!r}")
            seen.add(row["pair_id"])
            if row["split"] not in SPLIT_NAMES:
                problems.append(f"{tag}: split {row['split']!r} is not one of {', '.join(SPLIT_NAMES)}")
            for role in ("chosen_sample_index", "rejected_sample_index"):
                idx = row[role]
                if not _is_int(idx) or not 0 <= idx < n:
                    problems.append(f"{tag}: {role} {idx!r} is not a sample index in [0, {n})")
                elif rows[idx]["split"] != row["split"]:
                    problems.append(
                        f"{tag}: pair {row['pair_id']!r} ({row['split']}) uses sample {idx} "
                        f"({rows[idx]['sample_key']}) of split {rows[idx]['split']}"
                    )
    stats: dict[str, Any] = m["stats"] if isinstance(m.get("stats"), dict) else {}
    if stats.get("pairs") != count:
        problems.append(
            f"{loc.display(root / MANIFEST_NAME)}: stats.pairs {stats.get('pairs')!r} but {PAIRS_NAME} has {count} rows"
        )


def _validate_arrays(
    loc: StoreLocation,
    shards: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    problems: list[str],
    *,
    decode: bool = False,
) -> None:
    root = loc.root
    reader: VinOfflineStoreReader | None = None
    if decode:
        try:
            reader = VinOfflineStoreReader(loc)
        except StoreError as e:
            problems.append(f"cannot decode the samples: {e}")
    for sh in shards:
        sdir_p = root / sh["dir"]
        sdir = loc.display(sdir_p)
        if not loc.is_dir(sdir_p):
            continue  # reported by the shard-count check
        rr = int(sh["num_rows"])
        tmax, h, w, _ = sh["frame_shape"]
        wmax = int(sh["action_width_max"])
        expected: dict[str, tuple[int, ...]] = {
            BLOCK_FRAMES: (rr, tmax, h, w, 3),
            BLOCK_NUM_FRAMES: (rr,),
            BLOCK_WIDTH: (rr,),
        }
        if wmax > 0:
            expected[BLOCK_ACTIONS] = (rr, tmax, wmax)
        store = loc.zarr_store(sdir_p, read_only=True)
        arrays: dict[str, Any] = {}
        for name, shape in expected.items():
            try:
                arr = zarr.open_array(store=store, path=name, mode="r", zarr_format=3)
            except Exception as e:  # noqa: BLE001 - any failure to open is a problem to report
                problems.append(f"{sdir}/{name}: cannot open the array ({type(e).__name__}: {e})")
                continue
            if tuple(arr.shape) != shape:
                problems.append(f"{sdir}/{name}: shape {tuple(arr.shape)}; expected {shape}")
            if str(arr.dtype) != BLOCK_DTYPES[name]:
                problems.append(f"{sdir}/{name}: dtype {arr.dtype}; expected {BLOCK_DTYPES[name]}")
            else:
                arrays[name] = arr
        if wmax == 0 and loc.exists(sdir_p / "actions" / "aligned"):
            problems.append(f"{sdir}/{BLOCK_ACTIONS}: present but the manifest says action_width_max 0")
        mine = rows[int(sh["row_start"]) : int(sh["row_start"]) + rr]
        for name, col in ((BLOCK_NUM_FRAMES, "num_frames"), (BLOCK_WIDTH, "action_width")):
            if name not in arrays or len(mine) != rr or tuple(arrays[name].shape) != (rr,):
                continue
            try:
                got = np.asarray(arrays[name][...])
            except Exception as e:  # noqa: BLE001
                problems.append(f"{sdir}/{name}: cannot read ({type(e).__name__}: {e})")
                continue
            want = np.array([r[col] for r in mine])
            bad = np.nonzero(got != want)[0]
            if bad.size:
                problems.append(
                    f"{sdir}/{name}: {bad.size} rows disagree with sample_index.jsonl's {col} (first row {int(bad[0])})"
                )
        if reader is not None and len(mine) == rr and BLOCK_FRAMES in arrays:
            _validate_decoded(reader, int(sh["id"]), sdir, wmax, mine, problems)


def _validate_decoded(
    reader: VinOfflineStoreReader,
    sid: int,
    sdir: str,
    wmax: int,
    mine: list[dict[str, Any]],
    problems: list[str],
) -> None:
    """Decode one shard's rows the way training reads them (the strict reader, one row at a time on
    a few threads) and check each against the sample index: frames_sha256 over its ``num_frames``
    frames, zeros past them, and actions NaN past the row's length and width."""
    names = [BLOCK_FRAMES, *([BLOCK_ACTIONS] if wmax > 0 else [])]
    try:
        for name in names:
            reader._direct(sid, name)  # the shard index, read once before the threads share it
    except Exception as e:  # noqa: BLE001 - a shard that cannot be opened is a problem to report
        problems.append(f"{sdir}: cannot decode ({type(e).__name__}: {e})")
        return

    def check(r: dict[str, Any]) -> list[str]:
        row, n, w = int(r["row"]), int(r["num_frames"]), int(r["action_width"])
        try:
            frames = reader._padded_row(sid, BLOCK_FRAMES, row)
            actions = reader._padded_row(sid, BLOCK_ACTIONS, row) if wmax > 0 else None
        except Exception as e:  # noqa: BLE001
            return [f"cannot decode ({type(e).__name__}: {e})"]
        bad = []
        if frames_sha256(frames[:n]) != r["frames_sha256"]:
            bad.append("frames_sha256")
        if frames[n:].any():
            bad.append("padding")
        if actions is not None and not (np.isnan(actions[n:]).all() and np.isnan(actions[:n, w:]).all()):
            bad.append("actions")
        return bad

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        found = list(pool.map(check, mine))
    what = {
        "frames_sha256": f"{BLOCK_FRAMES}: decoded frames disagree with sample_index.jsonl's frames_sha256",
        "padding": f"{BLOCK_FRAMES}: non-zero frames past num_frames",
        "actions": f"{BLOCK_ACTIONS}: values where NaN padding belongs (past the row's length or width)",
    }
    for key in [*what, *sorted({k for ks in found for k in ks} - set(what))]:
        rows = [j for j, ks in enumerate(found) if key in ks]
        if rows:
            keys = ", ".join(str(mine[j]["sample_key"]) for j in rows[:3])
            problems.append(
                f"{sdir}/{what.get(key, key)} in {len(rows)} row(s) (first rows {rows[:3]}: {keys})"
            )


def _validate_files(
    loc: StoreLocation, m: dict[str, Any], shards: list[dict[str, Any]], deep: bool, problems: list[str]
) -> None:
    root = loc.root
    disp = loc.display
    listed: list[dict[str, Any]] = [f for f in m.get("files", []) if isinstance(f, dict)]
    for sh in shards:
        listed += sh["files"]
    listed_paths = {f["path"] for f in listed}
    for name in (SAMPLE_INDEX_NAME, PAIRS_NAME, *[f"{SPLITS_DIR}/{s}.npy" for s in SPLIT_FILES]):
        if name not in listed_paths:
            problems.append(f"{disp(root / MANIFEST_NAME)}: file {name} is not listed with its sha256")
    present: list[dict[str, Any]] = []
    remote_sizes = None if loc.is_local else loc.file_sizes()  # one listing, not a HEAD per file
    for f in listed:
        p = root / f["path"]
        if remote_sizes is None:
            size = p.stat().st_size if p.is_file() else -1
        else:
            size = remote_sizes.get(f["path"], -1)
        if size < 0:
            if not f["path"].startswith(SPLITS_DIR + "/"):  # missing split files are reported once, above
                problems.append(f"{disp(p)}: listed in the manifest but missing")
            continue
        if size != f["bytes"]:
            problems.append(f"{disp(p)}: {size} bytes; the manifest says {f['bytes']}")
        present.append(f)
    expected_dirs = {Path(sh["dir"]).name for sh in shards}
    sroot = root / SHARDS_DIR
    if remote_sizes is None:
        on_disk = loc.listdir_names(sroot)
        shard_files = loc.tree_files(sroot) if on_disk else []
    else:
        shard_files = sorted(r for r in remote_sizes if r.startswith(SHARDS_DIR + "/"))
        on_disk = {r.split("/")[1] for r in shard_files}
    for d in sorted(expected_dirs - on_disk):
        problems.append(f"{disp(sroot / d)}: shard folder missing")
    for d in sorted(on_disk - expected_dirs):
        problems.append(
            f"{disp(sroot / d)}: unexpected shard folder (the manifest lists {len(shards)} shards)"
        )
    if on_disk:
        for rel in shard_files:
            if rel not in listed_paths:
                problems.append(f"{disp(root / rel)}: file not listed in the manifest")
    if deep and present:
        hashes = loc.sha256_files([root / f["path"] for f in present])
        for f in present:
            got = hashes[str(root / f["path"])]
            if got != f["sha256"]:
                problems.append(f"{disp(root / f['path'])}: sha256 {got}; the manifest says {f['sha256']}")


def validate_vin_offline_store(
    path: str | os.PathLike[str] | StoreLocation,
    deep: bool = False,
    storage_options: dict[str, Any] | None = None,
    *,
    decode: bool = False,
) -> list[str]:
    """Read-only check of a store; returns every problem found (empty list = valid).

    Checks manifest fields, format/version, row counts, shard count, split files (sorted, disjoint,
    union == all, counts), unique sample keys, pairs (valid indices, matching split), required
    blocks and per-shard array shapes/dtypes (array metadata), the small per-row arrays against the
    sample index, and every listed file's size. ``deep`` also hashes every file against the manifest
    and recomputes the fingerprint. ``decode`` also decodes every sample as the reader does (a row
    at a time on a few threads: memory stays bounded by a few rows) and checks its frames against
    its ``frames_sha256``, the zero padding past ``num_frames`` and the NaN padding of actions past
    the row's length and width.
    """
    loc = StoreLocation.parse(path, storage_options)
    root = loc.root
    if loc.is_local and not root.is_dir():
        return [f"{root}: not a folder (no store here)"]
    mpath = loc.display(root / MANIFEST_NAME)
    if not loc.is_file(root / MANIFEST_NAME):
        return [f"{mpath}: missing (incomplete or not a store)"]
    try:
        m = json.loads(loc.read_bytes(root / MANIFEST_NAME).decode("utf-8"))
    except (OSError, ValueError) as e:
        return [f"{mpath}: unreadable ({e})"]
    if not isinstance(m, dict):
        return [f"{mpath}: not a JSON object"]
    return _validate(loc, m, deep, decode=decode)


def _lines(loc: StoreLocation, p: Path) -> list[str]:
    """The lines of a text file as iterating the open file gives them: split on "\n" only (JSON text
    may hold U+2028 and the like, which ``str.splitlines`` would split on)."""
    lines = loc.read_bytes(p).decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln + "\n" for ln in lines]


def _validate(loc: StoreLocation, m: dict[str, Any], deep: bool, *, decode: bool = False) -> list[str]:
    root = loc.root
    mpath = loc.display(root / MANIFEST_NAME)
    problems: list[str] = []
    _validate_manifest_fields(m, problems, str(mpath))
    shards = _validate_shard_entries(m, problems, str(mpath))
    stats: dict[str, Any] = m["stats"] if isinstance(m.get("stats"), dict) else {}
    if isinstance(m.get("shards"), list) and stats.get("shards") not in (None, len(m["shards"])):
        problems.append(f"{mpath}: stats.shards {stats.get('shards')!r} but {len(m['shards'])} shards listed")
    blocks = {b.get("name"): b for b in m.get("blocks", []) if isinstance(b, dict)}
    has_actions = any(int(s["action_width_max"]) > 0 for s in shards)
    if BLOCK_ACTIONS in blocks and bool(blocks[BLOCK_ACTIONS].get("materialized")) != has_actions:
        problems.append(
            f"{mpath}: block {BLOCK_ACTIONS} materialized={blocks[BLOCK_ACTIONS].get('materialized')!r} "
            f"but {'some' if has_actions else 'no'} shard holds it"
        )
    rows = _validate_index(loc, m, shards, problems)
    _validate_splits(loc, m, rows, problems)
    _validate_pairs(loc, m, rows, problems)
    _validate_arrays(loc, shards, rows, problems, decode=decode)
    _validate_files(loc, m, shards, deep, problems)
    if deep and isinstance(m.get("fingerprint"), str):
        try:
            fp = store_fingerprint(loc)
        except (OSError, StoreError) as e:
            problems.append(f"{loc.url}: cannot recompute the fingerprint ({e})")
        else:
            if fp != m["fingerprint"]:
                problems.append(f"{mpath}: fingerprint {m['fingerprint']} but the content gives {fp}")
    return problems


def raise_if_invalid(
    path: str | os.PathLike[str] | StoreLocation,
    deep: bool = False,
    storage_options: dict[str, Any] | None = None,
    *,
    decode: bool = False,
) -> None:
    loc = StoreLocation.parse(path, storage_options)
    problems = validate_vin_offline_store(loc, deep=deep, decode=decode)
    if problems:
        manifest: dict[str, Any] | None = None
        with contextlib.suppress(OSError, ValueError):
            manifest = json.loads(loc.read_bytes(loc.root / MANIFEST_NAME).decode("utf-8"))
        path = loc.url
        raise StoreValidationError(
            f"VIN offline store {path} is invalid",
            problems,
            fix=f"rebuild it: {rebuild_command(path, manifest if isinstance(manifest, dict) else None)}",
        )


def store_fingerprint(
    path: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
) -> str:
    """Recompute the fingerprint from the files on disk (hashes every data file) and the manifest.

    sha256 over the sorted (relative path, sha256) of every data file (shards, sample_index.jsonl,
    pairs.jsonl, splits) and the canonical JSON of the manifest without ``created_at``,
    ``fingerprint`` and ``local`` (this machine's paths). The writer stores the same value in
    ``manifest["fingerprint"]``.
    """
    loc = StoreLocation.parse(path, storage_options)
    root = loc.root
    mpath = root / MANIFEST_NAME
    if not loc.is_file(mpath):
        raise StoreNotFoundError(f"no complete VIN offline store at {loc.url}: {MANIFEST_NAME} is missing.")
    manifest = json.loads(loc.read_bytes(mpath).decode("utf-8"))
    rels = [r for r in loc.tree_files(root) if r != MANIFEST_NAME]
    hashes = loc.sha256_files([root / r for r in rels])
    return _fingerprint_of(manifest, [(r, hashes[str(root / r)]) for r in rels])


# ----- stats -------------------------------------------------------------------------------------------
def collect_vin_offline_dataset_stats(
    path: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Counts per split and source, pairs, samples with actions, frames per sample, and bytes per
    block: uncompressed (from the manifest: payload and stored with padding) and on disk (stat)."""
    reader = VinOfflineStoreReader(path, storage_options)
    loc = reader.location
    rows = reader.sample_index
    m = reader.manifest
    on_disk = dict.fromkeys([*BLOCK_NAMES, "group_metadata"], 0)
    for sh in m["shards"]:
        for f in sh["files"]:
            p = reader.path / f["path"]
            with contextlib.suppress(FileNotFoundError):
                on_disk[_block_of(Path(f["path"]).parts[2:])] += loc.size(p)
    meta_bytes = 0
    for rel in [f["path"] for f in m.get("files", [])] + [MANIFEST_NAME]:
        with contextlib.suppress(FileNotFoundError):
            meta_bytes += loc.size(reader.path / rel)
    on_disk["metadata_files"] = meta_bytes
    on_disk["total"] = sum(on_disk.values())
    nfs = [int(r["num_frames"]) for r in rows]
    per_split_source: dict[str, dict[str, int]] = {sp: {} for sp in SPLIT_NAMES}
    for r in rows:
        d = per_split_source.setdefault(r["split"], {})
        d[r["source"]] = d.get(r["source"], 0) + 1
    stats = m.get("stats", {})
    return {
        "path": loc.url,
        "format": m["format"],
        "version": m["version"],
        "fingerprint": m.get("fingerprint"),
        "profile": m.get("profile"),
        "samples": len(rows),
        "shards": len(m["shards"]),
        "pairs": len(reader.pairs()),
        "pairs_per_split": dict(Counter(p["split"] for p in reader.pairs())),
        "per_split": {sp: sum(1 for r in rows if r["split"] == sp) for sp in SPLIT_NAMES},
        "per_source": dict(sorted(Counter(r["source"] for r in rows).items())),
        "per_split_source": {k: dict(sorted(v.items())) for k, v in per_split_source.items()},
        "with_actions": sum(1 for r in rows if int(r["action_width"]) > 0),
        "action_widths": {
            str(k): v for k, v in sorted(Counter(int(r["action_width"]) for r in rows).items())
        },
        "resolutions": dict(sorted(Counter(f"{r['frame_height']}x{r['frame_width']}" for r in rows).items())),
        "frames_per_sample": {
            "min": min(nfs) if nfs else 0,
            "mean": (sum(nfs) / len(nfs)) if nfs else 0.0,
            "max": max(nfs) if nfs else 0,
        },
        "bytes": {
            "payload_uncompressed": stats.get("payload_bytes"),
            "stored_uncompressed": stats.get("stored_bytes_uncompressed"),
            "compressed_in_manifest": stats.get("compressed_bytes"),
            "on_disk": on_disk,
        },
    }


# ----- merge -------------------------------------------------------------------------------------------
def _copy_verified(src: Path, dst: Path, expected_sha: str) -> None:
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while True:
            buf = fi.read(8 << 20)
            if not buf:
                break
            h.update(buf)
            fo.write(buf)
        fo.flush()
        os.fsync(fo.fileno())
    if h.hexdigest() != expected_sha:
        raise StoreError(
            f"{src}: sha256 {h.hexdigest()} differs from its manifest ({expected_sha}); refusing to merge it.",
            fix="validate the source store with deep=True and rebuild it",
        )
    shutil.copystat(src, dst)


def _link_or_copy(src: Path, dst: Path, expected_sha: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        _copy_verified(src, dst, expected_sha)


def merge_vin_offline_stores(
    base: str | os.PathLike[str] | StoreLocation,
    sidecar: str | os.PathLike[str] | StoreLocation,
    out: str | os.PathLike[str] | StoreLocation,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A new store at ``out`` = ``base`` + ``sidecar`` (a store of NEW trajectories from the same writer).

    Base shards keep their ids and are hard-linked (copied and verified where linking fails);
    sidecar shards are copied whole (bytes verified against the sidecar manifest) and renumbered
    after the base's. Sample index, pairs (sorted by pair_id), splits and manifest are written anew;
    the result is validated like a fresh build, then published atomically. Neither input store is
    modified. Returns the new manifest.

    Any of the three may be an object-storage URL (``storage_options`` apply to all of them): shard
    objects are then copied whole (streamed, sha256 verified), and on object storage the output is
    written in place under its prefix with ``manifest.json`` last (the commit marker).
    """
    base_l = StoreLocation.parse(base, storage_options)
    side_l = StoreLocation.parse(sidecar, storage_options)
    out_l = StoreLocation.parse(out, storage_options)
    base_p, side_p, out_p = base_l.root, side_l.root, out_l.root

    def _same(a: StoreLocation, b: StoreLocation) -> bool:
        if a.is_local and b.is_local:
            return a.root.resolve() == b.root.resolve()
        return a.url.rstrip("/") == b.url.rstrip("/")

    if _same(out_l, base_l) or _same(out_l, side_l):
        raise StoreError(
            f"merge output {out_l.url} is one of its inputs; stores are immutable.",
            fix="write the merged store to a new folder",
        )
    rb, rs = VinOfflineStoreReader(base_l), VinOfflineStoreReader(side_l)  # strict: format/version
    for loc in (base_l, side_l):
        raise_if_invalid(loc, deep=False)
    mb, ms = rb.manifest, rs.manifest
    problems: list[str] = []
    if mb["profile"].get("repo_id") != ms["profile"].get("repo_id"):
        problems.append(
            f"profile repo differs: base {mb['profile'].get('repo_id')!r}, sidecar {ms['profile'].get('repo_id')!r}"
        )
    ob, os_ = mb.get("options", {}), ms.get("options", {})
    if ob.get("include_actions") != os_.get("include_actions"):
        problems.append(
            f"include_actions differs: base {ob.get('include_actions')!r}, sidecar {os_.get('include_actions')!r}"
        )
    if mb.get("codec") != ms.get("codec"):
        problems.append("codec differs between base and sidecar")
    base_rows, side_rows = rb.sample_index, rs.sample_index
    overlap = sorted({r["sample_key"] for r in base_rows} & {r["sample_key"] for r in side_rows})
    if overlap:
        problems.append(
            f"{len(overlap)} sample keys are in both stores (a sidecar holds NEW trajectories only): "
            f"{overlap[:10]}{' ...' if len(overlap) > 10 else ''}"
        )
    pair_overlap = sorted({p["pair_id"] for p in rb.pairs()} & {p["pair_id"] for p in rs.pairs()})
    if pair_overlap:
        problems.append(f"{len(pair_overlap)} pair ids are in both stores: {pair_overlap[:10]}")
    nb = len(base_rows)
    nsh = len(mb["shards"])
    index_rows = [dict(r) for r in base_rows] + [
        {**r, "sample_index": r["sample_index"] + nb, "shard_id": r["shard_id"] + nsh} for r in side_rows
    ]
    pairs_rows = [dict(p) for p in rb.pairs()] + [
        {
            **p,
            "chosen_sample_index": p["chosen_sample_index"] + nb,
            "rejected_sample_index": p["rejected_sample_index"] + nb,
        }
        for p in rs.pairs()
    ]
    splits_by_key: dict[str, set[str]] = defaultdict(set)
    for pr in pairs_rows:
        for role in ("chosen_sample_index", "rejected_sample_index"):
            splits_by_key[index_rows[pr[role]]["sample_key"]].add(pr["split"])
    for key, sps in sorted(splits_by_key.items()):
        if len(sps) > 1:
            problems.append(f"split leakage: trajectory {key!r} is used by pairs of splits {sorted(sps)}")
    if problems:
        raise StoreInputError(
            f"cannot merge sidecar store {side_l.url} into {base_l.url}",
            problems,
            fix="build the sidecar with the same writer, profile and options, for new trajectories only",
        )
    pairs_rows.sort(key=lambda p: p["pair_id"])
    if out_l.is_local:
        _check_out_dir(out_p, problems)
    else:
        _check_remote_out(out_l, problems)
    if problems:
        raise StoreInputError(
            f"cannot write the merged store at {out_l.url}", problems, fix="choose another output folder"
        )
    if out_l.is_local:
        staging = _make_staging(out_p)
        target = StoreLocation.parse(staging)
    else:  # object storage: in place, manifest.json last
        _clear_remote(out_l)
        staging, target = out_p, out_l

    def _copy(src: StoreLocation, sp: Path, dp: Path, sha: str, link: bool) -> None:
        if src.is_local and target.is_local:
            dp.parent.mkdir(parents=True, exist_ok=True)
            (_link_or_copy if link else _copy_verified)(sp, dp, sha)
        else:
            target.copy_verified(src, sp, dp, sha)

    try:
        shard_entries: list[dict[str, Any]] = []
        jobs: list[tuple[StoreLocation, Path, Path, str, bool]] = []
        for sh in mb["shards"]:
            if target.is_local:
                (staging / sh["dir"]).mkdir(parents=True)
            for f in sh["files"]:
                jobs.append((base_l, base_p / f["path"], staging / f["path"], f["sha256"], True))
            shard_entries.append(json.loads(json.dumps(sh)))
        for sh in ms["shards"]:
            new_id = sh["id"] + nsh
            new_dir = shard_dir_name(new_id)
            entry = {**sh, "id": new_id, "dir": new_dir, "row_start": sh["row_start"] + nb, "files": []}
            for f in sh["files"]:
                rel_in = Path(f["path"]).relative_to(sh["dir"]).as_posix()
                jobs.append((side_l, side_p / f["path"], staging / new_dir / rel_in, f["sha256"], False))
                entry["files"].append({**f, "path": f"{new_dir}/{rel_in}"})
            shard_entries.append(entry)
        if target.is_local and side_l.is_local and base_l.is_local:
            for job in jobs:
                _copy(*job)
        else:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(lambda j: _copy(*j), jobs))
        inputs = dict(mb["inputs"])
        for k, v in ms["inputs"].items():
            if inputs.get(k, v) == v:
                inputs[k] = v
            else:
                inputs[f"sidecar/{k}"] = v
        manifest = _finish_manifest(
            target,
            profile=mb["profile"],
            inputs=inputs,
            options=dict(ob),
            shard_entries=shard_entries,
            index_rows=index_rows,
            pairs_rows=pairs_rows,
            local=mb.get("local") or {"profile_path": None, "data_root": None},
            extra={
                "merged_from": [
                    {
                        "role": "base",
                        "fingerprint": mb["fingerprint"],
                        "profile": mb["profile"],
                        "samples": nb,
                    },
                    {
                        "role": "sidecar",
                        "fingerprint": ms["fingerprint"],
                        "profile": ms["profile"],
                        "samples": len(side_rows),
                    },
                ]
            },
        )
        if target.is_local:
            _publish(staging, out_p)
    except BaseException:
        if target.is_local:
            shutil.rmtree(staging, ignore_errors=True)
        else:  # no manifest was written: best-effort removal of the copied objects
            with contextlib.suppress(Exception):
                _clear_remote(out_l)
        raise
    return manifest


__all__ = [
    "OFFLINE_DATASET_VERSION",
    "STORE_FORMAT",
    "PairSpec",
    "SampleSpec",
    "StoreInputError",
    "VinOfflineDataset",
    "VinOfflineStoreReader",
    "VinOfflineWriter",
    "check_free_space_for_store",
    "collect_vin_offline_dataset_stats",
    "estimate_store_bytes",
    "merge_vin_offline_stores",
    "raise_if_invalid",
    "rebuild_command",
    "remove_stale_temp_dirs",
    "stale_temp_dirs",
    "store_fingerprint",
    "validate_vin_offline_store",
]
