"""Shared glue: StepResult -> Dagster events. Nothing domain-specific lives here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg

from stage2_data.checks import CHECK_DESCRIPTIONS, CHECKS_BY_ASSET, NON_BLOCKING
from stage2_data.errors import Stage2Error
from stage2_data.steps import StepResult


def check_specs(asset: str) -> list[dg.AssetCheckSpec]:
    """Every check is blocking (a failure stops downstream assets) unless listed in NON_BLOCKING."""
    return [
        dg.AssetCheckSpec(
            name, asset=asset, blocking=name not in NON_BLOCKING, description=CHECK_DESCRIPTIONS.get(name)
        )
        for name in CHECKS_BY_ASSET[asset]
    ]


def stage_asset(name: str, *, group: str, description: str, kind: str, **asset_args: Any) -> Any:
    """``@dg.asset`` for the asset called ``name``: its checks are ``CHECKS_BY_ASSET[name]``
    (:func:`check_specs`); ``asset_args`` (deps, partitions, pool) go to ``dg.asset`` as they are."""
    return dg.asset(
        name=name,
        group_name=group,
        check_specs=check_specs(name),
        description=description,
        kinds={kind},
        **asset_args,
    )


def to_metadata(md: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in md.items():
        if v is None:
            continue
        if isinstance(v, dict) and "__markdown__" in v:
            out[k] = dg.MetadataValue.md(v["__markdown__"])
        elif isinstance(v, list | dict):
            out[k] = dg.MetadataValue.json(v)
        elif isinstance(v, str) and (k.endswith("path") or k in ("store", "table", "report", "tar")):
            out[k] = dg.MetadataValue.path(v)
        else:
            out[k] = v
    return out


def run_step(asset: str, step: Callable[[], StepResult]) -> Iterator[Any]:
    """Run a library step; on an expected failure, fail the asset's first check with the message
    (so the UI and alerts show which check and why) and fail the step with the fix."""
    try:
        res = step()
    except Stage2Error as err:
        first = CHECKS_BY_ASSET[asset][0]
        yield dg.AssetCheckResult(check_name=first, passed=False, description=str(err)[:4000])
        raise dg.Failure(description=str(err), metadata={"error": type(err).__name__}) from None
    yield dg.MaterializeResult(
        metadata=to_metadata(res.metadata),
        check_results=[
            dg.AssetCheckResult(
                check_name=c.name,
                passed=c.passed,
                description=c.description[:4000],
                metadata=to_metadata(c.metadata),
            )
            for c in res.checks
        ],
    )
