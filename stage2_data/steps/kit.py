"""The kit steps: unpack the action sidecars, join by trajectory id, verify the subset's bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import checks as C
from .. import layout
from ..checks import compare_totals, outcome
from ..extract import invalidate_extraction, load_extraction_record
from ..kit import LINK_TOTALS, build_join_table, link_check, unpack_sidecars, verify_subset_bytes
from ..kit.sidecars import invalidate_sidecars
from ..kit.subset_bytes import ByteReport
from ..profile import Profile
from ..stages import SUBSET_CHECKSUMS, TRAJECTORY_JOIN
from .result import StepResult, rate
from .status import kit_held, require_inputs_as_recorded
from .store_inputs import checked_inputs, forget_checked, record_checked


def step_sidecars(profile: Profile, data_root: Path, *, reverify: bool = False) -> StepResult:
    """The kit's sidecar tar verified and unpacked (``reverify``: unpacked again whatever the
    unpack's record says, as a first build does)."""
    # raises ChecksumMismatchError before unpacking anything
    res = unpack_sidecars(profile, data_root, force=reverify)
    exp = profile.expected.sidecars_by_source
    problems = (
        compare_totals(
            dict(res.by_source), dict(exp), "sidecars by source", profile=profile, keys=_by_source_keys(exp)
        )
        if exp
        else []
    )
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
        "MB/s": rate(res.bytes, res.seconds),
        "by_source": {"__markdown__": table},
    }
    if res.moved_aside:  # a user's files in the old folder: kept, never deleted
        md["moved_aside"] = "\n".join(res.moved_aside)
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
    found = {n: getattr(rep, n) for n in LINK_TOTALS}
    probs = compare_totals(
        found,
        {n: getattr(e, n) for n in LINK_TOTALS},
        "link check",
        profile=profile,
        keys={n: f"expected.{n}" for n in LINK_TOTALS},
    )
    if e.sidecars_by_source:
        probs += compare_totals(
            dict(rep.sidecars_by_source),
            dict(e.sidecars_by_source),
            "resolved sidecars by source",
            profile=profile,
            keys=_by_source_keys(e.sidecars_by_source),
        )
    return probs


def _by_source_keys(expected: dict[str, int]) -> dict[str, str]:
    return {s: f"expected.sidecars_by_source.{s}" for s in expected}


def step_join(profile: Profile, data_root: Path) -> StepResult:
    # the rows' text comes from these files: checked now, and held to their records as read
    # no record of an earlier join stands while this one runs: a join that stops half-way (its
    # table may be written) leaves none, and the store step refuses until one passes
    forget_checked(data_root, TRAJECTORY_JOIN)
    records = require_inputs_as_recorded(profile, data_root, "the join")
    held = {k: {rel: e[0] for rel, e in rec.entries.items() if e} for k, rec in records.items()}
    with kit_held(profile, "the join"):
        judged = checked_inputs(profile, data_root)  # before anything is read: what the record vouches for
        join = build_join_table(profile, data_root, processed_sha256=held)
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
    checks = [
        outcome(C.JOIN_HAS_NO_PROBLEMS, problems),
        outcome(C.LINK_TOTALS_MATCH_EXPECTED, link_totals_problems(profile, rep)),
    ]
    record_checked(data_root, TRAJECTORY_JOIN, judged, all(c.passed for c in checks))
    return StepResult(md, checks, (join, rep))


def step_verify_bytes(
    profile: Profile, data_root: Path, *, progress: Any = None, record: bool = True
) -> StepResult:
    """The subset byte check. A file whose bytes disagree with the kit's SHA256SUMS is one of two
    cases, told apart by the extraction record (every extracted file's sha256): the file is not
    what its verified archive gave (damaged since: the extraction's record is marked, so the next
    build extracts the cache directory again, whatever the stats say), or it is exactly what the
    pinned archive gave (re-extracting changes nothing: the kit's SHA256SUMS and the profile's
    pins disagree, and the message says so, naming both). With ``record`` (the subset_checksums
    asset's step; not the verify job's check, which writes nothing) what it judged and whether it
    passed is recorded for the store step (``steps.store_inputs.require_checked``)."""
    if record:
        forget_checked(data_root, SUBSET_CHECKSUMS)
    with kit_held(profile, "the subset byte check"):
        judged = checked_inputs(profile, data_root) if record else ""  # before anything is read
        rep = verify_subset_bytes(profile, data_root, progress=progress)
    sums = profile.kit_file("subset_checksums")
    problems = byte_problems(profile, data_root, rep) + [
        f"{p}: used by the pairs but not listed in {sums} (fix: add its sha256 line to the kit)"
        for p in rep.unlisted
    ]
    md = {
        "files": rep.files,
        "bytes": rep.bytes,
        "matched": rep.matched,
        "seconds": round(rep.seconds, 3),
        "MB/s": round(rep.bytes / 1e6 / rep.seconds, 1) if rep.seconds else None,
    }
    if record:
        record_checked(data_root, SUBSET_CHECKSUMS, judged, not problems)
    return StepResult(md, [outcome(C.SUBSET_BYTES_MATCH_SHA256SUMS, problems)], rep)


def byte_problems(profile: Profile, data_root: Path, rep: ByteReport) -> list[str]:
    """Every mismatched and missing file of a byte check, said with the fix that works (and the
    success record of what holds a damaged file cleared); then the check's other problems."""
    sums = profile.kit_file("subset_checksums")
    return (
        [_mismatch(profile, data_root, sums, *m) for m in rep.mismatched_entries]
        + [_missing(profile, data_root, sums, *m) for m in rep.missing_entries]
        + list(rep.problems)
    )


def _as_extracted(profile: Profile, data_root: Path, rel: str) -> tuple[str, str, str | None, bool] | None:
    """For a data-root path inside a cache directory of the profile: (cache key, path inside it,
    the sha256 its extraction record holds for it (None: not extracted from the archive), whether
    that record is of the archives the profile pins now); None for any other path."""
    parts = rel.split("/", 2)
    if len(parts) < 3 or parts[0] != layout.PROCESSED_DIR or parts[1] not in profile.cache_keys():
        return None
    key, inner = parts[1], parts[2]
    rec = load_extraction_record(data_root, key)
    if rec is None:
        return key, inner, None, False
    pins = {a.path: a.sha256 for a in profile.archives_by_cache_key()[key]}
    return key, inner, rec.sha256_of(inner), rec.archive_sha256 == pins and not rec.invalidated


def _damaged(data_root: Path, rel: str, key: str | None, why: str) -> str:
    """Clear the success record of what holds ``rel`` (the cache directory's extraction, or the
    sidecars' unpack): the next build makes it again. Returns the fix to print."""
    if key is not None:
        invalidate_extraction(data_root, key, f"the subset byte check found {data_root / rel} {why}")
        return f"re-run the build: it extracts {key} again from its verified archive(s)"
    if rel.startswith(f"{layout.DERIVED_DIR}/{layout.SIDECARS_DIR}/"):
        invalidate_sidecars(data_root, f"the subset byte check found {data_root / rel} {why}")
        return "re-run the build: it unpacks the kit's sidecar tar again"
    return f"restore {data_root / rel}, or check the kit's SHA256SUMS"


def _mismatch(
    profile: Profile, data_root: Path, sums: Path, rel: str, expected: str, actual: str, line: int
) -> str:
    where = f"{sums}:{line}: {data_root / rel} has sha256 {actual}, expected {expected}"
    ext = _as_extracted(profile, data_root, rel)
    if ext is not None and ext[2] == actual and ext[3]:
        key = ext[0]
        archives = ", ".join(a.path for a in profile.archives_by_cache_key()[key])
        return (
            f"{where}; the file is exactly what the pinned archive(s) {archives} hold (sha256 as "
            f"extracted, archives verified against their pins): the kit's SHA256SUMS {sums} and the "
            f"profile's pinned archives disagree (the kit and the pins come from different releases; "
            f"extracting again changes nothing) (fix: use the kit made from the pinned revision "
            f"{profile.source.revision}, or pin the revision the kit was made from and run `stage2 pin`)"
        )
    fix = _damaged(
        data_root, rel, ext[0] if ext else None, f"damaged (sha256 {actual}, SHA256SUMS says {expected})"
    )
    return f"{where}; it is not the file its archive gave (changed since) (fix: {fix})"


def _missing(profile: Profile, data_root: Path, sums: Path, rel: str, expected: str, line: int) -> str:
    where = f"{sums}:{line}: {data_root / rel} is missing"
    ext = _as_extracted(profile, data_root, rel)
    if ext is not None and ext[2] is None and ext[3]:
        return (
            f"{where}; the pinned archive(s) of {ext[0]} hold no such file: the kit's SHA256SUMS {sums} "
            f"and the profile's pinned archives disagree (fix: use the kit made from the pinned revision "
            f"{profile.source.revision}, or pin the revision the kit was made from)"
        )
    fix = _damaged(data_root, rel, ext[0] if ext else None, "missing")
    return f"{where} (fix: {fix})"
