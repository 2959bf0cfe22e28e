"""The store format (v2): names, blocks, dtypes, codecs, the build's input records, the frames digest.

Everything another module needs to agree on to write or read a store is declared here once; the
contract is ``docs/spec/vin-store.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ProblemsError, SplitNameError, StoreError
from ..hashing import sha256_bytes
from ..layout import SPLIT_NAMES
from ..profile import DEFAULT_MAX_FRAMES as PROFILE_DEFAULT_MAX_FRAMES

if TYPE_CHECKING:  # zarr is imported when a codec is made: the names and versions here need none of it
    from zarr.codecs import BloscCodec, Crc32cCodec

OFFLINE_DATASET_VERSION: int = 2
STORE_FORMAT = "stage2-vin-offline-store"
WRITER_PACKAGE = "stage2-data"

MANIFEST_NAME = "manifest.json"
ZARR_JSON = "zarr.json"  # a Zarr v3 group's or array's metadata file
SAMPLE_INDEX_NAME = "sample_index.jsonl"
PAIRS_NAME = "pairs.jsonl"
SPLITS_DIR = "splits"
SHARDS_DIR = "shards"
SPLIT_FILES = ("all", *SPLIT_NAMES)


def check_split(split: object) -> None:
    """``split`` as a reader, a dataset and a selection take it: one of ``train``, ``val``,
    ``test``, or ``all`` / None (every split); :class:`SplitNameError` listing them otherwise."""
    if split is None or (isinstance(split, str) and split in SPLIT_FILES):
        return
    raise SplitNameError(
        f"split {split!r} is not a split of a store; the splits are: {', '.join(SPLIT_NAMES)} "
        "(or 'all' / None: every split).",
        fix=f"pass split= one of {', '.join(map(repr, SPLIT_NAMES))}, or None",
    )


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
CHECKSUM_DESC = "crc32c of every compressed inner chunk (appended to it) and of every shard index"
MAX_ACTION_WIDTH = int(np.iinfo(np.int16).max)
#: the frame bound of a build when none is given: the profile's default ``max_frames``
#: (docs/spec/profile.md; upstream's current preprocessing keeps at most 32 frames, older sets 64)
DEFAULT_MAX_FRAMES = PROFILE_DEFAULT_MAX_FRAMES
#: padding bound of a shard (the shard plan, validation): its Tmax exceeds no row's ``num_frames`` by
#: more than ``max(PAD_SLACK_FRAMES, num_frames // PAD_SLACK_DIVISOR)`` of its shortest row
PAD_SLACK_FRAMES = 8
PAD_SLACK_DIVISOR = 4

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
#: manifest keys left out of the fingerprint: time, the fingerprint itself, this machine's paths, and
#: how the store came to be (a merge's inputs, an extension's base): the fingerprint names content,
#: so a store merged from parts and one built in one piece that hold the same content share it.
FINGERPRINT_EXCLUDED = ("created_at", "fingerprint", "local", "merged_from", "extended_from")

#: How rows are ordered and cut into shards (:mod:`.plan`): part of a store folder's name, so a store
#: laid out by another rule is never taken for this one's.
SHARD_LAYOUT = "cache_key/resolution/length"


class StoreInputError(ProblemsError, StoreError):
    """The inputs of a store build (samples, pairs, frame files, sidecars) have problems."""


class StoreChecksumError(StoreError):
    """Stored bytes fail their crc32c (a flipped bit, a damaged copy): the message names the store,
    the shard, the array and the sample."""


def pad_slack(shortest: int) -> int:
    """How far a shard's Tmax may exceed its shortest row's ``num_frames`` (the padding bound)."""
    return max(PAD_SLACK_FRAMES, shortest // PAD_SLACK_DIVISOR)


# ----- the inputs of a build ----------------------------------------------------------------------
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
    num_frames: int | None = None  # T as the processed_dataset row declares it: must equal the file's
    # the frames file's sha256 as its extraction record holds it: the writer hashes the bytes it
    # decodes and refuses others (an edit after the record was checked, however quick)
    frames_file_sha256: str | None = None
    # the sidecar file's sha256 as the unpack's index holds it: hashed as read, likewise
    sidecar_file_sha256: str | None = None


@dataclass(frozen=True)
class PairSpec:
    pair_id: str
    split: str
    task: str
    chosen_key: str
    rejected_key: str


# ----- layout, blocks, codecs ---------------------------------------------------------------------
def shard_dir_name(shard_id: int) -> str:
    return f"{SHARDS_DIR}/shard-{shard_id:06d}"


def compressor(dtype: np.dtype[Any]) -> BloscCodec:
    """LZ4 (fast to decode, so a read is bound by memory, not by the codec). Frames get no shuffle
    at all: on camera-like uint8 frames bitshuffle saves few bytes for several times the encode and
    decode time, and byte shuffle is a no-op on 1-byte items; the numeric blocks get byte shuffle."""
    from zarr.codecs import BloscCodec

    return BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle" if dtype.itemsize == 1 else "shuffle")


def compressors(dtype: np.dtype[Any]) -> tuple[BloscCodec, Crc32cCodec]:
    """The bytes-to-bytes codecs of every inner chunk: Blosc (:func:`compressor`), then crc32c of the
    compressed bytes, so a chunk is verified before it is decompressed (and without decompressing)."""
    from zarr.codecs import Crc32cCodec

    return compressor(dtype), Crc32cCodec()


def codec_record() -> dict[str, Any]:
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
        "checksum": CHECKSUM_DESC,
        "write_empty_chunks": True,
        "consolidated_metadata": False,
    }


def block_of(rel_in_shard: Sequence[str]) -> str:
    """Which block a file of a shard folder belongs to (parts relative to the shard folder)."""
    if len(rel_in_shard) >= 2 and rel_in_shard[0] == "actions" and rel_in_shard[1] in ("aligned", "width"):
        return f"actions/{rel_in_shard[1]}"
    if len(rel_in_shard) >= 2 and rel_in_shard[0] in (BLOCK_FRAMES, BLOCK_NUM_FRAMES):
        return rel_in_shard[0]
    return "group_metadata"


def blocks_record(materialized_actions: bool) -> list[dict[str, Any]]:
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


def frames_sha256(frames: np.ndarray[Any, Any]) -> str:
    """A sample's ``frames_sha256``: sha256 of its ``num_frames`` frames as C-contiguous uint8
    (T, H, W, 3) bytes, padding excluded. The writer records it; validation and readers recompute it."""
    return sha256_bytes(np.ascontiguousarray(frames, dtype=np.uint8).data)
