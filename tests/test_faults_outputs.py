"""The fault matrix, outputs and reporting rows: what a command writes where a user points it (an
output path that is a link, a device, a FIFO or a file inside a store), the instance configuration a
build generates (a data root named with YAML's special characters, a data root copied or moved),
a failed check reported as what it is (never as a bug), a retention setting builds must refuse as
`stage2 gc` does, and the training loader's named errors.

Everything runs the real `stage2` command in a subprocess (exit code, output, files on disk), except
the loader rows, which are the library a trainer calls.
The matrix: tests/faults_table.py (rows), tests/helpers/faults.py (what every row asserts).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.cli import Ran, stage2, subprocess_env
from helpers.faults import NOWHERE, fault_cases, outside

from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.errors import LoaderError, StoreError
from stage2_data.loader import SeededOrder, Selection
from stage2_data.store import VinOfflineStoreReader

# the shared store (tests/fixtures/stores.py)
STORE_IDS = range(1, 9)
PROFILE_NAME = "stage2_core_v1_demo"


# ----- outputs: stage2 preview / stage2 export-rrd --out ---------------------------------------------
@pytest.fixture
def data_root(store: Path, tmp_path: Path) -> Path:
    """A data root holding a copy of the shared store as its published store (``current``)."""
    root = tmp_path / "data"
    stores = root / layout.STORES_DIR / "p"
    shutil.copytree(store, stores / "v2-0123456789abcdef")
    (stores / layout.CURRENT_LINK).symlink_to("v2-0123456789abcdef")
    (root / layout.LOCK_FILE).touch()
    return root


def _tree(folder: Path) -> dict[str, tuple[int, bytes | None, str | None]]:
    """Every entry under ``folder``: its mode, a file's bytes, a link's target (readers' leases,
    which every command reading a store takes, left out)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if ".leases" in p.parts:
            continue
        st = os.lstat(p)
        data = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
        link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
        out[str(p.relative_to(folder))] = (st.st_mode, data, link)
    return out


def _writers() -> list[tuple[str, ...]]:
    """The commands that write a user's --out: preview always, export-rrd with rerun installed."""
    cmds = [("preview", "{store}", "--n", "1")]
    try:
        import rerun  # noqa: F401
    except ImportError:
        return cmds
    return [*cmds, ("export-rrd", "{store}", "0")]


def _refused(cmd: tuple[str, ...], current: Path, out: str, *names: str) -> Ran:
    r = stage2(*(a.format(store=current) for a in cmd), "--out", out)
    assert r.returncode == 2, r.tail()
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for n in (f"stage2 {cmd[0]}: error: --out {out}", "Fix:", *names):
        assert n in r.stderr, f"{n!r} not in {r.stderr}"
    return r


def test_fault_store_out_link(data_root: Path, tmp_path: Path) -> None:
    """A symbolic link as --out: the rename would replace the link itself (and a link into the store
    would have the store's file replaced by nothing of it); refused, the link and its target kept."""
    current = layout.current_store_path(data_root, "p")
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"my own picture")
    links = {"to-a-file.png": mine, "to-the-manifest.png": current / "manifest.json"}
    for name, target in links.items():
        (tmp_path / name).symlink_to(target)
    before = _tree(tmp_path)
    for cmd in _writers():
        for name, target in links.items():
            _refused(cmd, current, str(tmp_path / name), "is a symbolic link", f"(to {target})")
    assert _tree(tmp_path) == before


def test_fault_store_out_special(data_root: Path, tmp_path: Path) -> None:
    """A device, a FIFO as --out: never replaced by the rename (a FIFO is not even opened, so nothing
    blocks); a regular file there is replaced as before."""
    current = layout.current_store_path(data_root, "p")
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    before = _tree(tmp_path)
    for cmd in _writers():
        _refused(cmd, current, "/dev/null", "is a character device")
        _refused(cmd, current, str(fifo), "is a FIFO")
    assert _tree(tmp_path) == before
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    mine = tmp_path / "old.png"
    mine.write_bytes(b"an older preview")
    r = stage2("preview", str(current), "--n", "1", "--out", str(mine))
    assert r.returncode == 0, r.tail()
    assert mine.read_bytes().startswith(b"\x89PNG")


def test_fault_store_out_in_store(data_root: Path, tmp_path: Path) -> None:
    """--out inside a store (its own manifest.json, a new file in its folders, the store folder
    itself) or in a data root's stores/: refused, naming the store; the store is byte for byte as it
    was and still validates."""
    current = layout.current_store_path(data_root, "p")
    store = current.resolve()
    stores = data_root / layout.STORES_DIR
    before = _tree(stores)
    for cmd in _writers():
        for out in (current / "manifest.json", store / "manifest.json", store / "shards" / "x.png", current):
            _refused(cmd, current, str(out), "is inside the store", str(store))
        for out in (stores / "p" / "preview.png", stores / "x.rrd"):
            _refused(cmd, current, str(out), "is inside the data root's stores folder", str(stores))
    assert _tree(stores) == before
    r = stage2("validate", str(current))
    assert r.returncode == 0, r.tail()
    # beside the data root (not in stores/) is an ordinary place to write
    r = stage2("preview", str(current), "--n", "1", "--out", str(data_root / "preview.png"))
    assert r.returncode == 0, r.tail()


def test_check_output_path_of_a_new_store_folder(data_root: Path, tmp_path: Path) -> None:
    """``kind="folder"`` (a new store's folder): nothing there, or a folder that is no store; a link,
    a file, a FIFO or a store itself refused; a data root's stores/ is where stores go."""
    from stage2_data.errors import StoreError
    from stage2_data.fsutil import check_output_path

    def refused(path: Path, said: str) -> None:
        with pytest.raises(StoreError, match=said):
            check_output_path(path, kind="folder", error=StoreError)

    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    os.mkfifo(tmp_path / "fifo")
    store = layout.current_store_path(data_root, "p").resolve()
    for ok in (tmp_path / "new", tmp_path / "empty", data_root / layout.STORES_DIR / "p" / "v2-new"):
        assert check_output_path(ok, kind="folder", error=StoreError) == ok
    refused(tmp_path / "link", "is a symbolic link")
    refused(tmp_path / "a-file", "is a regular file, not a folder to replace")
    refused(tmp_path / "fifo", "is a FIFO")
    refused(store, "is a store: a store is immutable")
    refused(store / "shards" / "new", "is inside the store")


# ----- builds: the generated instance configuration, failed checks, settings ------------------------
def _demo_copy(demo_cache: DemoPaths, dst: Path) -> DemoPaths:
    shutil.copytree(demo_cache.root, dst, symlinks=True)
    return DemoPaths(
        root=dst,
        upstream=dst / demo_cache.upstream.relative_to(demo_cache.root),
        kit_root=dst / demo_cache.kit_root.relative_to(demo_cache.root),
        profile=dst / demo_cache.profile.relative_to(demo_cache.root),
        repo_id=demo_cache.repo_id,
        revision=demo_cache.revision,
    )


def _env(**extra: str) -> dict[str, str]:
    """A user's environment: no DAGSTER_HOME (a build's instance is <data root>/.dagster)."""
    return subprocess_env(drop=("DAGSTER_HOME", "HF_TOKEN", "STAGE2_KEEP_STORES"), **extra)


def _build(demo: DemoPaths, root: Path, *args: str, **env: str) -> Ran:
    return stage2(
        "build",
        "--profile",
        str(demo.profile),
        "--data-root",
        str(root),
        "--hub-folder",
        str(demo.upstream),
        "--no-progress",
        *args,
        env=_env(**env),
    )


def _instance_paths(root: Path) -> list[str]:
    """Every path the data root's generated dagster.yaml names (parsed as YAML, as Dagster reads it)."""
    cfg = yaml.safe_load((root / ".dagster" / "dagster.yaml").read_text(encoding="utf-8"))
    return [cfg[k]["config"]["base_dir"] for k in ("event_log_storage", "compute_logs")]


def _runs(root: Path) -> int:
    """The runs the data root's own instance recorded."""
    # closed here, not when collected: SQLite removes its -wal and -shm files at the last close
    with contextlib.closing(sqlite3.connect(root / ".dagster" / "history" / "runs.db")) as db:
        return int(db.execute("select count(*) from runs").fetchone()[0])


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def world(demo_cache: DemoPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A private copy of the demo, and one whole `stage2 build` of it into a data root named
    ``run #2/data`` (a YAML comment, unquoted): the data root the rows below copy."""
    base = tmp_path_factory.mktemp("outputs")
    demo = _demo_copy(demo_cache, base / "demo")
    root = base / "run #2" / "data"
    r = _build(demo, root, "--json")
    yield {"base": base, "demo": demo, "root": root, "build": r}


@pytest.mark.slow
@fault_cases(
    proc_cfg_hash={"name": "run #2"},
    proc_cfg_colon={"name": "a: b"},
    proc_cfg_newline={"name": "one\ntwo"},
)
def test_fault_proc_config(world: dict[str, Any], tmp_path: Path, case: dict[str, str]) -> None:
    """A data root whose path holds ` #`, `: ` or a newline: the build succeeds and its instance
    (dagster.yaml, the event log, the step logs) is inside that data root, nowhere else."""
    if case["name"] == "run #2":
        root, r = world["root"], world["build"]
        base = world["base"]
    else:
        base = tmp_path
        root = tmp_path / case["name"] / "data"
        before = outside(world["base"], world["root"])
        r = _build(world["demo"], root, "--json")
        assert outside(world["base"], world["root"]) == before
    assert r.returncode == 0, r.tail()
    assert r.json()["dagster_home"] == str(root / ".dagster")
    assert _instance_paths(root) == [str(root / ".dagster" / "history"), str(root / ".dagster" / "storage")]
    assert _runs(root) >= 4  # the build's runs, in its own instance
    # nothing of the instance written beside the data root (`run #2` was cut to `run`, `a: b` to `a`)
    made = sorted(p.name for p in base.iterdir())
    assert made == sorted({case["name"], *(["demo"] if base == world["base"] else [])}), made


@pytest.mark.slow
def test_every_build_json_has_the_same_keys(world: dict[str, Any], tmp_path: Path) -> None:
    """`stage2 build --json` prints an object with the same keys whatever happened: a build that
    ran, a no-op build (every stage up to date: no run) and a build refused before it ran anything
    (its data root a file). A script reads one shape."""
    built = world["build"]
    assert built.returncode == 0, built.tail()
    copy = tmp_path / "copy" / "data"
    shutil.copytree(world["root"], copy, symlinks=True)
    first = _build(world["demo"], copy)  # a copy's files have new stats: checked again once
    assert first.returncode == 0, first.tail()
    noop = _build(world["demo"], copy, "--json")
    assert noop.returncode == 0, noop.tail()
    assert noop.json()["runs"] == [] and noop.json()["up_to_date"], noop.stdout
    (tmp_path / "a-file").write_text("not a folder\n")
    refused = _build(world["demo"], tmp_path / "a-file", "--json")
    assert refused.returncode == 2, refused.tail()
    assert refused.json()["errors"][0]["error"] == "FileSystemError", refused.stdout
    assert refused.json()["errors"][0]["could_not_run"] is True, refused.stdout  # exit 2
    keys = {name: sorted(r.json()) for name, r in (("ran", built), ("no-op", noop), ("refused", refused))}
    assert keys["ran"] == keys["no-op"] == keys["refused"], keys
    assert {"ok", "store", "fingerprint", "runs", "checks", "errors", "up_to_date", "ui"} <= set(keys["ran"])


@pytest.mark.slow
def test_a_dagster_home_that_is_a_file_is_refused_with_the_builds_summary(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """DAGSTER_HOME naming a regular file (QA): a build that runs printed, with --json, the generic
    error object (not the build's summary keys), did not name DAGSTER_HOME, and its fix said to move
    or delete the file (a user's); a no-op build ignored it. Both are refused now, exit 2, before
    anything is written: DAGSTER_HOME names a file, not a folder; the fix sets it to a folder or
    unsets it; --json prints the build's summary, the refusal its one error. The file is untouched."""
    built = world["build"]
    assert built.returncode == 0, built.tail()
    noop = _build(world["demo"], world["root"], "--json")  # the no-op path: nothing to do there
    assert noop.returncode == 0 and noop.json()["up_to_date"] and noop.json()["runs"] == [], noop.tail()
    mine = tmp_path / "my-notes.txt"
    mine.write_text("a user's file\n")
    fresh = tmp_path / "fresh" / "data"  # the path that runs: nothing built there yet
    for root in (world["root"], fresh):
        before = (outside(tmp_path), outside(world["root"]))
        for args in ((), ("--json",)):
            r = _build(world["demo"], root, *args, DAGSTER_HOME=str(mine))
            assert r.returncode == 2, r.tail()
            err = r.stderr.strip()
            assert len(err.splitlines()) == 1 and "Traceback" not in err, err
            assert f"DAGSTER_HOME={str(mine)!r} names a regular file, not a folder" in err, err
            assert (
                "Fix: set DAGSTER_HOME to a folder (or unset it: " in err and "<data root>/.dagster" in err
            ), err
            assert "move or delete" not in err, err
            if args:
                doc = r.json()
                assert sorted(doc) == sorted(built.json()), doc  # the build's summary, every key
                assert not doc["ok"] and doc["runs"] == [] and doc["dagster_home"] is None, doc
                assert [e["error"] for e in doc["errors"]] == ["SettingError"], doc["errors"]
                assert "DAGSTER_HOME" in doc["errors"][0]["message"], doc["errors"]
        assert mine.read_text() == "a user's file\n"
        assert (outside(tmp_path), outside(world["root"])) == before  # nothing written, the file kept
    assert not fresh.exists()


@pytest.mark.slow
def test_fault_proc_moved_root(world: dict[str, Any], tmp_path: Path) -> None:
    """A data root copied, then moved: each build records into the instance of the data root it
    builds (its dagster.yaml rewritten for its place); the original's instance is untouched."""
    original = world["root"]
    assert world["build"].returncode == 0, world["build"].tail()
    kept = _files(original / ".dagster")
    runs = _runs(original)
    copy = tmp_path / "copy" / "data"
    shutil.copytree(original, copy, symlinks=True)
    r = _build(world["demo"], copy, "--reverify", "--json")  # --reverify: every stage runs
    assert r.returncode == 0, r.tail()
    assert r.json()["dagster_home"] == str(copy / ".dagster")
    assert _instance_paths(copy) == [str(copy / ".dagster" / "history"), str(copy / ".dagster" / "storage")]
    assert _runs(copy) > runs
    moved = tmp_path / "moved" / "data"
    moved.parent.mkdir()
    copy.rename(moved)
    copied_runs = _runs(moved)
    r = _build(world["demo"], moved, "--reverify")
    assert r.returncode == 0, r.tail()
    assert _instance_paths(moved)[0] == str(moved / ".dagster" / "history")
    assert _runs(moved) > copied_runs
    assert not copy.exists()  # the moved data root's old place: nothing written back there
    assert _files(original / ".dagster") == kept and _runs(original) == runs
    # a dagster.yaml of the user's own (not stage2's first line) is never rewritten
    own = "telemetry:\n  enabled: false\n"
    (moved / ".dagster" / "dagster.yaml").write_text(own)
    r = _build(world["demo"], moved, "--reverify")
    assert r.returncode == 0, r.tail()
    assert (moved / ".dagster" / "dagster.yaml").read_text() == own


# The dagster.yaml stage2 wrote before its instance named only Dagster's own classes: an event log
# and step logs of stage2's own modules, since removed (docs/architecture.md, "A build's local instance").
_EARLIER_YAML = """\
# Written by stage2 for a local instance. Rewritten by `stage2 build` when the instance's folder
# moved (a copied or moved data root records into its own instance); delete this first line to keep
# your own edits.
telemetry:
  enabled: false
run_coordinator:
  module: dagster.core.run_coordinator
  class: DefaultRunCoordinator
event_log_storage:
  module: stage2_pipelines.eventlog
  class: FastSqliteEventLogStorage
  config:
    base_dir: {home}/history
compute_logs:
  module: stage2_pipelines.computelogs
  class: StepLogsToFiles
  config:
    base_dir: {home}/storage
"""


@pytest.mark.slow
def test_fault_proc_earlier_instance(world: dict[str, Any], tmp_path: Path) -> None:
    """A data root whose instance an earlier stage2 wrote, naming its own storage classes (gone
    now): the next build rewrites the dagster.yaml to Dagster's classes, on the same files, so the
    earlier runs and their events stay in the instance the UI reads."""
    import dagster as dg

    assert world["build"].returncode == 0, world["build"].tail()
    root = tmp_path / "data"
    shutil.copytree(world["root"], root, symlinks=True)
    home = root / ".dagster"
    (home / "dagster.yaml").write_text(_EARLIER_YAML.format(home=home), encoding="utf-8")
    with sqlite3.connect(home / "history" / "runs.db") as db:
        earlier = {row[0] for row in db.execute("select run_id from runs")}
    r = _build(world["demo"], root, "--reverify")
    assert r.returncode == 0, r.tail()
    written = (home / "dagster.yaml").read_text(encoding="utf-8")
    assert "stage2_pipelines" not in written and "ConsolidatedSqliteEventLogStorage" in written
    assert _instance_paths(root) == [str(home / "history"), str(home / "storage")]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = {run.run_id for run in instance.get_runs()}
        assert earlier < runs  # the earlier runs kept, the new ones added
        assert all(instance.all_logs(run_id) for run_id in earlier)  # with their events


@pytest.mark.slow
def test_fault_proc_check_failed(world: dict[str, Any], tmp_path: Path) -> None:
    """A blocking check of the last stage fails (a kit SHA256SUMS line changed): exit 1, the check's
    name, the file and the fix in the text output and in --json errors, and nothing calling it a bug."""
    demo = _demo_copy(world["demo"], tmp_path / "demo")
    root = tmp_path / "data"
    shutil.copytree(world["root"], root, symlinks=True)
    sums = demo.kit_root / "manifests" / "stage2_subset_SHA256SUMS"
    lines = sums.read_text().splitlines(keepends=True)
    digest, name = lines[0].split(maxsplit=1)
    wrong = digest[::-1]
    sums.write_text("".join([f"{wrong}  {name}", *lines[1:]]))
    name = name.strip()
    check = "subset_bytes_match_sha256sums"
    r = _build(demo, root)
    assert r.returncode == 1, r.tail()
    assert "internal error" not in r.stdout + r.stderr and "a bug" not in r.stdout + r.stderr, r.tail()
    line = next((ln for ln in r.stdout.splitlines() if f"failed check subset_checksums:{check}: " in ln), "")
    assert name in line and wrong in line and "fix" in line.lower(), r.stdout
    r = _build(demo, root, "--json")
    assert r.returncode == 1, r.tail()
    assert "internal error" not in r.stdout + r.stderr, r.tail()
    doc = r.json()
    assert not doc["ok"] and doc["store"] is None
    errors = [e for e in doc["errors"] if e.get("check") == check]
    assert len(errors) == 1 and errors == doc["errors"], doc["errors"]
    assert errors[0]["could_not_run"] is False, errors  # every error says it: here the data's (exit 1)
    message = errors[0]["message"]
    assert message.startswith(f"check subset_checksums:{check} failed: "), message
    assert name in message and wrong in message and "fix" in message.lower(), message
    assert [c["check"] for c in doc["checks"] if not c["passed"]] == [check]
    # the sums file fixed: the build converges to the original data root's store
    sums.write_text("".join(lines))
    r = _build(demo, root, "--json")
    assert r.returncode == 0, r.tail()
    clean = json.loads(world["build"].stdout)["fingerprint"]
    assert r.json()["fingerprint"] == clean


@fault_cases(prof_keep_text={"value": "abc"}, prof_keep_negative={"value": "-1"})
def test_fault_prof_keep_stores(tmp_path: Path, demo_cache: DemoPaths, case: dict[str, str]) -> None:
    """``STAGE2_KEEP_STORES`` that `stage2 gc` refuses: `stage2 build` (and `stage2 demo`) refuse it
    too, up front, with the same named error (exit 2), before anything is created."""
    root = tmp_path / "data"
    before = outside(tmp_path)
    value = case["value"]
    said = f"STAGE2_KEEP_STORES={value!r} is not a number of stores"
    argv = ("build", "--profile", str(demo_cache.profile), "--data-root", str(root), "--endpoint", NOWHERE)
    demo = ("demo", "--out", str(tmp_path / "demo"))
    for args in (argv, demo, (*argv, "--json"), (*demo, "--json")):
        r = stage2(*args, env=_env(STAGE2_KEEP_STORES=value))
        assert r.returncode == 2, r.tail()
        assert said in r.stderr and "Fix: set STAGE2_KEEP_STORES to an integer >= 0" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        if "--json" in args:  # one object on stdout too: nothing run, the refusal its one error
            doc = r.json()
            assert doc["ok"] is False and doc["runs"] == [] and doc["store"] is None, doc
            assert [said in e["message"] for e in doc["errors"]] == [True], doc["errors"]
        else:
            assert r.stdout == "", r.stdout
    assert not root.exists() and outside(tmp_path) == before
    gc = stage2("gc", str(tmp_path), "--dry-run", env=_env(STAGE2_KEEP_STORES=value))
    assert gc.returncode == 2 and said in gc.stderr, gc.tail()


# ----- the training loader --------------------------------------------------------------------------
def test_fault_store_loader_split(store: Path) -> None:
    """A trainer selects a split the store does not have: a LoaderError listing the splits, before
    the store is opened (not the reader's bare KeyError)."""
    with pytest.raises(LoaderError) as err:
        Selection(store, split="validation")
    assert str(err.value) == (
        "split 'validation' is not a split of a store; the splits are: train, val, test (or 'all' / "
        "None: every split). Fix: pass split= one of 'train', 'val', 'test', or None"
    )


def test_fault_store_loader_state(store: Path) -> None:
    """A trainer resumes from a malformed state (hand-edited, truncated, another object): a
    LoaderError naming what is wrong and what a state holds; the order stays where it was."""
    with Selection(store) as sel:
        order = SeededOrder(len(sel), seed=3)
    good = order.state_dict()
    for state, said in (
        ({k: v for k, v in good.items() if k != "epoch"}, "the saved order state has no 'epoch'"),
        (good | {"start": "4"}, "start='4' is not an integer"),
        (good | {"start": len(order) + 1}, f"start {len(order) + 1} is past the end of epoch 0"),
        (json.dumps(good), "the saved order state is str"),
    ):
        with pytest.raises(LoaderError, match=said):
            order.load_state_dict(state)  # type: ignore[arg-type]
        assert (order.epoch, order.start) == (0, 0)
    order.load_state_dict(json.loads(json.dumps(good)))
    assert (order.epoch, order.start) == (0, 0)


def test_fault_store_merge_out(data_root: Path, tmp_path: Path) -> None:
    """`stage2 merge --out` given a symbolic link (publishing would replace the link itself), a FIFO,
    or a store already there (it would be replaced, a user's store gone): refused before anything is
    read or written, naming --out and the path; the link, its target and the store are kept."""
    current = layout.current_store_path(data_root, "p")
    store = current.resolve()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(tmp_path / "fifo")
    before = _tree(tmp_path)
    for out, why in (
        (tmp_path / "link", "is a symbolic link"),
        (tmp_path / "fifo", "is a FIFO"),
        (store, "store"),
    ):
        r = stage2("merge", str(current), str(current), "--out", str(out))
        assert r.returncode == 2, r.tail()
        assert f"--out {out}" in r.stderr and why in r.stderr and "Fix:" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert _tree(tmp_path) == before
    # the reader, the dataset and the selection name a split typo alike, one error class that is
    # a StoreError and a LoaderError (the reader raised one, the dataset and selection the other: QA)
    from stage2_data.errors import LoaderError, SplitNameError
    from stage2_data.loader import Selection
    from stage2_data.store import VinOfflineDataset

    with VinOfflineStoreReader(store) as reader, pytest.raises(StoreError) as err:
        reader.split("validation")  # not a bare KeyError
    for call in (
        lambda: VinOfflineDataset(store, split="validation"),
        lambda: Selection(store, "validation"),
    ):
        with pytest.raises(LoaderError) as other:
            call()
        assert type(other.value) is type(err.value) is SplitNameError
        assert str(other.value) == str(err.value)
    assert "split 'validation' is not a split of a store; the splits are: train, val, test" in str(err.value)
    assert "Fix: pass split= one of 'train', 'val', 'test', or None" in str(err.value)
