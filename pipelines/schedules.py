"""Schedules: a nightly verify of what is on disk and a weekly rebuild. Both off by default."""

from typing import Any

import dagster as dg

from stage2_data.profile import Profile
from stage2_data.stages import REBUILD_FIRST_STAGE, VERIFY_JOB

from .rebuild import stage_requests


def build_schedules(profile: Profile, jobs: dict[str, Any]) -> list[dg.ScheduleDefinition]:
    nightly_verify = dg.ScheduleDefinition(
        name="nightly_verify",
        job=jobs[VERIFY_JOB],
        cron_schedule="0 2 * * *",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Re-check the data on disk, nothing downloaded or rebuilt: the join's link totals "
        "and unpacked sidecars, the subset's bytes against SHA256SUMS, and the published store (every "
        "file's sha256, the fingerprint, every sample decoded).",
    )

    @dg.schedule(
        name="weekly_rebuild",
        job=jobs[REBUILD_FIRST_STAGE.job],
        cron_schedule="0 3 * * 0",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Rebuild as `stage2 build` does: check the profile, then (advance_rebuilds) one "
        "download_and_extract run per range of cache keys (re-verify the archives against their pins, "
        "downloading only what is missing or fails its pin, and extract them) with the kit's sidecars "
        "unpacked beside them, then verify the kit and build the store.",
    )
    def weekly_rebuild(context: dg.ScheduleEvaluationContext):
        stamp = (
            context.scheduled_execution_time.strftime("%Y%m%d") if context.scheduled_execution_time else "now"
        )
        return stage_requests(f"weekly-{stamp}", REBUILD_FIRST_STAGE, profile)

    return [nightly_verify, weekly_rebuild]
