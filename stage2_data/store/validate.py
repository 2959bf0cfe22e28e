"""Read-only validation of a store: every problem found, as a list (empty = valid).

This module checks the manifest, its shard entries, and the sample index, splits and pairs against
it; :mod:`.validate_shards` checks the shard folders (array metadata, the small per-row arrays,
decoded samples) and every listed file.
"""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import StoreError, StoreValidationError
from ..formats.jsonl import iter_json_lines
from ..hashing import SHA256_RE, sha256_bytes
from ..storage import StoreLocation
from .format import (
    BLOCK_ACTIONS,
    MANIFEST_NAME,
    PAIR_FIELDS,
    PAIRS_NAME,
    SAMPLE_INDEX_FIELDS,
    SAMPLE_INDEX_NAME,
    SPLIT_FILES,
    SPLIT_NAMES,
    SPLITS_DIR,
    ZARR_JSON,
    pad_slack,
)
from .gate import non_regular_entries
from .manifest import fingerprint_of, load_manifest, rebuild_command
from .manifest_shape import blocks_by_name, is_file_entry, is_int, manifest_shape_problems
from .tables import npy_from_bytes
from .validate_shards import validate_arrays, validate_files


def validate_vin_offline_store(
    path: str | os.PathLike[str] | StoreLocation,
    deep: bool = False,
    storage_options: dict[str, Any] | None = None,
    *,
    decode: bool = False,
) -> list[str]:
    """Read-only check of a store; returns every problem found (empty list = valid).

    A local store holding anything but regular files and folders (a symbolic link, a FIFO, a
    device) is not read further: each such entry is the problem (:func:`.gate.non_regular_entries`).
    Checks manifest fields, format/version, row counts, shard count, split files (sorted, disjoint,
    union == all, counts), unique sample keys, pairs (valid indices, matching split), required
    blocks and per-shard array shapes/dtypes (array metadata), every sample's ``num_frames`` within
    the store's ``max_frames`` and every shard's padding within its bound, the small per-row arrays
    against the sample index, every listed file's size, the sha256 of the files read whole
    (``sample_index.jsonl``, ``pairs.jsonl``, ``splits/*.npy``, hashed from the bytes checked, and
    every ``zarr.json``) and the crc32c of every stored chunk (read, never decompressed). ``deep`` also hashes every file
    against the manifest and recomputes the fingerprint. ``decode`` also decodes every sample as
    the reader does (a row at a time on a few threads: memory stays bounded by a few rows; every
    chunk's crc32c is checked on the way) and checks its frames against its ``frames_sha256``, the
    zero padding past ``num_frames``, actions finite inside the row's length and width, and NaN past
    them.
    """
    loc = StoreLocation.parse(path, storage_options)
    root = loc.root
    if loc.is_local and not root.is_dir():
        return [f"{root}: not a folder (no store here)"]
    got = load_manifest(loc)
    if got.manifest is None:
        return [f"{loc.display(root / MANIFEST_NAME)}: {got.problem}"]
    return validate_store(loc, got.manifest, deep, decode=decode)


def validate_store(
    loc: StoreLocation, m: dict[str, Any], deep: bool, *, decode: bool = False, checksums: bool = True
) -> list[str]:
    """Every problem of the store at ``loc`` whose manifest is ``m`` (already read, or about to be
    written: the writer checks its result with this before it commits the manifest, without
    ``checksums``: it has just computed them). ``checksums``: read every stored chunk and check its
    crc32c (done by the decoding itself when ``decode``)."""
    root = loc.root
    if loc.is_local and (odd := non_regular_entries(root)):
        return odd  # nothing is read through a link, a FIFO or a device: those entries are the finding
    mpath = loc.display(root / MANIFEST_NAME)
    problems, shards = manifest_shape_problems(m, str(mpath))
    # the reader refuses a manifest with problems of its own, so those shards are checked without
    # decoding (every chunk's crc32c) and the problems are not repeated as the reader's refusal
    decode = decode and not problems
    stats: dict[str, Any] = m["stats"] if isinstance(m.get("stats"), dict) else {}
    if isinstance(m.get("shards"), list) and stats.get("shards") not in (None, len(m["shards"])):
        problems.append(f"{mpath}: stats.shards {stats.get('shards')!r} but {len(m['shards'])} shards listed")
    blocks = blocks_by_name(m)
    has_actions = any(int(s["action_width_max"]) > 0 for s in shards)
    if BLOCK_ACTIONS in blocks and bool(blocks[BLOCK_ACTIONS].get("materialized")) != has_actions:
        problems.append(
            f"{mpath}: block {BLOCK_ACTIONS} materialized={blocks[BLOCK_ACTIONS].get('materialized')!r} "
            f"but {'some' if has_actions else 'no'} shard holds it"
        )
    # the sha256 of each file read whole, from the very bytes checked here (a reader checks the same)
    tables: dict[str, str] = {}
    rows = _validate_index(loc, m, shards, problems, tables)
    _validate_splits(loc, m, rows, problems, tables)
    _validate_pairs(loc, m, rows, problems, tables)
    validate_arrays(loc, shards, rows, problems, decode=decode, checksums=checksums and not decode)
    if not deep:  # (deep hashes every file below)
        tables.update(_metadata_hashes(loc, m, shards))
    hashes: dict[str, str] | None = None
    if deep:  # every file of the store hashed once: for the manifest's sha256s and the fingerprint
        try:
            rels = [r for r in loc.tree_files(root) if r != MANIFEST_NAME]
            by_path = loc.sha256_files([root / r for r in rels])
            hashes = {r: by_path[str(root / r)] for r in rels}
        except (OSError, StoreError) as e:
            problems.append(f"{loc.url}: cannot hash its files ({e})")
    validate_files(loc, m, shards, {**(hashes or {}), **tables}, problems, every=hashes is not None)
    if hashes is not None and isinstance(m.get("fingerprint"), str):
        fp = fingerprint_of(m, sorted(hashes.items()))
        if fp != m["fingerprint"]:
            problems.append(f"{mpath}: fingerprint {m['fingerprint']} but the content gives {fp}")
    return problems


def _metadata_hashes(loc: StoreLocation, m: dict[str, Any], shards: list[dict[str, Any]]) -> dict[str, str]:
    """The sha256 of every Zarr metadata file the manifest lists (``zarr.json``: the store's, each
    shard group's and each array's), by relative path. They are read whole, tiny, and the reader
    hashes each against the manifest before it trusts a shard's layout, so validation at every
    level does too: a same-size edit of one (a fill value, a key) is a store the reader refuses.
    A listed file that is missing or unreadable is left to the size check, which names it."""
    top = m.get("files")
    listed = [f for f in top if is_file_entry(f)] if isinstance(top, list) else []
    rels = [
        f["path"]
        for f in [*listed, *(f for sh in shards for f in sh["files"])]
        if str(f["path"]).rsplit("/", 1)[-1] == ZARR_JSON
    ]
    root = loc.root

    def one(rel: str) -> tuple[str, str | None]:
        try:
            return rel, sha256_bytes(loc.read_bytes(root / rel))
        except (OSError, StoreError):
            return rel, None

    # a few at once: on object storage each is a request
    with ThreadPoolExecutor(max_workers=8) as pool:
        return {rel: sha for rel, sha in pool.map(one, rels) if sha is not None}


def raise_if_invalid(
    path: str | os.PathLike[str] | StoreLocation,
    deep: bool = False,
    storage_options: dict[str, Any] | None = None,
    *,
    decode: bool = False,
) -> None:
    """:func:`validate_vin_offline_store`, raising StoreValidationError (with the rebuild command)
    when it finds problems."""
    loc = StoreLocation.parse(path, storage_options)
    problems = validate_vin_offline_store(loc, deep=deep, decode=decode)
    if problems:
        manifest = load_manifest(loc).manifest
        path = loc.url
        raise StoreValidationError(
            f"VIN offline store {path} is invalid",
            problems,
            fix=f"rebuild it: {rebuild_command(path, manifest)}",
        )


# ----- the manifest and the small files -----------------------------------------------------------
def _validate_index(
    loc: StoreLocation,
    m: dict[str, Any],
    shards: list[dict[str, Any]],
    problems: list[str],
    tables: dict[str, str],
) -> list[dict[str, Any]]:
    root = loc.root
    ipath_p = root / SAMPLE_INDEX_NAME
    ipath = loc.display(ipath_p)
    if not loc.is_file(ipath_p):
        problems.append(f"{ipath}: missing")
        return []
    rows: list[dict[str, Any]] = []
    data = loc.read_bytes(ipath_p)
    tables[SAMPLE_INDEX_NAME] = sha256_bytes(data)
    for jl in iter_json_lines(data, skip_blank=False):
        lineno, row = jl.line, jl.value
        if not jl.ok:
            problems.append(f"{ipath}:{lineno}: not valid JSON ({jl.error})")
            continue
        if not isinstance(row, dict):
            problems.append(f"{ipath}:{lineno}: not a JSON object")
            continue
        if set(row) != set(SAMPLE_INDEX_FIELDS):
            missing = sorted(set(SAMPLE_INDEX_FIELDS) - set(row))
            extra = sorted(set(row) - set(SAMPLE_INDEX_FIELDS))
            problems.append(f"{ipath}:{lineno}: fields differ (missing {missing}, unexpected {extra})")
            continue
        rows.append(row)
    n_manifest = sum(int(s["num_rows"]) for s in shards)
    stats: dict[str, Any] = m["stats"] if isinstance(m.get("stats"), dict) else {}
    if len(rows) != n_manifest:
        problems.append(f"{ipath}: {len(rows)} rows but the manifest's shards hold {n_manifest}")
    if stats.get("samples") != len(rows):
        problems.append(
            f"{loc.display(root / MANIFEST_NAME)}: stats.samples {stats.get('samples')!r} but {len(rows)} index rows"
        )
    keys = Counter(r["sample_key"] for r in rows)
    dups = sorted(k for k, c in keys.items() if c > 1)
    if dups:
        problems.append(f"{ipath}: duplicate sample keys {dups[:10]}{' ...' if len(dups) > 10 else ''}")
    by_id = {int(s["id"]): s for s in shards}
    opts = m.get("options")
    max_frames = opts.get("max_frames") if isinstance(opts, dict) else None
    lengths: dict[int, list[int]] = {}
    for pos, r in enumerate(rows):
        tag = f"{ipath}:{pos + 1}"
        if r["sample_index"] != pos:
            problems.append(f"{tag}: sample_index {r['sample_index']!r}; expected {pos}")
        if r["split"] not in SPLIT_NAMES:
            problems.append(f"{tag}: split {r['split']!r} is not one of {', '.join(SPLIT_NAMES)}")
        if not isinstance(r["frames_sha256"], str) or not SHA256_RE.match(r["frames_sha256"]):
            problems.append(f"{tag}: frames_sha256 is not a sha256")
        sh = by_id.get(r["shard_id"]) if is_int(r["shard_id"]) else None
        if sh is None:
            problems.append(f"{tag}: shard_id {r['shard_id']!r} is not a shard of the manifest")
            continue
        tmax, h, w, _ = sh["frame_shape"]
        if not is_int(r["row"]) or not 0 <= r["row"] < sh["num_rows"] or sh["row_start"] + r["row"] != pos:
            problems.append(f"{tag}: row {r['row']!r} of shard {sh['id']} does not hold sample {pos}")
        if not is_int(r["num_frames"]) or not 1 <= r["num_frames"] <= tmax:
            problems.append(f"{tag}: num_frames {r['num_frames']!r} outside 1..{tmax} (shard Tmax)")
        else:
            lengths.setdefault(int(sh["id"]), []).append(int(r["num_frames"]))
            if is_int(max_frames) and r["num_frames"] > max_frames:
                problems.append(
                    f"{tag}: sample {r['sample_key']} has {r['num_frames']} frames, more than the store's "
                    f"max_frames {max_frames}"
                )
        if (r["frame_height"], r["frame_width"]) != (h, w):
            problems.append(
                f"{tag}: resolution {r['frame_height']}x{r['frame_width']} differs from shard {sh['id']} ({h}x{w})"
            )
        if not is_int(r["action_width"]) or not 0 <= r["action_width"] <= sh["action_width_max"]:
            problems.append(f"{tag}: action_width {r['action_width']!r} outside 0..{sh['action_width_max']}")
    for sid, ts in sorted(lengths.items()):
        sh = by_id[sid]
        tag = f"{loc.display(root / MANIFEST_NAME)}: shard {sid}"
        if len(ts) == int(sh["num_rows"]) and sh["frame_shape"][0] != max(ts):
            problems.append(f"{tag}: Tmax {sh['frame_shape'][0]} but its longest sample has {max(ts)} frames")
        if max(ts) - min(ts) > pad_slack(min(ts)):
            problems.append(
                f"{tag}: pads samples of {min(ts)} frames to {max(ts)} (more than {pad_slack(min(ts))} "
                "frames of padding: shards group samples of similar lengths)"
            )
    return rows


def _validate_splits(
    loc: StoreLocation,
    m: dict[str, Any],
    rows: list[dict[str, Any]],
    problems: list[str],
    tables: dict[str, str],
) -> None:
    root = loc.root
    n = len(rows)
    loaded: dict[str, np.ndarray[Any, Any]] = {}
    for name in SPLIT_FILES:
        pp = root / SPLITS_DIR / f"{name}.npy"
        p = loc.display(pp)
        if not loc.is_file(pp):
            problems.append(f"{p}: missing split file")
            continue
        try:
            data = loc.read_bytes(pp)
            tables[f"{SPLITS_DIR}/{name}.npy"] = sha256_bytes(data)
            arr = npy_from_bytes(data)
        except (OSError, ValueError) as e:
            problems.append(f"{p}: unreadable ({e})")
            continue
        if arr.dtype != np.int64 or arr.ndim != 1:
            problems.append(f"{p}: dtype {arr.dtype} ndim {arr.ndim}; expected 1-D int64")
            continue
        if arr.size and (np.any(np.diff(arr) <= 0)):
            problems.append(f"{p}: not sorted strictly increasing")
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            problems.append(f"{p}: indices outside [0, {n})")
        loaded[name] = arr
    sets = {k: set(v.tolist()) for k, v in loaded.items()}
    for i, a in enumerate(SPLIT_NAMES):
        for b in SPLIT_NAMES[i + 1 :]:
            if a in sets and b in sets and sets[a] & sets[b]:
                problems.append(f"splits {a} and {b} overlap on {len(sets[a] & sets[b])} samples")
    if all(k in sets for k in SPLIT_FILES):
        union = sets["train"] | sets["val"] | sets["test"]
        if union != sets["all"]:
            problems.append("splits: train ∪ val ∪ test differs from all")
    if "all" in loaded and not np.array_equal(loaded["all"], np.arange(n, dtype=np.int64)):
        problems.append(f"{loc.display(root / SPLITS_DIR / 'all.npy')}: is not 0..{n - 1}")
    per_split = (m.get("stats") or {}).get("per_split") if isinstance(m.get("stats"), dict) else None
    for sp in SPLIT_NAMES:
        if sp not in sets:
            continue
        want = {r["sample_index"] for r in rows if r["split"] == sp}
        if sets[sp] != want:
            problems.append(
                f"splits/{sp}.npy: {len(sets[sp] ^ want)} samples disagree with sample_index.jsonl's split column"
            )
        if isinstance(per_split, dict) and per_split.get(sp) != len(sets[sp]):
            problems.append(
                f"stats.per_split.{sp} {per_split.get(sp)!r} but splits/{sp}.npy has {len(sets[sp])}"
            )


def _validate_pairs(
    loc: StoreLocation,
    m: dict[str, Any],
    rows: list[dict[str, Any]],
    problems: list[str],
    tables: dict[str, str],
) -> None:
    root = loc.root
    pp = root / PAIRS_NAME
    p = loc.display(pp)
    if not loc.is_file(pp):
        problems.append(f"{p}: missing")
        return
    n = len(rows)
    count = 0
    seen: set[str] = set()
    data = loc.read_bytes(pp)
    tables[PAIRS_NAME] = sha256_bytes(data)
    for jl in iter_json_lines(data, skip_blank=False):
        tag, row = f"{p}:{jl.line}", jl.value
        if not jl.ok:
            problems.append(f"{tag}: not valid JSON ({jl.error})")
            continue
        count += 1
        if not isinstance(row, dict) or set(row) != set(PAIR_FIELDS):
            problems.append(f"{tag}: fields differ from {list(PAIR_FIELDS)}")
            continue
        if row["pair_id"] in seen:
            problems.append(f"{tag}: duplicate pair_id {row['pair_id']!r}")
        seen.add(row["pair_id"])
        if row["split"] not in SPLIT_NAMES:
            problems.append(f"{tag}: split {row['split']!r} is not one of {', '.join(SPLIT_NAMES)}")
        for role in ("chosen_sample_index", "rejected_sample_index"):
            idx = row[role]
            if not is_int(idx) or not 0 <= idx < n:
                problems.append(f"{tag}: {role} {idx!r} is not a sample index in [0, {n})")
            elif rows[idx]["split"] != row["split"]:
                problems.append(
                    f"{tag}: pair {row['pair_id']!r} ({row['split']}) uses sample {idx} "
                    f"({rows[idx]['sample_key']}) of split {rows[idx]['split']}"
                )
    stats: dict[str, Any] = m["stats"] if isinstance(m.get("stats"), dict) else {}
    if stats.get("pairs") != count:
        problems.append(
            f"{loc.display(root / MANIFEST_NAME)}: stats.pairs {stats.get('pairs')!r} but {PAIRS_NAME} has {count} rows"
        )
