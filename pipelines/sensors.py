"""Sensors: alerts on failed checks and failed runs, and a rebuild request when the profile or kit changes."""

import hashlib
from typing import Any

import dagster as dg

from resources import AlertsResource
from stage2_data.profile import Profile

UI_BASE = "http://127.0.0.1:3000"


def _run_link(run_id: str) -> str:
    return f"{UI_BASE}/runs/{run_id}"


def check_failure_alerts(context: dg.SensorEvaluationContext, alerts: AlertsResource) -> dg.SkipReason | None:
    """Every failed asset check since the cursor becomes one alert."""
    after = int(context.cursor) if context.cursor else None
    records = context.instance.get_event_records(
        dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION, after_cursor=after),
        ascending=True,
        limit=500,
    )
    sent = 0
    last = after
    for rec in records:
        last = rec.storage_id
        dagster_event = rec.event_log_entry.dagster_event
        if dagster_event is None:
            continue
        data: Any = dagster_event.event_specific_data
        if data is None or data.passed:
            continue
        run = context.instance.get_run_by_id(rec.run_id)
        partition = (run.tags.get("dagster/partition") if run else None) or getattr(data, "partition", None)
        alerts.deliver(
            {
                "kind": "asset_check_failed",
                "asset": data.asset_key.to_user_string(),
                "check": data.check_name,
                "partition": partition,
                "reason": data.description or "",
                "run_id": rec.run_id,
                "run_link": _run_link(rec.run_id),
            }
        )
        sent += 1
    if last is not None:
        context.update_cursor(str(last))
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
        monitor_all_code_locations=False,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Delivers an alert for every failed run.",
    )
    def alert_on_failed_run(context: dg.RunFailureSensorContext, alerts: AlertsResource):
        run = context.dagster_run
        alerts.deliver(
            {
                "kind": "run_failed",
                "asset": None,
                "check": None,
                "job": run.job_name,
                "partition": run.tags.get("dagster/partition"),
                "reason": context.failure_event.message or "run failed",
                "run_id": run.run_id,
                "run_link": _run_link(run.run_id),
            }
        )

    kit_files = [profile.profile_path] + [
        profile.kit_file(k)
        for k in ("pair_manifest", "subset_checksums", "sidecar_archive", "sidecar_archive_sha256")
    ]

    @dg.sensor(
        name="rebuild_on_profile_change",
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
