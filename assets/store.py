"""The immutable VIN offline store."""

from typing import Any

import dagster as dg

from resources import DataRootResource, ProfileResource, StoreTargetResource
from stage2_data import build

from ._common import check_specs, run_step

GROUP = "store"


def build_store_assets(trajectory_join: Any, subset_checksums: Any) -> list[Any]:
    @dg.asset(
        group_name=GROUP,
        deps=[trajectory_join, subset_checksums],
        check_specs=check_specs("vin_store"),
        description="stores/PROFILE/current: the immutable, versioned, sharded Zarr v3 VIN offline store.",
        kinds={"zarr"},
    )
    def vin_store(
        context: dg.AssetExecutionContext,
        profile: ProfileResource,
        data_root: DataRootResource,
        store_target: StoreTargetResource,
    ):
        prof = profile.load()
        yield from run_step(
            "vin_store",
            lambda: build.step_store(
                prof,
                data_root.root(),
                store_url=store_target.url,
                storage_options=store_target.storage_options,
            ),
        )

    return [vin_store]
