"""The kit: action sidecars, the join by trajectory id, byte-level subset verification."""

from typing import Any

from stage2_data import steps
from stage2_data.stages import ACTION_SIDECARS, SUBSET_CHECKSUMS, TRAJECTORY_JOIN

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
