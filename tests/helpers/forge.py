"""Forgeries of the build's own records, made consistent with the product's own digest functions:
what no stat and no check of a store against its own manifest can see."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path


def forge_store_consistently(store: Path) -> tuple[bytes, str]:
    """Edit a store together with its manifest: a task's text in ``sample_index.jsonl`` upper-cased,
    the file's sha256 and the fingerprint in ``manifest.json`` made to match, the index's mtime
    kept. Every byte then agrees with the manifest. Returns the forged index's bytes and the forged
    fingerprint."""
    from stage2_data.store.manifest import store_fingerprint

    manifest_path, index = store / "manifest.json", store / "sample_index.jsonl"
    for p in (store, manifest_path, index):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    text = index.read_bytes()
    task = re.search(rb'"task":"([a-z ]{8,})"', text)
    assert task is not None
    forged = text.replace(task.group(1), task.group(1).upper(), 1)
    st = index.stat()
    index.write_bytes(forged)
    os.utime(index, ns=(st.st_atime_ns, st.st_mtime_ns))
    doc = json.loads(manifest_path.read_text())
    (entry,) = [f for f in doc["files"] if f["path"] == "sample_index.jsonl"]
    entry["sha256"] = hashlib.sha256(forged).hexdigest()
    manifest_path.write_text(json.dumps(doc))
    doc["fingerprint"] = store_fingerprint(store)
    manifest_path.write_text(json.dumps(doc))
    return forged, str(doc["fingerprint"])
