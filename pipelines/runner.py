"""One command builds everything: every asset and every partition, recorded in the Dagster instance.

The stages and the rule for what runs next are the table in ``stage2_data.stages`` (the rebuild
sensor follows the same table); here they run as real Dagster runs on the instance at DAGSTER_HOME:
  1. profile: pinned_profile
  2. acquire: archive_file, one run per archive partition, several at once (processes)
  3. extract: cache_dir, one run per cache-key partition whose archives all verified
  4. store: extraction_report, action_sidecars, trajectory_join, subset_checksums, vin_store (one run)
A stage whose checks fail stops the stages after it; every failed check and error is reported.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_data import layout
from stage2_data.profile import load_profile
from stage2_data.publish import data_root_lock, sweep_data_root
from stage2_data.stages import DOWNLOADS_POOL, STAGES, STORE, VIN_STORE, Stage, next_stage, stage_partitions

from .config import BuildConfig
from .definitions import build_definitions, build_job
from .executors import executor_run_config, local_dask_cluster

FINAL_STAGE = list(STORE.assets)  # the last stage's one run (tests and tools run it on its own)


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
        logging.getLogger("stage2_data").setLevel(level)
    if cfg.executor != "in_process":  # steps elsewhere (subprocesses, Dask workers): executors.py
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
        if mev.asset_key and mev.asset_key.to_user_string() == VIN_STORE:
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


def execute_selection(
    config: dict[str, Any],
    selection: list[str],
    partition_key: str | None,
    instance: dg.DagsterInstance,
    *,
    log_level: str | None = None,
) -> Any:
    """One run of ``selection`` (one partition) on the configured executor, recorded in ``instance``:
    the job is rebuilt in every process that executes a step (``definitions.build_job``)."""
    recon = dg.build_reconstructable_job(
        build_job.__module__,
        build_job.__name__,
        reconstructable_kwargs={"config": dict(config), "selection": list(selection)},
        reconstructor_working_directory=os.getcwd(),
    )
    tags = {"stage2/cli": "build"}
    if partition_key is not None:
        tags["dagster/partition"] = partition_key
    run_config = executor_run_config(config)
    if log_level:
        run_config["loggers"] = {"console": {"config": {"log_level": log_level}}}
    return dg.execute_job(recon, instance, run_config=run_config, tags=tags, raise_on_error=False)


def _pool_run(args: tuple[dict[str, Any], list[str], str | None]) -> dict[str, Any]:
    return run_selection(*args)


def run_partitions(
    config: dict[str, Any],
    selection: list[str],
    keys: list[str],
    concurrency: int,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """One run of ``selection`` per partition key, ``concurrency`` at once (spawned processes)."""
    if not keys:
        return []
    out: list[dict[str, Any]] = []
    if concurrency <= 1 or len(keys) == 1:
        for k in keys:
            out.append(run_selection(config, selection, k))
            if on_done:
                on_done(out[-1])
        return out
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(concurrency, len(keys)), mp_context=ctx) as pool:
        for res in pool.map(_pool_run, [(config, selection, k) for k in keys]):
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
    """Run every stage holding the data root's lock (stage2_data.publish): a second build of the same
    data root is refused (DataRootLockedError naming the holder). A bad profile fails before the lock.
    Under the lock, temporary folders a killed build left behind are removed first."""
    load_profile(config.profile_path, kit_root=config.kit_root)
    data_root = Path(config.data_root).resolve()
    with data_root_lock(data_root):
        sweep_data_root(data_root)
        if config.executor == "dask" and not config.dask_address:  # one local cluster for the build
            with local_dask_cluster() as address:
                config = dataclasses.replace(config, dask_address=address)
                return _build_all(config, concurrency=concurrency, on_run=on_run)
        return _build_all(config, concurrency=concurrency, on_run=on_run)


def _run_stage(
    cfg: dict[str, Any],
    stage: Stage,
    partitions: list[str | None],
    concurrency: int,
    record: Callable[[dict[str, Any]], None],
) -> list[dict[str, Any]]:
    """The runs of one stage: one per partition (at most ``stage.max_parallel`` at once), or one."""
    selection = list(stage.assets)
    if stage.partitioned_by is None:
        runs = [run_selection(cfg, selection)]
        record(runs[0])
        return runs
    keys = [p for p in partitions if p is not None]
    return run_partitions(cfg, selection, keys, min(concurrency, stage.max_parallel or concurrency), record)


def _build_all(
    config: BuildConfig,
    *,
    concurrency: int | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every stage; returns {ok, runs, checks, errors, store, fingerprint, dagster_home}."""
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

    failed: list[tuple[Stage, str | None]] = []
    stage: Stage | None = STAGES[0]
    while stage is not None:
        partitions = stage_partitions(stage, profile, failed)
        if not partitions:
            break
        for r in _run_stage(cfg, stage, partitions, conc, record):
            if not r["success"]:
                failed.append((stage, r["partition"]))
        stage = next_stage(stage)
    # the stage the build stopped after: the first that failed, unless nothing came after it
    first_failed = failed[0][0] if failed else None
    stopped_at = None
    if first_failed is not None and next_stage(first_failed) is not None:
        stopped_at = ",".join(first_failed.assets)

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
