"""The ``stage2`` executable (``stage2_data.cli.run``) ends as any Python program does (``sys.exit``
with the command's code): threads that are not daemons waited for (a thread pool left open does not
hold it), exit handlers run, buffered output written; and it keeps OpenBLAS to one thread unless
told. Each case runs in a process of its own, as users run it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.cli import python, run, subprocess_env

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
try:
    run(sys.argv[2:])
except SystemExit:  # the interpreter's own exit: what the process ends with
    (out / "exit").write_text("normal")
    raise
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
    assert (tmp_path / "exit").read_text() == "normal"
    if argv == ["--help"]:
        assert "usage: stage2" in p.stdout


@pytest.mark.parametrize(("given", "want"), [(None, "1"), ("4", "4")])
def test_the_stage2_executable_keeps_openblas_to_one_thread_unless_told(given: str | None, want: str) -> None:
    """No command does linear algebra: OpenBLAS's spinning thread per core is not started (the
    build's helper processes inherit it); a user's own OPENBLAS_NUM_THREADS wins."""
    env = subprocess_env(drop=["OPENBLAS_NUM_THREADS"], **({"OPENBLAS_NUM_THREADS": given} if given else {}))
    code = (
        "import atexit, json, os\n"
        "from stage2_data import cli\n"
        "atexit.register(lambda: print(json.dumps(os.environ.get('OPENBLAS_NUM_THREADS'))))\n"
        "cli.run(['validate', '--help'])"
    )
    assert python(code, env=env).last_json() == want
