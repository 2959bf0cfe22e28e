"""The one switch that stops every download of this process at once (``cancel_downloads``: the whole
process is stopping, e.g. `stage2 build` on SIGTERM), and the sockets it wakes. Apart from the
transport so that a stop guard can hold it without importing the hub client: a build with nothing to
download never imports ``huggingface_hub``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

PROCESS_CANCEL = threading.Event()
"""Set when the whole process is stopping: downloads end, and no retry waits any longer."""
_LIVE_SOCKETS: set[socket.socket] = set()  # sockets a body is being read from (woken on cancel)
_LIVE_LOCK = threading.Lock()


def cancel_downloads(cancel: bool = True) -> None:
    """Stop every download of this process now (``cancel=False``: allow downloads again). A read
    blocked on the network is woken by shutting its socket down; each download ends with
    DownloadCancelled and keeps its partial file (the next download resumes it)."""
    if not cancel:
        PROCESS_CANCEL.clear()
        return
    PROCESS_CANCEL.set()
    with _LIVE_LOCK:
        live = list(_LIVE_SOCKETS)
    for sock in live:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def cancelled(cancel: threading.Event | None) -> bool:
    """The process is stopping, or a call's own ``cancel`` event (that call only) is set."""
    return PROCESS_CANCEL.is_set() or (cancel is not None and cancel.is_set())


@contextlib.contextmanager
def live_socket(sock: socket.socket) -> Iterator[None]:
    """Register ``sock`` for :func:`cancel_downloads` while a body is read from it."""
    with _LIVE_LOCK:
        _LIVE_SOCKETS.add(sock)
    try:
        if PROCESS_CANCEL.is_set():  # cancelled before it was registered
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        yield
    finally:
        with _LIVE_LOCK:
            _LIVE_SOCKETS.discard(sock)
