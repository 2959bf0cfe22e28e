"""The ``stage2`` executable's end (``stage2_data.cli.run``): it skips the interpreter's teardown, and
keeps what a normal exit does that matters: its exit code, threads that are not daemons waited for
(and a thread pool left open does not hold it), exit handlers run, buffered output written. Each case runs in a process of its own, as users run it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.cli import run

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
out = Path(sys.argv[1])
def late():
    time.sleep(0.3)
    (out / "thread").write_text("done")
threading.Thread(target=late).start()  # not a daemon: waited for
from concurrent.futures import ThreadPoolExecutor
left_open = ThreadPoolExecutor(2)  # never shut down: its idle workers must not hold the exit
left_open.submit(lambda: None).result()
atexit.register(lambda: (out / "atexit").write_text("ran"))
sys.stdout.write("still buffered")  # a pipe: block-buffered, written only by the final flush
from stage2_data.cli import run
run(sys.argv[2:])
"""


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["validate", "/nonexistent/store"], 2, "stage2 validate: error: no complete VIN offline store"),
        (["--help"], 0, ""),
        (["no-such-command"], 2, "invalid choice: 'no-such-command'"),
    ],
)
def test_the_executable_exits_with_its_code_after_threads_handlers_and_output(
    tmp_path: Path, argv: list[str], code: int, says: str
) -> None:
    p = run([sys.executable, "-c", SCRIPT, str(tmp_path), *argv], timeout=120)
    assert p.returncode == code, p.stderr
    assert says in p.stderr
    assert p.stdout.startswith("still buffered")
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"
    if argv == ["--help"]:
        assert "usage: stage2" in p.stdout
