"""Where everything is written: the data root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field


class DataRootResource(dg.ConfigurableResource):
    """The data root: archives/, processed_datasets/, derived/, tables/, reports/, stores/."""

    path: str = Field(description="absolute path of the data root")
    reverify: bool = Field(
        default=False, description="re-hash verified archives instead of trusting their record"
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
