"""Shared glue: StepResult -> Dagster events, one partition or a range of them in one run.
Nothing domain-specific lives here."""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_data.acquire import cancel_downloads
from stage2_data.acquire.hub import PinDisagreesError
from stage2_data.checks import CHECK_DESCRIPTIONS, CHECKS_BY_ASSET, NON_BLOCKING, CheckOutcome
from stage2_data.errors import Stage2Error
from stage2_data.extract import cancel_extractions
from stage2_data.fsutil import canonical_json, human_bytes
from stage2_data.publish.lock import BuildGoneError, require_launching_build, run_step_lock
from stage2_data.stages import BUILD_TAG, PARTITIONS_TAG, READS, stage_of
from stage2_data.steps import StepResult
from stage2_data.steps.status import clear_store_records, record_failed_checks
from stage2_data.steps.store_inputs import CHECKED_BY, forget_checked


def check_specs(asset: str) -> list[dg.AssetCheckSpec]:
    """Every check is blocking (a failure stops downstream assets) unless listed in NON_BLOCKING."""
    return [
        dg.AssetCheckSpec(
            name, asset=asset, blocking=name not in NON_BLOCKING, description=CHECK_DESCRIPTIONS.get(name)
        )
        for name in CHECKS_BY_ASSET[asset]
    ]


# The code version of every asset (Dagster marks an asset "code changed" when it differs from the
# one its latest materialization recorded). Bump an asset's entry when its step starts writing
# something else for the same inputs.
CODE_VERSIONS: dict[str, str] = {name: "1" for name in CHECKS_BY_ASSET}


def code_version_with(name: str, part: Any) -> str:
    """``CODE_VERSIONS[name]`` followed by a digest of ``part`` (a part of the profile, as canonical
    JSON): the code version of an asset whose result depends on that part too, so that the UI marks
    it stale (code version changed) once the code location is reloaded after an edit of that part.
    Only for an asset every build runs again when that part changes (the build's stage status reads
    the profile file's stats): the mark then lasts until the next build, never longer."""
    digest = hashlib.sha256(canonical_json(part).encode()).hexdigest()
    return f"{CODE_VERSIONS[name]}-{digest[:16]}"


# The tag `stage2 build` puts on a run: how many partitions to work on at once (and PARTITIONS_TAG).
WORKERS_TAG = "stage2/workers"
DATA_VERSION_TAG = "dagster/data_version"
DATA_VERSION_IS_USER_PROVIDED_TAG = "dagster/data_version_is_user_provided"
CODE_VERSION_TAG = "dagster/code_version"


def stage_asset(name: str, *, group: str, description: str, kind: str, **asset_args: Any) -> Any:
    """``@dg.asset`` for the asset called ``name``: what it reads is ``READS[name]`` (the one
    declaration of the graph's edges), its checks are ``CHECKS_BY_ASSET[name]`` (:func:`check_specs`),
    its code version ``CODE_VERSIONS[name]`` unless ``asset_args`` names one; the other
    ``asset_args`` (partitions, pool) go to ``dg.asset`` as they are. A partitioned asset runs a range of partitions in one run
    (``BackfillPolicy.single_run``; :func:`run_partitions`)."""
    if "partitions_def" in asset_args:
        asset_args.setdefault("backfill_policy", dg.BackfillPolicy.single_run())
        asset_args.setdefault("output_required", False)  # one materialization per partition that succeeded
    asset_args.setdefault("code_version", CODE_VERSIONS[name])
    with warnings.catch_warnings():  # backfill_policy is "beta" in Dagster 1.x (the version is pinned)
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.asset(
            name=name,
            deps=list(READS[name]),
            group_name=group,
            check_specs=check_specs(name),
            description=description,
            kinds={kind},
            **asset_args,
        )


def is_bytes_key(key: str) -> bool:
    """A metadata key that holds a byte count (``bytes``, ``bytes_on_disk``, ``archive_bytes``, ...)."""
    return key == "bytes" or key.startswith("bytes_") or key.endswith("_bytes")


def _cell(key: str, v: Any, in_bytes: bool = False) -> str:
    """One value in a Markdown table cell: a byte count as ``1.5 MiB (1,572,864 B)``, a list
    joined, nothing as ``-``; ``|`` escaped."""
    if v is None or v == []:
        text = "-"
    elif not isinstance(v, bool) and isinstance(v, int) and (in_bytes or is_bytes_key(key)):
        text = f"{human_bytes(v)} ({v:,} B)"
    elif isinstance(v, list):
        text = ", ".join(_cell(key, x, in_bytes) for x in v)
    elif isinstance(v, dict):
        text = ", ".join(f"{k}: {_cell(str(k), x, in_bytes)}" for k, x in v.items())
    else:
        text = str(v)
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(key: str, v: list[Any] | dict[str, Any]) -> str:
    """A list or dict of metadata as a Markdown table people read (never a JSON blob): a dict of
    records (or a list of them) one row each, a dict of values one row per key, a list one row per
    item. Byte counts are shown in IEC units (``fsutil.human_bytes``) with the exact count."""
    in_bytes = is_bytes_key(key)
    records: list[tuple[str, dict[str, Any]]] = []
    if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
        records = [(str(k), x) for k, x in v.items()]
    elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        records = [("", x) for x in v]
    if records:
        cols = list(dict.fromkeys(c for _, r in records for c in r))
        first = [key] if any(name for name, _ in records) else []
        head = "| " + " | ".join([*first, *cols]) + " |\n|" + "---|" * (len(first) + len(cols)) + "\n"
        return head + "\n".join(
            "| "
            + " | ".join([*([name] if first else []), *(_cell(c, r.get(c), in_bytes) for c in cols)])
            + " |"
            for name, r in records
        )
    if isinstance(v, dict):
        return f"| {key} | value |\n|---|---|\n" + "\n".join(
            f"| {k} | {_cell(str(k), x, in_bytes)} |" for k, x in v.items()
        )
    return f"| {key} |\n|---|\n" + "\n".join(f"| {_cell(key, x, in_bytes)} |" for x in v)


def to_metadata(md: dict[str, Any]) -> dict[str, Any]:
    """A step's metadata as Dagster metadata people read: ``{"__markdown__": text}`` as Markdown,
    lists and dicts as Markdown tables (:func:`md_table`), paths as paths, and next to every byte
    count (kept as a number, which the UI plots) its size in IEC units (``bytes`` -> ``size``,
    ``bytes_on_disk`` -> ``size_on_disk``: ``fsutil.human_bytes``)."""
    out: dict[str, Any] = {}
    for k, v in md.items():
        if v is None:
            continue
        if isinstance(v, dict) and "__markdown__" in v:
            out[k] = dg.MetadataValue.md(v["__markdown__"])
        elif isinstance(v, list | dict):
            out[k] = dg.MetadataValue.md(md_table(k, v)) if v else dg.MetadataValue.text("none")
        elif isinstance(v, str) and (k.endswith("path") or k in ("store", "table", "report", "tar")):
            out[k] = dg.MetadataValue.path(v)
        else:
            out[k] = v
            if is_bytes_key(k) and isinstance(v, int) and not isinstance(v, bool):
                out[k.replace("bytes", "size")] = dg.MetadataValue.text(human_bytes(v))
    return out


#: the longest check description kept (the UI shows a description whole; a long problem list is cut)
MAX_DESCRIPTION = 4000


def standalone_check(asset: Any, name: str) -> Any:
    """The decorator of a check that runs on its own over what is on disk (the verify job runs it;
    the UI can execute it any time): never blocking, described by ``checks.CHECK_DESCRIPTIONS``."""
    return dg.asset_check(asset=asset, name=name, blocking=False, description=CHECK_DESCRIPTIONS[name])


def check_result(
    passed: bool, description: str, metadata: dict[str, Any] | None = None, *, check_name: str | None = None
) -> dg.AssetCheckResult:
    """An asset check's result as every check here reports one: the description cut to
    :data:`MAX_DESCRIPTION`, the metadata through :func:`to_metadata`."""
    return dg.AssetCheckResult(
        check_name=check_name,
        passed=passed,
        description=description[:MAX_DESCRIPTION],
        metadata=to_metadata(metadata or {}),
    )


def record_standalone_results(
    context: dg.AssetExecutionContext, asset: str, outcomes: Sequence[CheckOutcome]
) -> None:
    """Record ``outcomes``, results of standalone checks (``checks.STANDALONE_CHECKS``) whose work
    this run's step of ``asset`` did itself, under this run, after the materialization it made: the
    UI then shows every check of a freshly built asset as passed or failed, never as not run (a
    result of the run that made the latest materialization is that materialization's).

    They go to the instance's event log directly, not through the step's events: every problem they
    hold is also a problem of one of the asset's own checks (``checks.RECORDED_BY_BUILD``), so a
    build's summary, read from the run's events, counts each finding once."""
    key = dg.AssetKey(asset)
    for o in outcomes:
        evaluation = dg.AssetCheckEvaluation(
            asset_key=key,
            check_name=o.name,
            passed=o.passed,
            metadata=to_metadata({**o.metadata, "recorded_by": f"the {asset} step of this run"}),
            description=o.description[:MAX_DESCRIPTION],
        )
        context.instance.report_dagster_event(
            dg.DagsterEvent(
                event_type_value=dg.DagsterEventType.ASSET_CHECK_EVALUATION.value,
                job_name=context.job_name,
                event_specific_data=evaluation,
                message=f"Asset check '{o.name}' on '{asset}' {'passed' if o.passed else 'failed'} "
                f"(recorded by the {asset} step)",
            ),
            run_id=context.run.run_id,
        )


def fails_a_check(err: Stage2Error) -> bool:
    """Whether ``err`` says the asset's data is wrong (its first check fails with it), not the
    environment: an error that kept the step from running (``could_not_run``: a full disk, a file
    system that refuses, the hub unreachable or without the file, another build writing the same
    stores folder) fails the step with its named error and leaves every check unjudged (a badge
    saying ``archive_sha256_matches_pin`` failed for a file the hub does not have would blame bytes
    nobody saw); nor does a run whose build is gone. A pin the hub contradicts is the profile's
    data being wrong, and fails the check that compares with it."""
    if isinstance(err, PinDisagreesError):
        return True
    return not (err.could_not_run or isinstance(err, BuildGoneError))


def forget_on_failure(
    data_root: Path | None, outcomes: Sequence[tuple[str, bool]], asset: str, context: Any = None
) -> None:
    """A check of ``asset`` that failed (``outcomes``: each check's name and whether it passed)
    leaves no record by which the next build would skip it: the store stage's success records are
    cleared, and the asset's stage is marked to run again (stage2_data.steps.status), so that the
    next build re-checks what failed here, in whichever run it failed."""
    failed = [name for name, passed in outcomes if not passed]
    if data_root is not None and failed:
        clear_store_records(data_root)
        if asset in CHECKED_BY:  # a store job run on its own refuses until this asset passes again
            forget_checked(data_root, asset)
        run_id = getattr(getattr(context, "run", None), "run_id", None)
        record_failed_checks(data_root, stage_of([asset]).name, failed, run_id)


def _run_label(context: Any, what: str) -> str:
    """The run and step a shared lock's record names (a build refused meanwhile prints it)."""
    run = getattr(context, "run", None) if context is not None else None
    run_id = getattr(run, "run_id", None)
    job = getattr(context, "job_name", None) if context is not None else None
    return f"run {run_id} of job {job}, {what}" if run_id else what


# the tag Dagster sets on a re-executed run (its parent), spelled as Dagster's run tags spell it
PARENT_RUN_TAG = "dagster/parent_run_id"


def _build_id(context: Any) -> str | None:
    """The id of the `stage2 build` that started this run (its ``stage2/build`` tag), if any."""
    run = getattr(context, "run", None) if context is not None else None
    tags = getattr(run, "tags", None)
    if not isinstance(tags, Mapping) or PARENT_RUN_TAG in tags:
        return None  # a re-execution (from the UI) carries its parent's tags: not the build's run
    value = tags.get(BUILD_TAG)
    return value if isinstance(value, str) and value else None


def error_metadata(err: Stage2Error) -> dict[str, Any]:
    """A failed step's metadata for the library's error ``err``: its class, and whether the
    environment stopped the step rather than the data (``Stage2Error.could_not_run``: the build's
    exit code reads it)."""
    return {"error": type(err).__name__, "could_not_run": err.could_not_run}


@contextlib.contextmanager
def data_root_step_lock(data_root: Path | None, context: Any = None, *, what: str = "") -> Iterator[None]:
    """Hold the data root's lock for the block as a step of this run must (``publish.lock``,
    :func:`run_step_lock`): nothing in a run a build covers (launched by it, or in its process),
    shared in any other run (the UI, a schedule, a sensor). When a build holds it, the step fails
    at once with the error's message and fix (no traceback), before anything is written: no check
    result is recorded (nothing was checked) and no record is cleared (:func:`forget_on_failure`
    would write into the build's data root). A run whose launching build is gone (killed: its lock
    released while its code server may still start steps) starts no step, and a range step no
    further partition (:class:`BuildGoneError`). ``data_root`` None: nothing is locked."""
    if data_root is None:
        yield
        return
    with contextlib.ExitStack() as held:
        try:
            # a run whose launching build was killed (its lock gone) starts no step: another build
            # may hold the data root now
            require_launching_build(Path(data_root))
            held.enter_context(
                run_step_lock(Path(data_root), label=_run_label(context, what), build_id=_build_id(context))
            )
        except Stage2Error as err:
            raise dg.Failure(description=str(err), metadata=error_metadata(err)) from None
        yield


def run_step(
    asset: str,
    step: Callable[[], StepResult],
    data_version: Callable[[StepResult], str | None] | None = None,
    *,
    context: dg.AssetExecutionContext | None = None,
    standalone: Callable[[StepResult], list[CheckOutcome]] | None = None,
    data_root: Path | None = None,
) -> Iterator[Any]:
    """Run a library step; on an expected failure, fail the asset's first check with the message
    (so the UI and alerts show which check and why) and fail the step with the fix. ``data_version``
    names what the step produced (else Dagster derives one from the inputs' versions and the code's).
    ``standalone(result)``: the standalone checks' results the step's work gives, recorded against
    the materialization once it is made (:func:`record_standalone_results`; needs ``context``).
    With ``data_root``, a failed check or step clears the records that let a later build call the
    store stage up to date (:func:`forget_on_failure`), whichever way the run was launched, and the
    step works under the data root's lock (:func:`data_root_step_lock`: shared in a run no build
    covers, refused at once while a build writes)."""
    with data_root_step_lock(data_root, context, what=f"step {asset}"):
        try:
            res = step()
        except Stage2Error as err:
            if fails_a_check(err):
                first = CHECKS_BY_ASSET[asset][0]
                forget_on_failure(data_root, [(first, False)], asset, context)
                yield check_result(False, str(err), check_name=first)
            raise dg.Failure(description=str(err), metadata=error_metadata(err)) from None
        forget_on_failure(data_root, [(c.name, c.passed) for c in res.checks], asset, context)
    version = data_version(res) if data_version else None
    yield dg.MaterializeResult(
        data_version=dg.DataVersion(version) if version else None,
        metadata=to_metadata(res.metadata),
        check_results=[
            check_result(c.passed, c.description, c.metadata, check_name=c.name) for c in res.checks
        ],
    )
    if standalone is not None and context is not None:
        record_standalone_results(context, asset, standalone(res))


def selected_partitions(context: dg.AssetExecutionContext, order: Sequence[str]) -> list[str]:
    """The partitions this run works on, in ``order`` (largest first): the run's partition or range,
    less the keys the run's ``stage2/partitions`` tag leaves out."""
    keys = set(context.partition_keys)
    wanted = context.run.tags.get(PARTITIONS_TAG)
    if wanted:
        keys &= set(json.loads(wanted))
    return [k for k in order if k in keys]


def partition_workers(context: dg.AssetExecutionContext, default: int) -> int:
    """How many partitions a run works on at once: the ``stage2/workers`` tag, else ``default``."""
    tag = context.run.tags.get(WORKERS_TAG)
    return max(1, int(tag)) if tag and tag.isdigit() else max(1, default)


def default_workers(kind: str) -> int:
    """Partitions at once inside a run, sized for the machine: downloads wait on the network (4
    threads); extractions two at once where there are two cores (their time is mostly the kernel's,
    file creation and copy_file_range, which two at a time overlap), capped by the stage's
    ``max_parallel``."""
    cpus = os.cpu_count() or 1
    return 4 if kind == "download" else max(1, min(2, cpus))


def input_tags(instance: dg.DagsterInstance, deps: dict[str, Sequence[str | None]]) -> dict[str, str]:
    """The provenance tags Dagster records on a materialization it makes itself (the data version
    and latest event of each input), for a materialization logged per partition: ``deps`` maps each
    upstream asset to the partitions it reads (None: unpartitioned). Without them the UI would call
    every partition stale ("has a new dependency")."""
    tags: dict[str, str] = {}
    for asset, parts in deps.items():
        key = dg.AssetKey(asset)
        ids: list[int] = []
        versions: list[str] = []
        for part in parts:
            rec = instance.get_latest_data_version_record(key, False, part)
            if rec is not None:
                ids.append(rec.storage_id)
                versions.append((rec.event_log_entry.tags or {}).get(DATA_VERSION_TAG) or "INITIAL")
        if len(versions) == 1:
            version_tag = versions[0]
        elif versions:
            version_tag = hashlib.sha256("\n".join(versions).encode()).hexdigest()
        else:
            version_tag = "INITIAL"
        tags[f"dagster/input_data_version/{asset}"] = version_tag
        tags[f"dagster/input_event_pointer/{asset}"] = str(max(ids)) if ids else "NULL"
    return tags


def _in_step_worker() -> bool:
    """This code runs on the main thread of a step worker process (a multiprocessing child that
    runs one step and ends: the multiprocess executor's), not in the build's own process (which
    keeps its stop guard) nor on a Dask worker's task thread."""
    return (
        multiprocessing.parent_process() is not None and threading.current_thread() is threading.main_thread()
    )


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _ignore_further_stops() -> None:
    """In a step worker process whose step is ending on a stop: ignore later SIGINT/SIGTERM, now and
    in the process's exit.

    What is left is that exit: multiprocessing's finalizers join the threads that feed the event
    queue to the orchestrator, then the interpreter joins the partition threads still winding down
    (they stop at their next cancellation point). A second stop signal (a terminal's Ctrl-C reaches
    the whole process group, the stop guard sends its SIGTERM, Dagster's orchestrator ends its
    workers) would raise inside one of those joins and print a traceback. Dagster's step worker
    restores its own handlers when the step's context ends (``capture_interrupts``), so the signals
    are ignored again by the first finalizer of the exit (the highest exit priority runs first).
    The guard's SIGKILL after its grace period still bounds the wait."""
    if not _in_step_worker():
        return
    _ignore_stop_signals()
    multiprocessing.util.Finalize(None, _ignore_stop_signals, exitpriority=1000)


def _feeds_downstream_in_run(context: dg.AssetExecutionContext, asset: str) -> bool:
    """True when the run also materializes an asset that depends on ``asset``."""
    # no selection (None, or an empty set from `execute_in_process` without one): the whole job
    selection = context.run.asset_selection
    if selection and len(selection) == 1:  # this asset alone
        return False
    layer = context.job_def.asset_layer
    in_run = set(selection) if selection else set(layer.executable_asset_keys)
    return bool(in_run & set(layer.asset_graph.get(dg.AssetKey(asset)).child_keys))


def _output_for_partitions(
    context: dg.AssetExecutionContext,
    asset: str,
    done: dict[str, StepResult],
    data_version: Callable[[str, StepResult], str],
) -> dg.MaterializeResult:
    """The step's output when every partition of the run is done: Dagster materializes each
    partition from it. One partition: its metadata and data version. A range: each partition's
    metadata (``add_asset_metadata``); the data version is Dagster's, from the code version and the
    inputs' versions (an output carries one data version, not one per partition)."""
    if len(done) == 1:
        ((key, res),) = done.items()
        return dg.MaterializeResult(
            metadata=to_metadata(res.metadata), data_version=dg.DataVersion(data_version(key, res))
        )
    for key, res in done.items():
        context.add_asset_metadata(to_metadata(res.metadata), partition_key=key)
    return dg.MaterializeResult()


def resource_data_root(context: dg.AssetExecutionContext) -> Path | None:
    """The data root of the run's ``data_root`` resource (``DataRootResource``), None without one."""
    res = getattr(getattr(context, "resources", None), "data_root", None)
    root = getattr(res, "root", None)
    return Path(root()) if callable(root) else None


def run_partitions(
    context: dg.AssetExecutionContext,
    asset: str,
    keys: Sequence[str],
    step: Callable[[str], StepResult],
    data_version: Callable[[str, StepResult], str],
    workers: int,
    inputs: Callable[[str], dict[str, Sequence[str | None]]] = lambda _key: {},
) -> Iterator[Any]:
    """Run ``step`` for every partition in ``keys`` (``workers`` at once, threads) inside one run,
    under the data root's lock (:func:`data_root_step_lock`; the data root of the asset's
    ``data_root`` resource), held until the step's last partition is over.

    Each partition whose step returns is materialized on its own (its metadata, its data version),
    and each check is recorded for its partition; a partition whose step raised a ``Stage2Error``
    fails its first check with the message and is not materialized. Then one declared result per
    check sums up the run (Dagster takes a check's declared result once per step; in a one-partition
    run it is that partition's result), and the step fails when any partition raised, naming each:
    the stages after it do not run, as when each partition had a run of its own. ``inputs(key)``
    names the upstream partitions a partition reads (their versions are recorded with it).

    When the run also holds an asset downstream of this one (the UI materializing ``archive_file``
    and ``cache_dir`` together), that asset's step runs only after this step's output: the
    partitions are then materialized through that output at the end of the step (Dagster makes one
    materialization per partition of the run, each with its own metadata), never as events alone,
    which would leave the downstream step skipped while the run says it succeeded."""
    data_root = resource_data_root(context)
    with data_root_step_lock(data_root, context, what=f"step {asset}"):
        asset_key = dg.AssetKey(asset)
        feeds = _feeds_downstream_in_run(context, asset)
        pending: dict[str, StepResult] = {}  # partitions done, materialized by the step's output
        names = CHECKS_BY_ASSET[asset]
        raised: dict[str, str] = {}
        raised_types: dict[str, str] = {}  # the error's class by partition
        could_not_run: list[str] = []  # the partitions the environment stopped (the exit code reads it)
        results: dict[str, list[tuple[str, bool, str, dict[str, Any]]]] = {}
        single = len(keys) == 1 and context.has_partition_key

        def materialization(key: str, res: StepResult) -> dg.AssetMaterialization:
            """One partition materialized as an event of its own: its metadata, its data version."""
            return dg.AssetMaterialization(
                asset_key=asset_key,
                partition=key,
                metadata=to_metadata(res.metadata),
                tags={
                    **input_tags(context.instance, inputs(key)),
                    DATA_VERSION_TAG: data_version(key, res),
                    DATA_VERSION_IS_USER_PROVIDED_TAG: "true",
                    CODE_VERSION_TAG: CODE_VERSIONS[asset],
                },
            )

        def one(key: str) -> StepResult | Stage2Error:
            try:
                if data_root is not None:  # each partition, not only the step's first (see above)
                    require_launching_build(data_root)
                return step(key)
            except Stage2Error as err:
                return err

        pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys) or 1)))
        try:
            futures = {pool.submit(one, k): k for k in keys}
            for fut in as_completed(futures):
                key = futures[fut]
                res = fut.result()
                outcomes: list[tuple[str, bool, str, dict[str, Any]]]
                if isinstance(res, Stage2Error):
                    raised[key] = str(res)
                    raised_types[key] = type(res).__name__
                    if res.could_not_run:
                        could_not_run.append(key)
                    outcomes = (
                        [(names[0], False, str(res)[:MAX_DESCRIPTION], {})] if fails_a_check(res) else []
                    )
                else:
                    outcomes = [
                        (c.name, c.passed, c.description[:MAX_DESCRIPTION], to_metadata(c.metadata))
                        for c in res.checks
                    ]
                results[key] = outcomes
                if not single:
                    for name, passed, desc, md in outcomes:
                        context.log_event(
                            dg.AssetCheckEvaluation(
                                asset_key=asset_key,
                                check_name=name,
                                passed=passed,
                                metadata=md,
                                description=desc,
                                partition=key,
                            )
                        )
                if isinstance(res, StepResult) and feeds:
                    pending[key] = res
                elif isinstance(res, StepResult):
                    yield materialization(key, res)
        except BaseException as exc:
            # An interrupt (a stop: Dagster's interrupt or KeyboardInterrupt in this thread) does not
            # reach the partitions' threads: queued partitions are dropped, running downloads and
            # extractions are told to stop (a download keeps its partial file; an extraction raises at
            # its next cancellation point, its staging folder removed), and the step ends now instead
            # of waiting for them (a run canceled through the instance ends as soon as they do).
            # (GeneratorExit: Dagster abandoned the step between two events, as an interrupt raised
            # in its own code does; in a step worker that is the step's end too)
            if not isinstance(exc, Exception) and (not isinstance(exc, GeneratorExit) or _in_step_worker()):
                cancel_downloads()
                cancel_extractions()
                _ignore_further_stops()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        outcomes = [(name, passed) for got in results.values() for name, passed, _, _ in got]
        forget_on_failure(data_root, outcomes, asset, context)
        if pending and not raised and set(keys) != set(context.partition_keys):
            raise dg.Failure(
                description=(
                    f"{asset}: this run covers some partitions of its range only ({context.run.tags.get(PARTITIONS_TAG)}); "
                    "an asset after it cannot run in the same run. Fix: materialize the whole range, or "
                    f"{asset} first and what follows it in a run of its own"
                )
            )
        if pending and not raised:
            yield _output_for_partitions(context, asset, pending, data_version)
        for key, res in pending.items() if raised else ():  # the run fails: what succeeded, as events
            yield materialization(key, res)
        for name in names:
            got = [(k, o) for k in keys for o in results.get(k, []) if o[0] == name]
            if not got and raised:  # every partition stopped by the machine, none checked
                continue
            bad = [(k, o[2]) for k, o in got if not o[1]]
            if single and got:
                _, (_, passed, desc, md) = got[0]
                yield dg.AssetCheckResult(check_name=name, passed=passed, description=desc, metadata=md)
                continue
            desc = f"{len(got) - len(bad)}/{len(got)} partitions passed" + "".join(
                f"\n{k}: {d}" for k, d in bad
            )
            yield check_result(
                not bad,
                desc,
                {"partitions": len(got), "failed_partitions": [k for k, _ in bad]},
                check_name=name,
            )
        if raised:
            raise dg.Failure(
                description="\n".join(f"{k}: {m}" for k, m in sorted(raised.items())),
                metadata={
                    "failed_partitions": dg.MetadataValue.json(raised),
                    "errors_by_partition": dg.MetadataValue.json(raised_types),
                    "could_not_run_partitions": dg.MetadataValue.json(sorted(could_not_run)),
                },
            )
