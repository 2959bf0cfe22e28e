"""The Dagster web UI over a real build of the demo: its GraphQL API, the UI itself in headless Chromium
(Debian's /usr/bin/chromium via selenium; scripts/system-deps.sh), and the progress display that build
reported."""

from __future__ import annotations

import contextlib
import html
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import REPO, subprocess_env
from helpers.env import environ, free_port

from stage2_data import checks as C
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.profile import load_profile
from stage2_data.stages import ACQUIRE, STAGES, STORE
from stage2_pipelines.config import BuildConfig
from stage2_pipelines.progress import BuildProgress
from stage2_pipelines.runner import build_all

XPATH, TAG_NAME = "xpath", "tag name"  # selenium's By.XPATH / By.TAG_NAME
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
    """A real build of the small demo recorded in its own instance (what the UI will show)."""
    base = tmp_path_factory.mktemp("ui")
    home = base / "dagster_home"
    with environ(DAGSTER_HOME=str(home)):
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
    port = free_port()
    env = subprocess_env(
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


def test_webserver_lists_the_builds_runs_under_named_jobs_and_nothing_stale(
    webserver: str, ui_instance: dict[str, Any]
) -> None:
    """What the UI's Overview and asset graph read: the build's runs belong to the Definitions' named
    jobs (none to __ephemeral_asset_job__), one per stage, and no asset is stale after the build."""

    data = _graphql(webserver, "{ runsOrError { ... on Runs { results { runId jobName } } } }")
    runs = data["runsOrError"]["results"]
    assert sorted(r["jobName"] for r in runs) == sorted(s.job for s in STAGES)
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
    assert f'VinOfflineDataset("{current}", split="train")' in html.unescape(text)

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


def test_build_progress_reports_stages_partitions_bytes(
    ui_instance: dict[str, Any], demo_cache: DemoPaths
) -> None:
    """The progress display fed by the real build's runs: plain lines off a terminal, a status line on one."""
    prof = load_profile(demo_cache.profile)
    plain = ui_instance["plain"].splitlines()
    runs = ui_instance["summary"]["runs"]
    # one plain line per partition (a stage's partitions share its one run) or unpartitioned run, no bars
    assert len(plain) == sum(max(1, len(r["partitions"])) for r in runs) and "\r" not in ui_instance["plain"]
    n = len(prof.archive_paths())
    assert sum("archive_file[" in ln and ln.endswith(f"/{n})") for ln in plain) == n
    assert any(ln.endswith(f": ok ({n}/{n})") for ln in plain)
    live = ui_instance["live"]
    label = {s.name: f"[{i}/{len(STAGES)}] {s.label}" for i, s in enumerate(STAGES, 1)}
    assert "\r" in live and label[ACQUIRE.name] in live and f"/{n} partitions" in live
    assert "MiB/s" in live or "KiB/s" in live  # the rate (IEC units: fsutil.human_bytes)
    assert "ETA" in live
    assert ui_instance["status"].startswith(label[STORE.name])
