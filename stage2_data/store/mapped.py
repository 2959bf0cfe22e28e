"""Local shard files mapped read-only, once each: what the strict reader reads a local store through.

A file is mapped whole (``mmap``) the first time it is read and stays mapped for the reader's life,
at most ``limit`` files at once (the least recently used unmapped first): a read is then a slice of
a view, no system call and no copy; the crc32c and Blosc read the page cache in place. Store files
are never rewritten in place (a rebuild publishes a new folder; gc unlinks, which a mapping
survives), so a mapping stays valid.

A read takes no lock (only mapping a file does): a mapping is unmapped only once no view of it is
left, as the buffer protocol refuses ``mmap.close`` before, so an eviction by another thread never
pulls bytes from under a read; the mapping then goes when its last view does.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections import OrderedDict
from pathlib import Path


class MappedFiles:
    """Files mapped read-only, once each, at most ``limit`` at once (least recently used unmapped
    first). ``maps`` holds the mappings, by path, least recently used first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.maps: OrderedDict[Path, mmap.mmap] = OrderedDict()
        self._views: dict[Path, memoryview] = {}  # a view of each of ``maps``, sliced by reads
        self._lock = threading.Lock()

    def read(self, path: Path, offset: int, length: int) -> memoryview:
        """``length`` bytes at ``offset`` of ``path`` (fewer past its end), a view of its mapping;
        raises FileNotFoundError (and other OSErrors) of the file."""
        view = self._views.get(path)
        if view is None:
            view = self._map(path)
        else:
            try:  # noqa: SIM105 - contextlib.suppress adds a context manager to every read
                self.maps.move_to_end(path)
            except KeyError:  # evicted meanwhile by another thread
                pass
        return view[offset : offset + length]

    def _map(self, path: Path) -> memoryview:
        with self._lock:
            view = self._views.get(path)
            if view is not None:  # another thread just mapped it
                return view
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return memoryview(b"")
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            view = memoryview(m)
            self.maps[path] = m
            self._views[path] = view
            if len(self.maps) > self.limit:
                old_path, old = self.maps.popitem(last=False)
                self._views.pop(old_path, None)
                with contextlib.suppress(BufferError):  # still being read: unmapped by GC
                    old.close()
            return view

    def close(self) -> None:
        """Unmap every file (one whose view is still alive is unmapped by GC when it goes)."""
        with self._lock:
            self._views = {}
            while self.maps:
                _, m = self.maps.popitem()
                with contextlib.suppress(BufferError, OSError):
                    m.close()
