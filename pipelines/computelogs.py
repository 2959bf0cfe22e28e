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
(``config.instance_yaml``); an instance with its own ``dagster.yaml`` keeps its configuration.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from typing import Any

from dagster._core.execution.compute_logs import redirect_to_file
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._utils import ensure_file, touch_file

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
        ensure_file(out)
        ensure_file(err)
        with redirect_to_file(sys.stdout, out), redirect_to_file(sys.stderr, err):
            yield CapturedLogContext(log_key)
        touch_file(self.complete_artifact_path(log_key))  # as Dagster's: the capture is complete
