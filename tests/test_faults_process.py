"""The fault matrix, process and secrets rows: real `stage2 build` processes killed with SIGKILL (in
the extraction, in the store write), two builds at once on one data root, a real full disk (a 64 MiB
tmpfs), and a hub token that must never be shown.

The kill and lock rows share one chain of whole builds on one data root (``chain``); its last build
completes, and the secrets row searches everything the chain wrote for the token.
The matrix: tests/faults_table.py (rows), tests/helpers/faults.py (what every row asserts).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import REPO, STAGE2, python, stage2
from helpers.faults import (
    SECRET,
    SMALL,
    TOKEN_VAR,
    Prepared,
    copy_root,
    demo_hub,
    forget_archive,
    outside,
    refused,
    resolve_gets,
    run_cfg,
    said,
    subprocess_env_for,
)

from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubFaults, HubServer
from stage2_data.hashing import sha256_file
from stage2_data.profile import load_profile
from stage2_data.publish import DataRootLockedError, data_root_lock, read_holder
from stage2_data.store import validate_vin_offline_store
from stage2_pipelines.runner import write_instance_yaml
from stage2_pipelines.runs import run_selection

pytestmark = pytest.mark.usefixtures("fault_instance")


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
    env = subprocess_env_for(home, TMPDIR=str(tmp), HF_HOME=str(base / "hf_home"), **{TOKEN_VAR: SECRET})
    env.pop("STAGE2_RUN_LOG_LEVEL", None)
    demo = prepared.demo
    logs = base / "logs"
    logs.mkdir()
    before = outside(base, root, home, logs)
    outputs: list[str] = []
    with demo_hub(demo, token=SECRET) as hub:
        args = ["build", "--profile", str(demo.profile), "--data-root", str(root), "--endpoint", hub.url,
                "--token-env", TOKEN_VAR, "--concurrency", "1", "--verbose"]  # fmt: skip
        # 1. killed during the extraction
        p1 = python(_KILL_IN_EXTRACTION, *args, env=env, timeout=300)
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
            [*STAGE2, *args],
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
        second = stage2(*args, env=env, timeout=120)
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
        p3 = stage2(*args, "--json", env=env, timeout=300)
        outputs += [p3.stdout, p3.stderr]
        final = {
            "returncode": p3.returncode,
            "summary": p3.json() if p3.returncode == 0 else p3.stderr[-3000:],
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
    assert len(runs) >= 5  # three builds (two killed); a stage with nothing to do is not run
    for run in runs:
        for ev in instance.all_logs(run.run_id):
            assert SECRET not in repr(ev)
    # error messages: a 404 and a wrong token, each with the token in play
    root = copy_root(prepared, tmp_path / "root")
    victim = f"{SMALL}.tar"
    forget_archive(root, victim)
    monkeypatch.setenv(TOKEN_VAR, SECRET)
    with demo_hub(demo, token=SECRET, faults=HubFaults(missing={victim})) as hub:
        r = run_selection(run_cfg(demo, root, hub.url, token_env_var=TOKEN_VAR), ["archive_file"], SMALL)
        text = refused(r, victim, "does not exist")
        assert SECRET not in text
    wrong = "hf_WrongTokenFaultMatrix_0000000000000"
    monkeypatch.setenv(TOKEN_VAR, wrong)
    with demo_hub(demo, token=SECRET) as hub:
        r = run_selection(run_cfg(demo, root, hub.url, token_env_var=TOKEN_VAR), ["archive_file"], SMALL)
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
        key = load_profile(demo.profile).archive(victim).cache_key  # its archive_file partition
        size = (demo.upstream / victim).stat().st_size
        (mnt / "fill").mkdir()
        filler = mnt / "fill" / "filler"  # the test's own file: not part of the "outside" check

        def fill_when_asked(hub: HubServer) -> None:
            deadline = time.monotonic() + 60
            while not any(m == "GET" for m, _ in hub.file_requests(victim)) and time.monotonic() < deadline:
                time.sleep(0.002)
            with open(filler, "wb") as f:
                f.write(b"\0" * (shutil.disk_usage(mnt).free - size // 2))

        before = outside(tmp_path, root, mnt / "fill")
        with demo_hub(demo, faults=HubFaults(fail_first={victim: 1})) as hub:
            cfg = run_cfg(demo, root, hub.url)
            th = threading.Thread(target=fill_when_asked, args=(hub,))
            th.start()
            r = run_selection(cfg, ["archive_file"], key)
            th.join()
            refused(r, victim, "disk full", str(layout.partial_path(root, victim)), "Fix:", "free disk space")
            # the machine's fault, not the archive's: its sha256 check is not failed by it
            assert not [c for c in r["checks"] if not c["passed"]], r["checks"]
            part = layout.partial_path(root, victim)
            assert 0 < part.stat().st_size < size  # the partial download is kept
            assert not layout.archive_path(root, victim).exists()
            assert outside(tmp_path, root, mnt / "fill") == before
            filler.unlink()
            hub.clear_log()
            r = run_selection(cfg, ["archive_file"], key)
            assert r["success"], said(r)
            gets = [rng for m, rng in hub.file_requests(victim) if m == "GET"]
        assert len(gets) == 1 and gets[0] is not None and gets[0].startswith("bytes="), gets  # resumed
        assert (
            sha256_file(layout.archive_path(root, victim))
            == load_profile(demo.profile).archive(victim).sha256
        )
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_fault_proc_read_only(prepared: Prepared, tmp_path: Path) -> None:
    """A read-only data root (a read-only tmpfs as root, whom permissions do not stop; a folder
    without write permission otherwise), and a file where the data root should be: `stage2 build`
    exits 2 with one line naming the folder and the fix, and writes nothing."""
    demo = prepared.demo
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True
        )
        if mount.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {mount.stderr.decode().strip()}")
    else:
        ro.chmod(0o555)
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    try:
        for root, said_ in ((ro, "read-only"), (a_file, "a file stands where a folder is needed")):
            before = outside(tmp_path, tmp_path / "nothing")
            out = stage2(
                "build", "--profile", str(demo.profile), "--data-root", str(root), "--hub-folder", str(demo.upstream),
                timeout=120,
            )  # fmt: skip
            err = out.stderr.strip()
            assert out.returncode == 2 and "Traceback" not in out.stdout + err, out.tail()
            assert len(err.splitlines()) == 1 and str(root) in err and "Fix:" in err, err
            assert said_ in err.lower() or (said_ == "read-only" and "access" in err), err
            assert outside(tmp_path, tmp_path / "nothing") == before  # nothing written anywhere
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)], capture_output=True)
        else:
            ro.chmod(0o755)
    with data_root_lock(tmp_path / "writable"):  # a writable data root: the build can start
        pass
