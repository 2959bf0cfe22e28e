"""A stage beside the main line of `stage2 build`, run in a process of its own.

The kit stage needs only the profile, so `stage2 build` runs it while the downloads and the
extraction run (``runner.walk_stages``). Not in a thread of the build's process: Dagster 1.13
reconfigures Python's logging (``logging.config.dictConfig``, which takes every handler's lock) at
the start of every run, and a run logging in another thread at that moment holds its handler's lock
while it waits for logging's module lock: two runs in two threads of one process can deadlock. So the
stage's one run is executed by a child process (``python -m stage2_pipelines.beside``), on the same
instance and executor, and only waited for in a thread of the build.

The child is started when the build starts, so that its imports (Dagster's are most of a start) run
while the build's own start-up and the profile stage do, on another core; it then waits for "go" on
its stdin (the stages it needs are over) and runs, or exits at once on end of input (a stage it
needs failed, or the build stopped). Its summary (``runs.run_selection``'s) comes back as JSON on
a pipe of its own (its stdout and stderr stay the build's). A stop reaches it as every worker
process: the stop guard sends it SIGTERM, and Dagster interrupts its step.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from stage2_data.commands.common import exit_process
from stage2_data.stages import STAGES, Stage, stage


class BesideProcess:
    """One stage's run in a child process: started now (it imports meanwhile), told to run by
    :meth:`run` (with the build's settings then: a local Dask cluster's address is known only once the
    build started it), or let go by :meth:`cancel`."""

    def __init__(self, stage: Stage, dagster_home: Path) -> None:
        self.stage = stage
        read, write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(write), stage.name],
                stdin=subprocess.PIPE,
                pass_fds=(write,),
                env={**os.environ, "DAGSTER_HOME": str(dagster_home)},
                text=True,
            )
        finally:
            os.close(write)
        self._result = os.fdopen(read, "r", encoding="utf-8")

    def run(self, config: dict[str, Any], workers: int | None) -> dict[str, Any]:
        """Run the stage's one run in the child; its summary (a failed one naming the exit code if the
        child died first: a stop)."""
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.write(json.dumps({"config": config, "workers": workers}) + "\n")
            self._proc.stdin.close()
        out = self._result.read()
        self._result.close()
        code = self._proc.wait()
        if code == 0 and out:
            return dict(json.loads(out))
        return died(self.stage, code)

    def cancel(self) -> None:
        """Let the child go without running (it exits on end of input)."""
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        self._result.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def start_beside(
    status: dict[str, str | None], dagster_home: Path, concurrency: int | None
) -> dict[str, BesideProcess]:
    """A started child for every stage beside the main line that has work to do (``status``: the
    build's ``uptodate.stage_status``); none with ``--concurrency 1`` (one thing at a time)."""
    if concurrency == 1:
        return {}
    return {
        s.name: BesideProcess(s, dagster_home)
        for s in STAGES
        if s.beside and not (s.name in status and status[s.name] is None)
    }


def died(stage: Stage, code: int) -> dict[str, Any]:
    """The summary of a stage whose process ended without one (killed by a stop, or crashed)."""
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return {
        "store_metadata": {},
        "run_id": None,
        "job": stage.job,
        "success": False,
        "partition": None,
        "partitions": {},
        "selection": list(stage.assets),
        "checks": [],
        "errors": [
            {
                "step": ",".join(stage.assets),
                "partition": None,
                "message": f"the {stage.name} stage's process {how} before its run ended; rerun the build",
            }
        ],
        "materialized": [],
        "reported": [],
    }


def main(argv: list[str]) -> int:
    fd, name = int(argv[0]), argv[1]
    from .runs import run_selection  # Dagster: imported while the build's main line starts

    with os.fdopen(fd, "w", encoding="utf-8") as out:
        line = sys.stdin.readline()
        if not line.strip():  # end of input: not to run
            return 0
        go = json.loads(line)
        run = run_selection(go["config"], list(stage(name).assets), workers=go.get("workers") or None)
        out.write(json.dumps(run, default=str))
    return 0


if __name__ == "__main__":
    # without the interpreter's teardown (slow after Dagster's import): the build waits for this end
    exit_process(main(sys.argv[1:]))
