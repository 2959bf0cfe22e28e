"""The published-stores ledger: the fingerprint each store folder had when this data root published it.

A store's folder name (``v<format>-<input key>``) says which inputs it was written from; its
manifest's ``fingerprint`` says what it holds, and the publication gate proves only that the two
agree with each other. A store edited together with its manifest (consistently, every sha256 and the
fingerprint recomputed) passes that gate. The ledger is a record kept apart from every store:
``<data_root>/reports/published_stores.json``, ``{profile: {store folder: {"fingerprint": ...,
"published_at": ...}}}``, written when a build publishes a store and never cleared by a failed
check (it says what was published, not what is up to date). A build reuses a store of its inputs
only when the store's fingerprint is the one recorded here for that folder; a store with no entry
(left by a stopped build, copied in, or published before the ledger existed) is reused only after a
store written anew from the inputs gives the same fingerprint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .. import layout
from .atomic import atomic_write_json

LEDGER_NAME = "published_stores.json"


def ledger_path(data_root: Path) -> Path:
    return layout.reports_dir(data_root) / LEDGER_NAME


def _read(data_root: Path) -> dict[str, Any]:
    """The ledger as stored; empty when there is none or it cannot be read as one (every store is
    then checked against its inputs before it is reused, as one with no entry is)."""
    try:
        doc = json.loads(ledger_path(data_root).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def published_fingerprint(data_root: Path, profile_name: str, store_name: str) -> str | None:
    """The fingerprint store ``store_name`` of profile ``profile_name`` had when this data root
    published it, or None when the ledger holds no such entry."""
    entry = _read(data_root).get(profile_name, {})
    entry = entry.get(store_name) if isinstance(entry, dict) else None
    fp = entry.get("fingerprint") if isinstance(entry, dict) else None
    return fp if isinstance(fp, str) and fp else None


def record_published(data_root: Path, profile_name: str, store_name: str, fingerprint: str) -> None:
    """Record that ``store_name`` was published with ``fingerprint`` (an entry already holding that
    fingerprint is kept as it is, with its first publication time)."""
    doc = _read(data_root)
    stores = doc.get(profile_name)
    if not isinstance(stores, dict):
        stores = doc[profile_name] = {}
    entry = stores.get(store_name)
    if isinstance(entry, dict) and entry.get("fingerprint") == fingerprint:
        return
    stores[store_name] = {
        "fingerprint": fingerprint,
        "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    ledger_path(data_root).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(ledger_path(data_root), doc, mode=0o644)


def unlike_published(data_root: Path, store_name: str, fingerprint: str, published: str) -> str:
    """The words for a store whose fingerprint is not the one the ledger recorded for it."""
    return (
        f"its content gives fingerprint {fingerprint}; this data root published {published} under "
        f"the name {store_name} ({ledger_path(data_root)})"
    )
