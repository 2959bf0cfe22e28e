"""The build instance's step logs (pipelines/computelogs.py), captured by a real process: what a step
and its child processes print goes to the step's log files, and to the terminal only when the runs'
console is wanted."""

from __future__ import annotations

from pathlib import Path

from helpers.cli import python, subprocess_env

from stage2_pipelines.computelogs import QUIET_ENV

CAPTURE = """
import os, subprocess, sys
from stage2_pipelines.computelogs import StepLogsToFiles
logs = StepLogsToFiles(sys.argv[1])
key = ["run-1", "compute_logs", "step"]
print("before", flush=True)
with logs.capture_logs(key):
    print("step says hello", flush=True)
    print("step warns", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-c", "print('child says hello')"], check=True)
print("after", flush=True)
print(logs.get_captured_local_path(key, "out"))
print(logs.get_captured_local_path(key, "err"))
print(logs.is_capture_complete(key))
"""


def _capture(tmp_path: Path, **env: str) -> tuple[list[str], str, str, str]:
    """Run a capture in a fresh process: (its stdout lines, its stderr, the captured out, err)."""
    out = python(CAPTURE, str(tmp_path / "storage"), env=subprocess_env(drop=(QUIET_ENV,), **env))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    out_path, err_path, complete = lines[-3:]
    assert complete == "True"
    return lines[:-3], out.stderr, Path(out_path).read_text(), Path(err_path).read_text()


def test_a_quiet_build_captures_step_output_to_files_only(tmp_path: Path) -> None:
    said, stderr, captured_out, captured_err = _capture(tmp_path, **{QUIET_ENV: "CRITICAL"})
    assert said == ["before", "after"]  # nothing of the step reached the terminal
    assert "step warns" not in stderr
    assert captured_out.splitlines() == ["step says hello", "child says hello"]  # a child's output too
    assert captured_err.splitlines() == ["step warns"]


def test_a_verbose_build_captures_and_mirrors_as_dagster_does(tmp_path: Path) -> None:
    # Dagster's documented wait before it stops its mirror (``tail -F``), so that the mirror has
    # copied everything when the capture ends
    said, stderr, captured_out, captured_err = _capture(
        tmp_path, DAGSTER_COMPUTE_LOG_TAIL_WAIT_AFTER_FINISH="1"
    )
    assert "step says hello" in said and "child says hello" in said  # Dagster's own mirror
    assert captured_out.splitlines() == ["step says hello", "child says hello"]
    assert captured_err.splitlines() == ["step warns"]
