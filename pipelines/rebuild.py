"""A rebuild as Dagster runs, stage by stage: the stages of `stage2 build` (``stage2_data.stages``),
sequenced by the same rules (``next_stage``, ``stage_partitions``).

The weekly schedule and the profile-change sensor start a rebuild at ``REBUILD_FIRST_STAGE``: one
``acquire_archives`` run per archive partition, tagged ``stage2/rebuild=<id>`` and
``stage2/stage=acquire``. The ``advance_rebuilds`` sensor follows the runs: once every partition of
a rebuild's stage has a successful run, it requests the next stage's runs (one ``extract_cache_dirs``
run per cache key, then one ``verify_kit_and_build_store`` run). A failed run stops its rebuild at
that stage (the alert sensors report it); re-executing the failed run from the UI keeps its tags,
so the rebuild goes on from there. Run keys make every request idempotent: a stage is requested
once per rebuild however many ticks see it complete.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import dagster as dg

from stage2_data.profile import Profile
from stage2_data.stages import STAGES, Stage, next_stage, stage_partitions

REBUILD_TAG = "stage2/rebuild"
STAGE_TAG = "stage2/stage"
PARTITION_TAG = "dagster/partition"

WINDOW = 300.0  # seconds of finished runs re-listed each tick (their ids are in the cursor)
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


class FinishedRuns:
    """Finished runs not seen by earlier ticks of a sensor, walked by update time.

    Works on every run storage. The cursor is ``{"ts": <latest update time seen>, "runs": {run id:
    update time}}`` for the runs of the last WINDOW seconds, so a run whose record lands late
    (parallel runs) is still seen once, and never twice. Call :meth:`save` at the end of the tick.
    """

    def __init__(self, context: dg.SensorEvaluationContext) -> None:
        cur = json.loads(context.cursor) if context.cursor else {}
        self._context = context
        self._last_ts: float | None = cur.get("ts")
        self._seen: dict[str, float] = dict(cur.get("runs") or {})

    def new(self) -> Iterator[dg.RunRecord]:
        import datetime as dt

        after = (
            dt.datetime.fromtimestamp(self._last_ts - WINDOW, tz=dt.UTC)
            if self._last_ts is not None
            else None
        )
        records = self._context.instance.get_run_records(
            dg.RunsFilter(statuses=FINISHED, updated_after=after), limit=500, ascending=True
        )
        for rec in sorted(records, key=lambda r: r.update_timestamp.timestamp()):
            ts = rec.update_timestamp.timestamp()
            if rec.dagster_run.run_id in self._seen:
                continue
            self._seen[rec.dagster_run.run_id] = ts
            self._last_ts = ts if self._last_ts is None else max(self._last_ts, ts)
            yield rec

    def save(self) -> None:
        last = self._last_ts
        seen = self._seen if last is None else {k: v for k, v in self._seen.items() if v >= last - WINDOW}
        self._context.update_cursor(json.dumps({"ts": last, "runs": seen}, sort_keys=True))


def job_of(stage: Stage) -> str:
    """The job a rebuild launches for ``stage``."""
    if stage.job is None:
        raise ValueError(f"stage {stage.name!r} has no job of its own; a rebuild cannot request it")
    return stage.job


def stage_requests(rebuild_id: str, stage: Stage, profile: Profile) -> list[dg.RunRequest]:
    """The runs of one stage of rebuild ``rebuild_id`` (its job, once per partition, largest first:
    runs are dequeued in the order requested), tagged so that ``advance_rebuilds`` follows them."""
    tags = {REBUILD_TAG: rebuild_id, STAGE_TAG: stage.name}
    return [
        dg.RunRequest(
            run_key=f"{rebuild_id}-{stage.name}" + (f"-{p}" if p is not None else ""),
            job_name=job_of(stage),
            partition_key=p,
            tags=tags,
        )
        for p in stage_partitions(stage, profile)
    ]


def stage_complete(instance: dg.DagsterInstance, rebuild_id: str, stage: Stage, profile: Profile) -> bool:
    """True when every partition of ``stage`` of the rebuild has a successful run."""
    records = instance.get_run_records(
        dg.RunsFilter(
            tags={REBUILD_TAG: rebuild_id, STAGE_TAG: stage.name}, statuses=[dg.DagsterRunStatus.SUCCESS]
        )
    )
    done = {r.dagster_run.tags.get(PARTITION_TAG) for r in records}
    return all(p in done for p in stage_partitions(stage, profile))


def advance_rebuilds(
    context: dg.SensorEvaluationContext, profile: Profile
) -> list[dg.RunRequest] | dg.SkipReason:
    """Request the next stage of every rebuild whose current stage a newly finished run completed."""
    by_name = {s.name: s for s in STAGES}
    runs = FinishedRuns(context)
    candidates: set[tuple[str, str]] = set()
    for rec in runs.new():
        tags = rec.dagster_run.tags
        stage = by_name.get(tags.get(STAGE_TAG, ""))
        if (
            rec.dagster_run.status == dg.DagsterRunStatus.SUCCESS
            and REBUILD_TAG in tags
            and stage is not None
            and next_stage(stage) is not None
        ):
            candidates.add((tags[REBUILD_TAG], stage.name))
    requests: list[dg.RunRequest] = []
    for rebuild_id, name in sorted(candidates):
        stage = by_name[name]
        nxt = next_stage(stage)
        if nxt is not None and stage_complete(context.instance, rebuild_id, stage, profile):
            context.log.info(f"rebuild {rebuild_id}: stage {name} complete; requesting stage {nxt.name}")
            requests += stage_requests(rebuild_id, nxt, profile)
    runs.save()
    return requests or dg.SkipReason("no rebuild stage completed since the last tick")
