"""The fault matrix, publication-gate rows: a store is published, re-published, resumed or reused only
after the same full check (every file hashed against its manifest, the content recomputed, every
sample decoded), whatever path led there; a store that fails it is moved aside, never deleted, and
built again from the verified inputs; only a no-op rebuild may skip the check, and only while every
entry of the store has the stats the last passed gate recorded.

Every row goes through the `stage2` command (a subprocess) against the loopback hub, on a copy of one
data root built once by `stage2 build`: exit code, output and files on disk, so the rows hold
whatever orchestrates the steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.built import DEMO_FINGERPRINT as FINGERPRINT
from helpers.built import build
from helpers.built import fingerprint as _fingerprint
from helpers.cli import Ran, stage2, subprocess_env
from helpers.forge import forge_store_consistently

from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.profile import load_profile
from stage2_data.steps.status import gate_status


def _build(demo: DemoPaths, root: Path, hub: HubServer, *extra: str) -> Ran:
    return build(demo.profile, root, *extra, endpoint=hub.url)


@pytest.fixture(scope="module")
def gated(demo_cache: DemoPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The demo built once by `stage2 build`; each row copies its data root."""
    root = tmp_path_factory.mktemp("gate") / "root"
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        out = _build(demo_cache, root, hub)
        assert out.returncode == 0 and _fingerprint(out) == FINGERPRINT, out.tail()
        yield {"root": root, "hub": hub, "demo": demo_cache, "profile": load_profile(demo_cache.profile).name}


def _copy(gated: dict[str, Any], dst: Path) -> tuple[Path, Path]:
    """A copy of the built data root (its own instance), and its published store's folder. A copy
    has new inodes and ctimes: its first build runs the store stage, whose gate passes."""
    shutil.copytree(gated["root"], dst, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    out = _build(gated["demo"], dst, gated["hub"])
    assert out.returncode == 0 and _fingerprint(out) == FINGERPRINT, out.tail()
    return dst, layout.current_store_path(dst, gated["profile"]).resolve()


def _same_size_edit(p: Path) -> None:
    """Change one byte of ``p`` in the middle, keeping its size and mtime (not its ctime)."""
    st = p.stat()
    os.chmod(p, 0o644)
    data = bytearray(p.read_bytes())
    i = len(data) // 2
    data[i] = ord("x") if data[i] != ord("x") else ord("y")
    p.write_bytes(bytes(data))
    os.chmod(p, stat.S_IMODE(st.st_mode))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def _aside(root: Path, name: str) -> list[Path]:
    """The stores named ``name`` moved aside under the data root's quarantine folder."""
    return sorted(layout.quarantine_root(root).glob(f"*/{layout.STORES_DIR}/*/{name}"))


def _valid_clean(root: Path, profile: str) -> None:
    """The published store, recomputed from its bytes (deep + decode), is the clean build's."""
    current = layout.current_store_path(root, profile)
    v = stage2("validate", str(current), "--deep", "--decode", "--json")
    assert v.returncode == 0, v.tail()
    assert json.loads((current / "manifest.json").read_text())["fingerprint"] == FINGERPRINT


def test_fault_gate_current_index_edited(gated: dict[str, Any], tmp_path: Path) -> None:
    """A same-length edit of the published store's sample_index.jsonl, mtime kept: the next build
    sees the change (ctime), re-runs the gate, which hashes the file against the manifest: the
    damaged store is moved aside (byte for byte, never deleted), a clean one built and published."""
    root, store = _copy(gated, tmp_path / "root")
    index = store / "sample_index.jsonl"
    _same_size_edit(index)
    damaged = index.read_bytes()
    out = _build(gated["demo"], root, gated["hub"])
    assert out.returncode == 0, out.tail()
    assert _fingerprint(out) == FINGERPRINT
    assert "internal error" not in out.stdout + out.stderr
    _valid_clean(root, gated["profile"])
    aside = _aside(root, store.name)
    assert len(aside) == 1 and (aside[0] / "sample_index.jsonl").read_bytes() == damaged
    said = re.search(r"^store update: (.*)$", out.stdout, re.M)
    assert said and "failed the publication gate" in said.group(1) and str(aside[0]) in said.group(1)
    assert "sample_index.jsonl" in said.group(1), said.group(1)  # what failed, named
    # the published store was there: why it was rebuilt is that it failed, not "none is published"
    assert said.group(1).startswith(f"rebuilt: the store already at {store} failed"), said.group(1)
    current = layout.current_store_path(root, gated["profile"])
    assert f"current:      {current}\n" in out.stdout  # the path to keep, and how to open it
    assert f'VinOfflineDataset("{current}", split="train")' in out.stdout
    listed = stage2("list", str(gated["demo"].profile), "--data-root", str(root), "--json")
    assert listed.returncode == 0 and str(aside[0] / "sample_index.jsonl") in listed.stdout, listed.tail()
    # the store moved aside is one item of the listing (its every file counted), not a line per file
    n_files = sum(1 for f in aside[0].rglob("*") if f.is_file())
    (moved,) = listed.json()["quarantine"]["moved"]
    assert (moved["path"], moved["is_dir"], moved["files"]) == (str(aside[0]), True, n_files), moved
    assert moved["reason"] == "failed the publication gate"
    rel = f"{aside[0].relative_to(layout.quarantine_root(root)).as_posix()}/"  # <time>/stores/<p>/<name>/
    text = stage2("list", str(gated["demo"].profile), "--data-root", str(root))
    lines = [ln for ln in text.stdout.splitlines() if rel in ln]
    assert len(lines) == 1 and f"folder of {n_files} file(s)" in lines[0], text.stdout
    dry = stage2("gc", str(root / layout.STORES_DIR), "--quarantine", "--dry-run")
    assert [ln for ln in dry.stdout.splitlines() if "would remove  " in ln] == [
        f"  would remove  {lines[0].strip().removesuffix('  failed the publication gate')}"
    ], dry.stdout
    gc = stage2("gc", str(root / layout.STORES_DIR), "--quarantine", "--json")  # only when asked
    assert gc.returncode == 0 and not aside[0].exists(), gc.tail()
    _valid_clean(root, gated["profile"])


def test_fault_gate_store_url_outside_the_data_root(gated: dict[str, Any], tmp_path: Path) -> None:
    """The stores in a local folder outside the data root (`--store-url file://...`), the published
    store's sample_index.jsonl edited (same length, mtime kept): the gate failed it, then moving it
    into the data root's quarantine raised an internal error, so `current` kept naming the damaged
    store and every rerun failed the same way (QA). It is moved aside like a store of the data
    root (`quarantine/<UTC time>/stores/<profile>/<name>`, its moved.json saying where it was), and
    a clean one built and published where the stores are."""
    root = tmp_path / "root"
    shutil.copytree(gated["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster", "stores"))
    url = f"file://{tmp_path / 'elsewhere'}"
    first = _build(gated["demo"], root, gated["hub"], "--store-url", url)
    assert first.returncode == 0 and _fingerprint(first) == FINGERPRINT, first.tail()
    current = tmp_path / "elsewhere" / gated["profile"] / layout.CURRENT_LINK
    store = current.resolve()
    # the path to keep is printed, as for a store of the data root (it printed none: QA)
    assert f"current:      {current}\nopen it:      " in first.stdout, first.stdout
    _same_size_edit(store / "sample_index.jsonl")
    damaged = (store / "sample_index.jsonl").read_bytes()
    out = _build(gated["demo"], root, gated["hub"], "--store-url", url)
    assert out.returncode == 0, out.tail()
    assert _fingerprint(out) == FINGERPRINT and "internal error" not in out.stdout + out.stderr
    (aside,) = _aside(root, store.name)
    assert (aside / "sample_index.jsonl").read_bytes() == damaged
    moved = json.loads((aside.parents[2] / "moved.json").read_text())
    assert moved["files"] == [{"from": str(store), "to": str(aside)}], moved
    v = stage2("validate", str(current), "--deep", "--decode")
    assert v.returncode == 0, v.tail()
    assert json.loads((current / "manifest.json").read_text())["fingerprint"] == FINGERPRINT


def test_fault_gate_store_url_shared_by_two_builds(gated: dict[str, Any], tmp_path: Path) -> None:
    """Two data roots' builds writing one stores folder (`--store-url file://...`) at once: the one
    whose gate failed removed the store the other had just published there, and `current` then named
    nothing (QA). The store step holds the folder's writer lock: with it held by another build, a
    build is refused (exit 2) naming that build and the fix, and touches nothing there; once it is
    released, the same build runs and reuses the published store."""
    import fcntl

    url = f"file://{tmp_path / 'shared'}"
    roots = []
    for n in (1, 2):
        root = tmp_path / f"root{n}"
        shutil.copytree(
            gated["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster", "stores")
        )
        roots.append(root)
    first = _build(gated["demo"], roots[0], gated["hub"], "--store-url", url)
    assert first.returncode == 0 and _fingerprint(first) == FINGERPRINT, first.tail()
    folder = tmp_path / "shared" / gated["profile"]
    store = (folder / layout.CURRENT_LINK).resolve()
    before = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    lock = folder / ".stage2-writer.lock"
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another build, in its store step
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": 4242, "host": "node7", "data_root": "/data/other"}).encode(), 0)
        out = _build(gated["demo"], roots[1], gated["hub"], "--store-url", url)
        said = out.stdout + out.stderr
        assert out.returncode == 2, out.tail()
        assert f"the stores folder {folder} is being written by another build (pid 4242 on node7, " in said
        assert "data root /data/other" in said and "Fix: wait for that build to end" in said, said
        assert "internal error" not in said and "Traceback" not in said, said
        assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == before
    finally:
        os.close(fd)
    again = _build(gated["demo"], roots[1], gated["hub"], "--store-url", url)
    assert again.returncode == 0 and _fingerprint(again) == FINGERPRINT, again.tail()
    assert (folder / layout.CURRENT_LINK).resolve() == store


def test_fault_gate_kept_store_decode_fails(gated: dict[str, Any], tmp_path: Path) -> None:
    """A store of this input set that is not current (a kept store the profile returns to, or one a
    stopped build left behind) with one byte of a compressed frames chunk changed, size and mtime
    kept: it is never re-published as is (nothing records it as checked); the gate hashes and
    decodes it, moves it aside, and the build publishes a clean store."""
    root, store = _copy(gated, tmp_path / "root")
    link = layout.current_store_path(root, gated["profile"])
    link.unlink()  # another store was current: this one is kept, or was left by a stopped build
    m = json.loads((store / "manifest.json").read_text())
    sh = m["shards"][0]
    frames = next(f for f in sh["files"] if f["path"].startswith(f"{sh['dir']}/frames/c/"))
    p = store / frames["path"]
    _same_size_edit(p)  # a changed chunk: its crc32c now fails (the decode's own check) ...
    m_text = (store / "manifest.json").read_text()
    out = _build(gated["demo"], root, gated["hub"])
    assert out.returncode == 0, out.tail()
    assert _fingerprint(out) == FINGERPRINT
    _valid_clean(root, gated["profile"])
    aside = _aside(root, store.name)
    assert len(aside) == 1 and (aside[0] / "manifest.json").read_text() == m_text


def test_fault_gate_noop_sees_ctime(gated: dict[str, Any], tmp_path: Path) -> None:
    """A byte of a published shard changed, size and mtime restored: the next plain build is not "up
    to date" (the entry's ctime is not the one the last gate recorded): it gates the store, moves it
    aside and publishes a clean one; the build after that is a no-op again."""
    root, store = _copy(gated, tmp_path / "root")
    m = json.loads((store / "manifest.json").read_text())
    sh = m["shards"][-1]
    frames = next(f for f in sh["files"] if f["path"].startswith(f"{sh['dir']}/frames/c/"))
    _same_size_edit(store / frames["path"])
    out = _build(gated["demo"], root, gated["hub"])
    assert out.returncode == 0 and _fingerprint(out) == FINGERPRINT, out.tail()
    assert "5/5] join, bytes, store: up to date" not in out.stderr  # the store stage ran
    _valid_clean(root, gated["profile"])
    assert len(_aside(root, store.name)) == 1
    again = _build(gated["demo"], root, gated["hub"])
    assert again.returncode == 0 and _fingerprint(again) == FINGERPRINT, again.tail()
    assert "5/5] join, bytes, store: up to date" in again.stderr, again.tail()  # gate not run again


def _lstat_tree(root: Path) -> dict[str, list[int]]:
    """The (inode, size, mtime_ns, ctime_ns) of every entry under ``root`` as lstat gives them (a
    link's own, not its target's; folders end with ``/``): what a gate record held for a link."""
    out: dict[str, list[int]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        name = p.relative_to(root).as_posix() + ("/" if stat.S_ISDIR(st.st_mode) else "")
        out[name] = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return out


def test_fault_gate_symlink_in_store(gated: dict[str, Any], tmp_path: Path) -> None:
    """A frames chunk of the published store replaced by a symbolic link to an identical copy
    outside it (every byte read through it is right): the next build neither calls the store up to
    date nor reuses it (a link's own stats say nothing of the file it points at, which can change
    while no entry of the store does): the gate fails it, naming the link; it is moved aside and a
    clean store published. Editing the outside copy afterwards changes nothing published."""
    root, store = _copy(gated, tmp_path / "root")
    m = json.loads((store / "manifest.json").read_text())
    sh = m["shards"][3]
    rel = next(f["path"] for f in sh["files"] if f["path"].startswith(f"{sh['dir']}/frames/c/"))
    chunk = store / rel
    outside = tmp_path / "outside-chunk"
    shutil.copyfile(chunk, outside)
    mode = stat.S_IMODE(chunk.parent.stat().st_mode)
    os.chmod(chunk.parent, mode | stat.S_IWUSR)
    chunk.unlink()
    chunk.symlink_to(outside)
    os.chmod(chunk.parent, mode)
    assert chunk.read_bytes() == outside.read_bytes()
    # a gate record that holds the link's own stats (what a gate that passed the link recorded)
    # never makes the store up to date: the link is seen for what it is
    record = layout.reports_dir(root) / "store_gate.json"
    rec = json.loads(record.read_text())
    record.write_text(json.dumps({**rec, "stats": _lstat_tree(store)}))
    assert gate_status(load_profile(gated["demo"].profile), root) is not None
    out = _build(gated["demo"], root, gated["hub"])
    assert out.returncode == 0 and _fingerprint(out) == FINGERPRINT, out.tail()
    assert "internal error" not in out.stdout + out.stderr
    said = re.search(r"^store update: (.*)$", out.stdout, re.M)
    assert said and "reused" not in said.group(1), out.stdout
    assert "failed the publication gate" in said.group(1) and f"{rel}: a symbolic link" in said.group(1), said
    aside = _aside(root, store.name)
    assert len(aside) == 1 and (aside[0] / rel).is_symlink() and str(aside[0]) in said.group(1)
    published = layout.current_store_path(root, gated["profile"]).resolve()
    assert [p for p in published.rglob("*") if p.is_symlink() or not (p.is_file() or p.is_dir())] == []
    _valid_clean(root, gated["profile"])
    _same_size_edit(outside)  # the old link's target changes: nothing published reads it
    again = _build(gated["demo"], root, gated["hub"])
    assert again.returncode == 0 and _fingerprint(again) == FINGERPRINT, again.tail()
    assert "5/5] join, bytes, store: up to date" in again.stderr, again.tail()
    _valid_clean(root, gated["profile"])


def test_fault_gate_other_store_under_its_name(gated: dict[str, Any], tmp_path: Path) -> None:
    """A valid store of other inputs (a small store of another profile) in the folder of this
    build's store: every file matches its own manifest, so it validates, but it is not what this
    build would write. The gate fails it from its manifest, naming what differs; it is moved aside,
    byte for byte, and a clean store is built and published."""
    from test_store import build as write_store
    from test_store import make_upstream

    root, store = _copy(gated, tmp_path / "root")
    other = tmp_path / "other" / "store"
    write_store(other, make_upstream(tmp_path / "up", range(1, 6)))
    assert stage2("validate", str(other), "--deep", "--decode").returncode == 0
    theirs = json.loads((other / "manifest.json").read_text())["fingerprint"]
    for p in [store, *store.rglob("*")]:
        if p.is_dir():
            os.chmod(p, 0o755)
    shutil.rmtree(store)
    shutil.copytree(other, store)
    out = _build(gated["demo"], root, gated["hub"])
    assert out.returncode == 0 and _fingerprint(out) == FINGERPRINT, out.tail()
    said = re.search(r"^store update: (.*)$", out.stdout, re.M)
    assert said and "reused" not in said.group(1), out.stdout
    assert "manifest.json: profile not this build's (name: " in said.group(1), said.group(1)
    assert "a store of other inputs under this build's name (and 2 more)" in said.group(1), said.group(1)
    aside = _aside(root, store.name)
    assert len(aside) == 1 and str(aside[0]) in said.group(1), said.group(1)
    assert json.loads((aside[0] / "manifest.json").read_text())["fingerprint"] == theirs
    _valid_clean(root, gated["profile"])


def test_fault_gate_published_store_read_only(gated: dict[str, Any], tmp_path: Path) -> None:
    """A published store has no write bit on any file or folder (a user's tool writing into it
    fails); `stage2 gc` still removes an old store (it gives the folders their write bit back)."""
    root, store = _copy(gated, tmp_path / "root")
    modes = {p: stat.S_IMODE(p.lstat().st_mode) for p in [store, *store.rglob("*")]}
    assert modes and all(m & 0o222 == 0 for m in modes.values()), [p for p, m in modes.items() if m & 0o222]
    stores = layout.stores_root(root, gated["profile"])
    old = stores / "v2-0000000000000000"  # an older store, read-only as a published one is
    shutil.copytree(store, old)
    for p in sorted([old, *old.rglob("*")], key=lambda p: -len(p.parts)):
        os.chmod(p, stat.S_IMODE(p.lstat().st_mode) & ~0o222)
    g = stage2("gc", str(root / layout.STORES_DIR), "--keep", "0", "--json")
    assert g.returncode == 0, g.tail()
    assert not old.exists() and store.is_dir()


def test_fault_gate_store_disk_full(gated: dict[str, Any], tmp_path: Path) -> None:
    """No room for the store (a real tmpfs data root with room for everything but the store): the
    writer's up-front estimate refuses before writing, exit 2 with one line naming the store's
    folder, the space needed and free, and the fix; nothing is published and no staging folder is
    left. With room again, the rerun publishes the clean store."""
    if os.geteuid() != 0:
        pytest.skip("mounting the tmpfs for this test needs root")
    src = gated["root"]
    skip = (layout.STORES_DIR, ".dagster", layout.QUARANTINE_DIR)
    need = sum(
        p.stat().st_size for p in src.rglob("*") if p.is_file() and p.relative_to(src).parts[0] not in skip
    )
    mnt = tmp_path / "small_fs"
    mnt.mkdir()
    size_kib = (need + (1 << 20)) // 1024 + 256  # the inputs, and ~1 MiB of the store's ~6.5 MiB
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        root = mnt / "root"
        shutil.copytree(src, root, symlinks=True, ignore=shutil.ignore_patterns(*skip))
        env = subprocess_env(drop=("CI",), DAGSTER_HOME=str(tmp_path / "home"))
        argv = ["build", "--profile", str(gated["demo"].profile), "--data-root", str(root)]
        out = stage2(*argv, "--endpoint", gated["hub"].url, "--json", env=env)
        s = json.loads(out.stdout)
        assert out.returncode == 2, (s["errors"], [c for c in s["checks"] if not c["passed"]])
        text = " ".join(e["message"] for e in s["errors"])
        stores = layout.stores_root(root, gated["profile"])
        assert "not enough free disk" in text and str(stores) in text and "Fix: free" in text, text
        assert "internal error" not in out.stdout + out.stderr and "Traceback" not in out.stderr
        assert not layout.current_store_path(root, gated["profile"]).exists()
        left = [p.name for p in stores.iterdir()] if stores.is_dir() else []
        assert [n for n in left if not n.startswith(".")] == [], left  # no store folder, no staging
        assert [n for n in left if ".tmp-" in n] == [], left
        subprocess.run(["mount", "-o", "remount,size=256m", str(mnt)], check=True, capture_output=True)
        again = stage2(*argv, "--endpoint", gated["hub"].url, env=env)
        assert again.returncode == 0 and _fingerprint(again) == FINGERPRINT, again.tail()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_fault_gate_store_without_manifest(gated: dict[str, Any], tmp_path: Path) -> None:
    """The published store's manifest.json deleted: the next build does not refuse every later
    build (the folder is not a store any more, and not the user's to delete): it is moved aside to
    the quarantine folder and a clean store is built and published."""
    root, store = _copy(gated, tmp_path / "root")
    os.chmod(store, 0o755)
    (store / "manifest.json").unlink()
    left = sorted(p.relative_to(store) for p in store.rglob("*"))
    out = _build(gated["demo"], root, gated["hub"])
    assert out.returncode == 0 and _fingerprint(out) == FINGERPRINT, out.tail()
    _valid_clean(root, gated["profile"])
    aside = _aside(root, store.name)
    assert len(aside) == 1 and sorted(p.relative_to(aside[0]) for p in aside[0].rglob("*")) == left
    assert "manifest.json: missing" in out.stdout, out.stdout


def _forge_consistently(store: Path) -> tuple[bytes, str]:
    """:func:`forge_store_consistently`, and the forged store validates."""
    forged, fp = forge_store_consistently(store)
    assert fp != FINGERPRINT
    v = stage2("validate", str(store), "--deep", "--json")
    assert v.returncode == 0, v.tail()  # consistent: only the inputs can tell it is not theirs
    return forged, fp


def _forged_moved_aside(
    out: Ran, root: Path, store: Path, forged: bytes, fingerprint: str, reason: str
) -> None:
    """The build published the clean content and moved the forged store aside, named."""
    said = out.stdout + out.stderr
    assert out.returncode == 0, out.tail()
    assert _fingerprint(out) == FINGERPRINT, out.tail()
    assert "internal error" not in said and "Traceback" not in said
    aside = _aside(root, store.name)
    assert len(aside) == 1 and (aside[0] / "sample_index.jsonl").read_bytes() == forged
    line = re.search(r"^store update: (.*)$", out.stdout, re.M)
    assert line and reason in line.group(1), out.stdout
    assert fingerprint in line.group(1) and str(aside[0]) in line.group(1), line.group(1)
    assert not list(store.parent.glob(".reverify-*"))  # the witness is gone


def test_fault_gate_store_forged_consistently(gated: dict[str, Any], tmp_path: Path) -> None:
    """A store forged consistently with its manifest (:func:`_forge_consistently`), then a plain
    `stage2 build`: the data root's ledger (reports/published_stores.json) holds the fingerprint the
    store was published with, so the forged one is moved aside and the clean content published."""
    root, store = _copy(gated, tmp_path / "root")
    forged, fingerprint = _forge_consistently(store)
    out = _build(gated["demo"], root, gated["hub"])
    _forged_moved_aside(out, root, store, forged, fingerprint, "is not the store this data root published")
    assert FINGERPRINT in out.stdout  # the fingerprint the ledger holds, named
    _valid_clean(root, gated["profile"])


def test_fault_gate_store_forged_consistently_no_ledger(gated: dict[str, Any], tmp_path: Path) -> None:
    """The same forgery, and the ledger removed too: a store this data root has no record of
    publishing is reused only when a store written anew from the inputs gives its fingerprint. Here
    it does not: moved aside, the clean content published. The next build reuses the clean store on
    the ledger's word, with no witness."""
    root, store = _copy(gated, tmp_path / "root")
    forged, fingerprint = _forge_consistently(store)
    (root / "reports" / "published_stores.json").unlink()
    out = _build(gated["demo"], root, gated["hub"])
    _forged_moved_aside(out, root, store, forged, fingerprint, "is not what its inputs give")
    assert "never published from this data root" in out.stdout, out.stdout
    _valid_clean(root, gated["profile"])
    ledger = json.loads((root / "reports" / "published_stores.json").read_text())
    assert ledger[store.parent.name][store.name]["fingerprint"] == FINGERPRINT, ledger

    # a clean store with no entry: checked by a witness, then reused and recorded
    (root / "reports" / "published_stores.json").unlink()
    (root / "reports" / "store_gate.json").unlink()  # the gate runs: this is not a no-op
    again = _build(gated["demo"], root, gated["hub"])
    assert again.returncode == 0 and _fingerprint(again) == FINGERPRINT, again.tail()
    line = re.search(r"^store update: (.*)$", again.stdout, re.M)
    assert (
        line
        and "no record of publishing it: written anew from its inputs, the same fingerprint" in line.group(1)
    )
    assert len(_aside(root, store.name)) == 1
    assert (root / "reports" / "published_stores.json").is_file()


def test_fault_gate_store_forged_consistently_reverify(gated: dict[str, Any], tmp_path: Path) -> None:
    """The same forgery, and `stage2 build --reverify`, which trusts none of the build's records
    (the ledger neither): it writes a store anew from the inputs, finds another fingerprint, moves
    the edited store aside (never deleted) and publishes the clean content."""
    root, store = _copy(gated, tmp_path / "root")
    forged, fingerprint = _forge_consistently(store)
    (root / "reports" / "published_stores.json").write_text(
        json.dumps({store.parent.name: {store.name: {"fingerprint": fingerprint}}})
    )  # a ledger forged to match: --reverify does not read it
    out = _build(gated["demo"], root, gated["hub"], "--reverify")
    _forged_moved_aside(out, root, store, forged, fingerprint, "is not what its inputs give")
    assert "checked by --reverify" in out.stdout
    _valid_clean(root, gated["profile"])

    # a clean store is reused by --reverify only after the same witness gives its fingerprint
    again = _build(gated["demo"], root, gated["hub"], "--reverify")
    assert again.returncode == 0 and _fingerprint(again) == FINGERPRINT, again.tail()
    line = re.search(r"^store update: (.*)$", again.stdout, re.M)
    assert line and "--reverify wrote it anew from its inputs: the same fingerprint" in line.group(1)
    assert len(_aside(root, store.name)) == 1


def test_fault_gate_failed_store_immutable(gated: dict[str, Any], tmp_path: Path) -> None:
    """A published store that fails the gate and cannot be moved aside (made immutable with
    `chattr +i`): the build said only "PermissionError: [Errno 1] Operation not permitted" (QA). It
    names the store, what the gate found, that it could not be moved, that `current` is unchanged,
    and the fix (exit 2). Made writable again, the next build moves it aside and rebuilds."""
    root, store = _copy(gated, tmp_path / "root")
    chunk = next(p for p in sorted((store / "shards").rglob("*")) if p.is_file() and "/frames/c/" in str(p))
    _same_size_edit(chunk)
    if subprocess.run(["chattr", "+i", str(store)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not allowed here (needs CAP_LINUX_IMMUTABLE and a file system that has it)")
    try:
        out = _build(gated["demo"], root, gated["hub"])
    finally:
        subprocess.run(["chattr", "-i", str(store)], check=True)
    said = out.stdout + out.stderr
    assert out.returncode == 2, out.tail()
    assert "Traceback" not in said and "internal error" not in said
    for part in (f"the store at {store} failed the publication gate", "cannot be moved aside",
                 "what `current` names is unchanged", "chattr -R -i"):  # fmt: skip
        assert part in said, (part, said)
    assert store.is_dir() and not _aside(root, store.name)
    again = _build(gated["demo"], root, gated["hub"])
    assert again.returncode == 0 and _fingerprint(again) == FINGERPRINT, again.tail()
    assert len(_aside(root, store.name)) == 1
    _valid_clean(root, gated["profile"])
