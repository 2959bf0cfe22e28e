"""One factory for the unpartitioned assets that run a library step over (profile, data root).

(No ``from __future__ import annotations`` here: Dagster reads the resource parameters' types.)
"""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_data.profile import Profile
from stage2_data.steps import StepResult
from stage2_resources import DataRootResource, ProfileResource

from ._common import run_step, stage_asset


def step_asset(
    name: str,
    *,
    group: str,
    deps: Sequence[Any],
    description: str,
    kind: str,
    step: Callable[[Profile, Path], StepResult],
) -> dg.AssetsDefinition:
    """An asset named ``name`` whose checks are ``CHECKS_BY_ASSET[name]`` and whose body is ``step``."""

    @stage_asset(name, group=group, description=description, kind=kind, deps=list(deps))
    def _asset(context: dg.AssetExecutionContext, profile: ProfileResource, data_root: DataRootResource):
        prof = profile.load()
        yield from run_step(name, lambda: step(prof, data_root.root()))

    return _asset
