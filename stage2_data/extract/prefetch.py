"""Archives read into the page cache ahead of their extraction.

A download writes each archive with ``O_DIRECT`` (no page-cache copy, nothing left to write back),
so its bytes are not in the page cache when the extraction reads them: a cold read (~530 MB/s on
this machine's disk) that the extraction would wait for, 6-7 s of a 3.4 GB profile. The
:class:`Prefetcher` asks the kernel to read the archives of the cache directories to be extracted,
in the order they will be extracted (``posix_fadvise(WILLNEED)``: no copy through Python), on a
thread of its own, at most ``budget`` bytes ahead of the extractions that have finished (a 107 GiB
profile is never pulled into memory at once). Where ``posix_fadvise`` does not exist it does
nothing; a file it cannot open is left to the extraction, which names the problem.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["Prefetcher", "prefetch_budget"]

_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)


def prefetch_budget() -> int:
    """Bytes read ahead at most: a quarter of the memory available now, at most 8 GiB."""
    avail = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    return min(8 << 30, avail // 4) if avail else 1 << 30


class Prefetcher:
    """Read ``groups`` (``key -> its archive files``, in extraction order) into the page cache ahead
    of their extraction; :meth:`done` says a key was extracted (its bytes leave the budget). Use as a
    context manager: the thread stops at exit (it never outlives the extraction stage)."""

    def __init__(self, groups: Sequence[tuple[str, Sequence[Path]]], budget: int | None = None) -> None:
        self._groups = [(k, list(files)) for k, files in groups]
        self._budget = prefetch_budget() if budget is None else budget
        self._sizes: dict[str, int] = {}
        self._ahead = 0  # bytes asked for and not yet extracted
        self._done: set[str] = set()
        self._stopped = threading.Event()
        self._cond = threading.Condition()
        self.prefetched: list[str] = []  # keys whose archives were asked for, in order
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Prefetcher:
        if _WILLNEED is not None and self._groups:
            self._thread = threading.Thread(target=self._run, name="archive-prefetch", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._cond:
            self._stopped.set()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def done(self, key: str) -> None:
        with self._cond:
            self._done.add(key)
            self._ahead -= self._sizes.pop(key, 0)
            self._cond.notify_all()

    def _run(self) -> None:
        for key, files in self._groups:
            sizes = []
            for p in files:
                try:
                    sizes.append(p.stat().st_size)
                except OSError:
                    sizes.append(0)
            size = sum(sizes)
            with self._cond:
                # wait for room, unless nothing is ahead (a cache dir bigger than the budget still goes)
                while not self._stopped.is_set() and self._ahead > 0 and self._ahead + size > self._budget:
                    self._cond.wait()
                if self._stopped.is_set():
                    return
                if key in self._done:
                    continue
                self._sizes[key] = size
                self._ahead += size
            for p in files:
                _willneed(p, self._stopped)
            if self._stopped.is_set():
                return
            self.prefetched.append(key)


_CHUNK = 64 << 20  # asked for at a time: a stop waits for one chunk's reads at most


def _willneed(path: Path, stopped: threading.Event | None = None) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        for off in range(0, size, _CHUNK):
            if stopped is not None and stopped.is_set():
                return
            os.posix_fadvise(fd, off, min(_CHUNK, size - off), _WILLNEED)  # type: ignore[arg-type]
    except OSError:
        pass
    finally:
        os.close(fd)
