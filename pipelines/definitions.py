"""The Definitions: thin. Assets from ``stage2_assets``, resources from ``stage2_resources``, jobs from
the stage table (``stage2_data.stages``), schedules and sensors from this package.

Nothing is built at import: :func:`build_definitions` builds them for a :class:`BuildConfig`, and
``defs`` (what ``workspace.yaml`` loads, ``attribute: defs``) is built from the environment
(:meth:`BuildConfig.from_env`) when it is first asked for.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_assets import build_asset_checks, build_assets
from stage2_data.checks import CHECKS_BY_ASSET
from stage2_data.profile import Profile, load_profile
from stage2_data.stages import (
    ACQUIRE_JOB,
    EXTRACT_JOB,
    JOB_ASSETS,
    KIT_AND_STORE_JOB,
    KIT_JOB,
    PROFILE_JOB,
    STREAM_JOB,
    VERIFY_JOB,
)
from stage2_resources import (
    AlertsResource,
    DataRootResource,
    HubSourceResource,
    LoopbackHubResource,
    ProfileResource,
    StoreTargetResource,
    default_ui_url,
)

from .config import BuildConfig, check_settings
from .executors import configured_executor, executor_def
from .schedules import build_schedules
from .sensors import build_sensors

__all__ = [
    "ACQUIRE_JOB",
    "EXTRACT_JOB",
    "KIT_AND_STORE_JOB",
    "KIT_JOB",
    "PROFILE_JOB",
    "STREAM_JOB",
    "VERIFY_JOB",
    "build_definitions",
    "build_job",
    "build_resources",
    "defs_from_env",
]

JOB_DESCRIPTIONS = {
    PROFILE_JOB: "Check the pinned profile: pins complete, counts match, room for the build.",
    ACQUIRE_JOB: "Download and verify the archives of each cache key partition.",
    EXTRACT_JOB: "Extract cache-key partitions.",
    STREAM_JOB: "Download and verify the archives of a range of cache keys, then extract them (a launched "
    "build runs one per range holding at least 1 GiB, two downloading at once).",
    KIT_JOB: "Verify the kit's action sidecar tar and unpack it (needs the profile only: runs beside the downloads).",
    KIT_AND_STORE_JOB: "Check extraction, join with the action sidecars, verify bytes, build the store.",
    VERIFY_JOB: "Re-check existing data on disk without downloading, rebuilding or materializing anything "
    "(asset checks only): link totals, subset bytes, and the published store (every file re-hashed, "
    "every sample decoded).",
}


def build_resources(config: BuildConfig, profile: Profile) -> dict[str, Any]:
    src = profile.source
    pin = {
        "repo_id": src.repo_id,
        "repo_type": src.repo_type,
        "revision": src.revision,
        "token_env_var": config.token_env_var,
    }
    hub: HubSourceResource = (
        LoopbackHubResource(folder=config.hub_folder, **pin)
        if config.hub_folder
        else HubSourceResource(endpoint=config.endpoint, **pin)
    )
    return {
        "profile": ProfileResource(profile_path=str(config.profile_path), kit_root=config.kit_root),
        "hub": hub,
        "data_root": DataRootResource(path=str(Path(config.data_root).resolve()), reverify=config.reverify),
        # the UI's address set explicitly: what the UI lists as the resource's value is the link's base
        "alerts": AlertsResource(webhook_url=config.webhook_url, ui_url=default_ui_url()),
        "store_target": StoreTargetResource(
            url=config.store_url, storage_options=dict(config.store_options or {})
        ),
    }


ALL_ASSETS_JOB = "all_assets"  # only in a build's own Definitions (build_job): not a job of the UI's


def _own(assets: Any) -> dg.AssetSelection:
    """``assets`` (names or definitions) and their own checks: ``AssetSelection.assets`` would also
    take every standalone check that targets them (the verify job's)."""
    names = [a if isinstance(a, str) else a.key.to_user_string() for a in assets]
    return dg.AssetSelection.assets(*names).without_checks() | dg.AssetSelection.checks(
        *(dg.AssetCheckKey(dg.AssetKey(a), n) for a in names for n in CHECKS_BY_ASSET[a])
    )


def build_jobs(
    checks: list[Any], executor: dg.ExecutorDefinition | None = None, tags: dict[str, str] | None = None
) -> dict[str, dg.UnresolvedAssetJobDefinition]:
    """Every job of ``JOB_ASSETS`` by name. The verify job is the standalone ``checks`` only: it
    materializes nothing, so it never makes an asset stale. ``executor`` and ``tags`` (``stage2
    build``'s runs) override the Definitions' executor."""
    jobs = {}
    for name, assets in JOB_ASSETS.items():
        # the standalone checks re-read what a build's own checks just verified: the verify job only
        selection = dg.AssetSelection.checks(*checks) if name == VERIFY_JOB else _own(assets)
        jobs[name] = dg.define_asset_job(
            name, selection=selection, description=JOB_DESCRIPTIONS[name], executor_def=executor, tags=tags
        )
    return jobs


def build_definitions(
    config: BuildConfig | None = None, *, job_executor: dg.ExecutorDefinition | None = None
) -> dg.Definitions:
    config = config or BuildConfig.from_env()
    profile = load_profile(config.profile_path, kit_root=config.kit_root)
    assets = build_assets(profile)
    checks = build_asset_checks(assets)
    tags = {"stage2/executor": config.executor} if job_executor is not None else None
    jobs = build_jobs(checks, job_executor, tags)
    if job_executor is not None:  # runs executed in process (runs.execute_selection): any selection
        jobs[ALL_ASSETS_JOB] = dg.define_asset_job(
            ALL_ASSETS_JOB,
            selection=_own(assets),
            description="Every asset: a run executed in process over a selection across stages.",
            executor_def=job_executor,
            tags=tags,
        )
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        resources=build_resources(config, profile),
        jobs=list(jobs.values()),
        schedules=build_schedules(profile, jobs),
        sensors=build_sensors(profile, jobs),
        executor=configured_executor(config),  # STAGE2_EXECUTOR: where the steps run (executors.py)
    )


@functools.cache
def defs_from_env() -> dg.Definitions:
    """The Definitions for the environment's settings (``BuildConfig.from_env``), built once; a
    setting read late that holds a bad value fails the load with its named error (``check_settings``)."""
    check_settings()
    return build_definitions(BuildConfig.from_env())


def __getattr__(name: str) -> Any:
    """``defs`` (workspace.yaml's ``attribute: defs``): built on first access, not at import."""
    if name == "defs":
        return defs_from_env()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----- one run of a stage's job (stage2 build) ----------------------------------------------------
def build_job(config: dict[str, Any], job_name: str, call: str = "") -> dg.JobDefinition:
    """Reconstructor (module-level, importable in every worker): the named job ``job_name`` of the
    Definitions, with the executor named by ``config["executor"]`` (the run config configures it).
    Built afresh at every call, so a run sees the profile as it is now. ``call`` is unused here: it
    tells runs apart in Dagster's own per-process cache of reconstructed jobs."""
    del call
    cfg = BuildConfig(**config)
    return build_definitions(cfg, job_executor=executor_def(cfg.executor)).resolve_job_def(job_name)
