"""Run ``stage2 …`` as a user's shell would: a real subprocess of this venv's Python.

Every test that runs the CLI (or a Python snippet, or a command the CLI printed) goes through
:func:`run`: the working directory is the repository, output is captured as text, and a timeout
keeps a hung child from hanging the suite. ``env=None`` inherits this process's environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STAGE2 = (sys.executable, "-m", "stage2_data.cli")  # `stage2` of this venv, whatever PATH says


class Ran(subprocess.CompletedProcess[str]):
    """A finished process: ``returncode``, ``stdout``, ``stderr`` (text), and two conveniences."""

    def json(self) -> Any:
        """stdout parsed as JSON (what ``--json`` prints)."""
        return json.loads(self.stdout)

    def last_json(self) -> Any:
        """The last line of stdout parsed as JSON (what a snippet printed last); the process must
        have succeeded."""
        assert self.returncode == 0, self.tail()
        return json.loads(self.stdout.strip().splitlines()[-1])

    def tail(self, chars: int = 3000) -> str:
        """The end of stdout and of stderr: enough to say why a run failed in an assertion."""
        return self.stdout[-chars:] + self.stderr[-chars:]


def run(
    argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 300
) -> Ran:
    """Run ``argv`` to completion (output captured as text); never raises on a non-zero exit."""
    p = subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    return Ran(p.args, p.returncode, p.stdout, p.stderr)


def stage2(*args: str, **kw: Any) -> Ran:
    """``stage2 <args>``; keywords as for :func:`run`."""
    return run([*STAGE2, *args], **kw)


def python_argv(code: str, *args: str) -> list[str]:
    """The argv of ``python -c <code> <args>`` (for :func:`run`, or for a Popen that is killed)."""
    return [sys.executable, "-c", code, *args]


def python(code: str, *args: str, **kw: Any) -> Ran:
    """``python -c <code> <args>``; keywords as for :func:`run`."""
    return run(python_argv(code, *args), **kw)


def subprocess_env(*, drop: Iterable[str] = (), **values: str) -> dict[str, str]:
    """This process's environment without ``drop`` (names compared case-insensitively), with
    ``values`` set."""
    gone = {d.upper() for d in drop}
    env = {k: v for k, v in os.environ.items() if k.upper() not in gone}
    env.update(values)
    return env
