"""Merge: a new store = a base store + a sidecar store of NEW trajectories built by the same writer.

Existing shards are never rewritten: base shards are hard-linked (or copied), sidecar shards copied
whole, every file's bytes checked against the sha256 its input manifest lists (hashed while copied,
or once linked); both are numbered in the order a fresh build of all the rows gives them, so a
merge of stores of disjoint cache directories equals that build, fingerprint included; the sample
index, pairs, splits and manifest are written anew, and the result passes the publication gate
(:func:`.gate.publication_gate`: every file hashed, the fingerprint recomputed, every sample decoded)
before it is published at ``out``: a merge checks no less than a first build. A merge that fails
leaves nothing at ``out``.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StoreError, StoreValidationError
from ..hashing import sha256_file
from ..publish import make_staging_dir, publish_dir
from ..publish.readonly import remove_tree
from ..storage import StoreLocation
from .commit import finish_manifest
from .format import MANIFEST_NAME, PairSpec, StoreChecksumError, StoreInputError, shard_dir_name
from .gate import publication_gate
from .plan import row_order
from .reader import VinOfflineStoreReader
from .target import check_out_dir, check_remote_out
from .validate import raise_if_invalid


def merge_vin_offline_stores(
    base: str | os.PathLike[str] | StoreLocation,
    sidecar: str | os.PathLike[str] | StoreLocation,
    out: str | os.PathLike[str] | StoreLocation,
    storage_options: dict[str, Any] | None = None,
    *,
    pairs: Sequence[PairSpec] | None = None,
    profile: dict[str, Any] | None = None,
    inputs: dict[str, str] | None = None,
    local: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    gate: bool = True,
) -> dict[str, Any]:
    """A new store at ``out`` = ``base`` + ``sidecar`` (a store of NEW trajectories from the same writer).

    Base shards are hard-linked (copied where linking fails); sidecar shards are copied whole;
    every file linked or copied is checked against the sha256 its input manifest lists (hashed
    while copied, or once linked: the bytes the output holds), StoreChecksumError naming the input
    file when they differ. All are numbered in the order a fresh build of every row gives them
    (``_canonical_layout``). Sample index, pairs (sorted by pair_id), splits and manifest are
    written anew; the result then passes the publication gate (deep validation and the decode
    round trip, as a published store) before it is published atomically at ``out``; a result that
    fails is removed (StoreValidationError naming each problem): nothing is left at ``out``.
    ``gate=False`` is for a caller that runs the gate itself on ``out`` before any reader is
    pointed at it (the store step's extension, :mod:`.extend`, as for a fresh build): the merge
    then publishes at ``out`` after the checks a first build makes while it writes. Neither
    input store's bytes change; the gate makes the merged store read-only, as every published
    store, and a hard-linked file shares its inode (a base store that was writable loses its shard
    files' write bits). Returns the new manifest.

    Any of the three may be an object-storage URL (``storage_options`` apply to all of them): shard
    objects are then copied whole (streamed, sha256 verified), and on object storage the output is
    written in place under its prefix with ``manifest.json`` last (the commit marker).

    An extension (:mod:`.extend`) gives what a fresh build of the bigger input set would record:
    ``pairs`` (by trajectory id; they may join a base sample to a sidecar sample) replace the two
    stores' own pairs; ``profile``, ``inputs`` and ``local`` replace the base's; ``extra`` is added to
    the manifest (beside ``merged_from``).
    """
    base_l = StoreLocation.parse(base, storage_options)
    side_l = StoreLocation.parse(sidecar, storage_options)
    out_l = StoreLocation.parse(out, storage_options)

    def _same(a: StoreLocation, b: StoreLocation) -> bool:
        if a.is_local and b.is_local:
            return a.root.resolve() == b.root.resolve()
        return a.url.rstrip("/") == b.url.rstrip("/")

    if _same(out_l, base_l) or _same(out_l, side_l):
        raise StoreError(
            f"merge output {out_l.url} is one of its inputs; stores are immutable.",
            fix="write the merged store to a new folder",
        )
    # strict (format/version); each reader resolves its store once (a `current` link: the store it
    # names now) and holds a lease on it (retention) until the merge is done
    with VinOfflineStoreReader(base_l) as rb, VinOfflineStoreReader(side_l) as rs:
        return _merge(rb, rs, rb.location, rs.location, out_l, pairs, profile, inputs, local, extra, gate)


def _merge(
    rb: VinOfflineStoreReader,
    rs: VinOfflineStoreReader,
    base_l: StoreLocation,
    side_l: StoreLocation,
    out_l: StoreLocation,
    pairs: Sequence[PairSpec] | None,
    profile: dict[str, Any] | None,
    inputs: dict[str, str] | None,
    local: dict[str, Any] | None,
    extra: dict[str, Any] | None,
    gate: bool = True,
) -> dict[str, Any]:
    base_p, side_p, out_p = base_l.root, side_l.root, out_l.root
    for loc in (base_l, side_l):
        raise_if_invalid(loc, deep=False)
    mb, ms = rb.manifest, rs.manifest
    problems: list[str] = []
    if mb["profile"].get("repo_id") != ms["profile"].get("repo_id"):
        problems.append(
            f"profile repo differs: base {mb['profile'].get('repo_id')!r}, sidecar {ms['profile'].get('repo_id')!r}"
        )
    ob, os_ = mb.get("options", {}), ms.get("options", {})
    if ob.get("include_actions") != os_.get("include_actions"):
        problems.append(
            f"include_actions differs: base {ob.get('include_actions')!r}, sidecar {os_.get('include_actions')!r}"
        )
    if ob.get("max_frames") != os_.get("max_frames"):
        problems.append(
            f"max_frames differs: base {ob.get('max_frames')!r}, sidecar {os_.get('max_frames')!r}"
        )
    if mb.get("codec") != ms.get("codec"):
        problems.append("codec differs between base and sidecar")
    base_rows, side_rows = rb.sample_index, rs.sample_index
    overlap = sorted({r["sample_key"] for r in base_rows} & {r["sample_key"] for r in side_rows})
    if overlap:
        problems.append(
            f"{len(overlap)} sample keys are in both stores (a sidecar holds NEW trajectories only): "
            f"{overlap[:10]}{' ...' if len(overlap) > 10 else ''}"
        )
    if pairs is None:
        pair_overlap = sorted({p["pair_id"] for p in rb.pairs()} & {p["pair_id"] for p in rs.pairs()})
        if pair_overlap:
            problems.append(f"{len(pair_overlap)} pair ids are in both stores: {pair_overlap[:10]}")
    nb = len(base_rows)
    layout = _canonical_layout(mb["shards"], base_rows, ms["shards"], side_rows)
    index_rows = layout.index_rows
    if pairs is None:
        pairs_rows = [
            {
                **p,
                "chosen_sample_index": moved[p["chosen_sample_index"]],
                "rejected_sample_index": moved[p["rejected_sample_index"]],
            }
            for pairs_of, moved in ((rb.pairs(), layout.base_index), (rs.pairs(), layout.side_index))
            for p in pairs_of
        ]
    else:
        pairs_rows = _pairs_by_key(pairs, index_rows, problems)
    splits_by_key: dict[str, set[str]] = defaultdict(set)
    for pr in pairs_rows:
        for role in ("chosen_sample_index", "rejected_sample_index"):
            splits_by_key[index_rows[pr[role]]["sample_key"]].add(pr["split"])
    for key, sps in sorted(splits_by_key.items()):
        if len(sps) > 1:
            problems.append(f"split leakage: trajectory {key!r} is used by pairs of splits {sorted(sps)}")
    if problems:
        raise StoreInputError(
            f"cannot merge sidecar store {side_l.url} into {base_l.url}",
            problems,
            fix="build the sidecar with the same writer, profile and options, for new trajectories only",
        )
    pairs_rows.sort(key=lambda p: p["pair_id"])
    if out_l.is_local:
        check_out_dir(out_p, problems)
    else:
        check_remote_out(out_l, problems)
    if problems:
        raise StoreInputError(
            f"cannot write the merged store at {out_l.url}", problems, fix="choose another output folder"
        )
    if out_l.is_local:
        staging = make_staging_dir(out_p)
        target = StoreLocation.parse(staging)
    else:  # object storage: in place, manifest.json last
        out_l.withdraw(MANIFEST_NAME)
        staging, target = out_p, out_l

    def _copy(src: StoreLocation, sp: Path, dp: Path, sha: str, link: bool) -> None:
        if link and src.is_local and target.is_local:
            dp.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(sp, dp)  # a base shard: the same bytes, no copy
            except OSError:
                pass  # (another file system, no links there): copied below
            else:
                _check_linked(src, sp, dp, sha)  # the bytes the output now holds, hashed
                return
        target.copy_verified(src, sp, dp, sha)  # streamed, sha256 verified

    try:
        shard_entries: list[dict[str, Any]] = []
        jobs: list[tuple[StoreLocation, Path, Path, str, bool]] = []
        for new_id, (from_base, sh) in enumerate(layout.shards):
            src, src_root = (base_l, base_p) if from_base else (side_l, side_p)
            new_dir = shard_dir_name(new_id)
            if target.is_local:
                (staging / new_dir).mkdir(parents=True)
            entry = {**sh, "id": new_id, "dir": new_dir, "row_start": layout.row_starts[new_id], "files": []}
            for f in sh["files"]:
                rel_in = Path(f["path"]).relative_to(sh["dir"]).as_posix()
                # a base shard is hard-linked where it can be (the same bytes, no copy)
                jobs.append((src, src_root / f["path"], staging / new_dir / rel_in, f["sha256"], from_base))
                entry["files"].append({**f, "path": f"{new_dir}/{rel_in}"})
            shard_entries.append(entry)
        if target.is_local and side_l.is_local and base_l.is_local:
            for job in jobs:
                _copy(*job)
        else:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(lambda j: _copy(*j), jobs))
        if inputs is None:
            inputs = dict(mb["inputs"])
            for k, v in ms["inputs"].items():
                if inputs.get(k, v) == v:
                    inputs[k] = v
                else:
                    inputs[f"sidecar/{k}"] = v
        manifest = finish_manifest(
            target,
            profile=mb["profile"] if profile is None else profile,
            inputs=inputs,
            options=dict(ob),
            shard_entries=shard_entries,
            index_rows=index_rows,
            pairs_rows=pairs_rows,
            local=(mb.get("local") or {"profile_path": None, "data_root": None}) if local is None else local,
            extra={
                **(extra or {}),
                "merged_from": [
                    {
                        "role": "base",
                        "fingerprint": mb["fingerprint"],
                        "profile": mb["profile"],
                        "samples": nb,
                    },
                    {
                        "role": "sidecar",
                        "fingerprint": ms["fingerprint"],
                        "profile": ms["profile"],
                        "samples": len(side_rows),
                    },
                ],
            },
        )
        if gate:  # the full check of a published store, before anything is at ``out``
            _gate(target, out_l, staging, base_l, side_l)
        if target.is_local:
            publish_dir(staging, out_p)
    except BaseException:
        if target.is_local:
            remove_tree(staging)  # (the gate made it read-only)
        else:  # no manifest was written: best-effort removal of the copied objects
            with contextlib.suppress(Exception):
                out_l.withdraw(MANIFEST_NAME)
        raise
    return manifest


def _check_linked(src: StoreLocation, sp: Path, dp: Path, sha: str) -> None:
    """The file ``dp`` just hard-linked to ``src``'s ``sp`` hashed against ``sha``, the sha256 the
    input manifest lists for it (the link is removed when they differ): linking copies nothing, so
    nothing else would check the bytes the merged store takes from its base."""
    got = sha256_file(dp)
    if got != sha:
        dp.unlink(missing_ok=True)
        raise StoreChecksumError(
            f"{src.display(sp)}: sha256 {got} differs from its manifest ({sha}); refusing to merge it "
            "(the file changed after the store was written).",
            fix=f"the input store is damaged: check it with `stage2 validate {src.url} --deep`, rebuild it, "
            "and merge again",
        )


def _gate(
    target: StoreLocation, out_l: StoreLocation, staging: Path, base_l: StoreLocation, side_l: StoreLocation
) -> None:
    """The merged store (in its staging folder, or in place on object storage) through the
    publication gate; StoreValidationError naming each problem (at the path it would have had)
    when it fails (the caller then removes it)."""
    result = publication_gate(target)
    if result.passed:
        return
    shown = [p.replace(str(staging), str(out_l.root)) for p in result.problems] if target.is_local else []
    raise StoreValidationError(
        f"the merged store failed the publication gate (deep validation and the decode round trip); "
        f"nothing was written at {out_l.url}",
        shown or list(result.problems),
        fix=f"check both inputs with `stage2 validate <store> --deep --decode` ({base_l.url}, {side_l.url}), "
        "rebuild the one that fails, and merge again",
    )


@dataclass
class _Layout:
    """The merged store's layout: its shards in canonical order (``(from the base?, shard entry)``),
    each shard's first row, the merged sample index, and where each input row went."""

    shards: list[tuple[bool, dict[str, Any]]]
    row_starts: list[int]
    index_rows: list[dict[str, Any]]
    base_index: dict[int, int]  # a base row's sample_index -> its sample_index in the merged store
    side_index: dict[int, int]


def _canonical_layout(
    base_shards: Sequence[dict[str, Any]],
    base_rows: Sequence[dict[str, Any]],
    side_shards: Sequence[dict[str, Any]],
    side_rows: Sequence[dict[str, Any]],
) -> _Layout:
    """The shards of both stores in the order a fresh build of all their rows gives them (each
    shard's first row by :func:`.plan.row_order`), rows renumbered to match. Shards are never cut anew: when the two stores hold
    disjoint cache directories (a store per cache directory, an extension by new cache
    directories), the result is the fresh build's layout exactly, and so is its fingerprint."""
    keyed: list[tuple[tuple[Any, ...], bool, dict[str, Any], list[dict[str, Any]]]] = []
    for from_base, shards, rows in ((True, base_shards, base_rows), (False, side_shards, side_rows)):
        by_shard: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_shard[r["shard_id"]].append(r)
        for sh in shards:
            own = sorted(by_shard.get(sh["id"], []), key=lambda r: r["row"])
            first = own[0] if own else {}
            key = row_order(
                first.get("cache_key", ""),
                first.get("frame_height", 0),
                first.get("frame_width", 0),
                first.get("num_frames", 0),
                first.get("sample_key", ""),
            )
            keyed.append((key, from_base, sh, own))
    keyed.sort(key=lambda k: (k[0], not k[1]))
    layout = _Layout([], [], [], {}, {})
    for new_id, (_key, from_base, sh, own) in enumerate(keyed):
        layout.shards.append((from_base, sh))
        layout.row_starts.append(len(layout.index_rows))
        moved = layout.base_index if from_base else layout.side_index
        for r in own:
            moved[r["sample_index"]] = len(layout.index_rows)
            layout.index_rows.append({**r, "sample_index": len(layout.index_rows), "shard_id": new_id})
    return layout


def _pairs_by_key(
    pairs: Sequence[PairSpec], index_rows: list[dict[str, Any]], problems: list[str]
) -> list[dict[str, Any]]:
    """Pair rows for ``pairs`` (given by trajectory id) against the merged sample index."""
    at = {r["sample_key"]: r["sample_index"] for r in index_rows}
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for p in pairs:
        if p.pair_id in seen:
            problems.append(f"pair {p.pair_id!r} is given twice")
            continue
        seen.add(p.pair_id)
        missing = [k for k in (p.chosen_key, p.rejected_key) if k not in at]
        if missing:
            problems.append(f"pair {p.pair_id!r}: trajectories {missing} are in neither store")
            continue
        out.append(
            {
                "pair_id": p.pair_id,
                "split": p.split,
                "task": p.task,
                "chosen_sample_index": at[p.chosen_key],
                "rejected_sample_index": at[p.rejected_key],
            }
        )
    return out
