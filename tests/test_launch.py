"""`stage2 build` as users run it by default: each stage's run launched through the instance, against
a code server the build starts, so that every run belongs to the project's code location.

The rest of the suite builds with ``STAGE2_RUN_IN_PROCESS=1`` (conftest: a launched run costs a
worker process); these tests drop it. What they hold the launched build to: the same store and
fingerprint as a build executed in process (the executor-independence of docs/spec/vin-store.md),
every run on its job's page (the filter the UI's job page uses: its name and the code location's
repository label), a failing step named as in process, and a code server that does not load named
with its log. Stops of launched builds are cases of tests/test_stops.py; the UI's own view of the
runs (job pages, Overview, Re-execute) is the browser test's (tests/test_ui.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.built import DEMO_FINGERPRINT
from helpers.cli import STAGE2, Ran, python, stage2, subprocess_env

from stage2_data.demo import DemoPaths
from stage2_data.profile import load_profile

pytestmark = pytest.mark.slow

# what workspace.yaml's module location is called: the label the UI's job pages filter runs by
REPOSITORY_LABEL = "__repository__@stage2_pipelines.definitions:defs"


def _env(home: Path, **extra: str) -> dict[str, str]:
    return subprocess_env(
        drop=("STAGE2_RUN_IN_PROCESS", "CI", "HF_TOKEN"),
        DAGSTER_HOME=str(home),
        STAGE2_RUN_LOG_LEVEL="CRITICAL",
        **extra,
    )


def _build(demo: DemoPaths, root: Path, home: Path, *extra: str, hub: Path | None = None, **env: str) -> Ran:
    return stage2(
        "build",
        "--profile",
        str(demo.profile),
        "--data-root",
        str(root),
        "--hub-folder",
        str(hub or demo.upstream),
        "--json",
        *extra,
        env=_env(home, **env),
        timeout=600,
    )


def _runs(home: Path, *, label: str | None = None) -> list[dict[str, str]]:
    """Every run of the instance at ``home`` (only those the UI's job pages list for the code location
    ``label``, when given): job name, status, the code location's label from its origin, and the
    id of the build that launched it (its ``stage2/build`` tag)."""
    code = (
        "import json, sys, dagster as dg\n"
        "i = dg.DagsterInstance.get()\n"
        "label = sys.argv[1] or None\n"
        "f = dg.RunsFilter(tags={'.dagster/repository': label}) if label else None\n"
        "out = []\n"
        "for r in i.get_run_records(f):\n"
        "    o = r.dagster_run.remote_job_origin\n"
        "    out.append({'job': r.dagster_run.job_name, 'status': r.dagster_run.status.value,\n"
        "                'run_id': r.dagster_run.run_id, 'build': r.dagster_run.tags.get('stage2/build'),\n"
        "                'label': o.repository_origin.get_label() if o else None})\n"
        "print(json.dumps(out))\n"
    )
    r = python(code, label or "", env=subprocess_env(DAGSTER_HOME=str(home)))
    return list(r.last_json())


def test_launched_build_is_on_its_jobs_pages_and_equals_the_in_process_build(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    r = _build(demo_cache, tmp_path / "root", home)
    assert r.returncode == 0, r.tail()
    s = r.json()
    assert s["launched"] is True and s["fingerprint"] == DEMO_FINGERPRINT, s
    runs = _runs(home)
    keys = load_profile(demo_cache.profile).cache_keys()
    # the profile, the sidecars, the store, and the streamed run of the cache keys: the demo's
    # archives are far under a streamed run's least bytes (stages.STREAM_RUN_BYTES), so one run
    assert len(runs) == len(s["runs"]) == 4, runs
    assert {x["label"] for x in runs} == {REPOSITORY_LABEL}, runs
    assert {x["status"] for x in runs} == {"SUCCESS"}, runs
    # one build's runs carry its id: a stop cancels every one of them, also one whose launch it cut
    assert len({x["build"] for x in runs}) == 1 and runs[0]["build"], runs
    # the build's logs stay its own: not in Dagster's telemetry folder, which a webserver sends away
    logs = home / "stage2-logs"
    assert (logs / "webserver.log").is_file()
    assert not [p.name for d in ("logs", ".logs_queue") if (home / d).is_dir() for p in (home / d).iterdir()]
    (streamed,) = [x for x in s["runs"] if x["job"] == "download_and_extract"]
    assert streamed["partitions"] == dict.fromkeys(keys, ["archive_file", "cache_dir"]), streamed
    # the job pages' filter lists every one of them
    listed = _runs(home, label=REPOSITORY_LABEL)
    assert sorted(x["run_id"] for x in listed) == sorted(x["run_id"] for x in runs)
    assert {x["job"] for x in listed} == {
        "check_profile",
        "download_and_extract",
        "unpack_action_sidecars",
        "verify_kit_and_build_store",
    }

    # the same build executed in process: the same store; its runs carry no origin
    home2 = tmp_path / "home2"
    r2 = _build(demo_cache, tmp_path / "root2", home2, "--run-in-process")
    assert r2.returncode == 0, r2.tail()
    assert r2.json()["launched"] is False and r2.json()["fingerprint"] == s["fingerprint"]
    assert {x["label"] for x in _runs(home2)} == {None}

    # a no-op rebuild starts no run, launched or not
    again = _build(demo_cache, tmp_path / "root", home)
    assert again.returncode == 0 and again.json()["runs"] == [], again.tail()
    assert len(_runs(home)) == 4


def _materializations(home: Path) -> list[tuple[float, str, str]]:
    """Every materialization in the instance at ``home``, in the order stored: (time, asset,
    partition)."""
    code = (
        "import json, dagster as dg\n"
        "i = dg.DagsterInstance.get()\n"
        "out = []\n"
        "for key in i.get_asset_keys():\n"
        "    f = dg.EventRecordsFilter(dg.DagsterEventType.ASSET_MATERIALIZATION, asset_key=key)\n"
        "    for r in i.get_event_records(f, ascending=True):\n"
        "        out.append((r.storage_id, r.timestamp, key.to_user_string(), r.partition_key))\n"
        "print(json.dumps([x[1:] for x in sorted(out)]))\n"
    )
    r = python(code, env=subprocess_env(DAGSTER_HOME=str(home)))
    return [tuple(x) for x in r.last_json()]


def test_a_launched_build_extracts_cache_keys_while_others_download(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """Streamed runs of 3 MB of archives each (``STAGE2_STREAM_RUN_MB``: the demo's 11 MB in three
    runs, each a whole range of cache keys), two downloading at once (``--concurrency 2``), each
    downloading its keys' archives and then extracting them: the third run is launched once one of
    the first two has downloaded its archives (tests/test_stages.py checks that rule). The store is
    the in-process build's. At ``--concurrency 1`` the stages go one run each, as in process."""
    home = tmp_path / "home"
    r = _build(demo_cache, tmp_path / "root", home, "--concurrency", "2", STAGE2_STREAM_RUN_MB="3")
    assert r.returncode == 0, r.tail()
    s = r.json()
    assert s["fingerprint"] == DEMO_FINGERPRINT, s
    streamed = [x["partitions"] for x in s["runs"] if x["job"] == "download_and_extract"]
    assert len(streamed) == 3 and sorted(k for p in streamed for k in p) == sorted(
        load_profile(demo_cache.profile).cache_keys()
    ), streamed
    events = _materializations(home)
    extracted = [t for t, asset, _ in events if asset == "cache_dir"]
    downloaded = [t for t, asset, _ in events if asset == "archive_file"]
    assert len(extracted) == len(downloaded) == len(load_profile(demo_cache.profile).cache_keys())
    assert min(extracted) < max(downloaded), events  # streamed: not every download before extraction

    home1 = tmp_path / "home1"
    r1 = _build(demo_cache, tmp_path / "root1", home1, "--concurrency", "1")
    assert r1.returncode == 0 and r1.json()["fingerprint"] == DEMO_FINGERPRINT, r1.tail()
    assert [x["job"] for x in r1.json()["runs"]] == [
        "check_profile",
        "acquire_archives",
        "unpack_action_sidecars",
        "extract_cache_dirs",
        "verify_kit_and_build_store",
    ]
    events = _materializations(home1)
    assert max(t for t, a, _ in events if a == "archive_file") < min(
        t for t, a, _ in events if a == "cache_dir"
    )


def test_a_launched_runs_failure_is_named_as_in_process(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """An archive in the hub's folder that is not the one the profile pins (a byte changed: the hub's
    listing gives it another sha256, so the pin is wrong): the launched acquire run fails; the build
    exits 2 (a wrong pin is a bad profile, as against a verified file on disk) and names the archive,
    its partition and the fix, as a build executed in process does. In both, the fix's `stage2 pin`
    names the profile and the folder the build served (not `--hub-folder DIR`); it runs as pasted."""
    hub = tmp_path / "the hub"  # a space: the folder is quoted in the fix
    shutil.copytree(demo_cache.upstream, hub, symlinks=True)
    victim = next(p for p in sorted(hub.rglob("*.tar*")) if p.is_file() and not p.is_symlink())
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.unlink()
    victim.write_bytes(bytes(data))
    pinned = load_profile(demo_cache.profile).archive(victim.relative_to(hub).as_posix()).sha256
    # the changed folder is another commit (a folder has one, a digest of its files): the profile is
    # pinned to it, as a pin wrong at the right revision is on the real hub
    from dataclasses import replace

    from helpers.faults import copy_kit

    from stage2_data.demo.hubserver import HubServer

    profile = copy_kit(demo_cache, tmp_path / "kit")
    commit = HubServer(hub, repo_id=demo_cache.repo_id, revision=None).revision
    profile.write_text(profile.read_text().replace(demo_cache.revision, commit))
    demo = replace(demo_cache, profile=profile)
    outs = {}
    for mode, extra in (("launched", ()), ("in_process", ("--run-in-process",))):
        r = _build(demo, tmp_path / mode, tmp_path / f"home-{mode}", *extra, hub=hub)
        assert r.returncode == 2, r.tail()
        assert "Traceback" not in r.stderr and "internal error" not in r.stdout, r.tail()
        outs[mode] = r.json()
    launched, in_process = outs["launched"], outs["in_process"]
    assert launched["store"] is None and launched["errors"], launched

    # (each run serves the hub folder on a port of its own)
    def key(e: dict[str, str]) -> tuple[str | None, str | None, str]:
        return e.get("step"), e.get("partition"), re.sub(r"127\.0\.0\.1:\d+", "HUB", e.get("message", ""))

    assert sorted(map(key, launched["errors"])) == sorted(map(key, in_process["errors"]))
    assert victim.name.split(".")[0] in json.dumps(launched["errors"])
    pin = f"`stage2 pin {shlex.quote(str(profile))} --hub-folder {shlex.quote(str(hub))} --check`"
    for mode, out in outs.items():
        assert [e["error"] for e in out["errors"]] == ["PinDisagreesError"], (mode, out["errors"])
        fix = out["errors"][0]["message"].partition(" Fix: ")[2]
        assert pin in fix and "DIR" not in fix, (mode, fix)
    p = stage2(*shlex.split(pin.strip("`"))[1:], timeout=120)
    upstream = hashlib.sha256(data).hexdigest()
    assert p.returncode == 2 and f"{pinned} in the profile, {upstream} upstream" in p.stderr, p.tail()


def test_a_code_server_that_does_not_load_is_named(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """The definitions fail to load in the build's code server (a ``sitecustomize`` that ends only
    that process): one line with what it said, its log and a fix, exit 2, no traceback."""
    broken = tmp_path / "broken"
    broken.mkdir()
    # a sitecustomize that breaks only the code server's import of the definitions
    (broken / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if 'api' in sys.argv and 'grpc' in sys.argv:\n"
        "    raise SystemExit('the code location cannot load: stage2 test')\n",
        encoding="utf-8",
    )
    r = stage2(
        "build",
        "--profile",
        str(demo_cache.profile),
        "--data-root",
        str(tmp_path / "root2"),
        "--hub-folder",
        str(demo_cache.upstream),
        env=_env(tmp_path / "home2", PYTHONPATH=str(broken) + os.pathsep + os.environ.get("PYTHONPATH", "")),
        timeout=600,
    )
    assert r.returncode == 2, r.tail()
    assert "Traceback" not in r.stderr, r.tail()
    line = r.stderr.strip().splitlines()[-1]
    assert "the code location cannot load: stage2 test" in line and "webserver.log" in line, r.tail()
    assert "Fix" in line, line


def test_a_run_queued_for_a_missing_daemon_is_named_and_a_stop_cancels_it(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """An instance of the user's own whose ``dagster.yaml`` queues launched runs for a daemon that
    does not run: the build says so (the run, why, three fixes) instead of waiting silently, and a
    stop then cancels the queued run: nothing stays queued in the instance."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nrun_coordinator:\n  module: dagster\n  class: QueuedRunCoordinator\n",
        encoding="utf-8",
    )
    argv = [
        *STAGE2, "build", "--profile", str(demo_cache.profile), "--data-root", str(tmp_path / "root"),
        "--hub-folder", str(demo_cache.upstream), "--no-progress",
    ]  # fmt: skip
    with open(tmp_path / "err", "w+", encoding="utf-8") as err:
        proc = subprocess.Popen(
            argv, env=_env(home, STAGE2_QUEUED_WARN_S="1"), stdout=subprocess.DEVNULL, stderr=err, text=True
        )
        try:
            deadline = time.monotonic() + 120
            while "still queued" not in (tmp_path / "err").read_text(encoding="utf-8"):
                assert proc.poll() is None, (tmp_path / "err").read_text(encoding="utf-8")
                assert time.monotonic() < deadline, "the queued run was never named"
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        said = (tmp_path / "err").read_text(encoding="utf-8")
    assert proc.returncode == 143, said
    assert "dagster-daemon run" in said and "DefaultRunCoordinator" in said and "--run-in-process" in said
    assert "Traceback" not in said, said
    runs = _runs(home)
    assert [x["job"] for x in runs] == ["check_profile"], runs
    assert runs[0]["status"] == "CANCELED", runs


def test_a_step_on_a_worker_with_other_settings_refuses_another_data_root(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """A Dask cluster of the user's own whose workers were started without the build's settings: a
    launched run's steps load the code location there, with another data root (the default under
    the workers' folder). Each refuses by name (the two data roots, the fix) instead of reading and
    writing another data root; the build exits non-zero and nothing is written where the workers
    would have written."""
    from dask.distributed import LocalCluster

    elsewhere = tmp_path / "workers"
    elsewhere.mkdir()
    cwd = os.getcwd()
    os.chdir(elsewhere)  # the workers' default data root: <their folder>/.demo/data
    try:
        cluster = LocalCluster(
            n_workers=1, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=None,
            env={"STAGE2_PROFILE": str(demo_cache.profile), "STAGE2_DEMO_ROOT": str(elsewhere / ".demo")},
        )  # fmt: skip
    finally:
        os.chdir(cwd)
    with cluster:
        r = _build(
            demo_cache, tmp_path / "root", tmp_path / "home", "--executor", "dask",
            "--dask-address", cluster.scheduler_address,
        )  # fmt: skip
    assert r.returncode != 0, r.tail()
    said = json.dumps(r.json()["errors"])
    assert (
        "was started for the data root" in said
        and "workers/.demo/data" in said
        and str(tmp_path / "root") in said
    ), said
    assert "--run-in-process" in said, said
    assert not (elsewhere / ".demo" / "data" / "archives").exists()


def test_a_launched_build_on_a_local_dask_cluster_builds_its_own_data_root(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """`--executor dask` without a scheduler: the build's own local cluster, whose workers load the
    code location (a launched run's steps) with the build's settings: the demo's store in the
    build's data root, with the demo's fingerprint."""
    root = tmp_path / "root"
    r = _build(demo_cache, root, tmp_path / "home", "--executor", "dask")
    assert r.returncode == 0, r.tail()
    s = r.json()
    assert s["launched"] and s["fingerprint"] == DEMO_FINGERPRINT, s
    assert Path(s["store"]).is_relative_to(root), s["store"]
