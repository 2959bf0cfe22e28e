"""The store's small files: ``sample_index.jsonl``, ``pairs.jsonl`` and ``splits/*.npy``, written and
read back; each written file is recorded with its bytes and sha256 for the manifest.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StoreError
from ..formats.jsonl import iter_json_lines, jsonl_bytes
from ..formats.npz import npy_bytes
from ..hashing import sha256_bytes
from ..storage import StoreLocation
from .format import PAIRS_NAME, SAMPLE_INDEX_NAME, SPLIT_FILES, SPLIT_NAMES, SPLITS_DIR


def write_file(loc: StoreLocation, rel: str, data: bytes) -> dict[str, Any]:
    """Write ``loc.root / rel`` (one PUT on object storage) and record its bytes and sha256."""
    loc.write_bytes(loc.root / rel, data)
    return {"path": rel, "bytes": len(data), "sha256": sha256_bytes(data)}


def read_jsonl(loc: StoreLocation, path: Path) -> list[dict[str, Any]]:
    """Every row of a JSONL file of the store (blank lines skipped); a line that is not a JSON
    object is a StoreError naming the file and line."""
    rows: list[dict[str, Any]] = []
    where = loc.display(path)
    for jl in iter_json_lines(loc.read_bytes(path)):
        if not jl.ok:
            raise StoreError(f"{where}:{jl.line}: not valid JSON ({jl.error}).")
        if not jl.is_object:
            raise StoreError(f"{where}:{jl.line}: not a JSON object.")
        rows.append(jl.value)
    return rows


def read_npy(loc: StoreLocation, p: Path) -> np.ndarray[Any, Any]:
    """One ``.npy`` file (a split), objects refused."""
    arr: np.ndarray[Any, Any] = np.load(io.BytesIO(loc.read_bytes(p)), allow_pickle=False)
    return arr


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
