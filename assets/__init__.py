"""Software-defined assets: thin wrappers over ``stage2_data.steps``, one module per domain.

Installed as ``stage2_assets``; asset names come from ``stage2_data.stages``."""

from __future__ import annotations

from typing import Any

from stage2_data import steps
from stage2_data.profile import Profile
from stage2_data.stages import SUBSET_CHECKSUMS, TRAJECTORY_JOIN, VIN_STORE

from ._common import WORKERS_TAG as WORKERS_TAG
from .acquisition import build_acquisition_assets
from .kit import build_kit_assets, build_kit_checks
from .store import build_store_assets, build_store_checks


def build_assets(profile: Profile) -> list[Any]:
    """The whole graph for one profile (partitions come from the profile's archives and cache keys)."""
    pinned_profile, archive_file, cache_dir, extraction_report = build_acquisition_assets(profile)
    # what the join, the byte check and the store read of the kit: in their code versions (hashed
    # once per load of the definitions)
    kit = steps.kit_digest(profile)
    action_sidecars, trajectory_join, subset_checksums = build_kit_assets(kit)
    (vin_store,) = build_store_assets(profile, kit)
    return [
        pinned_profile,
        archive_file,
        cache_dir,
        extraction_report,
        action_sidecars,
        trajectory_join,
        subset_checksums,
        vin_store,
    ]


def build_asset_checks(assets: list[Any]) -> list[Any]:
    """The checks that run on their own (over what is on disk), for the graph ``build_assets`` made."""
    by_name = {a.key.to_user_string(): a for a in assets}
    return build_kit_checks(by_name[TRAJECTORY_JOIN], by_name[SUBSET_CHECKSUMS]) + build_store_checks(
        by_name[VIN_STORE]
    )
