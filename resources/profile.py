"""The pinned profile and its kit."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field

from stage2_data.profile import Profile, load_profile


class ProfileResource(dg.ConfigurableResource):
    """A profile file (``manifests/*.toml``) and the kit root its kit paths are relative to."""

    profile_path: str = Field(description="path of the profile .toml")
    kit_root: str | None = Field(
        default=None, description="kit root; default: the folder holding the profile"
    )

    def load(self) -> Profile:
        return load_profile(Path(self.profile_path), kit_root=Path(self.kit_root) if self.kit_root else None)
