"""The fault matrix: every hostile or broken input is refused by name, nothing bad is published,
and once the cause is removed a rerun converges on the clean build's fingerprint.

Every row of ``FAULTS`` is one ``test_fault_<id>`` below (a meta-test enforces both ways), and the
README's table is rendered from ``FAULTS`` (tests/faults_table.py; a test compares it with
README.md). Faults are injected for real: hostile tars written with ``tarfile`` into a private copy
of the demo's upstream (re-pinned, so the failure is the intended one and not a sha mismatch),
HubServer faults on loopback, real ``stage2 build`` processes killed with SIGKILL, a real 8 MiB
tmpfs. Most rows run only the affected stage (``run_selection``) on a copy of a data root prepared
once per session; the process rows run whole builds.

Each row asserts (a) the run fails or a check fails, (b) the message names the culprit and the fix,
(c) no store is published and nothing changed outside the data root, (d) where the table says so,
a rerun after the fix gives the clean fingerprint without downloading verified archives again.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults_table import readme_block, render_faults_table

from stage2_data import checks as C
from stage2_data import layout
from stage2_data.acquire import HubSource, download_profile
from stage2_data.demo import DemoPaths, repin_profile, write_sidecar_sha256
from stage2_data.demo.hubserver import HubFaults, HubServer
from stage2_data.errors import ProfileError
from stage2_data.extract import extract_cache_dir
from stage2_data.hashing import sha256_file
from stage2_data.lock import DataRootLockedError, data_root_lock, read_holder
from stage2_data.profile import load_profile
from stage2_data.store import validate_vin_offline_store
from stage2_pipelines.config import BuildConfig
from stage2_pipelines.runner import FINAL_STAGE, build_all, run_selection, write_instance_yaml

REPO = Path(__file__).resolve().parent.parent
SECRET = "hf_FaultMatrixSecret_7c1d0e55b2a94f0e"  # a distinctive token: grep-able in any output
TOKEN_VAR = "STAGE2_FAULTS_TOKEN"
NOWHERE = "http://127.0.0.1:9"  # an endpoint never contacted (runs that need no hub)
SMALL = "abraranwar_libero_rfm_libero256_10"  # a small whole-tar cache key (bare member layout)
SPLIT = "jesbu1_roboarena_0825_rfm_roboarena"  # the split one: .tar.part-aa + .tar.part-ab


@dataclass(frozen=True)
class Fault:
    id: str
    category: str
    fault: str
    sees: str
    kept: str
    rerun: str


FP = "fingerprint = clean build's; no GET of a verified archive"
FAULTS: tuple[Fault, ...] = (
    # ----- network and hub ---------------------------------------------------------------------
    Fault(
        "net_drop",
        "network",
        "the connection drops mid-file",
        "nothing fails: a warning, then the download resumes with an HTTP Range request from the bytes already written (at most the client's last 10 MiB chunk is fetched again)",
        "the partial file (archives/.partial/), resumed, then verified",
        "(not needed: the run succeeds)",
    ),
    Fault(
        "net_corrupt",
        "network",
        "the server sends right-length wrong bytes",
        "check archive_sha256_matches_pin fails: sha256 mismatch for <archive>: expected, got; fix: re-run to download it again",
        "nothing: the bad download is deleted; no archive, no record",
        FP,
    ),
    Fault(
        "net_404",
        "network",
        "404 for an archive",
        "'<archive>' does not exist in <repo> at revision <commit>; fix: check the archive path, `stage2 pin`",
        "nothing (no partial file)",
        "the archive downloads; the cache key extracts",
    ),
    Fault(
        "net_bad_revision",
        "network",
        "the pinned revision does not exist on the hub",
        "revision <commit> of <repo> does not exist at <endpoint>; fix: set [source] revision to an existing commit",
        "nothing",
        "the archive downloads",
    ),
    Fault(
        "net_branch",
        "network",
        "a branch name instead of a commit in the profile",
        "`stage2 build` exits 2 before any request: key 'source.revision': 'main' is not a full 40-hex commit",
        "nothing; the data root is not even created",
        "the build starts",
    ),
    Fault(
        "net_unreachable",
        "network",
        "the hub is unreachable",
        "after 5 attempts with backoff: hub unreachable at <endpoint> (ConnectError); fix: check the network and --endpoint",
        "nothing",
        "not rerun here: nothing is kept to repair (the download itself is net_404's rerun)",
    ),
    # ----- archives ----------------------------------------------------------------------------
    Fault(
        "arc_truncated",
        "archive",
        "a truncated archive (pinned as such upstream)",
        "archive <name> is truncated or corrupt: member <m> needs bytes up to N but the data ends at M",
        "the verified download; nothing extracted",
        FP + " (the repaired archive is downloaded again)",
    ),
    Fault(
        "arc_missing_part",
        "archive",
        "a split archive missing a part (locally, or left out of the profile)",
        "split part <base>.part-ab is missing; or: truncated or corrupt, 'the split parts (…part-aa) may be incomplete, missing or out of order'",
        "the parts present; nothing extracted",
        "the part downloads; the cache key extracts",
    ),
    Fault(
        "arc_parts_order",
        "archive",
        "split parts out of order",
        "listed out of order in the profile: nothing, parts are read in name order; contents swapped upstream: truncated or corrupt, 'may be … out of order'",
        "the verified parts; nothing extracted",
        "the repaired parts download again (the verified ones are not) and extract",
    ),
    Fault(
        "arc_absolute",
        "archive",
        "a member with an absolute path",
        "unsafe archive <name>: member '/…' has an absolute path. Nothing was extracted. Fix: … if it is the pinned upstream file, list it under [[quarantined]] and report it upstream",
        "the verified download; no cache directory, no temp folder",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_dotdot",
        "archive",
        "a member with `..`",
        "unsafe archive <name>: member '<key>/../../…' has a '..' path component",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_link",
        "archive",
        "a symlink or a hard link pointing outside",
        "member '…' is a symbolic link (-> '/etc/passwd'); links are refused (hard links likewise)",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_device",
        "archive",
        "a device or FIFO member",
        "member '…' is a character device / is a FIFO",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_duplicate",
        "archive",
        "a duplicate member",
        "member '…' is a duplicate: same path as the earlier member '…'",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_extra_top",
        "archive",
        "an extra top-level folder that is not the cache key",
        "member 'other_folder/…' is outside the cache directory: top-level entry 'other_folder' is neither <key> nor processed_datasets/<key>",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_info_totals",
        "archive",
        "`dataset_info.json` totals disagree with the files",
        "check cache_dir_counts_consistent fails: <key>: dataset_info.json total_trajectories=N+1 but N frame files; a later run of the final stage fails extraction_report the same way",
        "the extracted folder (for inspection); no store",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    # ----- kit ---------------------------------------------------------------------------------
    Fault(
        "kit_sidecar_tar_sha",
        "kit",
        "the sidecar tar's sha256 does not match its .sha256",
        "check sidecar_tar_sha256_matches fails: sha256 mismatch for <tar>: expected, got; fix: re-copy it from the kit",
        "the sidecars unpacked before; nothing downstream runs",
        "every check before the store passes again",
    ),
    Fault(
        "kit_bad_json",
        "kit",
        "a malformed JSON line",
        "check join_has_no_problems fails: <pairs file>:<line>: malformed JSON (…)",
        "no store",
        FP,
    ),
    Fault(
        "kit_dup_pair",
        "kit",
        "a duplicate pair id",
        "<pairs file>:<line>: duplicate pair_id 'p…' (first on line N)",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_leak",
        "kit",
        "a trajectory used in two splits",
        "<pairs file>:<line>: leakage: trajectory <id> is used by a 'val' pair here and by a 'train' pair on line N",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_missing_sidecar",
        "kit",
        "a recovered row whose sidecar is missing",
        "<manifest>:<line>: trajectory <id> is 'recovered' but its sidecar <path> is missing",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_unknown_sidecar",
        "kit",
        "a sidecar for an unknown trajectory",
        "<path>: sidecar file for trajectory <id> that no action manifest row names",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_sidecar_width",
        "kit",
        "a sidecar whose width contradicts its source",
        "<sidecar> (trajectory <id>, <manifest>:<line>): raw action width 7 contradicts source 'roboarena' width 8",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_sha256sums",
        "kit",
        "a `SHA256SUMS` digest that does not match",
        "check subset_bytes_match_sha256sums fails: <frames file>: expected <digest>, actual <digest>",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_frames_npz",
        "kit",
        "a frames `.npz` with the wrong dtype or shape (in the archive, with SHA256SUMS agreeing)",
        "check store_opens_with_strict_reader fails: <frames file>: 'frames' has dtype float32; expected uint8 / has shape (T, H, W, 4); expected (T, H, W, 3)",
        "no store, no staging folder",
        FP + " (the repaired archive is downloaded again)",
    ),
    Fault(
        "kit_npz_object",
        "kit",
        "an `.npz` holding object arrays (never unpickled)",
        "<sidecar>: key(s) aligned_actions hold object (pickled) arrays; refused, not unpickled",
        "no store; the pickle's payload never ran",
        "every check before the store passes again",
    ),
    # ----- profile -----------------------------------------------------------------------------
    Fault(
        "prof_unknown_key",
        "profile",
        "an unknown key",
        "`stage2 build` exits 2: invalid profile <file>: unknown key 'bogus'; remove it or check its spelling",
        "nothing; the data root is not created",
        "the build starts",
    ),
    Fault(
        "prof_quarantined_active",
        "profile",
        "a quarantined path also listed as active",
        "quarantined[0].path: '<file>' is also listed under [[archives]] … remove one of the two entries",
        "nothing",
        "the build starts",
    ),
    Fault(
        "prof_dotdot",
        "profile",
        "a path with `..`",
        "key 'archives[0].path': '../…' contains '..'; use a plain relative path (kit paths likewise)",
        "nothing",
        "the build starts",
    ),
    Fault(
        "prof_totals",
        "profile",
        "expected totals that the data does not reach",
        "check trajectories_match_expected fails: trajectories is N, expected N+1 (fix the data, or the profile's [expected] table)",
        "no store",
        "fingerprint = clean build's",
    ),
    # ----- process -----------------------------------------------------------------------------
    Fault(
        "proc_kill_extract",
        "process",
        "`stage2 build` killed with SIGKILL during extraction, while the 3rd cache key's temp folder is being filled (sent by the process to itself from an audit hook: the demo's keys extract in milliseconds, too fast to hit from outside)",
        "the process dies (exit -9)",
        "the keys already extracted; the half-written .<key>.tmp-<pid> folder (never read, removed by the rerun); no store",
        FP + " (whole `stage2 build`)",
    ),
    Fault(
        "proc_kill_store",
        "process",
        "`stage2 build` killed with SIGKILL while it writes the store (when the staging folder appears)",
        "the process dies (exit -9)",
        "everything up to the store; the staging folder .v1-….tmp-… (removed by the rerun); no `current`",
        FP + " (whole `stage2 build`)",
    ),
    Fault(
        "proc_two_builds",
        "process",
        "two builds started at once on one data root",
        "the second exits 2 at once: data root <dir> is in use by another build: pid N …; fix: wait for it (or kill N)",
        "the first build's work, untouched",
        "the rerun of the row above completes (the second build changed nothing)",
    ),
    Fault(
        "proc_disk_full",
        "process",
        "the disk runs out during a write (a real 64 MiB tmpfs mounted for the test, filled up while the download waits to retry; needs root, else skipped)",
        "disk full while writing <partial file> (<archive>); fix: free disk space and re-run; the download resumes",
        "the partial file",
        "the download resumes (HTTP Range) and verifies",
    ),
    # ----- secrets -----------------------------------------------------------------------------
    Fault(
        "secret_token",
        "secrets",
        "a hub token given through the environment (--token-env)",
        "never shown: not in stdout/stderr, the Dagster event log or metadata, error messages (404, 401), the lock file, the store's manifest, or any file of the data root",
        "—",
        "the builds above ran with it",
    ),
)


# ================================================================================================
# Fixtures and helpers
# ================================================================================================
@dataclass
class Prepared:
    root: Path  # a fully extracted data root (archives verified, sidecars unpacked), no store
    home: Path  # the Dagster instance of these tests
    fingerprint: str  # of the clean store built from `root`
    profile_name: str
    demo: DemoPaths
    background: subprocess.Popen[str] | None


def _env_for_subprocess(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", TOKEN_VAR)}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=str(REPO), **extra)
    return env


_UNREACHABLE_SCRIPT = """
import json, sys
from stage2_pipelines.runner import run_selection
r = run_selection(json.loads(sys.argv[1]), ["archive_file"], sys.argv[2])
print(json.dumps(r))
"""


@pytest.fixture(scope="session")
def prepared(demo_cache: DemoPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prepared]:
    """Download and extract the small demo once with the library, then build its store once
    through Dagster (the clean fingerprint). Also starts, in the background, the one slow row (an
    unreachable hub: 5 attempts with backoff), whose test collects it."""
    base = tmp_path_factory.mktemp("faults")
    home = base / "dagster_home"
    write_instance_yaml(home)
    # the unreachable hub: a closed port, its own instance; mostly sleeping in backoff
    bg_root = base / "unreachable_root"
    bg_cfg = BuildConfig(str(demo_cache.profile), str(bg_root), endpoint=NOWHERE).to_dict()
    bg_home = base / "unreachable_home"
    write_instance_yaml(bg_home)
    bg = subprocess.Popen(
        [sys.executable, "-c", _UNREACHABLE_SCRIPT, json.dumps(bg_cfg), f"{SMALL}.tar"],
        cwd=REPO,
        env=_env_for_subprocess(bg_home, STAGE2_RUN_LOG_LEVEL="CRITICAL"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    root = base / "root"
    prof = load_profile(demo_cache.profile)
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
            download_profile(prof, HubSource.from_profile(prof, endpoint=hub.url), root)
        for key, specs in prof.archives_by_cache_key().items():
            extract_cache_dir(key, [layout.archive_path(root, a.path) for a in specs], root)
        clean = base / "clean"
        shutil.copytree(root, clean, symlinks=True)
        r = run_selection(_cfg(demo_cache, clean), FINAL_STAGE)
        assert r["success"], r
        # the sidecars are unpacked once here, so that copies of `root` carry them
        shutil.copytree(clean / layout.DERIVED_DIR, root / layout.DERIVED_DIR, symlinks=True)
        manifest = json.loads((layout.current_store_path(clean, prof.name) / "manifest.json").read_text())
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old
    yield Prepared(root, home, manifest["fingerprint"], prof.name, demo_cache, bg)
    if bg.poll() is None:
        bg.kill()
        bg.wait()


@pytest.fixture(autouse=True)
def _instance(prepared: Prepared, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(prepared.home))
    monkeypatch.setenv("STAGE2_RUN_LOG_LEVEL", "CRITICAL")


def _cfg(demo: DemoPaths, root: Path, url: str = NOWHERE, **kw: Any) -> dict[str, Any]:
    return BuildConfig(profile_path=str(demo.profile), data_root=str(root), endpoint=url, **kw).to_dict()


def _hub(demo: DemoPaths, **kw: Any) -> HubServer:
    return HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision, **kw)


def copy_root(prepared: Prepared, dst: Path) -> Path:
    shutil.copytree(prepared.root, dst, symlinks=True, ignore=shutil.ignore_patterns("stores", ".dagster"))
    return dst


def forget_archive(root: Path, path: str) -> None:
    """Remove a verified archive (and its record) from a data root, so the next run downloads it."""
    layout.archive_path(root, path).unlink()
    layout.verified_record_path(root, path).unlink()


def outside(base: Path, *inside: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file under ``base`` except under ``inside`` (data roots)."""
    skip = [p.resolve() for p in inside]
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        d = Path(dirpath).resolve()
        if any(d == s or d.is_relative_to(s) for s in skip):
            dirnames[:] = []
            continue
        for name in filenames:
            st = os.lstat(Path(dirpath) / name)
            out[str(Path(dirpath, name).relative_to(base))] = (st.st_size, st.st_mtime_ns)
    return out


def said(r: dict[str, Any]) -> str:
    """Everything a user is told about a failed run: failed checks and step errors."""
    parts = [f"{c['check']}: {c['description']}" for c in r.get("checks", []) if not c["passed"]]
    parts += [e["message"] for e in r.get("errors", [])]
    return "\n".join(parts)


def refused(r: dict[str, Any], *names: str, check: str | None = None) -> str:
    """(a) the run failed; (b) the message names every one of ``names``; returns the message."""
    text = said(r)
    assert not r["success"], r
    assert text, r
    for n in names:
        assert n in text, f"{n!r} not named in:\n{text}"
    if check is not None:
        assert any(c["check"] == check and not c["passed"] for c in r["checks"]), text
    return text


def no_store(root: Path) -> None:
    """(c) nothing under stores/: no store, no `current`, no staging folder."""
    assert not (root / layout.STORES_DIR).exists(), sorted(p.name for p in (root / "stores").rglob("*"))


def resolve_gets(hub: HubServer) -> list[str]:
    return [p.rsplit("/", 1)[-1] for m, p, _ in hub.log_snapshot() if m == "GET" and "/resolve/" in p]


def converge(prepared: Prepared, cfg: dict[str, Any], root: Path, runs: list[tuple[str, str | None]]) -> None:
    """(d) rerun the given stages (asset, partition), then the final stage; the store's fingerprint
    must be the clean build's."""
    for asset, part in runs:
        r = run_selection(cfg, [asset], part)
        assert r["success"], said(r)
    r = run_selection(cfg, FINAL_STAGE)
    assert r["success"], said(r)
    manifest = json.loads(
        (layout.current_store_path(root, prepared.profile_name) / "manifest.json").read_text()
    )
    assert manifest["fingerprint"] == prepared.fingerprint


Member = tuple[tarfile.TarInfo, bytes | None]


def read_members(*paths: Path) -> list[Member]:
    data = b"".join(p.read_bytes() for p in paths)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        out: list[Member] = []
        for m in tf.getmembers():
            f = tf.extractfile(m) if m.isreg() else None
            out.append((m, f.read() if f is not None else None))
    return out


def write_members(path: Path, members: list[Member]) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for m, data in members:
            tf.addfile(m, io.BytesIO(data) if data is not None else None)


def member(name: str, data: bytes | None = b"x", **kw: Any) -> Member:
    ti = tarfile.TarInfo(name)
    ti.mtime = 1724587200
    if data is not None:
        ti.size = len(data)
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti, data


def hostile_archive(demo: DemoPaths, key: str, edit: Callable[[list[Member], str], list[Member]]) -> str:
    """Rewrite the whole tar of ``key`` in the private upstream with ``edit(members, top)`` and
    re-pin the profile; returns the archive's path."""
    path = f"{key}.tar"
    f = demo.upstream / path
    members = read_members(f)
    top = next(m.name for m, _ in members if m.isdir()).split("/")[0]
    if top == layout.PROCESSED_DIR:
        top = f"{layout.PROCESSED_DIR}/{key}"
    write_members(f, edit(members, top))
    repin_profile(demo)
    return path


# ================================================================================================
# The table, and its README copy
# ================================================================================================
def test_every_row_has_a_test_and_every_test_a_row() -> None:
    ids = [f.id for f in FAULTS]
    assert len(ids) == len(set(ids))
    tests = {
        n.removeprefix("test_fault_")
        for n, v in globals().items()
        if n.startswith("test_fault_") and callable(v)
    }
    assert tests == set(ids)
    assert {f.category for f in FAULTS} <= {"network", "archive", "kit", "profile", "process", "secrets"}
    for f in FAULTS:
        assert f.fault and f.sees and f.kept and f.rerun, f.id


def test_readme_table_is_rendered_from_the_faults() -> None:
    block = readme_block(REPO / "README.md")
    rendered = render_faults_table(FAULTS)
    assert block == rendered, (
        "README.md's fault table (between <!-- faults:begin --> and <!-- faults:end -->) differs from "
        "FAULTS; paste the output of `python tests/faults_table.py` there"
    )


# ================================================================================================
# Network and hub
# ================================================================================================
def test_fault_net_drop(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    # The client hands bytes over in 10 MiB chunks: a drop resumes from the last whole chunk, so
    # the archive is padded (a 12 MiB member, re-pinned) for the drop to come after the first one.
    pad = np.random.default_rng(7).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes()
    victim = hostile_archive(demo, SMALL, lambda ms, top: ms + [member(f"{top}/padding.bin", pad)])
    root = copy_root(prepared, tmp_path / "root")
    forget_archive(root, victim)
    size = (demo.upstream / victim).stat().st_size
    drop = 11 << 20
    before = outside(tmp_path, root)
    with _hub(demo, faults=HubFaults(drop_after={victim: drop})) as hub:
        r = run_selection(_cfg(demo, root, hub.url), ["archive_file"], victim)
        assert r["success"], said(r)
        gets = [rng for m, rng in hub.file_requests(victim) if m == "GET"]
    # resumed from what was received (at most the client's last 10 MiB chunk again), not restarted
    assert len(gets) == 2 and gets[0] is None and gets[1] is not None, gets
    start = int(gets[1].removeprefix("bytes=").removesuffix("-"))
    assert (10 << 20) <= start <= drop, gets
    assert sha256_file(layout.archive_path(root, victim)) == load_profile(demo.profile).archive(victim).sha256
    assert not layout.partial_path(root, victim).exists()
    assert outside(tmp_path, root) == before
    assert run_selection(_cfg(demo, root), ["cache_dir"], SMALL)["success"]
    assert size > drop


def test_fault_net_corrupt(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    forget_archive(root, victim)
    before = outside(tmp_path, root)
    with _hub(demo, faults=HubFaults(corrupt={victim})) as hub:
        cfg = _cfg(demo, root, hub.url)
        r = run_selection(cfg, ["archive_file"], victim)
        refused(r, victim, "sha256 mismatch", "Fix:", "download it again", check=C.ARCHIVE_SHA256_MATCHES_PIN)
        assert not layout.archive_path(root, victim).exists()
        assert not layout.partial_path(root, victim).exists()
        assert outside(tmp_path, root) == before
        hub.faults.corrupt.clear()
        hub.clear_log()
        converge(prepared, cfg, root, [("archive_file", victim), ("cache_dir", SMALL)])
        assert resolve_gets(hub) == [victim]  # only the one that was not verified


def test_fault_net_404(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    forget_archive(root, victim)
    before = outside(tmp_path, root)
    with _hub(demo, faults=HubFaults(missing={victim})) as hub:
        cfg = _cfg(demo, root, hub.url)
        r = run_selection(cfg, ["archive_file"], victim)
        refused(r, victim, "does not exist", demo.revision, "Fix:", "stage2 pin")
        assert not layout.archive_path(root, victim).exists()
        assert not layout.partial_path(root, victim).exists()
        assert outside(tmp_path, root) == before
        hub.faults.missing.clear()
        assert run_selection(cfg, ["archive_file"], victim)["success"]
        assert run_selection(cfg, ["cache_dir"], SMALL)["success"]


def test_fault_net_bad_revision(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    forget_archive(root, victim)
    good = demo.profile.read_text()
    absent = "0123456789abcdef0123456789abcdef01234567"
    demo.profile.write_text(good.replace(demo.revision, absent))
    before = outside(tmp_path, root)
    with _hub(demo) as hub:
        cfg = _cfg(demo, root, hub.url)
        r = run_selection(cfg, ["archive_file"], victim)
        refused(r, absent, "does not exist", "Fix:", "[source] revision")
        assert not layout.archive_path(root, victim).exists()
        assert outside(tmp_path, root) == before
        demo.profile.write_text(good)
        assert run_selection(cfg, ["archive_file"], victim)["success"]


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stage2_data.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )


def _profile_refused(demo: DemoPaths, tmp_path: Path, bad_text: str, *names: str) -> None:
    """`stage2 build` on a broken profile: exit 2, one line naming the key and file, nothing written."""
    good = demo.profile.read_text()
    demo.profile.write_text(bad_text)
    before = outside(tmp_path)
    root = tmp_path / "root"
    out = _cli("build", "--profile", str(demo.profile), "--data-root", str(root), "--endpoint", NOWHERE)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    for n in (str(demo.profile), "Fix:", *names):
        assert n in out.stderr, f"{n!r} not in {out.stderr}"
    assert not root.exists()
    assert outside(tmp_path) == before
    with pytest.raises(ProfileError):  # build_all itself refuses too, before it takes the lock
        build_all(BuildConfig(str(demo.profile), str(root), endpoint=NOWHERE))
    assert not root.exists()
    demo.profile.write_text(good)
    load_profile(demo.profile)


def test_fault_net_branch(demo: DemoPaths, tmp_path: Path) -> None:
    text = demo.profile.read_text().replace(f'revision = "{demo.revision}"', 'revision = "main"')
    _profile_refused(demo, tmp_path, text, "source.revision", "'main'", "40-hex")


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


# ================================================================================================
# Archives
# ================================================================================================
def _extract_refused(
    prepared: Prepared,
    demo: DemoPaths,
    tmp_path: Path,
    key: str,
    paths: list[str],
    *names: str,
    check: str | None = None,
) -> tuple[dict[str, Any], Path, dict[str, Any]]:
    """Download the (re-pinned) archive(s) of ``key`` and extract them: the extraction must be refused."""
    root = copy_root(prepared, tmp_path / "root")
    for p in paths:
        forget_archive(root, p)
    shutil.rmtree(layout.cache_dir(root, key))
    before = outside(tmp_path, root)
    with _hub(demo) as hub:
        cfg = _cfg(demo, root, hub.url)
        for p in paths:
            r = run_selection(cfg, ["archive_file"], p)
            assert r["success"], said(r)
    r = run_selection(_cfg(demo, root), ["cache_dir"], key)
    refused(r, *names, check=check)
    assert outside(tmp_path, root) == before
    no_store(root)
    return r, root, _cfg(demo, root)


def _rerun_archive(demo: DemoPaths, root: Path, saved: dict[Path, bytes], paths: list[str], key: str) -> None:
    """Put the upstream file(s) and the profile back: the repaired archive(s), and only they, are
    downloaded again, and the cache key extracts."""
    for p, data in saved.items():
        p.write_bytes(data)
    with _hub(demo) as hub:
        cfg = _cfg(demo, root, hub.url)
        for path in paths:
            assert run_selection(cfg, ["archive_file"], path)["success"]
        r = run_selection(cfg, ["cache_dir"], key)
        assert r["success"] and all(c["passed"] for c in r["checks"]), said(r)
        assert sorted(resolve_gets(hub)) == sorted(paths)


def _unsafe(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path, extra: Callable[[str], list[Member]], *names: str
) -> None:
    saved = _save(demo.upstream / f"{SMALL}.tar", demo.profile)
    path = hostile_archive(demo, SMALL, lambda ms, top: ms + extra(top))
    _, root, cfg = _extract_refused(
        prepared,
        demo,
        tmp_path,
        SMALL,
        [path],
        f"unsafe archive {path}",
        "Nothing was extracted",
        "Fix:",
        "[[quarantined]]",
        *names,
    )
    proc = layout.processed_root(root)
    assert not layout.cache_dir(root, SMALL).exists()
    assert not [p.name for p in proc.iterdir() if p.name.startswith(".")]  # no temp folder left
    # the files a hostile member aims at were never written
    assert not (tmp_path / "evil").exists() and not (root / "evil").exists()
    _rerun_archive(demo, root, saved, [path], SMALL)


def test_fault_arc_absolute(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    evil = str(tmp_path / "evil")
    _unsafe(prepared, demo, tmp_path, lambda top: [member(evil)], repr(evil), "has an absolute path")


def test_fault_arc_dotdot(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    _unsafe(prepared, demo, tmp_path, lambda top: [member(f"{top}/../../evil")], "/../../evil", "'..'")


def test_fault_arc_link(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    def links(top: str) -> list[Member]:
        return [
            member(f"{top}/frames/evil", None, type=tarfile.SYMTYPE, linkname="/etc/passwd"),
            member(f"{top}/evil_hard", None, type=tarfile.LNKTYPE, linkname="../../../etc/passwd"),
        ]

    _unsafe(
        prepared,
        demo,
        tmp_path,
        links,
        "is a symbolic link",
        "/etc/passwd",
        "is a hard link",
        "links are refused",
    )


def test_fault_arc_device(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    def devices(top: str) -> list[Member]:
        return [
            member(f"{top}/evil_dev", None, type=tarfile.CHRTYPE, devmajor=1, devminor=3),
            member(f"{top}/evil_fifo", None, type=tarfile.FIFOTYPE),
        ]

    _unsafe(prepared, demo, tmp_path, devices, "evil_dev", "is a character device", "evil_fifo", "is a FIFO")


def test_fault_arc_duplicate(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    def dup(top: str) -> list[Member]:
        return [member(f"{top}/dataset_info.json", b'{"total_trajectories": 1}')]

    _unsafe(prepared, demo, tmp_path, dup, "dataset_info.json", "is a duplicate")


def test_fault_arc_extra_top(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    def extra(top: str) -> list[Member]:
        return [member("other_folder", None, type=tarfile.DIRTYPE), member("other_folder/x.json", b"{}")]

    _unsafe(prepared, demo, tmp_path, extra, "other_folder", "outside the cache directory", SMALL)


def test_fault_arc_truncated(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    path = f"{SMALL}.tar"
    f = demo.upstream / path
    original = f.read_bytes()
    f.write_bytes(original[: len(original) // 2 + 100])
    repin_profile(demo)
    _, root, _ = _extract_refused(
        prepared, demo, tmp_path, SMALL, [path], path, "truncated or corrupt", "Fix:", "download it again"
    )
    assert not layout.cache_dir(root, SMALL).exists()
    f.write_bytes(original)
    repin_profile(demo)
    with _hub(demo) as hub:
        cfg = _cfg(demo, root, hub.url)
        converge(prepared, cfg, root, [("archive_file", path), ("cache_dir", SMALL)])
        assert resolve_gets(hub) == [path]


def test_fault_arc_missing_part(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    aa, ab = f"{SPLIT}.tar.part-aa", f"{SPLIT}.tar.part-ab"
    root = copy_root(prepared, tmp_path / "root")
    forget_archive(root, ab)
    shutil.rmtree(layout.cache_dir(root, SPLIT))
    before = outside(tmp_path, root)
    r = run_selection(_cfg(demo, root), ["cache_dir"], SPLIT)
    refused(r, ab, "missing", "Fix:", "download it again")
    # left out of the profile: the parts present are read as one (truncated) stream
    good = demo.profile.read_text()
    block = good[good.index(f'path = "{ab}"') - len("[[archives]]\n") :]
    block = block[: block.index("\n\n") + 2]
    demo.profile.write_text(good.replace(block, ""))
    r = run_selection(_cfg(demo, root), ["cache_dir"], SPLIT)
    refused(r, f"{SPLIT}.tar", "truncated or corrupt", aa, "missing or out of order", "Fix:")
    demo.profile.write_text(good)
    assert not layout.cache_dir(root, SPLIT).exists()
    assert outside(tmp_path, root) == {
        **before,
        "demo/kit/profile.toml": outside(tmp_path, root)["demo/kit/profile.toml"],
    }
    no_store(root)
    with _hub(demo) as hub:
        cfg = _cfg(demo, root, hub.url)
        assert run_selection(cfg, ["archive_file"], ab)["success"]
        assert run_selection(cfg, ["cache_dir"], SPLIT)["success"]
        assert resolve_gets(hub) == [ab]


def test_fault_arc_parts_order(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    aa, ab = f"{SPLIT}.tar.part-aa", f"{SPLIT}.tar.part-ab"
    root = copy_root(prepared, tmp_path / "root")
    # 1. listed out of order in the profile: name order is used, the extraction is the clean one
    good = demo.profile.read_text()
    i_aa = good.index(f'path = "{aa}"') - len("[[archives]]\n")
    i_ab = good.index(f'path = "{ab}"') - len("[[archives]]\n")
    blk_aa = good[i_aa : good.index("\n\n", i_aa) + 2]
    blk_ab = good[i_ab : good.index("\n\n", i_ab) + 2]
    swapped = good.replace(blk_aa, "@@AA@@").replace(blk_ab, blk_aa).replace("@@AA@@", blk_ab)
    demo.profile.write_text(swapped)
    assert [a.path for a in load_profile(demo.profile).archives].index(ab) < [
        a.path for a in load_profile(demo.profile).archives
    ].index(aa)
    r = run_selection(_cfg(demo, root), ["cache_dir"], SPLIT)
    assert r["success"], said(r)
    clean = {p.name: sha256_file(p) for p in (layout.cache_dir(prepared.root, SPLIT) / "frames").iterdir()}
    assert {p.name: sha256_file(p) for p in (layout.cache_dir(root, SPLIT) / "frames").iterdir()} == clean
    demo.profile.write_text(good)
    # 2. contents swapped upstream (each part holds the other's bytes), pinned as such
    a_bytes, b_bytes = (demo.upstream / aa).read_bytes(), (demo.upstream / ab).read_bytes()
    (demo.upstream / aa).write_bytes(b_bytes)
    (demo.upstream / ab).write_bytes(a_bytes)
    repin_profile(demo)
    shutil.rmtree(root)
    _, root, _ = _extract_refused(
        prepared,
        demo,
        tmp_path,
        SPLIT,
        [aa, ab],
        f"{SPLIT}.tar",
        "truncated or corrupt",
        "out of order",
        "Fix:",
    )
    (demo.upstream / aa).write_bytes(a_bytes)
    (demo.upstream / ab).write_bytes(b_bytes)
    repin_profile(demo)
    with _hub(demo) as hub:
        cfg = _cfg(demo, root, hub.url)
        for asset, part in (("archive_file", aa), ("archive_file", ab), ("cache_dir", SPLIT)):
            assert run_selection(cfg, [asset], part)["success"]
        assert sorted(resolve_gets(hub)) == [aa, ab]


def test_fault_arc_info_totals(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    def bump(ms: list[Member], top: str) -> list[Member]:
        out = []
        for m, data in ms:
            if m.name == f"{top}/dataset_info.json":
                doc = json.loads(data or b"{}")
                doc["total_trajectories"] += 1
                data = json.dumps(doc).encode()
                m.size = len(data)
            out.append((m, data))
        return out

    saved = _save(demo.upstream / f"{SMALL}.tar", demo.profile)
    path = hostile_archive(demo, SMALL, bump)
    n = len(load_profile(demo.profile).archives_by_cache_key()[SMALL])
    assert n == 1
    r, root, cfg = _extract_refused(
        prepared,
        demo,
        tmp_path,
        SMALL,
        [path],
        SMALL,
        "dataset_info.json",
        "total_trajectories",
        check=C.CACHE_DIR_COUNTS_CONSISTENT,
    )
    # run on its own (as from the UI), the final stage refuses too: nothing is published
    r = run_selection(cfg, FINAL_STAGE)
    refused(r, SMALL, "dataset_info.json")
    assert "vin_store" not in r["materialized"]
    no_store(root)
    _rerun_archive(demo, root, saved, [path], SMALL)


# ================================================================================================
# Kit
# ================================================================================================
def _final_refused(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path, *names: str, check: str | None = None
) -> tuple[dict[str, Any], Path]:
    root = copy_root(prepared, tmp_path / "root")
    before = outside(tmp_path, root)
    r = run_selection(_cfg(demo, root), FINAL_STAGE)
    text = refused(r, *names, check=check)
    assert "vin_store" not in r["materialized"], text
    assert outside(tmp_path, root) == before
    no_store(root)
    return r, root


CHECK_STAGES = ["extraction_report", "action_sidecars", "trajectory_join", "subset_checksums"]


def _restore_and_converge(
    prepared: Prepared, demo: DemoPaths, root: Path, saved: dict[Path, bytes], *, full: bool = False
) -> None:
    """Put the kit back; ``full``: the store's fingerprint is the clean one (d); else (cheaper) every
    check before the store passes again."""
    for p, data in saved.items():
        p.write_bytes(data)
    if full:
        converge(prepared, _cfg(demo, root), root, [])
    else:
        r = run_selection(_cfg(demo, root), CHECK_STAGES)
        assert r["success"] and all(c["passed"] for c in r["checks"]), said(r)


def _save(*paths: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in paths}


def _sidecar_tar(demo: DemoPaths) -> Path:
    return load_profile(demo.profile).kit_file("sidecar_archive")


def _rewrite_sidecar_tar(demo: DemoPaths, edit: Callable[[list[Member]], list[Member]]) -> None:
    tar = _sidecar_tar(demo)
    write_members(tar, edit(read_members(tar)))
    write_sidecar_sha256(demo.kit_root, load_profile(demo.profile).kit.sidecar_archive)


def _kit_files(demo: DemoPaths) -> list[Path]:
    prof = load_profile(demo.profile)
    files = [
        prof.kit_file(k)
        for k in ("pair_manifest", "subset_checksums", "sidecar_archive", "sidecar_archive_sha256")
    ]
    return files + sorted(prof.kit_file("action_manifest_dir").glob("*.jsonl"))


def test_fault_kit_sidecar_tar_sha(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo))
    tar = _sidecar_tar(demo)
    data = bytearray(tar.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tar.write_bytes(bytes(data))
    r, root = _final_refused(
        prepared,
        demo,
        tmp_path,
        str(tar),
        "sha256 mismatch",
        "Fix:",
        "re-copy",
        check=C.SIDECAR_TAR_SHA256_MATCHES,
    )
    _restore_and_converge(prepared, demo, root, saved)


def _pairs(demo: DemoPaths) -> Path:
    return load_profile(demo.profile).kit_file("pair_manifest")


def test_fault_kit_bad_json(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo))
    p = _pairs(demo)
    lines = p.read_text().splitlines(keepends=True)
    lines[4] = lines[4][: len(lines[4]) // 2] + "\n"
    p.write_text("".join(lines))
    _final_refused(prepared, demo, tmp_path, f"{p}:5:", "malformed JSON", check=C.JOIN_HAS_NO_PROBLEMS)
    _restore_and_converge(prepared, demo, tmp_path / "root", saved, full=True)


def test_fault_kit_dup_pair(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo))
    p = _pairs(demo)
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    rows[7]["pair_id"] = rows[2]["pair_id"]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _final_refused(
        prepared,
        demo,
        tmp_path,
        f"{p}:8:",
        f"duplicate pair_id {rows[2]['pair_id']!r}",
        "first on line 3",
        check=C.JOIN_HAS_NO_PROBLEMS,
    )
    _restore_and_converge(prepared, demo, tmp_path / "root", saved)


def test_fault_kit_leak(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo))
    p = _pairs(demo)
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    i = next(i for i, r in enumerate(rows) if r["split"] == "train")
    j = next(j for j, r in enumerate(rows) if r["split"] == "val")
    tid = rows[i]["chosen_trajectory_id"]
    rows[j]["chosen_trajectory_id"] = tid
    rows[j]["chosen_frames_path"] = rows[i]["chosen_frames_path"]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _final_refused(prepared, demo, tmp_path, "leakage", tid, f"{p}:", check=C.JOIN_HAS_NO_PROBLEMS)
    _restore_and_converge(prepared, demo, tmp_path / "root", saved)


def _recovered_rows(demo: DemoPaths, source: str) -> tuple[Path, list[dict[str, Any]]]:
    f = load_profile(demo.profile).kit_file("action_manifest_dir") / f"{source}.jsonl"
    return f, [json.loads(x) for x in f.read_text().splitlines()]


def test_fault_kit_missing_sidecar(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo))
    _, rows = _recovered_rows(demo, "autoeval")
    victim = next(r for r in rows if r["status"] == "recovered")
    _rewrite_sidecar_tar(demo, lambda ms: [(m, d) for m, d in ms if m.name != victim["sidecar_path"]])
    r, root = _final_refused(
        prepared,
        demo,
        tmp_path,
        victim["stage2_trajectory_id"],
        "'recovered' but its sidecar",
        "is missing",
        check=C.JOIN_HAS_NO_PROBLEMS,
    )
    _restore_and_converge(prepared, demo, root, saved)


def test_fault_kit_unknown_sidecar(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo))
    stranger = "00000000-1111-4222-8333-444444444444"
    tar_members = read_members(_sidecar_tar(demo))
    some = next(d for m, d in tar_members if m.isreg())
    _rewrite_sidecar_tar(
        demo, lambda ms: ms + [member(f"action_sidecars/racer/trajectory_{stranger}.npz", some)]
    )
    r, root = _final_refused(
        prepared, demo, tmp_path, stranger, "that no action manifest row names", check=C.JOIN_HAS_NO_PROBLEMS
    )
    _restore_and_converge(prepared, demo, root, saved)


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _replace_sidecar(
    demo: DemoPaths, source: str, make: Callable[[dict[str, np.ndarray]], bytes]
) -> dict[str, Any]:
    """Replace one recovered sidecar of ``source`` (its manifest sha256 follows, so only the
    intended problem remains); returns its manifest row."""
    f, rows = _recovered_rows(demo, source)
    row = next(r for r in rows if r["status"] == "recovered")
    members = read_members(_sidecar_tar(demo))
    old = next(d for m, d in members if m.name == row["sidecar_path"])
    assert old is not None
    with np.load(io.BytesIO(old), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    new = make(arrays)
    out = []
    for m, d in members:
        if m.name == row["sidecar_path"]:
            m.size = len(new)
            d = new
        out.append((m, d))
    _rewrite_sidecar_tar(demo, lambda ms: out)
    import hashlib

    row["sidecar_sha256"] = hashlib.sha256(new).hexdigest()
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return row


def test_fault_kit_sidecar_width(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo))

    def narrower(a: dict[str, np.ndarray]) -> bytes:
        meta = json.loads(str(a["metadata_json"]))
        meta["raw_width"] = 7
        return _npz(
            metadata_json=np.array(json.dumps(meta)),
            raw_actions=a["raw_actions"][:, :7],
            aligned_actions=a["aligned_actions"][:, :7],
            source_indices=a["source_indices"],
            alignment_indices=a["alignment_indices"],
        )

    row = _replace_sidecar(demo, "roboarena", narrower)
    r, root = _final_refused(
        prepared,
        demo,
        tmp_path,
        row["stage2_trajectory_id"],
        "raw action width 7 contradicts source 'roboarena' width 8",
        check=C.JOIN_HAS_NO_PROBLEMS,
    )
    _restore_and_converge(prepared, demo, root, saved)


class _Tripwire:
    """Unpickling this calls ``open(path, "w")``: the file's existence proves something unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_fault_kit_npz_object(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo))
    tripwire = tmp_path / "UNPICKLED"

    def pickled(a: dict[str, np.ndarray]) -> bytes:
        obj = np.empty(len(a["aligned_actions"]), dtype=object)
        obj[0] = _Tripwire(str(tripwire))
        return _npz(**{**a, "aligned_actions": obj})

    row = _replace_sidecar(demo, "libero_success", pickled)
    # the payload is live: loading it with pickle allowed would trip the wire (proved on a copy)
    probe = _npz(x=np.array([_Tripwire(str(tmp_path / "probe"))], dtype=object))
    np.load(io.BytesIO(probe), allow_pickle=True)["x"]
    assert (tmp_path / "probe").exists()
    (tmp_path / "probe").unlink()
    r, root = _final_refused(
        prepared,
        demo,
        tmp_path,
        row["stage2_trajectory_id"] if False else "aligned_actions",
        "object (pickled) arrays",
        "not unpickled",
        check=C.JOIN_HAS_NO_PROBLEMS,
    )
    assert row["sidecar_path"].rsplit("/", 1)[-1] in said(r)
    assert not tripwire.exists()
    _restore_and_converge(prepared, demo, root, saved)
    assert not tripwire.exists()


def test_fault_kit_sha256sums(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo))
    sums = load_profile(demo.profile).kit_file("subset_checksums")
    lines = sums.read_text().splitlines()
    digest, path = lines[3].split("  ", 1)
    wrong = "f" * 64 if digest != "f" * 64 else "e" * 64
    lines[3] = f"{wrong}  {path}"
    sums.write_text("\n".join(lines) + "\n")
    r, root = _final_refused(
        prepared, demo, tmp_path, path, wrong, digest, check=C.SUBSET_BYTES_MATCH_SHA256SUMS
    )
    _restore_and_converge(prepared, demo, root, saved)


def test_fault_kit_frames_npz(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = _save(*_kit_files(demo), demo.profile, demo.upstream / f"{SMALL}.tar")
    pairs = [json.loads(x) for x in _pairs(demo).read_text().splitlines()]
    used = sorted(
        {p[k] for p in pairs for k in ("chosen_frames_path", "rejected_frames_path") if f"/{SMALL}/" in p[k]}
    )
    assert len(used) >= 2
    bad_dtype, bad_shape = used[0], used[1]
    new_digests: dict[str, str] = {}

    def damage(ms: list[Member], top: str) -> list[Member]:
        import hashlib

        out = []
        for m, data in ms:
            rel = f"{layout.PROCESSED_DIR}/{SMALL}/" + m.name.split(f"{SMALL}/", 1)[-1]
            if rel in (bad_dtype, bad_shape) and data is not None:
                with np.load(io.BytesIO(data), allow_pickle=False) as z:
                    frames = z["frames"]
                frames = (
                    frames.astype(np.float32)
                    if rel == bad_dtype
                    else np.concatenate([frames, frames[..., :1]], axis=-1)
                )
                buf = io.BytesIO()
                np.savez_compressed(
                    buf,
                    frames=frames,
                    shape=np.asarray(frames.shape, dtype=np.int64),
                    num_frames=np.asarray(len(frames), dtype=np.int64),
                )
                data = buf.getvalue()
                m.size = len(data)
                new_digests[rel] = hashlib.sha256(data).hexdigest()
            out.append((m, data))
        return out

    path = hostile_archive(demo, SMALL, damage)
    sums = load_profile(demo.profile).kit_file("subset_checksums")
    text = sums.read_text()
    for rel, dg in new_digests.items():
        text = re.sub(rf"^[0-9a-f]{{64}}  {re.escape(rel)}$", f"{dg}  {rel}", text, flags=re.M)
    sums.write_text(text)
    root = copy_root(prepared, tmp_path / "root")
    forget_archive(root, path)
    before = outside(tmp_path, root)
    with _hub(demo) as hub:
        cfg = _cfg(demo, root, hub.url)
        assert run_selection(cfg, ["archive_file"], path)["success"]
        assert run_selection(cfg, ["cache_dir"], SMALL)["success"]
        r = run_selection(cfg, FINAL_STAGE)
        refused(
            r,
            bad_dtype.rsplit("/", 1)[-1],
            "dtype float32; expected uint8",
            bad_shape.rsplit("/", 1)[-1],
            "expected (T, H, W, 3)",
            check=C.STORE_OPENS_STRICT,
        )
        assert outside(tmp_path, root) == before
        assert not layout.current_store_path(root, prepared.profile_name).exists()
        leftovers = (
            list(layout.stores_root(root, prepared.profile_name).glob("*"))
            if layout.stores_root(root, prepared.profile_name).exists()
            else []
        )
        assert leftovers == [], leftovers
        for p, data in saved.items():
            p.write_bytes(data)
        hub.clear_log()
        converge(prepared, cfg, root, [("archive_file", path), ("cache_dir", SMALL)])
        assert resolve_gets(hub) == [path]


# ================================================================================================
# Profile
# ================================================================================================
def test_fault_prof_unknown_key(demo: DemoPaths, tmp_path: Path) -> None:
    _profile_refused(
        demo,
        tmp_path,
        "bogus = 1\n" + demo.profile.read_text(),
        "unknown key 'bogus'",
        "remove it or check its spelling",
    )


def test_fault_prof_quarantined_active(demo: DemoPaths, tmp_path: Path) -> None:
    prof = load_profile(demo.profile)
    q = sorted(prof.quarantined_paths())[0]
    text = demo.profile.read_text() + f'\n[[archives]]\npath = "{q}"\ncache_key = "quarantined_key"\n'
    _profile_refused(
        demo, tmp_path, text, q, "also listed under [[archives]]", "remove one of the two entries"
    )


def test_fault_prof_dotdot(demo: DemoPaths, tmp_path: Path) -> None:
    victim = f"{SMALL}.tar"
    text = demo.profile.read_text().replace(f'path = "{victim}"', f'path = "../{victim}"')
    _profile_refused(demo, tmp_path, text, f"../{victim}", "contains '..'", "plain relative path")
    prof = load_profile(demo.profile)
    text = demo.profile.read_text().replace(prof.kit.pair_manifest, "../../etc/pairs.jsonl")
    _profile_refused(demo, tmp_path, text, "kit.pair_manifest", "contains '..'")


def test_fault_prof_totals(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    good = demo.profile.read_text()
    n = load_profile(demo.profile).expected.trajectories
    demo.profile.write_text(good.replace(f"trajectories = {n}\n", f"trajectories = {n + 1}\n"))
    r, root = _final_refused(
        prepared,
        demo,
        tmp_path,
        f"trajectories is {n}, expected {n + 1}",
        "[expected]",
        check=C.TRAJECTORIES_MATCH_EXPECTED,
    )
    demo.profile.write_text(good)
    converge(prepared, _cfg(demo, root), root, [])


# ================================================================================================
# Process: real `stage2 build` processes, SIGKILL, two at once; a real full disk
# ================================================================================================
# Runs the real CLI and kills itself with SIGKILL (from an audit hook) when the extraction of the
# 3rd cache key has begun inside its temp folder: the demo's cache keys extract in milliseconds, too
# fast to be hit reliably from outside.
_KILL_IN_EXTRACTION = r"""
import os, re, signal, sys
pat = re.compile(r"/processed_datasets/\.[^/]+\.tmp-\d+-\d+-[0-9a-f]{8}-[0-9a-f]{12}/.")  # an owned temp
seen = set()
def hook(event, args):
    if event == "os.mkdir":
        m = pat.search(os.fsdecode(args[0]))
        if m:
            seen.add(os.fsdecode(args[0]).split("/processed_datasets/")[1].split("/")[0])
            if len(seen) >= 3:
                os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
from stage2_data.cli import main
sys.argv[0] = "stage2"
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Chain:
    root: Path
    home: Path
    hub_gets: list[str]
    outputs: list[str]  # stdout + stderr of every process
    killed_extract: dict[str, Any]
    two_builds: dict[str, Any]
    killed_store: dict[str, Any]
    final: dict[str, Any]
    outside_same: bool


@pytest.fixture(scope="module")
def chain(prepared: Prepared, tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """One data root, one token-protected hub: build killed in extraction; build B (with a second
    build started while B holds the lock) killed in the store write; a last build completes."""
    base = tmp_path_factory.mktemp("chain")
    root = base / "root"
    shutil.copytree(prepared.root, root, symlinks=True)
    for key in load_profile(prepared.demo.profile).cache_keys():  # start before any extraction
        shutil.rmtree(layout.cache_dir(root, key))
    shutil.rmtree(layout.reports_dir(root))
    home = base / "home"
    write_instance_yaml(home)
    tmp = base / "tmp"
    tmp.mkdir()
    env = _env_for_subprocess(home, TMPDIR=str(tmp), HF_HOME=str(base / "hf_home"), **{TOKEN_VAR: SECRET})
    env.pop("STAGE2_RUN_LOG_LEVEL", None)
    demo = prepared.demo
    logs = base / "logs"
    logs.mkdir()
    before = outside(base, root, home, logs)
    outputs: list[str] = []
    with _hub(demo, token=SECRET) as hub:
        args = ["build", "--profile", str(demo.profile), "--data-root", str(root), "--endpoint", hub.url,
                "--token-env", TOKEN_VAR, "--concurrency", "1", "--verbose"]  # fmt: skip
        # 1. killed during the extraction
        p1 = subprocess.run(
            [sys.executable, "-c", _KILL_IN_EXTRACTION, *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=300,
        )
        outputs += [p1.stdout, p1.stderr]
        proc = layout.processed_root(root)
        killed_extract = {
            "returncode": p1.returncode,
            "temp": sorted(p.name for p in proc.iterdir() if p.name.startswith(".")),
            "done": sorted(p.name for p in proc.iterdir() if not p.name.startswith(".")),
            "stores": (root / "stores").exists(),
        }
        # 2. build B; a second build while B holds the lock; B killed while it writes the store
        b_out = open(logs / "b.out", "w+")  # noqa: SIM115 - files, not pipes: nobody reads B while it runs
        b_err = open(logs / "b.err", "w+")  # noqa: SIM115
        pb = subprocess.Popen(
            [sys.executable, "-m", "stage2_data.cli", *args],
            stdout=b_out,
            stderr=b_err,
            text=True,
            cwd=REPO,
            env=env,
        )
        deadline = time.monotonic() + 120
        while read_holder(root).get("pid") != pb.pid:
            assert pb.poll() is None and time.monotonic() < deadline, "build B never took the lock"
            time.sleep(0.02)
        second = _cli(*args, env=env, timeout=120)
        outputs += [second.stdout, second.stderr]
        two_builds = {
            "returncode": second.returncode,
            "stderr": second.stderr,
            "b_pid": pb.pid,
            "b_alive": pb.poll() is None,
        }
        stores = layout.stores_root(root, prepared.profile_name)
        staging: list[str] = []
        while pb.poll() is None:  # poll until the store's staging folder appears, then kill
            with contextlib.suppress(FileNotFoundError):
                staging = [p.name for p in os.scandir(stores) if ".tmp-" in p.name]
            if staging:
                os.kill(pb.pid, signal.SIGKILL)
                break
            time.sleep(0.002)
        pb.wait(timeout=600)
        for f in (b_out, b_err):
            f.seek(0)
            outputs.append(f.read())
            f.close()
        killed_store = {
            "returncode": pb.returncode,
            "seen": staging,
            "left": sorted(p.name for p in stores.iterdir()) if stores.is_dir() else [],
        }
        # 3. the rerun completes
        hub.clear_log()
        p3 = _cli(*args, "--json", env=env, timeout=300)
        outputs += [p3.stdout, p3.stderr]
        final = {
            "returncode": p3.returncode,
            "summary": json.loads(p3.stdout) if p3.returncode == 0 else p3.stderr[-3000:],
        }
        gets = resolve_gets(hub)
    return Chain(
        root,
        home,
        gets,
        outputs,
        killed_extract,
        two_builds,
        killed_store,
        final,
        outside(base, root, home, logs) == before,
    )


def _assert_rerun_converged(prepared: Prepared, chain: Chain) -> None:
    assert chain.final["returncode"] == 0, chain.final["summary"]
    s = chain.final["summary"]
    assert s["ok"] and s["fingerprint"] == prepared.fingerprint
    assert chain.hub_gets == []  # every archive was verified: none downloaded again
    store = layout.current_store_path(chain.root, prepared.profile_name)
    assert validate_vin_offline_store(store, deep=True) == []
    # the rerun left no temp folder anywhere
    leftovers = [p for p in chain.root.rglob(".*") if ".tmp" in p.name or ".old-" in p.name]
    assert leftovers == [], leftovers
    assert chain.outside_same


def test_fault_proc_kill_extract(prepared: Prepared, chain: Chain) -> None:
    k = chain.killed_extract
    assert k["returncode"] == -signal.SIGKILL
    owned_temp = r"^\..+\.tmp-\d+-\d+-[0-9a-f]{8}-[0-9a-f]{12}$"  # .<key>.tmp-<pid>-<start>-<host>-<rand>
    assert len(k["temp"]) == 1 and re.match(owned_temp, k["temp"][0]), k  # the half-written one
    assert len(k["done"]) == 2, k  # the two cache keys extracted before the kill
    assert not k["stores"]
    _assert_rerun_converged(prepared, chain)


def test_fault_proc_kill_store(prepared: Prepared, chain: Chain) -> None:
    k = chain.killed_store
    assert k["returncode"] == -signal.SIGKILL, k
    assert k["seen"], "the store's staging folder was never seen"
    assert layout.CURRENT_LINK not in k["left"]
    assert all(n.startswith(".") for n in k["left"]), k  # only staging: no store under its final name
    _assert_rerun_converged(prepared, chain)


def test_fault_proc_two_builds(prepared: Prepared, chain: Chain, tmp_path: Path) -> None:
    t = chain.two_builds
    assert t["b_alive"], "build B ended before the second build was tried"
    assert t["returncode"] == 2, t["stderr"]
    for n in (str(chain.root), "in use by another build", f"pid {t['b_pid']}", "Fix:", f"kill {t['b_pid']}"):
        assert n in t["stderr"], (n, t["stderr"])
    assert "Traceback" not in t["stderr"]
    _assert_rerun_converged(prepared, chain)
    # in one process too: a second holder (another thread) is refused, the lock is free afterwards
    import threading

    got: list[BaseException] = []
    with data_root_lock(tmp_path / "r"):
        th = threading.Thread(target=lambda: _try_lock(tmp_path / "r", got))
        th.start()
        th.join()
    assert got and isinstance(got[0], DataRootLockedError) and f"pid {os.getpid()}" in str(got[0])
    with data_root_lock(tmp_path / "r"):
        pass


def _try_lock(root: Path, got: list[BaseException]) -> None:
    try:
        with data_root_lock(root):
            pass
    except BaseException as e:  # noqa: BLE001 - handed to the test
        got.append(e)


def test_fault_secret_token(
    prepared: Prepared, chain: Chain, demo: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    assert chain.final["returncode"] == 0  # the token was needed (the hub refuses requests without it)
    # stdout/stderr of every build
    for text in chain.outputs:
        assert SECRET not in text
    # every file the builds wrote: data root (lock file, manifest, records, reports), the instance
    # (event log with all metadata, compute logs), temp dir
    for base in (chain.root, chain.home, chain.home.parent / "tmp"):
        for f in base.rglob("*"):
            if f.is_file() and not f.is_symlink():
                assert SECRET.encode() not in f.read_bytes(), f
    manifest = (layout.current_store_path(chain.root, prepared.profile_name) / "manifest.json").read_text()
    assert SECRET not in manifest
    # the Dagster event log, event by event (metadata included)
    instance = dg.DagsterInstance.from_config(str(chain.home))
    runs = instance.get_runs()
    assert len(runs) > 20
    for run in runs:
        for ev in instance.all_logs(run.run_id):
            assert SECRET not in repr(ev)
    # error messages: a 404 and a wrong token, each with the token in play
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    forget_archive(root, victim)
    monkeypatch.setenv(TOKEN_VAR, SECRET)
    with _hub(demo, token=SECRET, faults=HubFaults(missing={victim})) as hub:
        r = run_selection(_cfg(demo, root, hub.url, token_env_var=TOKEN_VAR), ["archive_file"], victim)
        text = refused(r, victim, "does not exist")
        assert SECRET not in text
    wrong = "hf_WrongTokenFaultMatrix_0000000000000"
    monkeypatch.setenv(TOKEN_VAR, wrong)
    with _hub(demo, token=SECRET) as hub:
        r = run_selection(_cfg(demo, root, hub.url, token_env_var=TOKEN_VAR), ["archive_file"], victim)
        text = refused(r, victim, "401")
        assert wrong not in text and SECRET not in text
    for ev in dg.DagsterInstance.get().all_logs(r["run_id"]):
        assert wrong not in repr(ev)


def test_fault_proc_disk_full(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting the tmpfs for this test needs root")
    mnt = tmp_path / "small_fs"
    mnt.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        # The build checks the free space first (and passes: 64 MiB); the disk fills up while the
        # download waits to retry a 503, so that it runs out in the middle of the write.
        root = mnt / "root"
        victim = "jesbu1_soar_rfm_soar.tar"
        size = (demo.upstream / victim).stat().st_size
        (mnt / "fill").mkdir()
        filler = mnt / "fill" / "filler"  # the test's own file: not part of the "outside" check

        def fill_when_asked(hub: HubServer) -> None:
            deadline = time.monotonic() + 60
            while not any(m == "GET" for m, _ in hub.file_requests(victim)) and time.monotonic() < deadline:
                time.sleep(0.002)
            with open(filler, "wb") as f:
                f.write(b"\0" * (shutil.disk_usage(mnt).free - size // 2))

        import threading

        before = outside(tmp_path, root, mnt / "fill")
        with _hub(demo, faults=HubFaults(fail_first={victim: 1})) as hub:
            cfg = _cfg(demo, root, hub.url)
            th = threading.Thread(target=fill_when_asked, args=(hub,))
            th.start()
            r = run_selection(cfg, ["archive_file"], victim)
            th.join()
            refused(r, victim, "disk full", str(layout.partial_path(root, victim)), "Fix:", "free disk space")
            part = layout.partial_path(root, victim)
            assert 0 < part.stat().st_size < size  # the partial download is kept
            assert not layout.archive_path(root, victim).exists()
            assert outside(tmp_path, root, mnt / "fill") == before
            filler.unlink()
            hub.clear_log()
            r = run_selection(cfg, ["archive_file"], victim)
            assert r["success"], said(r)
            gets = [rng for m, rng in hub.file_requests(victim) if m == "GET"]
        assert len(gets) == 1 and gets[0] is not None and gets[0].startswith("bytes="), gets  # resumed
        assert (
            sha256_file(layout.archive_path(root, victim))
            == load_profile(demo.profile).archive(victim).sha256
        )
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
