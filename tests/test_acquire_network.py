"""The network conventions of every request to the hub: one retry policy (backoff, ``Retry-After``
bounded, in both of its forms), ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``; and unknown profile entries with
the closest upstream names. The real huggingface_hub client against the loopback hub."""

from __future__ import annotations

import hashlib
import logging
from email.utils import formatdate
from pathlib import Path

import pytest
import test_acquire as _ta
from test_acquire import FAST, REPO, REV, Upstream, closed_port_endpoint, profile_data, spec_of

from stage2_data import layout
from stage2_data.acquire import (
    HubOfflineError,
    HubSource,
    RemoteFile,
    RetryAfterTooLongError,
    RetryPolicy,
    check_revision,
    closest_files,
    download_archive,
    download_archives,
    download_profile,
    list_remote_files,
    parse_retry_after,
    pin_profile,
    resolve_endpoint,
    retry,
)
from stage2_data.acquire.pin import UnknownEntry, unknown_entries
from stage2_data.acquire.retry import BACKOFF_ENV, RetrySettingError
from stage2_data.demo.hubserver import INFO, TREE, HubServer, Reject
from stage2_data.errors import HubError, ProfileError, UnknownArchivesError
from stage2_data.profile import load_profile, parse_profile

PATH = "split_key.tar.part-ab"
upstream, hub, source = _ta.upstream, _ta.hub, _ta.source  # the fixtures of test_acquire.py


def gets(hub: HubServer, path: str) -> list[float]:
    """When each GET of the repo file ``path`` arrived (monotonic seconds)."""
    return [t for t, m, p, _ in hub.timed_log() if m == "GET" and p.endswith("/resolve/" + REV + "/" + path)]


# ----- Retry-After ---------------------------------------------------------------------------------
def test_parse_retry_after_both_forms() -> None:
    now = 1_800_000_000.0
    assert parse_retry_after("120", now=now) == 120.0
    assert parse_retry_after(" 0 ", now=now) == 0.0
    assert parse_retry_after(formatdate(now + 90, usegmt=True), now=now) == pytest.approx(90.0)
    assert parse_retry_after(formatdate(now - 90, usegmt=True), now=now) == 0.0  # in the past: now
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 0.0
    for bad in (None, "", "soon", "-5", "1.5e3"):
        assert parse_retry_after(bad, now=now) is None


@pytest.mark.parametrize("http_date", [False, True], ids=["delta_seconds", "http_date"])
def test_429_retry_after_is_honoured(
    hub: HubServer,
    source: HubSource,
    upstream: Upstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    http_date: bool,
) -> None:
    # backoff 0.01 s: a wait of about 1 s can only come from the Retry-After header
    hub.faults.reject[PATH] = Reject(1, 429, retry_after=2 if http_date else 1, http_date=http_date)
    with caplog.at_level(logging.WARNING):
        res = download_archive(source, spec_of(upstream, PATH), tmp_path, **FAST)
    assert res.attempts == 2 and not res.skipped
    t = gets(hub, PATH)
    assert len(t) == 2
    # an HTTP-date has whole seconds: "now + 2 s" is at least 1 s away
    assert t[1] - t[0] >= 0.9
    assert "(the hub's Retry-After)" in caplog.text


def test_retry_after_beyond_the_cap_fails_at_once(
    hub: HubServer, source: HubSource, upstream: Upstream, tmp_path: Path
) -> None:
    hub.faults.reject[PATH] = Reject(1, 503, retry_after=3600)
    with pytest.raises(RetryAfterTooLongError) as ei:
        download_archive(source, spec_of(upstream, PATH), tmp_path, attempts=5, backoff=0.01)
    msg = str(ei.value)
    for needle in ("HTTP 503", "retry after 3600 s", "longer than the 300 s", "Fix: re-run after", PATH):
        assert needle in msg, msg
    assert 3590 <= ei.value.seconds <= 3600
    assert len(gets(hub, PATH)) == 1  # not retried
    assert not layout.archive_path(tmp_path, PATH).exists()
    # a Retry-After within the cap is waited for
    hub.faults.reject[PATH] = Reject(1, 429, retry_after=1)
    res = download_archive(source, spec_of(upstream, PATH), tmp_path, attempts=5, backoff=0.01)
    assert res.attempts == 2


def test_listing_and_revision_are_retried_like_downloads(hub: HubServer, source: HubSource) -> None:
    hub.faults.reject[INFO] = Reject(2, 500)
    hub.faults.reject[TREE] = Reject(1, 429, retry_after=0)
    policy = RetryPolicy(attempts=3, backoff=0.01)
    files = list_remote_files(source, policy=policy)
    assert PATH in files
    assert hub.faults.reject == {}  # every injected failure was met, and retried
    hub.faults.reject[INFO] = Reject(3, 500)
    with pytest.raises(HubError, match=r"gave up after 3 attempt\(s\).*HTTP 500"):
        check_revision(source, policy=policy)


# ----- the backoff schedule ------------------------------------------------------------------------
class _Waits:
    """Stands in for ``retry.PROCESS_CANCEL``: records each wait before a retry instead of sleeping."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.seconds.append(timeout)
        return False  # the process is not stopping: retry at once


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> _Waits:
    w = _Waits()
    monkeypatch.setattr(retry, "PROCESS_CANCEL", w)
    monkeypatch.delenv(BACKOFF_ENV, raising=False)
    return w


def test_the_default_policy_waits_1_2_4_8_s(
    hub: HubServer,
    source: HubSource,
    upstream: Upstream,
    tmp_path: Path,
    waits: _Waits,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """5 attempts in all, 1, 2, 4, 8 s apart (doubling, at most 30 s), for the downloads and the
    revision check alike (the waits are recorded, not slept); STAGE2_RETRY_BACKOFF sets the first."""
    assert RetryPolicy() == RetryPolicy(attempts=5, backoff=1.0, max_backoff=30.0)
    assert [RetryPolicy().backoff_wait(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    hub.faults.reject[PATH] = Reject(4, 500)
    res = download_archive(source, spec_of(upstream, PATH), tmp_path)  # neither attempts nor backoff given
    assert res.attempts == 5 and res.sha256 == upstream.sha(PATH)
    assert waits.seconds == [1.0, 2.0, 4.0, 8.0]
    waits.seconds.clear()
    with pytest.raises(HubError, match=r"gave up after 5 attempt\(s\)") as ei:
        check_revision(HubSource(REPO, "dataset", REV, endpoint=closed_port_endpoint()))
    assert "unreachable" in str(ei.value)
    assert waits.seconds == [1.0, 2.0, 4.0, 8.0]

    monkeypatch.setenv(BACKOFF_ENV, " 0.05 ")
    waits.seconds.clear()
    hub.faults.reject[INFO] = Reject(4, 503)
    assert check_revision(source) == REV
    assert waits.seconds == pytest.approx([0.05, 0.1, 0.2, 0.4])
    waits.seconds.clear()
    hub.faults.reject[PATH] = Reject(2, 500)
    download_archive(source, spec_of(upstream, PATH), tmp_path / "env")
    assert waits.seconds == pytest.approx([0.05, 0.1])
    assert RetryPolicy(backoff=2.0).backoff_wait(2) == 4.0  # an explicit backoff wins
    monkeypatch.setenv(BACKOFF_ENV, "0")
    assert RetryPolicy().backoff_wait(3) == 0.0  # retry at once


def test_a_bad_backoff_setting_is_named_before_any_request(
    hub: HubServer, source: HubSource, upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad in ("abc", "-1", "1s", "nan", "inf", "-inf"):
        monkeypatch.setenv(BACKOFF_ENV, bad)
        with pytest.raises(RetrySettingError) as ei:
            RetryPolicy()
        assert f"{BACKOFF_ENV}={bad!r} is not a number of seconds >= 0" in str(ei.value)
        assert ei.value.fix is not None and BACKOFF_ENV in ei.value.fix and "unset" in ei.value.fix
    hub.clear_log()
    spec = spec_of(upstream, PATH)
    for call in (
        lambda: check_revision(source),
        lambda: list_remote_files(source),
        lambda: download_archive(source, spec, tmp_path),
        lambda: download_archives(source, [spec], tmp_path),
    ):
        with pytest.raises(RetrySettingError):
            call()
    assert hub.log_snapshot() == []  # nothing was requested
    assert RetryPolicy(backoff=0.5).backoff == 0.5  # an explicit backoff does not read it
    assert not download_archive(source, spec, tmp_path, **FAST).skipped
    # a verified archive needs no request, nor the setting
    assert download_archive(source, spec, tmp_path).skipped
    assert download_archives(source, [spec], tmp_path)[0].skipped


# ----- HF_ENDPOINT, HF_HUB_OFFLINE -------------------------------------------------------------------
def test_hf_endpoint_is_the_default_endpoint(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch, upstream: Upstream, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url + "/")
    src = HubSource(REPO, "dataset", REV)  # no endpoint given
    assert src.api_endpoint == resolve_endpoint() == hub.url
    assert resolve_endpoint("http://127.0.0.1:1") == "http://127.0.0.1:1"  # an explicit one wins
    assert set(list_remote_files(src)) == set(upstream.files)
    assert download_archive(src, spec_of(upstream, PATH), tmp_path, **FAST).sha256 == upstream.sha(PATH)


def test_offline_uses_the_disk_and_requests_nothing(
    hub: HubServer, source: HubSource, upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    have, missing = "split_key.tar.part-aa", PATH
    download_archive(source, spec_of(upstream, have), tmp_path, **FAST)
    hub.clear_log()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download_archive(source, spec_of(upstream, have), tmp_path).skipped
    with pytest.raises(HubOfflineError) as ei:
        download_archives(source, [spec_of(upstream, have), spec_of(upstream, missing)], tmp_path)
    assert ei.value.missing == [missing]
    assert str(layout.archive_path(tmp_path, missing)) in str(ei.value)
    assert "HF_HUB_OFFLINE" in str(ei.value) and "nothing was requested" in str(ei.value)
    with pytest.raises(HubOfflineError, match="HF_HUB_OFFLINE is set"):
        download_archive(source, spec_of(upstream, missing), tmp_path)
    with pytest.raises(HubOfflineError, match="needs the hub"):
        pin_profile(parse_profile(profile_data(upstream, pinned=False)), source)
    # an archive put there by hand is verified by its hash alone
    layout.archive_path(tmp_path, missing).write_bytes(upstream.files[missing])
    assert download_archive(source, spec_of(upstream, missing), tmp_path).sha256 == upstream.sha(missing)
    assert hub.log_snapshot() == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert check_revision(source) == REV


# ----- unknown entries, closest names -----------------------------------------------------------------
def test_closest_files_groups_split_parts() -> None:
    remote = {
        p: RemoteFile(p, 1, "0" * 64)
        for p in (
            "jesbu1_soar_rfm_soar_rfm.tar.part-aa",
            "jesbu1_soar_rfm_soar_rfm.tar.part-ab",
            "jesbu1_oxe_rfm_oxe_toto.tar",
            "aliangdw_metaworld_metaworld_train.tar",
            "README.md",
        )
    }
    assert closest_files("jesbu1_soar_rfm_soar.tar", remote, exclude=set())[0] == (
        "jesbu1_soar_rfm_soar_rfm.tar.part-aa .. jesbu1_soar_rfm_soar_rfm.tar.part-ab (2 parts)"
    )
    assert closest_files("aliangdw_metaworld_rfm_metaworld_train.tar", remote, exclude=set())[0] == (
        "aliangdw_metaworld_metaworld_train.tar"
    )
    near = closest_files("x.tar", remote, exclude={"jesbu1_oxe_rfm_oxe_toto.tar"})
    assert "jesbu1_oxe_rfm_oxe_toto.tar" not in near and "README.md" not in near


def test_unknown_entries_are_never_requested(
    hub: HubServer, source: HubSource, upstream: Upstream, tmp_path: Path
) -> None:
    data = profile_data(upstream, pinned=False)
    data["archives"].append({"path": "big_cache_key_v2.tar", "cache_key": "guess", "unknown": True})
    data["expected"]["archives"] += 1
    prof = parse_profile(data)
    assert [a.path for _, a in prof.unknown_archives()] == ["big_cache_key_v2.tar"]
    assert "unknown = true" in prof.to_toml()
    pinned, _ = pin_profile(prof, source)
    assert [a.path for a in pinned.archives if a.pinned] == [a.path for a in prof.archives if not a.unknown]
    u = unknown_entries(prof, list_remote_files(source))
    assert [(x.index, x.path) for x in u] == [(3, "big_cache_key_v2.tar")]
    # the profile's own archives and the quarantined one are not proposed
    assert u[0].closest == ["unlisted_other.tar"]
    with pytest.raises(UnknownArchivesError) as ei:
        download_profile(pinned, source, tmp_path)
    assert ei.value.entries == ["big_cache_key_v2.tar"] and "stage2 pin" in str(ei.value)
    with pytest.raises(ProfileError, match="marked unknown = true"):
        download_archive(source, pinned.archive("big_cache_key_v2.tar"), tmp_path)
    assert not [p for _, p, _ in hub.log_snapshot() if "big_cache_key_v2" in p]
    bad = dict(data["archives"][-1], size=5, sha256=hashlib.sha256(b"").hexdigest())
    with pytest.raises(ProfileError, match="unknown = true and also has a size/sha256"):
        parse_profile({**data, "archives": [*data["archives"][:-1], bad]})


def test_shipped_profile_guesses_nothing(tmp_path: Path) -> None:
    """The real profile marks the 5 cache keys that are not public as unknown; against a hub that
    lists the names upstream is known to have (docs/spec/kit-format.md, 2a), `pin` pins the 9 known
    files and names the closest existing archives for each unknown entry, requesting no file."""
    prof = load_profile(Path(__file__).resolve().parents[1] / "manifests" / "stage2_core_v1.toml")
    unknown = [a.path for _, a in prof.unknown_archives()]
    assert len(unknown) == 5 and len(prof.archives) == prof.expected.archives == 14
    assert len({a.cache_key for a in prof.archives if not a.unknown}) == 8
    folder = tmp_path / "upstream"
    folder.mkdir()
    existing = [a.path for a in prof.archives if not a.unknown] + [
        "aliangdw_metaworld_metaworld_train.tar",
        *(f"jesbu1_epic_rfm_epic.tar.part-a{c}" for c in "abcd"),
        *(f"jesbu1_soar_rfm_soar_rfm.tar.part-a{c}" for c in "abcdef"),
        "jesbu1_racer_rfm_racer_val.tar",
        "jesbu1_oxe_rfm_oxe_toto.tar",
        *(f"ykorkmaz_libero_failure_rfm_libero_{s}_failure.tar" for s in ("10", "90", "goal", "object")),
    ]
    for name in existing:
        (folder / name).write_bytes(name.encode())
    src = prof.source
    with HubServer(folder, repo_id=src.repo_id, revision=src.revision) as server:
        found: list[UnknownEntry] = []
        pinned, changes = pin_profile(
            prof, HubSource.from_profile(prof, endpoint=server.url), unknown_out=found
        )
        assert not [p for m, p, _ in server.log_snapshot() if "/resolve/" in p]  # no file requested
    assert len(changes) == 9 and [a.path for a in pinned.archives if not a.pinned] == unknown
    closest = {u.path: u.closest[0] for u in found}
    assert closest == {
        "aliangdw_metaworld_rfm_metaworld_train.tar": "aliangdw_metaworld_metaworld_train.tar",
        "jesbu1_epic_rfm_epic.tar": "jesbu1_epic_rfm_epic.tar.part-aa .. jesbu1_epic_rfm_epic.tar.part-ad (4 parts)",
        "jesbu1_soar_rfm_soar.tar": "jesbu1_soar_rfm_soar_rfm.tar.part-aa .. jesbu1_soar_rfm_soar_rfm.tar.part-af (6 parts)",
        "jesbu1_toto_rfm_toto.tar": "jesbu1_oxe_rfm_oxe_toto.tar",
        "jesbu1_utd_so100_clean_rfm_utd_so100_clean.tar": closest[
            "jesbu1_utd_so100_clean_rfm_utd_so100_clean.tar"
        ],
    }
    assert all(len(u.closest) == 3 for u in found)


def test_an_endpoint_that_answers_html_pages_is_named_as_such(upstream: Upstream, tmp_path: Path) -> None:
    # A captive portal or a login proxy at the endpoint: every request gets a 200 HTML page. The HEAD
    # before the download carries none of the hub's headers: named as that, not as a wrong pin.
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    page = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>Log in</body></html>"

    class Portal(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()

        def do_GET(self) -> None:
            self.do_HEAD()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Portal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        path = "split_key.tar.part-ab"
        with pytest.raises(HubError) as ei:
            download_archive(
                HubSource(REPO, "dataset", REV, endpoint=url), spec_of(upstream, path), tmp_path, **FAST
            )
    finally:
        server.shutdown()
        server.server_close()
    msg = str(ei.value)
    assert "none of the hub's headers" in msg and path in msg and url in msg, msg
    assert "stage2 pin" not in msg and "HTTPS_PROXY" in msg and "HF_TOKEN" in msg, msg
    assert not layout.archive_path(tmp_path, path).exists()
