"""A PoolLoader's workers do not outlive the process of their loader: a training script killed by
SIGTERM (how SLURM, Kubernetes or ``kill`` stop a job; Python's default action runs no finalizer) or
SIGKILL leaves no worker running, holding the store's files, and no ``/dev/shm`` folder behind.
Real worker processes under fork, spawn and forkserver, on a real store on disk
(tests/fixtures/stores.py)."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stage2_data.loader import PoolLoader, ResolutionBatches, Selection

# The script a trainer runs: an endless epoch loop over persistent workers (as QA reproduced it).
SCRIPT = """\
import json
import sys
import time

from stage2_data.loader import PoolLoader, ResolutionBatches, Selection


def main() -> None:
    store, context = sys.argv[1], sys.argv[2]
    train = Selection(store, "train")
    order = ResolutionBatches(train, 2, seed=0)
    loader = PoolLoader(train, order, workers=2, persistent_workers=True, context=context)
    told = False
    while True:
        for batch in loader:
            time.sleep(0.005)  # a training step
            workers = sorted(loader._pool._processes)  # (the pool's worker processes)
            if not told and len(workers) == 2:
                print(json.dumps(workers), flush=True)
                told = True


if __name__ == "__main__":
    main()
"""

SHM = Path("/dev/shm")
WAIT = 60.0  # seconds at most for the workers to notice (a bound for a loaded machine, not a timing)


def _state(stat: str) -> list[str]:
    """The fields of a ``/proc/.../stat`` after the command's name (the first: the state)."""
    return stat[stat.rindex(")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    """The start time of the live process ``pid`` (None when there is none, or a zombie): with the
    pid it names one process, never one that reused its pid.

    A zombie is one whose every thread ended. A killed process's first thread (``/proc/<pid>/stat``)
    can be a zombie while its other threads still end, and they hold its files until the last one
    does: a killed loader's ``.alive`` stays locked meanwhile (tens of milliseconds on a loaded
    machine), so a loader that sweeps then leaves that folder alone."""
    try:
        fields = _state(Path(f"/proc/{pid}/stat").read_text())
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    states = []
    for task in tasks:
        try:
            states.append(_state((task / "stat").read_text())[0])
        except OSError:
            continue  # (ended meanwhile)
    return None if all(s in ("Z", "X") for s in states) else int(fields[19])


def _read_line(p: subprocess.Popen[str], deadline: float) -> str:
    assert p.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([p.stdout], [], [], 0.5)
        if ready:
            return p.stdout.readline()
        if p.poll() is not None:
            break
    return ""


def _start_training(store: Path, tmp_path: Path, context: str, **popen: Any) -> subprocess.Popen[str]:
    if not (SHM.is_dir() and os.access(SHM, os.W_OK)):
        pytest.skip("no writable /dev/shm here")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), str(store), context],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def _workers(p: subprocess.Popen[str]) -> dict[int, int | None]:
    """The worker processes the training script printed (pid: start time)."""
    line = _read_line(p, time.monotonic() + 120)
    if not line:
        p.kill()
        _, err = p.communicate(timeout=30)
        pytest.fail(f"the training script printed no workers (exit {p.returncode}):\n{err[-3000:]}")
    workers = {pid: _start_time(pid) for pid in json.loads(line)}
    assert len(workers) == 2 and all(workers.values()), workers
    return workers


def _end(p: subprocess.Popen[str], workers: dict[int, int | None]) -> None:
    """What a failed run left: the processes this test started, and their /dev/shm folders."""
    if p.poll() is None:
        p.kill()
        p.wait(timeout=60)
    if p.stdout is not None:
        p.stdout.close()
    if p.stderr is not None:
        p.stderr.close()
    for pid, t in workers.items():
        if t is not None and _start_time(pid) == t:
            os.kill(pid, signal.SIGKILL)
    for folder in SHM.glob(f"stage2-loader-{p.pid}-*"):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and /dev/shm: Linux")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_workers_and_shm_go_when_the_training_process_is_killed(
    store: Path, tmp_path: Path, context: str, sig: signal.Signals
) -> None:
    p = _start_training(store, tmp_path, context)
    workers: dict[int, int | None] = {}
    try:
        workers = _workers(p)
        folders = list(SHM.glob(f"stage2-loader-{p.pid}-*"))
        assert folders, "the loader made no /dev/shm folder"
        p.send_signal(sig)
        p.wait(timeout=60)  # (reaped: the script itself is gone, not a zombie)
        assert p.returncode == -sig

        def left() -> tuple[list[int], list[str]]:
            alive = [pid for pid, t in workers.items() if _start_time(pid) == t]
            return alive, sorted(f.name for f in SHM.glob(f"stage2-loader-{p.pid}-*"))

        deadline = time.monotonic() + WAIT
        while left() != ([], []) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left() == ([], []), "workers still alive, /dev/shm folders left"
    finally:
        _end(p, workers)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and /dev/shm: Linux")
def test_a_folder_left_by_a_loader_killed_with_its_workers_goes_with_the_next_loader(
    store: Path, tmp_path: Path
) -> None:
    """The script and its workers SIGKILLed together (``kill -KILL -- -<pgid>``, the OOM killer):
    nobody is left to remove the folder; the next PoolLoader to make one removes it (its ``.alive``
    is locked by no process any more), and leaves a live loader's folder alone."""
    p = _start_training(store, tmp_path, "fork", start_new_session=True)
    workers: dict[int, int | None] = {}
    try:
        workers = _workers(p)
        folders = list(SHM.glob(f"stage2-loader-{p.pid}-*"))
        assert folders, "the loader made no /dev/shm folder"
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
        deadline = time.monotonic() + WAIT
        while any(_start_time(pid) == t for pid, t in workers.items()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_start_time(pid) == t for pid, t in workers.items())
        assert all(f.exists() for f in folders)  # (nobody removed it)
        train = Selection(store, "train")
        with PoolLoader(train, ResolutionBatches(train, 2, seed=0), workers=2, context="fork") as live:
            batches = iter(live)
            next(batches)  # its folder made, the orphan removed (by it, or by another loader's
            # sweep that took the orphan's lock first and is still removing it: wait for that one)
            deadline = time.monotonic() + WAIT
            while any(f.exists() for f in folders) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert live._folder is not None and not any(f.exists() for f in folders)
            with PoolLoader(train, ResolutionBatches(train, 2, seed=0), workers=1, context="fork") as other:
                more = iter(other)
                next(more)
                assert Path(live._folder).is_dir()  # a live loader's folder stays
                more.close()
            batches.close()
        train.close()
    finally:
        _end(p, workers)
