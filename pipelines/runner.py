"""One command builds everything: every asset and every partition, as runs of the project's code
location recorded in the Dagster instance.

The stages and the rule for what runs next are the table in ``stage2_data.stages`` (the rebuild
sensor follows the same table); each run is a run of a named job (``JOB_ASSETS``) on the instance
at DAGSTER_HOME, whatever the executor, started once the stages it needs are over
(:func:`walk_stages`). Each run is launched through the instance against a code server the build
starts (``launch.CodeServer``), so the UI lists it on its job's page and can re-execute it:
  1. profile (check_profile): pinned_profile
  2.+4. acquire and extract, streamed (download_and_extract): one run per range of cache keys
     holding at least 1 GiB of archives (``stages.stream_groups``), its archive_file then its
     cache_dir, two runs downloading at once (:func:`stream_cache_keys`): the next range is
     launched as soon as a range's downloads are over, so that it downloads while that one extracts
  3. kit (unpack_action_sidecars): action_sidecars; it needs the profile only, so its run goes on
     beside stages 2 and 4
  5. store (verify_kit_and_build_store): extraction_report, trajectory_join, subset_checksums, vin_store
With ``run_in_process`` (``--run-in-process``) or ``--concurrency 1`` the runs go one after another,
one run per stage: acquire_archives over every cache key (a single-run backfill over the partition
range), then extract_cache_dirs over every cache key whose archives all verified.
Each partition keeps its own materialization, data version and check results. A stage whose
checks fail stops the stages after it; every failed check and error is reported with its partition.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_data.errors import CODE_ERRORS
from stage2_data.oserrors import fs_guard
from stage2_data.profile import load_profile
from stage2_data.publish import data_root_lock, sweep_data_root
from stage2_data.stages import (
    ACQUIRE,
    DATA_ROOT_TAG,
    DOWNLOADS_POOL,
    EXTRACT,
    STAGES,
    STORE,
    STREAMED,
    Stage,
    ready_stages,
    stage_of,
    stage_partitions,
    stages_after,
    stream_groups,
)
from stage2_data.steps.status import (
    clear_failed_checks,
    clear_store_records,
    kit_fingerprint,
    record_store_stage,
)

from .config import BuildConfig, check_dagster_home, stream_run_bytes, write_instance_yaml
from .executors import local_dask_cluster
from .launch import RUNS_CONSOLE_LOG, CodeServer, free_port, logs_dir, queued_warn_seconds, terminate_runs
from .runs import other_data_roots, partition_runs, run_selection
from .uptodate import (
    build_summary,
    instance_home,
    published_store,
    stage_status,
    store_stage_settings,
    up_to_date_summary,
)

#: in an instance's folder: held while a build writes its dagster.yaml and creates its schema
INSTANCE_LOCK = ".stage2-instance.lock"


@contextlib.contextmanager
def _instance_lock(home: Path) -> Iterator[None]:
    """One build at a time sets up the instance in ``home``: builds of two data roots may share one
    ``DAGSTER_HOME``, and two processes creating a new SQLite instance's tables at once fail (a
    table "already exists") or leave its schedule storage stamped twice, which no later build can
    open. Held for the set-up only; the runs share the instance as Dagster intends."""
    with open(home / INSTANCE_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def open_instance(data_root: Path) -> tuple[Path, dg.DagsterInstance]:
    """:func:`ensure_instance`, and the instance, which a build's runs in this process share (opening
    one reads its config and checks its three storages' schemas: once a build, not once a run)."""
    home = instance_home(data_root)
    check_dagster_home(data_root)  # a file there: named, its fix changes the setting, not the file
    with fs_guard("setting up the Dagster instance"):  # a read-only or full disk: named, exit 2
        return home, _set_up_instance(home)


def _set_up_instance(home: Path) -> dg.DagsterInstance:
    """The instance at ``home``, its folder, ``dagster.yaml`` and schema made once (under its lock)."""
    home.mkdir(parents=True, exist_ok=True)
    with _instance_lock(home):
        write_instance_yaml(home)
        os.environ["DAGSTER_HOME"] = str(home)
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)  # create the schema once, before worker processes start
        # Create the `downloads` pool's row once, here: concurrent first runs would race to insert
        # it (a unique-key violation that aborts a run on PostgreSQL). Only when it is missing:
        # over an existing row Dagster's initializer catches the violation, then updates inside
        # the transaction PostgreSQL has aborted (every later build failed there).
        storage = instance.event_log_storage
        if (
            storage.supports_global_concurrency_limits
            and DOWNLOADS_POOL not in storage.get_concurrency_keys()
        ):
            storage.initialize_concurrency_limit_to_default(DOWNLOADS_POOL)
    return instance


def _shared_with(instance: dg.DagsterInstance, home: Path, data_root: Path) -> list[str]:
    """The other data roots whose runs the build's instance records (``runs.other_data_roots``).
    A hint: when the run storage cannot be read for it, none (the build's own runs were read
    already)."""
    try:
        return other_data_roots(instance, home, data_root)
    except CODE_ERRORS:
        raise
    except Exception:  # noqa: BLE001 - a database gone for a moment fails no build that succeeded
        return []


def started_runs(data_root: Path, since: float) -> list[dict[str, Any]]:
    """The runs over ``data_root`` (its ``stage2/data_root`` tag) that the instance at DAGSTER_HOME
    created since ``since`` (a ``time.time()``), oldest first, each as a summary's run entry with
    its status: what a stopped build started, canceled or not."""
    instance = dg.DagsterInstance.get()
    after = datetime.fromtimestamp(since, tz=UTC)
    tag = {DATA_ROOT_TAG: str(Path(data_root).resolve())}
    records = instance.get_run_records(filters=dg.RunsFilter(tags=tag, created_after=after))
    return [
        {
            "store_metadata": {},
            "run_id": r.dagster_run.run_id,
            "job": r.dagster_run.job_name,
            "success": r.dagster_run.status == dg.DagsterRunStatus.SUCCESS,
            "status": r.dagster_run.status.value,
            "partition": r.dagster_run.tags.get("dagster/partition"),
            "partitions": {},
            "selection": [],
            "checks": [],
            "errors": [],
            "materialized": [],
        }
        for r in sorted(records, key=lambda r: r.create_timestamp)
    ]


def build_all(
    config: BuildConfig,
    *,
    concurrency: int | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    status: dict[str, str | None] | None = None,
    run_in_process: bool | None = None,
) -> dict[str, Any]:
    """Run every stage holding the data root's lock (stage2_data.publish): a second build of the same
    data root is refused (DataRootLockedError naming the holder). A bad profile fails before the lock.
    Under the lock, temporary folders a killed build left behind are removed first.
    ``run_in_process``: execute the runs in this process rather than launch them through the
    instance (None: ``$STAGE2_RUN_IN_PROCESS``)."""
    if run_in_process is None:
        run_in_process = os.environ.get("STAGE2_RUN_IN_PROCESS", "") not in ("", "0")
    load_profile(config.profile_path, kit_root=config.kit_root).require_known()
    # a setting that does not parse is named before anything runs
    stream_run_bytes()
    queued_warn_seconds()
    data_root = Path(config.data_root).resolve()
    with data_root_lock(data_root):
        sweep_data_root(data_root)
        if config.executor == "dask" and not config.dask_address:  # one local cluster for the build
            # its address is chosen first: its workers load the code location (a launched run's
            # steps) from the build's settings, the address among them
            config = dataclasses.replace(config, dask_address=f"tcp://127.0.0.1:{free_port()}")
            with local_dask_cluster(config.dask_address, env=config.to_env()):
                return _build_all(
                    config, concurrency=concurrency, on_run=on_run, status=status, in_process=run_in_process
                )
        return _build_all(
            config, concurrency=concurrency, on_run=on_run, status=status, in_process=run_in_process
        )


def stage_workers(stage: Stage, concurrency: int | None) -> int | None:
    """How many partitions a stage's run works on at once: the build's ``--concurrency``, at most the
    stage's ``max_parallel`` (None: the run's default)."""
    return min(concurrency, stage.max_parallel or concurrency) if concurrency else None


# How many streamed runs a launched build has going at once when --concurrency does not say: one
# extracting while the next downloads.
STREAM_SLOTS = 2


def stream_cache_keys(
    cfg: dict[str, Any],
    groups: list[list[str]],
    slots: int,
    record: Callable[[dict[str, Any]], None],
    instance: dg.DagsterInstance,
    server: CodeServer,
) -> None:
    """The streamed stages (``stages.STREAMED``) as one launched run of ``STREAM_JOB`` per group of
    cache keys (``stages.stream_groups``, largest first), at most ``slots`` of them downloading at
    once: in each run Dagster extracts the group's keys once their archives verified, and the next
    run is launched as soon as a run's downloads are over (:func:`stream_runs`). ``record`` has each
    run's summary as the run ends (:func:`stream_parts` splits it by stage)."""
    selection = [a for s in STREAMED for a in s.assets]

    def run(keys: list[str], downloaded: Callable[[], None]) -> dict[str, Any]:
        return run_selection(
            cfg, selection, partition_keys=keys, on_first=downloaded, instance=instance, server=server
        )

    stream_runs(groups, slots, run, record)


def stream_runs(
    groups: list[list[str]],
    slots: int,
    run: Callable[[list[str], Callable[[], None]], dict[str, Any]],
    record: Callable[[dict[str, Any]], None],
    *,
    poll: float = 0.2,
) -> None:
    """``run(keys, downloaded)`` for every group, in order, each in a thread of its own, started
    while fewer than ``slots`` started runs are still downloading: a run downloads until it calls
    ``downloaded()`` or ends. So the link never waits for an extraction: the next range downloads
    while the last one extracts (at most ``2 * slots`` runs at once). ``record`` has each run's
    result as it ends. The wait stays in this thread: a stop interrupts it at once, and the build
    then cancels the runs (``_build_all``)."""
    queue = list(groups)
    downloading: set[int] = set()
    lock = threading.Lock()

    def over(i: int) -> None:
        with lock:
            downloading.discard(i)

    def one(i: int, keys: list[str]) -> dict[str, Any]:
        try:
            return run(keys, lambda: over(i))
        finally:
            over(i)

    pool = ThreadPoolExecutor(max_workers=max(1, 2 * slots), thread_name_prefix="stage2-stream")
    pending: set[Future[dict[str, Any]]] = set()
    started = 0
    try:
        while queue or pending:
            with lock:
                while queue and len(downloading) < slots and len(pending) < 2 * slots:
                    downloading.add(started)
                    pending.add(pool.submit(one, started, queue.pop(0)))
                    started += 1
            finished, pending = wait(pending, timeout=poll, return_when=FIRST_COMPLETED)
            for f in finished:
                record(f.result())
    finally:
        pool.shutdown(wait=not sys.exc_info()[0], cancel_futures=True)


def stream_parts(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed run's summary as one entry per stage whose step ran (the shape of a run of that
    stage over the same partitions, marked ``streamed``), in table order: a stage after one that
    failed did not run (Dagster skips a step whose upstream step failed). An error belongs to the
    stage of its step's asset; a run-level error (no step of ours named) to the first stage that
    did not finish every partition."""
    done = {k: set(v) for k, v in run["partitions"].items()}
    unfinished = next(
        (s for s in STREAMED if not all(set(s.assets) <= d for d in done.values())), STREAMED[-1]
    )

    def owner(error: dict[str, Any]) -> Stage:
        name = error.get("asset") or error.get("step")
        return next((s for s in STREAMED if name in s.assets), unfinished)

    parts: list[dict[str, Any]] = []
    for stage in STREAMED:
        assets = set(stage.assets)
        errors = [e for e in run["errors"] if owner(e) is stage]
        partitions = {k: sorted(d & assets) for k, d in done.items()}
        if parts and not errors and not any(partitions.values()):
            break  # never ran: the stage before it failed
        parts.append(
            {
                **run,
                "selection": list(stage.assets),
                "materialized": sorted(set(run["materialized"]) & assets),
                "partitions": partitions,
                "checks": [c for c in run["checks"] if c["asset"] in assets],
                "errors": errors,
                "moved_aside": run["moved_aside"] if not parts else [],
                "success": not errors and all(assets <= d for d in done.values()),
                "streamed": True,
            }
        )
    return parts


def walk_stages(run: Callable[[Stage], None], *, beside: Collection[str] = ()) -> None:
    """Call ``run`` for every stage of ``stages.STAGES`` once the stages it needs are over, in table
    order in this thread, but the stages named in ``beside``: each of those is called in a thread of
    its own as soon as it is ready, so it runs beside the main line (the kit stage's launched run
    beside the downloads and the extraction). The main line stays in this thread: a stop interrupts
    its wait at once."""
    over: set[str] = set()
    started: set[str] = set()
    aside: dict[Future[None], Stage] = {}
    pool = ThreadPoolExecutor(max_workers=len(STAGES), thread_name_prefix="stage2-beside")
    try:
        while len(over) < len(STAGES):
            ready = ready_stages(over, started)
            for stage in ready:
                if stage.name in beside:
                    started.add(stage.name)
                    aside[pool.submit(run, stage)] = stage
            main = [s for s in ready if s.name not in beside]
            if main:
                started.add(main[0].name)
                run(main[0])
                over.add(main[0].name)
                continue
            if not aside:  # cannot happen with a well-formed table: every stage is reachable
                raise RuntimeError(f"stages {sorted({s.name for s in STAGES} - started)} never became ready")
            finished, _ = wait(aside, return_when=FIRST_COMPLETED)
            for f in finished:
                over.add(aside.pop(f).name)
                f.result()
    finally:
        # after a stop or an error the waits for the stages beside end with their runs (the build
        # terminates those); the interpreter waits for the threads
        pool.shutdown(wait=not sys.exc_info()[0], cancel_futures=True)


def _build_all(
    config: BuildConfig,
    *,
    concurrency: int | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    status: dict[str, str | None] | None = None,
    in_process: bool = False,
) -> dict[str, Any]:
    """Run every stage; returns {ok, runs, checks, errors, store, fingerprint, dagster_home}."""
    profile = load_profile(config.profile_path, kit_root=config.kit_root)
    data_root = Path(config.data_root).resolve()
    data_root.mkdir(parents=True, exist_ok=True)
    home, instance = open_instance(data_root)
    cfg = config.to_dict()
    cfg["data_root"] = str(data_root)
    # The build's code server loads the definitions while the stages' work is sized below.
    quiet = bool(os.environ.get("STAGE2_RUN_LOG_LEVEL"))
    server = None if in_process else CodeServer(config, home, verbose=not quiet)
    if server is not None:
        server.start()
    try:
        with runs_console(home, quiet=quiet and server is None):
            return _walk(config, profile, data_root, home, instance, cfg, server, concurrency, on_run, status)
    finally:
        if server is not None:
            # a stop or an error: none goes on alone (a run made from an interrupted request, late too)
            terminate_runs(instance, server.close(instance), more=lambda: server.close(instance))
            server.stop()


@contextlib.contextmanager
def runs_console(home: Path, *, quiet: bool) -> Iterator[None]:
    """While runs execute in this process quietly (`stage2 build` without ``--verbose``), this
    process's standard output and error (file descriptors 1 and 2, which its step workers and their
    helper processes inherit) go to ``<home>/stage2-logs/runs-console.log``, as a launched build's code
    server and runs write to ``webserver.log``. Each step's own output is still captured by
    Dagster's compute-log manager for the UI; what it mirrors to the console, Dagster's own debug
    lines, and the tracebacks its ``watch_orphans.py`` helpers print when a terminal's Ctrl-C
    reaches them, land in that file, not under the build's progress (which writes to a copy of the
    terminal taken before: ``commands._terminal``). The file holds the last quiet build's console."""
    if not quiet:
        yield
        return
    logs = logs_dir(home)
    _flush_std_streams()  # what Python buffered goes where it was written for
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with open(logs / RUNS_CONSOLE_LOG, "wb") as log:
            for fd in saved:
                os.dup2(log.fileno(), fd)
            try:
                yield
            finally:
                _flush_std_streams()
                for fd, copy in saved.items():
                    os.dup2(copy, fd)
    finally:
        for copy in saved.values():
            os.close(copy)


def entries_at_end(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished run's entries for the progress display (``partition_runs``): those of partitions
    not shown while it went on (``reported``), and those of shown ones that failed or carry a failed
    check or an error."""
    early = set(run.get("reported") or ())
    return [
        p
        for p in partition_runs(run)
        if p.get("partition") not in early
        or not p["success"]
        or p["errors"]
        or any(not c["passed"] for c in p["checks"])
    ]


def _flush_std_streams() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr`` before their descriptors are swapped (a stream that
    is closed or not a file is left as it is)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


def _walk(
    config: BuildConfig,
    profile: Any,
    data_root: Path,
    home: Path,
    instance: dg.DagsterInstance,
    cfg: dict[str, Any],
    server: CodeServer | None,
    concurrency: int | None,
    on_run: Callable[[dict[str, Any]], None] | None,
    status: dict[str, str | None] | None,
) -> dict[str, Any]:
    """The stages of :func:`_build_all`, their runs launched against ``server`` (None: executed in
    this process)."""
    runs: list[dict[str, Any]] = []
    up_to_date: list[str] = []  # the stages not run: nothing to do (steps.status.build_status)

    def record(r: dict[str, Any]) -> None:
        if r.get("up_to_date"):
            up_to_date.append(stage_of(r["selection"]).name)
        else:
            runs.append(r)
        if on_run:
            for part in entries_at_end(r):
                on_run(part)

    def report(part: dict[str, Any]) -> None:
        if on_run:
            on_run(part)

    # What each stage has to do, by stats, once before the first: a stage with nothing to do is not
    # run (a Dagster run costs seconds even when every step skips its work). The stages after the
    # acquire or extract stage when it runs always run. Never skipped: anything under --reverify; the
    # store stage on object storage.
    settings = store_stage_settings(config)
    if status is None:  # not given by the caller (`stage2 build` computes it under the same lock)
        status = stage_status(config, profile)
    failed: list[tuple[Stage, str | None]] = []
    lock = threading.Lock()  # a stage beside the main line records from its own thread

    # A stage beside the main line (the kit) waits for its launched run in a thread of its own. Runs
    # executed in this process go one after another: two runs in two threads of one process can
    # deadlock in Dagster's logging set-up (it reconfigures logging at every run's start).
    beside = {s.name for s in STAGES if s.beside} if server is not None and concurrency != 1 else set()

    # Launched runs stream the downloads into the extraction (a run per range of cache keys, two
    # at once) when the downloads have work; else the stages go one run each.
    def nothing_to_do(stage: Stage) -> bool:
        return stage.name in status and status[stage.name] is None

    stream = server is not None and concurrency != 1 and not nothing_to_do(ACQUIRE)

    def locked(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        def call(r: dict[str, Any]) -> None:
            with lock:
                fn(r)

        return call

    def run_one(stage: Stage) -> None:
        if stream and stage is EXTRACT:  # ran with the acquire stage's runs (stream_cache_keys)
            return
        with lock:
            partitions = stage_partitions(stage, profile, failed)
        if not partitions:  # something it needs failed: left out
            return
        if stream and stage is ACQUIRE:
            assert server is not None

            def streamed(run: dict[str, Any]) -> None:
                parts = [p for part in stream_parts(run) for p in partition_runs(part)]
                bad = [(stage_of(p["selection"]), p["partition"]) for p in parts if not p["success"]]
                with lock:
                    runs.append(run)
                    # a failed run whose failure no partition holds fails its stage: nothing after runs
                    failed.extend(bad if bad or run["success"] else [(stage_of(run["selection"]), None)])
                    if on_run is not None:
                        for part in parts:
                            on_run(part)

            keys = [p for p in partitions if p is not None]
            groups = stream_groups(profile, keys, stream_run_bytes())
            stream_cache_keys(cfg, groups, concurrency or STREAM_SLOTS, streamed, instance, server)
            return
        if nothing_to_do(stage):  # a store on object storage always has work (stage_status)
            with lock:
                record(up_to_date_summary(stage))
            return
        kit_before = kit_fingerprint(profile) if stage is STORE else None  # what its steps will read
        run = run_selection(
            cfg,
            list(stage.assets),
            partition_keys=[p for p in partitions if p is not None],
            workers=stage_workers(stage, concurrency),
            on_partition=locked(report),
            instance=instance,
            server=server,
        )
        locked(record)(run)
        passed = run["success"] and not run["errors"] and all(c["passed"] for c in run["checks"])
        if stage is STORE and passed and not config.store_url:  # a failed check: not up to date next time
            record_store_stage(profile, data_root, settings, kit_before=kit_before, dagster_home=str(home))
        with lock:
            if stage.partitioned_by is None:
                failed.extend([] if run["success"] else [(stage, None)])
            else:
                bad = [(stage, p["partition"]) for p in partition_runs(run) if not p["success"]]
                failed.extend(bad if bad or run["success"] else [(stage, None)])

    walk_stages(run_one, beside=beside)
    failed.sort(key=lambda f: STAGES.index(f[0]))
    runs.sort(key=lambda r: STAGES.index(stage_of(r["selection"][:1])))  # a streamed run: its first stage
    # the stage the build stopped after: the first that failed, unless nothing came after it
    first_failed = failed[0][0] if failed else None
    stopped_at = None
    if first_failed is not None and stages_after(first_failed):
        stopped_at = ",".join(first_failed.assets)

    checks = [c for r in runs for c in r["checks"]]
    errors = [e for r in runs for e in r["errors"]]
    ok = all(r["success"] for r in runs) and all(c["passed"] for c in checks) and stopped_at is None
    if not ok:  # whatever failed, no record lets the next build call the store stage up to date
        clear_store_records(data_root)
    else:  # every stage a failed check had marked ran, and its checks passed
        clear_failed_checks(data_root)
    store = fingerprint = None
    md: dict[str, Any] = next((r["store_metadata"] for r in runs if r.get("store_metadata")), {})
    if ok and config.store_url:  # object storage: what the store asset recorded
        store, fingerprint = md.get("store"), md.get("fingerprint")
    elif ok:
        store, fingerprint = published_store(data_root, profile)
    return build_summary(
        ok=ok,
        profile=profile.name,
        data_root=str(data_root),
        dagster_home=str(home),
        instance_shared_with=_shared_with(instance, home, data_root),
        launched=server is not None,
        store=store,
        fingerprint=fingerprint,
        store_update=md.get("update"),
        removed_stores=str(md.get("removed_stores") or "").split(),
        retention_error=md.get("retention_error"),
        moved_aside=[m for r in runs for m in r.get("moved_aside", [])],
        stopped_after=stopped_at,
        runs=[
            {
                k: r[k]
                for k in ("run_id", "job", "success", "partition", "partitions", "selection", "materialized")
            }
            for r in runs
        ],
        up_to_date=up_to_date,
        checks=checks,
        errors=errors,
    )
