"""The immutable VIN offline store."""

from typing import Any

import dagster as dg

from stage2_data import checks as C
from stage2_data import steps
from stage2_data.stages import VIN_STORE
from stage2_resources import DataRootResource, ProfileResource, StoreTargetResource

from ._common import check_result, run_step, stage_asset

GROUP = "store"


def build_store_assets(trajectory_join: Any, subset_checksums: Any) -> list[Any]:
    @stage_asset(
        VIN_STORE,
        group=GROUP,
        description="stores/PROFILE/current: the immutable, versioned, sharded Zarr v3 VIN offline store.",
        kind="zarr",
        deps=[trajectory_join, subset_checksums],
    )
    def vin_store(
        context: dg.AssetExecutionContext,
        profile: ProfileResource,
        data_root: DataRootResource,
        store_target: StoreTargetResource,
    ):
        prof = profile.load()
        yield from run_step(
            VIN_STORE,
            lambda: steps.step_store(
                prof,
                data_root.root(),
                store_url=store_target.url,
                storage_options=store_target.storage_options,
            ),
            # the store's data version: its folder name, a digest of its inputs
            lambda res: str(res.metadata.get("store") or "").rstrip("/").rsplit("/", 1)[-1] or None,
        )

    return [vin_store]


def build_store_checks(vin_store: Any) -> list[Any]:
    """Checks that run on their own over the published store (the nightly verify job runs them;
    the UI's Checks tab can execute them at any time); nothing is rebuilt."""

    @dg.asset_check(
        asset=vin_store,
        name=C.STORE_BYTES_MATCH_MANIFEST,
        blocking=False,
        description=C.CHECK_DESCRIPTIONS[C.STORE_BYTES_MATCH_MANIFEST],
    )
    def store_bytes_match_manifest(
        profile: ProfileResource, data_root: DataRootResource, store_target: StoreTargetResource
    ) -> dg.AssetCheckResult:
        res = steps.verify_current_store(
            profile.load(),
            data_root.root(),
            store_url=store_target.url,
            storage_options=store_target.storage_options,
        )
        return check_result(res.passed, res.description, res.metadata)

    return [store_bytes_match_manifest]
