"""Environment for a block of a session-scoped fixture (``monkeypatch`` is function-scoped), and a
free loopback port for a server a test starts."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block; afterwards each name is as it was (unset
    again if it was unset)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
