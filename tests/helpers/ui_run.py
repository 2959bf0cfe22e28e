"""One asset materialized as the UI's Materialize button runs it: the definitions' implicit asset job,
executed directly in the test's process (no build, no build's lock), into the current
``DAGSTER_HOME``'s instance."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def materialize(
    profile: Path,
    root: Path,
    url: str,
    asset: str,
    partition: str | None,
    tags: dict[str, str] | None = None,
) -> Any:
    """One run of ``asset`` (of ``partition``, with ``tags``) over ``profile`` and the data root
    ``root``, the hub at ``url``; the run's result (``raise_on_error=False``: a failed run is
    returned, not raised)."""
    import dagster as dg

    from stage2_pipelines.config import BuildConfig
    from stage2_pipelines.definitions import build_definitions

    defs = build_definitions(BuildConfig(profile_path=str(profile), data_root=str(root), endpoint=url))
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=dg.DagsterInstance.get(),
        asset_selection=[dg.AssetKey(asset)],
        partition_key=partition,
        raise_on_error=False,
        tags=tags,
    )
