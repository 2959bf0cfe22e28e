"""The progress display of `stage2 build` (stage2_pipelines.progress, drawn with rich): live lines per
stage on a real pseudo-terminal, plain lines when piped or in CI, no download bytes where nothing
downloads, and no rich in the Dagster-free library."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import STAGE2, python, python_argv, run, subprocess_env

from stage2_data import fsutil, layout
from stage2_data.demo import DemoPaths
from stage2_data.profile import Profile, load_profile
from stage2_data.stages import ACQUIRE, STAGES, Stage, stage_partitions
from stage2_pipelines import progress, runner, runs
from stage2_pipelines.progress import BuildProgress

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LABELS = [f"[{i}/{len(STAGES)}] {s.label}" for i, s in enumerate(STAGES, 1)]

# A child that feeds BuildProgress the runs of a whole build, in the runner's order (the stage table's
# partitions, a run at a time), writing to its own stderr: a terminal or a pipe, as the test chooses.
FEED = """
import sys, time
from stage2_data.profile import load_profile
from stage2_data.stages import STAGES, stage_partitions
from stage2_pipelines.progress import BuildProgress
prof = load_profile(sys.argv[1])
bar = BuildProgress(prof, tick=0.05)
i = 0
for stage in STAGES:
    for p in stage_partitions(stage, prof):
        i += 1
        time.sleep(0.02)
        bar.on_run({"run_id": f"{i:08x}-run", "success": True, "partition": p,
                    "selection": list(stage.assets), "checks": [], "errors": []})
bar.close()
print("live" if bar.live else "plain", file=sys.stdout)
"""


def _env(**extra: str) -> dict[str, str]:
    """This environment, without what would change rich's or our terminal detection."""
    drop = ("CI", "COLUMNS", "LINES", "TERM", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR")
    return subprocess_env(drop=drop, TERM="xterm-256color", **extra)


def _on_pty(args: list[str], env: dict[str, str], *, cols: int) -> str:
    """Run ``args`` with stdin, stdout and stderr on a new pseudo-terminal of ``cols`` columns; what it
    wrote (the terminal's output processing off: bytes as written, no \\n -> \\r\\n)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            out += data
        assert proc.wait(timeout=30) == 0, out.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return out.decode()


def _runs(prof: Profile, fail: str | None = None) -> list[dict[str, Any]]:
    """The runs of a build in the runner's order; a run of partition ``fail`` fails its check, and what
    depends on it does not run (stage_partitions, as the runner does)."""
    runs: list[dict[str, Any]] = []
    failed: list[tuple[Stage, str | None]] = []
    for stage in STAGES:
        for p in stage_partitions(stage, prof, failed):
            ok = fail is None or p != fail
            if not ok:
                failed.append((stage, p))
            checks = [] if ok else [{"asset": "archive_file", "check": "sha256", "passed": False,
                                     "description": "sha256 mismatch\nsecond line"}]  # fmt: skip
            runs.append({"run_id": f"{len(runs):08x}-run", "success": ok, "partition": p,
                         "selection": list(stage.assets), "checks": checks, "errors": []})  # fmt: skip
    return runs


def test_live_lines_on_a_pseudo_terminal(demo_cache: DemoPaths) -> None:
    """On a terminal: one line per stage (label, partitions, bytes, rate, ETA), redrawn in place and
    cut to the terminal's width; no per-run lines."""
    n = len(load_profile(demo_cache.profile).cache_keys())  # the partitions of acquire and of extract
    out = _on_pty(python_argv(FEED, str(demo_cache.profile)), _env(), cols=100)
    assert out.rstrip().endswith("live"), out[-500:]
    assert "\r" in out and "\x1b[1A" in out and "\x1b[2K" in out  # redrawn in place (cursor up, erase line)
    text = ANSI.sub("", out)
    for label in LABELS:
        assert label in text
    assert f"0/{n} partitions" in text and f"{n}/{n} partitions" in text
    assert "MiB/s" in text or "KiB/s" in text  # the rate, IEC units (fsutil.human_bytes)
    assert "ETA " in text
    assert " run " not in text and ": ok" not in text  # successes show in the stage lines only
    lines = [ln for ln in re.split(r"[\r\n]", text) if ln.strip() and ln.strip() != "live"]
    assert max(len(ln) for ln in lines) <= 100  # never wider than the terminal: no wrapped line
    final = ANSI.sub("", out.rsplit("\x1b[2K", 1)[1]).splitlines()  # the last frame, after close()
    rows = [ln for ln in final if ln.strip() and ln.strip() != "live"]
    assert len(rows) == len(STAGES), final
    for row, label in zip(rows, LABELS, strict=True):
        assert row.startswith("✓ ") and label in row, row
        assert "ETA" not in row  # a finished stage has no ETA


@pytest.mark.parametrize("where", ["pipe", "CI"])
def test_plain_lines_when_piped_or_in_ci(demo_cache: DemoPaths, where: str) -> None:
    """Piped (or CI set, even on a terminal): one plain line per run, no escape sequence, no \\r."""
    prof = load_profile(demo_cache.profile)
    args = python_argv(FEED, str(demo_cache.profile))
    if where == "pipe":
        done = run(args, env=_env(), timeout=120)
        assert done.returncode == 0, done.tail()
        assert done.stdout.strip() == "plain"
        err = done.stderr
    else:
        out = _on_pty(args, _env(CI="true"), cols=100)
        assert out.rstrip().endswith("plain"), out[-500:]
        err = out.rstrip()[: -len("plain")]
    assert "\x1b" not in err and "\r" not in err
    lines = err.splitlines()
    assert len(lines) == len(_runs(prof))
    assert all(
        re.fullmatch(r"\[\d/\d\] [^:]+: run [0-9a-f]{8} \S+: ok( \(\d+/\d+\))?", ln) for ln in lines
    ), lines
    assert all(any(ln.startswith(f"{label}: run ") for ln in lines) for label in LABELS), lines
    k = len(prof.cache_keys())  # acquire and extract: one partition per cache key
    assert k < len(prof.archive_paths())  # a split cache key: more archives than partitions
    for asset in ("archive_file", "cache_dir"):
        ran = [ln for ln in lines if f" {asset}[" in ln]
        assert len(ran) == k and all(ln.endswith(f"/{k})") for ln in ran), ran
        assert {ln.split(f" {asset}[", 1)[1].split("]", 1)[0] for ln in ran} == set(prof.cache_keys())
    assert lines[-1].endswith(": ok") and "vin_store" in lines[-1]
    assert sum(ln.endswith(f": ok ({k}/{k})") for ln in lines) == 2  # the last of each


def test_live_failures_stay_on_screen_and_a_stage_that_never_ran_is_left_out(demo_cache: DemoPaths) -> None:
    prof = load_profile(demo_cache.profile)
    bad = prof.cache_keys_largest_first()[-1]  # an archive_file partition: a cache key
    stream = io.StringIO()
    bar = BuildProgress(prof, stream, live=True, tick=60)  # frames drawn by each run, not by the ticker
    for r in _runs(prof, fail=bad):
        bar.on_run(r)
    assert bar.status_line().startswith(LABELS[3])  # the build stops in the extract stage
    bar.close()
    out = stream.getvalue()
    text = ANSI.sub("", out)
    assert f"  archive_file[{bad}]: FAILED" in text
    assert "    check archive_file:sha256 failed: sha256 mismatch" in text and "second line" not in text
    final = [ln for ln in ANSI.sub("", out.rsplit("\x1b[2K", 1)[1]).splitlines() if ln.strip()]
    k = len(prof.cache_keys())
    assert len(final) == 4 and LABELS[4] not in text  # the store stage never ran: no line for it
    assert final[1].startswith("✗ ") and f"{k}/{k} partitions (1 failed)" in final[1]
    assert final[2].startswith("✓ ") and LABELS[2] in final[2]  # the kit needs no archive: it ran
    assert final[3].startswith("✓ ") and f"{k - 1}/{k} partitions" in final[3]  # its key was left out


def test_plain_failure_lines(demo_cache: DemoPaths) -> None:
    """Off a terminal a failed run is one FAILED line, then its failed checks and its other errors
    (the first line of each)."""
    run = {"run_id": "abcdef0123", "success": False, "partition": None, "selection": ["vin_store"],
           "checks": [{"asset": "vin_store", "check": "counts", "passed": False, "description": "x\ny"}],
           "errors": [{"step": "vin_store", "message": "x\ny"}, {"step": "vin_store", "message": "boom"}]}  # fmt: skip
    stream = io.StringIO()
    bar = BuildProgress(load_profile(demo_cache.profile), stream, live=False)
    bar.on_run(run)
    bar.close()
    assert stream.getvalue().splitlines() == [
        f"{LABELS[4]}: run abcdef01 vin_store: FAILED",
        "    check vin_store:counts failed: x",
        "    error in vin_store: boom",  # the error that only repeats the failed check is left out
    ]


def test_nothing_to_download_shows_no_download_bytes(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """The download stage counts the bytes still to download when the build starts: archives already on
    disk count none (no `0 B/11 MiB ... ETA` while nothing downloads), a partial one its missing part.
    The extract stage still counts the archive bytes it reads."""
    prof = load_profile(demo_cache.profile)
    total = sum(a.size or 0 for a in prof.archives)
    runs = _runs(prof)
    acquire = [r for r in runs if r["selection"] == ["archive_file"]]

    fresh = BuildProgress(prof, io.StringIO(), live=False, data_root=tmp_path / "empty")
    assert f"0 B/{fsutil.human_bytes(total)}" in fresh.status_line("acquire")

    root = tmp_path / "root"
    for a in prof.archives:  # every archive on disk (unverified: re-hashed locally, not downloaded)
        dst = layout.archive_path(root, a.path)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(b"\0" * (a.size or 0))
    bar = BuildProgress(prof, io.StringIO(), live=False, data_root=root)
    for r in acquire[:3]:
        bar.on_run(r)
    line = bar.status_line("acquire")
    assert f"3/{len(acquire)} partitions" in line and "B/" not in line and "ETA" not in line, line
    for r in runs[len(acquire) + 1 :][:2]:
        bar.on_run(r)
    assert f"/{fsutil.human_bytes(total)}" in bar.status_line("extract")

    part_of = prof.archives[0]
    root2 = tmp_path / "root2"
    partial = layout.partial_path(root2, part_of.path)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"\0" * 1000)
    bar2 = BuildProgress(prof, io.StringIO(), live=False, data_root=root2)
    assert f"/{fsutil.human_bytes(total - 1000)}" in bar2.status_line("acquire")


def test_progress_uses_the_one_human_bytes_and_the_library_has_no_rich(tmp_path: Path) -> None:
    assert progress.human_bytes is fsutil.human_bytes
    code = """
import importlib, pkgutil, sys
import stage2_data
from stage2_data.cli import main
for m in pkgutil.walk_packages(stage2_data.__path__, "stage2_data."):
    if not m.name.endswith(".__main__"):
        importlib.import_module(m.name)
try:
    main(["--help"])  # builds every command's parser, the plugins' too
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m.split(".")[0] == "rich"))
"""
    out = python(code, cwd=tmp_path)
    assert out.returncode == 0, out.tail()
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _streamed_run(key: str, *, archive_ok: bool = True) -> dict[str, Any]:
    """A launched build's run of one cache key (``download_and_extract``), as ``runs.run_selection``
    summarizes it: both assets materialized, or the archive's check failed and nothing after it ran."""
    done = ["archive_file", "cache_dir"] if archive_ok else []
    checks = [{"asset": "archive_file", "partition": key, "check": "sha256", "passed": archive_ok,
               "description": "ok" if archive_ok else "sha256 mismatch"}]  # fmt: skip
    errors = [] if archive_ok else [{"step": "archive_file", "partition": key, "message": "sha256 mismatch"}]
    return {"run_id": f"{abs(hash(key)):08x}-run", "job": "download_and_extract", "success": archive_ok,
            "partition": key, "partitions": {key: done}, "selection": ["archive_file", "cache_dir"],
            "checks": checks, "errors": errors, "materialized": done, "moved_aside": [],
            "store_metadata": {}}  # fmt: skip


def test_streamed_runs_keep_the_download_and_extract_stages_going_side_by_side(demo_cache: DemoPaths) -> None:
    """A launched build streams each cache key through its download and its extraction
    (``runner.stream_parts`` splits the run by stage): the extract stage advances while the
    downloads still go on, and each stage ends with its last cache key; a key whose archive failed
    counts as a failed download and is never extracted."""
    from stage2_pipelines.runner import stream_parts

    prof = load_profile(demo_cache.profile)
    keys = prof.cache_keys_largest_first()
    bad = keys[-1]
    stream = io.StringIO()
    bar = BuildProgress(prof, stream, live=False)
    bar.on_run({"run_id": "0-run", "success": True, "partition": None, "selection": ["pinned_profile"],
                "checks": [], "errors": []})  # fmt: skip
    parts_of_first = stream_parts(_streamed_run(keys[0]))
    assert [p["selection"] for p in parts_of_first] == [["archive_file"], ["cache_dir"]]
    for part in parts_of_first:
        bar.on_run(part)
    acquire, extract = bar.stages["acquire"], bar.stages["extract"]
    assert extract.done == 1 and acquire.done == 1
    assert acquire.finished is None and extract.finished is None  # side by side, both going on
    failed = stream_parts(_streamed_run(bad, archive_ok=False))
    assert [(p["selection"], p["success"]) for p in failed] == [(["archive_file"], False)]
    assert failed[0]["errors"] and failed[0]["checks"][0]["check"] == "sha256"
    for key in keys[1:-1]:
        for part in stream_parts(_streamed_run(key)):
            bar.on_run(part)
    bar.on_run(failed[0])
    assert acquire.finished is not None and acquire.failed == 1 and acquire.done == len(keys)
    assert extract.done == len(keys) - 1  # the failed key is never extracted
    bar.close()
    assert f"{LABELS[1]}: run {failed[0]['run_id'][:8]} archive_file[{bad}]: FAILED" in stream.getvalue()


def test_the_download_line_counts_the_bytes_of_downloads_still_going_on(
    demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At real scale a cache key downloads for minutes: the download stage's bytes, rate and ETA
    move with the files being written (the partial file, then the published archive), before the
    key's run reports; the run's report does not count them twice, and a partial file that was on
    disk before the build counts only what is added to it."""
    monkeypatch.setattr(progress, "LIVE_BYTES_EVERY", 0.0)
    prof = load_profile(demo_cache.profile)
    total = sum(a.size or 0 for a in prof.archives)
    key, specs = next(iter(prof.archives_by_cache_key().items()))
    a = specs[0]
    root = tmp_path / "root"
    partial = layout.partial_path(root, a.path)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"\0" * 100)  # left by an earlier build: not this build's bytes
    bar = BuildProgress(prof, io.StringIO(), live=False, data_root=root)
    remaining = total - 100
    bar.on_run({"run_id": "0-run", "success": True, "partition": None, "selection": ["pinned_profile"],
                "checks": [], "errors": []})  # fmt: skip
    acquire = bar.stages["acquire"]
    assert acquire.started is not None and bar.shown_bytes(acquire) == 0

    partial.write_bytes(b"\0" * 4100)  # the download goes on: 4000 bytes of this build
    line = bar.status_line("acquire")
    assert f"{fsutil.human_bytes(4000)}/{fsutil.human_bytes(remaining)}" in line, line
    assert "/s" in line and "ETA" in line, line

    final = layout.archive_path(root, a.path)  # done: published under its own name
    final.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(final)
    with open(final, "ab") as f:
        f.write(b"\0" * ((a.size or 0) - 4100))
    assert bar.shown_bytes(acquire) == (a.size or 0) - 100

    own = sum(max(0, (s.size or 0) - (100 if s.path == a.path else 0)) for s in specs)
    bar.on_run({"run_id": "1-run", "success": True, "partition": key, "selection": ["archive_file"],
                "checks": [], "errors": []})  # fmt: skip
    assert acquire.bytes_done == own and bar.shown_bytes(acquire) == own  # counted once
    bar.on_run({"run_id": "2-run", "success": True, "partition": key, "selection": ["archive_file"],
                "checks": [], "errors": []})  # fmt: skip
    assert acquire.bytes_done == own  # a partition reported again adds no bytes
    bar.close()


@pytest.mark.slow
def test_a_build_on_a_slow_link_shows_download_bytes_before_any_cache_key_is_done(
    demo: DemoPaths, tmp_path: Path
) -> None:
    """`stage2 build` on a terminal, its hub's link paced to 1 MB/s for every download together
    (about 11 s for the demo's archives): the download line counts bytes, with a rate and an ETA,
    while no cache key has finished yet."""
    from stage2_data.demo.hubserver import HubFaults, HubServer

    faults = HubFaults(link_rate=1_000_000)
    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision, faults=faults) as hub:
        argv = [*STAGE2, "build", "--profile", str(demo.profile), "--data-root", str(tmp_path / "root"),
                "--endpoint", hub.url]  # fmt: skip
        out = _on_pty(argv, _env(DAGSTER_HOME=str(tmp_path / "home")), cols=160)
    n = len(load_profile(demo.profile).cache_keys())
    label = LABELS[STAGES.index(ACQUIRE)]
    going = [
        ln
        for ln in re.split(r"[\r\n]", ANSI.sub("", out))
        if label in ln and f" 0/{n} partitions" in ln and "ETA" in ln and " 0 B/" not in ln
    ]
    assert going, ANSI.sub("", out)[-3000:]
    assert re.search(r"0/\d+ partitions  \d+(\.\d+)? [KM]iB/", going[0]), going[0]


def test_a_range_runs_failed_check_is_said_once_under_its_partition(demo_cache: DemoPaths) -> None:
    """A run over several partitions is shown a partition at a time: a failed check (and an error)
    comes once, under its own partition, also when the other partitions were shown while the run
    went on; a partition shown then comes again only for a problem, and is not counted twice."""
    prof = load_profile(demo_cache.profile)
    keys = prof.cache_keys()[:3]
    bad, early = keys[1], keys[2]
    selection = list(ACQUIRE.assets)
    check = {"asset": "archive_file", "check": "archive_sha256_matches_pin", "passed": False,
             "partition": bad, "description": "the pin is wrong\nmore"}  # fmt: skip
    # a failed check that does not block (the one of stage2_data.checks.NON_BLOCKING): said, the
    # partition still ok (a blocking one fails its partition: nothing after it runs)
    warn = {"asset": "archive_file", "check": "sidecars_by_source_match_expected", "passed": False,
            "partition": early, "description": "size differs"}  # fmt: skip
    run = {
        "run_id": "abcdef0123", "success": False, "selection": selection, "reported": [early],
        "partitions": {k: ([] if k == bad else selection) for k in keys},
        "checks": [check, warn, *({"asset": "archive_file", "check": "archive_sizes", "passed": True,
                                   "partition": k} for k in keys if k != early)],
        "errors": [{"step": "archive_file", "partition": bad, "message": "the pin is wrong\nmore",
                    "check": "archive_sha256_matches_pin", "asset": "archive_file"}],
    }  # fmt: skip
    stream = io.StringIO()
    bar = BuildProgress(prof, stream, live=False)
    bar.on_run(runs.partition_entry("abcdef0123", "acquire_archives", selection, early, selection))
    for entry in runner.entries_at_end(run):
        bar.on_run(entry)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines == [
        f"{LABELS[1]}: run abcdef01 archive_file[{early}]: ok (1/{len(prof.cache_keys())})",
        f"{LABELS[1]}: run abcdef01 archive_file[{keys[0]}]: ok (2/{len(prof.cache_keys())})",
        f"{LABELS[1]}: run abcdef01 archive_file[{bad}]: FAILED (3/{len(prof.cache_keys())})",
        "    check archive_file:archive_sha256_matches_pin failed: the pin is wrong",
        f"  archive_file[{early}]: ok",
        "    check archive_file:sidecars_by_source_match_expected failed: size differs",
    ]
    assert bar.stages[ACQUIRE.name].done == 3 and bar.stages[ACQUIRE.name].failed == 1


def test_a_stage_with_nothing_to_do_is_said_up_to_date_not_a_run(demo_cache: DemoPaths) -> None:
    """Off a terminal, a stage the runner found up to date (no run) is its label and "up to date",
    never a run line with no run id ("run None")."""
    from stage2_data.stages import KIT
    from stage2_pipelines.uptodate import up_to_date_summary

    stream = io.StringIO()
    bar = BuildProgress(load_profile(demo_cache.profile), stream, live=False)
    bar.on_run(up_to_date_summary(KIT))
    bar.close()
    assert stream.getvalue().splitlines() == [f"{LABELS[2]}: up to date"], stream.getvalue()
