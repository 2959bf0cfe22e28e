"""A training script that starts a PoolLoader at its top level, without the
``if __name__ == "__main__":`` guard, under spawn (macOS's default) or forkserver: each worker imports
the script again as it starts and ends there at multiprocessing's own "bootstrapping phase" error. The
loader raises a LoaderError naming the guard and the script, at once; it used to hang for ever under
spawn (the message starting a worker, holding the pickled dataset, outgrew the pipe's 64 KiB buffer
and the worker died before reading it) and to end in a BrokenPipeError under forkserver. A real training process on a real store on disk
(tests/fixtures/stores.py), its dataset pickling to more than the pipe's buffer."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stage2_data.loader import Selection

# trajectories enough that the train split's Selection pickles to more than a pipe's buffer (64 KiB)
STORE_IDS = range(1, 100)

# A script as docs/training.md shows it, without the `if __name__ == "__main__":` guard.
SCRIPT = """\
from stage2_data.loader import PoolLoader, ResolutionBatches, Selection

train = Selection({store!r}, "train")
order = ResolutionBatches(train, batch_size=2, seed=0)
with PoolLoader(train, order, workers=2, context={context!r}) as loader:
    for batch in loader:
        print("a batch", flush=True)
train.close()
"""

WAIT = 60.0  # seconds at most for the script to end (a bound for a loaded machine: it hung for ever)
SHM = Path("/dev/shm")


def _group(pgid: int) -> list[int]:
    """The live processes of the process group ``pgid`` (zombies not counted)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_script_without_the_main_guard_gets_a_named_error_not_a_hang(
    store: Path, tmp_path: Path, context: str
) -> None:
    with Selection(store, "train") as train:
        assert len(pickle.dumps(train)) > 64 * 1024  # (what made spawn hang)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(store=str(store), context=context))
    p = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (its group: the script and every process it started)
    )
    try:
        try:
            out, err = p.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            p.kill()  # (the script alone first: its resource tracker then unlinks its semaphores)
            out, err = p.communicate(timeout=60)
            pytest.fail(f"the script hung (killed after {WAIT:.0f} s):\n{err[-3000:]}")
        assert p.returncode == 1, err
        # the script's error: our LoaderError (CPython's resource tracker may add its note on the
        # pool's semaphores after it, at the interpreter's exit: it unlinks them itself)
        ours = [ln for ln in err.splitlines() if ln.startswith("stage2_data.errors.LoaderError: ")]
        assert len(ours) == 1, err
        last = ours[0]
        assert 'if __name__ == "__main__":' in last and str(script) in last and context in last, last
        assert "bootstrapping phase" in err, err  # multiprocessing's own words, from the workers
        assert "a batch" not in out
        deadline = time.monotonic() + WAIT
        while _group(p.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _group(p.pid) == [], "processes of the script left running"
        assert not list(SHM.glob(f"stage2-loader-{p.pid}-*")), "a /dev/shm folder left"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=60)
        deadline = time.monotonic() + 10
        while _group(p.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in _group(p.pid):
            os.kill(pid, signal.SIGKILL)
        for folder in SHM.glob(f"stage2-loader-{p.pid}-*"):
            shutil.rmtree(folder, ignore_errors=True)
