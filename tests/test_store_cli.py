"""The store's CLI (summary, validate, merge), the version refusal's rebuild command run for real,
stale temp folders of killed builds, and the vin_store asset's metadata across materializations."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import REPO, python_argv, run, stage2, subprocess_env
from test_store import INPUTS, PROFILE, Upstream, build, make_upstream

from stage2_data import layout
from stage2_data.cli import main
from stage2_data.errors import StoreNotFoundError
from stage2_data.profile import load_profile
from stage2_data.store import (
    OFFLINE_DATASET_VERSION,
    VinOfflineStoreReader,
    rebuild_command,
    stale_temp_dirs,
    store_fingerprint,
    validate_vin_offline_store,
)

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("cli-upstream"), range(1, 13), seed=3)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory, up: Upstream) -> Path:
    out = tmp_path_factory.mktemp("cli-store") / "store"
    build(out, up)
    return out


# ----- summary ---------------------------------------------------------------------------------------
def test_summary_table_and_json(small_store: Path, up: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(small_store), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    per_split = {sp: sum(s.split == sp for s in up.samples) for sp in ("train", "val", "test")}
    assert doc["samples"] == len(up.samples) and doc["pairs"] == len(up.pairs)
    assert doc["per_split"] == per_split
    assert doc["per_source"] == {"autoeval": 6, "racer": 6}
    assert sum(doc["per_split_source"]["train"].values()) == per_split["train"]
    nfs = [f.shape[0] for f in up.frames.values()]
    assert (doc["frames_per_sample"]["min"], doc["frames_per_sample"]["max"]) == (min(nfs), max(nfs))
    blocks = doc["bytes_per_block"]
    assert blocks["frames"]["estimated_uncompressed"] == sum(f.nbytes for f in up.frames.values())
    assert blocks["frames"]["stored_uncompressed"] >= blocks["frames"]["estimated_uncompressed"]
    assert blocks["frames"]["on_disk"] > 0 and blocks["total"]["on_disk"] == doc["bytes"]["on_disk"]["total"]
    assert blocks["total"]["on_disk"] == sum(p.stat().st_size for p in small_store.rglob("*") if p.is_file())

    assert main(["summary", str(small_store)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert f"fingerprint:  {doc['fingerprint']}" in lines
    assert any(line.startswith("frames/sample: min") for line in lines)
    header = next(line for line in lines if line.startswith("split"))
    assert header.split() == ["split", "autoeval", "racer", "samples", "pairs"]
    total = next(line for line in lines if line.startswith("total "))
    assert total.split() == ["total", "6", "6", str(len(up.samples)), str(len(up.pairs))]
    train = next(line for line in lines if line.startswith("train "))
    assert train.split()[-2:] == [str(per_split["train"]), str(doc["pairs_per_split"].get("train", 0))]
    bhead = next(line for line in lines if line.startswith("block"))
    assert "estimated (payload)" in bhead and "on disk" in bhead
    assert any(line.startswith("actions/aligned ") for line in lines)


def test_help_has_an_example_each(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("summary", "validate", "merge"):
        with pytest.raises(SystemExit) as ei:
            main([cmd, "--help"])
        assert ei.value.code == 0
        out = capsys.readouterr().out
        assert f"Example:\n  stage2 {cmd} " in out, out


# ----- validate --------------------------------------------------------------------------------------
def test_validate_valid_invalid_and_deep(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(small_store), "--deep"]) == 0
    assert "is valid (deep" in capsys.readouterr().out
    s = tmp_path / "s"
    shutil.copytree(small_store, s)
    victim = next(p for p in sorted((s / "shards").rglob("*")) if p.is_file() and "/frames/c/" in str(p))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    # same size: the chunk's crc32c sees it (plain validate names the file), and --deep's sha256 too
    assert main(["validate", str(s)]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and str(victim) in out and "fail their crc32c" in out
    assert main(["validate", str(s), "--deep", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["opened"] is True
    assert any(str(victim) in p and "sha256" in p for p in doc["problems"])
    (s / "splits" / "val.npy").unlink()
    assert main(["validate", str(s)]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "val.npy: missing split file" in out
    (s / "manifest.json").unlink()
    assert main(["validate", str(s), "--json"]) == 2
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert doc["ok"] is False and doc["opened"] is False and doc["error"] == "StoreNotFoundError"
    assert "incomplete or not a store" in cap.err


@pytest.mark.parametrize("table", ["sample_index.jsonl", "pairs.jsonl"])
def test_validate_checks_the_tables_it_reads_whole_at_every_level(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str
) -> None:
    """A same-length edit of a table validation reads whole (a sample's label failure -> success; a
    pair's chosen and rejected swapped): plain `stage2 validate`, with --decode, and --deep each
    exit 1 naming the file, its sha256 and the manifest's (no crc32c covers these files; their
    sha256 does)."""
    s = tmp_path / "s"
    shutil.copytree(small_store, s)
    path = s / table
    text = path.read_text()
    if table == "sample_index.jsonl":
        old, new = '"quality_label":"failure"', '"quality_label":"success"'
    else:
        rows = [json.loads(line) for line in text.splitlines()]
        p = next(
            p
            for p in rows
            if len(str(p["chosen_sample_index"])) == len(str(p["rejected_sample_index"]))
            and p["chosen_sample_index"] != p["rejected_sample_index"]
        )
        c, r = p["chosen_sample_index"], p["rejected_sample_index"]
        old = f'"chosen_sample_index":{c},"rejected_sample_index":{r}'
        new = f'"chosen_sample_index":{r},"rejected_sample_index":{c}'
    assert old in text and len(old) == len(new)
    path.write_text(text.replace(old, new, 1))
    assert path.stat().st_size == (small_store / table).stat().st_size
    for flags in ([], ["--decode"], ["--deep", "--decode"]):
        assert main(["validate", str(s), *flags]) == 1, flags
        out = capsys.readouterr().out
        said = [line for line in out.splitlines() if f"{path}: sha256 " in line]
        assert "INVALID" in out and len(said) == 1 and "the manifest says" in said[0], (flags, out)
    assert main(["validate", str(s), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and any(f"{path}: sha256 " in p for p in doc["problems"]), doc


@pytest.mark.parametrize(
    "given",
    [
        "nothing",
        "a file",
        "a profile's stores folder",
        "a data root",
        "an empty folder",
        "a folder of other files",
        "a store without its manifest",
    ],
)
def test_a_path_that_is_no_store_is_named_with_the_store_meant(
    small_store: Path, tmp_path: Path, given: str
) -> None:
    """`stage2 validate` (and every command that opens a store) on a path that holds no store says
    what is there and what to pass instead: the `current` link of a stores folder, the stores of a
    data root (each one a path that then validates)."""
    root = tmp_path / "data"
    stores = root / "stores" / "p"
    stores.mkdir(parents=True)
    shutil.copytree(small_store, stores / "v2-0")
    (stores / "current").symlink_to("v2-0")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a store")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "README.md").write_text("a folder, not a store")
    shutil.copytree(small_store, tmp_path / "half")
    (tmp_path / "half" / "manifest.json").unlink()
    path, said, fix = {
        "nothing": (tmp_path / "missing", "nothing is there", "check the path"),
        "a file": (tmp_path / "notes.txt", "it is a file, not a store folder", "pass the store's folder"),
        "a profile's stores folder": (
            stores,
            "it is a profile's stores folder",
            f"pass its current store: {stores / 'current'}",
        ),
        "a data root": (root, "it is a data root", f"pass one of its stores: {stores / 'current'}"),
        "an empty folder": (
            tmp_path / "empty",
            "manifest.json is missing (incomplete or not a store)",
            "build it",
        ),
        "a folder of other files": (
            tmp_path / "other",
            "it is a folder of other files (no manifest.json, no shards/)",
            "pass the store's folder (the one holding manifest.json)",
        ),
        "a store without its manifest": (
            tmp_path / "half",
            "manifest.json is missing (incomplete or not a store)",
            "build it",
        ),
    }[given]
    r = stage2("validate", str(path), timeout=120)
    assert r.returncode == 2, r.tail()
    line = r.stderr.strip()
    assert line == line.splitlines()[0] and "Traceback" not in line, line
    assert f"no complete VIN offline store at {path}: {said}. Fix: {fix}" in line, line
    if given in ("a profile's stores folder", "a data root"):  # the path it names is the store
        assert stage2("validate", line.split(": ")[-1].split(", ")[0], timeout=120).returncode == 0


@pytest.mark.parametrize("command", ["preview", "export-rrd", "merge base", "merge sidecar", "python api"])
def test_a_relative_store_path_with_nothing_there_is_named_as_given(
    small_store: Path, tmp_path: Path, command: str
) -> None:
    """Every way a store is opened (not only validate and summary) says a relative path with nothing
    there as the user gave it: taken relative to the working folder (named), and the fix says first to
    run from the folder it is relative to; the path named is the folder the reader looked at. A path
    climbing out of the working folder (``../``) is said so too."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "data").mkdir()  # ../data exists: its stores folder does not
    for given, root in (
        (".demo/data/stores/p/current", None),
        ("../data/stores/p/current", tmp_path / "data"),
    ):
        argv = {
            "preview": ["preview", given, "--out", str(tmp_path / "p.png")],
            "export-rrd": ["export-rrd", given, "0", "--out", str(tmp_path / "t.rrd")],
            "merge base": ["merge", given, str(small_store), "--out", str(tmp_path / "m")],
            "merge sidecar": ["merge", str(small_store), given, "--out", str(tmp_path / "m")],
            "python api": [],
        }[command]
        if argv:
            r = stage2(*argv, cwd=work, timeout=120)
            assert r.returncode == 2, r.tail()
            line = r.stderr.strip()
            assert line == line.splitlines()[0] and "Traceback" not in line, line
        else:
            snippet = (
                "import sys; from stage2_data.store import VinOfflineStoreReader; "
                "VinOfflineStoreReader(sys.argv[1])"
            )
            r = run(python_argv(snippet, given), cwd=work, timeout=120)
            assert r.returncode != 0 and "StoreNotFoundError" in r.stderr, r.tail()
            line = r.stderr.strip().splitlines()[-1]
        looked_at = os.path.normpath(work / given)
        assert (
            f"no complete VIN offline store at {looked_at}: nothing is there (the relative path {given} "
            f"was taken relative to the working folder {work})." in line
        ), line
        assert f"run the command from the folder {given} is relative to, or pass its absolute path; " in line
        data_root = "<the data root stage2 build filled>" if root is None else str(root)
        assert line.endswith(f"build it: stage2 build --profile PROFILE.toml --data-root {data_root}"), line
        assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("given", ["current", "a store folder", "a data root"])
def test_gc_on_a_store_or_a_data_root_names_the_folder_meant(
    small_store: Path, tmp_path: Path, given: str
) -> None:
    """`stage2 gc` takes a folder of stores; given a store (its `current` link or its folder) or a
    data root, it names the folder meant, and gc on that folder then runs."""
    root = tmp_path / "data"
    stores = root / "stores" / "p"
    stores.mkdir(parents=True)
    shutil.copytree(small_store, stores / "v2-0")
    (stores / "current").symlink_to("v2-0")
    path, said, meant = {
        "current": (stores / "current", "is a store, not a folder of stores", stores),
        "a store folder": (stores / "v2-0", "is a store, not a folder of stores", stores),
        "a data root": (root, "holds no stores", root / "stores"),
    }[given]
    r = stage2("gc", str(path), "--dry-run", timeout=120)
    assert r.returncode == 2, r.tail()
    line = r.stderr.strip()
    assert line.startswith(f"stage2 gc: error: {path} {said}") and line.endswith(f": {meant}"), line
    assert stage2("gc", str(meant), "--dry-run", timeout=120).returncode == 0


def test_version_refusal_small_store_json(small_store: Path, tmp_path: Path) -> None:
    s = tmp_path / "s"
    shutil.copytree(small_store, s)
    m = json.loads((s / "manifest.json").read_text())
    m["version"] = 1
    (s / "manifest.json").write_text(json.dumps(m))
    r = stage2("validate", str(s), "--json")
    assert r.returncode == 2
    doc = r.json()
    assert doc["message"] == f"Unsupported VIN offline store version: 1. Expected {OFFLINE_DATASET_VERSION}."
    assert doc["fix"].endswith(rebuild_command(s, m))
    r = stage2("summary", str(s))
    assert r.returncode == 2 and r.stdout == ""
    assert f"Unsupported VIN offline store version: 1. Expected {OFFLINE_DATASET_VERSION}." in r.stderr

    # a store of a newer version: the fix is to upgrade, never to rebuild it a version back (QA)
    m["version"] = OFFLINE_DATASET_VERSION + 1
    (s / "manifest.json").write_text(json.dumps(m))
    doc = stage2("validate", str(s), "--json").json()
    writer = f"{m['writer']['package']} {m['writer']['version']}"
    assert doc["message"] == (
        f"VIN offline store version {OFFLINE_DATASET_VERSION + 1} at {s} (written by {writer}) is newer "
        f"than this stage2-data reads (version {OFFLINE_DATASET_VERSION})."
    ), doc
    assert doc["fix"].startswith("upgrade stage2-data where you read it") and "stage2 build" not in doc["fix"]


# ----- merge -----------------------------------------------------------------------------------------
def test_merge_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base_up = make_upstream(tmp_path / "u1", range(1, 9), seed=5)
    side_up = make_upstream(tmp_path / "u2", range(30, 35), seed=6)
    base, side, out = tmp_path / "base", tmp_path / "side", tmp_path / "merged"
    build(base, base_up)
    build(side, side_up, rows_per_shard=2)
    base_fp = json.loads((base / "manifest.json").read_text())["fingerprint"]
    assert main(["merge", str(base), str(side), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["samples"] == 13 and doc["store"] == str(out)
    assert [x["role"] for x in doc["merged_from"]] == ["base", "sidecar"]
    assert validate_vin_offline_store(out, deep=True) == []
    assert VinOfflineStoreReader(out).manifest["fingerprint"] == doc["fingerprint"] == store_fingerprint(out)
    assert json.loads((base / "manifest.json").read_text())["fingerprint"] == base_fp
    # the output may not be an input: one line, exit 2, nothing changed
    r = stage2("merge", str(base), str(side), "--out", str(base))
    assert r.returncode == 2 and "immutable" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # a sidecar that repeats base trajectories is refused, naming the overlap
    assert main(["merge", str(base), str(base), "--out", str(tmp_path / "m2")]) == 2
    assert "sample keys are in both stores" in capsys.readouterr().err
    assert not (tmp_path / "m2").exists()


def _merge_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A base store and a sidecar store of new trajectories (as test_merge_cli)."""
    base, side = tmp_path / "base", tmp_path / "side"
    build(base, make_upstream(tmp_path / "u1", range(1, 9), seed=5))
    build(side, make_upstream(tmp_path / "u2", range(30, 35), seed=6), rows_per_shard=2)
    return base, side


def _same_length_edit(path: Path, old: str, new: str) -> None:
    assert len(old) == len(new)
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def _left_at(tmp_path: Path, name: str) -> list[str]:
    """``name`` and any staging folder of it left in ``tmp_path``."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name == name or p.name.startswith(f".{name}."))


def test_merge_refuses_a_base_whose_metadata_changed_and_leaves_nothing(tmp_path: Path) -> None:
    """A same-length edit of a base shard's ``zarr.json`` (``"endian": "little"`` -> ``"big"``):
    a merge hard-linked it into its output, exited 0 with a fingerprint, and the merged store
    failed `validate --deep`. The merge validates both inputs first, and validation at every level
    hashes the metadata files (stop 56; before, the merge's hash of every file it links or copies
    against its input manifest found it): `stage2 merge` refuses (exit 2) naming the file, its
    sha256 and the manifest's, with the fix, and nothing is left at --out."""
    base, side = _merge_inputs(tmp_path)
    meta = base / "shards" / "shard-000000" / "actions" / "aligned" / "zarr.json"
    _same_length_edit(meta, '"endian": "little"', '"endian":    "big"')
    for level in ((), ("--deep",)):
        assert stage2("validate", str(base), *level).returncode == 1
    out = tmp_path / "merged"
    r = stage2("merge", str(base), str(side), "--out", str(out))
    assert r.returncode == 2, r.tail()
    assert r.stderr.startswith(f"stage2 merge: error: VIN offline store {base} is invalid"), r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    for part in (f"{meta}: sha256 ", "the manifest says", "Fix: rebuild it: stage2 build "):
        assert part in r.stderr, (part, r.stderr)
    assert r.stdout == "" and _left_at(tmp_path, "merged") == []


def test_merge_output_passes_the_publication_gate_before_it_is_published(tmp_path: Path) -> None:
    """A base store whose sample index says another frames_sha256 for one sample, with the
    manifest's sha256 of the index changed to match (the base's fingerprint no longer does, which
    only deep validation recomputes): every file the merge takes agrees with the base manifest,
    and a merge published a store that `validate --deep --decode` refuses. Now the merged store
    passes the publication gate (deep validation and the decode round trip) before it is
    published: `stage2 merge` exits 2 naming the sample's frames and the gate, and leaves
    nothing at --out; an --out that existed (an empty folder) is left as it was."""
    base, side = _merge_inputs(tmp_path)
    index = base / "sample_index.jsonl"
    manifest = base / "manifest.json"
    as_written = {p: p.read_bytes() for p in (index, manifest)}
    row = json.loads(index.read_text().splitlines()[0])
    old_sha = row["frames_sha256"]
    _same_length_edit(index, old_sha, old_sha[::-1])
    listed = next(f for f in json.loads(manifest.read_text())["files"] if f["path"] == "sample_index.jsonl")
    _same_length_edit(manifest, listed["sha256"], hashlib.sha256(index.read_bytes()).hexdigest())
    assert stage2("validate", str(base)).returncode == 0  # plain: the tables agree with the manifest
    out = tmp_path / "merged"
    r = stage2("merge", str(base), str(side), "--out", str(out))
    assert r.returncode == 2, r.tail()
    assert "Traceback" not in r.stderr and r.stdout == ""
    for part in ("failed the publication gate", f"nothing was written at {out}", "frames", "--deep --decode"):
        assert part in r.stderr, (part, r.stderr)
    assert _left_at(tmp_path, "merged") == []
    out.mkdir()  # an empty folder at --out stays as it was
    r = stage2("merge", str(base), str(side), "--out", str(out))
    assert r.returncode == 2 and "failed the publication gate" in r.stderr, r.tail()
    assert out.is_dir() and list(out.iterdir()) == [] and _left_at(tmp_path, "merged") == ["merged"]
    # the inputs as written merge, and the merged store is published read-only, as a published store
    for p, data in as_written.items():
        p.write_bytes(data)
    out.rmdir()
    r = stage2("merge", str(base), str(side), "--out", str(out), "--json")
    assert r.returncode == 0, r.tail()
    assert validate_vin_offline_store(out, deep=True, decode=True) == []
    assert not os.stat(out / "manifest.json").st_mode & 0o222


# ----- killed builds ---------------------------------------------------------------------------------
CHILD = r"""
import pickle, sys, time
from pathlib import Path
from stage2_data.store import VinOfflineWriter

args = pickle.loads(Path(sys.argv[1]).read_bytes())
marker = Path(sys.argv[2])

def progress(n):
    marker.write_text("one shard written")
    time.sleep(120)  # a long build: the parent kills us here with SIGKILL

VinOfflineWriter(Path(args["out"]), profile=args["profile"], inputs=args["inputs"], rows_per_shard=2,
                 progress=progress).write(args["samples"], args["pairs"])
"""


def _fake_owned(parent: Path, name: str, kind: str, pid: int, start: int) -> Path:
    import hashlib
    import socket

    host = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
    d = parent / f".{name}.{kind}-{pid}-{start}-{host}-abcdef012345"
    d.mkdir()
    (d / "junk").write_bytes(b"x" * 10)
    return d


def test_sigkilled_build_leaves_previous_store_and_next_build_cleans_up(
    small_store: Path, up: Upstream, tmp_path: Path
) -> None:
    out = tmp_path / "store"
    shutil.copytree(small_store, out)
    before = json.loads((out / "manifest.json").read_text())
    args = tmp_path / "args.pkl"
    args.write_bytes(
        pickle.dumps(
            {"out": str(out), "profile": PROFILE, "inputs": INPUTS, "samples": up.samples, "pairs": up.pairs}
        )
    )
    marker = tmp_path / "marker"
    child = subprocess.Popen(python_argv(CHILD, str(args), str(marker)), cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, "the writer exited before it was killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        staging = [p for p in tmp_path.iterdir() if p.name.startswith(".store.tmp-")]
        assert len(staging) == 1 and staging[0].name.startswith(f".store.tmp-{child.pid}-")
        assert stale_temp_dirs(out) == []  # its writer is alive: not stale
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    half = staging[0]
    assert (half / "shards" / "shard-000000").is_dir() and not (half / "manifest.json").exists()
    with pytest.raises(StoreNotFoundError):  # no half store is accepted
        VinOfflineStoreReader(half)
    assert validate_vin_offline_store(half) == [
        f"{half / 'manifest.json'}: missing (incomplete or not a store)"
    ]
    # the previous store is intact
    assert json.loads((out / "manifest.json").read_text()) == before
    assert validate_vin_offline_store(out, deep=True) == []
    assert stale_temp_dirs(out) == [half]

    # other leftovers: a dead writer's moved-aside old store (stale), a live writer's staging (kept),
    # a reused pid (same pid, another start time: stale), another store's staging (not ours to touch)
    dead_old = _fake_owned(tmp_path, "store", "old", child.pid, 1)
    live = _fake_owned(tmp_path, "store", "tmp", os.getpid(), _start_time(os.getpid()))
    reused = _fake_owned(tmp_path, "store", "tmp", os.getpid(), _start_time(os.getpid()) + 1)
    other = _fake_owned(tmp_path, "other", "tmp", child.pid, 1)
    assert set(stale_temp_dirs(out)) == {half, dead_old, reused}

    m = build(out, up, rows_per_shard=4)  # the next build cleans up and succeeds
    assert not half.exists() and not dead_old.exists() and not reused.exists()
    assert live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".store.")) == [live.name]
    assert VinOfflineStoreReader(out).manifest["fingerprint"] == m["fingerprint"] != before["fingerprint"]
    assert validate_vin_offline_store(out, deep=True) == []


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


# ----- the real pipeline: version refusal -> the printed command rebuilds; metadata; no rebuild -------
def _offline_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user's shell, with every proxy pointing at a closed port: any attempt to
    reach a hub (the default endpoint is the real one) fails, so a passing build proves none was made."""
    closed = "http://127.0.0.1:9"
    return subprocess_env(
        drop=("NO_PROXY", "DAGSTER_HOME"),
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        HTTP_PROXY=closed,
        HTTPS_PROXY=closed,
        http_proxy=closed,
        https_proxy=closed,
        HF_HUB_DISABLE_TELEMETRY="1",
        HOME=str(tmp_path / "home"),
    )


@pytest.fixture(scope="module")
def refused_then_rebuilt(built: dict, demo_cache: Any, tmp_path_factory: pytest.TempPathFactory) -> dict:
    assert built["summary"]["ok"], built["summary"]["errors"]
    tmp = tmp_path_factory.mktemp("refused")
    root = tmp / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(demo_cache.profile)
    current = layout.current_store_path(root, prof.name)
    store = current.resolve()
    mpath = store / "manifest.json"
    m = json.loads(mpath.read_text())
    m["version"] = 1
    mpath.write_text(json.dumps(m))
    env = _offline_env(tmp)
    refusal = stage2("validate", str(current), env=env)
    cmd = rebuild_command(current, m)
    t0 = time.monotonic()
    rebuild = run(shlex.split(cmd), cwd=tmp, env=env, timeout=600)
    print(f"\nrebuild command took {time.monotonic() - t0:.1f} s: {cmd}")
    return {
        "root": root,
        "store": store,
        "current": current,
        "profile": prof,
        "refusal": refusal,
        "cmd": cmd,
        "rebuild": rebuild,
        "fingerprint": built["summary"]["fingerprint"],
    }


def test_version_refusal_prints_the_command_that_rebuilds(
    refused_then_rebuilt: dict, demo_cache: Any
) -> None:
    r = refused_then_rebuilt
    ref = r["refusal"]
    assert ref.returncode == 2 and ref.stdout == ""
    lines = ref.stderr.strip().splitlines()
    assert len(lines) == 1, ref.stderr
    assert f"Unsupported VIN offline store version: 1. Expected {OFFLINE_DATASET_VERSION}." in lines[0]
    assert lines[0].endswith(r["cmd"])
    # the command names this data root (where the store lives) and the profile it was built from
    assert shlex.split(r["cmd"]) == [
        "stage2",
        "build",
        "--profile",
        str(demo_cache.profile),
        "--data-root",
        str(r["root"]),
    ]


def test_the_printed_command_rebuilds_offline(refused_then_rebuilt: dict) -> None:
    r = refused_then_rebuilt
    b = r["rebuild"]
    assert b.returncode == 0, b.tail()
    reader = VinOfflineStoreReader(r["current"])  # the strict reader opens the rebuilt store
    assert reader.manifest["version"] == OFFLINE_DATASET_VERSION
    assert r["current"].resolve() == r["store"]  # same inputs: the same v<VERSION>-<inputs> folder
    assert reader.manifest["fingerprint"] == r["fingerprint"]  # content-only: identical to the first build
    assert validate_vin_offline_store(r["current"], deep=True) == []
    assert [p.name for p in r["store"].parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []


def test_store_metadata_and_unchanged_inputs_do_not_rebuild(
    refused_then_rebuilt: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from stage2_pipelines.config import BuildConfig
    from stage2_pipelines.runs import run_selection

    r = refused_then_rebuilt
    assert r["rebuild"].returncode == 0
    home = r["root"] / ".dagster"  # the CLI's default instance for that data root
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    cfg = BuildConfig(
        profile_path=str(r["profile"].profile_path), data_root=str(r["root"]), endpoint="http://127.0.0.1:9"
    )
    res = run_selection(cfg.to_dict(), ["vin_store"])
    assert res["success"], res
    assert all(c["passed"] for c in res["checks"])
    instance = dg.DagsterInstance.get()
    records = instance.fetch_materializations(dg.AssetKey("vin_store"), limit=10).records
    mds = [rec.asset_materialization.metadata for rec in sorted(records, key=lambda x: x.storage_id)]
    assert len(mds) == 2
    first, second = ({k: getattr(v, "value", v) for k, v in md.items()} for md in mds)
    assert first["rebuilt"] is True  # the tampered store was rebuilt, never reused
    assert second["rebuilt"] is False  # unchanged inputs: nothing rebuilt
    assert first["fingerprint"] == second["fingerprint"] == r["fingerprint"]
    e = r["profile"].expected
    for md in (first, second):
        assert md["samples"] == e.unique_frame_files and md["pairs"] == e.pair_rows
        assert md["version"] == OFFLINE_DATASET_VERSION and md["shards"] >= 1
        total = sum(p.stat().st_size for p in r["store"].rglob("*") if p.is_file())
        assert md["bytes_on_disk"] == total
        assert "| frames | " in md["bytes_on_disk_per_block"]  # a Markdown table, sizes in IEC units
        assert md["size_on_disk"].endswith(("KiB", "MiB", "GiB"))


def test_gc_unused_removes_what_a_build_moved_aside_and_keeps_the_users_own(tmp_path: Path) -> None:
    """`stage2 gc --unused` removes each cache directory a build moved to unused/ (its extraction
    record beside it) with that record, says so one line a folder, and keeps a folder no build
    moved there; without the flag, or in a dry run, nothing there is touched."""
    root = tmp_path / "root"
    stores = root / layout.STORES_DIR
    stores.mkdir(parents=True)  # no store published yet: gc --unused still runs
    under = layout.unused_root(root) / layout.PROCESSED_DIR
    moved = under / "cache_a.1"
    (moved / "frames").mkdir(parents=True)
    (moved / "frames" / "t0.npz").write_bytes(b"x" * 1000)
    (moved / "dataset_info.json").write_text("{}")
    record = layout.extraction_record_path(layout.unused_root(root), "cache_a.1")
    record.parent.mkdir(parents=True)
    # the record as an extraction writes it: every file it wrote, with its sha256 and stats
    from stage2_data.extract.extract import ExtractionRecord, hash_regular_file

    entries = {}
    for rel in ("frames/t0.npz", "dataset_info.json"):
        sha, st = hash_regular_file(moved / rel)
        entries[rel] = [sha, *st]
    rec = ExtractionRecord("cache_a", ["cache_a.tar"], 2, 1002, 1, 1, 1, 0.1, "cache", entries=entries)
    record.write_text(json.dumps(rec.to_dict()))
    mine = under / "notes"
    mine.mkdir()
    (mine / "a.txt").write_text("mine")

    stage2("gc", str(stores), "--keep", "0")  # no store: refused, and unused/ untouched either way
    assert moved.is_dir() and record.is_file() and mine.is_dir()
    dry = stage2("gc", str(stores), "--unused", "--dry-run", "--json")
    assert dry.returncode == 0, dry.tail()
    doc = dry.json()["unused"]
    assert [(d["path"], d["cache_key"], d["files"], d["size"]) for d in doc["dirs"]] == [
        (str(moved), "cache_a", 2, 1002)
    ]
    assert [d["path"] for d in doc["kept"]] == [str(mine)] and doc["removed_dirs"] == 0
    assert moved.is_dir() and record.is_file()

    gc = stage2("gc", str(stores), "--unused")
    assert gc.returncode == 0, gc.tail()
    assert "removed  cache_a.1 (cache key cache_a): 2 file(s), 1002 B" in gc.stdout, gc.stdout
    assert "kept  notes: no extraction record" in gc.stdout and "unused: removed 1 folder(s)" in gc.stdout
    assert not moved.exists() and not record.exists() and (mine / "a.txt").read_text() == "mine"

    typo = tmp_path / "roto"  # no such data root: named, and not made by gc
    r = stage2("gc", str(typo / layout.STORES_DIR), "--unused", "--dry-run")
    assert r.returncode == 2 and f"no data root at {typo} (no such folder)" in r.stderr, r.tail()
    assert not typo.exists()
    elsewhere = stage2("gc", str(tmp_path / "somewhere"), "--unused")
    assert elsewhere.returncode == 2 and "--unused needs the local stores folder" in elsewhere.stderr
    assert "stage2 gc /data/stage2/stores --unused --dry-run" in elsewhere.stderr, elsewhere.tail()


def test_a_version_written_as_text_is_named_as_text(small_store: Path, tmp_path: Path) -> None:
    """``"version": "2"`` (text) was refused as "version: 2. Expected 2.", contradicting itself."""
    s = tmp_path / "s"
    shutil.copytree(small_store, s)
    m = json.loads((s / "manifest.json").read_text())
    m["version"] = str(OFFLINE_DATASET_VERSION)
    (s / "manifest.json").write_text(json.dumps(m))
    r = stage2("validate", str(s), "--json")
    assert r.returncode == 2, r.tail()
    assert r.json()["message"] == (
        f"Unsupported VIN offline store version: '{OFFLINE_DATASET_VERSION}' (a str, not a whole number). "
        f"Expected {OFFLINE_DATASET_VERSION}."
    )


@pytest.mark.parametrize("command", ["validate", "summary"])
def test_a_manifest_nested_too_deeply_is_named_not_an_internal_error(
    small_store: Path, tmp_path: Path, command: str
) -> None:
    """A manifest of deeply nested JSON (``[[[[...``) made every reader raise RecursionError: an
    "internal error" (exit 3) in validate and summary, and a build that never converged. It is an
    unreadable manifest like any other: named, exit 2, with the rebuild command."""
    s = tmp_path / "s"
    shutil.copytree(small_store, s)
    (s / "manifest.json").write_text("[" * 100_000)
    r = stage2(command, str(s))
    assert r.returncode == 2, r.tail()
    line = r.stderr.strip()
    assert f"{s / 'manifest.json'}: unreadable manifest (JSON nested too deeply). Fix: rebuild: " in line, (
        line
    )
    assert "internal error" not in line and "Traceback" not in line, line


def test_storage_options_for_a_local_store_are_refused(tmp_path: Path) -> None:
    """`--storage-option` with a local store was taken and ignored by validate, summary, preview,
    merge and gc (QA, stop 56), while `stage2 build` refuses it without --store-url: a misplaced
    flag, or a store meant to be named by its URL. Each command refuses it (exit 2), naming it."""
    base, side = _merge_inputs(tmp_path)
    for argv in (
        ("validate", str(base)),
        ("summary", str(base)),
        ("merge", str(base), str(side), "--out", str(tmp_path / "merged")),
        ("gc", str(tmp_path)),
    ):
        r = stage2(*argv, "--storage-option", "anon=true")
        assert r.returncode == 2, (argv, r.tail())
        assert "--storage-option (anon) is given with local paths only" in r.stderr and "Fix: " in r.stderr, (
            r.stderr
        )
    assert not (tmp_path / "merged").exists()
