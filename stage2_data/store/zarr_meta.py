"""The ``zarr.json`` documents of a shard group, made without zarr's store machinery.

zarr's ``create_array`` on a local store goes through its async store layer (an event loop round
trip per file), and a store has hundreds of small arrays: together they cost more than compressing
the arrays' data.
A shard group's documents differ only in a few shapes, so each kind of array (dtype, fill value,
codecs, rank) is made ONCE by zarr itself, in memory (:class:`zarr.storage.MemoryStore`), and that
document is reused with its shapes replaced: ``shape``, the regular chunk grid's ``chunk_shape``
(one shard: the whole array) and the sharding codec's inner ``chunk_shape``. Nothing else in the
document depends on the shape (tests/test_store_meta.py compares every byte with what zarr writes
for many shapes, dtypes and fill values).

The bytes are the canonical form of :func:`.determinism.canonical_zarr_json` (``json.dumps`` with
``indent=2``), whatever zarr's process-wide JSON indent is.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import numpy as np
import zarr
from zarr.storage import MemoryStore

from .format import compressors


def canonical_json(doc: dict[str, Any]) -> bytes:
    """The one byte form of a ``zarr.json`` document in a store (zarr's default: indent 2)."""
    return json.dumps(doc, indent=2, allow_nan=True).encode()


def create_layout_array(
    store: Any, shape: tuple[int, ...], inner: tuple[int, ...], dtype: Any, fill: Any, name: str | None = None
) -> Any:
    """A zarr array of a shard group created by zarr itself: one shard (the whole ``shape``), inner
    chunks ``inner``, the store's codecs for ``dtype``, every chunk written."""
    return zarr.create_array(
        store=store,
        name=name,
        shape=shape,
        chunks=inner,
        shards=shape,
        dtype=np.dtype(dtype),
        compressors=compressors(np.dtype(dtype)),
        fill_value=fill,
        config={"write_empty_chunks": True},
        zarr_format=3,
    )


@functools.lru_cache(maxsize=1)
def group_zarr_json() -> bytes:
    """The ``zarr.json`` of an empty group (a shard folder, its ``actions`` group), made by zarr."""
    stored: dict[str, Any] = {}
    zarr.open_group(store=MemoryStore(stored), mode="w", zarr_format=3)
    return canonical_json(json.loads(stored["zarr.json"].to_bytes()))


@functools.lru_cache(maxsize=64)
def _template(dtype: str, fill_key: Any, ndim: int) -> tuple[dict[str, Any], Any]:
    """zarr's own document (and array) for an array of this kind, at a placeholder shape."""
    fill = float("nan") if fill_key == "nan" else fill_key
    shape = (2,) + (3,) * (ndim - 1)
    stored: dict[str, Any] = {}
    arr = create_layout_array(MemoryStore(stored), shape, (1, *shape[1:]), dtype, fill)
    return json.loads(stored["zarr.json"].to_bytes()), arr


def _fill_key(fill: Any) -> Any:
    """A cache key for a fill value (NaN is not equal to itself)."""
    return "nan" if isinstance(fill, float) and fill != fill else fill


@functools.lru_cache(maxsize=512)
def _array_doc(
    dtype: str, fill_key: Any, shape: tuple[int, ...], inner: tuple[int, ...]
) -> tuple[bytes, Any]:
    doc, arr = _template(dtype, fill_key, len(shape))
    doc = copy.deepcopy(doc)
    doc["shape"] = list(shape)
    doc["chunk_grid"]["configuration"]["chunk_shape"] = list(shape)
    (sharding,) = doc["codecs"]
    sharding["configuration"]["chunk_shape"] = list(inner)
    return canonical_json(doc), arr


def array_zarr_json(
    shape: tuple[int, ...], inner: tuple[int, ...], dtype: np.dtype[Any], fill: Any
) -> tuple[bytes, Any]:
    """The ``zarr.json`` of one array of a shard group (one shard: the whole ``shape``; inner chunks
    ``inner``; the store's codecs for ``dtype``), and zarr's array of the same kind (at a placeholder
    shape: its codecs and chunk key encoding, for :func:`.shard_io.shard_layout`)."""
    return _array_doc(
        np.dtype(dtype).str, _fill_key(fill), tuple(int(x) for x in shape), tuple(int(x) for x in inner)
    )
