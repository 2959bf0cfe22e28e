"""The kit: action sidecars, the join by trajectory id, byte-level subset verification."""

from typing import Any

import dagster as dg

from resources import DataRootResource, ProfileResource
from stage2_data import build

from ._common import check_specs, run_step

GROUP = "kit"


def build_kit_assets(extraction_report: Any, pinned_profile: Any) -> list[Any]:
    @dg.asset(
        group_name=GROUP,
        deps=[pinned_profile],
        check_specs=check_specs("action_sidecars"),
        description="derived/action_sidecars/: the sidecar tar unpacked after its sha256 check.",
        kinds={"npz"},
    )
    def action_sidecars(
        context: dg.AssetExecutionContext, profile: ProfileResource, data_root: DataRootResource
    ):
        prof = profile.load()
        yield from run_step("action_sidecars", lambda: build.step_sidecars(prof, data_root.root()))

    @dg.asset(
        group_name=GROUP,
        deps=[extraction_report, action_sidecars],
        check_specs=check_specs("trajectory_join"),
        description="tables/trajectory_join.parquet: trajectories x sidecars joined by stage2_trajectory_id; link check.",
        kinds={"parquet"},
    )
    def trajectory_join(
        context: dg.AssetExecutionContext, profile: ProfileResource, data_root: DataRootResource
    ):
        prof = profile.load()
        yield from run_step("trajectory_join", lambda: build.step_join(prof, data_root.root()))

    @dg.asset(
        group_name=GROUP,
        deps=[extraction_report],
        check_specs=check_specs("subset_checksums"),
        description="Every subset frame file hashed (in parallel) and compared with the kit's SHA256SUMS.",
        kinds={"sha256"},
    )
    def subset_checksums(
        context: dg.AssetExecutionContext, profile: ProfileResource, data_root: DataRootResource
    ):
        prof = profile.load()
        yield from run_step("subset_checksums", lambda: build.step_verify_bytes(prof, data_root.root()))

    return [action_sidecars, trajectory_join, subset_checksums]
