"""One run against today's runs, at link rate: ``one_run_build_at_link_rate``.

The design question of issue #27 (docs/architecture.md, "Orchestration"): would the build be
faster, and end sooner after its last byte, as ONE launched run of one job in which each cache
directory is two assets of its own (``bench/onerun_defs.py``: Dagster's multiprocess executor
pipelining downloads into extractions, two downloads at once) than as today's runs (a profile run,
streamed ``download_and_extract`` runs over ranges of cache keys, the kit's run, the store's run)?

The same data as ``whole_build_at_link_rate`` (``STAGE2_BENCH_LINK_SCALE``, the ~4 GB
full-cardinality demo by default) over the same paced loopback hub (``STAGE2_BENCH_LINK_MB_S``,
100 MB/s). Three ways, each from a fresh data root and instance, the page cache dropped before each:
``hf download`` of the archives alone (the link's floor), `stage2 build` (ours), and the one-run
prototype, launched through the instance (a code server of ``bench.onerun_defs`` and ``dagster job
launch``, as `stage2 build` launches). Both builds must publish the same store (fingerprint).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.bench_link import SCALE, _first_request, _hf_download, _stage2_build, _timeline
from bench.bench_noop import REPO, _env, scaled_demo
from bench.run import caches_note, drop_caches, entry, wait_for_quiet_io

LINK_MB_S = float(os.environ.get("STAGE2_BENCH_LINK_MB_S", "100"))
FULL = os.environ.get("STAGE2_BENCH_ONERUN_SMALL", "") in ("", "0")
WAYS = ("hf", "ours", "one_run")


def _one_run(demo: Any, hub: Any, root: Path) -> tuple[float, float, float, float, Path, str]:
    """Wall seconds of the one-run build launched through a fresh instance (from before its code
    server starts to the run's end), when the hub got its first request and sent its last paced
    byte, the wall-clock start, the instance's folder and the published store's fingerprint."""
    import json

    from stage2_pipelines.config import BuildConfig, write_instance_yaml
    from stage2_pipelines.launch import free_port

    home = root / "dagster_home"
    write_instance_yaml(home)
    cfg = BuildConfig(profile_path=str(demo.profile), data_root=str(root / "data"), endpoint=hub.url)
    env = {**_env(), **cfg.to_env(), "DAGSTER_HOME": str(home), "PYTHONPATH": str(REPO)}
    dagster = str(Path(sys.executable).parent / "dagster")
    port = free_port()
    ws = root / "workspace.yaml"
    ws.write_text(
        f"load_from:\n  - grpc_server:\n      host: 127.0.0.1\n      port: {port}\n      location_name: onerun\n"
    )
    started = time.time()
    t0 = time.monotonic()
    with open(root / "server.log", "wb") as log:
        server = subprocess.Popen(
            [dagster, "api", "grpc", "-m", "bench.onerun_defs", "-a", "defs", "--host", "127.0.0.1",
             "--port", str(port), "--location-name", "onerun", "--working-directory", str(REPO)],
            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        try:
            took = _launch_and_wait(dagster, env, port, ws, home, server, root) - t0
        finally:
            server.terminate()
            server.wait()
    (manifest,) = (root / "data" / "stores").glob("*/current/manifest.json")
    fingerprint = json.loads(manifest.read_text())["fingerprint"]
    return took, _first_request(hub, t0), hub.link_free_at - t0, started, home, fingerprint


def _launch_and_wait(
    dagster: str, env: dict[str, str], port: int, ws: Path, home: Path, server: Any, root: Path
) -> float:
    """Once the code server answers, launch one run of ``build`` through the instance and wait
    for it to end: when it ended (``time.monotonic()``; a named error if it did not succeed)."""
    import dagster as dg

    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            break
        if server.poll() is not None:
            raise RuntimeError(f"code server exited: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.05)
    run_id = str(uuid.uuid4())
    subprocess.run(
        [dagster, "job", "launch", "-w", str(ws), "-j", "build", "--run-id", run_id],
        env=env, cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    # (not `with`: an instance's exit leaves it as Dagster's current state storage, see tests/conftest.py)
    inst = dg.DagsterInstance.from_config(str(home))
    try:
        while True:
            run = inst.get_run_by_id(run_id)
            if run is not None and run.is_finished:
                ended = time.monotonic()
                break
            time.sleep(0.1)
        if run.status != dg.DagsterRunStatus.SUCCESS:
            raise RuntimeError(f"one-run build ended {run.status}: see {home}")
    finally:
        inst.dispose()
    return ended


def one_run_build_at_link_rate(work: Path) -> dict[str, Any]:
    from stage2_data.demo.hubserver import HubFaults, HubServer

    demo = scaled_demo(work / "demo", SCALE if FULL else 9.2, full_cardinality=FULL)
    archive_bytes = sum(f.stat().st_size for f in demo.upstream.rglob("*") if f.is_file())
    rate = LINK_MB_S * 1e6
    out: dict[str, Any] = {}
    dropped = True
    with HubServer(
        demo.upstream, repo_id=demo.repo_id, revision=demo.revision, faults=HubFaults(link_rate=rate)
    ) as hub:
        for way in WAYS:
            dropped = drop_caches(page_cache=True) and dropped
            wait_for_quiet_io()
            root = work / way
            root.mkdir()
            if way == "hf":
                took, first, last = _hf_download(demo, hub, root)
                out[way] = {"s": took, "first_request_s": first, "last_byte_s": last}
            elif way == "ours":
                took, first, last, started, summary = _stage2_build(demo, hub, root / "data")
                runs, steps, store = _timeline(summary["dagster_home"], started, last)
                out[way] = {"s": took, "first_request_s": first, "last_byte_s": last, "runs": runs,
                            "steps": steps, "store": store, "fingerprint": summary.get("fingerprint")}  # fmt: skip
            else:
                took, first, last, started, home, fp = _one_run(demo, hub, root)
                runs, steps, store = _timeline(str(home), started, last)
                out[way] = {"s": took, "first_request_s": first, "last_byte_s": last, "runs": runs,
                            "steps": steps, "store": store, "fingerprint": fp}  # fmt: skip
            shutil.rmtree(root / "data" / "archives", ignore_errors=True)
    ours, one, hf = out["ours"], out["one_run"], out["hf"]
    if ours["fingerprint"] != one["fingerprint"]:
        raise RuntimeError(
            f"the two builds published different stores: {ours['fingerprint']} {one['fingerprint']}"
        )

    def r(x: Any) -> Any:
        return round(x, 2) if isinstance(x, float) else x

    return entry(
        "one_run_build_at_link_rate" + ("" if FULL else "_small"),
        one["s"],
        "`stage2 build` (today's runs) of the same profile over the same link",
        ours["s"],
        None,
        link_mb_s=LINK_MB_S,
        archive_bytes=archive_bytes,
        hf_download_s=r(hf["s"]),
        one_run_vs_hf_download=round(one["s"] / hf["s"], 3),
        ours_vs_hf_download=round(ours["s"] / hf["s"], 3),
        **{f"{w}_{k}": r(out[w][k]) for w in ("ours", "one_run") for k in ("first_request_s", "last_byte_s")},
        ours_after_last_byte_s=r(ours["s"] - ours["last_byte_s"]),
        one_run_after_last_byte_s=r(one["s"] - one["last_byte_s"]),
        one_run_steps=one["steps"],
        one_run_runs=one["runs"],
        ours_runs=ours["runs"],
        fingerprint=one["fingerprint"],
        cpus=os.cpu_count(),
        caches=caches_note(dropped, "way"),
    )


BENCHMARKS = [one_run_build_at_link_rate]
