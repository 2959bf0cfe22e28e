"""The Dagster web UI over a real build of the demo: its GraphQL API, the UI itself in headless Chromium
(Debian's /usr/bin/chromium via selenium; scripts/system-deps.sh), and the progress display that build
reported."""

from __future__ import annotations

import ast
import contextlib
import html
import io
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import REPO, run, subprocess_env
from helpers.env import environ, free_port

from stage2_data import checks as C
from stage2_data.demo import DemoPaths
from stage2_data.profile import load_profile
from stage2_data.stages import ACQUIRE, PROFILE, STAGES, STORE, STREAM_JOB, STREAMED
from stage2_pipelines.config import BuildConfig, ui_command
from stage2_pipelines.progress import BuildProgress
from stage2_pipelines.runner import build_all

XPATH, TAG_NAME = "xpath", "tag name"  # selenium's By.XPATH / By.TAG_NAME
# the jobs of a launched demo build's runs, one run each: a run per stage, but the acquire and
# extract stages streamed as download_and_extract runs (the demo's cache keys fit in one)
LAUNCHED_JOBS = sorted({*(s.job for s in STAGES if s not in STREAMED), STREAM_JOB})
ARTIFACTS = REPO / "tests" / "artifacts"


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
    """A real build of the small demo recorded in its own instance (what the UI will show), its runs
    launched through the instance against the build's code server."""
    base = tmp_path_factory.mktemp("ui")
    home = base / "dagster_home"
    with environ(DAGSTER_HOME=str(home)):
        prof = load_profile(demo_cache.profile)
        live, plain = io.StringIO(), io.StringIO()
        bars = [BuildProgress(prof, live, live=True, tick=0.05), BuildProgress(prof, plain, live=False)]

        def on_run(r: dict[str, Any]) -> None:
            for b in bars:
                b.on_run(r)

        # launched (as `stage2 build` does, not in this process: the suite sets STAGE2_RUN_IN_PROCESS),
        # so the runs carry the code location's origin; the settings are the webserver's (its
        # STAGE2_* environment), so its job snapshots are the runs' and Re-execute loads the same job.
        # The runs serve the hub folder on loopback themselves.
        config = BuildConfig(
            profile_path=str(demo_cache.profile),
            data_root=str(base / "root"),
            hub_folder=str(demo_cache.upstream),
        )
        s = build_all(
            config,
            concurrency=2,
            on_run=on_run,
            run_in_process=False,
        )
        status = bars[0].status_line()
        for b in bars:
            b.close()
    assert s["ok"], s["errors"]
    return {
        "home": home,
        "root": base / "root",
        "config": config,
        "live": live.getvalue(),
        "plain": plain.getvalue(),
        "status": status,
        "summary": s,
    }


@pytest.fixture(scope="session")
def webserver(ui_instance: dict[str, Any], demo_cache: DemoPaths) -> Iterator[str]:
    port = free_port()
    env = subprocess_env(
        DAGSTER_HOME=str(ui_instance["home"]),
        STAGE2_PROFILE=str(demo_cache.profile),
        STAGE2_DATA_ROOT=str(ui_instance["root"]),
        STAGE2_HUB_FOLDER=str(demo_cache.upstream),  # the build's settings: the same job snapshots
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


def _resource_value(url: str, resource: str, key: str) -> set[str]:
    """What the UI's code location loaded as ``key`` of its resource ``resource`` (each repository's)."""
    data = _graphql(
        url,
        """{ workspaceOrError { ... on Workspace { locationEntries { locationOrLoadError {
            ... on RepositoryLocation { repositories { allTopLevelResourceDetails {
                name configuredValues { key value } } } } } } } } }""",
    )
    return {
        json.loads(v["value"]) if v["value"].startswith('"') else v["value"]
        for e in data["workspaceOrError"]["locationEntries"]
        for r in e["locationOrLoadError"]["repositories"]
        for res in r["allTopLevelResourceDetails"]
        if res["name"] == resource
        for v in res["configuredValues"]
        if v["key"] == key
    }


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


def test_webserver_lists_the_builds_runs_under_named_jobs_and_nothing_stale(
    webserver: str, ui_instance: dict[str, Any]
) -> None:
    """What the UI's Overview and asset graph read: the build's runs belong to the Definitions' named
    jobs (none to __ephemeral_asset_job__), one per stage but the streamed ones (the demo's cache
    keys: one download_and_extract run), and no asset is stale after the build."""

    data = _graphql(webserver, "{ runsOrError { ... on Runs { results { runId jobName parentRunId } } } }")
    # a re-execution from the UI (test_browser_reexecutes_a_build_run_...) adds a run with a parent:
    # the build's own runs are those without one
    runs = [r for r in data["runsOrError"]["results"] if r["parentRunId"] is None]
    assert sorted(r["jobName"] for r in runs) == LAUNCHED_JOBS
    assert {r["runId"] for r in runs} == {r["run_id"] for r in ui_instance["summary"]["runs"]}
    nodes = _graphql(webserver, "{ assetNodes { assetKey { path } staleStatus } }")["assetNodes"]
    stale = {n["assetKey"]["path"][-1]: n["staleStatus"] for n in nodes if n["staleStatus"] != "FRESH"}
    assert stale == {}


def test_webserver_graphql_lists_assets_partitions_checks(webserver: str, demo_cache: DemoPaths) -> None:
    data = _graphql(
        webserver,
        "{ assetNodes { assetKey { path } partitionKeys "
        "assetChecksOrError { ... on AssetChecks { checks { name } } } } }",
    )
    nodes = {n["assetKey"]["path"][-1]: n for n in data["assetNodes"]}
    assert set(nodes) == set(C.CHECKS_BY_ASSET)
    prof = load_profile(demo_cache.profile)
    assert sorted(nodes["archive_file"]["partitionKeys"]) == sorted(prof.cache_keys())  # per cache key
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
            "size": "TextMetadataEntry",
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
            "size_on_disk": "TextMetadataEntry",  # the same count for people (IEC: fsutil.human_bytes)
            "bytes_on_disk_per_block": "MarkdownMetadataEntry",  # a table, not a JSON blob
            "per_split": "MarkdownMetadataEntry",
            "per_source": "MarkdownMetadataEntry",
            "open": "MarkdownMetadataEntry",  # where it is published, and the 3 lines that open it
            "length_histogram": "MarkdownMetadataEntry",  # images (data:image/png;base64)
            "contact_sheets": "MarkdownMetadataEntry",
        },
    }
    for asset, labels in want.items():
        for label, typename in labels.items():
            assert entries[asset].get(label) == typename, (asset, label, entries[asset])
    # people read tables, not JSON blobs
    blobs = {(a, k) for a, e in entries.items() for k, t in e.items() if t == "JsonMetadataEntry"}
    assert blobs == set()


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


COMMUNITY_DIALOG = "Join the Dagster community"  # Dagster's first-visit ("nux") dialog


def _assert_no_first_visit_dialog(driver: Any) -> None:
    """The instance this project configures shows no first-visit dialog (dagster.yaml: nux off);
    one that covers the page is a failure, not something to click away."""
    text = driver.find_element(TAG_NAME, "body").text
    assert COMMUNITY_DIALOG not in text, f"{driver.current_url}: the first-visit dialog is shown"


def _click_when_clear(driver: Any, xpath: str, timeout: float = 30) -> None:
    """Click the element at ``xpath``; a click that something else takes (an element re-rendering
    over it) is retried until ``timeout``."""
    from selenium.common.exceptions import ElementClickInterceptedException, StaleElementReferenceException
    from selenium.webdriver.common.keys import Keys

    deadline = time.monotonic() + timeout
    while True:
        _assert_no_first_visit_dialog(driver)
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
        _assert_no_first_visit_dialog(driver)
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
    _assert_no_first_visit_dialog(browser)
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
            f"{len(prof.cache_keys())} partitions",
        ],
    )
    browser.save_screenshot(str(ARTIFACTS / "ui-catalog.png"))
    # the partitions of archive_file (one per cache key: its archives), all materialized
    n = len(prof.cache_keys())
    _page_text_with(
        browser,
        webserver + "/assets/archive_file?view=partitions",
        [f"Materialized ({n})", "Failed (0)", *prof.cache_keys()],
    )
    browser.save_screenshot(str(ARTIFACTS / "ui-archive-partitions.png"))
    # every check on its asset's checks tab
    for asset, names in C.ALL_CHECKS_BY_ASSET.items():
        _page_text_with(browser, f"{webserver}/assets/{asset}?view=checks", list(names))
    browser.save_screenshot(str(ARTIFACTS / "ui-vin-store-checks.png"))
    # the store's rich metadata: fingerprint and the Markdown tables
    # the labels are in the DOM before the values render: wait for a split name in the per_split table
    text = _page_text_with(
        browser, webserver + "/assets/vin_store", ["fingerprint", "per_split", "per_source", "train"]
    )
    assert "train" in text.split("per_split", 1)[1]


def _shown(imgs: dict[str, tuple[bool, int, int]], alt: str) -> bool:
    loaded, w, h = imgs.get(alt, (False, 0, 0))
    return loaded and w > 0 and h > 0


def _images(driver: Any) -> dict[str, tuple[bool, int, int]]:
    """Every <img> on the page by its alt text: (loaded, naturalWidth, naturalHeight)."""
    got = driver.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])"
    )
    return {alt: (bool(done), int(w), int(h)) for alt, done, w, h in got}


def test_browser_shows_the_stores_frames_and_how_to_open_it(
    webserver: str, browser: Any, ui_instance: dict[str, Any], demo_cache: DemoPaths
) -> None:
    """The vin_store materialization shows where the store is published with the lines that open it,
    sizes for people, and a contact sheet per source and the length histogram as images the UI
    really renders (loaded, non-zero size). The UI shows a long Markdown value (an image is one)
    behind its "[Show Markdown]" link, in a dialog; a screenshot of it is kept in tests/artifacts/."""
    from stage2_data.preview import known_sources
    from stage2_data.store import VinOfflineStoreReader

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    prof = load_profile(demo_cache.profile)
    current = ui_instance["root"] / "stores" / prof.name / "current"
    with VinOfflineStoreReader(current) as reader:
        sources = known_sources(reader.sample_index)
    text = _page_text_with(
        browser,
        webserver + "/assets/vin_store",
        ["contact_sheets", "length_histogram", "size_on_disk", "VinOfflineDataset", str(current)],
    )
    assert "MiB" in text or "KiB" in text  # sizes for people
    # the visible text, or the page's HTML when a long value is shown shortened (quotes escaped there)
    # the lines that open it, the path on a line of its own (assets/store.py: open_markdown_narrow)
    # (the page can show the needles above before it renders these lines: waited for, on a busy machine)
    want = ["ds = VinOfflineDataset(", f'"{current}",', 'split="train",']
    shown = html.unescape(text)
    deadline = time.monotonic() + 30
    while not all(w in shown for w in want) and time.monotonic() < deadline:
        time.sleep(0.5)
        shown = html.unescape(browser.find_element(TAG_NAME, "body").text + "\n" + browser.page_source)
    assert [w for w in want if w not in shown] == [], shown[-3000:]

    def open_dialog(label: str, alts: list[str], shot: str) -> None:
        _click_when_clear(
            browser, f"//tr[td[normalize-space()='{label}']]//a[normalize-space()='[Show Markdown]']"
        )
        deadline = time.monotonic() + 30
        imgs = _images(browser)
        while time.monotonic() < deadline and not all(_shown(imgs, a) for a in alts):
            time.sleep(0.3)
            imgs = _images(browser)
        time.sleep(0.3)
        browser.save_screenshot(str(ARTIFACTS / shot))
        assert [a for a in alts if not _shown(imgs, a)] == [], imgs
        first = browser.find_element(XPATH, f"//img[@alt='{alts[0]}']")
        assert first.is_displayed() and first.size["width"] > 0 and first.size["height"] > 0
        _click_when_clear(browser, "//div[@role='dialog']//button[normalize-space()='Close']")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alts[0] in _images(browser):
            time.sleep(0.2)
        assert alts[0] not in _images(browser), "the dialog did not close"

    open_dialog(
        "contact_sheets", [f"contact sheet of {s}" for s in sources], "ui-vin-store-contact-sheets.png"
    )
    open_dialog("length_histogram", ["frames per sample"], "ui-vin-store-length-histogram.png")
    # the screenshot shows pictures, not a blank page
    from PIL import Image

    with Image.open(ARTIFACTS / "ui-vin-store-contact-sheets.png") as shot:
        low, high = shot.convert("L").getextrema()
    assert high - low > 100


def test_webserver_every_check_ran_and_passed_and_no_first_visit_dialog(webserver: str) -> None:
    """What the asset cards count: after a build, every check of every asset (the build's own and
    the standalone ones it records, checks.RECORDED_BY_BUILD) has a passed execution for the
    latest materialization, so no card reads "1 / 2 Passed"; the instance asks for no first-visit
    dialog."""
    assert _graphql(webserver, "{ shouldShowNux }")["shouldShowNux"] is False
    nodes = _graphql(
        webserver,
        "{ assetNodes { assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name "
        "executionForLatestMaterialization { status } } } } } }",
    )["assetNodes"]
    status = {
        (n["assetKey"]["path"][-1], c["name"]): (c["executionForLatestMaterialization"] or {}).get("status")
        for n in nodes
        for c in n["assetChecksOrError"]["checks"]
    }
    assert set(status) == {(a, c) for a, names in C.ALL_CHECKS_BY_ASSET.items() for c in names}
    assert {k: v for k, v in status.items() if v != "SUCCEEDED"} == {}
    assert set(C.RECORDED_BY_BUILD) == {c for names in C.STANDALONE_CHECKS.values() for c in names}


SHOTS = REPO / "docs" / "assets" / "ui"  # the operating guide's UI tour shows these

# The text of every value in a metadata table row that does not wrap, by key: the code blocks of a
# Markdown value (prose and tables wrap), else the value's text.
_VALUE_TEXTS_JS = """
const out = {};
for (const tr of document.querySelectorAll('tr')) {
  const tds = tr.querySelectorAll('td');
  if (tds.length < 3) continue;
  const pres = [...tds[2].querySelectorAll('pre')];
  const md = tds[2].querySelector('p, table, pre');
  out[tds[0].innerText.trim()] = pres.length ? pres.map(p => p.innerText).join('\\n') : (md ? '' : tds[2].innerText);
}
return out;"""


def _shot(driver: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / name))


def _check_badges(text: str) -> list[str]:
    """The check counts the asset graph's cards show that are not all passed ("1 / 2 Passed",
    "1 Failed", "2 Not executed", ...)."""
    partial = re.findall(r"\d+\s*/\s*\d+\s*Passed", text)
    other = re.findall(r"\d+\s*(?:Failed|Not executed|Skipped|Running|Warning)", text)
    return [p for p in partial if len(set(re.findall(r"\d+", p))) > 1] + other


def test_browser_first_visit_every_check_passed_and_the_tour_screenshots(
    webserver: str, browser: Any, ui_instance: dict[str, Any], demo_cache: DemoPaths
) -> None:
    """A first visit (a fresh browser profile) after a build, as a new user sees it: no "Join the
    Dagster community" dialog on any page; on the asset graph, every card's checks passed (none
    partly passed because a check never ran); the vin_store page's metadata table keeps its key
    column in view (no value is wider than the store's fingerprint, the widest one Dagster shows
    whole). Saves the operating guide's screenshots in docs/assets/ui/."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    # the overview: the dialog, if any, opens a moment after the page renders
    _page_text_with(browser, webserver + "/overview", ["Overview"])
    time.sleep(3)
    _assert_no_first_visit_dialog(browser)
    assert not browser.find_elements(XPATH, "//div[@role='dialog']"), "a dialog covers the overview"
    _shot(browser, "overview.png")
    # the asset graph (the groups), then each group's cards: every card's checks all passed
    _page_text_with(browser, webserver + "/asset-groups", ["Global asset lineage", "acquire", "kit", "store"])
    for group in ("store", "kit", "acquire"):
        _expand_group(browser, group, lambda: ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform())
    _wait_text(browser, list(C.CHECKS_BY_ASSET))
    _assert_no_first_visit_dialog(browser)
    _shot(browser, "asset-graph.png")
    location = _graphql(webserver, "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }")[
        "workspaceOrError"
    ]["locationEntries"][0]["name"]
    groups = {"acquire": ("pinned_profile", "archive_file", "cache_dir", "extraction_report")}
    groups |= {"kit": ("action_sidecars", "subset_checksums", "trajectory_join"), "store": ("vin_store",)}
    assert {a for names in groups.values() for a in names} == set(C.CHECKS_BY_ASSET)
    for group, assets in groups.items():
        url = f"{webserver}/locations/{location}/asset-groups/{group}"
        text = _page_text_with(browser, url, [*assets, "Asset checks"])
        # unpartitioned cards show "N / N Passed"; a partitioned one its partitions' counts. Each
        # card's count loads on its own ("Loading...").
        unpartitioned = [a for a in assets if a not in ("archive_file", "cache_dir")]
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and (
            "Loading" in text or len(re.findall(r"\d+ / \d+ Passed", text)) < len(unpartitioned)
        ):
            time.sleep(0.5)
            text = browser.find_element(TAG_NAME, "body").text
        assert _check_badges(text) == [], (group, text)
        assert len(re.findall(r"(\d+) / \1 Passed", text)) >= len(unpartitioned), (group, text)
        _assert_no_first_visit_dialog(browser)
        if group == "kit":
            _shot(browser, "asset-group-kit.png")
    # the store's page: its metadata, the key column in view
    prof = load_profile(demo_cache.profile)
    current = ui_instance["root"] / "stores" / prof.name / "current"
    _page_text_with(browser, webserver + "/assets/vin_store", ["fingerprint", "per_split", str(current)])
    # a value line that never wraps (a path, a fingerprint, a line of code) sets the value column's
    # width: none holds more than the longest path or fingerprint shown (and a few characters)
    texts: dict[str, str] = browser.execute_script(_VALUE_TEXTS_JS)
    longest = {k: max((len(ln) for ln in t.splitlines()), default=0) for k, t in texts.items()}
    allowed = max(len(texts["store"].strip()), len(texts["fingerprint"].strip())) + 8
    assert {k: n for k, n in longest.items() if n > allowed} == {}, (allowed, texts)
    _assert_no_first_visit_dialog(browser)
    _shot(browser, "vin-store.png")
    # a job: the store stage's, with its runs
    _page_text_with(
        browser,
        f"{webserver}/locations/__repository__@{location}/jobs/{STORE.job}",
        [STORE.job, "Description"],
    )
    time.sleep(2)  # the job's graph draws after the text
    _assert_no_first_visit_dialog(browser)
    _shot(browser, "job.png")


def _group_members(pgid: int) -> list[str]:
    """The running (not zombie) processes of process group ``pgid``: "pid state command"."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            text = stat.read_text()
            fields = text.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(f"{stat.parent.name} {fields[0]} {text.split('(', 1)[1].split(')', 1)[0]}")
    return out


def test_the_ui_line_of_a_build_names_its_own_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``UI:`` command of a build: `make ui` alone for the demo as `make demo` builds it (its
    defaults); for any other build, the build's own settings before it (quoted for the shell),
    never its storage options (credentials: a shell comment says to set them), and outside a
    checkout this interpreter's ``-m stage2_pipelines.ui`` instead of `make ui`."""
    from stage2_data.acquire import DEFAULT_ENDPOINT

    demo = tmp_path / ".demo"
    monkeypatch.setenv("STAGE2_DEMO_ROOT", str(demo))
    for name in ("STAGE2_DATA_ROOT", "STAGE2_HUB_FOLDER"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    as_make_demo = BuildConfig(
        profile_path=str(demo / "demo" / "kit" / "profile.toml"),
        data_root=str(demo / "data"),
        hub_folder=str(demo / "demo" / "upstream"),
    )
    checkout = demo.parent / "checkout"  # where `make ui` runs: its `.demo` is the demo built
    (checkout / ".demo").mkdir(parents=True)
    (checkout / "Makefile").touch()
    (checkout / "workspace.yaml").touch()
    monkeypatch.setenv("STAGE2_DEMO_ROOT", str(checkout / ".demo"))
    in_place = BuildConfig(
        profile_path=str(checkout / ".demo" / "demo" / "kit" / "profile.toml"),
        data_root=str(checkout / ".demo" / "data"),
        hub_folder=str(checkout / ".demo" / "demo" / "upstream"),
    )
    assert ui_command(in_place, home, cwd=checkout) == f"DAGSTER_HOME={home} make ui"
    monkeypatch.setenv("STAGE2_DEMO_ROOT", str(demo))
    # built with STAGE2_DEMO_ROOT elsewhere: the line says which demo (else `make ui` served
    # the checkout's own .demo over this build's runs, and Re-execute built into it: QA)
    assert ui_command(as_make_demo, home, cwd=REPO) == f"STAGE2_DEMO_ROOT={demo} DAGSTER_HOME={home} make ui"

    own = BuildConfig(
        profile_path="/data/kit/stage2_core_v1.toml",
        data_root="/data/stage 2",
        endpoint=DEFAULT_ENDPOINT,
        kit_root="/data/kit",
        store_url="s3://bucket/stores",
        store_options={"secret": "do-not-print"},
        executor="multiprocess",
        reverify=True,
    )
    line = ui_command(own, home, cwd=tmp_path)
    command, comment = line.split("  # ")
    assert comment == "with STAGE2_STORE_OPTIONS set as for the build"
    assert "do-not-print" not in line
    assert shlex.split(command) == [
        "STAGE2_PROFILE=/data/kit/stage2_core_v1.toml",
        "STAGE2_DATA_ROOT=/data/stage 2",
        "STAGE2_KIT_ROOT=/data/kit",
        "STAGE2_STORE_URL=s3://bucket/stores",
        "STAGE2_EXECUTOR=multiprocess",
        f"DAGSTER_HOME={home}",
        sys.executable,
        "-m",
        "stage2_pipelines.ui",
    ]
    in_checkout = ui_command(
        BuildConfig(profile_path="/p.toml", data_root="/d", endpoint="http://127.0.0.1:9"), home, cwd=REPO
    )
    assert (
        in_checkout
        == f"STAGE2_PROFILE=/p.toml STAGE2_DATA_ROOT=/d STAGE2_HUB_ENDPOINT=http://127.0.0.1:9 DAGSTER_HOME={home} make ui"
    )


@pytest.mark.parametrize("port", ["taken", "abc", "70000"])
def test_make_ui_refuses_a_port_it_cannot_serve_on_at_once(port: str, tmp_path: Path) -> None:
    """`make ui` on a port another server holds (3000 is a common default of web apps' dev servers)
    or on something that is not a port: one line naming it and the fix, exit 2, within seconds,
    instead of waiting minutes for a webserver that failed to bind (or finding the other server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        given = str(held.getsockname()[1]) if port == "taken" else port
        env = subprocess_env(
            STAGE2_PROFILE=str(tmp_path / "profile.toml"),
            STAGE2_UI_PORT=given,
            DAGSTER_HOME=str(tmp_path / "home"),
        )
        r = run([sys.executable, "-m", "stage2_pipelines.ui"], env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.tail()
    said = r.stderr.strip()
    assert "Traceback" not in said and len(said.splitlines()) == 1, said
    want = (
        f"port {given} on 127.0.0.1 is not free"
        if port == "taken"
        else f"STAGE2_UI_PORT={given!r} is not a TCP port"
    )
    assert said.startswith(f"make ui: {want}") and "Fix:" in said, said
    assert not (tmp_path / "home").exists()  # refused before anything started or was written


@pytest.mark.parametrize("profile", ["missing", "invalid"])
def test_make_ui_refuses_settings_its_code_location_cannot_load(profile: str, tmp_path: Path) -> None:
    """`make ui` with STAGE2_PROFILE naming no profile, or an invalid one: one line naming it and
    the fix, exit 2, before the UI starts (it used to start and show only a code location error)."""
    path = tmp_path / "profile.toml"
    if profile == "invalid":
        path.write_text('name = "x"\n')
    env = subprocess_env(
        STAGE2_PROFILE=str(path), STAGE2_UI_PORT=str(free_port()), DAGSTER_HOME=str(tmp_path / "home")
    )
    ui = subprocess.Popen(
        [sys.executable, "-m", "stage2_pipelines.ui"], env=env, cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = ui.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # it started the UI after all: stopped as Ctrl-C stops it
        ui.send_signal(signal.SIGTERM)
        out, err = ui.communicate(timeout=60)
        pytest.fail(f"make ui started with a profile its code location cannot load:\n{out}{err}")
    assert ui.returncode == 2, out + err
    said = err.strip()
    assert "Traceback" not in said and len(said.splitlines()) == 1, said
    if profile == "missing":  # named as the variable the user set, with the fix for it
        assert said == (
            f"make ui: STAGE2_PROFILE={str(path)!r} names nothing, not a profile file (read from {tmp_path}). "
            "Fix: set STAGE2_PROFILE to a profile .toml's path, or unset it to serve the demo"
        ), said
    else:
        assert said.startswith(
            f"make ui: the code location does not load with these settings: invalid profile {path}: "
        )
    assert "Fix:" in said and "starting the Dagster UI" not in out, out
    assert not (tmp_path / "home").exists()


def _make_ui_refusal(env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    """`make ui` (``-m stage2_pipelines.ui``) with ``env``, expected to refuse at once: its exit
    code, stdout and stderr; one that starts the UI after all is stopped as Ctrl-C stops it, and
    fails the test."""
    ui = subprocess.Popen(
        [sys.executable, "-m", "stage2_pipelines.ui"], env=env, cwd=cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = ui.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        ui.send_signal(signal.SIGTERM)
        out, err = ui.communicate(timeout=60)
        pytest.fail(f"make ui started with settings its code location cannot load:\n{out}{err}")
    return ui.returncode, out, err


BAD_LOCATION_SETTINGS = {
    "options-not-json": ("STAGE2_STORE_OPTIONS", "{bad", "STAGE2_STORE_OPTIONS is not valid JSON"),
    "options-not-an-object": ("STAGE2_STORE_OPTIONS", "[1]", "STAGE2_STORE_OPTIONS holds a JSON array"),
    "executor-unknown": ("STAGE2_EXECUTOR", "foo", "STAGE2_EXECUTOR='foo' is not an executor"),
    "dask-without-address": ("STAGE2_EXECUTOR", "dask", "STAGE2_EXECUTOR=dask needs STAGE2_DASK_ADDRESS"),
    "reverify-not-a-flag": ("STAGE2_REVERIFY", "maybe", "STAGE2_REVERIFY='maybe' is not a yes or no"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOCATION_SETTINGS))
def test_make_ui_names_a_setting_its_code_location_cannot_parse(
    case: str, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """`make ui` with a ``STAGE2_*`` setting of the code location that does not parse (storage
    options that are not a JSON object, an executor that is none or lacks its scheduler, a flag
    that is not a yes or no): one line naming the variable and the fix, exit 2, before anything
    starts; not the traceback of a JSON, type or value error. Storage options are not echoed."""
    name, value, says = BAD_LOCATION_SETTINGS[case]
    env = subprocess_env(
        drop=("STAGE2_DASK_ADDRESS",),
        STAGE2_PROFILE=str(demo_cache.profile),
        STAGE2_DATA_ROOT=str(tmp_path / "data"),
        STAGE2_UI_PORT=str(free_port()),
        DAGSTER_HOME=str(tmp_path / "home"),
        **{name: value},
    )
    code, out, err = _make_ui_refusal(env, tmp_path)
    said = err.strip()
    assert code == 2, out + err
    assert "Traceback" not in out + err and len(said.splitlines()) == 1, said
    assert said.startswith(f"make ui: the code location does not load with these settings: {says}"), said
    assert "Fix: " in said and "starting the Dagster UI" not in out, out
    if name == "STAGE2_STORE_OPTIONS":
        assert value not in said, said  # storage options may hold credentials
    assert not (tmp_path / "home").exists()


def test_make_ui_names_a_bad_setting_before_it_generates_the_demo(tmp_path: Path) -> None:
    """`make ui` without ``STAGE2_PROFILE`` (the demo) checks the same settings, before it
    generates the demo: its code location would load them as well."""
    env = subprocess_env(
        drop=("STAGE2_PROFILE", "STAGE2_DATA_ROOT", "STAGE2_HUB_FOLDER"),
        STAGE2_DEMO_ROOT=str(tmp_path / "demo"),
        STAGE2_EXECUTOR="foo",
        STAGE2_UI_PORT=str(free_port()),
        DAGSTER_HOME=str(tmp_path / "home"),
    )
    code, out, err = _make_ui_refusal(env, tmp_path)
    said = err.strip()
    assert code == 2 and "Traceback" not in out + err and len(said.splitlines()) == 1, out + err
    assert "STAGE2_EXECUTOR='foo' is not an executor" in said and "Fix: " in said, said
    assert not (tmp_path / "demo").exists() and not (tmp_path / "home").exists()


def test_the_open_it_lines_run_whatever_the_paths_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The build summary's ``open it:`` line, the store's open snippet (``preview.open_snippet``) and
    the store page's (``open_markdown_narrow``) are Python that runs as pasted: a data root holding
    ``"``, ``'`` and a backslash is a correctly quoted string literal; a plain path is in double quotes, as the docs show it."""
    from stage2_assets.store import open_markdown_narrow
    from stage2_data import layout
    from stage2_data.preview import open_snippet
    from stage2_pipelines.commands import print_build_summary

    monkeypatch.chdir(tmp_path)  # a data root under the working folder: said relative to it
    for root, shown in (
        (Path("dä ta 'root\"\\x"), None),  # relative to the working folder, as the line says it
        (Path("data"), '"data/stores/p/current"'),
    ):
        current = layout.current_store_path(root, "p")
        summary = {
            "profile": "p", "data_root": str(root), "runs": [], "dagster_home": str(tmp_path / "home"),
            "checks": [], "up_to_date": True, "ok": True, "store": str(current), "fingerprint": "f" * 16,
            "ui": "make ui",
        }  # fmt: skip
        print_build_summary(summary)
        out = capsys.readouterr().out
        line = next(ln for ln in out.splitlines() if "ds = VinOfflineDataset(" in ln)
        narrow = open_markdown_narrow(str(current), str(current)).split("```python\n")[1].split("```")[0]
        assert isinstance(ast.parse(narrow).body[1], ast.Assign), narrow  # the store page's snippet
        for code in (line.strip(), open_snippet(str(current)), narrow):
            call = next(n for n in ast.parse(code).body if isinstance(n, ast.Assign))
            assert isinstance(call.value, ast.Call), code
            assert ast.literal_eval(call.value.args[0]) == str(current), code
        if shown is not None:
            assert f'ds = VinOfflineDataset({shown}, split="train")' in line, line
            assert f'VinOfflineDataset({shown}, split="train")' in open_snippet(str(current))


@pytest.mark.system
@pytest.mark.parametrize(
    "signals", [[signal.SIGINT], [signal.SIGTERM, signal.SIGINT] * 3], ids=["ctrl-c", "signal-burst"]
)
def test_make_ui_says_its_url_when_it_answers_is_quiet_and_stops_on_ctrl_c(
    ui_instance: dict[str, Any], tmp_path: Path, signals: list[int]
) -> None:
    """The UI command a build prints (its ``UI:`` line, run outside a checkout: `make ui`'s
    python -m stage2_pipelines.ui) over that build's instance: it serves the build's own settings,
    not the demo's (no demo is generated; the code location's data root is the build's); the URL
    line comes only once the webserver answers; nothing more is printed while nothing happens (no
    daemon tick lines); Ctrl-C (SIGINT to its process group, as a terminal sends it) stops the UI,
    the daemon and the code server within seconds, and it exits 0 (make reports no error). So does
    a burst of SIGTERMs and SIGINTs to its group at once (a supervisor's `kill -TERM -- -PGID` beside
    a Ctrl-C, or make's own: a later one interrupted the stop, printed a traceback and once left the
    servers running).
    (No loopback hub of its own: the runs serve the hub folder themselves, STAGE2_HUB_FOLDER.)"""
    port = free_port()
    words = shlex.split(ui_command(ui_instance["config"], ui_instance["home"], cwd=tmp_path))
    settings = dict(
        w.split("=", 1) for w in itertools.takewhile(lambda w: re.match(r"[A-Z_0-9]+=", w), words)
    )
    assert words[len(settings) :] == [sys.executable, "-m", "stage2_pipelines.ui"], words
    assert settings["DAGSTER_HOME"] == str(ui_instance["home"])
    assert settings["STAGE2_DATA_ROOT"] == str(ui_instance["root"])
    env = subprocess_env(
        drop=[k for k in os.environ if k.upper().startswith("STAGE2_")],
        **settings,
        STAGE2_DEMO_ROOT=str(tmp_path / "demo-root"),
        STAGE2_UI_PORT=str(port),
    )
    out = open(tmp_path / "ui.out", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "stage2_pipelines.ui"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=out,
        start_new_session=True,
    )
    children: list[int] = []
    try:
        assert proc.stdout is not None
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        said = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode()
            if not line:
                break
            said += line
            if line.startswith("Dagster UI:"):
                # said only once it answers: it answers now
                with urllib.request.urlopen(url + "/server_info", timeout=5) as r:
                    assert r.status == 200
                break
        # `dagster dev`, in a group of its own: known before any assertion, so that `finally` stops it
        children = [int(p.name) for p in Path("/proc").glob("[0-9]*") if _ppid(p) == proc.pid]
        assert f"Dagster UI:   {url}" in said, (said, (tmp_path / "ui.out").read_text())
        assert len(children) == 1, children
        assert not (tmp_path / "demo-root").exists(), "the UI of a build generated the demo"
        assert _resource_value(url, "data_root", "path") == {str(ui_instance["root"])}
        assert _resource_value(url, "profile", "profile_path") == {str(ui_instance["config"].profile_path)}
        assert _resource_value(url, "alerts", "ui_url") == {url}  # alerts link to this UI, on its port
        # quiet while nothing happens: no more lines for a while (the daemon ticks every few seconds)
        out.flush()
        before = (tmp_path / "ui.out").read_text()
        time.sleep(8)
        assert (tmp_path / "ui.out").read_text() == before, (tmp_path / "ui.out").read_text()
        t0 = time.monotonic()
        for sig in signals:  # at once: two signals pending when the first is handled
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - t0
        left = [m for pgid in children for m in _group_members(pgid)]
        assert rc == 0 and left == [], (rc, left, (tmp_path / "ui.out").read_text())
        assert took < 10, took
        assert "Traceback" not in (tmp_path / "ui.out").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for pgid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        out.close()


def _ppid(proc_dir: Path) -> int:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_build_progress_reports_stages_partitions_bytes(
    ui_instance: dict[str, Any], demo_cache: DemoPaths
) -> None:
    """The progress display fed by the real build's runs: plain lines off a terminal, a status line on one."""
    prof = load_profile(demo_cache.profile)
    plain = ui_instance["plain"].splitlines()
    runs = ui_instance["summary"]["runs"]
    # one plain line per partition (a stage's partitions share its one run) or unpartitioned run, no
    # bars; a streamed run's partitions once per stage it streams (their download, their extraction)
    per_stage = {STREAM_JOB: len(STREAMED)}
    lines = sum(max(1, len(r["partitions"])) * per_stage.get(r["job"], 1) for r in runs)
    assert len(plain) == lines and "\r" not in ui_instance["plain"]
    n = len(prof.cache_keys())  # archive_file: one partition per cache key
    assert sum("archive_file[" in ln and ln.endswith(f"/{n})") for ln in plain) == n
    assert any(ln.endswith(f": ok ({n}/{n})") for ln in plain)
    live = ui_instance["live"]
    label = {s.name: f"[{i}/{len(STAGES)}] {s.label}" for i, s in enumerate(STAGES, 1)}
    assert "\r" in live and label[ACQUIRE.name] in live and f"/{n} partitions" in live
    assert "MiB/s" in live or "KiB/s" in live  # the rate (IEC units: fsutil.human_bytes)
    assert "ETA" in live
    assert ui_instance["status"].startswith(label[STORE.name])


# The code location the build's runs carry (stage2_pipelines.launch.LOCATION_NAME), as
# workspace.yaml names it for the webserver; its Definitions' repository is "__repository__".
LOCATION = "stage2_pipelines.definitions:defs"
REPOSITORY = "__repository__"


def _build_runs_by_job(ui_instance: dict[str, Any]) -> dict[str, str]:
    """The build's run id of each stage's job."""
    runs = {r["job"]: r["run_id"] for r in ui_instance["summary"]["runs"]}
    assert sorted(runs) == LAUNCHED_JOBS, runs
    return runs


def test_browser_job_pages_and_the_timeline_show_the_builds_launched_runs(
    webserver: str, browser: Any, ui_instance: dict[str, Any]
) -> None:
    """The build launches its runs through the instance, so they carry the code location's origin:
    each job's own page (its Runs tab, where the UI's job links lead) lists the build's run of that
    job, and the Overview timeline shows them under the location. Saves docs/assets/ui/job-runs.png."""
    by_job = _build_runs_by_job(ui_instance)
    origins = _graphql(
        webserver,
        "{ runsOrError { ... on Runs { results { runId repositoryOrigin "
        "{ repositoryName repositoryLocationName } } } } }",
    )["runsOrError"]["results"]
    origin = {r["runId"]: r["repositoryOrigin"] for r in origins}
    want = {"repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}
    assert {j: origin.get(rid) for j, rid in by_job.items()} == dict.fromkeys(by_job, want)
    for job, run_id in by_job.items():
        # the UI links a job of a Definitions' repository by its location alone (/locations/<location>/jobs/<job>)
        text = _page_text_with(
            browser, f"{webserver}/locations/{LOCATION}/jobs/{job}/runs", [job, "Runs", run_id[:8]]
        )
        assert "No runs" not in text, (job, text[:2000])
        _assert_no_first_visit_dialog(browser)
        if job == STORE.job:
            _shot(browser, "job-runs.png")
    text = _page_text_with(browser, webserver + "/overview/activity/timeline", [LOCATION, *by_job])
    assert "No runs or scheduled ticks in this time period" not in text, text[:3000]
    _assert_no_first_visit_dialog(browser)


# What the Re-execute button's tooltip says (with a warning or error icon on the button) when the
# loaded job's origin or snapshot is not the original run's (Dagster UI 1.13, LaunchButton).
REEXECUTE_WARNINGS = (
    "may be a different version",
    "may be different than the one used for the original run",
    "from a different code location",
    "The original run loaded",
    "could not be found",
)


def test_browser_reexecutes_a_build_run_without_a_version_warning(
    webserver: str, browser: Any, ui_instance: dict[str, Any]
) -> None:
    """A build's run re-executes from its page as it is: the webserver loads the same job (same
    origin, same snapshot) as the build's run, so the Re-execute button shows no warning, and the
    re-execution succeeds. Last in this file: it adds a run (and a materialization of pinned_profile)
    to the instance the tests above read."""
    from selenium.webdriver.common.action_chains import ActionChains

    run_id = _build_runs_by_job(ui_instance)[PROFILE.job]  # the profile stage's: a quick run
    button = "//button[starts-with(normalize-space(), 'Re-execute all')]"
    text = _page_text_with(browser, f"{webserver}/runs/{run_id}", [run_id[:8], PROFILE.job, "Re-execute all"])
    assert "Success" in text, text[:2000]
    # the split button (Re-execute all, and its menu's arrow): no warning or error icon on it (with
    # one, the UI wraps the button in its tooltip's <span>: the nearest <div> holds both halves)
    group = browser.find_element(XPATH, button + "/ancestor::div[1]")
    icons = [e.get_attribute("aria-label") for e in group.find_elements(XPATH, ".//*[@role='img']")]
    assert not {"warning", "error"} & set(icons), icons
    # hovering shows the button's tooltip, if it has one: none says the job may differ
    ActionChains(browser).move_to_element(browser.find_element(XPATH, button)).perform()
    time.sleep(1.5)
    shown = browser.find_element(TAG_NAME, "body").text + browser.page_source
    assert [w for w in REEXECUTE_WARNINGS if w in shown] == []
    before = {
        r["runId"]
        for r in _graphql(webserver, "{ runsOrError { ... on Runs { results { runId } } } }")["runsOrError"][
            "results"
        ]
    }
    _click_when_clear(browser, button)
    deadline = time.monotonic() + 120
    new: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = _graphql(
            webserver, "{ runsOrError { ... on Runs { results { runId jobName status parentRunId } } } }"
        )["runsOrError"]["results"]
        new = [r for r in runs if r["runId"] not in before]
        if new and new[0]["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(1)
    assert len(new) == 1, new
    assert new[0] == {
        "runId": new[0]["runId"],
        "jobName": PROFILE.job,
        "status": "SUCCESS",
        "parentRunId": run_id,
    }, (new, (ui_instance["home"].parent / "webserver.log").read_text(errors="replace")[-3000:])
    # the UI opened the new run's page
    _wait_text(browser, [new[0]["runId"][:8]])


def test_make_ui_refuses_an_instance_another_make_ui_serves(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """A second `make ui` over the same instance (on another port, as the busy port's fix used to
    suggest) started a second Dagster daemon that fought the first for its schedules and sensors:
    refused, naming the URL of the UI that serves it and the ways out. Another instance is served."""
    from stage2_pipelines.ui import hold_instance

    home = tmp_path / "home"
    held, busy = hold_instance(home, "http://127.0.0.1:3000")  # what the first `make ui` holds
    assert held is not None and busy is None
    env = subprocess_env(
        STAGE2_PROFILE=str(demo_cache.profile),
        STAGE2_DATA_ROOT=str(tmp_path / "data"),
        STAGE2_UI_PORT=str(free_port()),
        DAGSTER_HOME=str(home),
    )
    code, out, err = _make_ui_refusal(env, tmp_path)
    said = err.strip()
    assert code == 2 and "Traceback" not in said and len(said.splitlines()) == 1, out + err
    assert said.startswith(f"make ui: the Dagster instance {home} is already served by `make ui` at "
                           f"http://127.0.0.1:3000 (pid {os.getpid()}). Fix: open that URL"), said  # fmt: skip
    assert "DAGSTER_HOME=<another folder> make ui" in said and "starting the Dagster UI" not in out
    # the first UI's own port (a second `make ui` as the README starts it): the port's fix (another
    # port) would be refused in turn, so what is said is that the instance is served there
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code, out, err = _make_ui_refusal({**env, "STAGE2_UI_PORT": str(taken.getsockname()[1])}, tmp_path)
    assert code == 2 and err.strip().startswith(f"make ui: the Dagster instance {home} is already served"), (
        err
    )
    held.close()  # the first one stopped: this instance is free again
    again, busy = hold_instance(home, "http://127.0.0.1:3001")
    assert again is not None and busy is None


def test_make_ui_refuses_a_profile_without_its_data_root(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """STAGE2_PROFILE set and STAGE2_DATA_ROOT not: the UI's runs of that profile would download into
    the demo's data root. Refused, naming both variables and the fix."""
    env = subprocess_env(
        drop=("STAGE2_DATA_ROOT",),
        STAGE2_PROFILE=str(demo_cache.profile),
        STAGE2_UI_PORT=str(free_port()),
        DAGSTER_HOME=str(tmp_path / "home"),
    )
    code, out, err = _make_ui_refusal(env, tmp_path)
    said = err.strip()
    assert code == 2 and "Traceback" not in said and len(said.splitlines()) == 1, out + err
    assert said.startswith(f"make ui: STAGE2_PROFILE={demo_cache.profile} is set without STAGE2_DATA_ROOT"), (
        said
    )
    assert "Fix: set STAGE2_DATA_ROOT" in said, said


def test_make_ui_on_a_busy_port_suggests_a_free_one(tmp_path: Path) -> None:
    """The busy port's fix named a port to try; it was always 3001, busy or not."""
    from stage2_pipelines.ui import port_problem

    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        a.listen()
        port = a.getsockname()[1]
        if port + 1 >= 65536:
            pytest.skip("the port after the busy one does not exist")
        try:
            b.bind(("127.0.0.1", port + 1))
            b.listen()
        except OSError:
            pass  # held by someone else: busy either way
        said = port_problem(str(port))
    assert said is not None and said.startswith(f"port {port} on 127.0.0.1 is not free"), said
    suggested = int(said.split("STAGE2_UI_PORT=")[1].split()[0])
    assert suggested > port + 1, said


def test_make_ui_over_a_data_root_with_nothing_built_says_how_to_build(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """`make ui` before `make demo` served an empty UI: no runs, and no word of how to get some. It
    says which command builds (the demo's, or the profile's) until a store is published there."""
    from stage2_data import layout
    from stage2_data.profile import load_profile
    from stage2_pipelines.config import write_instance_yaml
    from stage2_pipelines.ui import nothing_built_hint

    empty, home = tmp_path / "data", tmp_path / "home"
    write_instance_yaml(home)  # an instance without runs (`make ui` writes it before it asks)
    said = nothing_built_hint(demo_cache.profile, empty, home=home, build=None)
    assert said == (
        f"nothing is published in {empty} yet, so the UI shows no runs: `make demo` builds it (its runs "
        "then show on their jobs' pages), or use Materialize all on the asset graph"
    )
    own = BuildConfig(profile_path=str(demo_cache.profile), data_root=str(empty))
    said = nothing_built_hint(demo_cache.profile, empty, home=home, build=own)
    assert said is not None and (
        f"`DAGSTER_HOME={home} stage2 build {demo_cache.profile} --data-root {empty}` builds it" in said
    ), said
    link = layout.current_store_path(empty, load_profile(demo_cache.profile).name)
    link.parent.mkdir(parents=True)
    link.symlink_to("v2-0000000000000000")  # a store published: nothing more to say
    assert nothing_built_hint(demo_cache.profile, empty, home=home, build=None) is None
