"""One command builds everything: every asset and every partition, recorded in the Dagster instance.

The stages and the rule for what runs next are the table in ``stage2_data.stages`` (the rebuild
sensor follows the same table); here each stage is ONE run of its named job (``JOB_ASSETS``) on the
instance at DAGSTER_HOME, whatever the executor:
  1. profile (check_profile): pinned_profile
  2. acquire (acquire_archives): archive_file, every archive partition in one run (a single-run
     backfill over the partition range), several downloads at once (threads in the step)
  3. extract (extract_cache_dirs): cache_dir, every cache key whose archives all verified, one run
  4. store (verify_kit_and_build_store): extraction_report, action_sidecars, trajectory_join,
     subset_checksums, vin_store
Each partition keeps its own materialization, data version and check results. A stage whose
checks fail stops the stages after it; every failed check and error is reported with its partition.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_assets import WORKERS_TAG
from stage2_data.checks import CHECKS_BY_ASSET
from stage2_data.profile import Profile, load_profile
from stage2_data.publish import data_root_lock, sweep_data_root
from stage2_data.stages import (
    DOWNLOADS_POOL,
    JOB_ASSETS,
    STAGES,
    STORE,
    VIN_STORE,
    Stage,
    next_stage,
    stage_of,
    stage_partitions,
)
from stage2_data.steps.status import build_status, record_store_stage

from .config import BuildConfig
from .definitions import build_job
from .executors import executor_run_config, local_dask_cluster
from .rebuild import partition_tags
from .uptodate import instance_home, published_store, store_stage_settings, up_to_date_summary
from .watch import RunWatcher

FINAL_STAGE = list(STORE.assets)  # the last stage's one run (tests and tools run it on its own)


INSTANCE_YAML = """\
# Written by stage2 for a local instance. One consolidated SQLite event log (WAL) instead of one
# database per run: a run costs about half as much, and the web UI and daemon read it live. Stored
# through one pooled engine per process with synchronous=NORMAL (pipelines/eventlog.py): events are
# stored about 4x faster than through Dagster's engine per event.
telemetry:
  enabled: false
event_log_storage:
  module: stage2_pipelines.eventlog
  class: FastSqliteEventLogStorage
  config:
    base_dir: {home}/history
# Step logs to files (the UI shows them); mirrored to the terminal only under --verbose, without
# Dagster's two helper processes per step (pipelines/computelogs.py).
compute_logs:
  module: stage2_pipelines.computelogs
  class: StepLogsToFiles
  config:
    base_dir: {home}/storage
"""


def write_instance_yaml(home: Path) -> None:
    """Create ``dagster.yaml`` for a local instance unless the user already has one."""
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        home.mkdir(parents=True, exist_ok=True)
        cfg.write_text(INSTANCE_YAML.format(home=home))


def ensure_instance(data_root: Path) -> Path:
    """DAGSTER_HOME if set, else <data_root>/.dagster; created with a dagster.yaml (telemetry off)."""
    home = instance_home(data_root)
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


def job_for(selection: list[str]) -> str:
    """The named job a run of ``selection`` belongs to: its stage's job (``stages.JOB_ASSETS``)."""
    stage = stage_of(selection)
    if set(selection) <= set(JOB_ASSETS[stage.job]):
        return stage.job
    for name, assets in JOB_ASSETS.items():
        if set(selection) <= set(assets):
            return name
    raise ValueError(f"no job holds the assets {selection}; see stage2_data.stages.JOB_ASSETS")


def run_tags(
    profile: Profile, selection: list[str], keys: list[str], workers: int | None = None
) -> dict[str, str]:
    """The tags of one run over ``keys``: one partition, or a range of them (``rebuild.partition_tags``)."""
    tags = {"stage2/cli": "build", **partition_tags(profile, stage_of(selection), keys)}
    if workers:
        tags[WORKERS_TAG] = str(workers)
    return tags


def run_selection(
    config: dict[str, Any],
    selection: list[str],
    partition_key: str | None = None,
    *,
    partition_keys: list[str] | None = None,
    workers: int | None = None,
    on_partition: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Materialize ``selection`` (and their checks) in one run of its stage's named job, on the
    configured executor: one partition (``partition_key``), several (``partition_keys``, one run over
    their range), or none. Returns a picklable summary, with the outcome of each partition.

    ``on_partition`` is called (from a watcher thread, ``watch.RunWatcher``) with a partition's
    entry (as ``partition_runs`` makes them) as soon as the run has materialized the selection for
    that partition; the summary lists those under ``reported``."""
    cfg = BuildConfig(**config)
    profile = load_profile(cfg.profile_path, kit_root=cfg.kit_root)
    keys = [partition_key] if partition_key is not None else list(partition_keys or [])
    instance = dg.DagsterInstance.get()
    # STAGE2_RUN_LOG_LEVEL (set by `stage2 build` unless --verbose) quiets the run's console log; the
    # events are recorded in the instance either way.
    level = os.environ.get("STAGE2_RUN_LOG_LEVEL")
    if level:
        logging.getLogger("stage2_data").setLevel(level)
    tags = run_tags(profile, selection, keys, workers)

    def partition_done(run_id: str, partition: str, done: list[str]) -> None:
        if on_partition is not None:
            on_partition(partition_entry(run_id, job_for(selection), selection, partition, done))

    watcher = RunWatcher(instance, selection, partition_done)
    with watcher if on_partition is not None and len(keys) > 1 else contextlib.nullcontext():
        result = execute_selection(config, selection, {**tags, **watcher.tags}, instance, log_level=level)
    evals = list(result.get_asset_check_evaluations())
    per_partition = {(e.asset_key, e.check_name) for e in evals if e.partition is not None}
    checks = []
    for ev in evals:
        if ev.partition is None and (ev.asset_key, ev.check_name) in per_partition:
            continue  # the run's summary of a check also recorded per partition
        checks.append(
            {
                "asset": ev.asset_key.to_user_string() if ev.asset_key else "",
                "partition": ev.partition,
                "check": ev.check_name,
                "passed": bool(ev.passed),
                "description": ev.description or "",
            }
        )
    errors = []
    for fev in result.get_step_failure_events():
        data = fev.event_specific_data
        err = getattr(data, "error", None)
        user = getattr(data, "user_failure_data", None)
        by_partition = getattr((user.metadata if user else {}).get("failed_partitions"), "value", None)
        if isinstance(by_partition, dict) and by_partition:
            errors += [
                {"step": fev.step_key, "partition": k, "message": m} for k, m in sorted(by_partition.items())
            ]
            continue
        msg = step_error_line(err)
        errors.append(
            {"step": fev.step_key, "partition": keys[0] if len(keys) == 1 else None, "message": msg}
        )
    mevs = [e for e in result.get_asset_materialization_events() if e.asset_key]
    materialized = sorted({e.asset_key.to_user_string() for e in mevs if e.asset_key})
    done: dict[str, set[str]] = {}
    for e in mevs:
        if e.partition is not None and e.asset_key:
            done.setdefault(e.partition, set()).add(e.asset_key.to_user_string())
    store_md: dict[str, Any] = {}
    for mev in mevs:
        if mev.asset_key and mev.asset_key.to_user_string() == VIN_STORE:
            md = mev.materialization.metadata
            store_md = {k: getattr(md[k], "value", md[k]) for k in ("store", "fingerprint") if k in md}
    return {
        "store_metadata": store_md,
        "run_id": result.run_id,
        "job": result.job_def.name,
        "success": bool(result.success),
        "partition": keys[0] if len(keys) == 1 else None,
        "partitions": {k: sorted(done.get(k, ())) for k in keys},
        "selection": selection,
        "checks": checks,
        "errors": errors,
        "materialized": materialized,
        "reported": sorted(watcher.reported),  # partitions on_partition already had
    }


def partition_entry(
    run_id: str, job: str, selection: list[str], partition: str, done: list[str]
) -> dict[str, Any]:
    """The entry of one partition of a run over several (the progress display's unit)."""
    return {
        "store_metadata": {},
        "run_id": run_id,
        "job": job,
        "success": set(selection) <= set(done),
        "partition": partition,
        "partitions": {},
        "selection": selection,
        "checks": [],
        "errors": [],
        "materialized": done,
    }


_OS_ERRORS = {  # the file system's refusals (builtins): named as such, not as a bug
    "OSError", "PermissionError", "FileNotFoundError", "FileExistsError", "IsADirectoryError",
    "NotADirectoryError",
}  # fmt: skip


def step_error_line(err: Any) -> str:
    """One line for a step's failure (a ``SerializableErrorInfo``): a ``Failure`` (a named error of
    the library) is its message; anything else escaped every guard, so it is named as such, with
    the innermost exception's type and message, never Dagster's wrapper or a traceback."""
    if err is None:
        return "step failed"
    msg = err.message.strip().removeprefix("dagster._core.definitions.events.Failure: ")
    if err.cls_name == "Failure":
        return msg
    inner = err
    while getattr(inner, "cause", None) is not None:
        inner = inner.cause
    text = " ".join(inner.message.split())[:500]
    if inner.cls_name in ("DagsterExecutionInterruptedError", "KeyboardInterrupt", "Failure"):
        return text.removeprefix("dagster._core.definitions.events.Failure: ")  # a stop; a wrapped Failure
    if inner.cls_name in _OS_ERRORS:  # the environment, not a bug: the path is in the message
        return f"{text}. Fix: check that path (permissions, free space, a file where a folder should be), then re-run"
    return (
        f"internal error: {text} (a bug: this step should have named it; the traceback is in the "
        "run's event log, `make ui`)"
    )


def execute_selection(
    config: dict[str, Any],
    selection: list[str],
    tags: dict[str, str],
    instance: dg.DagsterInstance,
    *,
    log_level: str | None = None,
) -> Any:
    """One run of ``selection`` in its stage's named job on the configured executor, recorded in
    ``instance``: the job is rebuilt in every process that executes a step (``definitions.build_job``)."""
    recon = dg.build_reconstructable_job(
        build_job.__module__,
        build_job.__name__,
        reconstructable_kwargs={
            "config": dict(config),
            "job_name": job_for(selection),
            "call": uuid.uuid4().hex,
        },
        reconstructor_working_directory=os.getcwd(),
    )
    run_config = executor_run_config(config)
    if log_level:
        run_config["loggers"] = {"console": {"config": {"log_level": log_level}}}
    # the whole job, unless asked for part of it: then those assets and their own checks (not the
    # standalone checks of the verify job)
    if set(selection) != set(JOB_ASSETS[job_for(selection)]):
        recon = recon.get_subset(
            asset_selection={dg.AssetKey(a) for a in selection},
            asset_check_selection={
                dg.AssetCheckKey(dg.AssetKey(a), n) for a in selection for n in CHECKS_BY_ASSET[a]
            },
        )
    return dg.execute_job(recon, instance, run_config=run_config, tags=tags, raise_on_error=False)


def partition_runs(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per partition of a run over several (the progress display's unit), else the run."""
    parts = run.get("partitions") or {}
    if len(parts) <= 1:
        return [run]
    return [
        {**run, "partition": k, "success": set(run["selection"]) <= set(done), "materialized": done}
        for k, done in parts.items()
    ]


def build_all(
    config: BuildConfig,
    *,
    concurrency: int | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every stage holding the data root's lock (stage2_data.publish): a second build of the same
    data root is refused (DataRootLockedError naming the holder). A bad profile fails before the lock.
    Under the lock, temporary folders a killed build left behind are removed first."""
    load_profile(config.profile_path, kit_root=config.kit_root).require_known()
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
    concurrency: int | None,
    record: Callable[[dict[str, Any]], None],
    report: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """The one run of a stage: all its partitions in one run (a single-run backfill), or its run.
    ``report`` has each partition as it finishes; ``record`` the run when it is over."""
    selection = list(stage.assets)
    keys = [p for p in partitions if p is not None]
    workers = min(concurrency, stage.max_parallel or concurrency) if concurrency else None
    run = run_selection(cfg, selection, partition_keys=keys, workers=workers, on_partition=report)
    record(run)
    return run


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
    runs: list[dict[str, Any]] = []
    up_to_date: list[str] = []  # the stages not run: nothing to do (steps.status.build_status)

    def record(r: dict[str, Any]) -> None:
        if r.get("up_to_date"):
            up_to_date.append(stage_of(r["selection"]).name)
        else:
            runs.append(r)
        if on_run:
            early = set(r.get("reported") or ())  # shown while the run went on (report)
            for part in partition_runs(r):
                if part.get("partition") not in early or not part["success"]:
                    on_run(part)

    def report(part: dict[str, Any]) -> None:
        if on_run:
            on_run(part)

    # What each stage has to do, by stats, once before the first: a stage with nothing to do is not
    # run (a Dagster run costs seconds even when every step skips its work). The stages after the
    # acquire or extract stage when it runs always run. Never skipped: anything under --reverify; the
    # store stage on object storage.
    settings = store_stage_settings(config)
    status = {} if config.reverify else build_status(profile, data_root, settings)
    failed: list[tuple[Stage, str | None]] = []
    stage: Stage | None = STAGES[0]
    while stage is not None:
        partitions = stage_partitions(stage, profile, failed)
        if not partitions:
            break
        skip = stage.name in status and status[stage.name] is None
        if skip and not (stage is STORE and config.store_url):
            record(up_to_date_summary(stage))
            stage = next_stage(stage)
            continue
        run = _run_stage(cfg, stage, partitions, concurrency, record, report)
        passed = run["success"] and not run["errors"] and all(c["passed"] for c in run["checks"])
        if stage is STORE and passed and not config.store_url:  # a failed check: not up to date next time
            record_store_stage(profile, data_root, settings)
        if stage.partitioned_by is None:
            failed += [] if run["success"] else [(stage, None)]
        else:
            failed += [(stage, p["partition"]) for p in partition_runs(run) if not p["success"]]
        stage = next_stage(stage)
    # the stage the build stopped after: the first that failed, unless nothing came after it
    first_failed = failed[0][0] if failed else None
    stopped_at = None
    if first_failed is not None and next_stage(first_failed) is not None:
        stopped_at = ",".join(first_failed.assets)

    checks = [c for r in runs for c in r["checks"]]
    errors = [e for r in runs for e in r["errors"]]
    ok = all(r["success"] for r in runs) and all(c["passed"] for c in checks) and stopped_at is None
    store = fingerprint = None
    if ok and config.store_url:  # object storage: what the store asset recorded
        md: dict[str, Any] = next((r["store_metadata"] for r in runs if r.get("store_metadata")), {})
        store, fingerprint = md.get("store"), md.get("fingerprint")
    elif ok:
        store, fingerprint = published_store(data_root, profile)
    return {
        "ok": ok,
        "profile": profile.name,
        "data_root": str(data_root),
        "dagster_home": str(home),
        "store": store,
        "fingerprint": fingerprint,
        "stopped_after": stopped_at,
        "runs": [
            {
                k: r[k]
                for k in ("run_id", "job", "success", "partition", "partitions", "selection", "materialized")
            }
            for r in runs
        ],
        "up_to_date": up_to_date,  # stages with nothing to do: not run, not in "runs"
        "checks": checks,
        "errors": errors,
    }
