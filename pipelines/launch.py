"""Runs launched through the instance, as the UI, a schedule or a sensor launches them.

`stage2 build` starts one code server for the build (``dagster api grpc`` over the project's
definitions, with the build's settings in its environment: :meth:`BuildConfig.to_env`) and launches
each stage's run with Dagster's own ``dagster job launch`` against it. The instance's run launcher
starts the run's worker process from that server, so every run carries the code location's origin
(``LOCATION_NAME``, the name ``workspace.yaml`` gives the same module): the UI lists it on its job's
page and on the Overview timeline, and Re-execute loads the same job. A run's outcome is read back
from the instance (``runs.RecordedRun``), whichever way it was started.

A stop cancels the build's runs through the instance (:func:`terminate_runs`): a run ends as
canceled, its step interrupted, whatever signal the build's own process received.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

import dagster as dg

from stage2_data.errors import Stage2Error, env_number

from .config import BuildConfig

# The code location's name: what `workspace.yaml` (module ``stage2_pipelines.definitions``, attribute
# ``defs``) calls it, so a build's runs and the UI's are runs of one location.
LOCATION_NAME = "stage2_pipelines.definitions:defs"
DEFINITIONS_MODULE = "stage2_pipelines.definitions"
SERVER_START_TIMEOUT = 180.0  # seconds for the code server to load the definitions
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


class LaunchError(Stage2Error):
    """The build's code server or a launch failed: the definitions did not load, or Dagster refused
    the run. The message carries Dagster's own words and where its log is."""


def _dagster_cli() -> str:
    """The ``dagster`` command of this environment (beside this interpreter)."""
    beside = Path(sys.executable).with_name("dagster")
    return str(beside) if beside.exists() else (shutil.which("dagster") or "dagster")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CodeServer:
    """One ``dagster api grpc`` server of the project's definitions for one build's settings; the
    build's runs are launched against it (:meth:`launch`) and their worker processes are its
    children. Use as a context manager: stopped (after its runs) when the build ends."""

    def __init__(self, config: BuildConfig, dagster_home: Path, *, verbose: bool = False) -> None:
        self.home = Path(dagster_home)
        self.port = free_port()
        self.env = {
            **os.environ,
            **config.to_env(),
            "DAGSTER_HOME": str(self.home),
            "PYTHONUNBUFFERED": "1",
        }
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / "code-server.log"
        self._log: IO[bytes] | None = None
        self._verbose = verbose
        self._workdir = tempfile.mkdtemp(prefix="stage2-launch-")
        self.workspace = Path(self._workdir) / "workspace.yaml"
        self.workspace.write_text(
            "load_from:\n"
            "  - grpc_server:\n"
            "      host: 127.0.0.1\n"
            f"      port: {self.port}\n"
            f"      location_name: {json.dumps(LOCATION_NAME)}\n",
            encoding="utf-8",
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self.launched: list[str] = []  # every run id launched, in order
        self._lock = threading.Lock()
        # set when the build stops: no run is launched after it, and one in flight is canceled
        # by the thread that launched it (runs.launch_selection)
        self.closed = threading.Event()

    def __enter__(self) -> CodeServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        out: Any = None
        if not self._verbose:
            # this build's server and runs only: the file holds the last build's log, not every one
            self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed by stop)
            out = self._log
        self._proc = subprocess.Popen(
            [
                _dagster_cli(), "api", "grpc",
                "--module-name", DEFINITIONS_MODULE,
                "--attribute", "defs",
                "--host", "127.0.0.1",
                "--port", str(self.port),
                "--location-name", LOCATION_NAME,
                "--working-directory", os.getcwd(),
            ],
            env=self.env,
            stdout=out,
            stderr=out,
            start_new_session=False,
        )  # fmt: skip

    def wait_ready(self) -> None:
        """Return once the server answers (it serves after the definitions loaded); a named error
        pointing at its log if it exited or never answered."""
        assert self._proc is not None
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise LaunchError(self._failure(f"the code server exited (code {self._proc.returncode})"))
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
                return
            time.sleep(0.05)
        raise LaunchError(
            self._failure(f"the code server did not answer within {SERVER_START_TIMEOUT:.0f} s")
        )

    def _failure(self, what: str) -> str:
        tail = ""
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            tail = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
        return (
            f"{what} while loading {DEFINITIONS_MODULE}"
            + (f": {tail[:400]}" if tail else "")
            + f". Its log: {self.log_path}. Fix what it names, then re-run (or `--run-in-process` to "
            "run the steps in this process)"
        )

    def launch(self, job: str, run_id: str, tags: dict[str, str], run_config: dict[str, Any]) -> None:
        """Launch one run of ``job`` through the instance (Dagster's ``dagster job launch``)."""
        self.wait_ready()
        with self._lock:
            if self.closed.is_set():
                raise LaunchError(f"not launching a run of {job}: the build is stopping")
            self.launched.append(run_id)
        cmd = [
            _dagster_cli(), "job", "launch",
            "-w", str(self.workspace),
            "-j", job,
            "--run-id", run_id,
            "--tags", json.dumps(tags),
            "--config-json", json.dumps(run_config),
        ]  # fmt: skip
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            lines = [ln for ln in (done.stderr or done.stdout).strip().splitlines() if ln.strip()]
            said = lines[-1].strip() if lines else f"exit code {done.returncode}"
            raise LaunchError(
                f"Dagster did not launch a run of {job}: {said[:500]}. Fix what it names, then re-run"
            )

    def close(self) -> list[str]:
        """Launch no run from now on; every run id launched so far (a launch still in flight then
        cancels its own run: ``runs.launch_selection``)."""
        with self._lock:
            self.closed.set()
            return list(self.launched)

    def stop(self) -> None:
        """Stop the server: it waits for nothing, its runs are over (or terminated) by now."""
        self.closed.set()
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self._workdir, ignore_errors=True)


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


def terminate_runs(instance: dg.DagsterInstance, run_ids: list[str]) -> None:
    """Cancel every run of ``run_ids`` that has not finished, as the UI's Terminate does: through the
    instance's run coordinator (a queued run is dequeued as canceled, a started one terminated by the
    run launcher)."""
    for run_id in run_ids:
        record = instance.get_run_record_by_id(run_id)
        if record is None or record.dagster_run.status in FINISHED:
            continue
        with contextlib.suppress(Exception):  # already gone: nothing to terminate
            instance.run_coordinator.cancel_run(run_id)
