"""The fault matrix, network and hub rows: the download stage (``archive_file``) against a loopback
HubServer that drops, corrupts, answers 404, knows no such revision, asks to retry later, or is not
there at all; `stage2 pin` through transient errors and ``HF_ENDPOINT``; ``HF_HUB_OFFLINE``.

The matrix: tests/faults_table.py (rows), tests/helpers/faults.py (what every row asserts).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.cli import stage2, subprocess_env
from helpers.env import small_tmpfs
from helpers.faults import (
    NOWHERE,
    SMALL,
    SPLIT,
    Prepared,
    converge,
    copy_root,
    demo_hub,
    fault_cases,
    forget_archive,
    hostile_archive,
    member,
    no_store,
    outside,
    refused,
    resolve_gets,
    run_cfg,
    said,
)

from stage2_data import checks as C
from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import INFO, TREE, HubFaults, Reject
from stage2_data.hashing import sha256_file
from stage2_data.profile import load_profile
from stage2_pipelines.runs import run_selection

pytestmark = pytest.mark.usefixtures("fault_instance")

# the default policy's attempts with short waits, where a row retries (its real 1, 2, 4, 8 s
# schedule: tests/test_acquire_network.py::test_the_default_policy_waits_1_2_4_8_s)
FAST_RETRIES = {"STAGE2_RETRY_BACKOFF": "0.05"}


def test_fault_net_drop(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client hands bytes over in 10 MiB chunks: a drop resumes from the last whole chunk, so
    # the archive is padded (a 12 MiB member, re-pinned) for the drop to come after the first one.
    for name, value in FAST_RETRIES.items():  # the resume waits the backoff (at most 1 s)
        monkeypatch.setenv(name, value)
    pad = np.random.default_rng(7).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes()
    victim = hostile_archive(demo, SMALL, lambda ms, top: ms + [member(f"{top}/padding.bin", pad)])
    root = copy_root(prepared, tmp_path / "root")
    forget_archive(root, victim)
    size = (demo.upstream / victim).stat().st_size
    drop = 11 << 20
    before = outside(tmp_path, root)
    with demo_hub(demo, faults=HubFaults(drop_after={victim: drop})) as hub:
        r = run_selection(run_cfg(demo, root, hub.url), ["archive_file"], SMALL)
        assert r["success"], said(r)
        gets = [rng for m, rng in hub.file_requests(victim) if m == "GET"]
    # resumed from what was received (at most the client's last 10 MiB chunk again), not restarted
    assert len(gets) == 2 and gets[0] is None and gets[1] is not None, gets
    start = int(gets[1].removeprefix("bytes=").removesuffix("-"))
    assert (10 << 20) <= start <= drop, gets
    assert sha256_file(layout.archive_path(root, victim)) == load_profile(demo.profile).archive(victim).sha256
    assert not layout.partial_path(root, victim).exists()
    assert outside(tmp_path, root) == before
    assert run_selection(run_cfg(demo, root), ["cache_dir"], SMALL)["success"]
    assert size > drop


@dataclass(frozen=True)
class Served:
    """A download the hub spoils: ``fault`` names the HubFaults set the archive is put in."""

    fault: str
    names: Callable[[DemoPaths], tuple[str, ...]]  # what the refusal names, besides the archive
    check: str | None
    converges: bool  # the rerun: the clean fingerprint, re-downloading only this archive; else it extracts


@fault_cases(
    net_corrupt=Served(
        "corrupt",
        lambda demo: ("sha256 mismatch", "Fix:", "download it again"),
        C.ARCHIVE_SHA256_MATCHES_PIN,
        converges=True,
    ),
    net_404=Served(
        "missing",
        # the fix is a command to paste (it was a bare `stage2 pin`: QA, stop 56)
        lambda demo: ("does not exist", demo.revision, "Fix:", f"`stage2 pin {demo.profile} ", " --check`"),
        None,
        converges=False,
    ),
)
def test_fault_download_refused(prepared: Prepared, demo: DemoPaths, tmp_path: Path, case: Served) -> None:
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    forget_archive(root, victim)
    before = outside(tmp_path, root)
    with demo_hub(demo, faults=HubFaults(**{case.fault: {victim}})) as hub:
        cfg = run_cfg(demo, root, hub.url)
        r = run_selection(cfg, ["archive_file"], SMALL)
        refused(r, victim, *case.names(demo), check=case.check)
        assert not layout.archive_path(root, victim).exists()
        if case.check is None:  # the hub's answer, not the archive's bytes: no check is judged (QA)
            assert not [c for c in r["checks"] if not c["passed"]], r["checks"]
            assert r["errors"] and all(e["could_not_run"] for e in r["errors"]), r["errors"]
        assert not layout.partial_path(root, victim).exists()
        assert outside(tmp_path, root) == before
        getattr(hub.faults, case.fault).clear()
        if case.converges:
            hub.clear_log()
            converge(prepared, cfg, root, [("archive_file", SMALL), ("cache_dir", SMALL)])
            assert resolve_gets(hub) == [victim]  # only the one that was not verified
        else:
            assert run_selection(cfg, ["archive_file"], SMALL)["success"]
            assert run_selection(cfg, ["cache_dir"], SMALL)["success"]


def test_a_bad_part_fails_its_split_cache_key_after_every_part_was_tried(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path
) -> None:
    """``archive_file``'s partition of a split cache key downloads every part: the hub corrupts the
    first part; `stage2 build` fails by a check (exit 1) naming that part's file, the part after it is
    still downloaded and verified (kept, not deleted), nothing is extracted or published, and the
    rerun downloads only the bad part and converges to the clean store."""
    aa, ab = f"{SPLIT}.tar.part-aa", f"{SPLIT}.tar.part-ab"
    assert [a.path for a in load_profile(demo.profile).archives_by_cache_key()[SPLIT]] == [aa, ab]
    root = copy_root(prepared, tmp_path / "root")
    for p in (aa, ab):
        forget_archive(root, p)
    with demo_hub(demo, faults=HubFaults(corrupt={aa})) as hub:
        out, doc, told = _build(demo, root, hub.url)
        assert out.returncode == 1 and doc.get("ok") is False, out.tail()
        for name in (aa, "sha256 mismatch", "Fix:", "download it again"):
            assert name in told, f"{name!r} not in:\n{told}"
        assert f"{ab}:" not in told and "Traceback" not in told
        assert sorted(resolve_gets(hub)) == [aa, ab]  # the part after the bad one was tried too
        assert not layout.archive_path(root, aa).exists() and not layout.partial_path(root, aa).exists()
        assert layout.verified_record_path(root, ab).is_file()  # downloaded, verified and kept
        assert sha256_file(layout.archive_path(root, ab)) == load_profile(demo.profile).archive(ab).sha256
        no_store(root)
        hub.faults.corrupt.clear()
        hub.clear_log()
        out, _, told = _build(demo, root, hub.url)
        assert out.returncode == 0, told
        assert resolve_gets(hub) == [aa]  # only the part that was not verified
    assert _fingerprint(root, prepared) == prepared.fingerprint


def test_a_failed_split_cache_key_names_every_bad_part_and_what_it_moved_aside(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path
) -> None:
    """A split cache key's partition that fails is not materialized, so its failure says everything:
    a part the hub does not have, and where the verified part that disagreed with its pin went (moved
    aside, downloaded again); then, with both parts missing upstream, each of them."""
    aa, ab = f"{SPLIT}.tar.part-aa", f"{SPLIT}.tar.part-ab"
    root = copy_root(prepared, tmp_path / "root")
    final = layout.archive_path(root, aa)
    good = final.read_bytes()
    st = final.stat()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    with open(final, "r+b") as f:  # in place, size and mtime restored: only the ctime tells
        f.write(bytes(bad))
    os.utime(final, ns=(st.st_atime_ns, st.st_mtime_ns))
    forget_archive(root, ab)
    with demo_hub(demo, faults=HubFaults(missing={ab})) as hub:
        out, doc, told = _build(demo, root, hub.url)
        # a part the hub does not have: the build cannot run (exit 2), as for a bad pin
        assert out.returncode == 2 and doc.get("ok") is False, out.tail()
        aside = [p for p in _quarantine(root) if p.name == aa]
        assert [p.read_bytes() for p in aside] == [bytes(bad)]  # moved aside, not deleted
        for name in (ab, "does not exist", "Fix:", f"{final} -> {aside[0]}", "not deleted"):
            assert name in told, f"{name!r} not in:\n{told}"
        assert final.read_bytes() == good and layout.verified_record_path(root, aa).is_file()
        # both parts missing upstream: the failure names each
        forget_archive(root, aa)
        hub.faults.missing.add(aa)
        out, doc, told = _build(demo, root, hub.url)
        assert out.returncode == 2 and doc.get("ok") is False, out.tail()
        for name in (f"'{aa}' does not exist", f"'{ab}' does not exist"):
            assert name in told, f"{name!r} not in:\n{told}"
        no_store(root)
        hub.faults.missing.clear()
        hub.clear_log()
        out, _, told = _build(demo, root, hub.url)
        assert out.returncode == 0, told
        assert sorted(resolve_gets(hub)) == [aa, ab]
    assert _fingerprint(root, prepared) == prepared.fingerprint


def test_a_stop_starts_no_further_part_of_a_split_cache_key(demo: DemoPaths, tmp_path: Path) -> None:
    """A stop of the process (``cancel_downloads``, what `stage2 build` does on SIGINT or SIGTERM)
    while the first part of a split cache key downloads: that download ends as cancelled, the next
    part is never requested, and the error names the cancelled part only."""
    from stage2_data.acquire import DownloadCancelled, HubSource, cancel_downloads
    from stage2_data.steps import step_download_cache_dir

    aa, ab = f"{SPLIT}.tar.part-aa", f"{SPLIT}.tar.part-ab"
    prof = load_profile(demo.profile)
    root = tmp_path / "root"
    with demo_hub(demo) as hub:
        hub.faults.rate = 100 * 1024  # bytes/s: the first part takes seconds
        source = HubSource.from_profile(prof, endpoint=hub.url)

        def stop_when_asked() -> None:
            deadline = time.monotonic() + 60
            while not any(m == "GET" for m, _ in hub.file_requests(aa)) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)  # inside the body
            cancel_downloads()

        th = threading.Thread(target=stop_when_asked)
        th.start()
        try:
            with pytest.raises(DownloadCancelled) as got:
                step_download_cache_dir(prof, source, root, SPLIT)
        finally:
            th.join()
            cancel_downloads(False)
        assert hub.file_requests(ab) == []  # never started
    assert aa in str(got.value) and ab not in str(got.value), str(got.value)
    assert not layout.archive_path(root, aa).exists() and not layout.archive_path(root, ab).exists()


def test_fault_net_bad_revision(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    forget_archive(root, victim)
    good = demo.profile.read_text()
    absent = "0123456789abcdef0123456789abcdef01234567"
    demo.profile.write_text(good.replace(demo.revision, absent))
    before = outside(tmp_path, root)
    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        r = run_selection(cfg, ["archive_file"], SMALL)
        refused(r, absent, "does not exist", "Fix:", "[source] revision")
        assert not layout.archive_path(root, victim).exists()
        assert outside(tmp_path, root) == before
        demo.profile.write_text(good)
        r2 = run_selection(cfg, ["archive_file"], SMALL)
        assert r2["success"], said(r2)


def test_fault_net_unreachable(prepared: Prepared) -> None:
    assert prepared.background is not None
    out, err = prepared.background.communicate(timeout=120)
    assert prepared.background.returncode == 0, err[-3000:]
    r = json.loads(out.strip().splitlines()[-1])
    refused(r, f"{SMALL}.tar", "unreachable", NOWHERE, "5 attempt", "Fix:", "--endpoint")
    bg_root = prepared.home.parent / "unreachable_root"
    assert not layout.archive_path(bg_root, f"{SMALL}.tar").exists()
    assert not layout.partial_path(bg_root, f"{SMALL}.tar").exists()
    no_store(bg_root)


def test_fault_net_retry_after(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in FAST_RETRIES.items():
        monkeypatch.setenv(name, value)
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    forget_archive(root, victim)
    before = outside(tmp_path, root)
    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        # beyond the cap (300 s): refused at once, saying when to retry; one GET, no retry
        hub.faults.reject[victim] = Reject(1, 429, retry_after=3600)
        r = run_selection(cfg, ["archive_file"], SMALL)
        refused(r, victim, "HTTP 429", "asks to retry after 3600 s", "Fix:", "re-run after")
        assert resolve_gets(hub) == [victim]
        assert not layout.archive_path(root, victim).exists()
        assert outside(tmp_path, root) == before
        # within the cap, both forms: waited for (backoff alone would retry after 0.05 s), then
        # downloaded; an HTTP-date has whole seconds: "now + 2 s" is at least 1 s away
        for retry_after, http_date in ((1, False), (2, True)):
            hub.clear_log()
            hub.faults.reject[victim] = Reject(1, 503 if http_date else 429, retry_after, http_date)
            r = run_selection(cfg, ["archive_file"], SMALL)
            assert r["success"], said(r)
            t = [t for t, m, p, _ in hub.timed_log() if m == "GET" and p.endswith(victim)]
            assert len(t) == 2 and t[1] - t[0] >= 0.9, t
            forget_archive(root, victim)
        assert run_selection(cfg, ["archive_file"], SMALL)["success"]
    assert run_selection(run_cfg(demo, root), ["cache_dir"], SMALL)["success"]


def _unpinned_copy(demo: DemoPaths, dst: Path) -> Path:
    """The demo's profile without its pins (what `stage2 pin --write` fills in)."""
    text = "".join(
        line
        for line in demo.profile.read_text().splitlines(keepends=True)
        if not line.startswith(("size = ", "sha256 = "))
    )
    dst.write_text(text)
    return dst


def test_fault_net_pin_transient(demo: DemoPaths, tmp_path: Path) -> None:
    prof = _unpinned_copy(demo, tmp_path / "profile.toml")
    with demo_hub(demo) as hub:
        hub.faults.reject[INFO] = Reject(1, 500)
        hub.faults.reject[TREE] = Reject(1, 503)
        env = subprocess_env(drop=("HF_ENDPOINT",), **FAST_RETRIES)
        out = stage2("pin", str(prof), "--endpoint", hub.url, "--write", env=env)
        assert out.returncode == 0, out.tail()
        assert hub.faults.reject == {}  # both failures happened, and were retried
    pinned = load_profile(prof)
    assert [(a.path, a.size, a.sha256) for a in pinned.archives] == [
        (a.path, a.size, a.sha256) for a in load_profile(demo.profile).archives
    ]


def test_fault_net_hf_endpoint(demo: DemoPaths, tmp_path: Path) -> None:
    prof = _unpinned_copy(demo, tmp_path / "profile.toml")
    with demo_hub(demo) as hub:
        out = stage2("pin", str(prof), "--check", env=subprocess_env(HF_ENDPOINT=hub.url))
        assert out.returncode == 1, out.tail()  # unpinned: it would change
        assert "not pinned yet" in out.stdout
        assert [p for _, p, _ in hub.log_snapshot() if "/tree/" in p]  # the listing came from HF_ENDPOINT
        # an explicit --endpoint wins over HF_ENDPOINT
        out = stage2(
            "pin", str(prof), "--check", "--endpoint", hub.url, env=subprocess_env(HF_ENDPOINT=NOWHERE)
        )
        assert out.returncode == 1, out.tail()
    out = stage2("pin", str(prof), "--check", env=subprocess_env(HF_ENDPOINT=NOWHERE, **FAST_RETRIES))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "gave up after 5 attempt(s)" in out.stderr, out.stderr  # the default policy, short waits
    assert NOWHERE in out.stderr and "HF_ENDPOINT" in out.stderr, out.stderr
    # `stage2 build` without --endpoint talks to HF_ENDPOINT too: nothing on disk, an unreachable
    # HF_ENDPOINT is named before anything starts
    root = tmp_path / "root"
    out = stage2(
        "build",
        "--profile",
        str(demo.profile),
        "--data-root",
        str(root),
        env=subprocess_env(HF_ENDPOINT=NOWHERE),
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.tail()
    assert f"hub unreachable at {NOWHERE}" in out.stderr, out.stderr


def test_fault_net_offline(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    before = outside(tmp_path, root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        assert run_selection(cfg, ["archive_file"], SMALL)["success"]  # verified on disk: no request
        forget_archive(root, victim)
        r = run_selection(cfg, ["archive_file"], SMALL)
        refused(r, "HF_HUB_OFFLINE", str(layout.archive_path(root, victim)), "nothing was requested", "Fix:")
        out = stage2("pin", str(demo.profile), "--endpoint", hub.url, env=subprocess_env(HF_HUB_OFFLINE="1"))
        assert out.returncode == 2 and "HF_HUB_OFFLINE is set" in out.stderr, out.tail()
        assert hub.log_snapshot() == []  # nothing reached the hub
        assert outside(tmp_path, root) == before
        monkeypatch.delenv("HF_HUB_OFFLINE")
        assert run_selection(cfg, ["archive_file"], SMALL)["success"]
    assert run_selection(run_cfg(demo, root), ["cache_dir"], SMALL)["success"]


def test_an_offline_build_names_every_missing_archive_at_once(demo: DemoPaths, tmp_path: Path) -> None:
    """`stage2 build` offline with archives not on disk: refused before any run, in one message that
    names each (here all of them, by the archives folder) and its fix once; nothing requested,
    nothing written. With ``--json``, stdout still holds one object: nothing run or published, the
    refusal as its one error (found by the mutation test: a script reading stdout got nothing)."""
    root = tmp_path / "root"
    archives = [a.path for a in load_profile(demo.profile).archives]
    argv = ["build", "--profile", str(demo.profile), "--data-root", str(root)]
    with demo_hub(demo) as hub:
        out = stage2(*argv, "--endpoint", hub.url, env=subprocess_env(HF_HUB_OFFLINE="1"))
        as_json = stage2(*argv, "--endpoint", hub.url, "--json", env=subprocess_env(HF_HUB_OFFLINE="1"))
        assert hub.log_snapshot() == []
    assert out.returncode == 2 and out.stdout == "", out.tail()
    (line,) = out.stderr.strip().splitlines()
    assert f"{len(archives)} archive(s) are not on disk in {layout.archives_dir(root)}: " in line, line
    assert all(p in line for p in archives) and "nothing was requested" in line, line
    assert line.count("Fix:") == 1 and "unset HF_HUB_OFFLINE" in line, line
    assert not root.exists()
    assert as_json.returncode == 2 and as_json.stderr == out.stderr, as_json.tail()
    doc = as_json.json()
    assert doc["ok"] is False and doc["store"] is None and doc["runs"] == [] and doc["checks"] == []
    (error,) = doc["errors"]
    assert error["error"] == "HubOfflineError" and line.endswith(error["message"]), error
    assert not root.exists()


# ----- verified archives that disagree with their pin; messages whose fix works ------------------
def _build(demo: DemoPaths, root: Path, url: str, **env: str) -> tuple[Any, dict[str, Any], str]:
    """``stage2 build --json`` of the demo into ``root`` against ``url``: (the process, its JSON
    summary, everything it told the user: failed checks, errors, stderr)."""
    out = stage2(
        "build", "--profile", str(demo.profile), "--data-root", str(root), "--endpoint", url, "--json",
        env=subprocess_env(drop=("HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"), **{**FAST_RETRIES, **env}),
        timeout=300,
    )  # fmt: skip
    assert "Traceback" not in out.stderr and "internal error" not in out.stdout + out.stderr, out.tail()
    doc = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}
    told = [f"{c['check']}: {c['description']}" for c in doc.get("checks", []) if not c["passed"]]
    told += [e["message"] for e in doc.get("errors", [])]
    return out, doc, "\n".join(told) + "\n" + out.stderr


def _fingerprint(root: Path, prepared: Prepared) -> str:
    manifest = layout.current_store_path(root, prepared.profile_name) / "manifest.json"
    return str(json.loads(manifest.read_text())["fingerprint"])


def _set_pin(demo: DemoPaths, path: str, key: str, value: str) -> None:
    """Set ``key`` (``size`` or ``sha256``) of the [[archives]] entry of ``path`` in the demo's profile."""
    lines = demo.profile.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip() == f'path = "{path}"')
    k = next(i for i in range(at, len(lines)) if lines[i].startswith(f"{key} = "))
    lines[k] = f"{key} = {value}\n"
    demo.profile.write_text("".join(lines))


def _typo(spec: Any, key: str) -> str:
    if key == "size":
        return str(spec.size + 1)
    return '"' + spec.sha256[:-1] + ("0" if spec.sha256[-1] != "0" else "1") + '"'


def _quarantine(root: Path) -> list[Path]:
    q = layout.quarantine_root(root)
    return sorted(p for p in q.rglob("*") if p.is_file()) if q.exists() else []


def test_fault_arc_pin_typo(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    # A typo in one pin (sha256, then size) with the hub reachable: the hub's listing agrees with the
    # verified file, so the pin is refused by name; the file stays byte-identical; nothing downloaded.
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    spec = load_profile(demo.profile).archive(victim)
    final = layout.archive_path(root, victim)
    good = final.read_bytes()
    clean = demo.profile.read_text()
    before = outside(tmp_path, root, demo.root)
    with demo_hub(demo) as hub:
        for key in ("sha256", "size"):
            _set_pin(demo, victim, key, _typo(spec, key))
            hub.clear_log()
            out, doc, told = _build(demo, root, hub.url)
            assert out.returncode != 0 and doc.get("ok") is False, out.tail()
            for name in (victim, f"{key} = {_typo(spec, key)}", "is wrong", "lists the same size and sha256",
                         "left where it is", "nothing was downloaded", "Fix:", "correct the pin"):  # fmt: skip
                assert name in told, f"{name!r} not in:\n{told}"
            assert final.read_bytes() == good and layout.verified_record_path(root, victim).is_file()
            assert _quarantine(root) == []  # nothing moved, nothing deleted
            assert resolve_gets(hub) == []  # nothing downloaded
            demo.profile.write_text(clean)
        # the pin corrected: the build converges without downloading anything
        hub.clear_log()
        out, doc, told = _build(demo, root, hub.url)
        assert out.returncode == 0, told
        assert resolve_gets(hub) == []
    assert _fingerprint(root, prepared) == prepared.fingerprint
    assert outside(tmp_path, root, demo.root) == before


def test_a_wrong_pin_exits_2_whether_its_archive_is_on_disk_or_downloading(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path
) -> None:
    """The same mistake, a typo in one pin's sha256, found against the verified archive on disk and
    then during its download: the same refusal and exit 2 (a bad profile: docs/commands.md), naming
    the pin by its key in the profile and the upstream value; the `stage2 pin` its fix names runs as
    pasted; the pin corrected as the fix says, the build converges."""
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    prof = load_profile(demo.profile)
    spec = prof.archive(victim)
    key = f"{demo.profile}: archives[{prof.archives.index(spec)}].sha256"
    _set_pin(demo, victim, "sha256", _typo(spec, "sha256"))
    argv = ["build", "--profile", str(demo.profile), "--data-root", str(root), "--json",
            "--hub-folder", str(demo.upstream)]  # fmt: skip
    env = subprocess_env(drop=("HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"), **FAST_RETRIES)
    fixes = []
    for where in ("on disk", "downloading"):
        if where == "downloading":
            forget_archive(root, victim)
        out = stage2(*argv, env=env, timeout=300)
        assert out.returncode == 2, (where, out.tail())
        assert "Traceback" not in out.stderr and "internal error" not in out.stdout + out.stderr, out.tail()
        errors = out.json()["errors"]
        assert [e["error"] for e in errors] == ["PinDisagreesError"], (where, errors)
        message, _, fix = errors[0]["message"].partition(" Fix: ")
        assert f"the pin {key} = {_typo(spec, 'sha256')} is wrong" in message, (where, message)
        assert f'{key} = "{spec.sha256}"' in fix, (where, fix)
        fixes.append(fix)
        on_disk = layout.archive_path(root, victim).is_file()
        assert on_disk == (where == "on disk") and _quarantine(root) == [], where
    for fix in fixes:  # the pin command each names runs as pasted, against the folder the build served
        (command,) = re.findall(r"`(stage2 pin [^`]+)`", fix)
        pin = stage2(*shlex.split(command)[1:], timeout=120)
        assert pin.returncode == 2 and f", {spec.sha256} upstream" in pin.stderr, pin.tail()
    (value,) = set(re.findall(rf'{re.escape(key)} = ("[0-9a-f]{{64}}")', fixes[0]))
    _set_pin(demo, victim, "sha256", value)
    out = stage2(*argv, env=env, timeout=300)
    assert out.returncode == 0, out.tail()
    assert _fingerprint(root, prepared) == prepared.fingerprint


def test_fault_arc_pin_typo_offline(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    # The same typo with HF_HUB_OFFLINE=1: nobody can say which side is wrong, so the file is moved
    # to the quarantine folder (never deleted) and the named error says where and what to do.
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    spec = load_profile(demo.profile).archive(victim)
    final = layout.archive_path(root, victim)
    good = final.read_bytes()
    clean = demo.profile.read_text()
    _set_pin(demo, victim, "sha256", _typo(spec, "sha256"))
    out, doc, told = _build(demo, root, NOWHERE, HF_HUB_OFFLINE="1")
    assert out.returncode != 0 and doc.get("ok") is False, out.tail()
    moved = [p for p in _quarantine(root) if p.name == victim]
    assert len(moved) == 1 and moved[0].read_bytes() == good  # moved aside, byte-identical
    assert not final.exists()
    for name in ("HF_HUB_OFFLINE", victim, f"moved to {moved[0]}", "not deleted", "nothing was requested",
                 "Fix:", "mv ", "unset HF_HUB_OFFLINE"):  # fmt: skip
        assert name in told, f"{name!r} not in:\n{told}"
    # the fix it gives works: the pin corrected and the file moved back, the offline build converges
    demo.profile.write_text(clean)
    moved[0].rename(final)
    out, doc, told = _build(demo, root, NOWHERE, HF_HUB_OFFLINE="1")
    assert out.returncode == 0, told
    assert _fingerprint(root, prepared) == prepared.fingerprint


def test_fault_arc_ctime_edit(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    # A verified archive's bytes changed with its size and mtime restored: its ctime moved, so its
    # record no longer covers it; re-hashed, found wrong (the hub agrees with the pin), moved to the
    # quarantine folder and downloaded again; the build converges to the clean store.
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    final = layout.archive_path(root, victim)
    with demo_hub(demo) as hub:
        out, _, told = _build(demo, root, hub.url)
        assert out.returncode == 0, told
        good = final.read_bytes()
        st = final.stat()
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0x01
        with open(final, "r+b") as f:  # in place: same inode, same size
            f.write(bytes(bad))
        os.utime(final, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (final.stat().st_size, final.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        hub.clear_log()
        out, doc, told = _build(demo, root, hub.url)
        assert out.returncode == 0, told
        assert resolve_gets(hub) == [victim]  # only the edited one
    assert final.read_bytes() == good
    aside = [p for p in _quarantine(root) if p.name == victim]
    assert [p.read_bytes() for p in aside] == [bytes(bad)]
    assert doc["moved_aside"] == [f"{final} -> {aside[0]}"]  # the build says where it went
    assert _fingerprint(root, prepared) == prepared.fingerprint


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_fault_arc_not_a_file(prepared: Prepared, demo: DemoPaths, tmp_path: Path, kind: str) -> None:
    # A folder holding a user's note, or a FIFO, where a verified archive goes (the archive moved
    # elsewhere by its user): the build failed after downloading it again with a raw
    # IsADirectoryError, or replaced the FIFO silently (QA). It is moved aside whole, said, and
    # the archive downloaded; the build converges to the clean store.
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    final = layout.archive_path(root, victim)
    final.rename(tmp_path / "elsewhere.tar")
    if kind == "folder":
        final.mkdir()
        (final / "note.txt").write_text("notes\n")
    else:
        os.mkfifo(final)
    with demo_hub(demo) as hub:
        out, doc, told = _build(demo, root, hub.url)
        assert out.returncode == 0, told
        assert resolve_gets(hub) == [victim]
    assert final.is_file() and final.read_bytes() == (tmp_path / "elsewhere.tar").read_bytes()
    (aside,) = layout.quarantine_root(root).glob(f"*/{layout.ARCHIVES_DIR}/{victim}")
    assert doc["moved_aside"] == [f"{final} -> {aside}"]  # the build says where it went
    if kind == "folder":
        assert (aside / "note.txt").read_text() == "notes\n"
    else:
        assert stat.S_ISFIFO(os.lstat(aside).st_mode)
    assert _fingerprint(root, prepared) == prepared.fingerprint


def test_fault_arc_quarantine_gc(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    # Files in the quarantine folder: `stage2 list` shows them with their size; `stage2 gc` leaves
    # them alone unless --quarantine is given; --dry-run removes nothing and says what it would.
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    final = layout.archive_path(root, victim)
    size = final.stat().st_size
    with open(final, "r+b") as f:
        f.write(b"\0")
    out, _, told = _build(demo, root, NOWHERE, HF_HUB_OFFLINE="1")
    assert out.returncode != 0 and "moved to" in told, told
    files = _quarantine(root)
    assert any(p.name == victim for p in files)
    listed = stage2("list", str(demo.profile), "--data-root", str(root), "--json")
    assert listed.returncode == 0, listed.tail()
    q = listed.json()["quarantine"]
    assert [(f["original"], f["size"]) for f in q["files"]] == [(f"archives/{victim}", size)]
    assert q["bytes"] == size and q["folder"] == str(layout.quarantine_root(root))
    text = stage2("list", str(demo.profile), "--data-root", str(root))
    assert f"archives/{victim}" in text.stdout and "quarantine folder" in text.stdout, text.tail()
    stores = root / layout.STORES_DIR
    # without the flag gc never touches it (no store yet: nothing else to do either)
    stores.mkdir()
    gc = stage2("gc", str(stores), "--keep", "0")
    assert _quarantine(root) == files, gc.tail()
    gc = stage2("gc", str(stores), "--quarantine", "--dry-run", "--json")
    assert gc.returncode == 0, gc.tail()
    doc = gc.json()["quarantine"]
    assert (
        doc["dry_run"]
        and doc["removed_files"] == 0
        and f"archives/{victim}" in {f["original"] for f in doc["files"]}
    )
    assert _quarantine(root) == files
    gc = stage2("gc", str(stores), "--quarantine")
    assert gc.returncode == 0, gc.tail()
    assert "removed  " in gc.stdout and victim in gc.stdout and "quarantine: removed" in gc.stdout, gc.stdout
    assert _quarantine(root) == [] and not layout.quarantine_root(root).exists()


@dataclass(frozen=True)
class Answer:
    """A download answer the hub spoils (``set_fault``), and what the refusal must (and must not) say."""

    set_fault: Callable[[Any, str], None]
    names: tuple[str, ...]
    never: tuple[str, ...]


@fault_cases(
    net_lying_length=Answer(
        lambda hub, v: hub.faults.content_length.__setitem__(v, 1000),
        (
            "Content-Length 1000",
            "listing",
            "agrees with the pin",
            "the download answer is wrong",
            "Fix:",
            "proxy",
        ),  # fmt: skip
        ("stage2 pin",),
    ),
    net_html_page=Answer(
        lambda hub, v: hub.faults.html.add(v),
        ("HTML page", "text/html", "login", "Fix:", "token", "HF_TOKEN", "endpoint"),
        ("stage2 pin",),
    ),
    net_redirect_dead=Answer(
        lambda hub, v: hub.faults.redirect.__setitem__(v, NOWHERE),
        (f"{NOWHERE} could not be reached", "redirected the request there", "Fix:", "5 attempt"),
        ("hub unreachable",),
    ),
)
def test_fault_download_answer(prepared: Prepared, demo: DemoPaths, tmp_path: Path, case: Answer) -> None:
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    forget_archive(root, victim)
    with demo_hub(demo) as hub:
        case.set_fault(hub, victim)
        out, doc, told = _build(demo, root, hub.url)
        # the hub's answer is not the file: the build cannot run (exit 2), as when the hub is
        # unreachable before the runs start
        assert out.returncode == 2 and doc.get("ok") is False, out.tail()
        for name in (victim, *case.names):
            assert name in told, f"{name!r} not in:\n{told}"
        for name in case.never:
            assert name not in told, f"{name!r} in:\n{told}"
        assert not layout.archive_path(root, victim).exists()
        no_store(root)
        hub.faults.content_length.clear()
        hub.faults.html.clear()
        hub.faults.redirect.clear()
        out, _, told = _build(demo, root, hub.url)
        assert out.returncode == 0, told
    assert _fingerprint(root, prepared) == prepared.fingerprint


def test_a_full_disk_under_the_dagster_instance_is_named(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path
) -> None:
    """The disk that holds the Dagster instance (DAGSTER_HOME), not the data root's, is full: SQLite
    refuses the build's run records ("database or disk is full", or "disk I/O error" when not even
    its journal fits). That is a full disk, named with the instance's folder and the fix (exit 2),
    not an internal error; once space is freed the same build goes through."""
    with small_tmpfs(tmp_path / "small_fs", "16m") as mnt:
        root = copy_root(prepared, tmp_path / "root")
        home = mnt / "home"
        filler = mnt / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, shutil.disk_usage(mnt).free - 64 * 1024))
        with demo_hub(demo) as hub:
            out, doc, told = _build(demo, root, hub.url, DAGSTER_HOME=str(home))
            assert out.returncode == 2, out.tail()
            for said in (f"the Dagster instance at {home}", "database", "free space on the disk", "Fix:"):
                assert said in told, f"{said!r} not in:\n{told}"
            filler.unlink()
            out, _, told = _build(demo, root, hub.url, DAGSTER_HOME=str(home))
            assert out.returncode == 0, told
        assert _fingerprint(root, prepared) == prepared.fingerprint


def test_fault_arc_disk_full_build(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    # `stage2 build` on a data root whose disk fills up during a download (a real 64 MiB tmpfs, filled
    # while the download waits to retry a 503): the message names the partial file, what is written
    # and the free space; the partial file is kept; once space is freed the build converges.
    with small_tmpfs(tmp_path / "small_fs", "64m") as mnt:
        root = copy_root(prepared, mnt / "root")
        victim = "jesbu1_soar_rfm_soar.tar"
        forget_archive(root, victim)
        size = (demo.upstream / victim).stat().st_size
        filler = mnt / "filler"

        def fill_when_asked(hub: Any) -> None:
            deadline = time.monotonic() + 120
            while not any(m == "GET" for m, _ in hub.file_requests(victim)) and time.monotonic() < deadline:
                time.sleep(0.002)
            with open(filler, "wb") as f:
                f.write(b"\0" * max(0, shutil.disk_usage(mnt).free - size // 2))

        with demo_hub(demo, faults=HubFaults(fail_first={victim: 1})) as hub:
            th = threading.Thread(target=fill_when_asked, args=(hub,))
            th.start()
            out, doc, told = _build(demo, root, hub.url, STAGE2_RETRY_BACKOFF="1")
            th.join()
            part = layout.partial_path(root, victim)
            for name in (f"disk full while writing {part}", victim, "still to come", "free there", "Fix:",
                         "free disk space"):  # fmt: skip
                assert name in told, f"{name!r} not in:\n{told}"
            assert out.returncode != 0 and doc.get("ok") is False, out.tail()
            assert 0 < part.stat().st_size < size  # the partial download is kept
            assert not layout.archive_path(root, victim).exists()
            code = out.returncode
            filler.unlink()
            out, _, told = _build(demo, root, hub.url)
            assert out.returncode == 0, told
        assert _fingerprint(root, prepared) == prepared.fingerprint
    assert code == 2  # a full disk: the build could not run
