"""The shape of a store's ``manifest.json``: every field of the right type, every shard entry
consistent with its position, every file entry a safe relative path with a size and a sha256.

Reading only the manifest (no file of the store), so the strict reader checks it at open and
validation starts with it; the code after it may then index the manifest without guarding each key.
"""

from __future__ import annotations

from typing import Any

from ..hashing import SHA256_RE
from .format import (
    BLOCK_DTYPES,
    BLOCK_NAMES,
    MANIFEST_TYPES,
    OFFLINE_DATASET_VERSION,
    OPTIONAL_BLOCKS,
    STORE_FORMAT,
    shard_dir_name,
)


def manifest_shape_problems(m: dict[str, Any], where: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Every problem of the manifest ``m`` itself (``where`` names it in each message), and the shard
    entries that are well formed (in order; what the array checks may then read)."""
    problems: list[str] = []
    _check_fields(m, problems, where)
    shards = _check_shards(m, problems, where)
    return problems, shards


FILE_LIST_SHAPE = (
    "is not a list of {path, bytes, sha256} (a relative path inside the store, a size, a sha256)"
)


def is_file_entry(f: Any) -> bool:
    """One entry of a manifest's list of files: a relative path that stays inside the store, a
    non-negative size and a sha256."""
    return (
        isinstance(f, dict)
        and isinstance(f.get("path"), str)
        and f["path"] != ""
        and not f["path"].startswith("/")
        and ".." not in f["path"].split("/")
        and is_int(f.get("bytes"))
        and f["bytes"] >= 0
        and isinstance(f.get("sha256"), str)
        and SHA256_RE.match(f["sha256"]) is not None
    )


def is_file_list(files: Any) -> bool:
    """A manifest's list of files (the store's or a shard's): every entry :func:`is_file_entry`."""
    return isinstance(files, list) and all(is_file_entry(f) for f in files)


def blocks_by_name(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's block descriptions by name (those that are objects with a string name)."""
    blocks = m.get("blocks")
    if not isinstance(blocks, list):
        return {}
    return {b["name"]: b for b in blocks if isinstance(b, dict) and isinstance(b.get("name"), str)}


def is_int(v: Any) -> bool:
    """An int that is not a bool (JSON has no separate integer type; Python makes True an int)."""
    return isinstance(v, int) and not isinstance(v, bool)


def version_words(version: Any) -> str:
    """A manifest's ``version`` as a message says it: the number, or what else it is (``"2"``, text,
    is not the version 2: saying ``2`` would contradict the expected 2 next to it)."""
    if type(version) is int:
        return str(version)
    return f"{version!r} (a {type(version).__name__}, not a whole number)"


def _check_fields(m: dict[str, Any], problems: list[str], where: str) -> None:
    for key, typ in MANIFEST_TYPES.items():
        if key not in m:
            problems.append(f"{where}: missing field {key!r}")
        elif not isinstance(m[key], typ) or (typ is int and isinstance(m[key], bool)):
            problems.append(f"{where}: field {key!r} has the wrong type ({type(m[key]).__name__})")
    if m.get("format") != STORE_FORMAT:
        problems.append(f"{where}: format {m.get('format')!r}; expected {STORE_FORMAT!r}")
    if m.get("version") != OFFLINE_DATASET_VERSION or not is_int(m.get("version")):
        problems.append(
            f"{where}: Unsupported VIN offline store version: {version_words(m.get('version'))}. "
            f"Expected {OFFLINE_DATASET_VERSION}."
        )
    prof = m.get("profile")
    if isinstance(prof, dict):
        for k in ("name", "repo_id", "revision"):
            if not isinstance(prof.get(k), str) or not prof.get(k):
                problems.append(f"{where}: profile.{k} missing or empty")
    inputs = m.get("inputs")
    if isinstance(inputs, dict):
        for k, v in inputs.items():
            if not isinstance(v, str) or not SHA256_RE.match(v):
                problems.append(f"{where}: inputs[{k!r}] is not a sha256")
    writer = m.get("writer")
    if isinstance(writer, dict):
        for k in ("package", "version"):
            if not isinstance(writer.get(k), str):
                problems.append(f"{where}: writer.{k} missing")
    blocks = m.get("blocks")
    if isinstance(blocks, list):
        by_name = blocks_by_name(m)
        if len(by_name) != len(blocks):
            problems.append(f"{where}: blocks is not a list of objects with distinct string names")
        for name in BLOCK_NAMES:
            b = by_name.get(name)
            if b is None:
                problems.append(f"{where}: block {name!r} is not described in 'blocks'")
                continue
            if b.get("dtype") != BLOCK_DTYPES[name]:
                problems.append(
                    f"{where}: block {name!r} dtype {b.get('dtype')!r}; expected {BLOCK_DTYPES[name]!r}"
                )
            if bool(b.get("optional")) != (name in OPTIONAL_BLOCKS):
                problems.append(f"{where}: block {name!r} optional flag is wrong")
            if name not in OPTIONAL_BLOCKS and b.get("materialized") is not True:
                problems.append(f"{where}: required block {name!r} is not materialized")
        extra = sorted(set(by_name) - set(BLOCK_NAMES), key=str)
        if extra:
            problems.append(f"{where}: unknown blocks {extra}")
    opts = m.get("options")
    if isinstance(opts, dict):
        for k, typ in (("include_actions", bool), ("rows_per_shard", int), ("max_frames", int)):
            v = opts.get(k)
            if not isinstance(v, typ) or (typ is int and (isinstance(v, bool) or v <= 0)):
                problems.append(
                    f"{where}: options.{k} {v!r} is not a {'bool' if typ is bool else 'positive integer'}"
                )
    if "files" in m and not is_file_list(m["files"]):
        problems.append(f"{where}: files {FILE_LIST_SHAPE}")
    fp = m.get("fingerprint")
    if isinstance(fp, str) and not SHA256_RE.match(fp):
        problems.append(f"{where}: fingerprint is not a sha256")


def _check_shards(m: dict[str, Any], problems: list[str], where: str) -> list[dict[str, Any]]:
    good: list[dict[str, Any]] = []
    shards: list[Any] = m["shards"] if isinstance(m.get("shards"), list) else []
    row_start = 0
    for k, sh in enumerate(shards):
        tag = f"{where}: shards[{k}]"
        if not isinstance(sh, dict):
            problems.append(f"{tag} is not an object")
            continue
        bad = len(problems)
        if sh.get("id") != k:
            problems.append(f"{tag}: id {sh.get('id')!r}; expected {k}")
        if sh.get("dir") != shard_dir_name(k):
            problems.append(f"{tag}: dir {sh.get('dir')!r}; expected {shard_dir_name(k)!r}")
        if sh.get("row_start") != row_start:
            problems.append(f"{tag}: row_start {sh.get('row_start')!r}; expected {row_start}")
        nr_raw: Any = sh.get("num_rows")
        nr: int = nr_raw if is_int(nr_raw) and nr_raw > 0 else 0
        if nr == 0:
            problems.append(f"{tag}: num_rows {nr_raw!r} is not a positive integer")
        fs = sh.get("frame_shape")
        if not (
            isinstance(fs, list) and len(fs) == 4 and all(is_int(x) and x > 0 for x in fs) and fs[3] == 3
        ):
            problems.append(f"{tag}: frame_shape {fs!r} is not [Tmax, H, W, 3]")
        aw: Any = sh.get("action_width_max")
        if not is_int(aw) or int(aw) < 0:
            problems.append(f"{tag}: action_width_max {aw!r} is not a non-negative integer")
        if not is_file_list(sh.get("files")):
            problems.append(f"{tag}: files {FILE_LIST_SHAPE}")
        row_start += nr
        if len(problems) == bad:
            good.append(sh)
    return good
