"""The kit: action sidecars, the join by trajectory id, byte-level subset verification."""

from typing import Any

from stage2_data import build

from .step_asset import step_asset

GROUP = "kit"


def build_kit_assets(extraction_report: Any, pinned_profile: Any) -> list[Any]:
    action_sidecars = step_asset(
        "action_sidecars",
        group=GROUP,
        deps=[pinned_profile],
        description="derived/action_sidecars/: the sidecar tar unpacked after its sha256 check.",
        kind="npz",
        step=build.step_sidecars,
    )
    trajectory_join = step_asset(
        "trajectory_join",
        group=GROUP,
        deps=[extraction_report, action_sidecars],
        description="tables/trajectory_join.parquet: trajectories x sidecars joined by stage2_trajectory_id; link check.",
        kind="parquet",
        step=build.step_join,
    )
    subset_checksums = step_asset(
        "subset_checksums",
        group=GROUP,
        deps=[extraction_report],
        description="Every subset frame file hashed (in parallel) and compared with the kit's SHA256SUMS.",
        kind="sha256",
        step=lambda prof, root: build.step_verify_bytes(prof, root),
    )
    return [action_sidecars, trajectory_join, subset_checksums]
