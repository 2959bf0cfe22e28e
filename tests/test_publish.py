"""stage2_data.publish (temp names, owner liveness, sweep, atomic publication, the data-root lock)
and the commit protocol of stage2_data.storage, with real files and real processes."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stage2_data import fsutil, layout, publish
from stage2_data.publish import atomic as patomic
from stage2_data.publish import names, sweep
from stage2_data.storage import CURRENT_OBJECT, FsspecLocation, LocalLocation, StoreLocation

REPO = Path(__file__).resolve().parents[1]


# ----- helpers: real processes ------------------------------------------------------------------
@pytest.fixture
def live_child() -> Iterator[subprocess.Popen[bytes]]:
    """A process that stays alive until the test ends."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield p
    finally:
        p.kill()
        p.wait(timeout=30)


def dead_pid() -> tuple[int, int]:
    """(pid, start time) of a process that ran and has exited (and was reaped)."""
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os; print(open(f'/proc/{os.getpid()}/stat').read().rsplit(')', 1)[1].split()[19])",
        ],
        stdout=subprocess.PIPE,
    )
    out, _ = p.communicate(timeout=30)
    return p.pid, int(out or 0)


def make_temp(
    parent: Path, final: str, kind: str, pid: int, start: int, *, host: str | None = None, file: bool = False
) -> Path:
    p = parent / f".{final}.{kind}-{pid}-{start}-{host or names.host_tag()}-{uuid.uuid4().hex[:12]}"
    if file:
        p.write_bytes(b"x")
    else:
        p.mkdir()
        (p / "junk").write_bytes(b"x" * 10)
    return p


# ----- names --------------------------------------------------------------------------------------
def test_owned_name_format_and_parse() -> None:
    n = names.owned_name("v1-abc", "tmp")
    pid = os.getpid()
    assert n.startswith(f".v1-abc.tmp-{pid}-{names.proc_start_time(pid)}-{names.host_tag()}-")
    t = names.parse_temp_name(n)
    assert t is not None and (t.final, t.kind, t.pid, t.start, t.host) == (
        "v1-abc", "tmp", pid, names.proc_start_time(pid), names.host_tag(),
    )  # fmt: skip
    assert t.owned and t.alive()
    assert names.parse_temp_name(names.owned_name("store", "old")).kind == "old"  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        names.owned_name("x", "new")
    assert names.temp_path(Path("/a/b/final")).parent == Path("/a/b")


@pytest.mark.parametrize(
    "name, final, owned",
    [
        (".key.tmp-123", "key", True),  # extraction's old spelling (pid only)
        (".key.old-456", "key", True),  # fsutil.publish_dir's old spelling
        (".manifest.json.k2x_9abc.tmp", "manifest.json", False),  # mkstemp / mkdtemp
        (".current.4242.tmp", "current", False),  # the old atomic_symlink
        (".v1-ab.cd.tmp-1-2-0123abcd-ff", "v1-ab.cd", True),
    ],
)
def test_legacy_temp_names_are_recognised(name: str, final: str, owned: bool) -> None:
    t = names.parse_temp_name(name)
    assert t is not None and t.final == final and t.owned is owned
    assert (
        names.is_temp_name(name) and names.is_temp_name(name, final) and not names.is_temp_name(name, "other")
    )


@pytest.mark.parametrize(
    "name", [".hidden", "key", ".partial", ".stage2.lock", ".sidecars.json", "x.tmp", ".tmp"]
)
def test_other_names_are_not_temps(name: str) -> None:
    assert names.parse_temp_name(name) is None


def test_owner_alive_with_real_processes(live_child: subprocess.Popen[bytes]) -> None:
    pid, start = dead_pid()
    assert names.owner_alive(pid, start, names.host_tag()) is False
    assert names.owner_alive(pid) is False  # a pid-only legacy name
    lstart = names.proc_start_time(live_child.pid)
    assert lstart > 0
    assert names.owner_alive(live_child.pid, lstart, names.host_tag()) is True
    assert names.owner_alive(live_child.pid, lstart + 1, names.host_tag()) is False  # the pid was reused
    assert names.owner_alive(live_child.pid, 0, names.host_tag()) is True  # start unknown: unsure = alive
    assert names.owner_alive(pid, start, "ffffffff" if names.host_tag() != "ffffffff" else "00000000") is True
    assert names.owner_alive(2**40) is False


# ----- sweep --------------------------------------------------------------------------------------
def test_sweep_removes_only_dead_owners_temps(tmp_path: Path, live_child: subprocess.Popen[bytes]) -> None:
    pid, start = dead_pid()
    lstart = names.proc_start_time(live_child.pid)
    (tmp_path / "store").mkdir()
    dead_tmp = make_temp(tmp_path, "store", "tmp", pid, start)
    dead_old = make_temp(tmp_path, "store", "old", pid, start)
    dead_file = make_temp(tmp_path, "store", "tmp", pid, start, file=True)
    reused = make_temp(tmp_path, "store", "tmp", live_child.pid, lstart + 1)
    live = make_temp(tmp_path, "store", "tmp", live_child.pid, lstart)
    foreign = make_temp(
        tmp_path, "store", "tmp", pid, start, host="ffffffff" if names.host_tag() != "ffffffff" else "0" * 8
    )
    other = make_temp(tmp_path, "other", "tmp", pid, start)
    legacy_dead = tmp_path / ".store.tmp-99999999"
    legacy_dead.mkdir()
    unowned = tmp_path / ".store.abc_1234.tmp"
    unowned.write_bytes(b"x")

    stale = {dead_tmp, dead_old, dead_file, reused, legacy_dead}
    assert set(sweep.stale_temps(tmp_path, final="store")) == stale
    assert set(sweep.stale_temps(tmp_path, final="store", dirs_only=True)) == stale - {dead_file}
    assert set(sweep.stale_temps(tmp_path, final="store", unowned=True)) == stale | {unowned}
    assert set(sweep.stale_temps(tmp_path)) == stale | {other}
    assert set(sweep.remove_stale(tmp_path, final="store")) == stale
    assert not any(p.exists() for p in stale)
    assert live.exists() and foreign.exists() and other.exists() and unowned.exists()
    assert (tmp_path / "store").exists()
    assert sweep.stale_temps(tmp_path / "absent") == []


def test_sweep_data_root(tmp_path: Path, live_child: subprocess.Popen[bytes]) -> None:
    root = tmp_path / "root"
    pid, start = dead_pid()
    lstart = names.proc_start_time(live_child.pid)
    stores = layout.stores_root(root, "prof")
    partial = layout.partial_path(root, "a.tar")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"resume me")
    for d in (stores, layout.processed_root(root), layout.derived_root(root), root / layout.TABLES_DIR):
        d.mkdir(parents=True, exist_ok=True)
    removed_expected = {
        make_temp(
            stores, "v1-abc", "tmp", pid, start
        ),  # the store's staging (the lock's old regex missed it)
        make_temp(layout.processed_root(root), "key", "tmp", pid, start),
        layout.processed_root(root) / ".key2.tmp-99999999",  # extraction's old spelling
        layout.derived_root(root) / ".action_sidecars.k2x_9abc.tmp",  # mkdtemp staging
        root / layout.TABLES_DIR / ".trajectory_join.parquet.abcdefgh.tmp",
        layout.archives_dir(root) / ".a.tar.verified.json.x1y2z3q4.tmp",  # mkstemp
    }
    for p in removed_expected:
        if not p.exists():
            p.mkdir() if "action_sidecars" in p.name or "key2" in p.name else p.write_bytes(b"x")
    live = make_temp(stores, "v1-abc", "tmp", live_child.pid, lstart)
    keep = [live, partial, root / ".hidden_user_file"]
    keep[-1].write_bytes(b"x")
    assert set(publish.sweep_data_root(root)) == removed_expected
    assert not any(p.exists() for p in removed_expected)
    assert all(p.exists() for p in keep)


# ----- atomic publication -------------------------------------------------------------------------
def _dir_with(p: Path, text: str) -> Path:
    p.mkdir()
    (p / "manifest.json").write_text(text)
    return p


def test_rename_exchange_swaps(tmp_path: Path) -> None:
    a = _dir_with(tmp_path / "a", "A")
    b = tmp_path / "b"
    b.write_text("B")  # a folder and a file swap too
    if not publish.rename_exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    assert (tmp_path / "b" / "manifest.json").read_text() == "A" and (tmp_path / "a").read_text() == "B"
    with pytest.raises(FileNotFoundError):
        publish.rename_exchange(tmp_path / "absent", b)


@pytest.mark.parametrize("exchange", [True, False])
def test_publish_dir_replaces_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    if not exchange:
        monkeypatch.setattr(patomic, "rename_exchange", lambda a, b: False)
    final = tmp_path / "final"
    publish.publish_dir(_dir_with(tmp_path / "s1", "1"), final)  # absent: a plain rename
    assert (final / "manifest.json").read_text() == "1"
    publish.publish_dir(_dir_with(tmp_path / "s2", "2"), final)  # present: swapped, old removed
    assert (final / "manifest.json").read_text() == "2"
    final_link = tmp_path / "link"
    final_link.symlink_to(final)
    publish.publish_dir(_dir_with(tmp_path / "s3", "3"), final_link)  # a link replaced by a folder
    assert not final_link.is_symlink() and (final_link / "manifest.json").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "link"]


@pytest.mark.parametrize("exchange", [True, False])
def test_publish_dir_keep_sees_the_old_version_and_a_failure_undoes_the_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    """``keep`` is given the old version, complete, before it is deleted (what it moves out stays);
    when it raises, the old version is back at ``final``, whole, and the error is raised."""
    if not exchange:
        monkeypatch.setattr(patomic, "rename_exchange", lambda a, b: False)
    final = _dir_with(tmp_path / "final", "old")
    (final / "mine.txt").write_text("mine")
    seen: list[str] = []

    def keep(old: Path) -> None:
        seen.append((old / "manifest.json").read_text())
        os.rename(old / "mine.txt", tmp_path / "kept.txt")

    publish.publish_dir(_dir_with(tmp_path / "s1", "new"), final, keep=keep)
    assert seen == ["old"] and (final / "manifest.json").read_text() == "new"
    assert (tmp_path / "kept.txt").read_text() == "mine" and not (final / "mine.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "kept.txt"]

    (final / "yours.txt").write_text("yours")

    def fail(old: Path) -> None:
        raise OSError("cannot move it aside")

    s2 = _dir_with(tmp_path / "s2", "newer")
    with pytest.raises(OSError, match="cannot move it aside"):
        publish.publish_dir(s2, final, keep=fail)
    assert (final / "manifest.json").read_text() == "new" and (final / "yours.txt").read_text() == "yours"
    assert (s2 / "manifest.json").read_text() == "newer"  # the new version back at its staging name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "kept.txt", "s2"]


def test_publish_dir_never_leaves_final_missing(tmp_path: Path) -> None:
    final = _dir_with(tmp_path / "final", "0")
    if not publish.rename_exchange(_dir_with(tmp_path / "probe", "p"), final):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    publish.remove_path(tmp_path / "probe")
    missing: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if not (final / "manifest.json").exists():
                missing.append(1)

    t = threading.Thread(target=watch)
    t.start()
    try:
        for i in range(200):
            with publish.staging(final) as s:
                (s / "manifest.json").write_text(str(i))
                publish.publish_dir(s, final)
    finally:
        stop.set()
        t.join()
    assert missing == [] and (final / "manifest.json").read_text() == "199"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_staging(tmp_path: Path) -> None:
    final = tmp_path / "out"
    pid, start = dead_pid()
    dead = make_temp(tmp_path, "out", "tmp", pid, start)
    with publish.staging(final) as s:
        assert not dead.exists()  # a killed writer's staging of the same final is removed first
        assert s.parent == tmp_path and names.parse_temp_name(s.name).final == "out"  # type: ignore[union-attr]
        assert stat.S_IMODE(s.stat().st_mode) == 0o777 & ~patomic.current_umask()
        (s / "x").write_text("x")
        publish.publish_dir(s, final)
    assert (final / "x").read_text() == "x"
    with pytest.raises(RuntimeError), publish.staging(final) as s:
        raise RuntimeError("boom")
    assert not s.exists()
    with pytest.raises(RuntimeError), publish.staging(final, keep_on_error=True) as kept:
        raise RuntimeError("boom")
    assert kept.exists()
    with publish.staging(tmp_path / "private", mode=0o700) as s2:  # mkdtemp's 0700, where asked for
        assert stat.S_IMODE(s2.stat().st_mode) == 0o700
        publish.publish_dir(s2, tmp_path / "private")
    assert (tmp_path / "private").is_dir()


def test_atomic_symlink_and_writes(tmp_path: Path) -> None:
    link = tmp_path / "stores" / "current"
    publish.atomic_symlink("v1-a", link)
    publish.atomic_symlink("v1-b", link)
    assert os.readlink(link) == "v1-b"
    p = tmp_path / "r" / "x.json"
    publish.atomic_write_json(p, {"b": 1, "a": "é"})
    assert p.read_text(encoding="utf-8") == '{\n  "a": "é",\n  "b": 1\n}\n'
    assert stat.S_IMODE(p.stat().st_mode) == 0o600  # as mkstemp made it
    publish.atomic_write_bytes(p, b"x", mode=publish.UMASK_MODE)
    assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~patomic.current_umask()
    with pytest.raises(TypeError):
        publish.atomic_write_bytes(p, "not bytes")  # type: ignore[arg-type]
    assert p.read_bytes() == b"x"
    assert sorted(q.name for q in (tmp_path / "r").iterdir()) == ["x.json"]
    assert sorted(q.name for q in link.parent.iterdir()) == ["current"]


def test_human_bytes_is_iec() -> None:
    assert [fsutil.human_bytes(n) for n in (0, 512, 1536, 5 * 2**20, 3 * 2**30, 2**42)] == [
        "0 B", "512 B", "1.5 KiB", "5.0 MiB", "3.0 GiB", "4.0 TiB",
    ]  # fmt: skip


# ----- the data-root lock across processes ---------------------------------------------------------
_HOLD = """
import sys, time
from pathlib import Path
from stage2_data.publish import data_root_lock
with data_root_lock(Path(sys.argv[1])):
    Path(sys.argv[2]).write_text("held")
    time.sleep(float(sys.argv[3]))
"""


def _holder(root: Path, marker: Path, seconds: float) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(root), str(marker), str(seconds)], cwd=REPO)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert p.poll() is None and time.monotonic() < deadline, "the holder never took the lock"
        time.sleep(0.02)
    return p


def test_lock_contention_across_processes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    p = _holder(root, tmp_path / "m1", 120)
    try:
        with pytest.raises(publish.DataRootLockedError) as ei, publish.data_root_lock(root):
            pass
        assert ei.value.holder["pid"] == p.pid and f"pid {p.pid}" in str(ei.value)
        assert publish.read_holder(root)["pid"] == p.pid
        p.send_signal(signal.SIGKILL)  # a killed holder never blocks the next build
        p.wait(timeout=30)
        with publish.data_root_lock(root, timeout=30) as path:
            assert path == root / layout.LOCK_FILE and publish.read_holder(root)["pid"] == os.getpid()
    finally:
        p.kill()
        p.wait(timeout=30)
    q = _holder(root, tmp_path / "m2", 1.0)  # with a timeout, a second build waits for the first
    try:
        assert publish.read_holder(root)["pid"] == q.pid
        with publish.data_root_lock(root, timeout=60):  # acquired once the holder let go
            assert publish.read_holder(root)["pid"] == os.getpid()
        assert q.wait(timeout=30) == 0
    finally:
        q.kill()
        q.wait(timeout=30)


# ----- StoreLocation: the hierarchy and the commit protocol -----------------------------------------
def test_location_classes(tmp_path: Path) -> None:
    loc = StoreLocation.parse(tmp_path / "s")
    assert isinstance(loc, LocalLocation) and loc.is_local and loc.root == (tmp_path / "s").absolute()
    assert isinstance(StoreLocation(root=loc.root, url=loc.url), LocalLocation)
    assert isinstance(StoreLocation.parse(f"file://{tmp_path}/s"), LocalLocation)
    assert StoreLocation.parse(loc) is loc
    mem = StoreLocation.parse("memory://bucket/stores/prof")
    assert isinstance(mem, FsspecLocation) and not mem.is_local and mem.protocol == "memory"
    v1 = mem.child("v1")  # (the memory filesystem keeps a leading "/" in its paths)
    assert isinstance(v1, FsspecLocation) and v1.display() == mem.url + "/v1" and v1.fs is mem.fs


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_commit_publish_current_withdraw(tmp_path: Path, backend: str) -> None:
    root = StoreLocation.parse(
        tmp_path / "stores" if backend == "local" else f"memory://b{uuid.uuid4().hex[:8]}/stores"
    )
    assert root.current() is None
    store = root.child("v1-abc")
    store.write_bytes(store.root / "shards" / "a.bin", b"data")
    store.commit(store.root / "manifest.json", b'{"format": "x"}\n')  # LAST
    assert store.read_bytes(store.root / "manifest.json") == b'{"format": "x"}\n'
    root.publish_current("v1-abc")
    cur = root.current()
    assert cur is not None and cur.read_bytes(cur.root / "shards" / "a.bin") == b"data"
    if backend == "local":
        assert os.readlink(tmp_path / "stores" / layout.CURRENT_LINK) == "v1-abc"
        assert stat.S_IMODE((store.root / "manifest.json").stat().st_mode) == 0o666 & ~patomic.current_umask()
        assert sorted(p.name for p in store.root.iterdir()) == ["manifest.json", "shards"]
    else:
        assert root.read_bytes(root.root / CURRENT_OBJECT) == b"v1-abc\n"
    # a verified copy across backends, then withdrawal: the manifest goes first
    other = StoreLocation.parse(tmp_path / "copy")
    import hashlib

    other.copy_verified(
        store, store.root / "shards" / "a.bin", other.root / "a.bin", hashlib.sha256(b"data").hexdigest()
    )
    assert (tmp_path / "copy" / "a.bin").read_bytes() == b"data"
    with pytest.raises(Exception, match="differs from its manifest"):
        other.copy_verified(store, store.root / "shards" / "a.bin", other.root / "b.bin", "0" * 64)
    assert not (tmp_path / "copy" / "b.bin").exists()
    store.withdraw("manifest.json")
    assert not store.exists(store.root / "manifest.json") and store.tree_files(store.root) == []


def test_an_atomic_write_on_a_full_disk_names_the_file_and_the_fix(tmp_path: Path) -> None:
    """A record written on a full disk (the publication gate's `reports/store_gate.json` once a store
    is published, say) raised a bare "[Errno 28] No space left on device", no path named (QA): it
    is a DiskSpaceError naming the folder, the file and the fix, and leaves no temp file."""
    from helpers.env import small_tmpfs

    from stage2_data.errors import DiskSpaceError
    from stage2_data.publish import atomic_write_bytes

    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        with pytest.raises(DiskSpaceError) as ei:
            atomic_write_bytes(disk / "reports" / "store_gate.json", b"x" * (2 << 20))
        said = str(ei.value)
        assert f"the disk is full at {disk / 'reports'}: could not write store_gate.json" in said, said
        assert ei.value.fix is not None and f"df -h {disk / 'reports'}" in ei.value.fix
        assert [p.name for p in (disk / "reports").iterdir()] == []
