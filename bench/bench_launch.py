"""What it costs to run a build's Dagster run through the instance, against the project's code
location, instead of executing its job in a process of its own (issue #27: one orchestrator).

- ``launch_via_instance_vs_execute_job`` (informational, no target): the store stage's job
  (``verify_kit_and_build_store``: everything after the extraction) on the built demo's data root,
  where its steps find their work done. Two ways, each a fresh process, alternated ``ROUNDS``
  times, best of each:

  - ours: ``dagster job launch -w workspace.yaml -j verify_kit_and_build_store`` with the in-process
    executor (run config), on an instance whose ``dagster.yaml`` is stage2's (``instance_config``)
    plus Dagster's ``DefaultRunCoordinator`` (without it a launched run waits, QUEUED, for a daemon).
    The CLI loads the workspace (a code server process), creates the run with the code location's
    origin and hands it to the run launcher, which starts a run worker (``dagster api
    execute_run``); the run then appears on the job's own page and the Overview timeline. Waited for
    until the CLI has exited and the run has ended (polling the instance).
  - baseline: today's path, ``stage2 build``'s: ``runs.run_selection`` of the kit and store stages' assets in a fresh
    ``python`` (``dagster.execute_job`` on a reconstructable job; the run has no remote origin).
  - ``running_server_*`` (informational, a third way in each round): the same launch against a code
    server started once beforehand (``dagster api grpc``, as a workspace's ``grpc_server`` location
    of workspace.yaml's name): what a run costs when a build pays for the code location's load once,
    not once a run. ``code_server_ready_s``: that server's start until it says it started.

  All take their settings from the same ``STAGE2_*`` variables (``BuildConfig.from_env``) and record
  into the same instance. Per way: ``wall_s`` (process start to the later of its exit and the run's
  end), ``created_s`` (start to the run's creation: for the launch, the CLI's import, the code
  server's start and load), ``first_step_s`` (start to the first ``STEP_START``), ``run_s`` (the run
  record's creation to its end), ``worker_start_s`` (run created to the run's ``PIPELINE_START``: the
  launch's run worker process starting), ``remote_origin`` (the run has ``remote_job_origin``) and
  ``on_job_page`` (the run matches the filter the UI's job page uses: job name and the
  ``.dagster/repository`` tag of workspace.yaml's code location). ``cli_help_s``: a bare ``dagster
  job launch --help`` (the CLI's import); ``code_server_load_s``: ours' ``created_s`` minus that.
  ``load_avg_1m``: the machine's load average before and after (other work on shared CPUs).
- ``build_launched_vs_in_process`` (informational, no target): a whole first ``stage2 build`` of the
  demo (fresh data root and instance each time, the demo's hub folder served by the runs), as users
  run it (each stage's run launched through the instance against the build's code server:
  ``pipelines/launch.py``) against ``--run-in-process`` (the same runs executed in the build's
  process, one after another: what the test suite runs). Alternated ``ROUNDS`` times, best of each;
  both must give the demo's fingerprint. ``ours_runs``: per launched run, when it was created and
  when it started and ended (seconds after the first run's creation), and whether the UI's job page
  lists it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.run import entry

REPO = Path(__file__).resolve().parents[1]
ROUNDS = int(os.environ.get("STAGE2_BENCH_LAUNCH_ROUNDS", "3"))
DAGSTER = str(Path(sys.executable).parent / "dagster")
JOB = "verify_kit_and_build_store"
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}
REPOSITORY_TAG = ".dagster/repository"  # the tag the UI's job page filters a job's runs by
MODULE = "stage2_pipelines.definitions"  # the code location of workspace.yaml ...
LOCATION = f"{MODULE}:defs"  # ... and its name there
COORDINATOR = {"module": "dagster.core.run_coordinator", "class": "DefaultRunCoordinator"}

# today's path: one run of the store stage's job in this process (as `stage2 build` runs a stage)
EXECUTE_JOB = """\
import json
from stage2_pipelines.config import BuildConfig
from stage2_data.stages import KIT, STORE
from stage2_pipelines.runs import run_selection
run = run_selection(BuildConfig.from_env().to_dict(), [*KIT.assets, *STORE.assets])
print(json.dumps({"run_id": run["run_id"], "success": run["success"]}))
"""


def write_home(home: Path) -> None:
    """A DAGSTER_HOME with stage2's instance config plus the immediate run coordinator."""
    import yaml

    from stage2_pipelines.config import instance_config

    home.mkdir(parents=True, exist_ok=True)
    cfg = {**instance_config(home), "run_coordinator": COORDINATOR}
    (home / "dagster.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")


def launch_env(home: Path, demo: Any, data_root: Path) -> dict[str, str]:
    """The environment of both ways: the code location's settings come from STAGE2_* variables (the
    code server and the run worker inherit them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "HF_TOKEN")}
    env.update(
        DAGSTER_HOME=str(home),
        STAGE2_PROFILE=str(demo.profile),
        STAGE2_DATA_ROOT=str(data_root),
        STAGE2_HUB_FOLDER=str(demo.upstream),
        STAGE2_RUN_LOG_LEVEL="CRITICAL",  # as `stage2 build` runs without --verbose
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    return env


def launch_argv(run_id: str, target: list[str]) -> list[str]:
    """``dagster job launch`` of the job in the code location ``target`` names (a workspace file, or
    a running code server's socket), with the in-process executor."""
    return [DAGSTER, "job", "launch", *target, "-j", JOB, "--run-id", run_id,
            "--config-json", json.dumps(IN_PROCESS)]  # fmt: skip


@contextmanager
def code_server(env: dict[str, str], socket: Path) -> Iterator[float]:
    """A code server of the workspace's code location (same module, attribute, working directory and
    location name) on ``socket``, running for the duration; yields the seconds it took to start and
    load the definitions (until it says it started)."""
    argv = [DAGSTER, "api", "grpc", "-m", MODULE, "-a", "defs", "-d", str(REPO),
            "--socket", str(socket), "--location-name", LOCATION]  # fmt: skip
    t = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    said: list[str] = []
    watchdog = threading.Timer(120, proc.kill)  # a server that never says it started
    watchdog.start()
    for line in proc.stdout:  # its log
        said.append(line)
        if "Started Dagster code server" in line:
            break
    ready = time.perf_counter() - t
    watchdog.cancel()
    if proc.poll() is not None:
        raise RuntimeError(f"code server did not start: {''.join(said)[-2000:]}")
    drain = threading.Thread(target=proc.stdout.read, daemon=True)  # the rest of its log, unread
    drain.start()
    try:
        yield ready
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a server that did not stop on SIGTERM
            proc.kill()
            proc.wait()


def _run_times(instance: Any, run_id: str, t0: float, page_label: str | None) -> dict[str, Any]:
    """What the instance recorded of run ``run_id``, in seconds after ``t0`` (epoch) where it is a
    moment; ``on_job_page``: the run is among those the UI's job page lists for the code location
    labelled ``page_label`` (workspace.yaml's; None: the run's own)."""
    import dagster as dg

    rec = instance.get_run_record_by_id(run_id)
    run = rec.dagster_run
    created = rec.create_timestamp.timestamp()
    events = [e for e in instance.all_logs(run_id) if e.is_dagster_event]
    kinds: dict[str, float] = {}
    for e in events:
        kinds.setdefault(e.dagster_event.event_type_value, e.timestamp)
    # the executor's own line: "Executing steps in process" or "Executing steps using multiprocess executor"
    executed = next((e.message for e in events if (e.message or "").startswith("Executing steps")), None)
    origin = run.remote_job_origin
    own = origin.repository_origin.get_label() if origin is not None else None
    label = page_label or own
    on_page = bool(label) and any(
        r.dagster_run.run_id == run_id
        for r in instance.get_run_records(dg.RunsFilter(job_name=JOB, tags={REPOSITORY_TAG: label}))
    )
    return {
        "status": run.status.value,
        "created_s": round(created - t0, 2),
        "first_step_s": round(kinds.get("STEP_START", float("nan")) - t0, 2),
        "run_s": round((rec.end_time or float("nan")) - created, 2),
        "worker_start_s": round(kinds.get("PIPELINE_START", float("nan")) - created, 2),
        "executor_said": executed.split(" (")[0] if executed else None,
        "remote_origin": origin is not None,
        "on_job_page": on_page,
        "repository_label": own,
    }


def _failures(instance: Any, run_id: str) -> str:
    """The messages of a run's failure events (what a failed run says went wrong)."""
    kinds = ("STEP_FAILURE", "PIPELINE_FAILURE", "RUN_FAILURE")
    msgs = []
    for e in instance.all_logs(run_id):
        if e.is_dagster_event and e.dagster_event.event_type_value in kinds:
            err = getattr(e.dagster_event.event_specific_data, "error", None)
            msgs.append(f"{e.message} {err.to_string() if err else ''}".strip())
    return "\n".join(msgs)[-3000:]


def launch_once(
    instance: Any, env: dict[str, str], target: list[str], page_label: str | None = None, poll_s: float = 0.02
) -> dict[str, Any]:
    """One ``dagster job launch`` of the job, waited for until the CLI has exited and the run ended."""
    run_id = str(uuid.uuid4())
    t0 = time.time()
    p0 = time.perf_counter()
    proc = subprocess.Popen(
        launch_argv(run_id, target),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    said: list[str] = []
    drain = threading.Thread(target=lambda: said.append(proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
    drain.start()
    cli_exit = run_end = None
    while cli_exit is None or run_end is None:
        if cli_exit is None and proc.poll() is not None:
            cli_exit = time.perf_counter() - p0
        if run_end is None:
            run = instance.get_run_by_id(run_id)
            if run is not None and run.is_finished:
                run_end = time.perf_counter() - p0
        if cli_exit is not None and proc.returncode != 0:
            drain.join(10)
            raise RuntimeError(f"dagster job launch failed ({proc.returncode}): {''.join(said)[-3000:]}")
        if time.perf_counter() - p0 > 300:
            proc.kill()
            raise RuntimeError(f"run {run_id} did not end within 300 s")
        time.sleep(poll_s)
    drain.join(10)
    out = _run_times(instance, run_id, t0, page_label)
    if out["status"] != "SUCCESS":
        raise RuntimeError(
            f"launched run {run_id} ended {out['status']}: {_failures(instance, run_id)}\n{''.join(said)[-2000:]}"
        )
    return {"wall_s": round(max(cli_exit, run_end), 2), "cli_exit_s": round(cli_exit, 2),
            "run_ended_s": round(run_end, 2), **out}  # fmt: skip


def execute_once(instance: Any, env: dict[str, str], page_label: str | None) -> dict[str, Any]:
    """One run of the job the way `stage2 build` runs a stage, in a fresh ``python``."""
    t0 = time.time()
    p0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", EXECUTE_JOB], cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - p0
    if p.returncode != 0:
        raise RuntimeError(f"execute_job way failed ({p.returncode}): {p.stdout[-2000:]}{p.stderr[-2000:]}")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    if not got["success"]:
        raise RuntimeError(f"execute_job run {got['run_id']} failed")
    return {"wall_s": round(wall, 2), **_run_times(instance, got["run_id"], t0, page_label)}


def cli_help_seconds(env: dict[str, str], repeat: int = 3) -> float:
    """Best wall time of a bare ``dagster job launch --help`` (the CLI's imports, nothing loaded)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(
            [DAGSTER, "job", "launch", "--help"], cwd=REPO, env=env, check=True, capture_output=True
        )
        best = min(best, time.perf_counter() - t)
    return best


def launch_via_instance_vs_execute_job(work: Path) -> dict[str, Any]:
    import dagster as dg

    from stage2_data.demo import generate_demo
    from stage2_data.demo.hubserver import HubServer

    demo = generate_demo(work / "demo")
    data_root = work / "data"
    home = work / "dagster_home"
    write_home(home)
    env = launch_env(home, demo, data_root)
    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as server:
        built = subprocess.run(
            [sys.executable, "-m", "stage2_data.cli", "build", "--profile", str(demo.profile),
             "--data-root", str(data_root), "--endpoint", server.url],  # fmt: skip
            cwd=REPO, env=env, capture_output=True, text=True,
        )  # fmt: skip
    if built.returncode != 0:
        raise RuntimeError(f"demo build failed: {built.stdout[-2000:]}{built.stderr[-2000:]}")
    load_before = os.getloadavg()[0]  # the machine's other work (it shares its CPUs)
    help_s = cli_help_seconds(env)
    workspace = ["-w", str(REPO / "workspace.yaml")]
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        ours: list[dict[str, Any]] = []
        base: list[dict[str, Any]] = []
        served: list[dict[str, Any]] = []
        label = None
        sock = work / "code-server.sock"
        # the running server as a workspace's code location of the same name as workspace.yaml's
        served_ws = work / "served-workspace.yaml"
        served_ws.write_text(
            json.dumps({"load_from": [{"grpc_server": {"socket": str(sock), "location_name": LOCATION}}]}),
            encoding="utf-8",
        )
        with code_server(env, sock) as server_ready_s:
            for _ in range(ROUNDS):
                ours.append(launch_once(instance, env, workspace))
                label = label or ours[-1]["repository_label"]
                base.append(execute_once(instance, env, label))
                served.append(launch_once(instance, env, ["-w", str(served_ws)], label))
    finally:
        instance.dispose()
    best_ours = min(ours, key=lambda r: r["wall_s"])
    best_base = min(base, key=lambda r: r["wall_s"])
    return entry(
        "launch_via_instance_vs_execute_job",
        best_ours["wall_s"],
        "the store stage's job in a fresh process as `stage2 build` runs it (execute_job, no origin)",
        best_base["wall_s"],
        None,
        job=JOB,
        executor="in_process (both)",
        ours_best=best_ours,
        baseline_best=best_base,
        ours_all=ours,
        baseline_all=base,
        running_server_best=min(served, key=lambda r: r["wall_s"]),
        running_server_all=served,
        code_server_ready_s=round(server_ready_s, 2),
        cli_help_s=round(help_s, 2),
        load_avg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],  # before and after
        code_server_load_s=round(best_ours["created_s"] - help_s, 2),
    )


def _build_once(demo: Any, work: Path, name: str, extra: list[str]) -> dict[str, Any]:
    """One first `stage2 build` of ``demo`` into fresh folders under ``work``; wall time, fingerprint,
    and (launched builds) each run's times and whether the UI's job page lists it."""
    import dagster as dg

    root, home = work / f"{name}-root", work / f"{name}-home"
    env = {k: v for k, v in os.environ.items() if k not in ("STAGE2_RUN_IN_PROCESS", "DAGSTER_HOME", "CI")}
    env.update(DAGSTER_HOME=str(home), STAGE2_RUN_LOG_LEVEL="CRITICAL")
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "stage2_data.cli", "build", "--profile", str(demo.profile),
         "--data-root", str(root), "--hub-folder", str(demo.upstream), "--json", *extra],  # fmt: skip
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{name} build failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    summary = json.loads(done.stdout)
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        records = sorted(instance.get_run_records(), key=lambda r: r.create_timestamp)
        first = records[0].create_timestamp.timestamp()
        listed = {
            r.dagster_run.run_id
            for r in instance.get_run_records(
                dg.RunsFilter(tags={REPOSITORY_TAG: f"__repository__@{LOCATION}"})
            )
        }
        runs = [
            {
                "job": r.dagster_run.job_name,
                "created_s": round(r.create_timestamp.timestamp() - first, 2),
                "started_s": round((r.start_time or float("nan")) - first, 2),
                "ended_s": round((r.end_time or float("nan")) - first, 2),
                "on_job_page": r.dagster_run.run_id in listed,
            }
            for r in records
        ]
    finally:
        instance.dispose()
    return {"wall_s": round(wall, 2), "fingerprint": summary["fingerprint"], "runs": runs}


def build_launched_vs_in_process(work: Path) -> dict[str, Any]:
    from stage2_data.demo import generate_demo

    demo = generate_demo(work / "demo")
    load_before = os.getloadavg()[0]
    ours: list[dict[str, Any]] = []
    base: list[dict[str, Any]] = []
    for i in range(ROUNDS):
        ours.append(_build_once(demo, work, f"launched-{i}", []))
        base.append(_build_once(demo, work, f"in-process-{i}", ["--run-in-process"]))
    prints = {r["fingerprint"] for r in ours + base}
    if len(prints) != 1:
        raise RuntimeError(f"launched and in-process builds disagree: {sorted(prints)}")
    best_ours = min(ours, key=lambda r: r["wall_s"])
    best_base = min(base, key=lambda r: r["wall_s"])
    return entry(
        "build_launched_vs_in_process",
        best_ours["wall_s"],
        "the same first `stage2 build --run-in-process` (runs executed in the build's process, no origin)",
        best_base["wall_s"],
        None,
        ours_all_s=[r["wall_s"] for r in ours],
        baseline_all_s=[r["wall_s"] for r in base],
        ours_runs=best_ours["runs"],
        on_job_page=all(x["on_job_page"] for r in ours for x in r["runs"]),
        baseline_on_job_page=any(x["on_job_page"] for r in base for x in r["runs"]),
        fingerprint=prints.pop(),
        load_avg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
    )


BENCHMARKS = [launch_via_instance_vs_execute_job, build_launched_vs_in_process]
