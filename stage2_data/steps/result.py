"""What every step returns: its metadata, the outcomes of the checks that guard it, and its value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..checks import CheckOutcome


@dataclass
class StepResult:
    metadata: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckOutcome] = field(default_factory=list)
    value: Any = None

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)


def rate(nbytes: int | float, seconds: float) -> float | None:
    """MB/s for the UI's metadata (None when unmeasurable)."""
    return round(nbytes / 1e6 / seconds, 1) if seconds and nbytes else None


def kv_table(name: str, d: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(d.items()))
    return f"| {name} | count |\n|---|---:|\n{rows}"
