"""Step logs for `stage2 build`'s local instance: captured to files (the UI shows them), mirrored to
the terminal only when asked.

Dagster's ``LocalComputeLogManager`` mirrors every step's stdout and stderr back to the terminal
through two helper processes per step: ``tail -F`` and a Python ``watch_orphans.py``. `stage2 build`
quiets the runs' console output unless ``--verbose`` (``STAGE2_RUN_LOG_LEVEL``), so the mirror only
costs: two processes started per step, and, on a foreground Ctrl-C, the terminal's SIGINT reaching
the Python helper, which printed its own ``KeyboardInterrupt`` traceback under the build's clean
one-line stop. This manager captures to the same files (same layout, same UI) and mirrors only
when the runs' console is wanted (``--verbose``, or a run not started by `stage2 build`: the web UI,
the daemon), exactly as Dagster does.

Configured by the ``dagster.yaml`` that `stage2 build` writes for a new local instance
(``config.instance_yaml``); an instance with its own ``dagster.yaml`` keeps its configuration. Kept
on the one private module below for that behaviour (docs/architecture.md, "Kept on Dagster's
internals"): with Dagster's own manager a terminal's Ctrl-C prints the helpers' tracebacks, and the
step workers' log lines reach the quiet build's terminal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

# Dagster's one local compute-log manager has no public import path (docs/architecture.md names
# this module and its measured reason); its module also holds the types a capture yields.
from dagster._core.storage.local_compute_log_manager import (
    IO_TYPE_EXTENSION,
    CapturedLogContext,
    ComputeIOType,
    LocalComputeLogManager,
)

QUIET_ENV = "STAGE2_RUN_LOG_LEVEL"  # set by `stage2 build` unless --verbose (commands._quiet_runs)


class StepLogsToFiles(LocalComputeLogManager):
    """``LocalComputeLogManager`` without the terminal mirror while `stage2 build` runs quietly."""

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> StepLogsToFiles:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Generator[CapturedLogContext, None, None]:
        if not os.environ.get(QUIET_ENV):  # the runs' console is wanted: Dagster's own mirror
            with super().capture_logs(log_key) as context:
                yield context
            return
        out = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        err = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        with _to_file(sys.stdout, out), _to_file(sys.stderr, err):
            yield CapturedLogContext(log_key)
        _touch(self.complete_artifact_path(log_key))  # as Dagster's: the capture is complete


def _touch(path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).touch()


def _fileno(stream: IO[str]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a file (a test's capture)
        return None


@contextmanager
def _to_file(stream: IO[str], path: str) -> Generator[None, None, None]:
    """``stream``'s file descriptor (the process's, so child processes' output too) appended to
    ``path`` while the block runs, then restored; a stream without a descriptor is left as it is."""
    _touch(path)
    fd = _fileno(stream)
    if fd is None:
        yield
        return
    stream.flush()
    saved = os.dup(fd)
    try:
        with open(path, "a", buffering=1, encoding="utf-8") as target:
            os.dup2(target.fileno(), fd)
            try:
                yield
            finally:
                stream.flush()
                os.dup2(saved, fd)
    finally:
        os.close(saved)
