"""Schedules: a nightly verify of what is on disk and a weekly rebuild. Both off by default."""

from typing import Any

import dagster as dg

from stage2_data.profile import Profile


def build_schedules(profile: Profile, jobs: dict[str, Any]) -> list[dg.ScheduleDefinition]:
    nightly_verify = dg.ScheduleDefinition(
        name="nightly_verify",
        job=jobs["verify"],
        cron_schedule="0 2 * * *",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Re-check the data on disk (extraction counts, join and link totals, subset bytes); no download.",
    )

    @dg.schedule(
        name="weekly_rebuild",
        job=jobs["acquire"],
        cron_schedule="0 3 * * 0",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Re-verify every archive partition against its pin (downloads only what is missing or "
        "fails its pin), one run per partition; then materialize extract_cache_dirs and "
        "verify_kit_and_build_store (or run `stage2 build`) to rebuild what changed.",
    )
    def weekly_rebuild(context: dg.ScheduleEvaluationContext):
        stamp = (
            context.scheduled_execution_time.strftime("%Y%m%d") if context.scheduled_execution_time else "now"
        )
        return [
            dg.RunRequest(run_key=f"weekly-{stamp}-{k}", partition_key=k) for k in profile.archive_paths()
        ]

    return [nightly_verify, weekly_rebuild]
