"""The Definitions: thin. Assets from assets/, resources from resources/, jobs here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from assets import build_asset_checks, build_assets
from resources import (
    AlertsResource,
    DataRootResource,
    HubSourceResource,
    LoopbackHubResource,
    ProfileResource,
    StoreTargetResource,
)
from stage2_data.profile import Profile, load_profile

from .config import BuildConfig
from .executors import configured_executor
from .schedules import build_schedules
from .sensors import build_sensors

ACQUIRE_JOB = "acquire_archives"
EXTRACT_JOB = "extract_cache_dirs"
KIT_AND_STORE_JOB = "verify_kit_and_build_store"
VERIFY_JOB = "verify_existing_data"


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
        "alerts": AlertsResource(webhook_url=config.webhook_url),
        "store_target": StoreTargetResource(
            url=config.store_url, storage_options=dict(config.store_options or {})
        ),
    }


def build_definitions(config: BuildConfig | None = None) -> dg.Definitions:
    config = config or BuildConfig.from_env()
    profile = load_profile(config.profile_path, kit_root=config.kit_root)
    assets = build_assets(profile)
    acquire = dg.define_asset_job(
        ACQUIRE_JOB,
        selection=dg.AssetSelection.assets("archive_file"),
        description="Download and verify archive partitions.",
    )
    extract = dg.define_asset_job(
        EXTRACT_JOB,
        selection=dg.AssetSelection.assets("cache_dir"),
        description="Extract cache-key partitions.",
    )
    kit_and_store = dg.define_asset_job(
        KIT_AND_STORE_JOB,
        selection=dg.AssetSelection.assets(
            "pinned_profile",
            "extraction_report",
            "action_sidecars",
            "trajectory_join",
            "subset_checksums",
            "vin_store",
        ),
        description="Check extraction, unpack sidecars, join, verify bytes, build the store.",
    )
    checks = build_asset_checks(assets)
    verify = dg.define_asset_job(
        VERIFY_JOB,
        selection=dg.AssetSelection.assets("extraction_report", "trajectory_join", "subset_checksums")
        | dg.AssetSelection.checks(*checks),
        description="Re-check existing data on disk without downloading or rebuilding: counts, join, link "
        "totals, subset bytes, and the published store (every file re-hashed, every sample decoded).",
    )
    jobs = {"acquire": acquire, "extract": extract, "kit_and_store": kit_and_store, "verify": verify}
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        resources=build_resources(config, profile),
        jobs=list(jobs.values()),
        schedules=build_schedules(profile, jobs),
        sensors=build_sensors(profile, jobs),
        executor=configured_executor(config),  # STAGE2_EXECUTOR: where the steps run (executors.py)
    )


defs = build_definitions()
