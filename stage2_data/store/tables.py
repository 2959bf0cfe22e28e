"""The store's small files: ``sample_index.jsonl``, ``pairs.jsonl`` and ``splits/*.npy``, written and
read back; each written file is recorded with its bytes and sha256 for the manifest, and a reader
reads each one whole and checks it against that sha256 before using any of it (a same-length edit,
e.g. a label or a pair's sides swapped, has no crc32c of its own to fail).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import FileSystemError, StoreError, StoreValidationError
from ..formats.jsonl import iter_json_lines, jsonl_bytes
from ..formats.npz import npy_bytes
from ..formats.sha256sums import read_regular_bytes
from ..hashing import sha256_bytes
from ..storage import StoreLocation
from .format import (
    MANIFEST_NAME,
    PAIRS_NAME,
    SAMPLE_INDEX_NAME,
    SPLIT_FILES,
    SPLIT_NAMES,
    SPLITS_DIR,
    StoreChecksumError,
)
from .manifest import rebuild_command
from .manifest_shape import is_file_entry


def write_file(loc: StoreLocation, rel: str, data: bytes) -> dict[str, Any]:
    """Write ``loc.root / rel`` (one PUT on object storage) and record its bytes and sha256."""
    loc.write_bytes(loc.root / rel, data)
    return {"path": rel, "bytes": len(data), "sha256": sha256_bytes(data)}


def listed_sha256(loc: StoreLocation, manifest: dict[str, Any], rel: str, files: Any = None) -> str:
    """The sha256 the manifest lists for the store's file ``rel`` (relative to the store): in
    ``files`` (a shard entry's ``files``) or, by default, the manifest's top-level ``files``;
    StoreValidationError (with the rebuild command) when it is not listed once with its sha256."""
    files = manifest.get("files") if files is None else files
    listed = (
        [f for f in files if isinstance(f, dict) and f.get("path") == rel] if isinstance(files, list) else []
    )
    if len(listed) != 1 or not is_file_entry(listed[0]):
        raise StoreValidationError(
            f"VIN offline store {loc.url} has a damaged manifest",
            [f"{loc.display(loc.root / MANIFEST_NAME)}: file {rel} is not listed with its sha256"],
            fix=f"rebuild it: {rebuild_command(loc, manifest)}",
        )
    return str(listed[0]["sha256"])


def check_sha256(loc: StoreLocation, manifest: dict[str, Any], rel: str, data: bytes, want: str) -> None:
    """StoreChecksumError naming the store's file ``rel`` (and the rebuild command) when the sha256
    of ``data``, the bytes read from it, is not ``want`` (the manifest's)."""
    got = sha256_bytes(data)
    if got != want:
        raise StoreChecksumError(
            f"VIN offline store {loc.url}: {loc.display(loc.root / rel)}: sha256 {got}; the manifest says "
            f"{want} (the file changed after the store was written)",
            fix=f"the store is damaged; rebuild it: {rebuild_command(loc, manifest)}",
        )


def read_store_file(loc: StoreLocation, manifest: dict[str, Any], rel: str) -> bytes | None:
    """The bytes of the store's file ``rel`` (relative path), or None when nothing is there. On a
    local disk only a regular file is read (a link to one is followed), and nothing blocks
    (:func:`~stage2_data.formats.sha256sums.read_regular_bytes`: stat'ed before it is opened, opened
    with ``O_NONBLOCK``): a FIFO, a device, a socket or a folder there is a StoreChecksumError naming
    the file and what it is (with the rebuild command), nothing read from it."""
    p = loc.root / rel
    try:
        return read_regular_bytes(p) if loc.is_local else loc.read_bytes(p)
    except (FileNotFoundError, NotADirectoryError):  # (a file where one of its folders should be)
        return None
    except FileSystemError as e:  # a FIFO, device, socket or folder: never opened
        raise StoreChecksumError(
            f"VIN offline store {loc.url}: {e.message.rstrip('.')} (a store holds only regular files "
            "and folders)",
            fix=f"the store is damaged; rebuild it: {rebuild_command(loc, manifest)}",
        ) from None


def read_checked(loc: StoreLocation, manifest: dict[str, Any], rel: str) -> bytes:
    """The bytes of the store's file ``rel`` (relative path), read whole and checked against the
    sha256 the manifest lists for it: StoreChecksumError naming the file when they differ,
    StoreValidationError when the manifest lists no sha256 for it, StoreChecksumError too when the
    file is missing or is not a regular file (:func:`read_store_file`: a FIFO is never waited on),
    each with the rebuild command."""
    want = listed_sha256(loc, manifest, rel)
    data = read_store_file(loc, manifest, rel)
    if data is None:
        raise StoreChecksumError(
            f"VIN offline store {loc.url}: {loc.display(loc.root / rel)}: missing; the manifest lists it "
            f"(sha256 {want}): the store is incomplete",
            fix=f"the store is damaged; rebuild it: {rebuild_command(loc, manifest)}",
        )
    check_sha256(loc, manifest, rel, data, want)
    return data


def parse_jsonl(where: str, data: bytes) -> list[dict[str, Any]]:
    """Every row of the JSONL bytes of the store's file ``where`` (blank lines skipped); a line that
    is not a JSON object is a StoreError naming the file and line."""
    rows: list[dict[str, Any]] = []
    for jl in iter_json_lines(data):
        if not jl.ok:
            raise StoreError(f"{where}:{jl.line}: not valid JSON ({jl.error}).")
        if not jl.is_object:
            raise StoreError(f"{where}:{jl.line}: not a JSON object.")
        rows.append(jl.value)
    return rows


def read_jsonl(loc: StoreLocation, manifest: dict[str, Any], rel: str) -> list[dict[str, Any]]:
    """Every row of the store's JSONL file ``rel``, its sha256 checked first (:func:`read_checked`)."""
    return parse_jsonl(loc.display(loc.root / rel), read_checked(loc, manifest, rel))


def npy_from_bytes(data: bytes) -> np.ndarray[Any, Any]:
    """The array of one ``.npy`` file's bytes (a split), objects refused."""
    arr: np.ndarray[Any, Any] = np.load(io.BytesIO(data), allow_pickle=False)
    return arr


def read_npy(loc: StoreLocation, manifest: dict[str, Any], rel: str) -> np.ndarray[Any, Any]:
    """The store's ``.npy`` file ``rel`` (a split), its sha256 checked first (:func:`read_checked`)."""
    return npy_from_bytes(read_checked(loc, manifest, rel))


def write_metadata_files(
    root: StoreLocation, index_rows: Sequence[dict[str, Any]], pairs_rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    files = [
        write_file(root, SAMPLE_INDEX_NAME, jsonl_bytes(index_rows)),
        write_file(root, PAIRS_NAME, jsonl_bytes(pairs_rows)),
    ]
    n = len(index_rows)
    splits = {"all": np.arange(n, dtype=np.int64)}
    for sp in SPLIT_NAMES:
        splits[sp] = np.array([r["sample_index"] for r in index_rows if r["split"] == sp], dtype=np.int64)
    for name in SPLIT_FILES:
        files.append(write_file(root, f"{SPLITS_DIR}/{name}.npy", npy_bytes(np.sort(splits[name]))))
    return files
