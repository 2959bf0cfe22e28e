"""Progress of `stage2 build` at run granularity: stages, partitions done/total, bytes, rate and ETA.

The per-partition runs happen in worker processes, so progress advances when a run finishes (the
runner's ``on_run`` callback). Bytes come from the profile's pinned archive sizes (a finished
``archive_file[p]`` run has moved ``size(p)`` bytes; a finished ``cache_dir[k]`` run has read the
archives of ``k``), so rate and ETA are exact in bytes, not guesses.

On a terminal, one status line is redrawn in place (a ticker keeps elapsed time moving); when stderr
is not a terminal or ``CI`` is set, only plain lines are printed: one per finished run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from .fsutil import human_bytes
from .profile import Profile
from .stages import BY_ARCHIVE, BY_CACHE_KEY, STAGES, stage_of


def human_seconds(s: float) -> str:
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def interactive(stream: IO[str]) -> bool:
    """True when a redrawn status line makes sense: a terminal, and not CI."""
    if os.environ.get("CI"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@dataclass
class _Stage:
    name: str
    total: int
    total_bytes: int
    done: int = 0
    failed: int = 0
    bytes_done: int = 0
    started: float | None = None


class BuildProgress:
    """Feed it every finished run summary (``runner.build_all(on_run=progress.on_run)``)."""

    def __init__(
        self, profile: Profile, stream: IO[str] | None = None, *, live: bool | None = None, tick: float = 0.5
    ) -> None:
        self.stream: IO[str] = stream if stream is not None else sys.stderr
        self.live = interactive(self.stream) if live is None else live
        by_key = profile.archives_by_cache_key()
        # bytes per partition: an archive's pinned size; a cache key's, the sizes of its archives
        self._bytes = {
            BY_ARCHIVE: {a.path: int(a.size or 0) for a in profile.archives},
            BY_CACHE_KEY: {k: sum(int(a.size or 0) for a in specs) for k, specs in by_key.items()},
        }
        self.stages = {}
        for s in STAGES:
            sizes = self._bytes.get(s.partitioned_by or "", {})
            self.stages[s.name] = _Stage(s.name, len(sizes) if s.partitioned_by else 1, sum(sizes.values()))
        self._labels = {s.name: s.label for s in STAGES}
        self._order = [s.name for s in STAGES]
        self.current = self._order[0]
        self.t0 = time.monotonic()
        self.stages[self.current].started = self.t0
        self._lock = threading.Lock()
        self._last_len = 0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.live:
            self._ticker = threading.Thread(target=self._tick, args=(tick,), daemon=True)
            self._ticker.start()

    # -- input ------------------------------------------------------------------------------------
    def on_run(self, r: dict[str, Any]) -> None:
        stage = stage_of(r.get("selection") or [])
        name = stage.name
        st = self.stages[name]
        now = time.monotonic()
        with self._lock:
            if st.started is None:
                st.started = now
            st.done += 1
            if not r.get("success"):
                st.failed += 1
            part = r.get("partition")
            if stage.partitioned_by and part:
                st.bytes_done += self._bytes[stage.partitioned_by].get(part, 0)
            self.current = name
            if st.done >= st.total:  # the next stage starts now
                i = self._order.index(name)
                if i + 1 < len(self._order):
                    self.current = self._order[i + 1]
                    self.stages[self.current].started = now
            self._emit_run(r, name, st)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        with self._lock:
            if self.live:
                self._clear()
                self.stream.flush()

    # -- rendering --------------------------------------------------------------------------------
    def status_line(self) -> str:
        name = self.current
        st = self.stages[name]
        idx = self._order.index(name) + 1
        now = time.monotonic()
        parts = [f"[{idx}/{len(self._order)}] {self._labels[name]}"]
        if st.total > 1:
            parts.append(f"{st.done}/{st.total} partitions" + (f" ({st.failed} failed)" if st.failed else ""))
        if st.total_bytes:
            parts.append(f"{human_bytes(st.bytes_done)}/{human_bytes(st.total_bytes)}")
            elapsed = now - (st.started or now)
            if st.bytes_done and elapsed > 0:
                rate = st.bytes_done / elapsed
                parts.append(f"{human_bytes(rate)}/s")
                parts.append(f"ETA {human_seconds((st.total_bytes - st.bytes_done) / rate)}")
        parts.append(f"elapsed {human_seconds(now - self.t0)}")
        return "  ".join(parts)

    def _emit_run(self, r: dict[str, Any], name: str, st: _Stage) -> None:
        what = ",".join(r.get("selection") or []) + (f"[{r['partition']}]" if r.get("partition") else "")
        status = "ok" if r.get("success") else "FAILED"
        count = f" ({st.done}/{st.total})" if st.total > 1 else ""
        lines = []
        if self.live:
            if not r.get("success"):  # keep failures on screen; successes show in the status line
                lines.append(f"  {what}: {status}")
        else:
            lines.append(f"  run {str(r.get('run_id', ''))[:8]} {what}: {status}{count}")
        for c in r.get("checks", []):
            if not c.get("passed"):
                lines.append(f"    check {c['asset']}:{c['check']} failed: {_first(c.get('description'))}")
        for e in r.get("errors", []):
            msg = _first(e.get("message"))
            if not any(msg == _first(c.get("description")) for c in r.get("checks", [])):
                lines.append(f"    error in {e['step']}: {msg}")
        if self.live:
            self._clear()
        for ln in lines:
            self.stream.write(ln + "\n")
        if self.live:
            self._draw()
        self.stream.flush()

    def _clear(self) -> None:
        if self._last_len:
            self.stream.write("\r" + " " * self._last_len + "\r")
            self._last_len = 0

    def _draw(self) -> None:
        line = self.status_line()
        self.stream.write("\r" + line + " " * max(0, self._last_len - len(line)))
        self._last_len = len(line)

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            with self._lock:
                self._draw()
                self.stream.flush()


def _first(text: Any) -> str:
    s = str(text or "").strip()
    return s.splitlines()[0] if s else ""
