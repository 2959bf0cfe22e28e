"""The kit steps: unpack the action sidecars, join by trajectory id, verify the subset's bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import checks as C
from ..checks import compare_totals, outcome
from ..kit import LINK_TOTALS, build_join_table, link_check, unpack_sidecars, verify_subset_bytes
from ..profile import Profile
from .result import StepResult, rate


def step_sidecars(profile: Profile, data_root: Path) -> StepResult:
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
        "MB/s": rate(res.bytes, res.seconds),
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
    found = {n: getattr(rep, n) for n in LINK_TOTALS}
    probs = compare_totals(found, {n: getattr(e, n) for n in LINK_TOTALS}, "link check")
    if e.sidecars_by_source:
        probs += compare_totals(
            dict(rep.sidecars_by_source), dict(e.sidecars_by_source), "resolved sidecars by source"
        )
    return probs


def step_join(profile: Profile, data_root: Path) -> StepResult:
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
