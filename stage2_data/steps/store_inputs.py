"""What a store is built from: the sha256 of the kit's files and the profile's pins, the content of
the extracted data and the unpacked sidecars, the record that the join's and the byte check's
checks passed for exactly those inputs, and the key that names a store folder after them."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from .. import layout
from ..errors import Stage2Error
from ..extract import load_extraction_record
from ..formats.sha256sums import read_regular_bytes
from ..fsutil import canonical_json
from ..hashing import sha256_file
from ..kit.sidecar_facts import SIDECAR_MARKER
from ..profile import Profile
from ..publish import atomic_write_json
from ..stages import SUBSET_CHECKSUMS, TRAJECTORY_JOIN
from ..store import OFFLINE_DATASET_VERSION, StoreInputError
from ..store.format import SHARD_LAYOUT


def kit_inputs(profile: Profile, *, sidecar_archive: bool = True) -> dict[str, str]:
    """sha256 of every kit file and every archive pin that feeds the store (names are kit-relative);
    without ``sidecar_archive``, the sidecar tar left out (what was unpacked of it is in the unpack's
    record, :func:`extracted_content`)."""
    inputs: dict[str, str] = {}
    keys = ("pair_manifest", "subset_checksums") + (("sidecar_archive",) if sidecar_archive else ())
    for key in keys:
        inputs[f"kit/{getattr(profile.kit, key)}"] = sha256_file(profile.kit_file(key))
    adir = profile.kit_file("action_manifest_dir")
    for f in layout.action_manifest_paths(adir):
        inputs[f"kit/{profile.kit.action_manifest_dir}/{f.name}"] = sha256_file(f)
    for a in profile.archives:
        inputs[f"archive/{a.path}"] = a.sha256 or ""
    return inputs


def kit_digest(profile: Profile) -> str:
    """A digest of what the join, the byte check and the store writer read of the kit and the
    profile's pins (:func:`kit_inputs` without the sidecar tar: the pair and action manifests, the
    subset ``SHA256SUMS``); a kit that cannot be read digests as such. The part of those assets'
    code versions that follows the kit, so that the UI marks them stale after an edit (the build's
    store stage runs whenever these files' stats change: the mark lasts until the next build)."""
    try:
        inputs: dict[str, str] = kit_inputs(profile, sidecar_archive=False)
    except (OSError, Stage2Error) as e:
        inputs = {"unreadable": type(e).__name__}
    return hashlib.sha256(canonical_json(inputs).encode()).hexdigest()


def extracted_content(profile: Profile, data_root: Path) -> dict[str, str]:
    """The content digests of what the store reads besides the kit, from the records that cover it:
    every cache directory's extraction record (the sha256 of every extracted file) and the unpacked
    sidecars' record ("" where a record is missing: such an input set never matches a built one)."""
    out: dict[str, str] = {}
    for key in profile.cache_keys():
        rec = load_extraction_record(data_root, key)
        out[f"extracted/{key}"] = rec.content_digest if rec is not None else ""
    try:
        marker = json.loads(
            read_regular_bytes(layout.derived_root(data_root) / SIDECAR_MARKER).decode("utf-8")
        )
    except (OSError, ValueError):
        marker = {}
    out["sidecars"] = str(marker.get("content_digest") or "") if isinstance(marker, dict) else ""
    return out


# What the store step requires to have passed for its inputs: the join's checks (the join and the
# link totals) and the subset byte check, each recorded by its step (reports/<what>.checked.json)
CHECKED_BY = {
    TRAJECTORY_JOIN: "trajectory_join's checks",
    SUBSET_CHECKSUMS: "the subset byte check (subset_checksums)",
}


def checked_inputs(
    profile: Profile,
    data_root: Path,
    *,
    kit: dict[str, str] | None = None,
    extracted: dict[str, str] | None = None,
) -> str:
    """A digest of what the join and the subset byte check judge: the profile (its identity and
    expected totals), the kit's files (the sidecar tar as unpacked), the pins, and the content
    digests of every extraction and of the unpacked sidecars. ``kit`` (:func:`kit_inputs`; the
    sidecar tar's entry, if there, is left out) and ``extracted`` (:func:`extracted_content`): what
    the caller has computed already, so that nothing is hashed or read twice."""
    if kit is None:
        kit = kit_inputs(profile, sidecar_archive=False)
    tar = f"kit/{profile.kit.sidecar_archive}"
    blob = {
        "profile": profile.identity(),
        "expected": profile.expected.model_dump(mode="json"),
        "kit": {k: v for k, v in kit.items() if k != tar},
        "extracted": extracted_content(profile, data_root) if extracted is None else extracted,
    }
    return hashlib.sha256(canonical_json(blob).encode()).hexdigest()


def record_checked(data_root: Path, asset: str, inputs: str, passed: bool) -> None:
    """What ``asset``'s step (one of :data:`CHECKED_BY`) judged (``inputs``: :func:`checked_inputs`,
    taken before it read them) and whether its checks passed."""
    atomic_write_json(layout.checked_record_path(data_root, asset), {"inputs": inputs, "passed": passed})


def forget_checked(data_root: Path, asset: str) -> None:
    """No record of ``asset`` (one of :data:`CHECKED_BY`) stands: its step is starting (one that stops
    half-way leaves none), or a check of it failed after its step recorded a pass (a check the
    asset adds, the verify job's re-check). A store job run on its own then refuses until the step
    passes again. Nothing on a data root this process cannot write."""
    with contextlib.suppress(FileNotFoundError, PermissionError, OSError):
        layout.checked_record_path(data_root, asset).unlink()


def require_checked(profile: Profile, data_root: Path, now: str | None = None) -> None:
    """Raise :class:`StoreInputError` unless the join's checks and the subset byte check passed for
    exactly these inputs (:func:`checked_inputs`, now). The store reads the kit's pairs and the
    join's table itself: a store job run on its own (the UI's Materialize of ``vin_store``) after
    the kit changed, or after those checks failed, would otherwise publish what no check saw.
    ``now``: :func:`checked_inputs` when the caller has it."""
    now = checked_inputs(profile, data_root) if now is None else now
    problems = []
    for what, checks in CHECKED_BY.items():
        path = layout.checked_record_path(data_root, what)
        try:
            rec = json.loads(read_regular_bytes(path).decode("utf-8"))
        except (OSError, ValueError, Stage2Error):
            rec = None
        if not isinstance(rec, dict):
            problems.append(f"{checks}: no record that they ran ({path})")
        elif rec.get("inputs") != now:
            problems.append(
                f"{checks} ran for other inputs: the kit, the profile or the extracted files changed since"
            )
        elif rec.get("passed") is not True:
            problems.append(f"{checks} failed for these inputs")
    if problems:
        raise StoreInputError(
            "the store step: what it is built from has not passed its checks",
            problems,
            fix="run `stage2 build` (or, in the UI, materialize trajectory_join and subset_checksums "
            "until their checks pass, then vin_store)",
        )


def store_input_key(
    profile: Profile,
    inputs: dict[str, str],
    settings: dict[str, Any],
    content: dict[str, str] | None = None,
) -> str:
    """The digest that names a store folder (``v<VERSION>-<first 16 hex>``): the profile, the kit's
    and the pins' sha256 (``inputs``, also in the manifest), the format version, the shard layout
    rule, the writer settings and, with ``content`` (:func:`extracted_content`), the content of the
    extracted data and sidecars, so one folder name never stands for two contents."""
    doc: dict[str, Any] = {
        "profile": profile.identity(),
        "inputs": inputs,
        "version": OFFLINE_DATASET_VERSION,
        "layout": SHARD_LAYOUT,
        "settings": settings,
    }
    if content is not None:
        doc["content"] = content
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()
