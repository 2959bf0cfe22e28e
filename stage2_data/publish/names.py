"""Temporary names and owner liveness: the one temp-name format of the product.

Everything the product writes under a temporary name is a sibling of its final path named::

    .<final>.<kind>-<pid>-<start>-<host>-<rand>

``kind`` is ``tmp`` (being written: a staging folder, a temp file or link) or ``old`` (a replaced
version being deleted); ``pid`` and ``start`` (its start time in clock ticks since boot, from
``/proc/<pid>/stat``; 0 when unknown) identify the owner process even after its pid is reused;
``host`` is 8 hex of the sha256 of the host name (a shared file system: another machine's temps
are never judged from here); ``rand`` keeps two temps of one process apart.

Older spellings still on disk (from before this module) are recognised too, so a sweep removes
them: ``.<final>.tmp-<pid>`` / ``.<final>.old-<pid>`` (pid only: judged by the pid alone) and
``.<final>.<x>.tmp`` (``mkstemp``/``mkdtemp``: no owner at all).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "KINDS",
    "TempName",
    "host_tag",
    "is_temp_name",
    "owned_name",
    "owner_alive",
    "parse_temp_name",
    "proc_start_time",
    "temp_path",
]

KINDS = ("tmp", "old")

_OWNED_RE = re.compile(
    r"^\.(?P<final>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-(?P<start>\d+)-(?P<host>[0-9a-f]{8})-[0-9a-f]+$"
)
_PID_ONLY_RE = re.compile(r"^\.(?P<final>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")
_UNOWNED_RE = re.compile(r"^\.(?P<final>.+)\.[A-Za-z0-9_]+\.tmp$")


def proc_start_time(pid: int) -> int:
    """Start time of process ``pid`` (clock ticks since boot, Linux ``/proc``); 0 when unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return 0
    try:  # the command name (field 2) may hold spaces and parentheses: split after the last ')'
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return 0


_HOST_TAG: str | None = None


def host_tag() -> str:
    """8 hex of the sha256 of this host's name."""
    global _HOST_TAG
    if _HOST_TAG is None:
        _HOST_TAG = hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]
    return _HOST_TAG


def owned_name(final_name: str, kind: str = "tmp") -> str:
    """A fresh temp name for ``final_name`` owned by this process (``.<final>.<kind>-<pid>-...``)."""
    if kind not in KINDS:
        raise ValueError(f"temp kind must be one of {KINDS}, got {kind!r}")
    pid = os.getpid()
    return f".{final_name}.{kind}-{pid}-{proc_start_time(pid)}-{host_tag()}-{uuid.uuid4().hex[:12]}"


def temp_path(final: Path, kind: str = "tmp") -> Path:
    """The sibling temp path of ``final`` (see :func:`owned_name`)."""
    return final.with_name(owned_name(final.name, kind))


@dataclass(frozen=True)
class TempName:
    """A parsed temp name. ``pid`` is None for an unowned legacy name; ``start``/``host`` are None
    for a pid-only legacy name."""

    final: str
    kind: str
    pid: int | None = None
    start: int | None = None
    host: str | None = None

    @property
    def owned(self) -> bool:
        return self.pid is not None

    def alive(self) -> bool:
        """Whether the owner may still be running (True when unsure; False for no owner)."""
        if self.pid is None:
            return False
        return owner_alive(self.pid, self.start or 0, self.host)


def parse_temp_name(name: str) -> TempName | None:
    """The parts of one of the product's temp names, or None for any other name."""
    m = _OWNED_RE.match(name)
    if m is not None:
        return TempName(m["final"], m["kind"], int(m["pid"]), int(m["start"]), m["host"])
    m = _PID_ONLY_RE.match(name)
    if m is not None:
        return TempName(m["final"], m["kind"], int(m["pid"]))
    m = _UNOWNED_RE.match(name)
    if m is not None:
        return TempName(m["final"], "tmp")
    return None


def is_temp_name(name: str, final: str | None = None) -> bool:
    """Whether ``name`` is one of the product's temp names (of ``final``, when given)."""
    t = parse_temp_name(name)
    return t is not None and (final is None or t.final == final)


def owner_alive(pid: int, start: int = 0, host: str | None = None) -> bool:
    """Whether the process that made a temp may still be running (True when unsure).

    Another host's process is never judged (True). A pid that does not exist is dead; a pid that
    exists with another start time than recorded was reused: dead too."""
    if host is not None and host != host_tag():
        return True  # another machine's writer (shared file system): never ours to judge
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (or a pid no process can have)
        return False
    except PermissionError:
        pass  # exists, owned by another user
    except OSError:
        return True
    now = proc_start_time(pid)
    return not (start and now and now != start)  # a different start time: the pid was reused
