"""Operations as a user touches them: schedules, alert sensors (JSONL + a real webhook on loopback), the
rebuild sensor, the web UI in headless Chromium, and `--help` of every command."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from stage2_data import checks as C
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.profile import load_profile
from stage2_data.progress import BuildProgress
from stage2_data.stages import ACQUIRE_JOB, EXTRACT_JOB, KIT_AND_STORE_JOB, VERIFY_JOB
from stage2_pipelines.config import BuildConfig
from stage2_pipelines.definitions import build_definitions
from stage2_pipelines.rebuild import REBUILD_TAG, STAGE_TAG
from stage2_pipelines.runner import build_all, run_selection
from stage2_resources import AlertsResource

REPO = Path(__file__).resolve().parent.parent
XPATH, TAG_NAME = "xpath", "tag name"  # selenium's By.XPATH / By.TAG_NAME
ARTIFACTS = REPO / "tests" / "artifacts"


def _defs(demo: DemoPaths, data_root: Path, webhook: str | None = None) -> dg.Definitions:
    return build_definitions(
        BuildConfig(profile_path=str(demo.profile), data_root=str(data_root), webhook_url=webhook)
    )


# ----- schedules ---------------------------------------------------------------------------------
def test_schedules_are_off_by_default_and_request_the_right_runs(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    defs = _defs(demo_cache, tmp_path / "root")
    prof = load_profile(demo_cache.profile)
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
    assert weekly.job_name == ACQUIRE_JOB
    assert sorted(r.partition_key for r in reqs) == sorted(prof.archive_paths())
    assert len({r.run_key for r in reqs}) == len(reqs) and all("20261129" in r.run_key for r in reqs)
    assert {(r.tags[REBUILD_TAG], r.tags[STAGE_TAG]) for r in reqs} == {("weekly-20261129", "acquire")}
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
    # the run-failure sensor starts from "now" on its first tick, like the daemon does
    first = run_sensor.evaluate_tick(
        dg.build_sensor_context(
            definitions=defs, instance=instance, cursor=None, resources={"alerts": alerts}
        )
    )
    assert receiver.bodies == []

    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as hub:
        cfg = BuildConfig(profile_path=str(demo.profile), data_root=str(root), endpoint=hub.url)
        r = run_selection(cfg.to_dict(), ["archive_file"], victim)
        ok = run_selection(cfg.to_dict(), ["archive_file"], prof.archive_paths()[1])
    assert not r["success"] and ok["success"]

    jsonl = dagster_home / "alerts" / "alerts.jsonl"
    res = check_sensor.evaluate_tick(
        dg.build_sensor_context(
            definitions=defs, instance=instance, cursor=None, resources={"alerts": alerts}
        )
    )
    assert not res.run_requests
    got = _lines(jsonl)
    assert len(got) == 1, got  # only the failed check; the passing one of the other partition is silent
    a = got[0]
    assert a["kind"] == "asset_check_failed"
    assert (a["asset"], a["check"], a["partition"]) == ("archive_file", C.ARCHIVE_SHA256_MATCHES_PIN, victim)
    assert bad in a["reason"] and victim in a["reason"]
    assert a["run_id"] == r["run_id"] and a["run_link"] == f"http://127.0.0.1:3000/runs/{r['run_id']}"
    assert receiver.bodies == [a]  # the same alert reached the webhook
    # the next tick (with the cursor the sensor left) sends nothing new
    again = check_sensor.evaluate_tick(
        dg.build_sensor_context(
            definitions=defs, instance=instance, cursor=res.cursor, resources={"alerts": alerts}
        )
    )
    assert again.skip_message and len(_lines(jsonl)) == 1 and len(receiver.bodies) == 1

    # the failed run: the same path as the daemon (a tick over the instance's run-failure events)
    tick = run_sensor.evaluate_tick(
        dg.build_sensor_context(
            definitions=defs, instance=instance, cursor=first.cursor, resources={"alerts": alerts}
        )
    )
    runs = [x for x in _lines(jsonl) if x["kind"] == "run_failed"]
    assert len(runs) == 1, _lines(jsonl)
    ra = runs[0]
    assert ra["run_id"] == r["run_id"] and ra["partition"] == victim
    assert ra["run_link"].endswith(f"/runs/{r['run_id']}") and ra["reason"]
    assert receiver.bodies[-1] == ra
    tick2 = run_sensor.evaluate_tick(
        dg.build_sensor_context(
            definitions=defs, instance=instance, cursor=tick.cursor, resources={"alerts": alerts}
        )
    )
    assert tick2.cursor is not None
    assert len(_lines(jsonl)) == 2 and len(receiver.bodies) == 2


def test_dead_webhook_keeps_the_alert_in_the_file(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there
    alerts = AlertsResource(jsonl_path=str(tmp_path / "a.jsonl"), webhook_url=f"http://127.0.0.1:{port}/x")
    problem = alerts.deliver({"kind": "test", "reason": "r"})
    assert problem and f"127.0.0.1:{port}" in problem
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
    # the first stage of a rebuild: every archive partition; advance_rebuilds does the rest
    assert {r.job_name for r in reqs} == {ACQUIRE_JOB}
    assert sorted(r.partition_key for r in reqs) == sorted(prof.archive_paths())
    assert {(r.tags[REBUILD_TAG], r.tags[STAGE_TAG]) for r in reqs} == {
        (f"change-{t3.cursor[:16]}", "acquire")
    }


def test_a_rebuild_goes_through_every_stage_in_real_runs(
    demo: DemoPaths, tmp_path: Path, dagster_home: Path, built: dict
) -> None:
    """weekly_rebuild starts a rebuild; advance_rebuilds requests extraction once every archive
    partition succeeded, then the store once every cache key did: the result is the store
    `stage2 build` makes. A failed partition holds its rebuild at that stage until it is re-run."""
    prof = load_profile(demo.profile)
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
                    instance=instance, partition_key=r.partition_key, tags=r.tags, raise_on_error=False
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
        acquire = list(weekly.run_requests or [])
        victim = acquire[0]
        hub.faults.missing.add(victim.partition_key)  # one archive fails: the rebuild waits
        assert run(acquire) == [False] + [True] * (len(acquire) - 1)
        reqs, cursor = tick(None)
        assert reqs == []
        hub.faults.missing.clear()
        assert run([victim]) == [True]  # re-run of the failed partition, same tags
        extract, cursor = tick(cursor)
        assert {r.job_name for r in extract} == {EXTRACT_JOB}
        assert sorted(r.partition_key for r in extract) == sorted(prof.cache_keys())
        assert all(
            r.tags[STAGE_TAG] == "extract" and r.tags[REBUILD_TAG] == "weekly-20261129" for r in extract
        )
        assert tick(cursor)[0] == []  # nothing new finished: nothing requested again
        assert all(run(extract))
        store, cursor = tick(cursor)
        assert [(r.job_name, r.partition_key, r.tags[STAGE_TAG]) for r in store] == [
            (KIT_AND_STORE_JOB, None, "store")
        ]
        assert run(store) == [True]
        assert tick(cursor)[0] == []  # the last stage: the rebuild is done
    done = instance.get_run_records(dg.RunsFilter(tags={REBUILD_TAG: "weekly-20261129"}))
    assert len(done) == len(acquire) + 1 + len(extract) + 1
    from stage2_data import layout
    from stage2_data.store import VinOfflineStoreReader

    reader = VinOfflineStoreReader(layout.current_store_path(tmp_path / "root", prof.name))
    assert reader.manifest["fingerprint"] == built["summary"]["fingerprint"]  # what `stage2 build` made


# ----- the web UI in a real browser --------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout}s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server started with start_new_session=True: its own process group, by its PID."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def ui_instance(demo_cache: DemoPaths, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real build of the small demo recorded in its own instance (what the UI will show)."""
    base = tmp_path_factory.mktemp("ui")
    home = base / "dagster_home"
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        prof = load_profile(demo_cache.profile)
        live, plain = io.StringIO(), io.StringIO()
        bars = [BuildProgress(prof, live, live=True, tick=0.05), BuildProgress(prof, plain, live=False)]

        def on_run(r: dict[str, Any]) -> None:
            for b in bars:
                b.on_run(r)

        with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
            s = build_all(
                BuildConfig(
                    profile_path=str(demo_cache.profile), data_root=str(base / "root"), endpoint=hub.url
                ),
                concurrency=2,
                on_run=on_run,
            )
        status = bars[0].status_line()
        for b in bars:
            b.close()
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old
    assert s["ok"], s["errors"]
    return {
        "home": home,
        "root": base / "root",
        "live": live.getvalue(),
        "plain": plain.getvalue(),
        "status": status,
        "summary": s,
    }


@pytest.fixture(scope="session")
def webserver(ui_instance: dict[str, Any], demo_cache: DemoPaths) -> Iterator[str]:
    port = _free_port()
    env = dict(
        os.environ,
        DAGSTER_HOME=str(ui_instance["home"]),
        STAGE2_PROFILE=str(demo_cache.profile),
        STAGE2_DATA_ROOT=str(ui_instance["root"]),
        STAGE2_HUB_ENDPOINT="http://127.0.0.1:9",
    )
    log = open(ui_instance["home"].parent / "webserver.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "dagster-webserver"),
            "-w",
            str(REPO / "workspace.yaml"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(url + "/server_info", 90, proc)
        yield url
    finally:
        _stop(proc)
        log.close()


def _graphql(url: str, query: str) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        out: dict[str, Any] = json.loads(r.read())
    assert "errors" not in out, out
    return out["data"]


def test_webserver_graphql_lists_assets_partitions_checks(webserver: str, demo_cache: DemoPaths) -> None:
    data = _graphql(
        webserver,
        "{ assetNodes { assetKey { path } partitionKeys "
        "assetChecksOrError { ... on AssetChecks { checks { name } } } } }",
    )
    nodes = {n["assetKey"]["path"][-1]: n for n in data["assetNodes"]}
    assert set(nodes) == set(C.CHECKS_BY_ASSET)
    prof = load_profile(demo_cache.profile)
    assert sorted(nodes["archive_file"]["partitionKeys"]) == sorted(prof.archive_paths())
    assert sorted(nodes["cache_dir"]["partitionKeys"]) == sorted(prof.cache_keys())
    for asset, names in C.ALL_CHECKS_BY_ASSET.items():
        assert {c["name"] for c in nodes[asset]["assetChecksOrError"]["checks"]} == set(names)
    # rich metadata on the latest materializations: counts, bytes, rates, fingerprints, Markdown tables
    md = _graphql(
        webserver,
        "{ assetNodes { assetKey { path } assetMaterializations(limit: 1) "
        "{ metadataEntries { label __typename } } } }",
    )
    entries = {
        n["assetKey"]["path"][-1]: {
            e["label"]: e["__typename"] for e in n["assetMaterializations"][0]["metadataEntries"]
        }
        for n in md["assetNodes"]
        if n["assetMaterializations"]
    }
    want = {
        "pinned_profile": {"archives": "IntMetadataEntry", "archives_pinned": "MarkdownMetadataEntry"},
        "archive_file": {
            "bytes": "IntMetadataEntry",
            "MB/s": "FloatMetadataEntry",
            "sha256": "TextMetadataEntry",
        },
        "cache_dir": {"bytes": "IntMetadataEntry", "frame_files": "IntMetadataEntry"},
        "extraction_report": {"trajectories": "IntMetadataEntry", "per_cache_key": "MarkdownMetadataEntry"},
        "action_sidecars": {"by_source": "MarkdownMetadataEntry", "tar_sha256": "TextMetadataEntry"},
        "trajectory_join": {"pair_rows": "IntMetadataEntry"},
        "subset_checksums": {"bytes": "IntMetadataEntry"},
        "vin_store": {
            "fingerprint": "TextMetadataEntry",
            "bytes_on_disk": "IntMetadataEntry",
            "per_split": "MarkdownMetadataEntry",
            "per_source": "MarkdownMetadataEntry",
        },
    }
    for asset, labels in want.items():
        for label, typename in labels.items():
            assert entries[asset].get(label) == typename, (asset, label, entries[asset])


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(
            "selenium missing: it is a dev dependency, run `pip install -e '.[dev]'` (or `make install`)"
        )

    for exe in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
        if not os.access(exe, os.X_OK):
            pytest.fail(f"{exe} missing: run `make system-deps` (scripts/system-deps.sh) as root")
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1600,1000",
    ):
        opts.add_argument(a)
    profile_dir = tempfile.mkdtemp(prefix="stage2-chromium-")
    opts.add_argument(f"--user-data-dir={profile_dir}")
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile_dir, ignore_errors=True)


def _dismiss_popup(driver: Any) -> None:
    """The UI's first-visit newsletter popup covers the page: skip it."""
    for b in driver.find_elements(XPATH, "//button[normalize-space()='Skip']"):
        with contextlib.suppress(Exception):  # the popup went away by itself
            b.click()


def _click_when_clear(driver: Any, xpath: str, timeout: float = 30) -> None:
    """Click the element at ``xpath``; a popup that opens late (its backdrop takes the click) is
    dismissed and the click retried until ``timeout``."""
    from selenium.common.exceptions import ElementClickInterceptedException, StaleElementReferenceException
    from selenium.webdriver.common.keys import Keys

    deadline = time.monotonic() + timeout
    while True:
        _dismiss_popup(driver)
        try:
            driver.find_element(XPATH, xpath).click()
            return
        except (ElementClickInterceptedException, StaleElementReferenceException):
            if time.monotonic() > deadline:
                raise
            with contextlib.suppress(Exception):
                driver.find_element(TAG_NAME, "body").send_keys(Keys.ESCAPE)
            time.sleep(0.5)


def _page_text_with(driver: Any, url: str, needles: list[str], timeout: float = 45) -> str:
    """Open ``url`` and wait until every needle is on the page; returns the text."""
    driver.get(url)
    return _wait_text(driver, needles, timeout)


def _wait_text(driver: Any, needles: list[str], timeout: float = 45) -> str:
    url = driver.current_url
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        _dismiss_popup(driver)
        text = driver.find_element(TAG_NAME, "body").text
        if all(n in text for n in needles):
            return text
        # long names are middle-truncated on screen ("sidecars_by_s…atch_expected"); the full name is
        # in the rendered DOM (MiddleTruncate keeps it for measuring / as the title)
        source = driver.page_source
        if all(n in text or n in source for n in needles):
            return text + "\n" + source
        time.sleep(0.3)
    missing = [n for n in needles if n not in text]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "ui-timeout.png"))
    raise AssertionError(f"{url}: {missing} never appeared; page text:\n{text[:3000]}")


def _expand_group(driver: Any, group: str, arrow_right: Any, tries: int = 5) -> None:
    """Open ``group`` in the asset graph's tree (select it, arrow-right), as a user does; the UI
    records open groups in the URL (``open-nodes``). The tree re-renders as groups open, so a
    click can land on a node being replaced: try again until the URL shows the group open."""
    opened = f"%3A{group}"
    for _ in range(tries):
        if opened in driver.current_url:
            return
        _click_when_clear(driver, f"//span[normalize-space()='{group}']/ancestor::button[1]")
        arrow_right()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and opened not in driver.current_url:
            time.sleep(0.2)
    assert opened in driver.current_url, f"group {group} did not open: {driver.current_url}"


def test_browser_shows_assets_partitions_and_checks(
    webserver: str, browser: Any, demo_cache: DemoPaths
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    prof = load_profile(demo_cache.profile)
    (ARTIFACTS / "ui-timeout.png").unlink(missing_ok=True)
    # the asset graph: its three groups, expanded in the graph's tree (select, arrow-right) to every asset
    _page_text_with(browser, webserver + "/asset-groups", ["Global asset lineage", "acquire", "kit", "store"])
    _dismiss_popup(browser)
    for group in ("store", "kit", "acquire"):
        _expand_group(browser, group, lambda: ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform())
    _wait_text(browser, list(C.CHECKS_BY_ASSET))
    browser.save_screenshot(str(ARTIFACTS / "ui-asset-graph.png"))
    # the catalog: every asset and the partition counts
    _page_text_with(
        browser,
        webserver + "/assets",
        [
            *C.CHECKS_BY_ASSET,
            f"{len(prof.archive_paths())} partitions",
            f"{len(prof.cache_keys())} partitions",
        ],
    )
    browser.save_screenshot(str(ARTIFACTS / "ui-catalog.png"))
    # the partitions of archive_file, all materialized
    n = len(prof.archive_paths())
    _page_text_with(
        browser,
        webserver + "/assets/archive_file?view=partitions",
        [f"Materialized ({n})", "Failed (0)", *prof.archive_paths()],
    )
    browser.save_screenshot(str(ARTIFACTS / "ui-archive-partitions.png"))
    # every check on its asset's checks tab
    for asset, names in C.ALL_CHECKS_BY_ASSET.items():
        _page_text_with(browser, f"{webserver}/assets/{asset}?view=checks", list(names))
    browser.save_screenshot(str(ARTIFACTS / "ui-vin-store-checks.png"))
    # the store's rich metadata: fingerprint and the Markdown tables
    text = _page_text_with(
        browser, webserver + "/assets/vin_store", ["fingerprint", "per_split", "per_source"]
    )
    assert "train" in text


def test_build_progress_reports_stages_partitions_bytes(
    ui_instance: dict[str, Any], demo_cache: DemoPaths
) -> None:
    """The progress display fed by the real build's runs: plain lines off a terminal, a status line on one."""
    prof = load_profile(demo_cache.profile)
    plain = ui_instance["plain"].splitlines()
    runs = ui_instance["summary"]["runs"]
    assert len(plain) == len(runs) and "\r" not in ui_instance["plain"]  # one plain line per run, no bars
    n = len(prof.archive_paths())
    assert sum("archive_file[" in ln and ln.endswith(f"/{n})") for ln in plain) == n
    assert any(ln.endswith(f": ok ({n}/{n})") for ln in plain)
    live = ui_instance["live"]
    assert "\r" in live and "[2/4] download+verify archives" in live and f"/{n} partitions" in live
    assert "MiB/s" in live or "KiB/s" in live  # the rate (IEC units: fsutil.human_bytes)
    assert "ETA" in live
    assert ui_instance["status"].startswith("[4/4] kit, join, bytes, store")


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
    out = subprocess.run(
        [sys.executable, "-m", "stage2_data.cli", "build", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0 and "Example:" in out.stdout


def test_build_with_unreachable_hub_is_one_line_per_problem(demo_cache: DemoPaths, tmp_path: Path) -> None:
    env = dict(os.environ, DAGSTER_HOME=str(tmp_path / "home"), CI="1")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "stage2_data.cli",
            "build",
            "--profile",
            str(demo_cache.profile),
            "--data-root",
            str(tmp_path / "root"),
            "--endpoint",
            "http://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr + out.stdout
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    assert "http://127.0.0.1:9" in lines[0] and "--endpoint" in lines[0]
