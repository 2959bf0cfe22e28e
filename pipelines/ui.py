"""`make ui`: the Dagster web UI on 127.0.0.1 over the same instance and settings as `make demo`.

Paths come from the environment (``config.py``), relative to the working directory: the demo in
``STAGE2_DEMO_ROOT`` (``./.demo``), the instance in ``DAGSTER_HOME`` (``./.dagster_home``), the code
location from ``STAGE2_WORKSPACE`` (a workspace file) or else the module ``stage2_pipelines.definitions``,
the port from ``STAGE2_UI_PORT`` (3000) and the services' log level from ``STAGE2_UI_LOG_LEVEL``
(``warning``: the webserver and the daemon say something only when something goes wrong, not at
every sensor or schedule tick).

The ``STAGE2_*`` settings the code location parses (``BuildConfig.from_env``: the executor, the
storage options, ...) and those it reads late (``config.check_settings``) are checked first, demo or
not: a bad one is refused in one line naming the variable and the fix. The code location gets the
settings of the environment when ``STAGE2_PROFILE`` is set (what
`stage2 build` prints on its ``UI:`` line for its own build: ``config.ui_command``), once its
definitions load with them (a missing profile is refused in one line, not shown as a code location
error in a UI that started anyway); otherwise the
demo is generated if needed and the code location gets the settings `stage2 demo` builds with (the
demo's profile and data root, its hub folder served on loopback by each run that downloads:
``STAGE2_HUB_FOLDER``). Either way a build's runs are runs of the jobs the UI shows, and Re-execute
runs them again as they ran.

Starts `dagster dev` in its own process group and prints the UI's URL once the webserver answers
(``/server_info``). On SIGINT or SIGTERM (Ctrl-C), or when `dagster dev` exits, it stops the group
by PID: SIGTERM to every process of the group (webserver, daemon, code server), SIGKILL of what is
left after :data:`STOP_GRACE` seconds, so nothing is left behind. A stop asked for by a signal exits 0 (``make``
then reports no error); `dagster dev` ending on its own exits with its code.

Without the pipeline extra (a core install: Dagster missing) it says what `stage2 build` says
there, what to install, in one line (exit 2); Dagster is imported only once it is known to be there.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import IO

from stage2_data.demo import generate_demo
from stage2_data.errors import Stage2Error

from .config import (
    BuildConfig,
    build_command,
    check_settings,
    dagster_home,
    demo_root,
    demo_settings,
    shared_instance_note,
    write_instance_yaml,
)
from .stops import stop_groups

STOP_GRACE = 5.0  # seconds a process group has to end after SIGTERM before it is killed
START_TIMEOUT = 180.0  # seconds the webserver has to answer before `make ui` gives up


class _Stop(Exception):
    """Raised by the SIGINT/SIGTERM handler: stop everything and exit 0."""


def answers(url: str) -> bool:
    """``url`` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _wait_in_slices(proc: subprocess.Popen[bytes], slice_s: float = 0.25) -> int:
    """``proc``'s exit code, waiting in short slices rather than in one blocking ``waitpid``. The
    kernel hands a signal sent to this process to any of its threads that does not block it (native
    ones included: an allocator's or a thread pool's from an imported library), and only the thread
    that takes it has its system call interrupted; CPython runs the Python handler in the main
    thread when that thread next runs bytecode. A main thread blocked in one ``waitpid`` would then
    not see a Ctrl-C until `dagster dev` ended on its own."""
    while True:
        try:
            return proc.wait(timeout=slice_s)
        except subprocess.TimeoutExpired:
            continue


def wait_until_answering(url: str, proc: subprocess.Popen[bytes], timeout: float = START_TIMEOUT) -> bool:
    """Poll ``url`` until it answers (True), ``proc`` exits or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if answers(url):
            return True
        time.sleep(0.25)
    return False


def port_problem(raw: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why the UI cannot serve on 127.0.0.1 port ``raw`` (``STAGE2_UI_PORT``), said before anything
    starts; None when it can. A port another server holds (a second `make ui`, a web app's dev
    server on 3000) would otherwise make the webserver fail to bind while this waits for it, or,
    worse, find that other server answering in its place. The fix is this `make ui` again on a free
    port, with the settings of ``env`` (this process's environment) repeated: :func:`again_on`."""
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        return f"STAGE2_UI_PORT={raw!r} is not a TCP port (1-65535). Fix: set it to one, or unset it for 3000"
    why = _bind_problem(port)
    if why is None:
        return None
    free = next((p for p in range(port + 1, min(port + 100, 65536)) if _bind_problem(p) is None), None)
    env = os.environ if env is None else env
    other = f"({free} is free now): {again_on(str(free), env)}" if free else again_on("<a free port>", env)
    return f"port {port} on 127.0.0.1 is not free ({why}). Fix: stop what holds it, or serve on another port {other}"


def again_on(port: str, env: Mapping[str, str]) -> str:
    """The command that starts this `make ui` again on ``port``, as pasted: ``STAGE2_UI_PORT`` in
    front, then every ``STAGE2_*`` and ``DAGSTER_HOME`` setting of ``env`` (those given on the line
    that started this one: a pasted `UI:` line's profile, data root, hub folder and instance),
    quoted for the shell; `make ui` when `make` started this, else this interpreter's ``-m
    stage2_pipelines.ui``. ``STAGE2_STORE_OPTIONS`` (it may hold credentials) is said, not printed."""
    given = [
        k for k in env if k.startswith("STAGE2_") and k not in ("STAGE2_UI_PORT", "STAGE2_STORE_OPTIONS")
    ]
    said = " ".join(f"{k}={shlex.quote(env[k])}" for k in [*given, "DAGSTER_HOME"] if k in env)
    port = port if port.startswith("<") else shlex.quote(port)  # a placeholder is not a value
    run = "make ui" if env.get("MAKELEVEL") else f"{shlex.quote(sys.executable)} -m stage2_pipelines.ui"
    line = " ".join(w for w in (f"STAGE2_UI_PORT={port}", said, run) if w)
    if env.get("STAGE2_STORE_OPTIONS"):  # a shell comment: the line still runs as pasted
        line += "  # with STAGE2_STORE_OPTIONS set as now"
    return line


def _bind_problem(port: int) -> str | None:
    """Why the webserver could not bind 127.0.0.1:``port`` now; None when it could."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the webserver binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def nothing_built_hint(
    profile: Path, data_root: Path, *, home: Path, build: BuildConfig | None
) -> str | None:
    """A line for a UI over a data root where nothing is published yet (`make ui` before `make
    demo`), saying how to build it: `make demo` for the demo (``build`` None), else the `stage2
    build` of ``build``'s settings (:func:`build_command`). What the instance at ``home`` records is
    said as it is: no runs, or how many and how the last one ended (a build that failed, runs
    launched from the UI). None once a store is published."""
    from stage2_data import layout
    from stage2_data.profile import load_profile

    try:
        name = load_profile(profile).name
    except Stage2Error:
        return None
    if os.path.lexists(layout.current_store_path(data_root, name)):
        return None
    how = "`make demo`" if build is None else f"`{build_command(build, home)}`"
    if build is not None and build.store_options:
        how += " (with a --storage-option KEY=VALUE for each of STAGE2_STORE_OPTIONS, not shown: it may hold credentials)"
    nothing = f"nothing is published in {data_root.absolute()} yet"
    ways = f"{how} builds it (its runs then show on their jobs' pages), or use Materialize all on the asset graph"
    runs = recorded_runs(home)
    if runs is None:  # the instance could not be read: nothing said of its runs
        return f"{nothing}: {ways}"
    count, last, failed = runs
    if not count:
        return f"{nothing}, so the UI shows no runs: {ways}"
    recorded = "1 run is" if count == 1 else f"{count} runs are"
    if failed:  # a build that failed: what failed comes first, whatever ran after it
        n, job = failed
        return (
            f"{nothing}; {recorded} recorded, {n} of them failed (the newest: {job}; its page on Runs "
            f"names why): fix that, then {ways}"
        )
    return f"{nothing}; {recorded} recorded, the last {last} (see Runs): {ways}"


def shared_instance_hint(home: Path, data_root: Path) -> str | None:
    """A line for a UI over ``data_root`` whose instance also records other data roots' builds
    (:func:`.config.shared_instance_note`); None when it records no other, when it is the data
    root's own instance (runs copied with it), or when it cannot be read."""
    import dagster as dg

    from .runs import other_data_roots

    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            others = other_data_roots(instance, home, data_root)
    except Exception:  # a hint only: `dagster dev` reports an instance it cannot open
        return None
    return shared_instance_note(home, data_root.absolute(), others) if others else None


# how a run that ended, or has not, is said: "the last (<job>) failed"
_RUN_ENDS = {
    "SUCCESS": "succeeded",
    "FAILURE": "failed",
    "CANCELED": "was canceled",
    "CANCELING": "is being canceled",
    "STARTING": "is running",
    "STARTED": "is running",
    "QUEUED": "is queued",
    "NOT_STARTED": "has not started",
}


def recorded_runs(home: Path) -> tuple[int, str, tuple[int, str] | None] | None:
    """How many runs the Dagster instance at ``home`` records, how the last one went
    ("(download_and_extract) failed"), and how many failed with the job of the newest that did
    (None: none failed); None when the instance cannot be read (`dagster dev` then says why)."""
    import dagster as dg

    failure = dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            count = instance.get_runs_count(dg.RunsFilter())
            last = instance.get_runs(dg.RunsFilter(), limit=1)
            failures = instance.get_runs_count(failure)
            newest_failed = instance.get_runs(failure, limit=1) if failures else []
    except Exception:  # a hint only: `dagster dev` reports an instance it cannot open
        return None
    failed = (failures, newest_failed[0].job_name) if newest_failed else None
    if not last:
        return count, "", failed
    status = last[0].status.value
    return count, f"({last[0].job_name}) {_RUN_ENDS.get(status, status.lower())}", failed


def _served(home: Path, held_by: str) -> str:
    return (
        f"the Dagster instance {home} is already served by `make ui` at {held_by}. Fix: open that "
        "URL, or stop that `make ui` (Ctrl-C in its terminal) and start this one, or give this one "
        "another instance (DAGSTER_HOME=<another folder> make ui)"
    )


def served_by(home: Path) -> str | None:
    """Why `make ui` cannot serve the instance at ``home``: another `make ui` holds it (its URL);
    None when none does. Looks only (a shared probe of :func:`hold_instance`'s lock): nothing is
    taken or written."""
    import fcntl

    try:
        f = open(home / "stage2-logs" / "ui.lock", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _served(home, f.read().strip() or "another `make ui`")
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def hold_instance(home: Path, url: str) -> tuple[IO[str] | None, str | None]:
    """One `make ui` an instance: ``dagster dev`` runs a daemon, and a second daemon over the same
    instance (a second `make ui` on another port) fights the first for its schedules and sensors.
    Holds ``<home>/stage2-logs/ui.lock`` (flock, released when this process ends, however it ends)
    and writes this UI's URL into it; returns (the open lock file, None), or (None, why not: the URL
    of the UI that holds it)."""
    import fcntl

    path = home / "stage2-logs" / "ui.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the life of this process
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        held_by = f.read().strip() or "another `make ui`"
        f.close()
        return None, _served(home, held_by)
    f.seek(0)
    f.truncate()
    f.write(f"{url} (pid {os.getpid()})\n")
    f.flush()
    return f, None


def usage() -> str:
    """`make ui`'s help: what it serves and every setting it reads (the build's settings are those
    ``BuildConfig.to_env`` writes and the code location reads)."""
    import textwrap

    build = textwrap.fill(
        ", ".join(sorted(BuildConfig(profile_path="", data_root="").to_env())),
        width=96,
        initial_indent="    ",
        subsequent_indent="    ",
    )
    return f"""usage: make ui  (or: python -m stage2_pipelines.ui)

Serves the Dagster web UI on http://127.0.0.1:$STAGE2_UI_PORT (3000) over the instance in
$DAGSTER_HOME (./.dagster_home): the demo's settings, or a build's when STAGE2_PROFILE is set (the
line `stage2 build` prints after `UI:`). Ctrl-C stops it and everything it started. It takes no
arguments; its settings come from the environment:
  the UI's own: STAGE2_UI_PORT, STAGE2_UI_LOG_LEVEL (warning), STAGE2_DEMO_ROOT (./.demo),
    STAGE2_WORKSPACE
  the build's (as `stage2 build` prints them on its `UI:` line):
{build}"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:  # settings come from the environment: `--help` prints them, anything else is refused
        if args[0] in ("-h", "--help"):
            print(usage())
            return 0
        print(f"make ui: takes no arguments (got {' '.join(args)}). Fix: set its STAGE2_* settings in the "
              "environment (`python -m stage2_pipelines.ui --help` lists them)", file=sys.stderr)  # fmt: skip
        return 2
    if find_spec("dagster") is None:  # a core install, without the pipeline extra
        from stage2_data.cli import missing_extra_text

        # what `stage2 build` says without the extra, said of the UI
        print(missing_extra_text("build", who="make ui", subject="the web UI"), file=sys.stderr)
        return 2
    from . import definitions

    env = dict(os.environ)
    port = env.get("STAGE2_UI_PORT", "3000")
    problem = port_problem(port, env)
    if problem is not None:
        # the port held by this instance's own `make ui`: another port would be refused too
        print(f"make ui: {served_by(dagster_home()) or problem}", file=sys.stderr)
        return 2
    refused = "make ui: the code location does not load with these settings:"
    chosen = env.get("STAGE2_PROFILE")  # unset or empty: the demo's settings
    if chosen and not Path(chosen).is_file():  # said as the variable a user set, not as a CLI flag
        there = "a folder" if Path(chosen).is_dir() else "nothing"
        print(
            f"make ui: STAGE2_PROFILE={chosen!r} names {there}, not a profile file (read from "
            f"{Path.cwd()}). Fix: set STAGE2_PROFILE to a profile .toml's path, or unset it to serve the demo",
            file=sys.stderr,
        )
        return 2
    try:  # the settings the code location parses (executor, storage options, ...), demo or not:
        # a bad one is said here in one line, before a demo is generated or anything starts
        check_settings()
        config = BuildConfig.from_env()
    except Stage2Error as e:
        print(f"{refused} {e}", file=sys.stderr)
        return 2
    if not chosen:  # the demo's settings, as `make demo` builds it
        generate_demo(demo_root() / "demo")
        env.update(demo_settings())
    else:  # the environment's settings: the code location must load with them, or the UI shows
        # nothing but its error; the same load `dagster dev` makes, said here in one line
        try:
            definitions.defs_from_env()
        except Stage2Error as e:
            print(f"{refused} {e}", file=sys.stderr)
            return 2
        if not env.get("STAGE2_DATA_ROOT"):  # the default is the demo's: a real profile's runs
            # launched from this UI would download and write into the demo's data root
            print(
                f"make ui: STAGE2_PROFILE={chosen} is set without STAGE2_DATA_ROOT, so this UI's runs "
                f"would write into the demo's data root ({(demo_root() / 'data').absolute()}). Fix: set "
                "STAGE2_DATA_ROOT to the data root that profile's build fills (the `UI:` line `stage2 "
                "build` prints has both), or unset STAGE2_PROFILE to serve the demo",
                file=sys.stderr,
            )
            return 2
    env["DAGSTER_HOME"] = str(dagster_home())
    Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    held, busy = hold_instance(Path(env["DAGSTER_HOME"]), f"http://127.0.0.1:{port}")
    if busy is not None:
        print(f"make ui: {busy}", file=sys.stderr)
        return 2
    write_instance_yaml(Path(env["DAGSTER_HOME"]))
    log_level = env.get("STAGE2_UI_LOG_LEVEL", "warning")

    stopping = [False]

    def on_signal(*_: object) -> None:
        # the first signal stops the UI; any more (a group's SIGTERM beside a Ctrl-C, a second
        # Ctrl-C) do nothing from then on, so none interrupts the stop itself. The handler stays:
        # one swapped for SIG_IGN while a signal is pending makes CPython print "Signal 15 ignored
        # due to race condition"
        if stopping[0]:
            return
        stopping[0] = True
        raise _Stop

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    procs: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = []
    try:
        workspace = os.environ.get("STAGE2_WORKSPACE")
        location = ["-w", workspace] if workspace else ["-m", definitions.__name__, "-a", "defs"]
        ui_url = f"http://127.0.0.1:{port}"
        env.setdefault("STAGE2_UI_URL", ui_url)  # the alerts' run links: this UI, on its own port
        print(
            f"starting the Dagster UI (instance {env['DAGSTER_HOME']}; profile {env['STAGE2_PROFILE']}, "
            f"data root {Path(env['STAGE2_DATA_ROOT']).absolute()}) ...",
            flush=True,
        )
        hint = nothing_built_hint(
            Path(env["STAGE2_PROFILE"]),
            Path(env["STAGE2_DATA_ROOT"]),
            home=Path(env["DAGSTER_HOME"]),
            build=config if chosen else None,  # the environment's settings, as the code location's
        )
        if hint:
            print(hint, flush=True)
        shared = shared_instance_hint(Path(env["DAGSTER_HOME"]), Path(env["STAGE2_DATA_ROOT"]))
        if shared:
            print(f"note: {shared}", flush=True)
        ui = subprocess.Popen(
            [
                sys.executable,
                # `dagster dev` names its successor (`dg dev`, another package) at every start
                "-W",
                "ignore:Function `dev_command` is superseded",
                "-m",
                "dagster",
                "dev",
                *location,
                "-h",
                "127.0.0.1",
                "-p",
                port,
                "--log-level",
                log_level,
            ],
            env=env,
            start_new_session=True,
        )
        procs.append(ui)
        t0 = time.monotonic()
        if not wait_until_answering(ui_url + "/server_info", ui):
            why = f"exited with {ui.returncode}" if ui.poll() is not None else "did not answer"
            print(f"make ui: the Dagster webserver {why} (see the log above)", file=sys.stderr)
            return 2
        print(
            f"Dagster UI:   {ui_url}  (answering after {time.monotonic() - t0:.0f} s; Ctrl-C stops it)",
            flush=True,
        )
        rc = _wait_in_slices(ui)
        return rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's 128 + N
    except _Stop:
        print("\nmake ui: stopping the UI ...", file=sys.stderr, flush=True)
        return 0
    finally:
        stopping[0] = True  # a signal while the groups stop must not leave them running
        stop_groups(procs, STOP_GRACE)


if __name__ == "__main__":
    sys.exit(main())
