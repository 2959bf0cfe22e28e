"""Pin and acquire: the profile, one archive per partition, one extracted cache dir per cache key."""

from typing import Any

import dagster as dg

from resources import DataRootResource, HubSourceResource, ProfileResource
from stage2_data import build
from stage2_data.profile import Profile

from ._common import check_specs, run_step
from .partitions import archive_partitions, archive_to_cache_key, cache_key_partitions
from .step_asset import step_asset

GROUP = "acquire"


def build_acquisition_assets(profile: Profile) -> list[Any]:
    archives = archive_partitions(profile)
    cache_keys = cache_key_partitions(profile)

    @dg.asset(
        group_name=GROUP,
        check_specs=check_specs("pinned_profile"),
        description="The pinned profile: repo, full commit, archives with size and sha256, expected totals.",
        kinds={"toml"},
    )
    def pinned_profile(
        context: dg.AssetExecutionContext,
        profile: ProfileResource,
        hub: HubSourceResource,
        data_root: DataRootResource,
    ):
        prof = profile.load()
        if hub.revision != prof.source.revision or hub.repo_id != prof.source.repo_id:
            raise dg.Failure(
                description=(
                    f"hub resource pins {hub.repo_id}@{hub.revision} but the profile {prof.profile_path} pins "
                    f"{prof.source.repo_id}@{prof.source.revision}; configure the hub resource from the profile"
                )
            )
        yield from run_step("pinned_profile", lambda: build.step_profile(prof, data_root.root()))

    @dg.asset(
        group_name=GROUP,
        partitions_def=archives,
        deps=[pinned_profile],
        check_specs=check_specs("archive_file"),
        description="One archive file of the profile, downloaded at the pinned commit and verified against its sha256.",
        kinds={"tar"},
        pool="downloads",
    )
    def archive_file(
        context: dg.AssetExecutionContext,
        profile: ProfileResource,
        hub: HubSourceResource,
        data_root: DataRootResource,
    ):
        prof = profile.load()
        path = context.partition_key
        yield from run_step(
            "archive_file",
            lambda: build.step_download(
                prof, hub.source(), data_root.root(), path, reverify=data_root.reverify
            ),
        )

    @dg.asset(
        group_name=GROUP,
        partitions_def=cache_keys,
        deps=[dg.AssetDep(archive_file, partition_mapping=archive_to_cache_key(profile))],
        check_specs=check_specs("cache_dir"),
        description="processed_datasets/CACHE_KEY/ extracted safely from its archive (split parts read as one stream).",
        kinds={"folder"},
    )
    def cache_dir(context: dg.AssetExecutionContext, profile: ProfileResource, data_root: DataRootResource):
        prof = profile.load()
        key = context.partition_key
        yield from run_step("cache_dir", lambda: build.step_extract(prof, data_root.root(), key))

    extraction_report = step_asset(
        "extraction_report",
        group=GROUP,
        deps=[cache_dir],
        description="extraction_report.json: per cache key files, bytes, trajectories; totals vs the profile.",
        kind="json",
        step=build.step_extraction_report,
    )

    return [pinned_profile, archive_file, cache_dir, extraction_report]
