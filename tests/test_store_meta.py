"""The shard groups' ``zarr.json`` documents made without zarr's store (stage2_data/store/zarr_meta.py)
are byte for byte what zarr itself writes (in the store's canonical form), for every kind of array a
shard holds and many shapes; and a shard group written this way reads back through zarr."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore

from stage2_data.store.format import compressors
from stage2_data.store.shard_io import write_shard_group
from stage2_data.store.zarr_meta import array_zarr_json, canonical_json, group_zarr_json

KINDS = [  # (dtype, fill value, inner chunk of a row) as the writer uses them
    (np.uint8, 0, lambda s: (1, *s[1:])),
    (np.float32, float("nan"), lambda s: (1, *s[1:])),
    (np.int32, 0, lambda s: s),
    (np.int16, 0, lambda s: s),
]
SHAPES = [
    (64, 1, 26, 26, 3),
    (3, 40, 96, 128, 3),
    (1, 7, 5, 4, 3),
    (64, 12, 9),
    (5, 1, 2),
    (64,),
    (1,),
    (17,),
]


def _zarr_doc(tmp: Path, shape, inner, dtype, fill) -> bytes:
    arr = zarr.create_array(
        store=LocalStore(tmp),
        name="a",
        shape=shape,
        chunks=inner,
        shards=shape,
        dtype=dtype,
        compressors=compressors(np.dtype(dtype)),
        fill_value=fill,
        config={"write_empty_chunks": True},
        zarr_format=3,
    )
    assert arr.shape == shape
    return canonical_json(json.loads((tmp / "a" / "zarr.json").read_bytes()))


CASES = [  # 1-D arrays are one chunk; the others one row a chunk
    (kind, shape)
    for kind, (_, _, inner_of) in enumerate(KINDS)
    for shape in SHAPES
    if (len(shape) == 1) == (inner_of(shape) == shape)
]


@pytest.mark.parametrize(("kind", "shape"), CASES, ids=str)
def test_array_documents_equal_zarrs_own(tmp_path: Path, kind: int, shape: tuple[int, ...]) -> None:
    dtype, fill, inner_of = KINDS[kind]
    inner = inner_of(shape)
    ours, _ = array_zarr_json(shape, inner, np.dtype(dtype), fill)
    assert ours == _zarr_doc(tmp_path, shape, inner, dtype, fill)


def test_group_document_equals_zarrs_own(tmp_path: Path) -> None:
    zarr.open_group(store=LocalStore(tmp_path), mode="w", zarr_format=3).create_group("actions")
    for p in (tmp_path / "zarr.json", tmp_path / "actions" / "zarr.json"):
        assert group_zarr_json() == canonical_json(json.loads(p.read_bytes()))


def test_documents_ignore_zarrs_json_indent(tmp_path: Path) -> None:
    before, _ = array_zarr_json((9, 4, 3), (1, 4, 3), np.dtype(np.float32), float("nan"))
    with zarr.config.set({"json_indent": 7}):
        from stage2_data.store import zarr_meta

        zarr_meta._template.cache_clear()
        zarr_meta._array_doc.cache_clear()
        after, _ = array_zarr_json((9, 4, 3), (1, 4, 3), np.dtype(np.float32), float("nan"))
    assert after == before


def test_a_shard_group_written_directly_reads_back_through_zarr(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 255, (4, 3, 6, 5, 3), dtype=np.uint8)
    num_frames = np.array([3, 1, 2, 3], dtype=np.int32)
    widths = np.array([7, 0, 8, 7], dtype=np.int16)
    actions = np.full((4, 3, 8), np.nan, dtype=np.float32)
    actions[0, :3, :7] = rng.random((3, 7))
    names, hashes = write_shard_group(tmp_path / "s", frames, num_frames, widths, actions)
    files = sorted(str(p) for p in (tmp_path / "s").rglob("*") if p.is_file())
    assert sorted(hashes) == files  # every file written here, and hashed as written
    g = zarr.open_group(store=LocalStore(tmp_path / "s"), mode="r", zarr_format=3)
    np.testing.assert_array_equal(g["frames"][...], frames)
    np.testing.assert_array_equal(g["num_frames"][...], num_frames)
    np.testing.assert_array_equal(g["actions/width"][...], widths)
    np.testing.assert_array_equal(g["actions/aligned"][...], actions)
    assert names == sorted(["frames", "num_frames", "actions/width", "actions/aligned"])
