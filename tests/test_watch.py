"""Progress inside a stage's one run (pipelines/watch.py): the partitions of a single-run backfill are
reported as the run materializes them, read from the instance while the run goes on, each once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.profile import load_profile
from stage2_pipelines.config import BuildConfig
from stage2_pipelines.runner import open_instance
from stage2_pipelines.runs import partition_runs, run_selection


def test_partitions_are_reported_while_their_run_goes_on(
    demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    prof = load_profile(demo_cache.profile)
    keys = prof.cache_keys()  # archive_file's partitions
    seen: list[tuple[float, dict[str, Any]]] = []
    root = tmp_path / "root"
    open_instance(root)[0]
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        hub.faults.rate = 4 * 1024 * 1024  # bytes/s per download: the run lasts seconds, not one poll
        cfg = BuildConfig(profile_path=str(demo_cache.profile), data_root=str(root), endpoint=hub.url)
        run = run_selection(
            cfg.to_dict(),
            ["archive_file"],
            partition_keys=keys,
            workers=1,
            on_partition=lambda e: seen.append((time.time(), e)),
        )
    assert run["success"], run["errors"]
    record = dg.DagsterInstance.get().get_run_record_by_id(run["run_id"])
    assert record is not None and record.end_time is not None
    early = [(t, e) for t, e in seen if t < record.end_time]
    # downloads one at a time at a paced rate: the first archives were reported before the run ended
    assert len(early) >= 2, [(round(record.end_time - t, 2), e["partition"]) for t, e in seen]
    assert all(e["run_id"] == run["run_id"] and e["success"] for _, e in seen)
    reported = [e["partition"] for _, e in seen]
    assert len(reported) == len(set(reported)) and set(reported) == set(run["reported"]) <= set(keys)
    # the rest come from the run's summary: every partition once in all
    rest = [p["partition"] for p in partition_runs(run) if p["partition"] not in set(run["reported"])]
    assert sorted(reported + rest) == sorted(keys)
