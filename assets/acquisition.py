"""Pin and acquire: the profile, then per cache key (one partition) its archives and its extracted
cache dir."""

import hashlib
from typing import Any

import dagster as dg

from stage2_data import steps
from stage2_data.profile import Profile
from stage2_data.stages import (
    ARCHIVE_FILE,
    CACHE_DIR,
    DOWNLOADS_POOL,
    EXTRACT,
    EXTRACTION_REPORT,
    PINNED_PROFILE,
)
from stage2_resources import DataRootResource, HubSourceResource, ProfileResource

from ._common import (
    CODE_VERSIONS,
    code_version_with,
    default_workers,
    partition_workers,
    run_partitions,
    run_step,
    selected_partitions,
    stage_asset,
)
from .partitions import cache_key_partitions
from .step_asset import step_asset

GROUP = "acquire"


# The profile asset's data version: the same for every profile. What reads the profile is marked
# stale by its own data versions (an archive's: its pinned sha256s), which a build refreshes only
# where something changed; a data version that followed every profile edit would leave assets a
# build rightly skipped marked stale for ever.
PROFILE_DATA_VERSION = "profile-1"


def build_acquisition_assets(profile: Profile) -> list[Any]:
    cache_keys = cache_key_partitions(profile)

    @stage_asset(
        PINNED_PROFILE,
        group=GROUP,
        description=(
            "The pinned profile: repo, full commit, archives with size and sha256, expected totals. "
            "Its code version ends with a digest of the profile: after an edit of the profile and a "
            "reload of the code location it is marked stale (code version changed) until it is "
            "materialized again (a build of the edited profile does)."
        ),
        kind="toml",
        # what the profile pins and expects (its TOML as `stage2 pin --write` writes it), the
        # free-text description left out
        code_version=code_version_with(
            PINNED_PROFILE, profile.model_copy(update={"description": ""}).to_toml()
        ),
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
        root = data_root.root()
        yield from run_step(
            PINNED_PROFILE,
            lambda: steps.step_profile(prof, root),
            lambda _: PROFILE_DATA_VERSION,
            context=context,
            data_root=root,
        )

    @stage_asset(
        ARCHIVE_FILE,
        group=GROUP,
        description=(
            "The archive files of one cache key (its split parts, or its one tar), downloaded at the "
            "pinned commit and each verified against its sha256."
        ),
        kind="tar",
        partitions_def=cache_keys,
        pool=DOWNLOADS_POOL,
    )
    def archive_file(
        context: dg.AssetExecutionContext,
        profile: ProfileResource,
        hub: HubSourceResource,
        data_root: DataRootResource,
    ):
        prof = profile.load()
        source, root = hub.source(), data_root.root()
        # a partition's data version is a digest of its archives' sha256 (what the step verified)
        yield from run_partitions(
            context,
            ARCHIVE_FILE,
            selected_partitions(context, prof.cache_keys_largest_first()),
            lambda key: steps.step_download_cache_dir(prof, source, root, key, reverify=data_root.reverify),
            lambda _key, res: str(res.metadata["sha256"]),
            partition_workers(context, default_workers("download")),
            lambda _key: {PINNED_PROFILE: [None]},
        )

    @stage_asset(
        CACHE_DIR,
        group=GROUP,
        description="processed_datasets/CACHE_KEY/ extracted safely from its archive (split parts read as one stream).",
        kind="folder",
        partitions_def=cache_keys,
    )
    def cache_dir(context: dg.AssetExecutionContext, profile: ProfileResource, data_root: DataRootResource):
        prof = profile.load()
        root = data_root.root()
        by_key = prof.archives_by_cache_key()

        def version(key: str, _res: Any) -> str:
            """A cache dir's data version: its archives' sha256 and the extractor's code version."""
            h = hashlib.sha256(f"extractor {CODE_VERSIONS[CACHE_DIR]}\n".encode())
            for a in sorted(by_key[key], key=lambda a: a.path):
                h.update(f"{a.path} {a.sha256}\n".encode())
            return h.hexdigest()

        keys = selected_partitions(context, prof.cache_keys_largest_first())

        yield from run_partitions(
            context,
            CACHE_DIR,
            keys,
            # --reverify: extracted again from the archives, whatever the extraction record says
            lambda key: steps.step_extract(prof, root, key, force=data_root.reverify),
            version,
            partition_workers(context, min(default_workers("extract"), EXTRACT.max_parallel or 1)),
            lambda key: {ARCHIVE_FILE: [key]},
        )

    extraction_report = step_asset(
        EXTRACTION_REPORT,
        group=GROUP,
        description="extraction_report.json: per cache key files, bytes, trajectories; totals vs the profile.",
        kind="json",
        step=steps.step_extraction_report,
    )

    return [pinned_profile, archive_file, cache_dir, extraction_report]
