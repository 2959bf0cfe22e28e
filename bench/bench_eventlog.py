"""What one stored event costs in each local event-log storage (issue #27: the build's local
instance names only Dagster's own, documented storage classes).

- ``event_log_per_event`` (informational, no target): ``EVENTS`` asset materializations stored one
  after another through ``DagsterInstance.report_runless_asset_event`` (the public call that writes
  one event through the instance's event-log storage), on a fresh instance per variant, the
  variants alternated over ``ROUNDS`` rounds (order reversed every other round), median per variant:

  - ours: stage2's own ``dagster.yaml`` (``config.instance_config``: Dagster's
    ``ConsolidatedSqliteEventLogStorage``, one SQLite database for every run's events);
  - baseline: Dagster's ``storage: sqlite:`` (its default local storage: a database per run).

  ``ours_s`` / ``baseline_s`` are seconds per event. Multiplied by a build's events (a demo build
  stores ~200: each partition's materialization and check results, each step's start and end) it
  gives what the storage adds to a build.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.run import entry

EVENTS = int(os.environ.get("STAGE2_BENCH_EVENTS", "300"))
ROUNDS = int(os.environ.get("STAGE2_BENCH_EVENT_ROUNDS", "3"))
VARIANTS = ("stage2", "public")


def _instance_yaml(variant: str, home: Path) -> dict[str, Any]:
    from stage2_pipelines.config import instance_config

    if variant == "stage2":
        return instance_config(home)
    return {"telemetry": {"enabled": False}, "storage": {"sqlite": {"base_dir": str(home / "storage")}}}


def _seconds_per_event(variant: str, work: Path) -> tuple[float, str]:
    import dagster as dg
    import yaml

    home = Path(tempfile.mkdtemp(dir=work))
    (home / "dagster.yaml").write_text(yaml.safe_dump(_instance_yaml(variant, home)), encoding="utf-8")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization("warm"))  # schema, engine, files
        t = time.perf_counter()
        for i in range(EVENTS):
            instance.report_runless_asset_event(dg.AssetMaterialization("x", metadata={"i": i}))
        per_event = (time.perf_counter() - t) / EVENTS
        storage = type(instance.event_log_storage).__name__
    return per_event, storage


def event_log_per_event(work: Path) -> dict[str, Any]:
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    storages: dict[str, str] = {}
    load_before = os.getloadavg()[0]
    for r in range(ROUNDS):
        for variant in VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS)):
            per_event, storages[variant] = _seconds_per_event(variant, work)
            times[variant].append(per_event)
    med = {v: statistics.median(xs) for v, xs in times.items()}
    return entry(
        "event_log_per_event",
        med["stage2"],
        "one event stored through Dagster's public `storage: sqlite:`",
        med["public"],
        None,
        events=EVENTS,
        rounds=ROUNDS,
        ms_per_event={v: [round(x * 1000, 2) for x in xs] for v, xs in times.items()},
        storage_classes=storages,
        load_avg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
    )


BENCHMARKS = [event_log_per_event]
