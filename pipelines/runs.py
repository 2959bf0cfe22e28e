"""One run of a selection of assets in its stage's named job, on the configured executor, recorded in
the Dagster instance: what `stage2 build` runs for each stage (``runner``), what a stage beside the
main line runs in its own process (``beside``), and what tests and tools run on their own. Returns a
picklable, JSON-able summary of the run: its checks, its errors (one line each, never a traceback),
what it materialized, per partition.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_assets import WORKERS_TAG
from stage2_data.checks import NON_BLOCKING
from stage2_data.errors import Stage2Error
from stage2_data.profile import Profile, load_profile
from stage2_data.publish.lock import held_build_id
from stage2_data.stages import BUILD_TAG, DATA_ROOT_TAG, JOB_ASSETS, VIN_STORE, stage_of

from .config import INSTANCE_DISK_FULL, INTERNAL_ERROR, BuildConfig, own_instance
from .definitions import ALL_ASSETS_JOB, build_job
from .executors import executor_run_config
from .launch import CodeServer, terminate_runs, wait_for_run
from .rebuild import job_subset, partition_tags
from .watch import RunWatcher


class RecordedRun:
    """A finished run as the instance recorded it: its status and its events (the same for a run
    executed in this process and one launched through the instance)."""

    def __init__(self, instance: dg.DagsterInstance, run_id: str) -> None:
        record = instance.get_run_record_by_id(run_id)
        if record is None:  # a run id the build itself created: always recorded
            raise RuntimeError(f"run {run_id} is not in the instance")
        self.run_id = run_id
        self.job_name = record.dagster_run.job_name
        self.status = record.dagster_run.status.value
        self.success = record.dagster_run.status == dg.DagsterRunStatus.SUCCESS
        self.events = [e.dagster_event for e in instance.all_logs(run_id) if e.dagster_event is not None]

    def check_evaluations(self) -> list[Any]:
        """The results of the run's steps' checks (not those a step recorded for a standalone check
        outside its events: ``assets._common.record_standalone_results``; each of their problems is
        also one of a step's own checks)."""
        return [
            e.asset_check_evaluation_data
            for e in self.events
            if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION and e.step_key is not None
        ]

    def step_failures(self) -> list[Any]:
        return [e for e in self.events if e.is_step_failure]

    def failure_line(self) -> str:
        """One line for a run that failed without a failed step (its run-level failure: a step that
        could not start, a worker that died, a cancellation), never a traceback."""
        for e in self.events:
            if e.event_type in (dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED):
                err = getattr(e.event_specific_data, "error", None)
                if err is not None:
                    return f"run {self.run_id[:8]} failed: {step_error_line(err)}"
                return f"run {self.run_id[:8]}: {' '.join((e.message or 'failed').split())[:500]}"
        return (
            f"run {self.run_id[:8]} ended {self.status.lower()} without a failed step; its event log is in "
            "the UI (`make ui`)"
        )

    def materializations(self) -> list[Any]:
        return [e for e in self.events if e.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION]


class _LibraryLevel:
    """The library's logger level held for runs going on at once in threads: the first run sets
    it, the last one puts back the level it found."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs = 0
        self.before = logging.NOTSET


_LIBRARY_LEVEL = _LibraryLevel()


@contextlib.contextmanager
def library_log_level(level: str | None) -> Iterator[None]:
    """The library's logger (``stage2_data``) at ``level`` while a run goes on (None: as it is), then
    back as it was: the process that runs a build keeps its own logging (a test's captured warnings,
    a notebook's)."""
    if not level:
        yield
        return
    logger, held = logging.getLogger("stage2_data"), _LIBRARY_LEVEL
    with held.lock:
        if held.runs == 0:
            held.before = logger.level
            logger.setLevel(level)
        held.runs += 1
    try:
        yield
    finally:
        with held.lock:
            held.runs -= 1
            if held.runs == 0:
                logger.setLevel(held.before)


def launch_selection(
    server: CodeServer,
    selection: list[str],
    tags: dict[str, str],
    instance: dg.DagsterInstance,
    *,
    log_level: str | None = None,
) -> str:
    """Launch the run of ``selection``'s job through the instance (``server``) and wait for its end;
    its run id. A stop interrupts the wait; the build then cancels every run it launched
    (``runner._build_all``)."""
    run_config: dict[str, Any] = {}  # the executor is the code location's own (configured_executor)
    if log_level:
        run_config["loggers"] = {"console": {"config": {"log_level": log_level}}}
    run_id = server.launch(job_for(selection), tags, run_config)
    if server.closed.is_set():  # the build stopped while Dagster launched it: none goes on alone
        terminate_runs(instance, [run_id])
    wait_for_run(instance, run_id, stop=server.closed)
    return run_id


def job_for(selection: list[str]) -> str:
    """The named job a run of ``selection`` belongs to: its stage's job (``stages.JOB_ASSETS``), else
    the job of every asset (``definitions.ALL_ASSETS_JOB``, for runs executed in process)."""
    stage = stage_of(selection)
    if set(selection) <= set(JOB_ASSETS[stage.job]):
        return stage.job
    for name, assets in JOB_ASSETS.items():
        if set(selection) <= set(assets):
            return name
    return ALL_ASSETS_JOB  # a selection across stages (tests, tools): part of every asset's job


def other_data_roots(instance: dg.DagsterInstance, home: Path, data_root: Path) -> list[str]:
    """The data roots other than ``data_root`` whose builds' runs the instance at ``home`` records
    (their ``stage2/data_root`` tag), sorted; none when ``home`` is the data root's own instance
    (:func:`.config.own_instance`: runs copied with it). Dagster keeps one state per asset in an
    instance, so the UI over an instance shared by builds of several data roots shows each asset as
    whichever of them materialized it last: :func:`.config.shared_instance_note` says so."""
    if own_instance(home, data_root):
        return []
    here = str(Path(data_root).resolve())
    return sorted(
        {v for _key, values in instance.get_run_tags(tag_keys=[DATA_ROOT_TAG]) for v in values} - {here}
    )


def run_tags(
    profile: Profile, selection: list[str], keys: list[str], workers: int | None = None
) -> dict[str, str]:
    """The tags of one run over ``keys``: one partition, or a range of them (``rebuild.partition_tags``)."""
    tags = {"stage2/cli": "build", **partition_tags(profile, keys)}
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
    on_first: Callable[[], None] | None = None,
    instance: dg.DagsterInstance | None = None,
    server: CodeServer | None = None,
) -> dict[str, Any]:
    """Materialize ``selection`` (and their checks) in one run of its stage's named job, on the
    configured executor: one partition (``partition_key``), several (``partition_keys``, one run over
    their range), or none. Returns a picklable summary, with the outcome of each partition.

    ``on_partition`` is called (from a watcher thread, ``watch.RunWatcher``) with a partition's
    entry (as ``partition_runs`` makes them) as soon as the run has materialized the selection for
    that partition; the summary lists those under ``reported``. ``on_first`` is called (from that
    thread) once the first asset of ``selection`` has materialized for every partition (a streamed
    run's downloads are over). ``instance``: the build's (else the
    one at DAGSTER_HOME). ``server``: the build's code server, to launch the run through the
    instance (else the run is executed in this process)."""
    cfg = BuildConfig(**config)
    profile = load_profile(cfg.profile_path, kit_root=cfg.kit_root)
    keys = [partition_key] if partition_key is not None else list(partition_keys or [])
    instance = instance if instance is not None else dg.DagsterInstance.get()
    # STAGE2_RUN_LOG_LEVEL (set by `stage2 build` unless --verbose) quiets the run's console log; the
    # events are recorded in the instance either way.
    level = os.environ.get("STAGE2_RUN_LOG_LEVEL")
    tags = {**run_tags(profile, selection, keys, workers), DATA_ROOT_TAG: str(Path(cfg.data_root).resolve())}
    build_id = held_build_id(Path(cfg.data_root))
    if build_id:  # the build's lock covers this run's steps wherever they execute
        tags[BUILD_TAG] = build_id

    def partition_done(run_id: str, partition: str, done: list[str]) -> None:
        if on_partition is not None:
            on_partition(partition_entry(run_id, job_for(selection), selection, partition, done))

    per_partition = on_partition is not None and len(keys) > 1
    watcher = RunWatcher(
        instance, selection, partition_done if per_partition else None, on_first=on_first, partitions=keys
    )
    with (
        library_log_level(level),
        watcher if per_partition or on_first is not None else contextlib.nullcontext(),
    ):
        if server is not None:
            run_id = launch_selection(server, selection, {**tags, **watcher.tags}, instance, log_level=level)
        else:
            run_id = execute_selection(
                config, selection, {**tags, **watcher.tags}, instance, log_level=level
            ).run_id
    result = RecordedRun(instance, run_id)
    evals = result.check_evaluations()
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
    for fev in result.step_failures():
        data = fev.event_specific_data
        err = getattr(data, "error", None)
        user = getattr(data, "user_failure_data", None)
        umd = user.metadata if user else {}
        by_partition = getattr(umd.get("failed_partitions"), "value", None)
        if isinstance(by_partition, dict) and by_partition:
            types = getattr(umd.get("errors_by_partition"), "value", None) or {}
            env = set(getattr(umd.get("could_not_run_partitions"), "value", None) or ())
            errors += [
                {
                    "step": fev.step_key,
                    "partition": k,
                    "message": m,
                    "error": types.get(k),
                    "could_not_run": k in env,
                }
                for k, m in sorted(by_partition.items())
            ]
            continue
        named = check_failure_errors(fev.step_key, err, checks)
        if named is not None:  # blocking checks failed: what they found, not a bug
            errors += named
            continue
        msg = step_error_line(err)
        kind = getattr(umd.get("error"), "value", None) or (_innermost(err).cls_name if err else None)
        flagged = getattr(umd.get("could_not_run"), "value", None)
        errors.append(
            {
                "step": fev.step_key,
                "partition": keys[0] if len(keys) == 1 else None,
                "message": msg,
                "error": kind,
                # the library's error says; a file system's refusal that reached Dagster unnamed too
                "could_not_run": bool(flagged) if flagged is not None else kind in _OS_REFUSALS,
            }
        )
    if not result.success and not errors:  # the run failed before or around its steps
        errors.append(
            {
                "step": ",".join(selection),
                "partition": keys[0] if len(keys) == 1 else None,
                "message": result.failure_line(),
                "error": None,
                "could_not_run": False,
            }
        )
    mevs = [e for e in result.materializations() if e.asset_key]
    materialized = sorted({e.asset_key.to_user_string() for e in mevs if e.asset_key})
    done: dict[str, set[str]] = {}
    for e in mevs:
        if e.partition is not None and e.asset_key:
            done.setdefault(e.partition, set()).add(e.asset_key.to_user_string())
    moved: list[str] = []  # files a step set aside (never deleted): from where to where
    for mev in mevs:
        aside = getattr(mev.materialization.metadata.get("moved_aside"), "value", None)
        if isinstance(aside, str):  # one "<from> -> <to>" line per file or folder
            moved += [ln for ln in aside.splitlines() if ln]
    store_md: dict[str, Any] = {}
    for mev in mevs:
        if mev.asset_key and mev.asset_key.to_user_string() == VIN_STORE:
            md = mev.materialization.metadata
            store_md = {
                k: getattr(md[k], "value", md[k])
                for k in ("store", "fingerprint", "update", "rebuilt", "removed_stores", "retention_error")
                if k in md
            }
    return {
        "store_metadata": store_md,
        "moved_aside": moved,
        "run_id": result.run_id,
        "job": result.job_name,
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
#: of those, what the environment refuses whatever the data (the build could not run: exit 2); a
#: file or folder missing or in the way is the data root's state (exit 1)
_OS_REFUSALS = {"OSError", "PermissionError", "IsADirectoryError", "NotADirectoryError"}


CHECK_FAILED_ERROR = "DagsterAssetCheckFailedError"  # a step's blocking checks failed (Dagster's name)


def _named_errors() -> set[str]:
    """The class names of the library's named errors (``Stage2Error`` and every subclass)."""
    out, todo = set(), [Stage2Error]
    while todo:
        cls = todo.pop()
        out.add(cls.__name__)
        todo += cls.__subclasses__()
    return out


def _without_class(message: str, cls_name: str = dg.Failure.__name__) -> str:
    """``message`` without a leading ``<module>.<cls_name>: `` (how Dagster words a raised error; a
    ``dg.Failure``'s by default); the class's module path is not matched, only its name."""
    head, sep, rest = message.partition(": ")
    return rest if sep and head.rsplit(".", 1)[-1] == cls_name and " " not in head else message


def _innermost(err: Any) -> Any:
    while getattr(err, "cause", None) is not None:
        err = err.cause
    return err


def failed_check_keys(err: Any) -> list[tuple[str, str]] | None:
    """The ``(asset, check)`` of every blocking check whose failure failed a step (Dagster's
    ``DagsterAssetCheckFailedError``, which lists them one asset a line: ``asset: check,check``);
    None when ``err`` (a ``SerializableErrorInfo``) is another failure."""
    inner = _innermost(err) if err is not None else None
    if inner is None or inner.cls_name != CHECK_FAILED_ERROR:
        return None
    keys = []
    for line in inner.message.splitlines()[1:]:
        asset, sep, names = line.partition(": ")
        if sep:
            keys += [(asset.strip(), n.strip()) for n in names.split(",") if n.strip()]
    return keys


def check_failure_errors(step: str, err: Any, checks: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """A step failed because blocking checks failed: one error per failed check, as what it is (the
    check's name and what it found: its description names the file and the fix), taken from the
    run's check results ``checks``; None when the step failed for another reason."""
    keys = failed_check_keys(err)
    if keys is None:
        return None
    failed = [c for c in checks if not c["passed"] and (c["asset"], c["check"]) in set(keys)]
    seen = {(c["asset"], c["check"]) for c in failed}
    out = [
        {
            "step": step,
            "partition": c["partition"],
            "asset": c["asset"],
            "check": c["check"],
            "message": f"check {c['asset']}:{c['check']} failed: {c['description']}",
            "could_not_run": False,  # a check found a problem in the data
        }
        for c in failed
    ]
    out += [  # a failure whose result did not reach the run's summary: its name at least
        {
            "step": step,
            "partition": None,
            "asset": a,
            "check": n,
            "message": f"check {a}:{n} failed",
            "could_not_run": False,
        }
        for a, n in keys
        if (a, n) not in seen
    ]
    return out


def step_error_line(err: Any) -> str:
    """One line for a step's failure (a ``SerializableErrorInfo``): a ``Failure`` (a named error of
    the library) is its message; failed blocking checks are named (``check_failure_errors`` gives
    what they found); anything else escaped every guard, so it is named as such, with
    the innermost exception's type and message, never Dagster's wrapper or a traceback."""
    if err is None:
        return "step failed"
    msg = _without_class(err.message.strip())
    if err.cls_name == "Failure":
        return msg
    checks = failed_check_keys(err)
    if checks is not None:  # what the checks found is in their results; not a bug
        return "failed check " + ", ".join(f"{a}:{n}" for a, n in checks) + " (its result says why)"
    inner = _innermost(err)
    text = " ".join(inner.message.split())[:500]
    if inner.cls_name in ("DagsterExecutionInterruptedError", "KeyboardInterrupt", "Failure"):
        return _without_class(text)  # a stop; a wrapped Failure
    if inner.cls_name in _named_errors():  # one of the library's named errors (its fix included)
        return _without_class(text, inner.cls_name)
    if inner.cls_name in _OS_ERRORS:  # the environment, not a bug: the path is in the message
        return f"{text}. Fix: check that path (permissions, free space, a file where a folder should be), then re-run"
    if inner.cls_name == "OperationalError" and any(w in text for w in INSTANCE_DISK_FULL):
        # Dagster's own write of the step's events into the instance's database (SQLite) refused
        return (
            f"the Dagster instance's database could not record this step's events ({text}): its disk "
            "is full. Fix: free space on the disk that holds DAGSTER_HOME, then run the build again "
            "(what was built is kept: the build resumes)"
        )
    return (
        f"{INTERNAL_ERROR}{text} (a bug: this step should have named it; the traceback is in the "
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
            # Dagster keeps a reconstructed job per (function, kwargs) for the process's life: a
            # key of its own per run makes a later run of the same config see the profile as it is
            "call": uuid.uuid4().hex,
        },
        reconstructor_working_directory=os.getcwd(),
    )
    run_config = executor_run_config(config)
    if log_level:
        run_config["loggers"] = {"console": {"config": {"log_level": log_level}}}
    # the whole job, unless asked for part of it (rebuild.job_subset)
    subset = job_subset(selection, job_for(selection))
    if subset:
        recon = recon.get_subset(
            asset_selection=set(subset["asset_selection"]),
            asset_check_selection=set(subset["asset_check_keys"]),
        )
    return dg.execute_job(recon, instance, run_config=run_config, tags=tags, raise_on_error=False)


def partition_runs(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per partition of a run over several (the progress display's unit), else the run.
    An entry holds its own partition's checks and errors; those of no partition go with the first
    partition that failed (else the last), so that each is said once."""
    parts = run.get("partitions") or {}
    if len(parts) <= 1:
        return [run]
    # a partition succeeded when its every asset materialized and none failed a blocking check (an
    # asset a blocking check fails is materialized, then its step fails: nothing after it may run)
    failed_checks = {
        c.get("partition") for c in run["checks"] if not c["passed"] and c.get("check") not in NON_BLOCKING
    }
    ok = {k: set(run["selection"]) <= set(done) and k not in failed_checks for k, done in parts.items()}
    rest = next((k for k in parts if not ok[k]), list(parts)[-1])

    def mine(items: list[dict[str, Any]], k: str) -> list[dict[str, Any]]:
        return [x for x in items if x.get("partition") == k or (x.get("partition") is None and k == rest)]

    return [
        {
            **run,
            "partition": k,
            "success": ok[k],
            "materialized": done,
            "checks": mine(run["checks"], k),
            "errors": mine(run["errors"], k),
        }
        for k, done in parts.items()
    ]
