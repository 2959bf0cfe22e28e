"""The full build of a multi-archive profile (the demo: 14 archive partitions, 13 cache keys) with
Dagster's in-process, multiprocess and Dask executors, as ratios to the in-process executor.

Every variant is the same ``build_all`` (one run per stage under the stage's named job) from a
fresh data root and a fresh Dagster instance (SQLite, written by ``ensure_instance``), over the same
loopback hub, with the same number of concurrent runs (``STAGE2_BENCH_SCALE_CONCURRENCY``, default 2):

- ``in_process`` (baseline): each run's steps in the run's own process (the in-process executor);
- ``multiprocess``: Dagster's multiprocess executor, each step in a child process of its run;
- ``dask``: the dagster-dask executor on a ``dask.distributed`` LocalCluster (scheduler + 2 worker
  processes on 127.0.0.1, started once per build and included in the time), each step a Dask task.

All three must produce the same store fingerprint; the entry records it.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.run import drop_caches, entry

CONCURRENCY = int(os.environ.get("STAGE2_BENCH_SCALE_CONCURRENCY", "2"))
EXECUTORS = ("in_process", "multiprocess", "dask")


def _build(demo: Any, workdir: Path, executor: str) -> tuple[float, dict[str, Any]]:
    from stage2_data.demo.hubserver import HubServer
    from stage2_pipelines.config import BuildConfig
    from stage2_pipelines.runner import build_all

    home = Path(tempfile.mkdtemp(prefix=f"home-{executor}-", dir=workdir))
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ.setdefault("STAGE2_RUN_LOG_LEVEL", "WARNING")
    try:
        with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as hub:
            cfg = BuildConfig(
                profile_path=str(demo.profile),
                data_root=str(workdir / f"root-{executor}"),
                endpoint=hub.url,
                executor=executor,
            )
            drop_caches()
            t = time.perf_counter()
            summary = build_all(cfg, concurrency=CONCURRENCY)
            took = time.perf_counter() - t
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old
    if not summary["ok"]:
        raise RuntimeError(f"{executor} build failed: {summary['errors'][:3]}")
    return took, summary


def bench_build_executors(workdir: Path) -> list[dict]:
    from stage2_data.demo import generate_demo

    demo = generate_demo(workdir / "demo")
    times: dict[str, float] = {}
    prints: dict[str, str] = {}
    runs = 0
    for ex in EXECUTORS:
        times[ex], summary = _build(demo, workdir, ex)
        prints[ex] = summary["fingerprint"]
        runs = len(summary["runs"])
    if len(set(prints.values())) != 1:
        raise RuntimeError(f"executors disagree on the store fingerprint: {prints}")
    base = times["in_process"]
    return [
        entry(
            f"full_build_{ex}_executor_vs_in_process",
            times[ex],
            "in-process executor",
            base,
            None,
            runs=runs,
            concurrent_runs=CONCURRENCY,
            cpus=os.cpu_count(),
            fingerprint=prints[ex],
        )
        for ex in EXECUTORS
        if ex != "in_process"
    ]


BENCHMARKS = [bench_build_executors]
