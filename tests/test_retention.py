"""Readers own their store; old stores go by the retention policy, never from under a live reader.

Real stores made by the writer (tests/test_store.py's helpers), real processes for the leases.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import python_argv, stage2, subprocess_env
from test_store import Upstream, build, make_upstream

from stage2_data.cli import main
from stage2_data.errors import Stage2Error, StoreNotFoundError
from stage2_data.publish import owned_name
from stage2_data.storage import StoreLocation
from stage2_data.store import VinOfflineDataset, VinOfflineStoreReader
from stage2_data.store.retention import (
    KEEP_ENV,
    LEASES_DIR,
    check_current,
    collect_stores,
    default_keep,
    lease_path,
    profile_roots,
    retention_after_publish,
)

PROFILE = "demo_v1"


@pytest.fixture(scope="module")
def ups(tmp_path_factory: pytest.TempPathFactory) -> tuple[Upstream, Upstream]:
    """Two input sets with different content (the store before and after a rebuild)."""
    root = tmp_path_factory.mktemp("upstream")
    return make_upstream(root / "a", range(1, 11), seed=1), make_upstream(root / "b", range(3, 15), seed=2)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, ups: tuple[Upstream, Upstream]) -> tuple[Path, Path]:
    """Store A and store B, built once; tests copy them into a stores folder."""
    root = tmp_path_factory.mktemp("built")
    a, b = root / "a", root / "b"
    build(a, ups[0])
    build(b, ups[1])
    return a, b


def publish(profile_root: Path, src: Path, name: str) -> Path:
    """A store copied to ``stores/<profile>/<name>`` and published as ``current`` (the build's way)."""
    dst = profile_root / name
    shutil.copytree(src, dst)
    StoreLocation.parse(profile_root).publish_current(name)
    return dst


def everything(reader: VinOfflineStoreReader) -> list[tuple[bytes, bytes | None]]:
    """Every sample's frames and actions, as bytes."""
    out = []
    for i in range(len(reader)):
        a = reader.read_actions(i)
        out.append((reader.read_frames(i).tobytes(), None if a is None else a.tobytes()))
    return out


def digest(reader: VinOfflineStoreReader) -> str:
    h = hashlib.sha256()
    for f, a in everything(reader):
        h.update(f)
        h.update(a or b"-")
    return h.hexdigest()


def actions_of(report: Any) -> dict[str, tuple[str, str]]:
    return {e.name: (e.action, e.reason) for e in report.entries}


# ----- a reader pins its store --------------------------------------------------------------------------
def test_reader_on_current_reads_its_own_store_after_swap_and_gc(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    profile_root = tmp_path / "stores" / PROFILE
    profile_root.mkdir(parents=True)
    a = publish(profile_root, built[0], "v1-0000000000000001")
    current = profile_root / "current"
    reader = VinOfflineStoreReader(current)
    ds = VinOfflineDataset(current, split="train")
    assert reader.path == a.resolve() and reader.resolved == str(a.resolve()) and ds.path == a.resolve()
    assert reader.opened_as == str(current) and reader.fingerprint == reader.manifest["fingerprint"]
    reference = everything(reader)
    ref_items = [(x["frames"].tobytes(), x["actions"].tobytes(), x["sample_key"]) for x in ds]
    pickled = pickle.dumps(ds)  # a DataLoader worker's copy, made before the rebuild

    b = publish(profile_root, built[1], "v1-0000000000000002")  # the rebuild: current moves to B
    assert current.resolve() == b.resolve()
    assert everything(reader) == reference  # byte-exact, sample by sample, after the swap
    assert [(x["frames"].tobytes(), x["actions"].tobytes(), x["sample_key"]) for x in ds] == ref_items
    clone = pickle.loads(pickled)  # unpickled after the swap: still A
    assert clone.resolved == str(a.resolve())
    assert [(x["frames"].tobytes(), x["actions"].tobytes(), x["sample_key"]) for x in clone] == ref_items

    rep = collect_stores(profile_root, keep=0)  # A is leased: kept, whatever keep says
    got = actions_of(rep)
    assert got["v1-0000000000000002"] == ("kept", "current")
    assert got["v1-0000000000000001"][0] == "kept" and got["v1-0000000000000001"][1].startswith(
        "in use by pid "
    )
    assert str(os.getpid()) in got["v1-0000000000000001"][1]
    assert a.is_dir()
    assert everything(reader) == reference  # and after gc

    reader.close()
    ds.close()
    assert collect_stores(profile_root, keep=0).entries[0].action == "kept"  # the clone still holds A
    clone.close()
    rep = collect_stores(profile_root, keep=0)
    assert actions_of(rep)["v1-0000000000000001"][0] == "removed" and not a.exists()
    assert not lease_path(a).exists()  # its gate went with it
    assert sorted(p.name for p in profile_root.iterdir()) == [LEASES_DIR, "current", "v1-0000000000000002"]
    with VinOfflineStoreReader(current) as fresh:
        assert fresh.path == b.resolve() and fresh.fingerprint != reader.fingerprint


def test_lease_across_processes_and_after_kill_9(tmp_path: Path, built: tuple[Path, Path]) -> None:
    profile_root = tmp_path / "stores" / PROFILE
    profile_root.mkdir(parents=True)
    a = publish(profile_root, built[0], "v1-0000000000000001")
    with VinOfflineStoreReader(a) as r:
        reference = digest(r)
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_retention import digest
from stage2_data.store import VinOfflineStoreReader
reader = VinOfflineStoreReader(sys.argv[1])
print(reader.resolved, flush=True)
for line in sys.stdin:  # one digest of every sample per line received
    print(digest(reader), flush=True)
"""
    child = subprocess.Popen(
        python_argv(code, str(profile_root / "current")),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == str(a.resolve())
        publish(profile_root, built[1], "v1-0000000000000002")
        rep = collect_stores(profile_root, keep=0)
        assert actions_of(rep)["v1-0000000000000001"] == ("kept", f"in use by pid {child.pid}")
        child.stdin.write("read\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == reference  # the child read its own store after swap + gc
        os.kill(child.pid, signal.SIGKILL)  # a crashed reader: its lease must not block gc
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    rep = collect_stores(profile_root, keep=0)
    assert actions_of(rep)["v1-0000000000000001"] == ("removed", "") and not a.exists()


def test_pickled_reader_takes_its_own_lease(tmp_path: Path, built: tuple[Path, Path]) -> None:
    profile_root = tmp_path / "stores" / PROFILE
    profile_root.mkdir(parents=True)
    a = publish(profile_root, built[0], "v1-0000000000000001")
    reader = VinOfflineStoreReader(profile_root / "current")
    state = pickle.dumps(reader)
    assert reader.lease is not None and reader.lease.held
    reader.close()
    with VinOfflineStoreReader(a) as on_its_folder:  # opened on the store's own folder, not `current`
        state_of_folder = pickle.dumps(on_its_folder)
    clone = pickle.loads(state)
    assert clone.lease is not None and clone.lease.held and clone.path == a.resolve()
    publish(profile_root, built[1], "v1-0000000000000002")
    assert actions_of(collect_stores(profile_root, keep=0))["v1-0000000000000001"][0] == "kept"
    clone.close()
    assert actions_of(collect_stores(profile_root, keep=0))["v1-0000000000000001"][0] == "removed"
    with pytest.raises(StoreNotFoundError, match="gone") as ei:
        pickle.loads(state)  # the store it was opened on is gone: one clear error, never another store
    assert ei.value.fix == f"open the published store again (e.g. {profile_root / 'current'})"
    # opened on the folder that is gone: the fix named that very folder (QA, stop 56); it names
    # the `current` beside it
    with pytest.raises(StoreNotFoundError, match="gone") as ei:
        pickle.loads(state_of_folder)
    assert ei.value.fix == f"open the published store again (e.g. {profile_root / 'current'})"


_WORKER_DS: VinOfflineDataset | None = None


def _worker_init(ds: VinOfflineDataset) -> None:
    global _WORKER_DS
    _WORKER_DS = ds


def _worker_read(_: int) -> tuple[int, str, str]:
    assert _WORKER_DS is not None
    h = hashlib.sha256()
    for x in _WORKER_DS:
        h.update(x["frames"].tobytes())
        h.update(x["actions"].tobytes())
    return os.getpid(), _WORKER_DS.resolved, h.hexdigest()


def test_dataset_in_a_spawned_worker_keeps_its_store(tmp_path: Path, built: tuple[Path, Path]) -> None:
    """A DataLoader-style worker (spawn: the dataset is pickled) reads the store the dataset was opened
    on, after a rebuild and a gc; its own lease keeps the store while the worker lives."""
    import multiprocessing

    profile_root = tmp_path / "stores" / PROFILE
    profile_root.mkdir(parents=True)
    a = publish(profile_root, built[0], "v1-0000000000000001")
    ds = VinOfflineDataset(profile_root / "current", split="train")
    _worker_init(ds)
    _, _, reference = _worker_read(0)
    with multiprocessing.get_context("spawn").Pool(1, initializer=_worker_init, initargs=(ds,)) as pool:
        pid, resolved, got = pool.apply(_worker_read, (0,))
        assert resolved == str(a.resolve()) and got == reference
        publish(profile_root, built[1], "v1-0000000000000002")
        ds.close()
        _worker_init(None)  # type: ignore[arg-type]
        assert actions_of(collect_stores(profile_root, keep=0))["v1-0000000000000001"] == (
            "kept",
            f"in use by pid {pid}",
        )
        assert pool.apply(_worker_read, (0,)) == (pid, str(a.resolve()), reference)
        # the worker ends (and its lease with it); close, not terminate: terminate ends workers with
        # SIGTERM, which a process started with SIGTERM ignored (nohup, some CI runners) never gets,
        # and then waits for them forever
        pool.close()
        pool.join()
    assert actions_of(collect_stores(profile_root, keep=0))["v1-0000000000000001"][0] == "removed"


def test_reader_resolves_current_on_object_storage(tmp_path: Path, built: tuple[Path, Path]) -> None:
    """On object storage ``CURRENT`` is read once, at open (fsspec's memory file system)."""
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://bucket/t{os.getpid()}/stores/{PROFILE}"
    root = StoreLocation.parse(url)
    try:
        for name, src in (("v1-0000000000000001", built[0]), ("v1-0000000000000002", built[1])):
            dst = root.child(name)
            for rel in StoreLocation.parse(src).tree_files(src):
                dst.put_file(src / rel, dst.root / rel)
        root.publish_current("v1-0000000000000001")
        reader = VinOfflineStoreReader(f"{url}/current")
        assert reader.resolved == f"{root.url}/v1-0000000000000001"
        with VinOfflineStoreReader(built[0]) as local:
            reference = everything(local)
        root.publish_current("v1-0000000000000002")
        assert everything(reader) == reference
        assert VinOfflineStoreReader(url).resolved == f"{root.url}/v1-0000000000000002"
        assert [r.url for r in profile_roots(url)] == [root.url]
        assert [r.url for r in profile_roots(url.rsplit("/", 1)[0])] == [root.url]
        rep = collect_stores(url, keep=0)
        assert actions_of(rep)["v1-0000000000000001"] == ("removed", "") and "no lease" in rep.notes[0]
        assert actions_of(rep)["v1-0000000000000002"] == ("kept", "current")
        # a note put inside a store there (gc removed the whole prefix, the note too: QA round 2)
        noted = root.child("v1-0000000000000003")
        for rel in StoreLocation.parse(built[0]).tree_files(built[0]):
            noted.put_file(built[0] / rel, noted.root / rel)
        noted.write_bytes(noted.root / "NOTES.md", b"mine")
        verdict = actions_of(collect_stores(url, keep=0))["v1-0000000000000003"]
        assert verdict[0] == "kept" and "holds what is not the store's (NOTES.md)" in verdict[1], verdict
        assert noted.read_bytes(noted.root / "NOTES.md") == b"mine"
    finally:
        fsspec.filesystem("memory").rm(f"/bucket/t{os.getpid()}", recursive=True)


# ----- the policy ---------------------------------------------------------------------------------------
def four_stores(tmp_path: Path, src: Path) -> Path:
    """stores/<profile>/ with v1-0000000000000001..v1-0000000000000004 (oldest first), current -> v1-0000000000000004."""
    profile_root = tmp_path / "stores" / PROFILE
    profile_root.mkdir(parents=True)
    for i in range(1, 5):
        publish(profile_root, src, f"v1-{i:016x}")
    return profile_root


@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        (0, ["v1-0000000000000004"]),
        (1, ["v1-0000000000000003", "v1-0000000000000004"]),
        (2, ["v1-0000000000000002", "v1-0000000000000003", "v1-0000000000000004"]),
    ],
)
def test_keep_n_previous_never_current(
    tmp_path: Path, built: tuple[Path, Path], keep: int, kept: list[str]
) -> None:
    profile_root = four_stores(tmp_path, built[0])
    before = sorted(p.name for p in profile_root.iterdir())
    dry = collect_stores(profile_root, keep=keep, dry_run=True)
    assert sorted(p.name for p in profile_root.iterdir()) == before  # a dry run removes nothing
    assert sorted(e.name for e in dry.entries if e.action == "would remove") == sorted(
        {"v1-0000000000000001", "v1-0000000000000002", "v1-0000000000000003"} - set(kept)
    )
    rep = collect_stores(profile_root, keep=keep)
    assert sorted(e.name for e in rep.entries if e.action == "kept") == kept
    assert actions_of(rep)["v1-0000000000000004"] == ("kept", "current")
    assert sorted(p.name for p in profile_root.iterdir() if p.name.startswith("v1-")) == kept
    assert rep.freed_bytes == dry.freed_bytes > 0
    with VinOfflineStoreReader(profile_root / "current") as r:
        assert r.path.name == "v1-0000000000000004"


def test_gc_leaves_what_is_not_ours_and_sweeps_dead_temps(tmp_path: Path, built: tuple[Path, Path]) -> None:
    profile_root = four_stores(tmp_path, built[0])
    (profile_root / "notes").mkdir()
    (profile_root / "notes" / "todo.txt").write_text("mine")
    foreign = profile_root / "other-format"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"format": "something-else"}')
    half = profile_root / "v1-0000000000000bad"  # an interrupted store: no manifest
    shutil.copytree(built[0] / "shards", half / "shards")
    dead = profile_root / ".v1-0000000000000005.tmp-999999999-1-00000000-abc"  # another host: never judged
    dead.mkdir()
    mine = profile_root / owned_name("v1-0000000000000006")  # a live writer (this process): kept
    mine.mkdir()
    gone = profile_root / ".v1-0000000000000007.tmp-4194999"  # pid-only legacy name whose pid does not exist
    gone.mkdir()
    # a user's copy of a store under a name of theirs (a complete store: QA saw gc and a build's
    # retention remove it), and a build's store with a note put inside: neither is removed
    backup = profile_root / "my-backup"
    shutil.copytree(profile_root / "v1-0000000000000001", backup)
    noted = profile_root / "v1-0000000000000002"
    noted.chmod(0o755)
    (noted / "NOTES.txt").write_text("mine")
    foreign_v = profile_root / "v1-00000000000000ff"
    foreign_v.mkdir()
    (foreign_v / "manifest.json").write_text('{"format": "something-else"}')
    shutil.copytree(profile_root / "v1-0000000000000001", profile_root / "v1-2025")  # a short hex name
    # a file named as the store's own files are (a chunk), its manifest not listing it (QA round 2)
    chunked = profile_root / "v1-0000000000000003"
    chunk = next(p for p in sorted(chunked.rglob("*")) if p.is_file() and "/c/" in p.as_posix())
    os.chmod(chunk.parent, 0o755)
    (chunk.parent / "9").write_bytes(b"a chunk of mine")
    rep = collect_stores(profile_root, keep=0)
    got = actions_of(rep)
    for name in (
        "notes",
        "other-format",
        "v1-0000000000000bad",
        "my-backup",
        "v1-00000000000000ff",
        "v1-2025",
    ):
        assert got[name][0] == "left alone" and (profile_root / name).is_dir()
    assert got["v1-0000000000000003"][0] == "kept" and "not the store's" in got["v1-0000000000000003"][1]
    assert (chunk.parent / "9").read_bytes() == b"a chunk of mine"
    for name in ("notes", "other-format", "my-backup", "v1-2025"):
        assert "not named as a build names a store" in got[name][1], got[name]
    assert (
        "no manifest.json" in got["v1-0000000000000bad"][1]
        and "another format" in got["v1-00000000000000ff"][1]
    )
    assert (
        got["v1-0000000000000002"][0] == "kept"
        and "holds what is not the store's (NOTES.txt)" in got["v1-0000000000000002"][1]
    )
    assert (noted / "NOTES.txt").read_text() == "mine" and (noted / "manifest.json").is_file()
    # a kept store frees nothing: its --json entry said "freed" what its removal would have (QA)
    by_name = {e.name: e for e in rep.entries}
    assert by_name["v1-0000000000000002"].freed is None and by_name["v1-0000000000000003"].freed is None
    assert by_name["v1-0000000000000001"].freed
    assert got[gone.name] == ("removed", "a temp its dead writer left") and not gone.exists()
    assert dead.exists() and mine.exists()
    assert {n for n, (act, _) in got.items() if act == "removed"} == {"v1-0000000000000001", gone.name}


def test_gc_names_a_link_or_a_file_among_the_stores_and_leaves_it(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    """A symlink or a plain file in a profile's stores folder (a link to a store elsewhere, a note)
    was passed over without a word: `stage2 gc` now names each as left alone, says why, and neither
    it nor what a link points to is touched."""
    profile_root = four_stores(tmp_path, built[0])
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(profile_root / "v1-0000000000000001", elsewhere)
    (profile_root / "v1-00000000000000aa").symlink_to(elsewhere)
    (profile_root / "notes.txt").write_text("mine")
    r = stage2("gc", str(profile_root), "--keep", "0")
    assert r.returncode == 0, r.tail()
    lines = r.stdout.splitlines()
    link = next(ln for ln in lines if "v1-00000000000000aa" in ln)
    assert link.split()[:2] == ["left", "alone"] and f"a symlink (to {elsewhere})" in link, r.stdout
    note = next(ln for ln in lines if "notes.txt" in ln)
    assert note.split()[:2] == ["left", "alone"] and "a file, not a store folder" in note, r.stdout
    assert (profile_root / "v1-00000000000000aa").is_symlink() and (elsewhere / "manifest.json").is_file()
    assert (profile_root / "notes.txt").read_text() == "mine"
    # the links the build keeps are not listed: `current` is the current store's line
    assert not any(ln.split()[2:3] == ["current"] for ln in lines), r.stdout


def test_without_current_nothing_is_removed(tmp_path: Path, built: tuple[Path, Path]) -> None:
    profile_root = four_stores(tmp_path, built[0])
    (profile_root / "current").unlink()
    rep = collect_stores(profile_root, keep=0)
    assert all(e.action == "kept" for e in rep.entries) and len(rep.entries) == 4
    assert "nothing removed" in rep.notes[0]


def test_keep_setting_and_the_build_hook(
    tmp_path: Path, built: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert default_keep({}) == 1
    assert default_keep({KEEP_ENV: "3"}) == 3
    assert default_keep({KEEP_ENV: "all"}) is None
    for bad in ("-1", "two"):
        with pytest.raises(Stage2Error, match=KEEP_ENV):
            default_keep({KEEP_ENV: bad})
    profile_root = four_stores(tmp_path, built[0])
    loc = StoreLocation.parse(profile_root)
    assert retention_after_publish(loc, "all")["removed"] == []
    monkeypatch.setenv(KEEP_ENV, "all")
    assert retention_after_publish(loc)["removed"] == []  # None: the environment says
    monkeypatch.setenv(KEEP_ENV, "-2")
    assert KEEP_ENV in retention_after_publish(loc)["error"] and len(list(profile_root.glob("v1-*"))) == 4
    monkeypatch.delenv(KEEP_ENV)
    got = retention_after_publish(loc)  # the default: keep 1
    assert got["removed"] == ["v1-0000000000000002", "v1-0000000000000001"] and got["freed_bytes"] > 0
    assert sorted(p.name for p in profile_root.iterdir() if p.name.startswith("v1-")) == [
        "v1-0000000000000003",
        "v1-0000000000000004",
    ]
    assert "error" in retention_after_publish(StoreLocation.parse(tmp_path / "nowhere"), 1)


def test_profile_roots(tmp_path: Path, built: tuple[Path, Path]) -> None:
    profile_root = four_stores(tmp_path, built[0])
    other = tmp_path / "stores" / "other"
    other.mkdir()
    publish(other, built[1], "v1-0000000000000001")
    (tmp_path / "stores" / "empty").mkdir()
    assert [r.root for r in profile_roots(tmp_path / "stores")] == [profile_root, other]
    assert [r.root for r in profile_roots(profile_root)] == [profile_root]
    with pytest.raises(Stage2Error, match="holds no stores"):
        profile_roots(tmp_path / "stores" / "empty")


# ----- the command --------------------------------------------------------------------------------------
def test_gc_command(tmp_path: Path, built: tuple[Path, Path]) -> None:
    profile_root = four_stores(tmp_path, built[0])
    stores = tmp_path / "stores"
    r = stage2("gc", str(stores), "--dry-run")
    assert r.returncode == 0, r.tail()
    lines = r.stdout.splitlines()
    assert "dry run, nothing removed" in lines[0]
    assert any(ln.split()[:3] == ["would", "remove", "v1-0000000000000001"] and "KiB" in ln for ln in lines)
    assert any(ln.split()[:2] == ["kept", "v1-0000000000000004"] and ln.endswith("current") for ln in lines)
    assert len(list(profile_root.glob("v1-*"))) == 4
    r = stage2("gc", str(stores), "--json", env=subprocess_env(**{KEEP_ENV: "2"}))
    assert r.returncode == 0, r.tail()
    doc = r.json()
    assert doc["keep"] == 2 and not doc["dry_run"] and doc["freed_bytes"] > 0
    (root,) = doc["roots"]
    assert [s["name"] for s in root["stores"] if s["action"] == "removed"] == ["v1-0000000000000001"]
    r = stage2("gc", str(profile_root), "--keep", "0")
    assert r.returncode == 0, r.tail()
    assert sum(ln.split()[0] == "removed" for ln in r.stdout.splitlines()) == 2
    assert sorted(p.name for p in profile_root.glob("v1-*")) == ["v1-0000000000000004"]


def test_gc_json_gives_every_store_the_created_at_of_its_manifest(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    """`stage2 gc --dry-run --json` reports each store's `created_at` as its manifest.json records it:
    the current store's too, and every store's when no store is published."""
    profile_root = four_stores(tmp_path, built[0])
    created = {}
    for i, store in enumerate(sorted(profile_root.glob("v1-*")), start=1):
        mpath = store / "manifest.json"
        m = json.loads(mpath.read_text())
        m["created_at"] = created[store.name] = f"2026-01-0{i}T00:00:00Z"  # one per store, oldest first
        mpath.chmod(0o644)
        mpath.write_text(json.dumps(m))

    def reported() -> dict[str, str | None]:
        r = stage2("gc", str(tmp_path / "stores"), "--dry-run", "--json")
        assert r.returncode == 0, r.tail()
        (root,) = r.json()["roots"]
        return {s["name"]: s["created_at"] for s in root["stores"]}

    assert reported() == created  # v1-0000000000000004 is current
    (profile_root / "current").unlink()
    assert reported() == created


def test_gc_command_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = stage2("gc", str(tmp_path / "missing"))  # the real command, once
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("stage2 gc: error: ") and "no such folder" in line and "Fix:" in line
    capsys.readouterr()
    (tmp_path / "a file").write_text("x")  # there, but not a folder: said as such, not "no such folder"
    assert main(["gc", str(tmp_path / "a file")]) == 2
    assert f"{tmp_path / 'a file'}: it is a regular file, not a folder. Fix: " in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["gc", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "holds no stores" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exc:
        main(["gc", str(tmp_path), "--keep", "-1"])
    assert exc.value.code == 2 and "not a number of stores" in capsys.readouterr().err
    monkeypatch.setenv(KEEP_ENV, "lots")
    assert main(["gc", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert KEEP_ENV in err and len(err.strip().splitlines()) == 1


def test_gc_command_refused_while_a_build_holds_the_data_root(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    from stage2_data.publish import data_root_lock

    profile_root = four_stores(tmp_path, built[0])
    with data_root_lock(tmp_path):
        r = stage2("gc", str(profile_root), "--keep", "0")
    assert r.returncode == 2 and "in use by another build" in r.stderr, r.tail()
    assert sorted(p.name for p in profile_root.glob("v1-*")) == [f"v1-{i:016x}" for i in range(1, 5)]


# ----- something in the way of the leases ---------------------------------------------------------------
def _refused(err: Stage2Error, where: Path) -> None:
    text = f"{err} {err.fix or ''}"
    assert str(where) in text and "move" in (err.fix or ""), text


@pytest.mark.parametrize("what", ["file", "dangling link", "gate folder"])
def test_something_in_the_way_of_the_leases_refuses_readers_and_gc(
    tmp_path: Path, built: tuple[Path, Path], what: str
) -> None:
    """``.leases`` a regular file (or a link to nothing), or a store's gate a folder: no reader
    opens a store of that folder without its lease (each is refused, naming the path and the
    fix), and gc (dry run or not, the library and the command) removes no store and leaves the
    user's entry exactly as it is. Moved out of the way, readers lease again and gc removes."""
    profile_root = four_stores(tmp_path, built[0])
    leases = profile_root / LEASES_DIR
    if what == "file":
        leases.write_text("a user's notes\n")
        blocker = leases
    elif what == "dangling link":
        leases.symlink_to(tmp_path / "nowhere")
        blocker = leases
    else:
        blocker = lease_path(profile_root / "v1-0000000000000001")
        blocker.mkdir(parents=True)
        (blocker / "mine.txt").write_text("kept")
    before = sorted(p.name for p in profile_root.iterdir())

    for target in (profile_root / "v1-0000000000000001", profile_root / "current"):
        if what == "gate folder" and target.name == "current":
            continue  # only v1-0000000000000001's gate is in the way
        with pytest.raises(Stage2Error) as exc:
            VinOfflineStoreReader(target)
        _refused(exc.value, blocker)
    with pytest.raises(Stage2Error) as exc:
        VinOfflineDataset(profile_root / "v1-0000000000000001", split="train")
    _refused(exc.value, blocker)

    for dry_run in (True, False):
        with pytest.raises(Stage2Error) as exc:
            collect_stores(profile_root, keep=0, dry_run=dry_run)
        _refused(exc.value, blocker)
    r = stage2("gc", str(profile_root), "--keep", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.tail()
    (line,) = r.stderr.strip().splitlines()
    assert str(blocker) in line and "Fix:" in line, line
    assert sorted(p.name for p in profile_root.iterdir()) == before  # no store removed
    if what == "file":
        assert leases.read_text() == "a user's notes\n"
    elif what == "dangling link":
        assert leases.is_symlink() and os.readlink(leases) == str(tmp_path / "nowhere")
    else:
        assert (blocker / "mine.txt").read_text() == "kept"

    # moved out of the way: a reader takes its lease, gc keeps the leased store and removes the rest
    blocker.rename(tmp_path / "moved-aside")
    with VinOfflineStoreReader(profile_root / "v1-0000000000000001") as reader:
        assert reader.lease is not None and reader.lease.held
        got = actions_of(collect_stores(profile_root, keep=0))
        assert got["v1-0000000000000001"][0] == "kept" and got["v1-0000000000000001"][1].startswith(
            "in use by pid "
        )
        assert got["v1-0000000000000002"][0] == got["v1-0000000000000003"][0] == "removed"


# ----- a `current` that names no store --------------------------------------------------------------------
@pytest.mark.parametrize("points_at", ["empty folder elsewhere", ".leases", "nothing", "incomplete store"])
def test_gc_refuses_when_current_names_no_store_of_the_folder(
    tmp_path: Path, built: tuple[Path, Path], points_at: str
) -> None:
    """`current` linked to a folder that is not a complete store of the profile's folder (an empty
    folder elsewhere, `.leases`, nothing, a store folder without manifest.json) publishes nothing:
    `stage2 gc` (dry run or not, any --keep) refuses, naming what `current` points at and the fix,
    and removes no store. Before, every store was "previous" and went with --keep 0."""
    profile_root = four_stores(tmp_path, built[0])
    link = profile_root / "current"
    if points_at == "empty folder elsewhere":
        target = tmp_path / "emptydir"
        target.mkdir()
    elif points_at == ".leases":
        (profile_root / LEASES_DIR).mkdir(exist_ok=True)
        target = Path(LEASES_DIR)
    elif points_at == "nothing":
        target = Path("v1-gone")
    else:
        shutil.copytree(built[0] / "shards", profile_root / "v1-half" / "shards")
        target = Path("v1-half")
    link.unlink()
    link.symlink_to(target)
    before = sorted(p.name for p in profile_root.iterdir())
    for args in (["--keep", "0"], ["--keep", "1", "--dry-run"], ["--keep", "0", "--json"]):
        r = stage2("gc", str(tmp_path / "stores"), *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.tail()
        if "--json" in args:
            doc = r.json()
            assert not doc["ok"] and doc["error"] == "StoreNotFoundError", doc
            line = f"{doc['message']} Fix: {doc['fix']}"
        else:
            assert r.stdout == "", r.tail()
            (line,) = r.stderr.strip().splitlines()
        assert f"{link} points at {target}" in line and "which is not a store" in line, line
        assert "nothing was removed" in line and "Fix:" in line, line
        assert f"stage2 build --profile <the profile's .toml> --data-root {tmp_path}" in line, line
        assert f"ln -sfn v1-0000000000000004 {link}" in line, (
            line
        )  # the newest complete store, ready to paste
        assert sorted(p.name for p in profile_root.iterdir()) == before
    for call in (
        lambda: collect_stores(profile_root, keep=0),
        lambda: check_current(StoreLocation.parse(profile_root)),
    ):
        with pytest.raises(StoreNotFoundError, match="publishes no store"):
            call()
    # the fix as pasted: current names a store again, and gc judges by it
    link.unlink()
    link.symlink_to("v1-0000000000000004")
    r = stage2("gc", str(profile_root), "--keep", "1")
    assert r.returncode == 0, r.tail()
    assert sorted(p.name for p in profile_root.glob("v1-000*")) == [
        "v1-0000000000000003",
        "v1-0000000000000004",
    ]


def test_gc_refuses_a_current_that_is_a_folder_or_another_profiles_store(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    """A `current` that is a folder (not the link a build makes; even a store) or a link to a store
    of another profile's folder publishes no store of this folder: refused, nothing removed."""
    profile_root = four_stores(tmp_path, built[0])
    other = tmp_path / "stores" / "other"
    other.mkdir()
    publish(other, built[1], "v1-0000000000000009")
    link = profile_root / "current"
    link.unlink()
    link.symlink_to(other / "v1-0000000000000009")
    before = sorted(p.name for p in profile_root.iterdir())
    r = stage2("gc", str(profile_root), "--keep", "0")
    assert r.returncode == 2 and f"not a folder directly inside {profile_root}" in r.stderr, r.tail()
    assert sorted(p.name for p in profile_root.iterdir()) == before
    link.unlink()
    shutil.copytree(built[0], link)
    r = stage2("gc", str(profile_root), "--keep", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.tail()
    assert f"{link} is a folder, not the symbolic link to a store a build makes" in r.stderr, r.tail()
    assert sorted(p.name for p in profile_root.iterdir()) == before
    assert (other / "v1-0000000000000009" / "manifest.json").is_file()


# ----- a lease file that is not a regular file ----------------------------------------------------------
def test_a_fifo_as_a_stores_lease_is_refused_never_waited_on(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    """A FIFO at `.leases/<store>.lock`: opening the store (`VinOfflineDataset(current)`) used to wait
    forever for a writer; it is refused with a named error (the path, what it is, the fix: remove
    it), and so is gc (nothing removed); an orphan FIFO gate never stops gc either."""
    profile_root = four_stores(tmp_path, built[0])
    leases = profile_root / LEASES_DIR
    leases.mkdir(exist_ok=True)
    fifo = lease_path(profile_root / "v1-0000000000000004")
    os.mkfifo(fifo)
    code = """
import sys
from stage2_data.errors import Stage2Error
from stage2_data.store import VinOfflineDataset
try:
    VinOfflineDataset(sys.argv[1], split="train")
except Stage2Error as e:
    print(type(e).__name__, e)
"""
    r = subprocess.run(
        python_argv(code, str(profile_root / "current")),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=60,  # the hang: a FIFO opened for reading waits for a writer
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("FileSystemError ") and f"{fifo} is a FIFO, not a regular file" in r.stdout
    assert f"Fix: remove it (rm {fifo})" in r.stdout, r.stdout
    # gc: a FIFO gate of a store it would remove refuses the profile's folder, nothing removed
    os.mkfifo(lease_path(profile_root / "v1-0000000000000001"))
    before = sorted(p.name for p in profile_root.iterdir())
    for args in (["--keep", "0"], ["--keep", "0", "--dry-run"]):
        r2 = stage2("gc", str(profile_root), *args, timeout=60)
        assert r2.returncode == 2 and "Traceback" not in r2.stderr, r2.tail()
        assert "is a FIFO, not a regular file" in r2.stderr and "Fix: remove it" in r2.stderr, r2.tail()
        assert sorted(p.name for p in profile_root.iterdir()) == before
    # removed as the fix says: the reader leases; an orphan FIFO gate (its store gone) is left alone
    fifo.unlink()
    lease_path(profile_root / "v1-0000000000000001").unlink()
    os.mkfifo(lease_path(profile_root / "v1-gone"))
    with VinOfflineStoreReader(profile_root / "current") as reader:
        assert reader.lease is not None and reader.lease.held
    r3 = stage2("gc", str(profile_root), "--keep", "0", timeout=60)
    assert r3.returncode == 0, r3.tail()
    assert sorted(p.name for p in profile_root.glob("v1-*")) == ["v1-0000000000000004"]
    assert lease_path(profile_root / "v1-gone").exists()


def test_gc_of_several_profiles_removes_nothing_when_one_current_names_no_store(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    """`stage2 gc <data_root>/stores` judges every profile's folder: when one profile's `current`
    names no store, gc refuses before any store of any profile goes (it used to remove the first
    profile's old stores, then refuse the second without saying what it had removed)."""
    first = four_stores(tmp_path, built[0])
    second = tmp_path / "stores" / "zz_second"  # judged after the first (sorted)
    second.mkdir()
    publish(second, built[0], "v1-0000000000000001")
    (second / "current").unlink()
    (second / "current").symlink_to(tmp_path)  # a folder that is no store of this profile
    before = sorted(p.name for p in first.iterdir())
    r = stage2("gc", str(tmp_path / "stores"), "--keep", "0")
    assert r.returncode == 2 and "publishes no store" in r.stderr and str(second) in r.stderr, r.tail()
    assert sorted(p.name for p in first.iterdir()) == before
