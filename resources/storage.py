"""Where everything is written: the data root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from stage2_data.stages import DATA_ROOT_TAG


class DataRootResource(dg.ConfigurableResource):
    """The data root: archives/, processed_datasets/, derived/, tables/, reports/, stores/."""

    path: str = Field(description="absolute path of the data root")
    reverify: bool = Field(
        default=False, description="re-hash verified archives instead of trusting their record"
    )

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Refuse a step of a run started for another data root (its ``stage2/data_root`` tag): the
        process executing the step loaded the code location with other settings, and would read and
        write another data root than the build's."""
        run = context.run
        want = run.tags.get(DATA_ROOT_TAG) if run is not None else None
        have = Path(self.path).expanduser().resolve()
        if want and Path(want).expanduser().resolve() != have:
            raise dg.Failure(
                description=(
                    f"this run was started for the data root {want}; the process of this step loaded "
                    f"the code location with {have} (a Dask worker or pod with other STAGE2_* settings, "
                    "or the UI re-executing a build's run). Fix: give that process the build's STAGE2_* "
                    "settings, or build with --run-in-process"
                )
            )

    def root(self) -> Path:
        p = Path(self.path).expanduser().resolve()
        p.mkdir(parents=True, exist_ok=True)
        return p


class StoreTargetResource(dg.ConfigurableResource):
    """Where the VIN store is written: ``<data_root>/stores`` (default) or an fsspec URL such as
    ``s3://bucket/prefix`` with storage options (e.g. ``endpoint_url``, ``key``, ``secret``)."""

    url: str | None = Field(
        default=None, description="fsspec URL of the stores root; default: <data_root>/stores"
    )
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec storage options")
