"""What one action sidecar ``.npz`` says, read without unpickling anything: its keys, shapes,
widths and metadata (``.npy`` headers), its sha256 and its data's sanity
(:mod:`.sidecar_data`), from its bytes or its file; the unpack's record of every sidecar it wrote
(:data:`SIDECAR_INDEX`), which the join uses for files still as written; and the standalone re-check
of every unpacked sidecar.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import zipfile
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .. import layout
from ..formats import FormatError, npz
from ..formats.sha256sums import read_regular_bytes
from ..hashing import sha256_file
from ..publish import atomic_write_bytes
from .listing import sidecar_dirs
from .sidecar_data import DATA_KEYS, check_sidecar_arrays

__all__ = [
    "SIDECAR_INDEX",
    "SIDECAR_KEYS",
    "SIDECAR_MARKER",
    "SidecarDataCheck",
    "check_sidecars_on_disk",
    "recorded_sidecars",
    "sidecar_infos",
]

SIDECAR_KEYS = ("metadata_json", "raw_actions", "aligned_actions", "source_indices", "alignment_indices")
#: what the unpack read in each sidecar it wrote (keyed by path under derived/, with the file's
#: sha256 and stats then: inode, size, mtime_ns, ctime_ns), so the join need not read 20k files
#: again (:func:`recorded_sidecars`), and an edited sidecar is found (``sidecars.sidecars_status``)
SIDECAR_INDEX = ".sidecars.index.json"
SIDECAR_READ_LIMIT = 64 * 1024 * 1024
#: the unpack's marker (kit/sidecars.py writes it): the tar it unpacked; an index is used only when
#: it carries the same tar sha256
SIDECAR_MARKER = ".sidecars.json"


# ----------------------------------------------------------------------------------------------
# One sidecar npz (never unpickles)
# ----------------------------------------------------------------------------------------------
_READ_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, zipfile.BadZipFile, zlib.error)


@dataclass
class _SidecarInfo:
    sha256: str | None = None
    bytes: int | None = None
    raw_width: int | None = None
    metadata_raw_width: int | None = None
    aligned_length: int | None = None
    aligned_width: int | None = None
    problems: list[str] = field(default_factory=list)


def _read_sidecar(path: str | Path, want_sha: bool) -> _SidecarInfo:
    """Widths and lengths of a sidecar from its ``.npy`` headers (+ the small metadata_json).

    A lean reader of the npz (zip) container: only headers are parsed, ``metadata_json`` is read
    with ``np.frombuffer`` after its dtype is checked; an object (pickled) array is a problem and is
    never unpickled."""
    label = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(SIDECAR_READ_LIMIT + 1)
            if len(data) > SIDECAR_READ_LIMIT:
                info = _SidecarInfo(bytes=os.fstat(f.fileno()).st_size)
                if want_sha:
                    info.sha256 = sha256_file(path)
                info.problems.append(
                    f"{label}: {info.bytes} bytes, too large for an action sidecar; not read"
                )
                return info
    except OSError as e:
        return _SidecarInfo(problems=[f"{label}: unreadable sidecar npz ({type(e).__name__}: {e})"])
    return _parse_sidecar(data, label, want_sha)


def _parse_sidecar(data: bytes, label: str, want_sha: bool) -> _SidecarInfo:
    """:func:`_read_sidecar` of a sidecar's bytes (``label`` names it in problems)."""
    info = _SidecarInfo()
    try:
        info.bytes = len(data)
        if want_sha:
            info.sha256 = hashlib.sha256(data).hexdigest()
        members = npz.npz_members(data)
        headers: dict[str, npz.NpyHeader] = {}
        bodies: dict[str, np.ndarray[Any, Any] | None] = {}  # data keys: inflated once, whole
        meta_body: bytes | None = None  # metadata_json's bytes, when they inflate and parse whole
        for key, zi in members.items():
            if not zi.name.endswith(".npy"):
                continue
            if key == "metadata_json" and zi.usize <= SIDECAR_READ_LIMIT:
                try:  # one inflate for header and value; anything odd: the header alone, as ever
                    meta_body = npz.member_bytes(data, zi, file=label)
                    headers[key] = npz.parse_npy_header(meta_body, file=label, member=zi.name)
                    continue
                except _READ_ERRORS:
                    meta_body = None
            try:
                if key in DATA_KEYS and zi.usize <= SIDECAR_READ_LIMIT:
                    headers[key], bodies[key] = npz.member_npy(data, zi, file=label)
                else:
                    headers[key] = npz.member_header(data, zi)
            except _READ_ERRORS as e:
                why = e.detail if isinstance(e, FormatError) else e  # the member is named already
                info.problems.append(
                    f"{label}: member {zi.name}: unreadable .npy ({type(e).__name__}: {why})"
                )
        objects = [k for k, (_, dt, _) in headers.items() if dt.hasobject]
        if objects:
            info.problems.append(
                f"{label}: key(s) {', '.join(objects)} hold object (pickled) arrays; refused, not unpickled"
            )
            return info
        missing = [k for k in SIDECAR_KEYS if k not in members]
        if missing:
            info.problems.append(f"{label}: missing key(s) {', '.join(missing)}")
        raw = headers.get("raw_actions")
        if raw is not None:
            if len(raw[0]) == 2:
                info.raw_width = raw[0][1]
            else:
                info.problems.append(f"{label}: raw_actions has shape {raw[0]}, expected (N, W)")
        aligned = headers.get("aligned_actions")
        if aligned is not None:
            if len(aligned[0]) == 2:
                info.aligned_length, info.aligned_width = aligned[0]
            else:
                info.problems.append(f"{label}: aligned_actions has shape {aligned[0]}, expected (T, W)")
        if "metadata_json" in headers:
            shape, dtype, offset = headers["metadata_json"]
            meta = None
            if dtype.kind not in "US" or shape not in ((), (1,)):
                info.problems.append(f"{label}: metadata_json is {dtype} {shape}, expected a 0-d string")
            else:
                body = (
                    meta_body if meta_body is not None else npz.member_bytes(data, members["metadata_json"])
                )
                value = np.frombuffer(body, dtype=dtype, count=1, offset=offset)[0]
                text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
                try:
                    meta = json.loads(text)
                except ValueError as e:
                    info.problems.append(f"{label}: metadata_json is not JSON ({e})")
            if isinstance(meta, dict):
                rw = meta.get("raw_width")
                if isinstance(rw, int) and not isinstance(rw, bool):
                    info.metadata_raw_width = rw
                else:
                    info.problems.append(f"{label}: metadata_json has no integer raw_width")
            elif meta is not None:
                info.problems.append(f"{label}: metadata_json is not a JSON object")
        arrays: dict[str, np.ndarray[Any, Any]] = {}
        for k in DATA_KEYS:
            if k not in headers:
                continue
            shape, dtype, offset = headers[k]
            need = offset + math.prod(shape) * dtype.itemsize  # Python ints: no overflow
            if need != members[k].usize or need > SIDECAR_READ_LIMIT:
                info.problems.append(
                    f"{label}: member {members[k].name}: its shape {shape} needs {need} bytes, it holds "
                    f"{members[k].usize}{' (too large for an action sidecar)' if need > SIDECAR_READ_LIMIT else ''}"
                )
                continue
            whole = bodies.get(k)
            arrays[k] = whole if whole is not None else npz.member_array(data, members[k], file=label)
        check_sidecar_arrays(label, arrays, info.problems)
    except (
        OSError,
        ValueError,
        SyntaxError,
        TypeError,
        MemoryError,
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
    ) as e:
        info.problems.append(f"{label}: unreadable sidecar npz ({type(e).__name__}: {e})")
    return info


def _record(
    index: dict[str, dict[str, Any]], rel: str, st: os.stat_result, sha256: str, i: _SidecarInfo | None
) -> None:
    """The index entry of a sidecar the unpack wrote (``st``: the file's stat once written, mode
    set; ``sha256``: of the bytes written); msgspec encodes the facts (a dataclass) as the object of
    its fields. ``i`` is None for a sidecar the unpack did not parse (too large: read again)."""
    entry: dict[str, Any] = {
        "sha256": sha256,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }
    if i is not None:
        entry["info"] = i
    index[rel] = entry


def entry_stats(entry: dict[str, Any]) -> tuple[int, int, int, int] | None:
    """(inode, size, mtime_ns, ctime_ns) an index entry recorded (None: an index of another form)."""
    try:
        return int(entry["ino"]), int(entry["size"]), int(entry["mtime_ns"]), int(entry["ctime_ns"])
    except (KeyError, TypeError, ValueError):
        return None


def _write_index(path: Path, tar_sha256: str, index: dict[str, dict[str, Any]]) -> None:
    """:data:`SIDECAR_INDEX`: ``{"tar_sha256": ..., "files": {rel: {"sha256", "ino", "size",
    "mtime_ns", "ctime_ns", "info"}}}`` as compact JSON with sorted keys."""
    doc = {"tar_sha256": tar_sha256, "files": index}
    atomic_write_bytes(path, msgspec.json.encode(doc, order="sorted") + b"\n")


def recorded_sidecars(derived: Path) -> dict[str, dict[str, Any]]:
    """What the last unpack read in each sidecar it wrote, by path under ``derived/`` (with the
    file's size and mtime then), when the index belongs to the unpack the marker records; else {}."""
    try:
        # (never a read that blocks: a FIFO there is no record)
        marker = json.loads(read_regular_bytes(derived / SIDECAR_MARKER).decode("utf-8"))
        doc = msgspec.json.decode(read_regular_bytes(derived / SIDECAR_INDEX))
    except (OSError, ValueError, msgspec.DecodeError):
        return {}
    if not (isinstance(marker, dict) and isinstance(doc, dict) and isinstance(doc.get("files"), dict)):
        return {}
    if doc.get("tar_sha256") != marker.get("tar_sha256"):
        return {}
    # an entry that is not an object (a damaged index) counts as not recorded: that sidecar is read again
    return {str(k): v for k, v in doc["files"].items() if isinstance(v, dict)}


def sidecar_infos(
    derived: Path, rels: Sequence[str], want_sha: bool, workers: int | None = None
) -> list[_SidecarInfo]:
    """The facts of the sidecars ``rels`` (paths under ``derived/``): from the unpack's index for a
    file whose inode, size, mtime and ctime are still what the unpack wrote (the unpack parsed those
    very bytes), read again for any other."""
    recorded = recorded_sidecars(derived)
    out: list[_SidecarInfo | None] = []
    again: list[tuple[int, str]] = []
    for rel in rels:
        rec = recorded.get(rel)
        path = f"{derived}/{rel}"
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if (
            rec is not None
            and st is not None
            and "info" in rec
            and (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == entry_stats(rec)
        ):
            try:
                out.append(_SidecarInfo(**rec["info"]))
                continue
            except TypeError:  # an index of another version: read the file
                pass
        again.append((len(out), path))
        out.append(None)
    for (i, _), info in zip(again, _read_sidecars([p for _, p in again], want_sha, workers), strict=True):
        out[i] = info
    return [o if o is not None else _SidecarInfo() for o in out]


@dataclass
class SidecarDataCheck:
    """The standalone re-check of the unpacked sidecars (``check_sidecars_on_disk``)."""

    files: int
    problems: list[str]
    seconds: float


def check_sidecars_on_disk(data_root: Path, *, workers: int | None = None) -> SidecarDataCheck:
    """Every unpacked sidecar under ``derived/action_sidecars/`` read again: its keys, shapes and
    metadata, and its data (:func:`.sidecar_data.check_sidecar_arrays`). Reads only."""
    t0 = time.perf_counter()
    derived = layout.derived_root(Path(data_root))
    base = derived / layout.SIDECARS_DIR
    paths = [
        str(base / source / name)
        for source, names in sorted(sidecar_dirs(derived).items())
        for name in sorted(names)
        if name.endswith(".npz")
    ]
    infos = _read_sidecars(paths, False, workers)
    problems = [p for info in infos for p in info.problems]
    return SidecarDataCheck(len(paths), problems, time.perf_counter() - t0)


def _read_sidecars(paths: Sequence[str], want_sha: bool, workers: int | None) -> list[_SidecarInfo]:
    """Read many sidecars; a couple of threads overlap the file I/O (the parsing holds the GIL)."""
    n = workers or min(2, os.cpu_count() or 1)
    if n <= 1 or len(paths) < 1024:
        return [_read_sidecar(p, want_sha) for p in paths]
    size = 512
    chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        parts = pool.map(lambda c: [_read_sidecar(p, want_sha) for p in c], chunks)
        return [info for part in parts for info in part]
