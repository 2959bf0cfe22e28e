"""The data root's lock between `stage2 build` (exclusive) and the steps of the runs no build
covers (the Dagster UI, schedules, sensors: shared, ``publish.lock.run_step_lock``): real
processes holding real ``flock`` s, real Dagster runs of the demo's assets."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import REPO, python_argv, stage2, subprocess_env
from helpers.env import read_only_mount
from helpers.ui_run import materialize

from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.publish import (
    DataRootInUseError,
    DataRootLockedError,
    data_root_lock,
    holds_data_root_lock,
    read_shared_holders,
    run_step_lock,
)
from stage2_data.publish.lock import LAUNCHING_BUILD_ENV, shared_holders_dir

# A process that holds the data root's lock (exclusive: `data_root_lock`, as `stage2 build` does;
# shared: `run_step_lock`, as a UI run's step does), says "held" and sleeps until it is killed.
_HOLD = """
import sys, time
from pathlib import Path
from stage2_data.publish.lock import data_root_lock, run_step_lock
root, mode = Path(sys.argv[1]), sys.argv[2]
lock = data_root_lock(root) if mode == "exclusive" else run_step_lock(root, label="run r1 of job j, step s")
with lock as got:
    print("held", got, flush=True)
    time.sleep(600)
"""

# A process that holds the lock exclusively and starts a child (a step worker of its executor) that
# takes the step's lock: the child is covered by its ancestor's lock.
_HOLD_AND_SPAWN = """
import subprocess, sys
from pathlib import Path
from stage2_data.publish.lock import data_root_lock
root = Path(sys.argv[1])
child = "import sys; from pathlib import Path; from stage2_data.publish.lock import run_step_lock\\n" \\
    "with run_step_lock(Path(sys.argv[1])) as got: print(got)"
with data_root_lock(root):
    out = subprocess.run([sys.executable, "-c", child, str(root)], capture_output=True, text=True)
    print(out.stdout.strip() or out.stderr.strip().splitlines()[-1])
"""


def _env() -> dict[str, str]:
    return subprocess_env(drop=[LAUNCHING_BUILD_ENV])


class Holder:
    """A process holding ``root``'s lock (``mode``: exclusive or shared) until :meth:`kill`."""

    def __init__(self, root: Path, mode: str) -> None:
        self.proc = subprocess.Popen(
            python_argv(_HOLD, str(root), mode),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=_env(),
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("held"), line + (self.proc.stderr.read() if self.proc.stderr else "")
        self.pid = self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it may end meanwhile
                os.kill(self.pid, sig)
        self.proc.wait(timeout=30)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        h.kill()


@pytest.fixture(autouse=True)
def _no_build_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LAUNCHING_BUILD_ENV, raising=False)


# ----- the lock itself (fast) ---------------------------------------------------------------------
def test_a_step_is_refused_while_a_build_holds_the_lock(tmp_path: Path, holders: list[Holder]) -> None:
    """A step of a run no build covers is refused at once while a build holds the lock: the error
    names the build (pid, host, command) and the fix, and the step wrote nothing (no record)."""
    root = tmp_path / "root"
    holders.append(build := Holder(root, "exclusive"))
    t0 = time.monotonic()
    with pytest.raises(DataRootInUseError) as ei, run_step_lock(root):
        pytest.fail("the step ran while a build held the data root")
    assert time.monotonic() - t0 < 5  # refused at once, never waiting
    msg = str(ei.value)
    for part in (str(root), f"build pid {build.pid}", "this run wrote nothing", "Fix:", "re-execute"):
        assert part in msg, (part, msg)
    assert isinstance(ei.value, DataRootLockedError) and ei.value.holder["pid"] == build.pid
    assert not shared_holders_dir(root).exists()
    assert sorted(p.name for p in root.iterdir()) == [layout.LOCK_FILE]


def test_a_read_only_view_of_the_data_root_is_locked_through_its_lock_file(
    tmp_path: Path, holders: list[Holder]
) -> None:
    """Through a read-only mount (a host that only verifies) a step takes the lock shared by the
    lock file opened read-only: a build elsewhere (the writable path) refuses while it is held and
    the step is refused while the build holds it; nothing is written through the mount."""
    root = tmp_path / "root"
    with data_root_lock(root):
        pass  # the lock file, as a build leaves it
    with read_only_mount(root) as ro:
        with run_step_lock(ro) as got:
            assert got == "shared"
            with pytest.raises(DataRootLockedError), data_root_lock(root):
                pytest.fail("a build ran while a step held the data root")
        holders.append(Holder(root, "exclusive"))
        with pytest.raises(DataRootInUseError), run_step_lock(ro):
            pytest.fail("the step ran while a build held the data root")
    assert sorted(p.name for p in root.iterdir()) == [layout.LOCK_FILE]


def test_a_build_is_refused_while_a_run_holds_the_lock_shared(tmp_path: Path, holders: list[Holder]) -> None:
    """`data_root_lock` (a build) is refused while a step holds the lock shared, the message naming
    a run of the UI, a schedule or a sensor (the holder's pid and its run), never "another build";
    with a timeout, the build waits until the run's step is over."""
    root = tmp_path / "root"
    holders.append(run := Holder(root, "shared"))
    with pytest.raises(DataRootLockedError) as ei, data_root_lock(root):
        pytest.fail("the build ran while a run held the data root")
    msg = str(ei.value)
    for part in (
        "a run of the Dagster UI, a schedule or a sensor",
        f"pid {run.pid}",
        "run r1 of job j",
        "Fix:",
    ):
        assert part in msg, (part, msg)
    assert "another build" not in msg
    threading.Timer(1.0, run.kill, args=(signal.SIGTERM,)).start()
    with data_root_lock(root, timeout=60):
        assert holds_data_root_lock(root)
        assert read_shared_holders(root) == []


def test_gc_refused_by_a_run_says_to_run_gc_again(tmp_path: Path, holders: list[Holder]) -> None:
    """`stage2 gc` refused while a run's step holds the data root: its fix is to run gc again
    once the run is over, not a build's "use another --data-root" (gc takes no such option)."""
    root = tmp_path / "root"
    store = root / layout.STORES_DIR / "p" / "s1"
    store.mkdir(parents=True)
    (store / "manifest.json").write_text("{}")
    (store.parent / "current").symlink_to("s1")
    holders.append(Holder(root, "shared"))
    got = stage2("gc", str(root / layout.STORES_DIR), "--keep", "1")
    assert got.returncode == 2, got.tail()
    assert "a run of the Dagster UI, a schedule or a sensor" in got.stderr, got.stderr
    assert "then run `stage2 gc` again" in got.stderr and "--data-root" not in got.stderr, got.stderr
    assert store.is_dir()
    # through a link to the stores folder under a name of its own, and to a profile's folder: the
    # same data root, the same refusal (the link took no lock, and gc went on: QA)
    (tmp_path / "my-stores").symlink_to(root / layout.STORES_DIR)
    (tmp_path / "my-profile").symlink_to(root / layout.STORES_DIR / "p")
    for link in ("my-stores", "my-profile"):
        got = stage2("gc", str(tmp_path / link), "--keep", "0")
        assert got.returncode == 2 and "then run `stage2 gc` again" in got.stderr, (link, got.tail())
    assert store.is_dir()


def test_two_shared_holders_at_once(tmp_path: Path, holders: list[Holder]) -> None:
    """Runs go side by side: another process's step and two steps of this process (threads) hold
    the lock shared at once; the build is refused until all have let go."""
    root = tmp_path / "root"
    holders.append(other := Holder(root, "shared"))
    entered = threading.Barrier(2, timeout=30)
    modes: list[str] = []

    def step() -> None:
        with run_step_lock(root, label="step in a thread") as got:
            modes.append(got)
            entered.wait()  # both threads hold it at the same time

    threads = [threading.Thread(target=step) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert modes == ["shared", "shared"]
    with run_step_lock(root) as got:
        assert got == "shared"
        assert [h["pid"] for h in read_shared_holders(root)] == sorted([other.pid, os.getpid()])
        with pytest.raises(DataRootLockedError, match="a schedule or a sensor"), data_root_lock(root):
            pass
    assert [h["pid"] for h in read_shared_holders(root)] == [other.pid]  # this process let go
    other.kill(signal.SIGTERM)
    with data_root_lock(root):
        pass


def test_a_killed_shared_holder_leaves_nothing_that_blocks_or_misleads(
    tmp_path: Path, holders: list[Holder]
) -> None:
    """A run's process killed by SIGKILL leaves its record behind; the kernel dropped its lock, so a
    build takes the lock at once (and removes the record), and a record of a dead process is never
    named as a holder, beside a live one."""
    root = tmp_path / "root"
    holders.append(dead := Holder(root, "shared"))
    holders.append(alive := Holder(root, "shared"))
    dead.kill(signal.SIGKILL)
    record = shared_holders_dir(root) / f"{dead.pid}.json"
    assert record.exists()  # nothing removed it: SIGKILL
    assert [h["pid"] for h in read_shared_holders(root)] == [alive.pid]
    with pytest.raises(DataRootLockedError) as ei, data_root_lock(root):
        pass
    assert f"pid {alive.pid}" in str(ei.value) and f"pid {dead.pid}" not in str(ei.value)
    alive.kill(signal.SIGKILL)
    # a record cut short (killed while writing it) is judged by its name's pid alone
    (shared_holders_dir(root) / f"{dead.pid + 1_000_000}.json").write_text('{"pid": ')
    assert read_shared_holders(root) == []
    t0 = time.monotonic()
    with data_root_lock(root):  # not blocked: refused would raise at once (timeout 0)
        assert list(shared_holders_dir(root).iterdir()) == []  # stale records removed
    assert time.monotonic() - t0 < 5
    with run_step_lock(root) as got:  # and a new run's step is not misled either
        assert got == "shared"


def test_a_run_a_build_covers_takes_nothing(
    tmp_path: Path, holders: list[Holder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No shared lock (it would conflict with the build's own): in a run launched by the build
    (STAGE2_BUILD_PID), in the build's own process (another thread: `--run-in-process`), in a
    process the build started (a step worker of its executor)."""
    root = tmp_path / "root"
    holders.append(Holder(root, "exclusive"))
    monkeypatch.setenv(LAUNCHING_BUILD_ENV, str(holders[0].pid))
    with run_step_lock(root) as got:
        assert got == "build"
    monkeypatch.delenv(LAUNCHING_BUILD_ENV)
    holders.pop().kill()

    mine = tmp_path / "mine"
    got_in_thread: list[Any] = []

    def step() -> None:
        try:
            with run_step_lock(mine) as got:
                got_in_thread.append(got)
        except Exception as e:  # noqa: BLE001 - handed to the test
            got_in_thread.append(e)

    with data_root_lock(mine):
        t = threading.Thread(target=step)
        t.start()
        t.join()
    assert got_in_thread == ["build"]
    assert not holds_data_root_lock(mine)

    out = subprocess.run(
        python_argv(_HOLD_AND_SPAWN, str(tmp_path / "spawned")),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(),
        timeout=120,
    )
    assert out.stdout.strip() == "build", out.stdout + out.stderr


def test_a_step_of_the_builds_own_run_elsewhere_is_covered_by_its_build_id(
    tmp_path: Path, holders: list[Holder]
) -> None:
    """A step of a build's run executing in a process the build did not start (a worker of the
    user's Dask cluster, a pod) is covered by the build's lock through its run's ``stage2/build``
    tag: the id the build wrote into the lock. Another build's id (a re-executed old run) or none
    (a UI run) is refused while the build holds the data root."""
    from stage2_data.publish import read_holder

    root = tmp_path / "root"
    holders.append(Holder(root, "exclusive"))
    build_id = read_holder(root).get("build_id")
    assert isinstance(build_id, str) and len(build_id) == 32, read_holder(root)
    with run_step_lock(root, build_id=build_id) as got:
        assert got == "build"
    for other in ("0" * 32, None):
        with pytest.raises(DataRootInUseError), run_step_lock(root, build_id=other):
            pass
    assert not list(shared_holders_dir(root).glob("*.json"))


# ----- through Dagster and the CLI ----------------------------------------------------------------
def _failure_descriptions(result: Any) -> list[str]:
    out = []
    for ev in result.all_events:
        if ev.event_type_value == "STEP_FAILURE":
            data = ev.event_specific_data
            user = getattr(data, "user_failure_data", None)
            out.append((user.description if user else None) or str(getattr(data, "error", "")))
    return out


def test_a_ui_run_fails_at_once_and_writes_nothing_while_a_build_holds_the_data_root(
    demo_cache: DemoPaths,
    tmp_path: Path,
    dagster_home: Path,
    holders: list[Holder],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of archive_file (downloads) and of pinned_profile executed the UI's way while another
    process holds the data root exclusively: each step fails at once with DataRootInUseError's
    message (the build's pid, the fix), no traceback, and nothing is written into the data root.
    Once the build is over, the same run downloads."""
    from stage2_data.profile import load_profile

    monkeypatch.delenv("STAGE2_RUN_IN_PROCESS", raising=False)
    root = tmp_path / "root"
    key = load_profile(demo_cache.profile).cache_keys_largest_first()[-1]
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        holders.append(build := Holder(root, "exclusive"))
        for asset, part in (("archive_file", key), ("pinned_profile", None)):
            r = materialize(demo_cache.profile, root, hub.url, asset, part)
            assert not r.success
            (desc,) = _failure_descriptions(r)
            for s in (f"build pid {build.pid}", "this run wrote nothing", "Fix: wait for that build to end"):
                assert s in desc, (s, desc)
            assert "Traceback" not in desc
            assert not r.get_asset_materialization_events()
            assert not r.get_asset_check_evaluations()  # nothing was checked: no verdict recorded
            assert sorted(p.name for p in root.iterdir()) == [layout.LOCK_FILE], asset
        assert hub.request_log == []  # not one byte asked for
        build.kill()
        r = materialize(demo_cache.profile, root, hub.url, "archive_file", key)
        assert r.success
        assert layout.archives_dir(root).is_dir()
        assert not list(shared_holders_dir(root).iterdir())  # released with the step


def test_a_run_whose_launching_build_was_killed_starts_no_step(
    demo_cache: DemoPaths,
    tmp_path: Path,
    dagster_home: Path,
    holders: list[Holder],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run `stage2 build` launched takes no lock of its own: the build holds the data root for it.
    Once that build is killed (SIGKILL: its lock is gone at once, while its code server may still
    start the run's steps), a step of the run starts nothing, before any byte is asked for, since
    another build may hold the data root now; it fails with the named error, and no check is marked
    failed by it (nothing was checked)."""
    from stage2_data.profile import load_profile

    monkeypatch.delenv("STAGE2_RUN_IN_PROCESS", raising=False)
    root = tmp_path / "root"
    key = load_profile(demo_cache.profile).cache_keys_largest_first()[-1]
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        holders.append(build := Holder(root, "exclusive"))
        monkeypatch.setenv(LAUNCHING_BUILD_ENV, str(build.pid))  # what the build's runs carry
        r = materialize(demo_cache.profile, root, hub.url, "pinned_profile", None)
        assert r.success, _failure_descriptions(r)  # covered by its live build
        build.kill()
        r = materialize(demo_cache.profile, root, hub.url, "archive_file", key)
        assert not r.success
        (desc,) = _failure_descriptions(r)
        assert f"the build that launched this run (pid {build.pid}) no longer holds" in desc, desc
        assert "Fix: run `stage2 build` again" in desc and "Traceback" not in desc, desc
        assert not r.get_asset_materialization_events()
        assert all(e.passed for e in r.get_asset_check_evaluations())  # none failed by the build's death
        assert not layout.archives_dir(root).exists()
        assert not any(p == "GET" for p, _, _ in hub.request_log)


def test_a_re_execution_of_a_builds_run_is_not_covered_by_that_build(
    demo_cache: DemoPaths,
    tmp_path: Path,
    dagster_home: Path,
    holders: list[Holder],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dagster copies a run's tags into its re-execution, the build's ``stage2/build`` among them:
    a run re-executed from the UI while that build runs is refused like any UI run (it re-ran the
    build's downloads, or published a store, beside the build). A run of the build carries the tag
    without a parent run and is covered."""
    from stage2_data.publish import read_holder
    from stage2_data.stages import BUILD_TAG

    monkeypatch.delenv("STAGE2_RUN_IN_PROCESS", raising=False)
    root = tmp_path / "root"
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        holders.append(build := Holder(root, "exclusive"))
        build_id = str(read_holder(root)["build_id"])
        own = materialize(demo_cache.profile, root, hub.url, "pinned_profile", None, {BUILD_TAG: build_id})
        assert own.success, _failure_descriptions(own)
        again = {BUILD_TAG: build_id, "dagster/parent_run_id": own.run_id, "dagster/root_run_id": own.run_id}
        r = materialize(demo_cache.profile, root, hub.url, "pinned_profile", None, again)
        assert not r.success
        (desc,) = _failure_descriptions(r)
        assert f"build pid {build.pid}" in desc and "this run wrote nothing" in desc, desc


def test_stage2_build_is_refused_while_a_ui_run_holds_the_data_root(
    demo_cache: DemoPaths, tmp_path: Path, holders: list[Holder]
) -> None:
    """`stage2 build` (the CLI, a real process) started while a step of a UI run holds the data
    root shared is refused as a second build is (exit 2, no traceback), the message naming a run of
    the UI, a schedule or a sensor and its pid; nothing is built."""
    root = tmp_path / "root"
    holders.append(run := Holder(root, "shared"))
    env = subprocess_env(drop=[LAUNCHING_BUILD_ENV], DAGSTER_HOME=str(tmp_path / "home"))
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        got = stage2(
            "build", "--profile", str(demo_cache.profile), "--data-root", str(root), "--endpoint", hub.url,
            env=env, timeout=300,
        )  # fmt: skip
    assert got.returncode == 2, got.tail()
    for part in ("a run of the Dagster UI, a schedule or a sensor", f"pid {run.pid}", str(root), "Fix:"):
        assert part in got.stderr, (part, got.stderr)
    assert "Traceback" not in got.stderr and "another build" not in got.stderr
    assert not layout.archives_dir(root).exists()
    assert json.loads((shared_holders_dir(root) / f"{run.pid}.json").read_text())["pid"] == run.pid
