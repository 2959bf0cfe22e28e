"""Skip what has not changed, provably: the extraction record's check (stats only) and the no-op
rebuild (a second `stage2 build` of unchanged inputs writes nothing, sends no GET, says "up to date").

The unit tests extract one cache key of the demo and change one thing at a time (an archive's
sha256, the extractor version, a file deleted, added, resized or modified); the slow tests build the
demo twice on one data root through the CLI, against the loopback hub."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.built import DEMO_FINGERPRINT as FINGERPRINT
from helpers.cli import python, run, stage2, subprocess_env
from helpers.env import environ
from helpers.faults import copy_kit
from helpers.ui_run import materialize

from stage2_data import layout
from stage2_data.acquire.state import _write_record
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.extract import check_extraction, extract_cache_dir, load_extraction_record, scan_tree
from stage2_data.extract import extract as extract_mod
from stage2_data.kit import SIDECAR_INDEX
from stage2_data.profile import Profile, load_profile
from stage2_data.stages import ACQUIRE, EXTRACT, PROFILE, STAGES, STORE
from stage2_data.steps import step_extract
from stage2_data.steps.plan import OBJECT_STORE
from stage2_data.steps.status import (
    build_status,
    record_store_stage,
    reported_extraction,
    store_stage_fingerprint,
)


# --------------------------------------------------------------------------------------------------
# the extraction record's check
# --------------------------------------------------------------------------------------------------
def _one_key(demo: DemoPaths) -> tuple[Profile, str]:
    prof = load_profile(demo.profile)
    key = next(k for k, specs in prof.archives_by_cache_key().items() if len(specs) == 1)
    return prof, key


def _verified_root(demo: DemoPaths, root: Path, prof: Profile, key: str) -> None:
    """The archives of ``key`` in ``root/archives/`` with their .verified.json records (as a
    download leaves them)."""
    for a in prof.archives_by_cache_key()[key]:
        dst = layout.archive_path(root, a.path)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(demo.upstream / a.path, dst)
        assert a.sha256
        _write_record(root, a, dst, a.sha256, (prof.source.repo_type, prof.source.repo_id, demo.revision))


def _extracted(demo_cache: DemoPaths, root: Path) -> tuple[str, dict[str, str | None], Path]:
    prof, key = _one_key(demo_cache)
    specs = prof.archives_by_cache_key()[key]
    shas: dict[str, str | None] = {a.path: a.sha256 for a in specs}
    extract_cache_dir(key, [demo_cache.upstream / a.path for a in specs], root, archive_sha256=shas)
    return key, shas, layout.cache_dir(root, key)


def _a_file(cdir: Path) -> Path:
    return sorted((cdir / layout.FRAMES_SUBDIR).iterdir())[0]


def test_an_unchanged_extraction_is_up_to_date(demo_cache: DemoPaths, tmp_path: Path) -> None:
    key, shas, cdir = _extracted(demo_cache, tmp_path)
    rec, reason = check_extraction(tmp_path, key, shas)
    assert reason is None and rec is not None
    tree = scan_tree(cdir)
    assert tree is not None
    assert (rec.files, rec.bytes, rec.tree_digest) == (tree.files, tree.bytes, tree.digest)
    assert rec.extractor_version == extract_mod.EXTRACTOR_VERSION and rec.archive_sha256 == shas


@pytest.mark.parametrize(
    "change, because",
    [
        ("sha256", r"archive \S+ changed: sha256 0{64}, extracted from [0-9a-f]{64}"),
        ("unverified", r"archive \S+ is not verified"),
        ("version", r"extracted by extractor version \d+, this is version 999"),
        ("deleted", r"holds (\d+) files, its extraction record says (?!\1)\d+"),
        ("added", r"holds (\d+) files, its extraction record says (?!\1)\d+"),
        ("resized", r"holds \d+ bytes, its extraction record says \d+"),
        ("modified", r"a file was replaced, renamed or modified since it was extracted"),
        ("no record", r"not extracted yet"),
        ("no cache dir", r"is missing"),
    ],
)
def test_a_change_is_named(
    demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, because: str
) -> None:
    """Each change makes check_extraction return why the cache directory must be re-extracted."""
    key, shas, cdir = _extracted(demo_cache, tmp_path)
    path = next(iter(shas))
    f = _a_file(cdir)
    if change == "sha256":
        shas = {path: "0" * 64}
    elif change == "unverified":
        shas = {path: None}
    elif change == "version":
        monkeypatch.setattr(extract_mod, "EXTRACTOR_VERSION", 999)
    elif change == "deleted":
        f.unlink()
    elif change == "added":
        (cdir / "stray.txt").write_bytes(b"")  # zero bytes: only the count tells
    elif change == "resized":
        with open(f, "ab") as out:
            out.write(b"\0")
    elif change == "modified":  # same size, new bytes: its mtime tells (nothing is hashed)
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    elif change == "no record":
        layout.extraction_record_path(tmp_path, key).unlink()
    elif change == "no cache dir":
        shutil.rmtree(cdir)
    _, reason = check_extraction(tmp_path, key, shas)
    assert reason is not None and re.search(because, reason), reason


def test_step_extract_skips_an_unchanged_cache_dir_and_reextracts_a_changed_one(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """step_extract: the first call extracts; the second leaves every file (inode, mtime) and the
    record alone and returns the same metadata, up to date; a deleted file is re-extracted, saying why."""
    prof, key = _one_key(demo_cache)
    _verified_root(demo_cache, tmp_path, prof, key)
    first = step_extract(prof, tmp_path, key)
    assert first.ok and first.metadata["up_to_date"] is False
    assert first.metadata["extracted_because"] == "not extracted yet"
    cdir = layout.cache_dir(tmp_path, key)
    record = layout.extraction_record_path(tmp_path, key)
    before = _stats(cdir) | _stats(record.parent)

    second = step_extract(prof, tmp_path, key)
    assert (
        second.ok and second.metadata["up_to_date"] is True and second.metadata["extracted_because"] is None
    )
    assert {k: v for k, v in second.metadata.items() if k not in ("up_to_date", "extracted_because")} == {
        k: v for k, v in first.metadata.items() if k not in ("up_to_date", "extracted_because")
    }
    assert _stats(cdir) | _stats(record.parent) == before

    _a_file(cdir).unlink()
    third = step_extract(prof, tmp_path, key)
    assert third.ok and third.metadata["up_to_date"] is False
    assert "its extraction record says" in third.metadata["extracted_because"]
    assert scan_tree(cdir) is not None and load_extraction_record(tmp_path, key) is not None
    assert (
        check_extraction(tmp_path, key, {a.path: a.sha256 for a in prof.archives_by_cache_key()[key]})[1]
        is None
    )


def test_an_older_record_is_reextracted(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """A record written before the check existed (no extractor version, no archive sha256) is not
    trusted: the cache directory is extracted again."""
    key, shas, _ = _extracted(demo_cache, tmp_path)
    path = layout.extraction_record_path(tmp_path, key)
    old = json.loads(path.read_text())
    for k in ("extractor_version", "archive_sha256", "tree_digest"):
        del old[k]
    path.write_text(json.dumps(old))
    _, reason = check_extraction(tmp_path, key, shas)
    assert reason == f"extracted by extractor version 0, this is version {extract_mod.EXTRACTOR_VERSION}"


# --------------------------------------------------------------------------------------------------
# the no-op rebuild (slow: three whole builds through the CLI)
# --------------------------------------------------------------------------------------------------
Stats = dict[str, tuple[int, int, int]]


def _stats(root: Path, *, skip: tuple[str, ...] = ()) -> Stats:
    """(inode, mtime_ns, size) of every entry under ``root`` (folders too), by relative path."""
    out: Stats = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if os.path.normpath(os.path.join(rel_dir, d)) not in skip]
        for name in dirnames + filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel in skip:
                continue
            st = os.lstat(os.path.join(dirpath, name))
            out[rel] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def _stage2_build(demo: DemoPaths, root: Path, hub: HubServer, *extra: str) -> Any:
    """`stage2 build` of the demo into ``root`` from ``hub``, its own DAGSTER_HOME (under the root);
    asserts exit 0."""
    out = stage2(
        "build",
        "--profile",
        str(demo.profile),
        "--data-root",
        str(root),
        "--endpoint",
        hub.url,
        *extra,
        env=subprocess_env(drop=("DAGSTER_HOME", "CI")),
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.tail()
    return out


def _build(demo: DemoPaths, root: Path, hub: HubServer, *extra: str) -> Any:
    # not --json: the progress display (plain lines, stderr is a pipe) is part of what is checked
    out = _stage2_build(demo, root, hub, *extra)
    m = re.search(r"^fingerprint:\s+([0-9a-f]{64})$", out.stdout, re.M)
    assert m, out.stdout
    return out, m.group(1)


def _dagster_runs(root: Path) -> int:
    """How many runs the build's instance (``<data_root>/.dagster``) holds."""
    return len(_dagster_jobs(root))


def _dagster_jobs(root: Path) -> list[str]:
    """The job of every run the build's instance holds, newest first."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(root / ".dagster")) as instance:
        return [r.job_name for r in instance.get_runs()]


def _stage_lines(out: Any) -> list[str]:
    return [ln for ln in out.stderr.splitlines() if ln.startswith("[")]


# What a build may change under the data root: the Dagster instance (DAGSTER_HOME defaults to
# <data_root>/.dagster) and the lock file, where the lock's holder writes who it is.
INSTANCE = (".dagster", layout.LOCK_FILE)


@pytest.fixture(scope="module")
def noop_rebuilt(demo_cache: DemoPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The demo built twice on one data root; what changed and what was asked of the hub."""
    root = tmp_path_factory.mktemp("noop") / "root"
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        first, fp1 = _build(demo_cache, root, hub)
        first_gets = [r for r in hub.log_snapshot() if r[0] == "GET"]
        before = _stats(root, skip=INSTANCE)
        runs_before = _dagster_runs(root)
        hub.clear_log()
        second, fp2 = _build(demo_cache, root, hub)
        after = _stats(root, skip=INSTANCE)
        yield {
            "root": root,
            "hub": hub,
            "demo": demo_cache,
            "first": first,
            "second": second,
            "fingerprints": (fp1, fp2),
            "first_gets": first_gets,
            "gets": [r for r in hub.log_snapshot() if r[0] == "GET"],
            "before": before,
            "after": after,
            "runs": (runs_before, _dagster_runs(root)),
        }


def test_noop_rebuild_writes_nothing_and_asks_nothing(noop_rebuilt: dict[str, Any]) -> None:
    r = noop_rebuilt
    assert r["fingerprints"] == (FINGERPRINT, FINGERPRINT)
    assert r["first_gets"] and r["gets"] == []  # the first build downloaded; the second sent no GET
    before, after = r["before"], r["after"]
    assert set(after) == set(before), set(after) ^ set(before)
    changed = sorted(p for p in after if after[p] != before[p])
    assert changed == []  # nothing under the data root but the instance (and the lock's holder line)
    extracted = [p for p in before if p.startswith((layout.PROCESSED_DIR + "/", layout.DERIVED_DIR + "/"))]
    assert len(extracted) > 100  # every extracted file (and folder) kept its inode and mtime


def test_the_first_builds_check_count_says_what_the_ui_adds(noop_rebuilt: dict[str, Any]) -> None:
    """The first build's summary counts each check result once and says how many verify checks its
    steps also recorded (the UI lists those beside them); a no-op build ran no check and says so."""
    from stage2_data.checks import CHECKS_BY_ASSET, STANDALONE_CHECKS

    prof = load_profile(noop_rebuilt["demo"].profile)
    per_key = {"archive_file", "cache_dir"}
    ran = sum(len(n) * (len(prof.cache_keys()) if a in per_key else 1) for a, n in CHECKS_BY_ASSET.items())
    recorded = sum(len(n) for n in STANDALONE_CHECKS.values())
    line = f"checks:       {ran}/{ran} passed (the UI lists {recorded} more: verify checks recorded"
    assert line in noop_rebuilt["first"].stdout, noop_rebuilt["first"].stdout
    assert "checks:       none run" in noop_rebuilt["second"].stdout, noop_rebuilt["second"].stdout


def test_a_noop_build_into_another_instance_names_the_one_holding_the_runs(
    noop_rebuilt: dict[str, Any], tmp_path: Path
) -> None:
    """A build with nothing to do, run with another DAGSTER_HOME (or none, where the first build
    had one): it named its own instance, which holds no run, on its `runs:` and `UI:` lines, so the
    UI pasted from it showed nothing built (QA). It names the instance that recorded the runs that
    built what is up to date; its `--reverify` hint is the whole command, which runs as pasted."""
    root, hub = noop_rebuilt["root"], noop_rebuilt["hub"]
    other = tmp_path / "other-home"
    env = subprocess_env(drop=("CI",), DAGSTER_HOME=str(other))
    r = stage2("build", "--profile", str(noop_rebuilt["demo"].profile), "--data-root", str(root),
               "--endpoint", hub.url, env=env)  # fmt: skip
    assert r.returncode == 0, r.tail()
    home = (root / ".dagster").resolve()
    assert (
        f"runs:         0 (every stage up to date; its runs are in the Dagster instance at {home})"
        in r.stdout
    )
    assert f" DAGSTER_HOME={home} make ui\n" in r.stdout, r.stdout
    m = re.search(r"^checks:       none run \(every stage up to date; `(.+)` runs them\)$", r.stdout, re.M)
    assert m and m.group(1).endswith(" --reverify"), r.stdout
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `stage2` as pasted
    again = run(
        ["bash", "-c", m.group(1)], env=subprocess_env(drop=("CI", "DAGSTER_HOME"), PATH=path), timeout=600
    )
    assert again.returncode == 0, again.tail()
    assert re.search(r"^runs:\s+[1-9]", again.stdout, re.M) and f"Dagster instance at {home}" in again.stdout


def test_the_summarys_rebuild_line_runs_as_pasted(noop_rebuilt: dict[str, Any]) -> None:
    """A build's summary ends with the command that builds it again (its instance, profile, data
    root and hub), which runs as pasted in a shell with `stage2` on its PATH: after a build, a no-op
    into the same instance; its `--reverify` hint is that command plus the option."""
    first = noop_rebuilt["first"].stdout
    m = re.search(r"^rebuild:      (.+)$", first, re.M)
    assert m, first
    assert "with --reverify it checks everything again" in first, first
    home = (noop_rebuilt["root"] / ".dagster").resolve()
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `stage2` as pasted
    again = run(
        ["bash", "-c", m.group(1)], env=subprocess_env(drop=("CI", "DAGSTER_HOME"), PATH=path), timeout=600
    )
    assert again.returncode == 0, again.tail()
    assert (
        f"runs:         0 (every stage up to date; its runs are in the Dagster instance at {home})"
        in again.stdout
    ), again.stdout
    assert f"`{m.group(1)} --reverify` runs them" in again.stdout, again.stdout
    assert f"rebuild:      {m.group(1)}\n" in again.stdout, again.stdout


def test_a_noop_build_over_a_hub_folder_declaring_another_commit_is_refused(
    noop_rebuilt: dict[str, Any], tmp_path: Path
) -> None:
    """A build with nothing to do, over a hub folder that now declares another commit than the
    profile's (its `.stage2-hub.json`): it answered "up to date" with exit 0 and printed a
    `--reverify` command and a UI whose runs that folder refuses (QA). It is refused as a build
    that runs is, naming the folder's commit; over the folder the profile was pinned from it is the
    no-op it was."""
    root, demo = noop_rebuilt["root"], noop_rebuilt["demo"]
    hub = tmp_path / "hub"
    shutil.copytree(demo.upstream, hub, copy_function=os.link)  # the same files, linked
    marker = hub / ".stage2-hub.json"
    doc = json.loads(marker.read_text())
    marker.unlink()  # a file of its own, not the upstream's marker
    marker.write_text(json.dumps({**doc, "revision": "2" * 40}))
    env = subprocess_env(drop=("DAGSTER_HOME", "CI"))
    args = ["build", "--profile", str(demo.profile), "--data-root", str(root)]
    r = stage2(*args, "--hub-folder", str(hub), env=env)
    assert r.returncode == 2, r.tail()
    assert f"the hub folder {hub} is at commit {'2' * 40}" in r.stderr, r.stderr
    assert f'Fix: set the profile\'s [source] revision to "{"2" * 40}"' in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "up to date" not in r.stdout
    ok = stage2(*args, "--hub-folder", str(demo.upstream), env=env)
    assert ok.returncode == 0, ok.tail()
    assert re.search(r"^runs:\s+0 ", ok.stdout, re.M), ok.stdout


def test_noop_rebuild_launches_no_run(noop_rebuilt: dict[str, Any]) -> None:
    """Every stage is up to date: the second build launches no Dagster run at all."""
    before, after = noop_rebuilt["runs"]
    assert before >= len(STAGES) and after == before
    assert re.search(r"^runs:\s+0 ", noop_rebuilt["second"].stdout, re.M), noop_rebuilt["second"].stdout


def test_noop_rebuild_says_up_to_date_per_stage(noop_rebuilt: dict[str, Any]) -> None:
    lines = _stage_lines(noop_rebuilt["second"])
    assert lines == [f"[{i}/{len(STAGES)}] {s.label}: up to date" for i, s in enumerate(STAGES, 1)]
    first = noop_rebuilt["first"].stderr
    assert "up to date" not in first and "cache_dir[" in first  # the first build shows its runs


def test_noop_rebuild_reports_the_store_and_every_stage_up_to_date(noop_rebuilt: dict[str, Any]) -> None:
    """A no-op rebuild answers from the library's stats (pipelines/uptodate.py): the store's
    fingerprint and counts, no run, one "up to date" line per stage."""
    r = noop_rebuilt
    code = "import sys; from stage2_data.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["build", "--profile", str(r["demo"].profile), "--data-root", str(r["root"])]
    out = python(code, *argv, "--endpoint", r["hub"].url, env=subprocess_env(drop=("DAGSTER_HOME", "CI")))
    assert out.returncode == 0, out.tail()
    assert f"fingerprint:  {FINGERPRINT}" in out.stdout
    assert re.search(r"^samples:\s+\d+  pairs: \d+  per split: \{'train': \d+", out.stdout, re.M), out.stdout
    assert re.search(r"^runs:\s+0 ", out.stdout, re.M) and out.stderr.count(": up to date") == len(STAGES)


def test_build_status_names_what_must_run(noop_rebuilt: dict[str, Any]) -> None:
    """build_status (stats only): nothing to do after the builds (once the store stage is recorded);
    a touched extracted file or kit file names the stage that must run, and every stage after it."""
    root: Path = noop_rebuilt["root"]
    prof = load_profile(noop_rebuilt["demo"].profile)
    status = build_status(prof, root)
    assert status["acquire"] is None and status["extract"] is None
    record_store_stage(prof, root)
    assert build_status(prof, root) == {s.name: None for s in STAGES}
    assert record_store_stage(prof, root) is False  # unchanged: not written again

    def touched(p: Path) -> dict[str, str | None]:
        st = p.stat()
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        try:
            return build_status(prof, root)
        finally:
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))

    def edited(p: Path) -> dict[str, str | None]:
        """One byte changed, size and mtime kept (only the ctime tells), then put back."""
        st, data = p.stat(), p.read_bytes()
        p.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        try:
            return build_status(prof, root)
        finally:
            p.write_bytes(data)
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))

    key = sorted(prof.cache_keys())[0]
    assert touched(_a_file(layout.cache_dir(root, key))) == {s.name: None for s in STAGES}  # same bytes
    got = edited(_a_file(layout.cache_dir(root, key)))
    assert got["acquire"] is None and got["store"] == "cache directories change"
    assert (got["extract"] or "").startswith(
        f"cache_dir[{key}]: {layout.cache_dir(root, key)}: a file was replaced, renamed or modified since it "
        "was extracted"
    ), got["extract"]
    assert got["profile"] == got["extract"]
    got = touched(prof.kit_file("pair_manifest"))
    assert got["extract"] is None and got["store"] is not None and "kit" in got["store"]
    # its mtime put back, its ctime is not: the kit's stats no longer match the record (until the
    # next store stage records them again)
    assert build_status(prof, root)["profile"] is not None
    record_store_stage(prof, root)
    assert build_status(prof, root) == {s.name: None for s in STAGES}


def test_a_changed_cache_dir_alone_is_reextracted(noop_rebuilt: dict[str, Any]) -> None:
    """After the no-op: one extracted file deleted; the next build re-extracts that cache directory
    only (the others keep every inode), downloads nothing, and the store is the same."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    keys = sorted(p.name for p in layout.processed_root(root).iterdir())
    victim = keys[0]
    gone = _a_file(layout.cache_dir(root, victim))
    gone.unlink()
    before = {k: _stats(layout.cache_dir(root, k)) for k in keys}
    hub.clear_log()
    out, fp = _build(noop_rebuilt["demo"], root, hub)
    assert fp == FINGERPRINT
    assert [r for r in hub.log_snapshot() if r[0] == "GET"] == []
    after = {k: _stats(layout.cache_dir(root, k)) for k in keys}
    assert gone.is_file() and after[victim] != before[victim]
    assert all(after[k] == before[k] for k in keys if k != victim)
    i = STAGES.index(EXTRACT) + 1
    assert f"[{i}/{len(STAGES)}] {EXTRACT.label}: up to date" not in out.stderr
    assert f"cache_dir[{victim}]: ok" in out.stderr


def _dry_run(demo: DemoPaths, root: Path, hub: HubServer, *extra: str) -> Any:
    return _stage2_build(demo, root, hub, "--dry-run", *extra)


def test_a_dry_run_changes_nothing_and_names_what_the_build_then_runs(
    noop_rebuilt: dict[str, Any], tmp_path: Path
) -> None:
    """`stage2 build --dry-run` says each stage's state and why it would run, touching nothing (no
    file under the data root, no Dagster run, no request to the hub); the build after it runs
    exactly the stages it named. A data root that does not exist is not created."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    demo: DemoPaths = noop_rebuilt["demo"]
    runs = _dagster_runs(root)
    hub.clear_log()
    plan = _dry_run(demo, root, hub, "--json").json()
    assert plan["dry_run"] and plan["up_to_date"], plan
    assert [(s["stage"], s["runs"]) for s in plan["stages"]] == [(s.name, False) for s in STAGES]
    assert plan["download_bytes"] == plan["extract_bytes"] == 0
    # with --store-url only the store stage runs, and that is the reason said (it said the kit or the
    # extracted data had changed: QA)
    plan = _dry_run(demo, root, hub, "--json", "--store-url", f"file://{tmp_path / 'stores'}").json()
    assert [(s["stage"], s["runs"]) for s in plan["stages"]] == [(s.name, s is STORE) for s in STAGES]
    assert [s["why"] for s in plan["stages"] if s["runs"]] == [OBJECT_STORE], plan

    victim = sorted(p.name for p in layout.processed_root(root).iterdir())[1]
    gone = _a_file(layout.cache_dir(root, victim))
    gone.unlink()
    before = _stats(root, skip=INSTANCE)
    out = _dry_run(demo, root, hub)
    assert _stats(root, skip=INSTANCE) == before and not gone.exists()  # nothing re-extracted
    assert _dagster_runs(root) == runs and hub.log_snapshot() == []
    lines = out.stdout.splitlines()
    n = len(STAGES)
    would = [s.name for i, s in enumerate(STAGES, 1) if f"[{i}/{n}] {s.label}: would run: " in out.stdout]
    assert f"[{STAGES.index(ACQUIRE) + 1}/{n}] {ACQUIRE.label}: up to date" in lines, out.stdout
    extract_line = next(ln for ln in lines if ln.startswith(f"[{STAGES.index(EXTRACT) + 1}/{n}]"))
    assert f"cache_dir[{victim}]" in extract_line, out.stdout
    assert f"a build now would run: {', '.join(would)}" in lines, out.stdout

    built, fp = _build(demo, root, hub)
    assert fp == FINGERPRINT and gone.is_file()
    assert sorted(set(s.name for s in STAGES) - set(_up_to_date(built))) == sorted(would), built.stderr

    fresh = tmp_path / "not-yet"
    plan = _dry_run(demo, fresh, hub, "--json").json()
    assert not fresh.exists(), "a dry run created the data root"
    assert all(s["runs"] and "does not exist yet" in s["why"] for s in plan["stages"]), plan
    assert plan["download_bytes"] == sum(a.size or 0 for a in load_profile(demo.profile).archives) > 0


def _contents(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, tuple[tuple[int, int, int], str]]:
    """:func:`_stats` of every entry under ``root``, with every regular file's sha256 (byte for byte)."""
    import hashlib

    out = {}
    for rel, st in _stats(root, skip=skip).items():
        p = root / rel
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
        out[rel] = (st, digest)
    return out


def test_a_dry_run_writes_no_refresh_and_says_what_the_build_refreshes(noop_rebuilt: dict[str, Any]) -> None:
    """A sidecar and an extracted file whose stats changed and whose bytes did not (a chmod, an mtime
    set back): the build's checks hash them again and refresh their records (the sidecars' index and
    record, the extraction record). The dry run rewrote those records too (QA): it writes nothing,
    every file under the data root keeps its bytes and its mtime, it names the records a build
    refreshes, and the build after it runs exactly the stages it named (a refreshed sidecar index is
    an input of the store stage; an extraction record's stats are not)."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    demo: DemoPaths = noop_rebuilt["demo"]
    _build(demo, root, hub)  # whatever an earlier test left: a no-op after it
    sidecar = sorted((root / layout.DERIVED_DIR / layout.SIDECARS_DIR).rglob("*.npz"))[0]
    sidecar.chmod(sidecar.stat().st_mode ^ 0o040)  # its ctime moves, its bytes stay
    key = sorted(p.name for p in layout.processed_root(root).iterdir())[0]
    info = layout.cache_dir(root, key) / "dataset_info.json"
    st = info.stat()
    os.utime(info, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same mtime set again: only its ctime moves
    before = _contents(root, skip=INSTANCE)
    runs = _dagster_runs(root)
    plan = _dry_run(demo, root, hub, "--json").json()
    after = _contents(root, skip=INSTANCE)
    assert sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p)) == []
    assert _dagster_runs(root) == runs
    derived = root / layout.DERIVED_DIR
    record = layout.extraction_record_path(root, key)
    assert {str(derived / SIDECAR_INDEX), str(record)} <= set(plan["refreshes"]), plan
    would = [s["stage"] for s in plan["stages"] if s["runs"]]
    assert would == [STORE.name], plan
    out = _dry_run(demo, root, hub)
    assert f"{record}" in out.stdout and "a build now would run: store" in out.stdout, out.stdout
    assert _contents(root, skip=INSTANCE) == before

    built, fp = _build(demo, root, hub)
    assert fp == FINGERPRINT
    assert sorted(set(s.name for s in STAGES) - set(_up_to_date(built))) == sorted(would), built.stderr
    rel = os.path.relpath(record, root)
    assert _contents(root, skip=INSTANCE)[rel] != before[rel]  # the build refreshed it
    again = _dry_run(demo, root, hub, "--json").json()
    assert again["up_to_date"] and again["refreshes"] == [], again


def _up_to_date(out: Any) -> list[str]:
    """The names of the stages the build says are up to date."""
    return [
        s.name for i, s in enumerate(STAGES, 1) if f"[{i}/{len(STAGES)}] {s.label}: up to date" in out.stderr
    ]


def test_a_store_modified_in_place_makes_the_store_stage_run(noop_rebuilt: dict[str, Any]) -> None:
    """The store stage's fingerprint covers every file of the published store by stats: a manifest
    edited, a file deleted or a shard touched makes the store stage (only it) run again (it writes
    nothing new, so its line may still say "up to date"); the build after that launches no run."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    demo: DemoPaths = noop_rebuilt["demo"]
    prof = load_profile(demo.profile)
    out, _ = _build(demo, root, hub)  # after the earlier tests: whatever they left is rebuilt
    assert _up_to_date(_build(demo, root, hub)[0]) == [s.name for s in STAGES]
    store = layout.current_store_path(root, prof.name).resolve()
    manifest = store / "manifest.json"

    # status only (no build): an edited manifest, a deleted file
    text = manifest.read_bytes()
    st = manifest.stat()
    assert json.loads(text)["fingerprint"] == FINGERPRINT
    manifest.write_bytes(text.replace(FINGERPRINT.encode(), b"0" * 64))  # same size, same inode
    os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns))  # its mtime set back: its ctime tells
    try:
        assert build_status(prof, root)["store"] is not None
    finally:
        manifest.write_bytes(text)
    shard = sorted(p for p in store.rglob("*") if p.is_file() and p.name != "manifest.json")[-1]
    kept = shard.read_bytes()
    shard.unlink()
    try:
        assert build_status(prof, root)["store"] is not None
    finally:
        shard.write_bytes(kept)

    # a shard touched in place (same bytes, new mtime): the store stage runs, the others do not
    out, _ = _build(demo, root, hub)  # the restored files have new inodes and mtimes: run once
    runs = _dagster_runs(root)
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    out, fp = _build(demo, root, hub)
    assert fp == FINGERPRINT
    jobs = _dagster_jobs(root)
    assert len(jobs) == runs + 1 and jobs[0] == STORE.job  # one run: the store stage's
    assert _up_to_date(out)[: len(STAGES) - 1] == [s.name for s in STAGES if s is not STORE]
    assert re.search(r"^runs:\s+1 ", out.stdout, re.M), out.stdout
    runs = _dagster_runs(root)
    out, fp = _build(demo, root, hub)  # recorded: the next build runs nothing
    assert fp == FINGERPRINT and _up_to_date(out) == [s.name for s in STAGES]
    assert _dagster_runs(root) == runs


def test_reverify_runs_every_stage(noop_rebuilt: dict[str, Any]) -> None:
    """--reverify bypasses the status: every stage runs (one Dagster run each), nothing downloaded,
    and the progress lines do not call a stage that ran "up to date"."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    demo: DemoPaths = noop_rebuilt["demo"]
    _build(demo, root, hub)
    runs = _dagster_runs(root)
    hub.clear_log()
    out, fp = _build(demo, root, hub, "--reverify")
    assert fp == FINGERPRINT
    assert _dagster_runs(root) == runs + len(STAGES)
    assert re.search(rf"^runs:\s+{len(STAGES)} ", out.stdout, re.M), out.stdout
    assert [r for r in hub.log_snapshot() if r[0] == "GET"] == []
    # every stage ran: none is said to be "up to date" (nothing to do); every cache directory was
    # extracted again from its archives (--reverify trusts no extraction record)
    assert _up_to_date(out) == [], out.stderr
    extracted = re.findall(r"^\[\d/\d\] extract cache dirs: run \w+ cache_dir\[", out.stderr, re.M)
    assert len(extracted) == len(load_profile(demo.profile).cache_keys()), out.stderr
    # the profile stage writes nothing: "nothing changed" would read as if an edit went unseen
    assert re.search(rf"^\[1/{len(STAGES)}\] {re.escape(PROFILE.label)}: checked$", out.stderr, re.M), (
        out.stderr
    )
    # the setting does what the flag does (docs/operating.md's settings); a word it does not know
    # is refused before anything runs
    env = subprocess_env(drop=("DAGSTER_HOME", "CI"), STAGE2_REVERIFY="yes")
    argv = ["build", "--profile", str(demo.profile), "--data-root", str(root), "--endpoint", hub.url]
    again = stage2(*argv, env=env)
    assert again.returncode == 0 and _dagster_runs(root) == runs + 2 * len(STAGES), again.tail()
    env["STAGE2_REVERIFY"] = "maybe"
    refused = stage2(*argv, env=env)
    assert refused.returncode == 2 and "STAGE2_REVERIFY='maybe' is not a yes or no" in refused.stderr
    assert _dagster_runs(root) == runs + 2 * len(STAGES)


@pytest.mark.parametrize("field", ["revision", "repo_id"])
def test_a_typo_in_the_pinned_source_never_stands_for_the_verified_archives(
    noop_rebuilt: dict[str, Any], field: str
) -> None:
    """Every archive verified, then the profile's [source] revision or repo_id mistyped: the hub is
    asked, as a first build asks it, and the build fails naming it; nothing is published, the
    archives and their records stay. The profile put right, the next build is a no-op again."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    demo: DemoPaths = noop_rebuilt["demo"]
    prof = load_profile(demo.profile)
    _build(demo, root, hub)
    current = layout.current_store_path(root, prof.name).resolve()
    records = {a.path: layout.verified_record_path(root, a.path).read_text() for a in prof.archives}
    old = getattr(prof.source, field)
    new = (old[:-1] + ("1" if old[-1] == "0" else "0")) if field == "revision" else old + "z"
    typo = demo.profile.with_name("profile-typo.toml")
    typo.write_text(demo.profile.read_text().replace(f'"{old}"', f'"{new}"'))
    try:
        r = stage2(
            "build", "--profile", str(typo), "--data-root", str(root), "--endpoint", hub.url,
            env=subprocess_env(drop=("DAGSTER_HOME", "CI")),
        )  # fmt: skip
    finally:
        typo.unlink()
    assert r.returncode != 0, r.tail()
    assert "BUILD FAILED" in r.stdout and new in r.stdout + r.stderr, r.tail()
    assert "was left where it is" in r.stdout + r.stderr, r.tail()
    assert "Traceback" not in r.stderr
    assert layout.current_store_path(root, prof.name).resolve() == current  # nothing published
    for a in prof.archives:  # every verified archive and its record as they were
        assert layout.archive_path(root, a.path).is_file()
        assert layout.verified_record_path(root, a.path).read_text() == records[a.path]
    # the failed build left no record to skip the stages after the archives by: they check again
    # (the extraction records are checked, nothing is extracted; the store goes through the gate).
    # The acquire step failed because the hub could not serve the mistyped source, not a check (no
    # archive was judged): the verified archives stay up to date by their records, nothing is
    # downloaded or hashed; the sidecars stay as verified; then a no-op
    hub.clear_log()
    again, fp = _build(demo, root, hub)
    assert fp == FINGERPRINT and _up_to_date(again) == ["acquire", "kit"], again.stderr
    assert not [r for r in hub.log_snapshot() if r[0] == "GET"]
    assert f"{EXTRACT.label}: checked, nothing changed" in again.stderr, again.stderr
    again, fp = _build(demo, root, hub)
    assert fp == FINGERPRINT and _up_to_date(again) == [s.name for s in STAGES], again.stderr


def _latest_check(root: Path, asset: str, check: str, partition: str) -> bool | None:
    """Whether the latest evaluation of ``check`` of ``asset[partition]`` in the data root's own
    instance passed (what the UI shows on the check's badge); None if it was never evaluated."""
    import dagster as dg

    with environ(DAGSTER_HOME=str(root / ".dagster")), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # get_event_records: 2.0 drops it
        instance = dg.DagsterInstance.get()
        records = instance.get_event_records(
            dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION), ascending=False
        )
        for rec in records:
            ev = rec.event_log_entry.dagster_event.event_specific_data
            if ev.asset_key != dg.AssetKey(asset):
                continue
            # a run over one partition records its checks without one: the run's partition
            run = instance.get_run_by_id(rec.event_log_entry.run_id)
            part = ev.partition or (run.tags.get("dagster/partition") if run else None)
            if ev.check_name == check and part == partition:
                return bool(ev.passed)
    return None


def test_a_check_failed_in_a_ui_run_runs_again_in_the_next_build(noop_rebuilt: dict[str, Any]) -> None:
    """A wrong pin tried from the UI (a run of archive_file[key] no build covers) fails
    archive_sha256_matches_pin for that key; the pin put back, the next build said every stage was
    up to date, and the UI went on showing the failed check over data that was fine. The stage whose
    check failed runs again (no download: the archive is verified), so the check passes on record;
    then builds are no-ops again."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    demo: DemoPaths = noop_rebuilt["demo"]
    prof = load_profile(demo.profile)
    _build(demo, root, hub)
    key, specs = next((k, v) for k, v in prof.archives_by_cache_key().items() if len(v) == 1)
    assert specs[0].sha256
    wrong = demo.profile.with_name("profile-wrong-pin.toml")
    wrong.write_text(demo.profile.read_text().replace(specs[0].sha256, "0" * 64))
    try:
        with environ(DAGSTER_HOME=str(root / ".dagster")):
            ran = materialize(wrong, root, hub.url, "archive_file", key)
    finally:
        wrong.unlink()
    assert not ran.success
    check = "archive_sha256_matches_pin"
    assert _latest_check(root, "archive_file", check, key) is False
    hub.clear_log()
    again, fp = _build(demo, root, hub)
    assert fp == FINGERPRINT and "acquire" not in _up_to_date(again), again.stderr
    assert f"{ACQUIRE.label}: checked, nothing changed" in again.stderr, again.stderr
    assert not [r for r in hub.log_snapshot() if r[0] == "GET"]  # nothing downloaded
    assert _latest_check(root, "archive_file", check, key) is True
    again, fp = _build(demo, root, hub)
    assert fp == FINGERPRINT and _up_to_date(again) == [s.name for s in STAGES], again.stderr


def _failing_build(profile: Path, root: Path, hub: HubServer) -> Any:
    out = stage2(
        "build", "--profile", str(profile), "--data-root", str(root), "--endpoint", hub.url,
        env=subprocess_env(drop=("DAGSTER_HOME", "CI")),
    )  # fmt: skip
    assert out.returncode == 1 and "BUILD FAILED" in out.stdout, out.tail()
    assert "Traceback" not in out.stderr and "internal error" not in out.stdout + out.stderr
    return out


def test_a_kit_file_behind_a_link_is_checked_again_when_the_file_it_names_changes(
    noop_rebuilt: dict[str, Any], tmp_path: Path
) -> None:
    """The kit's SHA256SUMS is a symbolic link to a file outside the kit (a link to a kit file is
    followed). An edit of that file, its size and mtime kept, makes the next build check the bytes
    again, as a first build does: it fails, and leaves no record by which the build after it would
    skip the check (that one fails too). The file put right, the build passes again."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    demo: DemoPaths = noop_rebuilt["demo"]
    profile = copy_kit(demo, tmp_path / "kit")
    sums = profile.parent / "manifests" / "stage2_subset_SHA256SUMS"
    outside = tmp_path / "outside" / "SHA256SUMS"
    outside.parent.mkdir()
    shutil.copyfile(sums, outside)
    sums.unlink()
    sums.symlink_to(outside)
    _, fp = _build(demo, root, hub, "--profile", str(profile))
    assert fp == FINGERPRINT
    assert _up_to_date(_build(demo, root, hub, "--profile", str(profile))[0]) == [s.name for s in STAGES]
    good = outside.read_bytes()
    st = outside.stat()
    line = good.split(b"\n", 1)[0]
    bad = (b"0" if line[:1] != b"0" else b"1") + good[1:]  # the first file's sha256, its first digit
    outside.write_bytes(bad)
    os.utime(outside, ns=(st.st_atime_ns, st.st_mtime_ns))
    record = layout.reports_dir(root) / "store_stage.json"
    assert record.is_file()
    out = _failing_build(profile, root, hub)
    assert "subset_bytes_match_sha256sums" in out.stdout, out.stdout
    assert not record.exists()  # a failed build: nothing lets the next one skip the check
    _failing_build(profile, root, hub)
    outside.write_bytes(good)
    _, fp = _build(demo, root, hub, "--profile", str(profile))
    assert fp == FINGERPRINT


def test_a_stray_entry_of_processed_datasets_fails_every_build_until_it_is_gone(
    noop_rebuilt: dict[str, Any],
) -> None:
    """An entry of ``processed_datasets/`` that is no cache key of the profile fails a first build's
    extraction report (no_stray_entries); a rebuild sees it too, by the folder's stats, and fails
    naming it, build after build, until it is gone."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    demo: DemoPaths = noop_rebuilt["demo"]
    _build(demo, root, hub)
    assert _up_to_date(_build(demo, root, hub)[0]) == [s.name for s in STAGES]
    stray = layout.processed_root(root) / "stray.txt"
    stray.write_text("x")
    try:
        for _ in range(2):
            out = _failing_build(demo.profile, root, hub)
            assert "no_stray_entries" in out.stdout and "stray.txt" in out.stdout, out.stdout
    finally:
        stray.unlink()
    _, fp = _build(demo, root, hub)
    assert fp == FINGERPRINT


def test_what_the_extraction_records_say_is_what_the_report_shows(noop_rebuilt: dict[str, Any]) -> None:
    """After a build, every extraction record says what the extraction report shows of it
    (``reported_extraction``, the entry ``write_extraction_report`` writes for each record): the
    no-op compares them, so a drift between the two would make every build check again."""
    root: Path = noop_rebuilt["root"]
    prof = load_profile(noop_rebuilt["demo"].profile)
    _build(noop_rebuilt["demo"], root, noop_rebuilt["hub"])
    shown = json.loads(layout.extraction_report_path(root).read_text())["cache_keys"]
    for key in prof.cache_keys():
        rec = load_extraction_record(root, key)
        assert rec is not None and reported_extraction(rec) == shown[key], key
    assert build_status(prof, root)["extract"] is None


def test_the_store_fingerprint_covers_what_the_records_say(noop_rebuilt: dict[str, Any]) -> None:
    """An extraction record's ``problems`` or counts, or the sidecars' index, edited with its mtime
    set back (only its bytes and ctime tell): the store stage's fingerprint is not the recorded one.
    A refresh of the record's file stats (a file touched, its bytes the same) leaves it as it was."""
    root: Path = noop_rebuilt["root"]
    prof = load_profile(noop_rebuilt["demo"].profile)
    _build(noop_rebuilt["demo"], root, noop_rebuilt["hub"])
    record_store_stage(prof, root)
    fp = store_stage_fingerprint(prof, root)
    key = sorted(prof.cache_keys())[0]
    path = layout.extraction_record_path(root, key)
    good = path.read_bytes()

    def edited(p: Path, data: bytes) -> str:
        kept, was = p.read_bytes(), p.stat()
        p.write_bytes(data)
        os.utime(p, ns=(was.st_atime_ns, was.st_mtime_ns))
        try:
            return store_stage_fingerprint(prof, root)
        finally:
            p.write_bytes(kept)
            os.utime(p, ns=(was.st_atime_ns, was.st_mtime_ns))

    doc = json.loads(good)
    for field, value in [("problems", ["an edited problem"]), ("rows", doc["rows"] + 1), ("frame_files", 0)]:
        assert edited(path, json.dumps({**doc, field: value}).encode()) != fp, field
    assert store_stage_fingerprint(prof, root) == fp  # put back: the same content
    # a touched extracted file (same bytes): its record's stats are refreshed, the fingerprint stays
    f = _a_file(layout.cache_dir(root, key))
    fst = f.stat()
    os.utime(f, ns=(fst.st_atime_ns, fst.st_mtime_ns + 1_000_000_000))
    assert build_status(prof, root)["extract"] is None and path.read_bytes() != good  # refreshed
    assert store_stage_fingerprint(prof, root) == fp
    # the sidecars' index (the join trusts its facts): by its stats, as the sidecars' record
    index = layout.derived_root(root) / SIDECAR_INDEX
    data = index.read_bytes()
    assert edited(index, data.replace(b'"size"', b'"sizf"', 1)) != fp  # same size, same mtime


@pytest.mark.parametrize("edit", ["problems", "rows"])
def test_an_edited_extraction_record_is_checked_again(noop_rebuilt: dict[str, Any], edit: str) -> None:
    """A build, then one cache key's extraction record edited (a problem added to its ``problems``,
    or its ``rows`` count changed; its mtime set back): the next build is no no-op. Its extract
    stage checks the record again, as a first build's does, and the build fails naming the cache
    key and what the record says (exit 1), build after build, until the record is put back; then
    the build passes with the clean build's fingerprint and the one after it is a no-op again."""
    root: Path = noop_rebuilt["root"]
    hub: HubServer = noop_rebuilt["hub"]
    demo: DemoPaths = noop_rebuilt["demo"]
    prof = load_profile(demo.profile)
    _build(demo, root, hub)
    assert _up_to_date(_build(demo, root, hub)[0]) == [s.name for s in STAGES]
    key = sorted(prof.cache_keys())[0]
    path = layout.extraction_record_path(root, key)
    good, st = path.read_bytes(), path.stat()
    doc = json.loads(good)
    if edit == "problems":
        doc["problems"] = [f"{layout.cache_dir(root, key)}: an edited problem"]
        says = "an edited problem"
    else:
        doc["rows"] += 1
        says = f"processed_dataset rows {doc['rows']}"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        for _ in range(2):
            out = _failing_build(demo.profile, root, hub)
            assert "up to date" not in " ".join(ln for ln in _stage_lines(out) if EXTRACT.label in ln)
            assert f"cache_dir[{key}]" in out.stdout and "cache_dir_counts_consistent" in out.stdout, (
                out.stdout
            )
            assert says in out.stdout, out.stdout
            # a blocking check failed: nothing after it runs (no store step, nothing published)
            assert "BUILD FAILED (stopped after cache_dir)" in out.stdout, out.stdout
            assert "store update:" not in out.stdout, out.stdout
            assert f"as its extraction record {path} says" in out.stdout, out.stdout
        # the fix as it says: the record moved aside, the cache directory is extracted anew
        path.rename(f"{path}.edited")
        _, fp = _build(demo, root, hub)
        assert fp == FINGERPRINT
        assert json.loads(path.read_bytes())[edit] == json.loads(good)[edit]  # written anew
    finally:
        Path(f"{path}.edited").unlink(missing_ok=True)
        if not path.exists():
            path.write_bytes(good)
    _, fp = _build(demo, root, hub)
    assert fp == FINGERPRINT
    assert _up_to_date(_build(demo, root, hub)[0]) == [s.name for s in STAGES]
