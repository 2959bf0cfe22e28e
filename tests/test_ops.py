"""Operations as a user touches them: schedules, alert sensors (JSONL + a real webhook on loopback), the
rebuild sensor, and `--help` of every command. (The web UI and the progress display: tests/test_ui.py.)"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from helpers.cli import stage2, subprocess_env
from helpers.env import free_port

from stage2_data import checks as C
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.profile import load_profile
from stage2_data.stages import (
    ACQUIRE_JOB,
    EXTRACT_JOB,
    JOB_ASSETS,
    KIT_AND_STORE_JOB,
    KIT_JOB,
    PROFILE_JOB,
    STORE,
    STREAM_JOB,
    VERIFY_JOB,
    stream_groups,
)
from stage2_pipelines.config import BuildConfig
from stage2_pipelines.definitions import build_definitions
from stage2_pipelines.rebuild import PART_TAG, REBUILD_TAG, STAGE_TAG
from stage2_pipelines.runs import run_selection
from stage2_resources import AlertsResource


def _defs(demo: DemoPaths, data_root: Path, webhook: str | None = None) -> dg.Definitions:
    return build_definitions(
        BuildConfig(profile_path=str(demo.profile), data_root=str(data_root), webhook_url=webhook)
    )


# ----- schedules ---------------------------------------------------------------------------------
def test_schedules_are_off_by_default_and_request_the_right_runs(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    defs = _defs(demo_cache, tmp_path / "root")
    nightly = defs.resolve_schedule_def("nightly_verify")
    weekly = defs.resolve_schedule_def("weekly_rebuild")
    for s in (nightly, weekly):
        assert s.default_status == dg.DefaultScheduleStatus.STOPPED
    when = dt.datetime(2026, 11, 29, 3, 0, tzinfo=dt.UTC)
    repo = defs.get_repository_def()
    with dg.instance_for_test() as instance:
        ctx = dg.build_schedule_context(instance=instance, scheduled_execution_time=when, repository_def=repo)
        data = nightly.evaluate_tick(ctx)
        assert nightly.job_name == VERIFY_JOB
        assert len(data.run_requests or []) == 1
        ctx = dg.build_schedule_context(instance=instance, scheduled_execution_time=when, repository_def=repo)
        data = weekly.evaluate_tick(ctx)
    reqs = data.run_requests or []
    assert weekly.job_name == PROFILE_JOB  # a rebuild starts as `stage2 build` does: with the profile
    assert len(reqs) == 1 and "20261129" in (reqs[0].run_key or "")
    assert {(r.tags[REBUILD_TAG], r.tags[STAGE_TAG]) for r in reqs} == {("weekly-20261129", "profile")}
    # the verify job re-checks data on disk: it never downloads
    verify = defs.resolve_job_def(VERIFY_JOB)
    assert "archive_file" not in {k.to_user_string() for k in verify.asset_layer.executable_asset_keys}


# ----- alerts ------------------------------------------------------------------------------------
class _Receiver:
    """A webhook receiver on loopback collecting POSTed JSON bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                outer.bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def _lines(p: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in p.read_text().splitlines()] if p.is_file() else []


def test_failed_check_and_failed_run_alert_to_file_and_webhook(
    demo: DemoPaths, tmp_path: Path, dagster_home: Path, receiver: _Receiver
) -> None:
    """A build's failed check and failed run are alerted once each, also when the sensors' first
    tick comes after the build (no daemon ran while it ran: `stage2 build`, then `make ui`), and
    when the run covered a range of partitions (its per-partition results, not the range's summary
    of them)."""
    # A deliberately broken input: one archive's pinned sha256 is wrong in the profile.
    prof = load_profile(demo.profile)
    victim = prof.archive_paths()[0]
    bad = "0" * 64
    demo.profile.write_text(demo.profile.read_text().replace(prof.archive(victim).sha256, bad))
    root = tmp_path / "root"
    defs = _defs(demo, root, receiver.url)
    alerts = AlertsResource(webhook_url=receiver.url)
    check_sensor = defs.resolve_sensor_def("alert_on_failed_check")
    run_sensor = defs.resolve_sensor_def("alert_on_failed_run")
    instance = dg.DagsterInstance.get()

    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as hub:
        cfg = BuildConfig(profile_path=str(demo.profile), data_root=str(root), endpoint=hub.url)
        victim_key = prof.archive(victim).cache_key  # archive_file: one partition per cache key
        keys = prof.cache_keys()
        i = keys.index(victim_key)
        both = keys[i : i + 2] if i + 1 < len(keys) else keys[i - 1 : i + 1]  # a range of two
        r = run_selection(cfg.to_dict(), ["archive_file"], partition_keys=both)
    assert not r["success"] and set(r["partitions"]) == set(both)

    def tick(sensor: Any, cursor: str | None) -> Any:
        return sensor.evaluate_tick(
            dg.build_sensor_context(
                definitions=defs, instance=instance, cursor=cursor, resources={"alerts": alerts}
            )
        )

    jsonl = dagster_home / "alerts" / "alerts.jsonl"
    res = tick(check_sensor, None)  # the daemon's first tick, after the build
    assert not res.run_requests
    got = _lines(jsonl)
    assert len(got) == 1, got  # only the failed check, once; the other partition's passed
    a = got[0]
    assert a["kind"] == "asset_check_failed"
    assert (a["asset"], a["check"], a["partition"]) == (
        "archive_file",
        C.ARCHIVE_SHA256_MATCHES_PIN,
        victim_key,
    )
    assert bad in a["reason"] and victim in a["reason"]
    assert a["run_id"] == r["run_id"] and a["run_link"] == f"http://127.0.0.1:3000/runs/{r['run_id']}"
    assert receiver.bodies == [a]  # the same alert reached the webhook
    # the next tick (with the cursor the sensor left) sends nothing new
    again = tick(check_sensor, res.cursor)
    assert again.skip_message and len(_lines(jsonl)) == 1 and len(receiver.bodies) == 1

    # the failed run, from the run sensor's first tick after the build
    first = tick(run_sensor, None)
    runs = [x for x in _lines(jsonl) if x["kind"] == "run_failed"]
    assert len(runs) == 1, _lines(jsonl)
    ra = runs[0]
    assert ra["run_id"] == r["run_id"] and ra["job"] == "acquire_archives"
    assert ra["run_link"].endswith(f"/runs/{r['run_id']}") and ra["reason"]
    assert receiver.bodies[-1] == ra
    tick2 = tick(run_sensor, first.cursor)
    assert tick2.skip_message and tick2.cursor is not None
    assert len(_lines(jsonl)) == 2 and len(receiver.bodies) == 2


def test_dead_webhook_keeps_the_alert_in_the_file(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    alerts = AlertsResource(jsonl_path=str(tmp_path / "a.jsonl"), webhook_url=f"http://127.0.0.1:{port}/x")
    problem = alerts.deliver({"kind": "test", "reason": "r"})
    assert problem and f"127.0.0.1:{port}" in problem
    assert f"the alert is kept in {tmp_path / 'a.jsonl'}. Fix: check that the webhook answers" in problem
    assert _lines(tmp_path / "a.jsonl")[0]["reason"] == "r"


def test_rebuild_sensor_records_skips_then_requests(demo: DemoPaths, tmp_path: Path) -> None:
    defs = _defs(demo, tmp_path / "root")
    sensor = defs.resolve_sensor_def("rebuild_on_profile_change")
    prof = load_profile(demo.profile)
    with dg.instance_for_test() as instance:
        t1 = sensor.evaluate_tick(dg.build_sensor_context(definitions=defs, instance=instance, cursor=None))
        assert not t1.run_requests and "recorded" in (t1.skip_message or "")
        t2 = sensor.evaluate_tick(
            dg.build_sensor_context(definitions=defs, instance=instance, cursor=t1.cursor)
        )
        assert not t2.run_requests and "unchanged" in (t2.skip_message or "") and t2.cursor == t1.cursor
        pm = prof.kit_file("pair_manifest")
        pm.write_bytes(pm.read_bytes() + b"\n")
        t3 = sensor.evaluate_tick(
            dg.build_sensor_context(definitions=defs, instance=instance, cursor=t2.cursor)
        )
    reqs = t3.run_requests or []
    assert t3.cursor != t2.cursor
    # the first stage of a rebuild: the profile; advance_rebuilds does the rest
    assert [r.job_name for r in reqs] == [PROFILE_JOB]
    assert {(r.tags[REBUILD_TAG], r.tags[STAGE_TAG]) for r in reqs} == {
        (f"change-{t3.cursor[:16]}", "profile")
    }


def test_a_rebuild_goes_through_every_stage_in_real_runs(
    demo: DemoPaths, tmp_path: Path, dagster_home: Path, built: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """weekly_rebuild starts a rebuild; advance_rebuilds requests each stage once the runs of the
    stages it needs succeeded: after the profile, the kit's run and one download_and_extract run
    per range of cache keys (the ranges `stage2 build` streams), all at once; after every streamed
    run and the kit, the store. The result is the store `stage2 build` makes. A failed streamed run
    (one archive failed) holds the store, whatever the other ranges did, until it is re-executed
    (same tags)."""
    monkeypatch.setenv("STAGE2_STREAM_RUN_MB", "3")  # the demo's 11 MB as three ranges
    prof = load_profile(demo.profile)
    groups = stream_groups(prof, prof.cache_keys(), 3_000_000)
    assert len(groups) >= 3
    instance = dg.DagsterInstance.get()
    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as hub:
        defs = build_definitions(
            BuildConfig(profile_path=str(demo.profile), data_root=str(tmp_path / "root"), endpoint=hub.url)
        )
        advance = defs.resolve_sensor_def("advance_rebuilds")
        assert advance.default_status == dg.DefaultSensorStatus.RUNNING

        def run(reqs: list[dg.RunRequest]) -> list[bool]:
            return [
                defs.resolve_job_def(r.job_name)
                .execute_in_process(
                    instance=instance,
                    partition_key=r.partition_key,
                    tags=r.tags,
                    asset_selection=r.asset_selection,
                    raise_on_error=False,
                )
                .success
                for r in reqs
            ]

        def tick(cursor: str | None) -> tuple[list[dg.RunRequest], str | None]:
            data = advance.evaluate_tick(
                dg.build_sensor_context(definitions=defs, instance=instance, cursor=cursor)
            )
            return list(data.run_requests or []), data.cursor

        when = dt.datetime(2026, 11, 29, 3, 0, tzinfo=dt.UTC)
        weekly = defs.resolve_schedule_def("weekly_rebuild").evaluate_tick(
            dg.build_schedule_context(
                instance=instance, scheduled_execution_time=when, repository_def=defs.get_repository_def()
            )
        )
        profile_runs = list(weekly.run_requests or [])
        assert run(profile_runs) == [True]
        after_profile, cursor = tick(None)
        # the kit needs no archive: its run goes beside the streamed ones
        assert [r.job_name for r in after_profile] == [STREAM_JOB] * len(groups) + [KIT_JOB]
        streams, kit = after_profile[:-1], after_profile[-1:]
        n = len(groups)
        assert [r.tags[PART_TAG] for r in streams] == [f"{i}/{n}" for i in range(1, n + 1)]
        assert {r.tags[STAGE_TAG] for r in streams} == {"stream"}
        # each run over one whole range of the partitions (archive_file's are cache_dir's)
        assert [
            (r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"])
            for r in streams
        ] == [(g[0], g[-1]) for g in groups]
        by_key = prof.archives_by_cache_key()
        victim = by_key[groups[0][0]][0].path
        hub.faults.missing.add(victim)  # one archive fails: its range's run fails, the rebuild waits
        assert run(streams[:1]) == [False]
        assert tick(cursor)[0] == []
        assert run(streams[1:]) == [True] * (n - 1)
        assert tick(cursor)[0] == []  # one range is missing: the store waits for it
        assert run(kit) == [True]
        assert tick(cursor)[0] == []
        hub.faults.missing.clear()
        assert run(streams[:1]) == [True]  # the failed run again (a re-execution keeps its tags)
        store, cursor = tick(cursor)
        assert [(r.job_name, r.partition_key, r.tags[STAGE_TAG], r.tags[REBUILD_TAG]) for r in store] == [
            (KIT_AND_STORE_JOB, None, "store", "weekly-20261129")
        ]
        assert tick(cursor)[0] == []  # nothing new finished: nothing requested again
        # its whole job, which is the stage's assets (the kit stage's run made the sidecars)
        assert store[0].asset_selection is None and store[0].asset_check_keys is None
        assert set(JOB_ASSETS[KIT_AND_STORE_JOB]) == set(STORE.assets)
        assert run(store) == [True]
        assert tick(cursor)[0] == []  # the last stage: the rebuild is done
        # a rebuild started by hand with an acquire_archives run goes on stage by stage
        by_hand = dg.RunRequest(
            job_name=ACQUIRE_JOB,
            tags={
                REBUILD_TAG: "by-hand",
                STAGE_TAG: "acquire",
                "dagster/asset_partition_range_start": prof.cache_keys()[0],
                "dagster/asset_partition_range_end": prof.cache_keys()[-1],
            },
        )
        assert run([by_hand]) == [True]
        nxt, cursor = tick(cursor)
        assert [(r.job_name, r.tags[STAGE_TAG], r.tags[REBUILD_TAG]) for r in nxt] == [
            (EXTRACT_JOB, "extract", "by-hand")
        ]
    done = instance.get_run_records(dg.RunsFilter(tags={REBUILD_TAG: "weekly-20261129"}))
    # profile, the streamed runs (the first failed, then again), kit, store
    assert len(done) == 1 + (n + 1) + 1 + 1
    # every cache key's archives and extraction have their own materialization from the range runs
    for key in prof.cache_keys():
        for asset in ("archive_file", "cache_dir"):
            assert instance.get_latest_data_version_record(dg.AssetKey(asset), False, key) is not None
    from stage2_data import layout
    from stage2_data.store import VinOfflineStoreReader

    reader = VinOfflineStoreReader(layout.current_store_path(tmp_path / "root", prof.name))
    assert reader.manifest["fingerprint"] == built["summary"]["fingerprint"]  # what `stage2 build` made


# ----- help --------------------------------------------------------------------------------------
def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_command_help_has_an_example() -> None:
    from stage2_data.cli import make_parser

    parser = make_parser()
    assert "Example:" in parser.format_help()
    subs = _subcommands(parser)
    assert {"build", "demo", "validate", "summary"} <= set(subs)
    missing = [name for name, p in subs.items() if "Example:" not in p.format_help()]
    assert not missing, f"commands without an 'Example:' line in --help: {missing}"
    out = stage2("build", "--help")
    assert out.returncode == 0 and "Example:" in out.stdout


def test_build_with_unreachable_hub_is_one_line_per_problem(demo_cache: DemoPaths, tmp_path: Path) -> None:
    env = subprocess_env(DAGSTER_HOME=str(tmp_path / "home"), CI="1")
    out = stage2(
        "build", "--profile", str(demo_cache.profile), "--data-root", str(tmp_path / "root"),
        "--endpoint", "http://127.0.0.1:9",
        env=env,
        timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "Traceback" not in out.stderr + out.stdout
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    assert "http://127.0.0.1:9" in lines[0] and "--endpoint" in lines[0]
