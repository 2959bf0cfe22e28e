"""A command's start from a cold page cache, shortened: the files its last run imported are read
ahead, in parallel, while it imports them.

A cron'ed or first build of the day starts with Python's and its libraries' files out of the page
cache. `stage2 build` imports ~1,500 modules and ~100 shared libraries (Dagster, SQLAlchemy,
pyarrow, zarr, ...), one file after the other, each a few random reads (its folder, its inode, its
bytes) on the import's critical path: measured here, the imports took 2.3-5.9 s cold against 1.45 s
warm, depending on how busy the disk was. Handing the kernel all of those files at once (``open`` and
``posix_fadvise(WILLNEED)`` on 16 threads, ~0.45 s for the whole list) lets the disk serve them in
parallel, and the imports then find most of them cached (1.9-2.15 s cold in the same measurement).

The list is the command's own, from its previous runs (:func:`record`: every imported module's
file, cached bytecode preferred, and every mapped shared library, in import order), kept per command and per Python
environment in the user's cache folder (``$XDG_CACHE_HOME/stage2-data/warmstart/``), never in a data
root. No list yet (a first run), a stale entry, an unreadable file: nothing happens, or less is read
ahead; nothing waits for the reads, and nothing is ever read that the command could not read itself.
``STAGE2_WARMSTART=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ENV = "STAGE2_WARMSTART"
THREADS = 16  # requests in flight: a virtio or NVMe disk serves many at once


def list_path(command: str) -> Path:
    """Where ``command``'s list of files lives for this Python environment."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    env = hashlib.sha256(f"{sys.executable}\0{sys.prefix}\0{sys.version}".encode()).hexdigest()[:16]
    return Path(base) / "stage2-data" / "warmstart" / f"{command}-{env}.txt"


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0" and hasattr(os, "posix_fadvise")


def _advise(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def read_ahead(paths: list[str], threads: int = THREADS) -> int:
    """Ask the kernel to read ``paths`` into the page cache (in the background: this returns once
    every request is made); how many files were asked for."""
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="stage2-warmstart") as ex:
        return sum(ex.map(_advise, paths))


def prefetch(command: str) -> threading.Thread | None:
    """Start reading ahead ``command``'s list (a daemon thread, returned), or None (no list, or off)."""
    if not enabled():
        return None
    try:
        paths = list_path(command).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    t = threading.Thread(target=read_ahead, args=(paths,), name="stage2-warmstart", daemon=True)
    t.start()
    return t


def loaded_files() -> list[str]:
    """The files this process has imported, in the order it imported them: each module's (its cached
    bytecode when there is one, as the import read that), then each shared library mapped (extension
    modules and what they link)."""
    files: dict[str, bool] = {}  # (ordered, no repeats) path -> already known to be a file
    for mod in list(sys.modules.values()):  # in import order
        f = getattr(mod, "__file__", None)
        if not isinstance(f, str) or not os.path.isabs(f):
            continue
        if f.endswith(".py"):
            try:
                cached = importlib.util.cache_from_source(f)
            except (NotImplementedError, ValueError):
                cached = None
            if cached and os.path.isfile(cached):
                files.setdefault(cached, True)
                continue
        files.setdefault(f, False)
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
                    files.setdefault(parts[5].rstrip("\n"), False)
    except OSError:  # not Linux: the modules' files only
        pass
    return [p for p, known in files.items() if known or os.path.isfile(p)]


def record(command: str) -> Path | None:
    """Add this process's :func:`loaded_files` to ``command``'s list, keeping its order (what earlier
    runs imported first stays first) and dropping files that are gone; rewritten only when it
    changed, atomically. A union, not the last run's list alone: a no-op build imports far less
    than a build that runs its stages, and a week of no-op rebuilds must not leave the next real
    one a short list (a no-op that exits early leaves the rest of its read-ahead to the kernel's
    idle time). Its path, or None (off, or the cache folder is not writable)."""
    if not enabled():
        return None
    path = list_path(command)
    try:
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
    except (OSError, UnicodeDecodeError):
        old = ""
    loaded = loaded_files()  # (each already checked to be a file)
    fresh = set(loaded)
    kept = dict.fromkeys(p for p in old.splitlines() if p and (p in fresh or os.path.isfile(p)))
    kept.update(dict.fromkeys(loaded))
    text = "".join(f"{p}\n" for p in kept)
    try:
        if text == old:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except (OSError, UnicodeDecodeError):
        return None
    return path
