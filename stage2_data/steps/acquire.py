"""The acquisition steps: download one archive or every archive of a cache key, extract one cache
key, report the extraction."""

from __future__ import annotations

import hashlib
import logging
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import checks as C
from .. import layout
from ..acquire import (
    archive_state,
    download_archive,
    hashed_by_this_build,
    require_build_space,
    verified_sha256s,
)
from ..acquire.cancel import cancelled
from ..checks import compare_totals, outcome
from ..errors import ChecksumMismatchError, Stage2Error
from ..extract import (
    check_extraction,
    extract_cache_dir,
    inspect_cache_dir,
    load_extraction_record,
    move_aside_unused,
    stray_entries,
    write_extraction_report,
)
from ..hashing import sha256_file
from ..profile import ArchiveSpec, Profile
from ..publish.quarantine import quarantine_files
from .result import StepResult, rate

log = logging.getLogger(__name__)


def step_download(
    profile: Profile, source: Any, data_root: Path, path: str, *, reverify: bool = False, progress: Any = None
) -> StepResult:
    """Download one archive (a part of a cache key's partition); a download whose sha256 does not
    match raises ChecksumMismatchError (that download never verified); a verified file that
    disagrees with its pin is moved aside first (``moved_aside`` in the metadata), never deleted."""
    spec = profile.archive(path)
    if spec.pinned and archive_state(data_root, spec).state in ("missing", "partial"):
        require_build_space(profile, data_root)  # refuses before the download starts
    res = download_archive(
        source,
        spec,
        data_root,
        reverify=reverify,
        progress=progress,
        quarantined=profile.quarantined_paths(),
        profile=profile,
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
    if res.moved_aside is not None:  # the local file disagreed with its pin: kept there, never deleted
        md["moved_aside"] = f"{res.local_path} -> {res.moved_aside}"
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


def step_download_cache_dir(
    profile: Profile, source: Any, data_root: Path, cache_key: str, *, reverify: bool = False
) -> StepResult:
    """Download and verify every archive of one cache key (its split parts, or its one tar): one
    partition of ``archive_file``. Each archive is :func:`step_download`'s; a part that fails does
    not keep the others from downloading (a rerun then resumes only what is missing; a stop of the
    process starts no further part), and the first failure is raised once all were tried
    (:func:`_partition_failure`). The metadata lists each archive; ``sha256`` is a digest of the
    archives' paths and sha256 (the partition's data version)."""
    parts: list[StepResult] = []
    failures: list[Stage2Error] = []
    for spec in profile.archives_by_cache_key()[cache_key]:
        try:
            parts.append(step_download(profile, source, data_root, spec.path, reverify=reverify))
        except Stage2Error as err:  # a named error: the other parts first, then this one
            log.warning("archive_file[%s]: %s", cache_key, err)
            failures.append(err)
            if cancelled(None):  # the process is stopping: no other part is started
                break
    if failures:
        raise _partition_failure(failures, parts)
    digest = hashlib.sha256()
    for r in parts:
        digest.update(f"{r.metadata['path']} {r.metadata['sha256']}\n".encode())
    moved = _moved_aside(parts)
    total = sum(int(r.metadata["bytes"] or 0) for r in parts)
    downloaded = sum(int(r.metadata["bytes_downloaded"] or 0) for r in parts)
    seconds = sum(float(r.metadata["seconds"] or 0) for r in parts)
    md: dict[str, Any] = {
        "cache_key": cache_key,
        "archives": [
            {
                k: r.metadata[k]
                for k in ("path", "bytes", "bytes_downloaded", "sha256", "skipped (already verified)")
            }
            for r in parts
        ],
        "bytes": total,
        "bytes_downloaded": downloaded,
        "seconds": round(seconds, 3),
        "MB/s": rate(downloaded, seconds),
        "sha256": digest.hexdigest(),
        "skipped (already verified)": all(r.metadata["skipped (already verified)"] for r in parts),
    }
    if moved:
        md["moved_aside"] = "\n".join(moved)
    checks = [c for r in parts for c in r.checks]
    problems = [c.description for c in checks if not c.passed]
    ok_text = f"{cache_key}: every archive's sha256 and size match its pin ({len(parts)} archive(s))"
    return StepResult(md, [outcome(C.ARCHIVE_SHA256_MATCHES_PIN, problems, ok_text)], parts)


def _moved_aside(parts: list[StepResult]) -> list[str]:
    """The ``<from> -> <to>`` line of every archive a download moved aside (``step_download``)."""
    return [str(r.metadata["moved_aside"]) for r in parts if r.metadata.get("moved_aside")]


def _partition_failure(failures: list[Stage2Error], parts: list[StepResult]) -> Stage2Error:
    """The error a failed cache key's partition raises: its first failure (its class sets the
    build's exit code), its message extended with every other part that failed and every file the
    parts that succeeded moved aside. A failed partition is not materialized, so this message is
    the only place the build can say where those files went."""
    first = failures[0]
    # each other failure by its message, and by its fix only when that is not the first's (the
    # first's fix ends the whole message): two parts missing offline say "Fix:" once
    more = [
        f"also {e.message.rstrip().rstrip('.')}"
        + (f" (fix: {e.fix})" if e.fix and e.fix != first.fix else "")
        for e in failures[1:]
    ]
    moved = _moved_aside(parts)
    if moved:
        more.append(f"moved aside (kept, not deleted): {'; '.join(moved)}")
    if more:
        first.message = f"{first.message.rstrip().rstrip('.')} ({'; '.join(more)})"
        first.args = (str(first),)  # what repr() and a re-raise in another process show
    return first


def step_extract(
    profile: Profile, data_root: Path, cache_key: str, *, progress: Any = None, force: bool = False
) -> StepResult:
    """Extract one cache key, unless it is up to date: its extraction record was made by this
    extractor from the archives' verified sha256 and the cache directory still holds what the
    record says (:func:`~stage2_data.extract.check_extraction`: every file's stats, and the sha256
    of any file whose stats changed). Then nothing is extracted, and the metadata is the recorded
    extraction's, with ``up_to_date`` true. Otherwise the metadata's ``extracted_because`` says why
    it was (re-)extracted (naming the file)."""
    specs = profile.archives_by_cache_key()[cache_key]
    files = [layout.archive_path(data_root, a.path) for a in specs]
    shas = verified_sha256s(profile, data_root, cache_key)
    found, reason = (
        (None, "--reverify: extracted again from its verified archives")
        if force
        else check_extraction(data_root, cache_key, shas)
    )
    if found is not None and reason is None:
        rec = found
        log.info("cache_dir[%s]: up to date (%d files, %d bytes)", cache_key, rec.files, rec.bytes)
    else:
        log.info("cache_dir[%s]: extracting: %s", cache_key, reason)
        if not force:  # --reverify's download step hashed every archive in this build
            _require_pinned_bytes(data_root, [a for a in specs if shas.get(a.path)])
        rec = extract_cache_dir(
            cache_key, files, data_root, progress=progress, archive_sha256=shas, trust_record=not force
        )
    problems = list(getattr(rec, "problems", []) or [])
    if not (rec.frame_files == rec.rows == rec.total_trajectories):
        problems.insert(
            0,
            f"{layout.cache_dir(data_root, cache_key)}: frame files {rec.frame_files}, processed_dataset rows "
            f"{rec.rows}, dataset_info.json total_trajectories {rec.total_trajectories} disagree",
        )
    if problems and reason is None:  # what its record says, not what an extraction just found
        record = layout.extraction_record_path(data_root, cache_key)
        problems.append(
            f"(as its extraction record {record} says; if that file was edited, move it aside, "
            f"e.g. `mv {shlex.quote(str(record))} {shlex.quote(str(record) + '.edited')}`, and build "
            "again: the cache directory is then extracted anew)"
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
        "MB/s": rate(rec.bytes, rec.seconds),
        "layout": rec.layout,
        "content_digest": rec.content_digest,
        "path": str(layout.cache_dir(data_root, cache_key)),
        "up_to_date": reason is None,
        "extracted_because": reason,
    }
    if getattr(rec, "moved_aside", None):  # a user's files in the old folder: kept, never deleted
        md["moved_aside"] = "\n".join(rec.moved_aside)
    return StepResult(md, [outcome(C.CACHE_DIR_COUNTS_CONSISTENT, problems)], rec)


def _require_pinned_bytes(data_root: Path, specs: list[ArchiveSpec]) -> None:
    """Hash again, before they are extracted, the verified archives that no step of this build
    hashed: their ``.verified.json`` says only what stats the bytes had when an earlier build
    hashed them, and a record edited together with the archive says the same. An archive this build
    downloaded or re-hashed is not read twice. One whose bytes are not its pin's is moved to
    quarantine with its record (never deleted) and the step fails: the next build downloads it."""
    todo = [a for a in specs if not hashed_by_this_build(data_root, a)]
    if not todo:
        return
    paths = [layout.archive_path(data_root, a.path) for a in todo]
    with ThreadPoolExecutor(max_workers=min(4, len(todo)), thread_name_prefix="archive-hash") as pool:
        digests = list(pool.map(sha256_file, paths))
    for spec, path, digest in zip(todo, paths, digests, strict=True):
        if digest == spec.sha256:
            continue
        assert spec.sha256 is not None
        moved = quarantine_files(
            data_root,
            [path, layout.verified_record_path(data_root, spec.path)],
            "its bytes are not its pin's, though its .verified.json record said they were",
            archive=spec.path,
            expected_sha256=spec.sha256,
            sha256=digest,
        )
        err = ChecksumMismatchError(
            spec.path,
            spec.sha256,
            digest,
            fix="build again: the archive is downloaded again (nothing was extracted from it)",
        )
        err.message = (
            f"{err.message.rstrip('.')}, though its record {layout.verified_record_path(data_root, spec.path)} "
            f"said it was verified (hashed again before extraction: no step of this build had hashed "
            f"it). The archive was moved to {moved[0]}, its record beside it."
        )
        err.args = (str(err),)
        raise err


def step_extraction_report(profile: Profile, data_root: Path) -> StepResult:
    """The extraction report of every cache key of the profile. A cache directory the build
    extracted that the profile no longer lists is first moved to ``<data_root>/unused/`` (the
    metadata's ``moved_aside`` says from where to where); any other entry of ``processed_datasets/``
    that is not a cache key of the profile fails ``no_stray_entries``, named."""
    moved = move_aside_unused(data_root, profile.cache_keys())
    for src, dest in moved:
        log.info("%s: no longer in the profile; moved to %s", src, dest)
    records = []
    problems_dirs: list[str] = []
    total = 0
    rows_md = []
    seen: dict[str, str] = {}  # trajectory id -> the first cache key holding it
    repeated: dict[tuple[str, str], list[str]] = {}  # (first key, key) -> the ids both hold
    for key in profile.cache_keys():
        rec_path = layout.extraction_record_path(data_root, key)
        cdir = layout.cache_dir(data_root, key)
        if not cdir.is_dir() or not rec_path.is_file():
            problems_dirs.append(f"{cdir}: cache directory missing (materialize cache_dir[{key}])")
            continue
        record = load_extraction_record(data_root, key)
        if record is None:
            problems_dirs.append(f"{rec_path}: extraction record unreadable (materialize cache_dir[{key}])")
            continue
        info = inspect_cache_dir(cdir)
        # a cache dir whose own counts disagree must block here too (a run of this stage on its own)
        problems_dirs += [f"{p} (fix: correct the upstream data or re-extract {cdir})" for p in info.problems]
        records.append(record)
        total += len(info.frame_ids)
        for tid in info.frame_ids:
            first = seen.setdefault(tid, key)
            if first != key:
                repeated.setdefault((first, key), []).append(tid)
        rows_md.append((key, len(info.frame_ids), info.rows, info.total_trajectories))
    for (first, key), ids in sorted(repeated.items()):
        ids.sort()
        shown = ", ".join(ids[:10]) + (f", ... and {len(ids) - 10} more" if len(ids) > 10 else "")
        problems_dirs.append(
            f"{layout.cache_dir(data_root, key)} repeats {len(ids)} trajectory id(s) of "
            f"{layout.cache_dir(data_root, first)}: {shown} (a trajectory id names one trajectory: "
            f"it would be counted twice; fix: remove the cache key {key!r} or {first!r} from the "
            f"profile, or ask upstream which one holds those trajectories)"
        )
    present = [k for k in profile.cache_keys() if layout.cache_dir(data_root, k).is_dir()]
    if len(present) != profile.expected.cache_dirs:
        problems_dirs.append(
            f"{layout.processed_root(data_root)}: {len(present)} cache directories, expected {profile.expected.cache_dirs}"
        )
    report_path = write_extraction_report(data_root, records)
    strays = [
        f"{layout.processed_root(data_root) / s}: not a cache directory of the profile, nor one this "
        f"build extracted (fix: move it out of {layout.processed_root(data_root)})"
        for s in stray_entries(data_root, profile.cache_keys())
    ]
    traj_problems = compare_totals(
        {"trajectories": total},
        {"trajectories": profile.expected.trajectories},
        str(report_path),
        profile=profile,
        keys={"trajectories": "expected.trajectories"},
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
    if moved:
        md["moved_aside"] = "\n".join(f"{src} -> {dest}" for src, dest in moved)
    return StepResult(
        md,
        [
            outcome(C.TRAJECTORIES_MATCH_EXPECTED, traj_problems, trajectories=total),
            outcome(C.CACHE_DIRS_MATCH_EXPECTED, problems_dirs),
            outcome(
                C.NO_STRAY_ENTRIES,
                strays,
                "; ".join(f"{src}: no longer in the profile, moved to {dest}" for src, dest in moved) or None,
            ),
        ],
        report_path,
    )
