"""Dagster-free step functions: one per asset of the graph.

Each step does the work through the domain modules and returns its result, the metadata worth
showing, and the outcomes of the checks that guard it. The Dagster assets call these and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import checks as C
from . import layout
from .checks import CheckOutcome, compare_totals, outcome
from .fsutil import atomic_symlink, canonical_json
from .hashing import sha256_file
from .profile import Profile


@dataclass
class StepResult:
    metadata: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckOutcome] = field(default_factory=list)
    value: Any = None

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)


# ----- profile -----------------------------------------------------------------------------------
def step_profile(profile: Profile, data_root: Path | None = None) -> StepResult:
    """With ``data_root``: raises DiskSpaceError (before any download starts) when the free disk there
    is below what the remaining downloads and the extraction need (``acquire.required_free_bytes``)."""
    if data_root is not None and not profile.unpinned():
        from .acquire import require_build_space

        require_build_space(profile, data_root)
    unpinned = profile.unpinned()
    pin_problems = [f"{profile.profile_path}: archive {p!r} has no size/sha256" for p in unpinned]
    pin_fix = f"run `stage2 pin {profile.profile_path}` to fill them from the hub's listing"
    if pin_problems:
        pin_problems.append(pin_fix)
    e = profile.expected
    count_problems = compare_totals(
        {"archives": len(profile.archives), "cache_dirs": len(profile.cache_keys())},
        {"archives": e.archives, "cache_dirs": e.cache_dirs},
        str(profile.profile_path),
    )
    md = {
        "profile": profile.name,
        "repo_id": profile.source.repo_id,
        "revision": profile.source.revision,
        "archives": len(profile.archives),
        "cache_dirs": len(profile.cache_keys()),
        "quarantined": len(profile.quarantined),
        "archive_bytes": profile.total_archive_bytes(),
        "archives_pinned": {
            "__markdown__": "| archive | cache key | bytes | sha256 |\n|---|---|---:|---|\n"
            + "\n".join(f"| {a.path} | {a.cache_key} | {a.size} | `{a.sha256}` |" for a in profile.archives)
        },
    }
    return StepResult(
        md,
        [
            outcome(C.PROFILE_IS_PINNED, pin_problems),
            outcome(C.PROFILE_COUNTS_MATCH_EXPECTED, count_problems),
        ],
        profile,
    )


# ----- acquisition -------------------------------------------------------------------------------
def step_download(
    profile: Profile, source: Any, data_root: Path, path: str, *, reverify: bool = False, progress: Any = None
) -> StepResult:
    """Download one archive partition; a sha256 mismatch raises ChecksumMismatchError (after the file is deleted)."""
    from .acquire import archive_state, download_archive, require_build_space

    spec = profile.archive(path)
    if spec.pinned and archive_state(data_root, spec).state in ("missing", "partial"):
        require_build_space(profile, data_root)  # refuses before the download starts
    res = download_archive(
        source, spec, data_root, reverify=reverify, progress=progress, quarantined=profile.quarantined_paths()
    )
    md = {
        "path": path,
        "cache_key": spec.cache_key,
        "bytes": res.size,
        "bytes_downloaded": res.bytes_downloaded,
        "resumed_from": res.resumed_from,
        "seconds": round(res.seconds, 3),
        "MB/s": round(res.mb_per_s, 1),
        "sha256": res.sha256,
        "skipped (already verified)": res.skipped,
        "local_path": str(res.local_path),
    }
    ok = res.sha256 == spec.sha256 and res.size == spec.size
    return StepResult(
        md,
        [
            outcome(
                C.ARCHIVE_SHA256_MATCHES_PIN,
                [] if ok else [f"{path}: expected {spec.sha256}/{spec.size}, got {res.sha256}/{res.size}"],
                f"{path}: sha256 {res.sha256} and {res.size} bytes match the pin",
            )
        ],
        res,
    )


def step_extract(profile: Profile, data_root: Path, cache_key: str, *, progress: Any = None) -> StepResult:
    from .extract import extract_cache_dir

    specs = profile.archives_by_cache_key()[cache_key]
    files = [layout.archive_path(data_root, a.path) for a in specs]
    rec = extract_cache_dir(cache_key, files, data_root, progress=progress)
    problems = list(getattr(rec, "problems", []) or [])
    if not (rec.frame_files == rec.rows == rec.total_trajectories):
        problems.insert(
            0,
            f"{layout.cache_dir(data_root, cache_key)}: frame files {rec.frame_files}, processed_dataset rows "
            f"{rec.rows}, dataset_info.json total_trajectories {rec.total_trajectories} disagree",
        )
    md = {
        "cache_key": cache_key,
        "archives": [a.path for a in specs],
        "files": rec.files,
        "bytes": rec.bytes,
        "frame_files": rec.frame_files,
        "rows": rec.rows,
        "total_trajectories": rec.total_trajectories,
        "seconds": round(rec.seconds, 3),
        "MB/s": _rate(rec.bytes, rec.seconds),
        "layout": rec.layout,
        "path": str(layout.cache_dir(data_root, cache_key)),
    }
    return StepResult(md, [outcome(C.CACHE_DIR_COUNTS_CONSISTENT, problems)], rec)


def step_extraction_report(profile: Profile, data_root: Path) -> StepResult:
    from .extract import ExtractionRecord, inspect_cache_dir, stray_entries, write_extraction_report

    records = []
    problems_dirs: list[str] = []
    total = 0
    rows_md = []
    for key in profile.cache_keys():
        rec_path = layout.extraction_record_path(data_root, key)
        cdir = layout.cache_dir(data_root, key)
        if not cdir.is_dir() or not rec_path.is_file():
            problems_dirs.append(f"{cdir}: cache directory missing (materialize cache_dir[{key}])")
            continue
        info = inspect_cache_dir(cdir)
        # a cache dir whose own counts disagree must block here too (a run of this stage on its own)
        problems_dirs += [f"{p} (fix: correct the upstream data or re-extract {cdir})" for p in info.problems]
        records.append(ExtractionRecord.from_dict(json.loads(rec_path.read_text())))
        total += len(info.frame_ids)
        rows_md.append((key, len(info.frame_ids), info.rows, info.total_trajectories))
    present = [k for k in profile.cache_keys() if layout.cache_dir(data_root, k).is_dir()]
    if len(present) != profile.expected.cache_dirs:
        problems_dirs.append(
            f"{layout.processed_root(data_root)}: {len(present)} cache directories, expected {profile.expected.cache_dirs}"
        )
    report_path = write_extraction_report(data_root, records)
    strays = [
        f"{layout.processed_root(data_root) / s}: not an expected cache directory (remove it)"
        for s in stray_entries(data_root, profile.cache_keys())
    ]
    traj_problems = compare_totals(
        {"trajectories": total}, {"trajectories": profile.expected.trajectories}, str(report_path)
    )
    table = "| cache key | frame files | rows | total_trajectories |\n|---|---:|---:|---:|\n" + "\n".join(
        f"| {k} | {a} | {b} | {c} |" for k, a, b, c in rows_md
    )
    md = {
        "trajectories": total,
        "cache_dirs": len(present),
        "report": str(report_path),
        "per_cache_key": {"__markdown__": table},
    }
    return StepResult(
        md,
        [
            outcome(C.TRAJECTORIES_MATCH_EXPECTED, traj_problems, trajectories=total),
            outcome(C.CACHE_DIRS_MATCH_EXPECTED, problems_dirs),
            outcome(C.NO_STRAY_ENTRIES, strays),
        ],
        report_path,
    )


# ----- kit ---------------------------------------------------------------------------------------
def step_sidecars(profile: Profile, data_root: Path) -> StepResult:
    from .kit import unpack_sidecars

    res = unpack_sidecars(profile, data_root)  # raises ChecksumMismatchError before unpacking anything
    exp = profile.expected.sidecars_by_source
    problems = compare_totals(dict(res.by_source), dict(exp), "sidecars by source") if exp else []
    table = "| source | sidecars | expected |\n|---|---:|---:|\n" + "\n".join(
        f"| {s} | {res.by_source.get(s, 0)} | {exp.get(s, '-')} |"
        for s in sorted(set(res.by_source) | set(exp))
    )
    md = {
        "tar": str(res.tar_path),
        "tar_sha256": res.tar_sha256,
        "files": res.files,
        "bytes": res.bytes,
        "seconds": round(res.seconds, 3),
        "MB/s": _rate(res.bytes, res.seconds),
        "by_source": {"__markdown__": table},
    }
    return StepResult(
        md,
        [
            outcome(
                C.SIDECAR_TAR_SHA256_MATCHES,
                [],
                f"{res.tar_path}: sha256 {res.tar_sha256} matches its .sha256",
            ),
            outcome(C.SIDECARS_BY_SOURCE_MATCH_EXPECTED, problems),
        ],
        res,
    )


def link_totals_problems(profile: Profile, rep: Any) -> list[str]:
    e = profile.expected
    found = {
        "pair_rows": rep.pair_rows,
        "unique_frame_files": rep.unique_frame_files,
        "action_manifest_rows": rep.action_manifest_rows,
        "resolved_sidecars": rep.resolved_sidecars,
    }
    expected = {
        "pair_rows": e.pair_rows,
        "unique_frame_files": e.unique_frame_files,
        "action_manifest_rows": e.action_manifest_rows,
        "resolved_sidecars": e.resolved_sidecars,
    }
    probs = compare_totals(found, expected, "link check")
    if e.sidecars_by_source:
        probs += compare_totals(
            dict(rep.sidecars_by_source), dict(e.sidecars_by_source), "resolved sidecars by source"
        )
    return probs


def step_join(profile: Profile, data_root: Path) -> StepResult:
    from .kit import build_join_table, link_check

    join = build_join_table(profile, data_root)
    rep = link_check(profile, data_root)
    problems = list(join.problems) + [p for p in rep.problems if p not in join.problems]
    md = {
        "table": str(join.table_path),
        "rows": join.rows,
        "pair_rows": rep.pair_rows,
        "unique_frame_files": rep.unique_frame_files,
        "action_manifest_rows": rep.action_manifest_rows,
        "resolved_sidecars": rep.resolved_sidecars,
        "link_check_seconds": round(rep.seconds, 3),
        **{f"count/{k}": v for k, v in sorted(join.counts.items()) if isinstance(v, int | float)},
    }
    return StepResult(
        md,
        [
            outcome(C.JOIN_HAS_NO_PROBLEMS, problems),
            outcome(C.LINK_TOTALS_MATCH_EXPECTED, link_totals_problems(profile, rep)),
        ],
        (join, rep),
    )


def step_verify_bytes(profile: Profile, data_root: Path, *, progress: Any = None) -> StepResult:
    from .kit import verify_subset_bytes

    rep = verify_subset_bytes(profile, data_root, progress=progress)
    fix = "delete the named cache directory's extraction and re-run the build (or check the kit's SHA256SUMS)"
    sums = profile.kit_file("subset_checksums")
    problems = (
        [f"{m} (fix: {fix})" for m in rep.mismatched]
        + [f"{p}: missing" for p in rep.missing]
        + [
            f"{p}: used by the pairs but not listed in {sums} (fix: add its sha256 line to the kit)"
            for p in rep.unlisted
        ]
        + list(rep.problems)
    )
    md = {
        "files": rep.files,
        "bytes": rep.bytes,
        "matched": rep.matched,
        "seconds": round(rep.seconds, 3),
        "MB/s": round(rep.bytes / 1e6 / rep.seconds, 1) if rep.seconds else None,
    }
    return StepResult(md, [outcome(C.SUBSET_BYTES_MATCH_SHA256SUMS, problems)], rep)


# ----- store -------------------------------------------------------------------------------------
def kit_inputs(profile: Profile) -> dict[str, str]:
    """sha256 of every kit file and every archive pin that feeds the store (names are kit-relative)."""
    inputs: dict[str, str] = {}
    for key in ("pair_manifest", "subset_checksums", "sidecar_archive"):
        inputs[f"kit/{getattr(profile.kit, key)}"] = sha256_file(profile.kit_file(key))
    adir = profile.kit_file("action_manifest_dir")
    for f in sorted(adir.glob("*.jsonl")):
        inputs[f"kit/{profile.kit.action_manifest_dir}/{f.name}"] = sha256_file(f)
    for a in profile.archives:
        inputs[f"archive/{a.path}"] = a.sha256 or ""
    return inputs


def store_input_key(profile: Profile, inputs: dict[str, str], settings: dict[str, Any]) -> str:
    from .store import OFFLINE_DATASET_VERSION

    blob = canonical_json(
        {
            "profile": profile.identity(),
            "inputs": inputs,
            "version": OFFLINE_DATASET_VERSION,
            "settings": settings,
        }
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def step_store(
    profile: Profile,
    data_root: Path,
    *,
    rows_per_shard: int = 64,
    progress: Any = None,
    store_url: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> StepResult:
    """Build (or reuse, for an unchanged input set) the store ``v<VERSION>-<inputs16>`` under
    ``<data_root>/stores/<profile>/`` or, with ``store_url`` (``s3://bucket/prefix``), under
    ``<store_url>/<profile>/``; then point ``current`` at it (a symlink locally, a ``CURRENT`` object
    holding the folder name on object storage, written after the store's manifest)."""
    import pyarrow.parquet as pq

    from .kit import load_pairs
    from .store import (
        OFFLINE_DATASET_VERSION,
        PairSpec,
        SampleSpec,
        VinOfflineStoreReader,
        VinOfflineWriter,
        validate_vin_offline_store,
    )

    inputs = kit_inputs(profile)
    settings = {"rows_per_shard": rows_per_shard, "include_actions": True}
    key = store_input_key(profile, inputs, settings)
    name = f"v{OFFLINE_DATASET_VERSION}-{key[:16]}"
    root_loc = stores_location(profile, data_root, store_url=store_url, storage_options=storage_options)
    out = root_loc.child(name)
    t0 = time.perf_counter()
    rebuilt = True
    problems: list[str] = []
    if out.is_file(out.root / "manifest.json") and not validate_vin_offline_store(out):
        rebuilt = False  # same inputs, valid store: nothing to rebuild (and nothing left to validate)
    else:
        table = pq.read_table(layout.join_table_path(data_root)).to_pylist()
        derived = layout.derived_root(data_root)
        samples = []
        for r in table:
            if not r.get("in_pairs"):
                continue
            sidecar = None
            if r.get("sidecar_path") and r.get("sidecar_present"):
                sidecar = derived / r["sidecar_path"]
            samples.append(
                SampleSpec(
                    sample_key=r["stage2_trajectory_id"],
                    cache_key=r["cache_key"],
                    source=r.get("source") or "",
                    task=r.get("task") or "",
                    quality_label=r.get("quality_label") or "",
                    partial_success=r.get("partial_success"),
                    is_robot=bool(r.get("is_robot")),
                    split=r["split"],
                    frames_path=data_root / r["frames_path"],
                    sidecar_path=sidecar,
                    action_status=r.get("action_status"),
                )
            )
        pairs_rows, _ = load_pairs(profile.kit_file("pair_manifest"))
        pairs = [
            PairSpec(p.pair_id, p.split, p.task, p.chosen_trajectory_id, p.rejected_trajectory_id)
            for p in pairs_rows
        ]
        VinOfflineWriter(
            out,
            profile=profile.identity(),
            inputs=inputs,
            rows_per_shard=rows_per_shard,
            progress=progress,
            profile_path=profile.profile_path,
            data_root=data_root,
            kit_root=profile.kit_root,
        ).write(samples, pairs)
    seconds = time.perf_counter() - t0
    # A new store is decoded sample by sample (through zarr, not through our writer) and compared
    # with the frames_sha256 the writer recorded, before it becomes current: a store that does not
    # round-trip is never published.
    t1 = time.perf_counter()
    if rebuilt:
        problems = validate_vin_offline_store(out, decode=True)
    validate_seconds = time.perf_counter() - t1
    if not problems:
        if root_loc.is_local:
            atomic_symlink(name, layout.current_store_path(data_root, profile.name))
        else:
            root_loc.write_bytes(root_loc.root / CURRENT_OBJECT, (name + "\n").encode())
    elif rebuilt:
        problems.append(
            f"{out.url} was removed, not published: {CURRENT_OBJECT.lower()} still points at the previous store"
        )
    result = store_checks(
        profile,
        out,
        rebuilt=rebuilt,
        seconds=seconds,
        reader_cls=VinOfflineStoreReader,
        problems=problems,
        validate_seconds=validate_seconds,
    )
    if problems and rebuilt:  # never published, and never reused by a rerun (which would not decode it)
        out.delete_tree()
    return result


CURRENT_OBJECT = "CURRENT"  # on object storage: names the published store folder under <url>/<profile>/


def stores_location(
    profile: Profile,
    data_root: Path,
    *,
    store_url: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """Where the stores of ``profile`` live, as a StoreLocation: ``<data_root>/stores/<profile>/``,
    or ``<store_url>/<profile>/`` on object storage."""
    from .storage import StoreLocation

    if store_url:
        return StoreLocation.parse(f"{store_url.rstrip('/')}/{profile.name}", storage_options)
    return StoreLocation.parse(layout.stores_root(data_root, profile.name))


def current_store(
    profile: Profile,
    data_root: Path,
    *,
    store_url: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """The published store of ``profile`` as a StoreLocation: ``stores/<profile>/current`` under the
    data root, or the folder named by ``<store_url>/<profile>/CURRENT`` on object storage.
    Raises StoreNotFoundError (with the command that builds it) when none is published."""
    from .errors import StoreNotFoundError
    from .storage import StoreLocation

    fix = f"build it: stage2 build --profile {profile.profile_path} --data-root {data_root}"
    if not store_url:
        current = layout.current_store_path(data_root, profile.name)
        if not current.exists():
            raise StoreNotFoundError(f"no store is published at {current}.", fix=fix)
        return StoreLocation.parse(current.resolve())
    root = stores_location(profile, data_root, store_url=store_url, storage_options=storage_options)
    if not root.is_file(root.root / CURRENT_OBJECT):
        raise StoreNotFoundError(
            f"no store is published at {root.url} (no {CURRENT_OBJECT} object).", fix=fix
        )
    return root.child(root.read_bytes(root.root / CURRENT_OBJECT).decode().strip())


def verify_current_store(
    profile: Profile,
    data_root: Path,
    *,
    store_url: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> CheckOutcome:
    """Re-read the published store: deep validation (every file's sha256, the fingerprint) and every
    sample decoded against its frames_sha256. Nothing is written."""
    from .errors import StoreError
    from .store import validate_vin_offline_store

    t0 = time.perf_counter()
    try:
        loc = current_store(profile, data_root, store_url=store_url, storage_options=storage_options)
    except StoreError as e:
        return outcome(C.STORE_BYTES_MATCH_MANIFEST, [str(e)])
    problems = validate_vin_offline_store(loc, deep=True, decode=True)
    return outcome(
        C.STORE_BYTES_MATCH_MANIFEST, problems, store=loc.url, seconds=round(time.perf_counter() - t0, 3)
    )


def store_checks(
    profile: Profile,
    path: Any,
    *,
    rebuilt: bool,
    seconds: float,
    reader_cls: Any,
    problems: list[str] | None = None,
    validate_seconds: float | None = None,
) -> StepResult:
    """Re-open ``path`` (a local path or a StoreLocation) with the strict reader and validate it
    (unless the validation's ``problems`` are given)."""
    from .store import collect_vin_offline_dataset_stats, validate_vin_offline_store

    open_problems: list[str] = []
    manifest: dict[str, Any] = {}
    try:
        reader = reader_cls(path)
        manifest = reader.manifest
    except Exception as exc:  # the strict reader's refusal is the check's finding
        open_problems.append(str(exc))
    if open_problems:
        problems = ["store did not open"]
    elif problems is None:
        problems = validate_vin_offline_store(path)
    count_problems: list[str] = []
    stats: dict[str, Any] = {}
    if manifest:
        stats = collect_vin_offline_dataset_stats(path)
        count_problems = compare_totals(
            {"samples": int(stats.get("samples", -1)), "pairs": int(stats.get("pairs", -1))},
            {"samples": profile.expected.unique_frame_files, "pairs": profile.expected.pair_rows},
            getattr(path, "url", str(path)),
        )
    split_counts = stats.get("per_split", {}) if stats else {}
    md = {
        "store": getattr(path, "url", str(path)),
        "fingerprint": manifest.get("fingerprint"),
        "version": manifest.get("version"),
        "samples": stats.get("samples"),
        "pairs": stats.get("pairs"),
        "shards": len(manifest.get("shards", [])),
        "bytes_on_disk": ((stats.get("bytes") or {}).get("on_disk") or {}).get("total"),
        "bytes_on_disk_per_block": ((stats.get("bytes") or {}).get("on_disk") or None),
        "rebuilt": rebuilt,
        "decoded": rebuilt,  # a new store is decoded sample by sample before it becomes current
        "seconds": round(seconds, 3),
        "validate_seconds": round(validate_seconds, 3) if validate_seconds is not None else None,
        "MB/s": _rate(((stats.get("bytes") or {}).get("on_disk") or {}).get("total") or 0, seconds)
        if rebuilt
        else None,
        "per_split": {"__markdown__": _kv_table("split", split_counts)},
        "per_source": {"__markdown__": _kv_table("source", stats.get("per_source", {}) if stats else {})},
    }
    return StepResult(
        md,
        [
            outcome(C.STORE_OPENS_STRICT, open_problems),
            outcome(C.STORE_VALIDATES, problems),
            outcome(C.STORE_COUNTS_MATCH_EXPECTED, count_problems),
        ],
        path,
    )


def _rate(nbytes: int | float, seconds: float) -> float | None:
    """MB/s for the UI's metadata (None when unmeasurable)."""
    return round(nbytes / 1e6 / seconds, 1) if seconds and nbytes else None


def _kv_table(name: str, d: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(d.items()))
    return f"| {name} | count |\n|---|---:|\n{rows}"
