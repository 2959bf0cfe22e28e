"""One command builds everything: every asset and every partition, recorded in the Dagster instance.

Stages (each a set of real Dagster runs on the instance at DAGSTER_HOME):
  1. pinned_profile
  2. archive_file, one run per archive partition, several at once (processes)
  3. cache_dir, one run per cache-key partition whose archives all verified
  4. extraction_report, action_sidecars, trajectory_join, subset_checksums, vin_store (one run)
A stage whose checks fail stops the stages after it; every failed check and error is reported.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .config import BuildConfig

DOWNLOADS_POOL = "downloads"  # the concurrency pool of archive_file (assets/acquisition.py)
FINAL_STAGE = ["extraction_report", "action_sidecars", "trajectory_join", "subset_checksums", "vin_store"]


INSTANCE_YAML = """\
# Written by stage2 for a local instance. One consolidated SQLite event log (WAL) instead of one
# database per run: a run costs about half as much, and the web UI and daemon read it live.
telemetry:
  enabled: false
event_log_storage:
  module: dagster._core.storage.event_log
  class: ConsolidatedSqliteEventLogStorage
  config:
    base_dir: {home}/history
"""


def write_instance_yaml(home: Path) -> None:
    """Create ``dagster.yaml`` for a local instance unless the user already has one."""
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        home.mkdir(parents=True, exist_ok=True)
        cfg.write_text(INSTANCE_YAML.format(home=home))


def ensure_instance(data_root: Path) -> Path:
    """DAGSTER_HOME if set, else <data_root>/.dagster; created with a dagster.yaml (telemetry off)."""
    home = Path(os.environ.get("DAGSTER_HOME") or (data_root / ".dagster")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    write_instance_yaml(home)
    os.environ["DAGSTER_HOME"] = str(home)
    import dagster as dg

    instance = dg.DagsterInstance.get()
    instance.get_runs(limit=1)  # create the schema once, before worker processes start
    # Create the `downloads` pool's row once, here: concurrent first runs would race to insert it
    # (a unique-key violation that aborts a run on PostgreSQL).
    init_pool = getattr(instance.event_log_storage, "initialize_concurrency_limit_to_default", None)
    if callable(init_pool):
        init_pool(DOWNLOADS_POOL)
    return home


def run_selection(
    config: dict[str, Any], selection: list[str], partition_key: str | None = None
) -> dict[str, Any]:
    """Materialize ``selection`` (and their checks) in one run; returns a picklable summary."""
    import dagster as dg

    from .definitions import build_definitions

    cfg = BuildConfig(**config)
    defs = build_definitions(cfg)
    assets: list[Any] = list(defs.assets or [])
    resources = dict(defs.resources or {})
    instance = dg.DagsterInstance.get()
    sel = dg.AssetSelection.assets(*selection)
    # STAGE2_RUN_LOG_LEVEL (set by `stage2 build` unless --verbose) quiets the run's console log; the
    # events are recorded in the instance either way.
    level = os.environ.get("STAGE2_RUN_LOG_LEVEL")
    if level:
        import logging

        logging.getLogger("stage2_data").setLevel(level)
    if cfg.executor != "in_process":  # steps elsewhere (subprocesses, Dask workers): pipelines/executors.py
        from .executors import execute_selection

        result: Any = execute_selection(config, selection, partition_key, instance, log_level=level)
    else:
        result = dg.materialize(
            assets,
            selection=sel,
            resources=resources,
            instance=instance,
            partition_key=partition_key,
            raise_on_error=False,
            tags={"stage2/cli": "build"},
            run_config={"loggers": {"console": {"config": {"log_level": level}}}} if level else None,
        )
    checks = []
    for ev in result.get_asset_check_evaluations():
        checks.append(
            {
                "asset": ev.asset_key.to_user_string() if ev.asset_key else "",
                "partition": partition_key,
                "check": ev.check_name,
                "passed": bool(ev.passed),
                "description": ev.description or "",
            }
        )
    errors = []
    for fev in result.get_step_failure_events():
        data = fev.event_specific_data
        err = getattr(data, "error", None)
        msg = err.message.strip() if err is not None else "step failed"
        msg = msg.removeprefix("dagster._core.definitions.events.Failure: ")
        errors.append({"step": fev.step_key, "partition": partition_key, "message": msg})
    materialized = sorted(
        {e.asset_key.to_user_string() for e in result.get_asset_materialization_events() if e.asset_key}
    )
    store_md: dict[str, Any] = {}
    for mev in result.get_asset_materialization_events():
        if mev.asset_key and mev.asset_key.to_user_string() == "vin_store":
            md = mev.materialization.metadata
            store_md = {k: getattr(md[k], "value", md[k]) for k in ("store", "fingerprint") if k in md}
    return {
        "store_metadata": store_md,
        "run_id": result.run_id,
        "success": bool(result.success),
        "partition": partition_key,
        "selection": selection,
        "checks": checks,
        "errors": errors,
        "materialized": materialized,
    }


def _pool_run(args: tuple[dict[str, Any], list[str], str | None]) -> dict[str, Any]:
    return run_selection(*args)


def run_partitions(
    config: dict[str, Any],
    asset: str,
    keys: list[str],
    concurrency: int,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    if not keys:
        return []
    out: list[dict[str, Any]] = []
    if concurrency <= 1 or len(keys) == 1:
        for k in keys:
            out.append(run_selection(config, [asset], k))
            if on_done:
                on_done(out[-1])
        return out
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(concurrency, len(keys)), mp_context=ctx) as pool:
        for res in pool.map(_pool_run, [(config, [asset], k) for k in keys]):
            out.append(res)
            if on_done:
                on_done(res)
    return out


def default_concurrency() -> int:
    return max(2, min(4, (os.cpu_count() or 2) * 2))


def build_all(
    config: BuildConfig,
    *,
    concurrency: int | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every stage holding the data root's lock (stage2_data/lock.py): a second build of the same
    data root is refused (DataRootLockedError naming the holder). A bad profile fails before the lock.
    Under the lock, temporary folders a killed build left behind are removed first."""
    from stage2_data.lock import data_root_lock, sweep_temp_dirs
    from stage2_data.profile import load_profile

    load_profile(config.profile_path, kit_root=config.kit_root)
    data_root = Path(config.data_root).resolve()
    with data_root_lock(data_root):
        sweep_temp_dirs(data_root)
        return _build_all(config, concurrency=concurrency, on_run=on_run)


def _build_all(
    config: BuildConfig,
    *,
    concurrency: int | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every stage; returns {ok, runs, checks, errors, store, fingerprint, dagster_home}."""
    if config.executor == "dask" and not config.dask_address:  # one local cluster for the whole build
        import dataclasses

        from .executors import local_dask_cluster

        with local_dask_cluster() as address:
            return build_all(
                dataclasses.replace(config, dask_address=address), concurrency=concurrency, on_run=on_run
            )
    from stage2_data import layout
    from stage2_data.profile import load_profile

    profile = load_profile(config.profile_path, kit_root=config.kit_root)
    data_root = Path(config.data_root).resolve()
    data_root.mkdir(parents=True, exist_ok=True)
    home = ensure_instance(data_root)
    cfg = config.to_dict()
    cfg["data_root"] = str(data_root)
    conc = concurrency or default_concurrency()
    runs: list[dict[str, Any]] = []

    def record(r: dict[str, Any]) -> None:
        runs.append(r)
        if on_run:
            on_run(r)

    record(run_selection(cfg, ["pinned_profile"]))
    stopped_at = None
    if not runs[-1]["success"]:
        stopped_at = "pinned_profile"
    else:
        # largest first: the build ends soonest (a big archive started last would run alone)
        run_partitions(cfg, "archive_file", profile.archive_paths_largest_first(), conc, record)
        failed_archives = {
            r["partition"] for r in runs if r["selection"] == ["archive_file"] and not r["success"]
        }
        by_key = profile.archives_by_cache_key()
        keys = [
            k
            for k in profile.cache_keys_largest_first()
            if not any(a.path in failed_archives for a in by_key[k])
        ]
        run_partitions(cfg, "cache_dir", keys, min(conc, 2), record)
        if any(not r["success"] for r in runs):
            stopped_at = "cache_dir" if not failed_archives else "archive_file"
        else:
            record(run_selection(cfg, FINAL_STAGE))

    checks = [c for r in runs for c in r["checks"]]
    errors = [e for r in runs for e in r["errors"]]
    ok = all(r["success"] for r in runs) and all(c["passed"] for c in checks) and stopped_at is None
    store = None
    fingerprint = None
    current = layout.current_store_path(data_root, profile.name)
    if ok and config.store_url:  # object storage: what the store asset recorded
        md: dict[str, Any] = next((r["store_metadata"] for r in runs if r.get("store_metadata")), {})
        store, fingerprint = md.get("store"), md.get("fingerprint")
    elif ok and (current / "manifest.json").is_file():
        import json

        store = str(current.resolve())
        fingerprint = json.loads((current / "manifest.json").read_text()).get("fingerprint")
    return {
        "ok": ok,
        "profile": profile.name,
        "data_root": str(data_root),
        "dagster_home": str(home),
        "store": store,
        "fingerprint": fingerprint,
        "stopped_after": stopped_at,
        "runs": [
            {k: r[k] for k in ("run_id", "success", "partition", "selection", "materialized")} for r in runs
        ],
        "checks": checks,
        "errors": errors,
    }
