"""The immutable VIN offline store (format v2): writer, strict reader, dataset, validation, stats, merge.

The contract is ``docs/spec/vin-store.md``. In short::

    <store>/
      manifest.json            written LAST, atomically: its presence means "complete"
      sample_index.jsonl       one row per sample, in sample_index order
      pairs.jsonl              one row per pair, pointing at sample indices (sorted by pair_id)
      splits/{all,train,val,test}.npy   int64, sorted
      shards/shard-000000/     a Zarr v3 group per shard: frames, num_frames, actions/aligned, actions/width

Modules, in the order a build uses them:

* :mod:`.format` - names, blocks, dtypes, codecs, :class:`SampleSpec` / :class:`PairSpec`;
* :mod:`.inputs` - the frame files and sidecars, inspected from their ``.npy`` headers;
* :mod:`.plan` - dedupe, splits (leakage is an error), row order, shards, size estimate;
* :mod:`.shard_io` - one shard's Zarr group, and "our shard layout" written and read directly;
* :mod:`.tables` - ``sample_index.jsonl``, ``pairs.jsonl``, ``splits/*.npy``;
* :mod:`.manifest` - the one loader of ``manifest.json``, the strict version check, the fingerprint;
* :mod:`.commit` - metadata files and manifest, checked, ``manifest.json`` last;
* :mod:`.target` - what may be replaced, and the staging folders killed builds left;
* :mod:`.writer` (:class:`VinOfflineWriter`), :mod:`.reader` (:class:`VinOfflineStoreReader`),
  :mod:`.dataset` (:class:`VinOfflineDataset`), :mod:`.validate` / :mod:`.validate_shards`,
  :mod:`.stats`, :mod:`.merge`.

Design choices recorded in the manifest where they matter:

* Padding is told from data by separate lengths, never by value: a row's frames and actions are
  valid up to its ``num_frames`` (and its actions up to ``actions/width``); past them frames are 0
  and actions NaN. Inside them actions are always finite (the writer refuses NaN and inf, and
  ``validate --decode`` checks it), so a NaN is never data.
* Every stored chunk carries its crc32c (after Blosc); every read checks it
  (:class:`StoreChecksumError` names the store, shard, array and sample).
* ``actions/width`` (int16) is always present (0 where a trajectory has no sidecar, or when the
  store is built with ``include_actions=False``). ``actions/aligned`` is optional: present in a shard
  only when at least one of its rows has actions (``action_width_max > 0`` in the shard entry); the
  block is ``materialized`` when any shard holds it.
* Machine-dependent facts (the profile path and the data root, used by :func:`rebuild_command`) live
  under ``manifest["local"]``, which the fingerprint excludes together with ``created_at`` and
  ``fingerprint``.
"""

from __future__ import annotations

from .dataset import VinOfflineDataset
from .format import (
    BLOCK_ACTIONS,
    BLOCK_DTYPES,
    BLOCK_FRAMES,
    BLOCK_NAMES,
    BLOCK_NUM_FRAMES,
    BLOCK_ROW_SHAPES,
    BLOCK_WIDTH,
    CHECKSUM_DESC,
    COMPRESSOR_DESC,
    DEFAULT_MAX_FRAMES,
    FINGERPRINT_EXCLUDED,
    MANIFEST_NAME,
    MANIFEST_TYPES,
    MAX_ACTION_WIDTH,
    OFFLINE_DATASET_VERSION,
    OPTIONAL_BLOCKS,
    PAIR_FIELDS,
    PAIRS_NAME,
    SAMPLE_INDEX_FIELDS,
    SAMPLE_INDEX_NAME,
    SHARDS_DIR,
    SPLIT_FILES,
    SPLIT_NAMES,
    SPLITS_DIR,
    STORE_FORMAT,
    WRITER_PACKAGE,
    PairSpec,
    SampleSpec,
    StoreChecksumError,
    StoreInputError,
    frames_sha256,
    pad_slack,
    shard_dir_name,
)
from .manifest import rebuild_command, store_fingerprint
from .merge import merge_vin_offline_stores
from .plan import check_free_space_for_store, estimate_store_bytes
from .reader import ReaderClosedError, VinOfflineStoreReader
from .stats import collect_vin_offline_dataset_stats
from .target import remove_stale_temp_dirs, stale_temp_dirs
from .validate import raise_if_invalid, validate_vin_offline_store
from .writer import VinOfflineWriter

__all__ = [
    "BLOCK_ACTIONS",
    "BLOCK_DTYPES",
    "BLOCK_FRAMES",
    "BLOCK_NAMES",
    "BLOCK_NUM_FRAMES",
    "BLOCK_ROW_SHAPES",
    "BLOCK_WIDTH",
    "CHECKSUM_DESC",
    "COMPRESSOR_DESC",
    "DEFAULT_MAX_FRAMES",
    "FINGERPRINT_EXCLUDED",
    "MANIFEST_NAME",
    "MANIFEST_TYPES",
    "MAX_ACTION_WIDTH",
    "OFFLINE_DATASET_VERSION",
    "OPTIONAL_BLOCKS",
    "PAIRS_NAME",
    "PAIR_FIELDS",
    "SAMPLE_INDEX_FIELDS",
    "SAMPLE_INDEX_NAME",
    "SHARDS_DIR",
    "SPLITS_DIR",
    "SPLIT_FILES",
    "SPLIT_NAMES",
    "STORE_FORMAT",
    "WRITER_PACKAGE",
    "PairSpec",
    "SampleSpec",
    "ReaderClosedError",
    "StoreChecksumError",
    "StoreInputError",
    "VinOfflineDataset",
    "VinOfflineStoreReader",
    "VinOfflineWriter",
    "check_free_space_for_store",
    "collect_vin_offline_dataset_stats",
    "estimate_store_bytes",
    "frames_sha256",
    "merge_vin_offline_stores",
    "pad_slack",
    "raise_if_invalid",
    "rebuild_command",
    "remove_stale_temp_dirs",
    "shard_dir_name",
    "stale_temp_dirs",
    "store_fingerprint",
    "validate_vin_offline_store",
]
