"""`make ui`: the Dagster web UI on 127.0.0.1 over the same instance as `make demo`, with the demo's hub.

Paths come from the environment (``config.py``), relative to the working directory: the demo in
``STAGE2_DEMO_ROOT`` (``./.demo``), the instance in ``DAGSTER_HOME`` (``./.dagster_home``), the code
location from ``STAGE2_WORKSPACE`` (a workspace file) or else the module ``stage2_pipelines.definitions``.

Starts (1) the loopback hub serving the demo's upstream folder and (2) `dagster dev`, each in its own
process group, and on SIGINT/SIGTERM (or when `dagster dev` exits) stops both groups by PID: SIGINT
(dagster dev's clean shutdown) / SIGTERM first, SIGKILL of the whole group after 20 s, so no
webserver, daemon or code server is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stage2_data.demo import generate_demo

from . import definitions
from .config import dagster_home, demo_root
from .runner import write_instance_yaml


def _signal_group(p: subprocess.Popen[str] | subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process group led by ``p`` (started with start_new_session=True)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def main() -> int:
    demo = generate_demo(demo_root() / "demo")
    env = dict(os.environ)
    env["DAGSTER_HOME"] = str(dagster_home())
    Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    write_instance_yaml(Path(env["DAGSTER_HOME"]))
    port = env.get("STAGE2_UI_PORT", "3000")
    hub = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stage2_data.cli",
            "serve-hub",
            str(demo.upstream),
            "--repo-id",
            demo.repo_id,
            "--revision",
            demo.revision,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert hub.stdout is not None
    url = hub.stdout.readline().strip()
    if not url.startswith("http"):
        _signal_group(hub, signal.SIGKILL)
        print("make ui: the loopback hub did not start (see the error above)", file=sys.stderr)
        return 2
    env.update(
        STAGE2_PROFILE=str(demo.profile),
        STAGE2_DATA_ROOT=env.get("STAGE2_DATA_ROOT", str(demo_root() / "data")),
        STAGE2_HUB_ENDPOINT=url,
    )
    print(
        f"loopback hub: {url}\nDagster UI:   http://127.0.0.1:{port}  (instance {env['DAGSTER_HOME']})",
        flush=True,
    )
    workspace = os.environ.get("STAGE2_WORKSPACE")
    location = ["-w", workspace] if workspace else ["-m", definitions.__name__, "-a", "defs"]
    ui = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", *location, "-h", "127.0.0.1", "-p", port],
        env=env,
        start_new_session=True,
    )
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping and ui.poll() is None:
            time.sleep(0.5)
    finally:
        for p, sig in ((ui, signal.SIGINT), (hub, signal.SIGTERM)):
            _signal_group(p, sig)
        for p in (ui, hub):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=20)
            _signal_group(p, signal.SIGKILL)  # anything left in the group (webserver, daemon, code server)
            p.wait()
    return ui.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
