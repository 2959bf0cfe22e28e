"""What every command shares: output helpers and exit codes."""

from __future__ import annotations

import json
import sys
from typing import Any

EXIT_FAILED = 1  # the command ran and found problems (a failed check, an invalid store)
EXIT_ERROR = 2  # the command could not run (bad input, bad arguments)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def eprint(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)
