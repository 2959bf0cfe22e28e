"""A rebuild as Dagster runs: the stages of `stage2 build` (``stage2_data.stages``), sequenced by
the same rules (``Stage.after``), the acquire and extract stages streamed as a launched build
streams them.

The weekly schedule and the profile-change sensor start a rebuild at ``REBUILD_FIRST_STAGE``: one
``check_profile`` run, tagged ``stage2/rebuild=<id>`` and ``stage2/stage=profile``. The
``advance_rebuilds`` sensor follows the runs: once every stage a stage needs has succeeded in the
rebuild, it requests that stage's runs. After the profile: ``unpack_action_sidecars``, and the
streamed stages (``stages.STREAMED``) as one ``download_and_extract`` run per range of cache keys
(``stages.stream_groups``: the ranges `stage2 build` launches), each tagged ``stage2/stage=stream``
and ``stage2/part=<i>/<n>``, all requested at once: the ``downloads`` concurrency pool of
``archive_file`` decides how many go together (deploy/dagster.yaml: two slots; the run queue starts
a streamed run once a slot is free, so the next range starts when a range's downloads are over, as
`stage2 build` runs them). After
every streamed run and the sidecars: ``verify_kit_and_build_store``. A failed run stops its
rebuild there (the alert sensors report it, per partition); re-executing the failed run from the
UI keeps its tags, so the rebuild goes on from there. Run keys make every request idempotent: a
stage is requested once per rebuild however many ticks see it complete.

Why a sensor of our own and not declarative automation (``AutomationCondition.eager()`` /
``on_cron``): those conditions react to every materialization, including `stage2 build`'s own runs.
Right after the CLI's ``acquire_archives`` run, ``eager()`` requests every ``cache_dir`` partition
(Dagster 1.13, as ``dg.evaluate_automation_conditions`` shows on the demo), so the daemon would
extract them while the CLI, holding the data root's lock, extracts them too. And a schedule cannot
launch an asset backfill in 1.13 (only a sensor, through a private constructor). This sensor follows
only runs tagged ``stage2/rebuild``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import dagster as dg

from stage2_data.checks import CHECKS_BY_ASSET
from stage2_data.profile import Profile
from stage2_data.stages import (
    JOB_ASSETS,
    PARTITIONS_TAG,
    STAGES,
    STREAM_JOB,
    STREAMED,
    Stage,
    stage_partitions,
    stages_after,
    stream_groups,
)

from .config import stream_run_bytes

REBUILD_TAG = "stage2/rebuild"
STAGE_TAG = "stage2/stage"
STREAM_STAGE = "stream"  # the stage tag of a rebuild's streamed runs (stages.STREAMED)
PART_TAG = "stage2/part"  # "<i>/<n>": which of the rebuild's n streamed runs
PARTITION_TAG = "dagster/partition"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"

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


def partition_tags(profile: Profile, keys: list[str]) -> dict[str, str]:
    """The tags of one run over the cache keys ``keys``: one partition, or the range holding them all
    (a single-run backfill; ``stage2/partitions`` names the keys when the range holds others too)."""
    if len(keys) == 1:
        return {PARTITION_TAG: keys[0]}
    if not keys:
        return {}
    order = profile.cache_keys()
    idx = sorted(order.index(k) for k in keys)
    tags = {RANGE_START_TAG: order[idx[0]], RANGE_END_TAG: order[idx[-1]]}
    if len(keys) != idx[-1] - idx[0] + 1:
        tags[PARTITIONS_TAG] = json.dumps(sorted(keys))
    return tags


def stage_requests(
    rebuild_id: str, stage: Stage, profile: Profile, *, stream: bool = True
) -> list[dg.RunRequest]:
    """The runs of one stage of rebuild ``rebuild_id``, tagged so that ``advance_rebuilds`` follows
    them: the stage's job over every partition of the stage in one run (``BackfillPolicy.single_run``);
    with ``stream``, the streamed stages (``stages.STREAMED``) as one ``STREAM_JOB`` run per range
    of cache keys, requested with the first of them (the later ones run inside those runs)."""
    if stream and stage in STREAMED:
        return stream_requests(rebuild_id, profile) if stage is STREAMED[0] else []
    keys = [p for p in stage_partitions(stage, profile) if p is not None]
    tags = {REBUILD_TAG: rebuild_id, STAGE_TAG: stage.name, **partition_tags(profile, keys)}
    subset = job_subset(list(stage.assets), stage.job)  # the store stage: its job without the sidecars
    return [dg.RunRequest(run_key=f"{rebuild_id}-{stage.name}", job_name=stage.job, tags=tags, **subset)]


def stream_requests(rebuild_id: str, profile: Profile) -> list[dg.RunRequest]:
    """One ``STREAM_JOB`` run per range of cache keys (``stages.stream_groups``, the most bytes
    first): each downloads its range's archives and extracts them, as `stage2 build` streams them."""
    groups = stream_groups(profile, profile.cache_keys(), stream_run_bytes())
    return [
        dg.RunRequest(
            run_key=f"{rebuild_id}-{STREAM_STAGE}-{i}of{len(groups)}",
            job_name=STREAM_JOB,
            tags={
                REBUILD_TAG: rebuild_id,
                STAGE_TAG: STREAM_STAGE,
                PART_TAG: f"{i}/{len(groups)}",
                **partition_tags(profile, keys),
            },
        )
        for i, keys in enumerate(groups, start=1)
    ]


def job_subset(selection: list[str], job: str) -> dict[str, Any]:
    """``{}`` when ``selection`` is all of ``job``'s assets; else the part of the job to run: those
    assets and their own checks (not the standalone checks of the verify job), as ``RunRequest``
    takes them (``asset_selection``, ``asset_check_keys``)."""
    if job in JOB_ASSETS and set(selection) == set(JOB_ASSETS[job]):
        return {}
    return {
        "asset_selection": [dg.AssetKey(a) for a in selection],
        "asset_check_keys": [
            dg.AssetCheckKey(dg.AssetKey(a), n) for a in selection for n in CHECKS_BY_ASSET[a]
        ],
    }


def stage_complete(instance: dg.DagsterInstance, rebuild_id: str, stage: Stage) -> bool:
    """True when the stage's run of the rebuild succeeded (or its re-execution did: same tags); a
    streamed stage, when every streamed run of the rebuild did (each ``<i>/<n>`` of ``PART_TAG``)."""

    def succeeded(stage_tag: str) -> list[dg.RunRecord]:
        return list(
            instance.get_run_records(
                dg.RunsFilter(
                    tags={REBUILD_TAG: rebuild_id, STAGE_TAG: stage_tag},
                    statuses=[dg.DagsterRunStatus.SUCCESS],
                ),
                limit=None if stage_tag == STREAM_STAGE else 1,
            )
        )

    own = succeeded(stage.name)
    if own or stage not in STREAMED:
        return bool(own)
    parts = {r.dagster_run.tags.get(PART_TAG, "") for r in succeeded(STREAM_STAGE)}
    counts = {p.partition("/")[2] for p in parts}
    return len(counts) == 1 and str(len(parts)) in counts


def advance_rebuilds(
    context: dg.SensorEvaluationContext, profile: Profile
) -> list[dg.RunRequest] | dg.SkipReason:
    """Request, for every rebuild a newly finished run moved on, each stage whose needs
    (``Stage.after``) are now all complete: the kit and the streamed runs after the profile, the
    store after every streamed run and the kit. A stage is requested once per rebuild (its run key)."""
    by_name = {s.name: s for s in STAGES}
    by_name[STREAM_STAGE] = STREAMED[-1]  # a streamed run may end the streamed stages
    runs = FinishedRuns(context)
    candidates: set[tuple[str, str]] = set()
    for rec in runs.new():
        tags = rec.dagster_run.tags
        stage = by_name.get(tags.get(STAGE_TAG, ""))
        if (
            rec.dagster_run.status == dg.DagsterRunStatus.SUCCESS
            and REBUILD_TAG in tags
            and stage is not None
            and stages_after(stage)
        ):
            candidates.add((tags[REBUILD_TAG], stage.name))
    requests: list[dg.RunRequest] = []
    asked: set[tuple[str, str]] = set()
    for rebuild_id, name in sorted(candidates):
        for nxt in stages_after(by_name[name]):
            if (rebuild_id, nxt.name) in asked:
                continue
            if all(stage_complete(context.instance, rebuild_id, by_name[a]) for a in nxt.after):
                context.log.info(
                    f"rebuild {rebuild_id}: stage(s) {', '.join(nxt.after)} complete; requesting stage {nxt.name}"
                )
                asked.add((rebuild_id, nxt.name))
                # after a streamed stage's run (a streamed run, or an acquire_archives run started
                # by hand), what follows goes stage by stage
                requests += stage_requests(rebuild_id, nxt, profile, stream=by_name[name] not in STREAMED)
    runs.save()
    return requests or dg.SkipReason("no rebuild stage completed since the last tick")
