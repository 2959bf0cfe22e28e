"""How kit problems are reported: located messages shared by several checks, and the one way to
turn gathered problems into an exception."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .. import layout
from ..errors import KitError

__all__ = ["raise_for_problems"]


def raise_for_problems(problems: Sequence[str], what: str, *, fix: str | None = None) -> None:
    """Raise a :class:`KitError` listing every problem, if there is any."""
    if problems:
        raise KitError(
            what,
            problems,
            fix=fix or "correct the named kit file lines / data-root files, then run the step again",
        )


def missing_frames_problem(pairs_path: Path | str, line: int, fpath: str, tid: str, data_root: Path) -> str:
    return f"{pairs_path}:{line}: frames file {fpath} of trajectory {tid} is missing under {data_root}"


def unnamed_sidecar_problem(derived: Path, rel: str) -> str:
    m = layout.SIDECAR_PATH_RE.match(rel)
    what = f"trajectory {m.group('id')}" if m else "no trajectory"
    return f"{derived / rel}: sidecar file for {what} that no action manifest row names"
