"""Loopback hub benchmarks: the test double's own speed, which the download benchmarks rely on.

Both use ``curl`` as the client (one process a request, body to /dev/null), so that what is timed
is the server, not a Python client sharing its interpreter.

- ``hub_get_64mib_vs_http_server``: one ``GET`` of a 64 MiB file from ``HubServer`` (``sendfile``,
  in a thread of this process) against the same file from the standard library's
  ``ThreadingHTTPServer`` + ``SimpleHTTPRequestHandler`` (also a thread of this process); best of
  5, alternating. The bytes are checked once (sha256 of what curl received). Was a test's
  ``dt < 5`` (tests/test_hubserver.py::test_serves_large_body_fast): ``limit_s`` 5.
- ``hub_unpaced_get_vs_paced``: a ``GET`` of a 3 MiB file unpaced against the same ``GET`` paced
  at 10 MB/s (``HubFaults.rate``, as ``download_vs_curl_at_link_rate`` paces a link); best of 3
  each. The target (ratio <= 1) is the claim a test used to make: pacing only ever slows a
  download (tests/test_hubserver.py::test_paced_downloads_keep_to_the_rate, which now checks the
  pauses the server asks for on a fake clock). ``paced_vs_rate`` is the paced time over
  bytes / rate: about 1 when the server keeps to the rate.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.run import best_alternating, entry

REPO_ID = "bench/hub"
REVISION = "fedcba9876543210fedcba9876543210fedcba98"
MiB = 1024 * 1024


def _curl(url: str, out: str = "/dev/null") -> None:
    subprocess.run(["curl", "-sSf", "-o", out, url], check=True)


def _hub_url(server: Any, path: str) -> str:
    return f"{server.url}/datasets/{REPO_ID}/resolve/{REVISION}/{path}"


def _checked(url: str, data: bytes, work: Path) -> None:
    got = work / "received"
    _curl(url, str(got))
    if hashlib.sha256(got.read_bytes()).digest() != hashlib.sha256(data).digest():
        raise RuntimeError(f"{url} served other bytes")
    got.unlink()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


@contextmanager
def _stdlib_server(folder: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def hub_get_64mib_vs_http_server(work: Path) -> dict[str, Any]:
    from stage2_data.demo.hubserver import HubServer

    folder = work / "upstream"
    folder.mkdir()
    data = os.urandom(64 * MiB)
    (folder / "big.bin").write_bytes(data)
    with HubServer(folder, repo_id=REPO_ID, revision=REVISION) as hub, _stdlib_server(folder) as plain:
        ours_url, base_url = _hub_url(hub, "big.bin"), f"{plain}/big.bin"
        _checked(ours_url, data, work)  # also warms the page cache and both servers
        _checked(base_url, data, work)
        best_ours, best_base = best_alternating(lambda: _curl(ours_url), lambda: _curl(base_url), repeat=5)
    return entry(
        "hub_get_64mib_vs_http_server",
        best_ours,
        "http.server (ThreadingHTTPServer + SimpleHTTPRequestHandler), same file, curl",
        best_base,
        2.0,
        limit_s=5.0,
        bytes=len(data),
        ours_MB_s=round(len(data) / 1e6 / best_ours, 1),
        baseline_MB_s=round(len(data) / 1e6 / best_base, 1),
    )


def hub_unpaced_get_vs_paced(work: Path) -> dict[str, Any]:
    from stage2_data.demo.hubserver import HubFaults, HubServer

    rate = 10e6  # bytes/s: ~0.3 s for the file, far above an unpaced loopback GET
    folder = work / "upstream"
    folder.mkdir()
    data = os.urandom(3 * MiB + 17)
    (folder / "a.tar").write_bytes(data)
    with HubServer(folder, repo_id=REPO_ID, revision=REVISION, faults=HubFaults()) as hub:
        url = _hub_url(hub, "a.tar")

        def paced() -> None:
            hub.faults.rate = rate
            try:
                _curl(url)
            finally:
                hub.faults.rate = None

        _checked(url, data, work)
        unpaced_s, paced_s = best_alternating(lambda: _curl(url), paced)
        _checked(url, data, work)
    ideal = len(data) / rate
    return entry(
        "hub_unpaced_get_vs_paced",
        unpaced_s,
        f"the same GET paced at {rate / 1e6:g} MB/s (HubFaults.rate)",
        paced_s,
        1.0,
        bytes=len(data),
        rate_MB_s=rate / 1e6,
        paced_vs_rate=round(paced_s / ideal, 3),
    )


BENCHMARKS = [hub_get_64mib_vs_http_server, hub_unpaced_get_vs_paced]
