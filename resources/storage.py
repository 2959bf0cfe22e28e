"""Where everything is written: the data root."""

from __future__ import annotations

from pathlib import Path

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
