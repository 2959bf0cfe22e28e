"""Sensors: alerts on failed checks and failed runs, and a rebuild request when the profile or kit changes."""

import hashlib
from typing import Any

import dagster as dg

from resources import AlertsResource
from stage2_data.profile import Profile

WINDOW = 300.0  # seconds of finished runs re-listed each tick (their ids are in the cursor)
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def check_failure_alerts(context: dg.SensorEvaluationContext, alerts: AlertsResource) -> dg.SkipReason | None:
    """Every failed asset check of every run finished since the cursor becomes one alert.

    Walks finished runs by update time (works on every event-log storage, run-sharded SQLite
    included). The cursor is ``{"ts": <latest run update time seen>, "runs": {run id: update time}}``
    for the runs of the last WINDOW seconds, so a run whose record lands late (parallel builds) is
    still alerted once, and never twice."""
    import datetime as dt
    import json

    cur = json.loads(context.cursor) if context.cursor else {}
    last_ts: float | None = cur.get("ts")
    seen: dict[str, float] = dict(cur.get("runs") or {})
    after = dt.datetime.fromtimestamp(last_ts - WINDOW, tz=dt.UTC) if last_ts is not None else None
    records = context.instance.get_run_records(
        dg.RunsFilter(statuses=FINISHED, updated_after=after), limit=500, ascending=True
    )
    sent = 0
    for rec in sorted(records, key=lambda r: r.update_timestamp.timestamp()):
        ts = rec.update_timestamp.timestamp()
        run = rec.dagster_run
        if run.run_id in seen:
            continue
        seen[run.run_id] = ts
        last_ts = ts if last_ts is None else max(last_ts, ts)
        for entry in context.instance.all_logs(
            run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        ):
            data: Any = entry.dagster_event.event_specific_data if entry.dagster_event else None
            if data is None or data.passed:
                continue
            partition = run.tags.get("dagster/partition") or getattr(data, "partition", None)
            problem = alerts.deliver(
                {
                    "kind": "asset_check_failed",
                    "asset": data.asset_key.to_user_string(),
                    "check": data.check_name,
                    "partition": partition,
                    "reason": data.description or "",
                    "run_id": run.run_id,
                    "run_link": alerts.run_link(run.run_id),
                }
            )
            if problem:
                context.log.warning(problem)
            sent += 1
    if last_ts is not None:
        seen = {k: v for k, v in seen.items() if v >= last_ts - WINDOW}
    context.update_cursor(json.dumps({"ts": last_ts, "runs": seen}, sort_keys=True))
    return None if sent else dg.SkipReason("no failed asset checks since the last tick")


def build_sensors(profile: Profile, jobs: dict[str, Any]) -> list[dg.SensorDefinition]:
    @dg.sensor(
        name="alert_on_failed_check",
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Delivers an alert (asset, check, partition, reason, run link) for every failed asset check.",
    )
    def alert_on_failed_check(context: dg.SensorEvaluationContext, alerts: AlertsResource):
        return check_failure_alerts(context, alerts)

    @dg.run_failure_sensor(
        name="alert_on_failed_run",
        # True: runs started by `stage2 build` have no code-location origin; they must alert too.
        monitor_all_code_locations=True,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Delivers an alert for every failed run.",
    )
    def alert_on_failed_run(context: dg.RunFailureSensorContext, alerts: AlertsResource):
        run = context.dagster_run
        problem = alerts.deliver(
            {
                "kind": "run_failed",
                "asset": None,
                "check": None,
                "job": run.job_name,
                "partition": run.tags.get("dagster/partition"),
                "reason": context.failure_event.message or "run failed",
                "run_id": run.run_id,
                "run_link": alerts.run_link(run.run_id),
            }
        )
        if problem:
            context.log.warning(problem)

    kit_files = [profile.profile_path] + [
        profile.kit_file(k)
        for k in ("pair_manifest", "subset_checksums", "sidecar_archive", "sidecar_archive_sha256")
    ]

    @dg.sensor(
        name="rebuild_on_profile_change",
        jobs=[jobs["acquire"], jobs["kit_and_store"]],
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Requests a rebuild when the profile (pinned revision, archives) or a kit file changes.",
    )
    def rebuild_on_profile_change(context: dg.SensorEvaluationContext):
        h = hashlib.sha256()
        for f in kit_files:
            h.update(str(f).encode())
            h.update(f.read_bytes() if f is not None and f.is_file() else b"<missing>")
        adir = profile.kit_file("action_manifest_dir")
        for f in sorted(adir.glob("*.jsonl")) if adir.is_dir() else []:
            h.update(f.name.encode() + f.read_bytes())
        digest = h.hexdigest()
        previous = context.cursor
        context.update_cursor(digest)
        if previous is None or previous == digest:
            return dg.SkipReason(
                "profile and kit unchanged" if previous else "recorded the current profile and kit"
            )
        reqs = [
            dg.RunRequest(run_key=f"{digest[:16]}-{k}", job_name=jobs["acquire"].name, partition_key=k)
            for k in profile.archive_paths()
        ]
        reqs.append(dg.RunRequest(run_key=f"{digest[:16]}-kit", job_name=jobs["kit_and_store"].name))
        return reqs

    return [alert_on_failed_check, alert_on_failed_run, rebuild_on_profile_change]
