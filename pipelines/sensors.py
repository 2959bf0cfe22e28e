"""Sensors: alerts on failed checks and failed runs; starting and advancing rebuilds (pipelines/rebuild.py)."""

import hashlib
from collections.abc import Callable
from typing import Any

import dagster as dg

from stage2_data import layout
from stage2_data.profile import Profile
from stage2_data.stages import REBUILD_FIRST_STAGE, STAGES, STREAM_JOB
from stage2_resources import AlertsResource

from .rebuild import FinishedRuns, advance_rebuilds, stage_requests


def deliver_for_finished_runs(
    context: dg.SensorEvaluationContext,
    alerts: AlertsResource,
    alerts_of: Callable[[dg.DagsterInstance, dg.DagsterRun], list[dict[str, Any]]],
    nothing: str,
) -> dg.SkipReason | None:
    """Deliver ``alerts_of(instance, run)``, with the run's link, for every run finished since the
    last tick (each run is looked at once: ``FinishedRuns``). The first tick looks at every finished
    run, so failures of runs that ended while no daemon ran (a `stage2 build` without `make ui`)
    are alerted too."""
    runs = FinishedRuns(context)
    sent = 0
    for rec in runs.new():
        run = rec.dagster_run
        for alert in alerts_of(context.instance, run):
            problem = alerts.deliver({**alert, "run_link": alerts.run_link(run.run_id)})
            if problem:
                context.log.warning(problem)
            sent += 1
    runs.save()
    return None if sent else dg.SkipReason(nothing)


def failed_check_alerts(instance: dg.DagsterInstance, run: dg.DagsterRun) -> list[dict[str, Any]]:
    """One alert per failed asset check of ``run``. A run over a range of partitions records each
    partition's result and one for the whole range; the partitions' results say it, once each."""
    failed = []
    for entry in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        data: Any = entry.dagster_event.event_specific_data if entry.dagster_event else None
        if data is not None and not data.passed:
            failed.append(data)
    by_partition = {(d.asset_key, d.check_name) for d in failed if getattr(d, "partition", None)}
    out = []
    for data in failed:
        partition = getattr(data, "partition", None) or run.tags.get("dagster/partition")
        if partition is None and (data.asset_key, data.check_name) in by_partition:
            continue  # the range's summary of the partitions' results above
        out.append(
            {
                "kind": "asset_check_failed",
                "asset": data.asset_key.to_user_string(),
                "check": data.check_name,
                "partition": partition,
                "reason": data.description or "",
                "run_id": run.run_id,
            }
        )
    return out


def failed_run_alert(instance: dg.DagsterInstance, run: dg.DagsterRun) -> list[dict[str, Any]]:
    """The alert of ``run`` when it failed: its job, partition and Dagster's failure message."""
    if run.status != dg.DagsterRunStatus.FAILURE:
        return []
    failures = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    event = failures[-1].dagster_event if failures else None
    return [
        {
            "kind": "run_failed",
            "asset": None,
            "check": None,
            "job": run.job_name,
            "partition": run.tags.get("dagster/partition"),
            "reason": (event.message if event is not None else None) or "run failed",
            "run_id": run.run_id,
        }
    ]


def build_sensors(profile: Profile, jobs: dict[str, Any]) -> list[dg.SensorDefinition]:
    @dg.sensor(
        name="alert_on_failed_check",
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Delivers an alert (asset, check, partition, reason, run link) for every failed asset check.",
    )
    def alert_on_failed_check(context: dg.SensorEvaluationContext, alerts: AlertsResource):
        return deliver_for_finished_runs(
            context,
            alerts,
            failed_check_alerts,
            "no failed asset checks since the last tick",
        )

    # A sensor over the instance's finished runs, not Dagster's run_failure_sensor: that one starts
    # from the moment it is first turned on, so a build's failed run that ended before any daemon
    # ran would never be alerted. It sees every run of the instance, `stage2 build`'s included
    # (launched, or executed in process without a code location's origin).
    @dg.sensor(
        name="alert_on_failed_run",
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Delivers an alert (job, partition, reason, run link) for every failed run.",
    )
    def alert_on_failed_run(context: dg.SensorEvaluationContext, alerts: AlertsResource):
        return deliver_for_finished_runs(
            context, alerts, failed_run_alert, "no failed runs since the last tick"
        )

    # what advance_rebuilds requests: the jobs of a rebuild's stages after its first, and the one
    # job that runs the streamed stages together
    first = STAGES.index(REBUILD_FIRST_STAGE)
    later_jobs = [jobs[s.job] for s in STAGES[first + 1 :]] + [jobs[STREAM_JOB]]

    kit_files = [profile.profile_path] + [
        profile.kit_file(k)
        for k in ("pair_manifest", "subset_checksums", "sidecar_archive", "sidecar_archive_sha256")
    ]

    @dg.sensor(
        name="rebuild_on_profile_change",
        jobs=[jobs[REBUILD_FIRST_STAGE.job]],
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Starts a rebuild (the profile, then every cache key's archives and extraction, and "
        "the store: see advance_rebuilds) when the profile (pinned revision, archives) or a kit file changes.",
    )
    def rebuild_on_profile_change(context: dg.SensorEvaluationContext):
        h = hashlib.sha256()
        for f in kit_files:
            h.update(str(f).encode())
            h.update(f.read_bytes() if f is not None and f.is_file() else b"<missing>")
        adir = profile.kit_file("action_manifest_dir")
        for f in layout.action_manifest_paths(adir) if adir.is_dir() else []:
            h.update(f.name.encode() + f.read_bytes())
        digest = h.hexdigest()
        previous = context.cursor
        context.update_cursor(digest)
        if previous is None or previous == digest:
            return dg.SkipReason(
                "profile and kit unchanged" if previous else "recorded the current profile and kit"
            )
        return stage_requests(f"change-{digest[:16]}", REBUILD_FIRST_STAGE, profile)

    @dg.sensor(
        name="advance_rebuilds",
        jobs=later_jobs,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Carries a rebuild (runs tagged stage2/rebuild, as weekly_rebuild and "
        "rebuild_on_profile_change start them) through its stages: when the runs a stage needs have "
        "succeeded, it requests that stage (after the profile, the sidecars and one download_and_extract "
        "run per range of cache keys; after all of those, the store).",
    )
    def advance_rebuilds_sensor(context: dg.SensorEvaluationContext):
        return advance_rebuilds(context, profile)

    return [alert_on_failed_check, alert_on_failed_run, rebuild_on_profile_change, advance_rebuilds_sensor]
