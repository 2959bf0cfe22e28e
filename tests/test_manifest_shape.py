"""A damaged ``manifest.json`` or ``zarr.json`` is named, never a crash (docs/spec/vin-store.md,
"Reader rules").

Every key of a built store's manifest (and of the first entry of every list in it) is deleted, set
to ``null`` and set to a list (a wrong type for every field); a file entry's path is also pointed
outside the store. For each, deep validation (every file hashed) returns problems instead of raising, and
opening the store raises a :class:`StoreError` (the family every user-facing message comes from) or
reads it; every sixth one also goes through ``stage2 validate``, ``stage2 summary`` and
``stage2 merge`` (as the base), none of which may exit with the bug code. A key whose change validation accepts must be one the fingerprint leaves out; any other
accepted change would be a store whose manifest says something its content does not.

Every key of each ``zarr.json`` of a shard with actions (its group's and its arrays') is damaged the same three
ways: validation names it, and reading every sample raises a :class:`StoreError` naming the file.

The mutation test (tests/test_mutation.py) found the first case through ``stage2 build``: a same-size
edit of a key in the manifest's ``files`` list ended as ``internal error: KeyError: 'sha256'``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stage2_data.cli import EXIT_BUG, main
from stage2_data.errors import StoreError
from stage2_data.store import VinOfflineStoreReader, validate_vin_offline_store
from stage2_data.store.format import FINGERPRINT_EXCLUDED, MANIFEST_NAME

# Hundreds of validations of a small store (about a minute): the slow tier, out of the inner loop.
pytestmark = pytest.mark.slow

Path_ = tuple[str | int, ...]


def _key_paths(doc: Any, at: Path_ = ()) -> Iterator[Path_]:
    """Every key of ``doc``'s objects, following the first entry of each list."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*at, k)
            yield from _key_paths(v, (*at, k))
    elif isinstance(doc, list) and doc:
        yield from _key_paths(doc[0], (*at, 0))


def _parent(doc: Any, path: Path_) -> Any:
    for p in path[:-1]:
        doc = doc[p]
    return doc


def _read_every_sample(path: Path) -> None:
    with VinOfflineStoreReader(path) as r:
        for i in range(len(r)):
            r.sample(i)


def _damaged(doc: Any) -> Iterator[tuple[str, Path_, Any]]:
    """``doc`` with one key deleted, set to null or set to a list, for every key."""
    for path in _key_paths(doc):
        for kind in ("delete", "null", "list"):
            m = json.loads(json.dumps(doc))
            parent, key = _parent(m, path), path[-1]
            if kind == "delete":
                del parent[key]
            else:
                parent[key] = {"null": None, "list": [1]}[kind]
            yield kind, path, m


def _mutations(manifest: dict[str, Any]) -> Iterator[tuple[str, Path_, dict[str, Any]]]:
    yield from _damaged(manifest)
    for where in (("files", 0), ("shards", 0, "files", 0)):
        for bad in ("../outside", "/etc/passwd", ""):
            m = json.loads(json.dumps(manifest))
            _parent(m, (*where, "path"))["path"] = bad
            yield f"path={bad!r}", where, m


def _check(work: Path, label: str, crashes: list[str], *, deep: bool) -> list[str] | None:
    """Validation's problems with the store at ``work`` (None: it raised), after reading every
    sample; anything but a list of problems or a StoreError is put in ``crashes``."""
    try:
        problems = validate_vin_offline_store(work, deep=deep)
    except Exception as e:  # the class under test: anything but a list of problems is a bug
        crashes.append(f"{label}: validate raised {type(e).__name__}: {e}")
        return None
    try:
        _read_every_sample(work)
    except StoreError:
        pass
    except Exception as e:
        crashes.append(f"{label}: reading raised {type(e).__name__}: {e}")
    return problems


def test_every_damaged_manifest_key_is_named_not_a_crash(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = json.loads((store / MANIFEST_NAME).read_text())
    work = tmp_path / "store"
    shutil.copytree(store, work)
    crashes: list[str] = []
    accepted: list[str] = []
    n = 0
    for kind, path, m in _mutations(manifest):
        n += 1
        (work / MANIFEST_NAME).write_text(json.dumps(m, indent=2))
        label = f"{kind} {'.'.join(map(str, path))}"
        problems = _check(work, label, crashes, deep=True)
        if n % 6 == 0:
            for argv in (
                ["validate", str(work)],
                ["summary", str(work)],
                ["merge", str(work), str(store), "--out", str(tmp_path / f"merged{n}")],
            ):
                if main(argv) == EXIT_BUG:
                    crashes.append(f"{label}: stage2 {argv[0]}: {capsys.readouterr().err.strip()}")
            capsys.readouterr()
        if problems == [] and path[0] not in FINGERPRINT_EXCLUDED:
            accepted.append(label)
    assert n > 200, n  # every key of a real manifest, three ways
    assert not crashes, "\n".join(crashes)
    assert not accepted, "accepted although the fingerprint covers it:\n" + "\n".join(accepted)


def test_every_damaged_zarr_metadata_key_is_named_not_a_crash(tmp_path: Path, store: Path) -> None:
    work = tmp_path / "store"
    shutil.copytree(store, work)
    crashes: list[str] = []
    accepted: list[str] = []
    # a shard with every array (actions too: a shard without them has no actions arrays)
    shard = next(d for d in sorted((store / "shards").iterdir()) if (d / "actions" / "aligned").is_dir())
    metas = sorted(shard.rglob("zarr.json"))
    assert len(metas) >= 6, metas  # the group, frames, num_frames, actions, aligned, width
    n = 0
    for meta in metas:
        rel = meta.relative_to(store)
        for kind, path, m in _damaged(json.loads(meta.read_text())):
            n += 1
            (work / rel).write_text(json.dumps(m))
            label = f"{rel}: {kind} {'.'.join(map(str, path))}"
            if _check(work, label, crashes, deep=False) == []:
                accepted.append(label)
        shutil.copy2(meta, work / rel)
    assert n > 100, n
    assert not crashes, "\n".join(crashes)
    assert not accepted, "\n".join(accepted)
