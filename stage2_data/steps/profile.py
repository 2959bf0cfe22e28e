"""The profile step: the pins are complete and the counts match, and there is room for the build."""

from __future__ import annotations

import shlex
from pathlib import Path

from .. import checks as C
from ..acquire import require_build_space
from ..checks import compare_totals, outcome
from ..fsutil import human_bytes
from ..profile import Profile
from .result import StepResult


def step_profile(profile: Profile, data_root: Path | None = None) -> StepResult:
    """With ``data_root``: raises DiskSpaceError (before any download starts) when the free disk there
    is below what the remaining downloads and the extraction need (``acquire.required_free_bytes``)."""
    if data_root is not None and not profile.unpinned():
        require_build_space(profile, data_root)
    unpinned = profile.unpinned()
    unknown = {a.path for _, a in profile.unknown_archives()}
    pin_problems = [
        f"{profile.profile_path}: archive {p!r} is marked unknown = true (a guessed name, never requested); "
        "`stage2 pin` names the closest upstream files"
        if p in unknown
        else f"{profile.profile_path}: archive {p!r} has no size/sha256"
        for p in unpinned
    ]
    pin_fix = f"run `stage2 pin {shlex.quote(str(profile.profile_path))} --write` to fill them from the hub's listing"
    if pin_problems:
        pin_problems.append(pin_fix)
    e = profile.expected
    count_problems = compare_totals(
        {"archives": len(profile.archives), "cache_dirs": len(profile.cache_keys())},
        {"archives": e.archives, "cache_dirs": e.cache_dirs},
        str(profile.profile_path),
        profile=profile,
        keys={"archives": "expected.archives", "cache_dirs": "expected.cache_dirs"},
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
            "__markdown__": "| archive | cache key | size | sha256 |\n|---|---|---:|---|\n"
            + "\n".join(
                f"| {a.path} | {a.cache_key} | {'-' if a.size is None else human_bytes(a.size)} | `{a.sha256}` |"
                for a in profile.archives
            )
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
