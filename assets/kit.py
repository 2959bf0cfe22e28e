"""The kit: action sidecars, the join by trajectory id, byte-level subset verification."""

from typing import Any

import dagster as dg

from stage2_data import checks as C
from stage2_data import steps
from stage2_data.kit import link_check
from stage2_data.kit.sidecar_facts import check_sidecars_on_disk
from stage2_data.stages import ACTION_SIDECARS, SUBSET_CHECKSUMS, TRAJECTORY_JOIN
from stage2_resources import DataRootResource, ProfileResource

from ._common import check_result, standalone_check
from .step_asset import step_asset

GROUP = "kit"


def build_kit_assets(extraction_report: Any, pinned_profile: Any) -> list[Any]:
    action_sidecars = step_asset(
        ACTION_SIDECARS,
        group=GROUP,
        deps=[pinned_profile],
        description="derived/action_sidecars/: the sidecar tar unpacked after its sha256 check.",
        kind="npz",
        step=steps.step_sidecars,
    )
    trajectory_join = step_asset(
        TRAJECTORY_JOIN,
        group=GROUP,
        deps=[extraction_report, action_sidecars],
        description="tables/trajectory_join.parquet: trajectories x sidecars joined by stage2_trajectory_id; link check.",
        kind="parquet",
        step=steps.step_join,
    )
    subset_checksums = step_asset(
        SUBSET_CHECKSUMS,
        group=GROUP,
        deps=[extraction_report],
        description="Every subset frame file hashed (in parallel) and compared with the kit's SHA256SUMS.",
        kind="sha256",
        step=lambda prof, root: steps.step_verify_bytes(prof, root),
    )
    return [action_sidecars, trajectory_join, subset_checksums]


def build_kit_checks(trajectory_join: Any, subset_checksums: Any) -> list[Any]:
    """Checks that re-read the kit's data on disk and write nothing (the verify job runs them)."""

    @standalone_check(trajectory_join, C.LINKS_ON_DISK_MATCH_EXPECTED)
    def links_on_disk_match_expected(
        profile: ProfileResource, data_root: DataRootResource
    ) -> dg.AssetCheckResult:
        prof = profile.load()
        rep = link_check(prof, data_root.root())
        problems = list(rep.problems) + steps.link_totals_problems(prof, rep)
        res = C.outcome(C.LINKS_ON_DISK_MATCH_EXPECTED, problems)
        md = {
            "pair_rows": rep.pair_rows,
            "unique_frame_files": rep.unique_frame_files,
            "resolved_sidecars": rep.resolved_sidecars,
            "seconds": round(rep.seconds, 3),
        }
        return check_result(res.passed, res.description, md)

    @standalone_check(trajectory_join, C.SIDECARS_ON_DISK_SANE)
    def sidecars_on_disk_sane(data_root: DataRootResource) -> dg.AssetCheckResult:
        rep = check_sidecars_on_disk(data_root.root())
        res = C.outcome(C.SIDECARS_ON_DISK_SANE, rep.problems)
        return check_result(
            res.passed, res.description, {"sidecars": rep.files, "seconds": round(rep.seconds, 3)}
        )

    @standalone_check(subset_checksums, C.SUBSET_BYTES_ON_DISK_MATCH)
    def subset_bytes_on_disk_match(
        profile: ProfileResource, data_root: DataRootResource
    ) -> dg.AssetCheckResult:
        res = steps.step_verify_bytes(profile.load(), data_root.root())
        failed = [c for c in res.checks if not c.passed]
        desc = "; ".join(c.description for c in failed) if failed else res.checks[0].description
        return check_result(not failed, desc, res.metadata)

    return [links_on_disk_match_expected, sidecars_on_disk_sane, subset_bytes_on_disk_match]
