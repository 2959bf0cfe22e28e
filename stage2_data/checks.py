"""Check names (constants) and the check outcomes every stage reports.

The Dagster layer turns each :class:`CheckOutcome` into an ``AssetCheckResult``; the CLI prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .stages import (
    ACTION_SIDECARS,
    ARCHIVE_FILE,
    CACHE_DIR,
    EXTRACTION_REPORT,
    PINNED_PROFILE,
    SUBSET_CHECKSUMS,
    TRAJECTORY_JOIN,
    VIN_STORE,
)

# pinned_profile
PROFILE_IS_PINNED = "profile_is_pinned"
PROFILE_COUNTS_MATCH_EXPECTED = "profile_counts_match_expected"
# archive_file (per cache key partition: its archives)
ARCHIVE_SHA256_MATCHES_PIN = "archive_sha256_matches_pin"
# cache_dir (per cache-key partition)
CACHE_DIR_COUNTS_CONSISTENT = "cache_dir_counts_consistent"
# extraction_report
TRAJECTORIES_MATCH_EXPECTED = "trajectories_match_expected"
CACHE_DIRS_MATCH_EXPECTED = "cache_dirs_match_expected"
NO_STRAY_ENTRIES = "no_stray_entries"
# action_sidecars
SIDECAR_TAR_SHA256_MATCHES = "sidecar_tar_sha256_matches"
SIDECARS_BY_SOURCE_MATCH_EXPECTED = "sidecars_by_source_match_expected"
# trajectory_join
JOIN_HAS_NO_PROBLEMS = "join_has_no_problems"
LINK_TOTALS_MATCH_EXPECTED = "link_totals_match_expected"
# subset_checksums
SUBSET_BYTES_MATCH_SHA256SUMS = "subset_bytes_match_sha256sums"
# vin_store
STORE_OPENS_STRICT = "store_opens_with_strict_reader"
STORE_VALIDATES = "store_validates"
STORE_COUNTS_MATCH_EXPECTED = "store_counts_match_expected"

CHECKS_BY_ASSET: dict[str, tuple[str, ...]] = {
    PINNED_PROFILE: (PROFILE_IS_PINNED, PROFILE_COUNTS_MATCH_EXPECTED),
    ARCHIVE_FILE: (ARCHIVE_SHA256_MATCHES_PIN,),
    CACHE_DIR: (CACHE_DIR_COUNTS_CONSISTENT,),
    EXTRACTION_REPORT: (TRAJECTORIES_MATCH_EXPECTED, CACHE_DIRS_MATCH_EXPECTED, NO_STRAY_ENTRIES),
    ACTION_SIDECARS: (SIDECAR_TAR_SHA256_MATCHES, SIDECARS_BY_SOURCE_MATCH_EXPECTED),
    TRAJECTORY_JOIN: (JOIN_HAS_NO_PROBLEMS, LINK_TOTALS_MATCH_EXPECTED),
    SUBSET_CHECKSUMS: (SUBSET_BYTES_MATCH_SHA256SUMS,),
    VIN_STORE: (STORE_OPENS_STRICT, STORE_VALIDATES, STORE_COUNTS_MATCH_EXPECTED),
}

# Checks that run on their own (not while the asset is materialized): the nightly verify job runs
# them over what is already on disk; `stage2 build` does the same work while it builds.
# They read, never write: the verify job is checks only (no materialization, nothing goes stale).
STORE_BYTES_MATCH_MANIFEST = "store_bytes_match_manifest"
LINKS_ON_DISK_MATCH_EXPECTED = "links_on_disk_match_expected"
SIDECARS_ON_DISK_SANE = "sidecars_on_disk_finite_and_consistent"
SUBSET_BYTES_ON_DISK_MATCH = "subset_bytes_on_disk_match_sha256sums"
STANDALONE_CHECKS: dict[str, tuple[str, ...]] = {
    TRAJECTORY_JOIN: (LINKS_ON_DISK_MATCH_EXPECTED, SIDECARS_ON_DISK_SANE),
    SUBSET_CHECKSUMS: (SUBSET_BYTES_ON_DISK_MATCH,),
    VIN_STORE: (STORE_BYTES_MATCH_MANIFEST,),
}
# The standalone checks a build records with its materialization (assets/: ``run_step``), so that
# a fresh build shows every check of every asset as run: the asset whose step does the work, over
# the same files, in the same run. Links: the join step's link check is this check's code.
# Sidecars: the join asset checks every unpacked sidecar as the unpack read it when it wrote it
# (unchanged since: inode, size, mtime, ctime) or reads it again, and says so in the result (only
# the check itself re-reads every one; a problem found also fails JOIN_HAS_NO_PROBLEMS). Subset
# bytes: the subset_checksums step is this check's code. Store bytes: the publication gate (every
# file's sha256, the fingerprint, every sample decoded) passed on the store the build published,
# which `current` now names.
RECORDED_BY_BUILD: dict[str, str] = {
    LINKS_ON_DISK_MATCH_EXPECTED: TRAJECTORY_JOIN,
    SIDECARS_ON_DISK_SANE: TRAJECTORY_JOIN,
    SUBSET_BYTES_ON_DISK_MATCH: SUBSET_CHECKSUMS,
    STORE_BYTES_MATCH_MANIFEST: VIN_STORE,
}
ALL_CHECKS_BY_ASSET: dict[str, tuple[str, ...]] = {
    a: names + STANDALONE_CHECKS.get(a, ()) for a, names in CHECKS_BY_ASSET.items()
}
"""Every check the definitions hold, per asset (what the UI shows)."""

# Checks whose failure is better explained by a later, blocking check (which names the id): a
# sidecar-count mismatch lets the join run, so that its check names the trajectory that is missing.
NON_BLOCKING: frozenset[str] = frozenset({SIDECARS_BY_SOURCE_MATCH_EXPECTED})

CHECK_DESCRIPTIONS: dict[str, str] = {
    PROFILE_IS_PINNED: "every archive has a size and sha256; the revision is a full commit",
    PROFILE_COUNTS_MATCH_EXPECTED: "archives and cache directories listed == expected.archives / expected.cache_dirs",
    ARCHIVE_SHA256_MATCHES_PIN: "the downloaded archive's sha256 and size equal the profile's pin",
    CACHE_DIR_COUNTS_CONSISTENT: "frame files == processed_dataset rows == dataset_info.total_trajectories",
    TRAJECTORIES_MATCH_EXPECTED: "sum of trajectories over cache dirs == expected.trajectories",
    CACHE_DIRS_MATCH_EXPECTED: "extracted cache directories == expected.cache_dirs, one per cache key",
    NO_STRAY_ENTRIES: "nothing in processed_datasets/ outside the expected cache directories",
    SIDECAR_TAR_SHA256_MATCHES: "the sidecar tar's sha256 equals its .sha256 file",
    SIDECARS_BY_SOURCE_MATCH_EXPECTED: "unpacked sidecars per source == expected.sidecars_by_source",
    JOIN_HAS_NO_PROBLEMS: "join by trajectory id: no duplicate, missing, unknown, leaking or mis-shaped row; "
    "every sidecar sane (actions finite, alignment indices within its raw actions, aligned rows equal to "
    "the raw rows they index)",
    LINK_TOTALS_MATCH_EXPECTED: "pair rows, unique frame files, action rows, resolved sidecars == expected",
    SUBSET_BYTES_MATCH_SHA256SUMS: "every subset frame file's bytes match SHA256SUMS",
    STORE_OPENS_STRICT: "the store re-opens with the strict reader (format, version, manifest)",
    STORE_VALIDATES: "manifest, shapes, dtypes, shards, splits and pairs validate; num_frames within "
    "max_frames, padding within its bound; every chunk's crc32c; a new store is also decoded sample by "
    "sample against its frames_sha256, padding and finite actions before it becomes current",
    STORE_COUNTS_MATCH_EXPECTED: "samples == expected.unique_frame_files and pairs == expected.pair_rows",
    LINKS_ON_DISK_MATCH_EXPECTED: "the link check re-run over what is on disk: every pair's frames file and every "
    "recovered row's sidecar exist; pair rows, frame files, action rows, resolved sidecars == expected",
    SUBSET_BYTES_ON_DISK_MATCH: "every subset frame file on disk re-hashed: its bytes match SHA256SUMS",
    SIDECARS_ON_DISK_SANE: "every unpacked sidecar re-read: actions finite, alignment indices within its raw "
    "actions, each aligned row equal to the raw row it indexes, one source index per raw row",
    STORE_BYTES_MATCH_MANIFEST: "the current store, re-read from disk: every file's sha256 equals its manifest "
    "entry, the fingerprint recomputes, every chunk passes its crc32c, and every sample decodes to its "
    "frames_sha256 with finite actions (bit rot, tampering)",
}


@dataclass
class CheckOutcome:
    name: str
    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, asset: str, partition: str | None = None) -> dict[str, Any]:
        return {
            "asset": asset,
            "partition": partition,
            "check": self.name,
            "passed": self.passed,
            "description": self.description,
        }


def outcome(name: str, problems: list[str], ok_text: str | None = None, **metadata: Any) -> CheckOutcome:
    """Passed when ``problems`` is empty; the description lists every problem (at most 20 shown)."""
    if not problems:
        return CheckOutcome(name, True, ok_text or CHECK_DESCRIPTIONS.get(name, "ok"), dict(metadata))
    shown = "; ".join(problems[:20]) + (f"; ... and {len(problems) - 20} more" if len(problems) > 20 else "")
    return CheckOutcome(name, False, shown, {"problems": len(problems), **metadata})


def compare_totals(
    found: dict[str, int],
    expected: dict[str, int],
    where: str,
    *,
    profile: Any = None,
    keys: dict[str, str] | None = None,
) -> list[str]:
    """One problem per total that differs from what the profile expects. ``keys``: the profile key
    (dotted, ``expected.trajectories``) that holds each expected total, named with the file and its
    line (``profile.where_is``), so that a wrong profile is corrected where it is wrong."""
    out = []
    for k in sorted(set(found) | set(expected)):
        f, e = found.get(k), expected.get(k)
        if f != e:
            key = (keys or {}).get(k)
            at = f": `{key}`{profile.where_is(key)}" if key and profile is not None else ""
            out.append(
                f"{where}: {k} is {f}, expected {e} (fix the data, or the profile's [expected] table "
                f"if the profile is wrong{at})"
            )
    return out
