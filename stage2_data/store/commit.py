"""The end of every build (the writer's and the merge's): the metadata files, the manifest with its
stats and fingerprint, a check of the result as validation sees it, then ``manifest.json`` LAST.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import StoreValidationError
from ..publish import fsync_dir
from ..storage import StoreLocation
from .format import (
    MANIFEST_NAME,
    OFFLINE_DATASET_VERSION,
    STORE_FORMAT,
    WRITER_PACKAGE,
    blocks_record,
    codec_record,
)
from .manifest import fingerprint_of, manifest_data_files
from .stats import manifest_stats
from .tables import write_metadata_files
from .validate import validate_store


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def finish_manifest(
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
    """Write the metadata files and the manifest into ``target`` (a local staging folder, or the
    object-storage prefix itself) after the shards; check the result as validation would; write
    ``manifest.json`` LAST (its presence means complete). Returns the manifest."""
    files = write_metadata_files(target, index_rows, pairs_rows)
    staging = target.root
    manifest: dict[str, Any] = {
        "format": STORE_FORMAT,
        "version": OFFLINE_DATASET_VERSION,
        "created_at": _utc_now(),
        "profile": dict(profile),
        "inputs": dict(sorted(inputs.items())),
        "writer": {"package": WRITER_PACKAGE, "version": __version__},
        "blocks": blocks_record(any(int(s["action_width_max"]) > 0 for s in shard_entries)),
        "codec": codec_record(),
        "options": options,
        "shards": shard_entries,
        "files": files,
        "stats": manifest_stats(index_rows, pairs_rows, shard_entries),
        "local": local,
    }
    if extra:
        manifest.update(extra)
    manifest["fingerprint"] = fingerprint_of(manifest, manifest_data_files(manifest))
    all_rel = [f["path"] for f in files] + [f["path"] for s in shard_entries for f in s["files"]]
    if target.is_local:
        _fsync_files(staging, all_rel)
    target.invalidate()
    problems = validate_store(target, manifest, deep=False, checksums=False)  # crc32c: just written
    if problems:
        raise StoreValidationError(
            f"the store just written in {target.display(staging)} is invalid (a writer bug)",
            problems,
            fix="report this; nothing was published",
        )
    # LAST: its presence means complete (locally a rename into place, on object storage one PUT)
    body = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    target.commit(staging / MANIFEST_NAME, body.encode("utf-8"))
    return manifest
