"""Environment for a block of a session-scoped fixture (``monkeypatch`` is function-scoped), a
free loopback port for a server a test starts, a read-only view of a folder, and a small disk."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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


@contextmanager
def read_only_mount(path: Path) -> Iterator[Path]:
    """``path`` seen through a read-only bind mount (a data root on a read-only volume, as a
    verifying host mounts it), at ``<path>.ro``; skips the test where mounting is not permitted."""
    import pytest

    target = path.with_name(path.name + ".ro")
    target.mkdir()
    bind = subprocess.run(["mount", "--bind", str(path), str(target)], capture_output=True, text=True)
    if bind.returncode != 0:
        target.rmdir()
        pytest.skip(f"a bind mount is not permitted here: {bind.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, capture_output=True)
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True, capture_output=True)
        target.rmdir()


@contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``64m``) mounted at ``path`` (made) for the block, a disk that
    fills up; skips the test where mounting is not permitted (not root). Unmounted lazily after."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
