"""The no-op build, decided before Dagster is imported.

A second ``stage2 build`` of unchanged inputs has nothing to run: every stage is up to date by
stats alone (``stage2_data.steps.status.build_status``). Deciding that costs a scandir walk and a
few ``stat`` calls; importing Dagster and opening the instance costs far more. So the CLI asks
this module first (under the data root's lock) and imports the runner only when a stage has work.

Nothing here imports Dagster (``tests/test_layering.py`` checks it); the runner uses the same
summary shapes, so a no-op answers exactly as a build whose stages all skipped, and every build's
summary (run, no-op, refused) is made by :func:`build_summary`, with one set of keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from stage2_data import layout
from stage2_data.profile import Profile
from stage2_data.stages import STAGES, Stage
from stage2_data.steps.plan import stage_reasons
from stage2_data.steps.status import store_stage_home

from .config import BuildConfig


def instance_home(data_root: Path) -> Path:
    """The Dagster instance a build of ``data_root`` records into: DAGSTER_HOME if set, else
    ``<data_root>/.dagster``."""
    return Path(os.environ.get("DAGSTER_HOME") or (Path(data_root) / ".dagster")).resolve()


def store_stage_settings(config: BuildConfig) -> dict[str, Any]:
    """What, besides the profile, the kit and the data root, changes the store stage's result."""
    return {"kit_root": config.kit_root, "store_url": config.store_url}


# Every key of a build's summary (`stage2 build --json` prints it) and its value when nothing says
# otherwise: a build that ran, a no-op build and a build refused before it ran all have these keys.
SUMMARY_DEFAULTS: dict[str, Any] = {
    "ok": False,
    "profile": None,
    "data_root": None,
    "dagster_home": None,  # the instance the runs are recorded in (None: refused before it was opened)
    "instance_shared_with": [],  # other data roots whose runs that instance records (config.shared_instance_note)
    "launched": False,  # the runs were launched through the instance (else executed in this process)
    "store": None,  # the published store (resolved), None when nothing was published
    "fingerprint": None,
    "store_update": None,  # reused, rebuilt or extended, and anything moved aside
    "moved_aside": [],
    "removed_stores": [],  # store folders the retention policy removed once the store was published
    "retention_error": None,  # why the retention policy removed nothing (a bad setting, say)
    "stopped_after": None,  # the assets of the stage the build stopped after
    "runs": [],
    "up_to_date": [],  # stages with nothing to do: not run, not in "runs"
    "checks": [],
    "errors": [],
    "ui": None,  # the command that serves the web UI over this build's instance
}


def build_summary(**given: Any) -> dict[str, Any]:
    """A build's summary: every key of :data:`SUMMARY_DEFAULTS`, ``given`` replacing the defaults
    (a key it does not know is a bug, named)."""
    unknown = set(given) - set(SUMMARY_DEFAULTS)
    if unknown:
        raise KeyError(f"not a key of a build's summary: {sorted(unknown)}")
    return {k: given.get(k, list(v) if isinstance(v, list) else v) for k, v in SUMMARY_DEFAULTS.items()}


def up_to_date_summary(stage: Stage) -> dict[str, Any]:
    """A stage not run because it had nothing to do, as a run's summary (no run id): the progress
    display counts it as the whole stage and says "up to date"; the build's summary lists it under
    ``up_to_date``, not under ``runs`` (the Dagster runs that ran)."""
    return {
        "store_metadata": {},
        "run_id": None,
        "job": stage.job,
        "success": True,
        "partition": None,
        "partitions": {},
        "selection": list(stage.assets),
        "checks": [],
        "errors": [],
        "materialized": [],
        "up_to_date": True,
    }


def published_store(data_root: Path, profile: Profile) -> tuple[str | None, str | None]:
    """The store ``current`` points at (resolved) and its fingerprint; ``(None, None)`` if none."""
    current = layout.current_store_path(data_root, profile.name)
    manifest = current / "manifest.json"
    if not manifest.is_file():
        return None, None
    try:
        fingerprint = json.loads(manifest.read_text()).get("fingerprint")
    except (OSError, ValueError):
        return None, None
    return str(current.resolve()), fingerprint


def stage_status(config: BuildConfig, profile: Profile) -> dict[str, str | None]:
    """What each stage of this build has to do (``steps.plan.stage_reasons``: None, up to date, or
    why it runs; every stage runs under ``--reverify`` or without a data root yet, the store stage
    always on object storage): what ``stage2 build --dry-run`` prints. Computed once per build,
    holding the data root's lock: the no-op answer, the stages beside the main line and the runner
    all read it."""
    return stage_reasons(
        profile,
        Path(config.data_root).resolve(),
        store_stage_settings(config),
        reverify=config.reverify,
        store_url=config.store_url,
    )


def up_to_date_build(
    config: BuildConfig, profile: Profile, status: dict[str, str | None]
) -> dict[str, Any] | None:
    """The build's summary when every stage is up to date (``status``, from :func:`stage_status`),
    else None (the build must run).

    Call it holding the data root's lock. Never a no-op: ``--reverify`` (everything runs), a store
    on object storage (its stage always runs), a data root without a published store."""
    if config.reverify or config.store_url:
        return None
    data_root = Path(config.data_root).resolve()
    if set(status) != {s.name for s in STAGES} or any(why is not None for why in status.values()):
        return None
    store, fingerprint = published_store(data_root, profile)
    if store is None:
        return None
    return build_summary(
        ok=True,
        profile=profile.name,
        data_root=str(data_root),
        # no run: the instance that recorded the runs that built it (this one may hold none)
        dagster_home=store_stage_home(data_root) or str(instance_home(data_root)),
        store=store,
        fingerprint=fingerprint,
        up_to_date=[s.name for s in STAGES],
    )
