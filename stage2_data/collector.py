"""The cyclic garbage collector of a ``stage2`` process: paused while the process imports, and kept
off what the imports built.

CPython's collector runs after every 700 net allocations of container objects, and every tenth
(then hundredth) run walks everything older. A build imports Dagster, SQLAlchemy, pyarrow, pandas
and zarr: well over a thousand modules, whose objects live as long as the process, every one of
them walked again by each full collection, which holds the interpreter lock and so stalls every
thread of the process; the collections during the imports find next to nothing to free.

So the kit stage's child process (``stage2_pipelines.beside``, :func:`own`) pauses the collector
while it imports (:func:`paused`), and when the last such stretch ends, moves every object alive at
that moment to the collector's permanent generation (``gc.freeze()``: still freed by reference
counting, never walked again) and turns it back on. Objects built later are collected as usual. A
process that did not call :func:`own` (the ``stage2`` executable, a library user) is left alone:
:func:`paused` does nothing there.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_owned = False  # this process called own(): the policy above applies
_depth = 0  # stretches of imports under way (threads overlap theirs)


def own() -> None:
    """Apply the policy to this process (the kit stage's child process calls it first): the
    collector is paused from here until the first :func:`paused` stretch ends."""
    global _owned
    with _lock:
        _owned = True
        gc.disable()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """A stretch of imports (or of other long-lived objects' creation) with the collector paused, in
    a process that :func:`own` applies to; when the last overlapping stretch ends, what is alive is
    frozen and the collector is on again."""
    global _depth
    if not _owned:
        yield
        return
    with _lock:
        _depth += 1
        gc.disable()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.freeze()
                gc.enable()
