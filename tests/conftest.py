"""Shared fixtures: the demo (generated once per session), a loopback hub over it, a Dagster home."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.env import environ

from stage2_data.demo import DemoPaths, generate_demo
from stage2_data.demo.hubserver import HubServer

# Test tiers (fast / slow / system) for `make test-fast`: see tests/_tiers.py. Fixture plugins
# (lerobot style): tests/fixtures/*.py, each a module of fixtures that every test can use.
pytest_plugins = ["_tiers", "_groups", "fixtures.faults", "fixtures.stores"]

# The suite started by a background job of a non-interactive shell (`cmd &` in a script, as a CI
# runner may) inherits SIGINT ignored. Dagster, run in this process, maps SIGTERM to SIGINT's
# handler, so SIGTERM becomes ignored too, and every process started afterwards inherits both:
# Dask workers, and the `tail` processes Dagster's LocalComputeLogManager starts per step, which
# then outlive its SIGTERM (each step waited 2 x 30 s). Measured: the Dask build test took minutes
# instead of one. The suite runs as from a terminal; the tests of background stops set the ignored
# SIGINT in their own children (tests/test_stops.py).
# `stage2 build` launches its runs through the instance (a code server, a worker process per run:
# ~4 s a run, measured in bench/bench_launch.py). The suite's ~200 builds execute their runs in the
# build's process instead (`--run-in-process`: the same steps, the same store); tests/test_launch.py
# and the browser test build the default way.
os.environ["STAGE2_RUN_IN_PROCESS"] = "1"

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(scope="session")
def full_card_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoPaths, float]:
    """The full-cardinality demo, generated once per session (read-only), and the CPU seconds its
    generation took (``time.process_time``: wall time depends on what else the machine runs)."""
    t0 = time.process_time()
    demo = generate_demo(tmp_path_factory.mktemp("full-card-demo") / "demo", full_cardinality=True)
    return demo, time.process_time() - t0


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> DemoPaths:
    """The small demo, generated once; tests that mutate it must use ``demo`` (a private copy)."""
    return generate_demo(tmp_path_factory.mktemp("demo-cache") / "demo")


@pytest.fixture
def demo(demo_cache: DemoPaths, tmp_path: Path) -> DemoPaths:
    """A private, mutable copy of the demo."""
    root = tmp_path / "demo"
    shutil.copytree(demo_cache.root, root, symlinks=True)
    return DemoPaths(
        root=root,
        upstream=root / demo_cache.upstream.relative_to(demo_cache.root),
        kit_root=root / demo_cache.kit_root.relative_to(demo_cache.root),
        profile=root / demo_cache.profile.relative_to(demo_cache.root),
        repo_id=demo_cache.repo_id,
        revision=demo_cache.revision,
    )


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    yield home


@pytest.fixture(autouse=True)
def _no_dagster_state_storage_left_behind() -> Iterator[None]:
    """``with instance:`` (``dg.instance_for_test()`` too) sets Dagster's current definitions-state
    storage, a context variable, and its exit disposes the instance without resetting it: every
    later ``Definitions`` load in the process then opens the disposed instance's SQLite files (gone
    with its temp folder: "unable to open database file"). Each test leaves it as it found it."""
    base = sys.modules.get("dagster._core.storage.defs_state.base")
    before = base._current_storage.get() if base is not None else None
    yield
    base = sys.modules.get("dagster._core.storage.defs_state.base")
    if base is not None:
        base._current_storage.set(before)


@pytest.fixture(autouse=True)
def _no_real_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing here may reach the real hub; every test passes an explicit loopback endpoint.
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.pop("HF_TOKEN", None)


@pytest.fixture(scope="session")
def built(demo_cache: DemoPaths, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One full build of the demo through the real client over loopback, shared by the tests that
    need a built data root (read-only: copy ``built["root"]`` before changing anything)."""
    import dagster as dg

    from stage2_pipelines.config import BuildConfig
    from stage2_pipelines.runner import build_all

    base = tmp_path_factory.mktemp("built")
    home = base / "dagster_home"
    with environ(DAGSTER_HOME=str(home)):
        with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
            config = BuildConfig(
                profile_path=str(demo_cache.profile), data_root=str(base / "root"), endpoint=hub.url
            )
            summary = build_all(config, concurrency=2)
            requested = [p for (_, p, _) in hub.request_log]
        instance = dg.DagsterInstance.get()
        runs = len(instance.get_runs())
        # the process each run's events came from, by job
        pids = {
            r.job_name: {e.dagster_event.pid for e in instance.all_logs(r.run_id) if e.dagster_event}
            for r in instance.get_runs()
        }
    return {
        "summary": summary,
        "root": base / "root",
        "home": home,
        "requested": requested,
        "runs": runs,
        "pids": pids,
        "build_pid": os.getpid(),
    }
