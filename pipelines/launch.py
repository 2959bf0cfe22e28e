"""Runs launched through the instance, as the UI, a schedule or a sensor launches them.

`stage2 build` starts Dagster's webserver over the project's definitions (``dagster-webserver -m``,
with the build's settings in its environment: :meth:`BuildConfig.to_env`), which runs its own code
server as ``make ui``'s does, and launches each stage's run as the UI's Launch button does:
Dagster's GraphQL client (``dagster_graphql.DagsterGraphQLClient``) asks the webserver, which
keeps the location's snapshot loaded, so a launch costs one request instead of a process that
imports Dagster and loads the location again. The instance's run launcher starts the run's worker
process from the code server, so every run carries the code location's origin (``LOCATION_NAME``,
the name ``workspace.yaml`` gives the same module): the UI lists it on its job's page and on the
Overview timeline, and Re-execute loads the same job. A run's outcome is read back from the
instance (``runs.RecordedRun``), whichever way it was started.

A stop cancels the build's runs through the instance (:func:`terminate_runs`): a run ends as
canceled, its step interrupted, whatever signal the build's own process received.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import dagster as dg

from stage2_data.cli import install_line
from stage2_data.errors import Stage2Error, env_number
from stage2_data.publish.lock import LAUNCHING_BUILD_ENV, held_build_id
from stage2_data.stages import BUILD_TAG

from .config import BuildConfig
from .stops import spare, stop_groups, unspare

# The code location's name: what `workspace.yaml` (module ``stage2_pipelines.definitions``, attribute
# ``defs``) calls it, so a build's runs and the UI's are runs of one location.
LOCATION_NAME = "stage2_pipelines.definitions:defs"
DEFINITIONS_MODULE = "stage2_pipelines.definitions"
REPOSITORY_NAME = "__repository__"  # the one repository of a `Definitions`
SERVER_START_TIMEOUT = 180.0  # seconds for the code server to load the definitions
# every run a build launches carries this tag with the build's id: a stop cancels them all, also
# one whose launch request was still going when the stop came
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


_LOCATION_QUERY = """
query { workspaceOrError { __typename
  ... on Workspace { locationEntries { name loadStatus
    locationOrLoadError { __typename } } } } }
"""


def location_loaded(port: int) -> bool:
    """Whether the webserver on ``port`` serves the code location ``LOCATION_NAME`` loaded, as its
    GraphQL API (the one the UI reads) says; the load's error, when there is one, is in its log."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": _LOCATION_QUERY}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        workspace = json.load(answer)["data"]["workspaceOrError"]
    entries = workspace.get("locationEntries") or []  # none: the workspace itself did not load
    entry = next((e for e in entries if e["name"] == LOCATION_NAME), {})
    loaded = entry.get("locationOrLoadError") or {}
    return entry.get("loadStatus") == "LOADED" and loaded.get("__typename") == "RepositoryLocation"


class LaunchError(Stage2Error):
    """The build's code server or a launch failed: the definitions did not load, or Dagster refused
    the run. The message carries Dagster's own words and where its log is."""


# The build's own logs, under DAGSTER_HOME. Not Dagster's `logs` folder there: Dagster keeps its
# telemetry log in it, and its webserver (the build's, `make ui`'s) moves that folder to
# `.logs_queue` and posts each file in it to Dagster's telemetry server, whatever the instance's
# telemetry setting (the telemetry upload `dagster-webserver` starts with, Dagster 1.13).
LOGS_DIR = "stage2-logs"
CODE_SERVER_LOG = "code-server.log"  # an older stage2's: moved out of Dagster's folders like the rest
WEBSERVER_LOG = "webserver.log"  # the webserver's, its code server's and the launched runs' console
RUNS_CONSOLE_LOG = "runs-console.log"  # a quiet build's runs executed in process (runner.runs_console)


def logs_dir(home: Path) -> Path:
    """``<home>/stage2-logs``, created. A log of ours that an earlier stage2 left in Dagster's
    ``logs`` folder, or that a webserver then moved to ``.logs_queue``, is moved in first (nothing
    lost, nothing of ours left where a webserver would send it away)."""
    out = home / LOGS_DIR
    out.mkdir(parents=True, exist_ok=True)
    for old in ("logs", ".logs_queue"):
        for name in (CODE_SERVER_LOG, WEBSERVER_LOG, RUNS_CONSOLE_LOG):
            src = home / old / name
            if src.is_file() and not (out / name).exists():
                with contextlib.suppress(OSError):
                    src.rename(out / name)
    return out


#: the last line of a Python traceback (``SystemExit: ...``, ``ModuleNotFoundError: ...``)
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: |$)")


def _dagster_cli(name: str = "dagster") -> str:
    """The ``dagster`` (or ``name``) command of this environment (beside this interpreter)."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else (shutil.which(name) or name)


PR_SET_PDEATHSIG = 1  # prctl(2)


def _ends_with_build() -> Callable[[], None] | None:
    """On Linux, what a server's child process runs before exec: the kernel sends it SIGTERM when
    the process that started it dies, however it dies (SIGKILL and the OOM killer included), so no
    server outlives its build (it would hold a port and launch nothing). The signal follows the
    thread that started the child: the servers are started from the build's main thread. None
    elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the build died before the line above: end now
            os.kill(os.getpid(), signal.SIGTERM)

    return child


def _spawn(argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``argv`` started, ending with this process (:func:`_ends_with_build`); a Dagster command
    missing from this environment is named with the fix."""
    try:
        return subprocess.Popen(argv, preexec_fn=_ends_with_build(), **popen)  # noqa: PLW1509
    except FileNotFoundError:
        raise LaunchError(
            f"`{Path(argv[0]).name}` is not installed beside this Python ({sys.executable})",
            fix=f"install the pipeline extra (`{install_line()}`, or `make install`), "
            "or build with --run-in-process",
        ) from None


# Dagster's GraphQL client calls gql in a way gql 4 deprecates (a DeprecationWarning at each call):
# Dagster's to change, not the build's to show. One filter for those two messages, installed once
# (``warnings.catch_warnings`` around each call would race between the threads that launch runs).
_GQL_DEPRECATIONS = r"Using (a DocumentNode|variable_values and operation_name arguments)"


def _quiet_gql_deprecations() -> None:
    warnings.filterwarnings("ignore", message=_GQL_DEPRECATIONS, category=DeprecationWarning)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CodeServer:
    """One ``dagster api grpc`` server of the project's definitions for one build's settings, and
    Dagster's webserver over it; the build's runs are launched through the webserver
    (:meth:`launch`) and their worker processes are the code server's children. Use as a context
    manager: stopped (after its runs) when the build ends."""

    def __init__(self, config: BuildConfig, dagster_home: Path, *, verbose: bool = False) -> None:
        self.home = Path(dagster_home)
        self.ui_port = free_port()
        # the id the build wrote into the data root's lock: its runs' steps are covered by that lock
        self.build_id = held_build_id(Path(config.data_root)) or uuid.uuid4().hex
        self.env = {
            **os.environ,
            **config.to_env(),
            "DAGSTER_HOME": str(self.home),
            "PYTHONUNBUFFERED": "1",
            LAUNCHING_BUILD_ENV: str(os.getpid()),  # its runs publish only while this build holds the lock
        }
        self.log_path = logs_dir(self.home) / WEBSERVER_LOG
        self._log: IO[bytes] | None = None
        self._verbose = verbose
        self._ui: subprocess.Popen[bytes] | None = None
        self._connected = False  # the webserver answers and serves the code location
        self._clients = threading.local()  # a GraphQL client per thread: gql's sends one request at a time
        self.launched: list[str] = []  # every run id launched, in order
        self._lock = threading.Lock()
        self._in_flight = 0  # launch requests sent and not yet answered
        self._answered = threading.Condition(self._lock)
        self._ready = threading.Lock()
        # set when the build stops: no run is launched after it, and one in flight is canceled
        # by the thread that launched it (runs.launch_selection)
        self.closed = threading.Event()

    def start(self) -> None:
        """Start the webserver (it starts its code server); if it cannot start, nothing is left
        running."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        # the webserver's own code server loads the definitions (the location `make ui` serves)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed by stop)
        # a session of its own: a terminal's Ctrl-C reaches the build alone, which cancels the runs
        # through the instance (spared by the stop guard meanwhile), so that they end as canceled
        self._ui = _spawn(
            [
                _dagster_cli("dagster-webserver"),
                "-m", DEFINITIONS_MODULE, "-a", "defs", "-d", os.getcwd(),
                "-h", "127.0.0.1",
                "-p", str(self.ui_port),
                "--log-level", "warning",
            ],
            env=self.env,
            stdout=None if self._verbose else self._log,
            stderr=None if self._verbose else self._log,
            start_new_session=True,
        )  # fmt: skip
        spare(self._ui.pid)

    def _await(self, answers: Callable[[], bool]) -> None:
        """Return once ``answers()`` (the webserver serves); a named error pointing at its log if it
        exited or never answered, :meth:`_stopping`'s if the build stops meanwhile."""
        assert self._ui is not None
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            self._stopping()
            if self._ui.poll() is not None:
                raise LaunchError(self._failure(f"Dagster's webserver exited (code {self._ui.returncode})"))
            with contextlib.suppress(OSError):
                if answers():
                    return
            time.sleep(0.05)
        raise LaunchError(
            self._failure(f"Dagster's webserver did not answer within {SERVER_START_TIMEOUT:.0f} s")
        )

    def _failure(self, what: str) -> str:
        """``what`` went wrong, with the last error the log names (a traceback's last line: the
        code server's, whose start-up the webserver logs at length), else its last line."""
        tail = ""
        if self._verbose:  # -v: its output went to the terminal, not to the log
            where = "Its output is above (-v)"
        else:
            where = f"Its log: {self.log_path}"
            with contextlib.suppress(OSError):
                text = self.log_path.read_text(encoding="utf-8", errors="replace")
                lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
                errors = [ln for ln in lines if _ERROR_LINE.match(ln)]
                tail = (errors or lines or [""])[-1]
        return (
            f"{what} while loading {DEFINITIONS_MODULE}"
            + (f": {tail[:400]}" if tail else "")
            + f". {where}. Fix what it names, then re-run (or `--run-in-process` to run the steps in "
            "this process)"
        )

    def client(self) -> Any:
        """This thread's GraphQL client of the build's webserver, once the webserver answers and
        serves the code location loaded (:func:`location_loaded`); a named error pointing at its
        log if it exited, never answered, or serves the location with the error its load raised.
        Each thread has its own, so that runs launched from two threads (the kit's, the stream's)
        start their workers side by side."""
        with self._ready:  # one connection however many threads ask at once
            if not self._connected:
                self._connect()
                self._connected = True
        client = getattr(self._clients, "client", None)
        if client is None:
            client = self._clients.client = self._new_client()
        return client

    def _new_client(self) -> Any:
        from dagster_graphql import DagsterGraphQLClient

        return DagsterGraphQLClient("127.0.0.1", port_number=self.ui_port)

    def _stopping(self, job: str | None = None) -> None:
        """Raise when the build is stopping: no run (of ``job``) is launched, and a thread waiting
        for the servers ends at once."""
        if self.closed.is_set():
            raise LaunchError(f"not launching a run{f' of {job}' if job else ''}: the build is stopping")

    def _connect(self) -> None:
        _quiet_gql_deprecations()

        def answers() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/server_info", timeout=1):
                return True

        self._await(answers)
        # The webserver loads its code location before it serves (Dagster's workspace context loads
        # every location when it is made): asking for the location's state is enough, where a
        # reload would start a second code server on the path to the first run.
        if not location_loaded(self.ui_port):  # the log names the load's error
            raise LaunchError(self._failure("the code location did not load"))

    def launch(self, job: str, tags: dict[str, str], run_config: dict[str, Any]) -> str:
        """Launch one run of ``job`` through the instance, as the UI's Launch button does (the
        webserver's ``launchPipelineExecution``); its run id."""
        from dagster_graphql import DagsterGraphQLClientError

        client = self.client()
        with self._lock:
            self._stopping(job)
            self._in_flight += 1
        try:
            run_id = str(
                client.submit_job_execution(
                    job,
                    repository_location_name=LOCATION_NAME,
                    repository_name=REPOSITORY_NAME,
                    run_config=run_config,
                    tags={**tags, BUILD_TAG: self.build_id},
                )
            )
        except DagsterGraphQLClientError as err:
            # the client's own message repeats the query; what went wrong is its cause's
            said = " ".join(str(err.__cause__ or err).split()) or type(err).__name__
            raise LaunchError(
                f"Dagster did not launch a run of {job}: {said[:500]}. Fix what it names, then re-run"
            ) from None
        finally:
            with self._lock:
                self._in_flight -= 1
                self._answered.notify_all()
        with self._lock:
            self.launched.append(run_id)
        return run_id

    def close(self, instance: dg.DagsterInstance) -> list[str]:
        """Launch no run from now on; every run of this build so far: those launched (a launch
        request still unanswered is waited for, at most ``LAUNCH_WAIT_S``: its run is created and
        started by then), and any the webserver made from a request the stop interrupted (the
        build's tag)."""
        with self._lock:
            self.closed.set()
            self._answered.wait_for(lambda: self._in_flight == 0, timeout=LAUNCH_WAIT_S)
            launched = list(self.launched)
        tagged = [r.run_id for r in instance.get_runs(filters=dg.RunsFilter(tags={BUILD_TAG: self.build_id}))]
        return list(dict.fromkeys([*launched, *tagged]))

    def stop(self) -> None:
        """Stop the webserver's session (SIGTERM, then SIGKILL after ``STOP_WAIT_S``): its runs are
        over (or canceled) by now."""
        self.closed.set()
        if self._ui is not None:
            # its session: the webserver, its code server and the run workers that one started (a
            # worker whose step left a thread that does not stop never exits of itself)
            stop_groups([self._ui], STOP_WAIT_S)
            unspare(self._ui.pid)
        self._ui = None
        if self._log is not None:
            self._log.close()
        self._log = None


def queued_warn_seconds() -> float:
    """How long a launched run may wait in the instance's queue before the build says why
    (``STAGE2_QUEUED_WARN_S``, default 30)."""
    return env_number("STAGE2_QUEUED_WARN_S", 30.0)


class BuildStopped(Stage2Error):
    """The build stopped while a thread of its own waited for a launched run (the build cancels the
    run; the thread ends at once)."""


def wait_for_run(
    instance: dg.DagsterInstance,
    run_id: str,
    *,
    interval: float = 0.2,
    stop: threading.Event | None = None,
) -> dg.DagsterRunStatus:
    """Block until the run ``run_id`` has finished; its final status. A run still queued after
    :func:`queued_warn_seconds` is said once on stderr, with what dequeues it: an instance whose
    ``dagster.yaml`` queues runs (``QueuedRunCoordinator``) starts them from its daemon only.
    ``stop`` set (the build stopped: ``CodeServer.closed``) ends the wait with :class:`BuildStopped`:
    a thread beside the build's main one must not outlive the stop (the build cancels the run)."""
    queued_since: float | None = None
    said = False
    while True:
        if stop is not None and stop.is_set():
            raise BuildStopped(f"the build stopped while run {run_id} went on; it is canceled")
        record = instance.get_run_record_by_id(run_id)
        status = record.dagster_run.status if record is not None else None
        if status in FINISHED:
            assert status is not None
            return status
        if record is not None and status == dg.DagsterRunStatus.QUEUED:
            queued_since = queued_since if queued_since is not None else time.monotonic()
            if not said and time.monotonic() - queued_since >= queued_warn_seconds():
                said = True
                print(
                    f"stage2 build: run {run_id} of {record.dagster_run.job_name} is "
                    f"still queued: this instance ({os.environ.get('DAGSTER_HOME', 'DAGSTER_HOME')}) "
                    "queues launched runs for its daemon. Fix: run `dagster-daemon run` for it, or "
                    "set `run_coordinator: {module: dagster.core.run_coordinator, class: "
                    "DefaultRunCoordinator}` in its dagster.yaml, or build with --run-in-process; "
                    "waiting",
                    file=sys.stderr,
                    flush=True,
                )
        time.sleep(interval)


#: how long a stop waits for the runs it cancels to end: within the stop guard's spared time
#: (``stops.SPARE_S``), after which it ends them itself
CANCEL_WAIT_S = 5.0
#: how long the webserver's session is given to exit once asked to, before it is killed
STOP_WAIT_S = 2.0
#: how long a stop waits for a launch request in flight to be answered (its run then started)
LAUNCH_WAIT_S = 3.0


def _steps_all_ended(instance: dg.DagsterInstance, run: dg.DagsterRun, plans: dict[str, set[str]]) -> bool:
    """Whether every step the started run ``run`` planned has ended (succeeded, failed or been
    skipped): the run then only writes its own end. False while a step runs, and for a run whose
    plan is not known. ``plans``: each run's planned step keys, read once and kept there (a stop
    asks again every poll)."""
    if run.status != dg.DagsterRunStatus.STARTED or run.execution_plan_snapshot_id is None:
        return False
    planned = plans.get(run.run_id)
    if planned is None:
        plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
        planned = plans[run.run_id] = set(run.step_keys_to_execute or plan.step_keys_to_execute)
    if not planned:
        return False
    ended = {s.step_key for s in instance.get_run_step_stats(run.run_id) if s.end_time is not None}
    return planned <= ended


def terminate_runs(
    instance: dg.DagsterInstance,
    run_ids: list[str],
    *,
    wait_s: float = CANCEL_WAIT_S,
    more: Callable[[], list[str]] | None = None,
) -> None:
    """Cancel every run of ``run_ids`` (and of ``more()``, asked again while it waits: a run the
    webserver makes from a launch request the stop interrupted appears late) that has not
    finished, as the UI's Terminate does (through the instance's run coordinator: a queued run is
    dequeued as canceled, a started one terminated by the run launcher), and wait, at most
    ``wait_s``, until each has ended, so that the code server that runs it is still there when its
    worker reports the end. A run whose worker is still starting is let start first. Otherwise
    Dagster marks the run failed, not canceled, and the failed-run alert fires: a worker that
    starts after the cancel ("started a new run worker while the run was already in state
    CANCELING"), a worker whose code server went first ("Could not reach user code server"). A run
    still not ended then (never launched: the webserver skips a run already canceling; or its
    worker is about to be ended with the build's webserver) is recorded as canceled.

    A started run whose planned steps have all ended is let end by itself too: Dagster's Terminate
    reads a run and then marks it canceling, and a success recorded between the two is lost (the
    run is failed as "unexpectedly exited"). Waiting for such a run leaves that window only for the
    last moments of a run's own ending, where it cannot be told from outside."""
    deadline = time.monotonic() + wait_s
    asked: set[str] = set()
    plans: dict[str, set[str]] = {}
    pending = list(dict.fromkeys(run_ids))
    while True:
        late = time.monotonic() >= deadline
        if more is not None:
            pending = list(dict.fromkeys([*pending, *more()]))
        still = []
        for run_id in pending:
            record = instance.get_run_record_by_id(run_id)
            if record is None or record.dagster_run.status in FINISHED:
                continue
            still.append(run_id)
            run = record.dagster_run
            # a run's plan and step stats are read only while it is still to be asked
            if run_id not in asked and (
                late
                or not (run.status == dg.DagsterRunStatus.STARTING or _steps_all_ended(instance, run, plans))
            ):
                asked.add(run_id)
                with contextlib.suppress(Exception):  # already gone: nothing to terminate
                    instance.run_coordinator.cancel_run(run_id)
        pending = still
        if not pending:
            return
        if late:
            break
        time.sleep(0.1)
    for run_id in pending:
        record = instance.get_run_record_by_id(run_id)
        if record is not None and record.dagster_run.status not in FINISHED:
            instance.report_run_canceled(
                record.dagster_run, message="Canceled: the build that launched this run was stopped."
            )
