"""The Definitions: thin. Assets from assets/, resources from resources/, jobs here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from assets import build_assets
from resources import DataRootResource, HubSourceResource, LoopbackHubResource, ProfileResource
from stage2_data.profile import Profile, load_profile

from .config import BuildConfig

ACQUIRE_JOB = "acquire_archives"
EXTRACT_JOB = "extract_cache_dirs"
KIT_AND_STORE_JOB = "verify_kit_and_build_store"


def build_resources(config: BuildConfig, profile: Profile) -> dict[str, Any]:
    src = profile.source
    hub: HubSourceResource
    if config.hub_folder:
        hub = LoopbackHubResource(
            folder=config.hub_folder,
            repo_id=src.repo_id,
            repo_type=src.repo_type,
            revision=src.revision,
            token_env_var=config.token_env_var,
        )
    else:
        hub = HubSourceResource(
            repo_id=src.repo_id,
            repo_type=src.repo_type,
            revision=src.revision,
            endpoint=config.endpoint,
            token_env_var=config.token_env_var,
        )
    return {
        "profile": ProfileResource(profile_path=str(config.profile_path), kit_root=config.kit_root),
        "hub": hub,
        "data_root": DataRootResource(path=str(Path(config.data_root).resolve()), reverify=config.reverify),
    }


def build_definitions(config: BuildConfig | None = None) -> dg.Definitions:
    config = config or BuildConfig.from_env()
    profile = load_profile(config.profile_path, kit_root=config.kit_root)
    assets = build_assets(profile)
    jobs = [
        dg.define_asset_job(ACQUIRE_JOB, selection=dg.AssetSelection.assets("archive_file"),
                            description="Download and verify archive partitions."),
        dg.define_asset_job(EXTRACT_JOB, selection=dg.AssetSelection.assets("cache_dir"),
                            description="Extract cache-key partitions."),
        dg.define_asset_job(
            KIT_AND_STORE_JOB,
            selection=dg.AssetSelection.assets(
                "pinned_profile", "extraction_report", "action_sidecars", "trajectory_join", "subset_checksums",
                "vin_store",
            ),
            description="Check extraction, unpack sidecars, join, verify bytes, build the store.",
        ),
    ]
    return dg.Definitions(assets=assets, resources=build_resources(config, profile), jobs=jobs)


defs = build_definitions()
