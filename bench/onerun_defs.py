"""A measured alternative, not the product: the whole build as ONE run of one job, a cache directory
being two assets of its own (``archive_file/<key>``, ``cache_dir/<key>``) instead of a partition.

Dagster's multiprocess executor then pipelines the cache directories itself: at most
``DOWNLOADS_AT_ONCE`` download steps at once (the executor's ``tag_concurrency_limits``, inside
the run, no daemon), a cache directory's extraction as soon as its own download is over, the kit's
sidecars beside them, the store once every extraction and the kit are done. Every step runs the
product's own library step (``stage2_data.steps``) with the product's own resources, so the bytes
moved, verified and written are the product's. ``bench/bench_onerun.py`` launches it through the
instance as `stage2 build` launches its runs and compares it with `stage2 build`.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg

from stage2_assets._common import check_specs, run_step
from stage2_data import steps
from stage2_data.profile import load_profile
from stage2_pipelines.config import BuildConfig
from stage2_pipelines.definitions import build_resources
from stage2_resources import DataRootResource, HubSourceResource, ProfileResource

DOWNLOADS_AT_ONCE = int(os.environ.get("STAGE2_ONERUN_DOWNLOADS", "2"))
STEPS_AT_ONCE = int(os.environ.get("STAGE2_ONERUN_STEPS", "4"))
KIND = "stage2/kind"


def _key(name: str) -> str:
    """A cache key as an asset key's last part (Dagster allows letters, digits and _ only)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def build_defs() -> dg.Definitions:
    config = BuildConfig.from_env()
    profile = load_profile(config.profile_path, kit_root=config.kit_root)

    # (dg.asset with the product's checks, not stage_asset: that one takes the deps of the product's
    # graph, stages.READS, and here the store's inputs are the per-key assets below)
    @dg.asset(name="pinned_profile", check_specs=check_specs("pinned_profile"), group_name="acquire")
    def pinned_profile(profile: ProfileResource, data_root: DataRootResource):
        prof = profile.load()
        yield from run_step("pinned_profile", lambda: steps.step_profile(prof, data_root.root()))

    per_key: list[Any] = []
    cache_dir_keys: list[dg.AssetKey] = []
    for key in profile.cache_keys_largest_first():

        def make(key: str) -> list[Any]:
            @dg.asset(
                key=dg.AssetKey(["archive_file", _key(key)]),
                deps=[pinned_profile],
                op_tags={KIND: "download"},
                group_name="acquire",
            )
            def archive(profile: ProfileResource, hub: HubSourceResource, data_root: DataRootResource):
                prof = profile.load()
                res = steps.step_download_cache_dir(prof, hub.source(), data_root.root(), key)
                return dg.MaterializeResult(data_version=dg.DataVersion(str(res.metadata["sha256"])))

            @dg.asset(
                key=dg.AssetKey(["cache_dir", _key(key)]),
                deps=[archive],
                op_tags={KIND: "extract"},
                group_name="acquire",
            )
            def extracted(profile: ProfileResource, data_root: DataRootResource):
                prof = profile.load()
                steps.step_extract(prof, data_root.root(), key)
                return dg.MaterializeResult()

            return [archive, extracted]

        made = make(key)
        per_key += made
        cache_dir_keys.append(made[1].key)

    def plain(name: str, deps: list[Any], step: Any) -> Any:
        @dg.asset(name=name, deps=deps, check_specs=check_specs(name), group_name="store")
        def _a(profile: ProfileResource, data_root: DataRootResource):
            prof = profile.load()
            yield from run_step(name, lambda: step(prof, data_root.root()))

        return _a

    report = plain("extraction_report", cache_dir_keys, steps.step_extraction_report)
    sidecars = plain("action_sidecars", [pinned_profile], steps.step_sidecars)
    join = plain("trajectory_join", [report, sidecars], steps.step_join)
    subset = plain("subset_checksums", [report], lambda p, r: steps.step_verify_bytes(p, r))
    store = plain("vin_store", [join, subset], lambda p, r: steps.step_store(p, r))
    assets = [pinned_profile, *per_key, report, sidecars, join, subset, store]
    executor = dg.multiprocess_executor.configured(
        {
            "max_concurrent": STEPS_AT_ONCE,
            "tag_concurrency_limits": [{"key": KIND, "value": "download", "limit": DOWNLOADS_AT_ONCE}],
            "start_method": {
                "forkserver": {"preload_modules": ["dagster", "stage2_data.steps", "bench.onerun_defs"]}
            },
        }
    )
    return dg.Definitions(
        assets=assets,
        resources=build_resources(config, profile),
        jobs=[dg.define_asset_job("build", selection=dg.AssetSelection.all(), executor_def=executor)],
    )


defs = build_defs() if os.environ.get("STAGE2_PROFILE") else None
