"""One factory for the unpartitioned assets that run a library step over (profile, data root).

(No ``from __future__ import annotations`` here: Dagster reads the resource parameters' types.)
"""

from collections.abc import Callable
from pathlib import Path

import dagster as dg

from stage2_data.checks import CheckOutcome
from stage2_data.profile import Profile
from stage2_data.steps import StepResult
from stage2_resources import DataRootResource, ProfileResource

from ._common import run_step, stage_asset


def step_asset(
    name: str,
    *,
    group: str,
    description: str,
    kind: str,
    step: Callable[..., StepResult],
    standalone: Callable[[Profile, Path, StepResult], list[CheckOutcome]] | None = None,
    code_version: str | None = None,
    reverifies: bool = False,
) -> dg.AssetsDefinition:
    """An asset named ``name`` whose checks are ``CHECKS_BY_ASSET[name]`` and whose body is ``step``;
    ``standalone(profile, root, result)``: the results of the asset's standalone checks that the
    step's work gives (recorded with the materialization: ``run_step``); ``code_version``: its own
    (default ``CODE_VERSIONS[name]``); ``reverifies``: ``step`` takes ``reverify`` (the data root's
    ``--reverify``: it trusts none of its own records)."""
    more = {"code_version": code_version} if code_version else {}

    @stage_asset(name, group=group, description=description, kind=kind, **more)
    def _asset(context: dg.AssetExecutionContext, profile: ProfileResource, data_root: DataRootResource):
        prof = profile.load()
        root = data_root.root()
        yield from run_step(
            name,
            lambda: step(prof, root, reverify=data_root.reverify) if reverifies else step(prof, root),
            context=context,
            standalone=(lambda res: standalone(prof, root, res)) if standalone else None,
            data_root=root,
        )

    return _asset
