"""Safe extraction of whole and split tars into ``<DATA_ROOT>/processed_datasets/<cache_key>/``,
and inspection of an extracted cache directory.

- :mod:`.multipart`: split parts (``<cache_key>.tar.part-aa``, ``-ab``, ...) ordered, checked for
  gaps, and read in place through :class:`MultiPartReader` (no joined copy is written);
- :mod:`.tar`: the archive opened in random-access mode, every header read, the end-of-archive
  block checked (a truncated or corrupt stream is an :class:`~stage2_data.errors.ArchiveError`);
- :mod:`.safety`: every member checked before anything is written (an
  :class:`~stage2_data.errors.UnsafeArchiveError` lists every refused member);
- :mod:`.extract`: the all-or-nothing extraction (``copy_file_range`` into a temporary folder, then
  renamed into place) and its records (every file's sha256 and stats); :func:`check_extraction` says
  whether a cache directory is still what its record says (by stats when they are unchanged, by
  content when they are not), or why it must be re-extracted;
- :mod:`.inspect`: what an extracted cache directory holds (counts cross-checked, its rows);
- :mod:`.aside`: what a re-extraction (or a re-unpack of the sidecars) finds in the folder it
  replaces that the last one did not write, unchanged (a user's files, an edit): moved into the
  data root's quarantine folder, never deleted.
"""

from __future__ import annotations

from .extract import (
    EXTRACTOR_VERSION,
    ExtractionCancelled,
    ExtractionRecord,
    NotRegularFile,
    TreeStat,
    cancel_extractions,
    check_cancel,
    check_extraction,
    content_digest_of,
    extract_cache_dir,
    file_kind,
    hash_regular_file,
    invalidate_extraction,
    load_extraction_record,
    reported_extraction,
    scan_tree,
    settle_ctimes,
    stats_digest,
    walk_stats,
    write_extraction_report,
    write_json_if_changed,
)
from .inspect import (
    CacheDirInfo,
    inspect_cache_dir,
    move_aside_unused,
    read_processed_rows,
    stray_entries,
)
from .multipart import MultiPartReader
from .safety import REDOWNLOAD_FIX
from .tar import open_archive_parts

__all__ = [
    "EXTRACTOR_VERSION",
    "REDOWNLOAD_FIX",
    "CacheDirInfo",
    "ExtractionCancelled",
    "ExtractionRecord",
    "MultiPartReader",
    "NotRegularFile",
    "TreeStat",
    "cancel_extractions",
    "check_cancel",
    "check_extraction",
    "content_digest_of",
    "extract_cache_dir",
    "file_kind",
    "hash_regular_file",
    "inspect_cache_dir",
    "invalidate_extraction",
    "load_extraction_record",
    "move_aside_unused",
    "open_archive_parts",
    "read_processed_rows",
    "scan_tree",
    "settle_ctimes",
    "stats_digest",
    "stray_entries",
    "walk_stats",
    "reported_extraction",
    "write_extraction_report",
    "write_json_if_changed",
]
