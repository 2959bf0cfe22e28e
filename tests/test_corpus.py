"""No byte of any input and no fault of the environment escapes unnamed.

A deterministic corpus of mutated inputs (tests/helpers/corpus.py: every byte region of an npz, an
npy header inside one, a corrupt deflate stream with the zip directory intact, Arrow IPC stream and
file shards, JSON Lines, a profile, a cache directory's tar; truncations, odd header values, whole
files of another format) goes through the product's readers at library level; each case ends in
success or an error of the family (``Stage2Error``) that names the file. A sample goes through the
real ``stage2`` command (a subprocess: one line, no traceback) and through a Dagster run of the
extraction stage. Environment faults (a read-only data root, a file where the data root should be)
end in a named error too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import stage2
from helpers.corpus import FRAMES_MEMBER, KEY, Case, base_tar, base_toml, corpus

from stage2_data.errors import FileSystemError, FileTypeError, Stage2Error
from stage2_data.extract import extract_cache_dir, inspect_cache_dir, open_archive_parts, read_processed_rows
from stage2_data.formats import arrow as farrow
from stage2_data.formats import jsonl, npz
from stage2_data.kit._lines import iter_json_lines as kit_lines
from stage2_data.profile import load_profile
from stage2_data.publish import data_root_lock
from stage2_data.store.inputs import inspect_frames_npz

CASES = list(corpus())


def _outcome(fn: Callable[[], Any], name: str) -> str:
    """'' when ``fn`` returned or raised an error of the family naming ``name`` (the file); else
    what went wrong."""
    try:
        fn()
    except Stage2Error as e:
        text = str(e)
        if "Traceback" in text:
            return f"a traceback in the message: {text[:200]}"
        if name not in text:
            return f"{type(e).__name__} does not name {name}: {text[:300]}"
    except Exception as e:  # noqa: BLE001 - what the test is about
        return f"unnamed {type(e).__name__}: {str(e)[:300]}"
    return ""


def _npz(case: Case, tmp: Path) -> Iterator[tuple[str, Callable[[], Any], str]]:
    p = tmp / "trajectory_t0.npz"
    p.write_bytes(case.data)

    def members() -> None:
        for m in npz.npz_members(case.data, file=p.name).values():
            npz.member_bytes(case.data, m, file=p.name)
            npz.member_header(case.data, m, file=p.name)

    def inputs() -> None:
        problems: list[str] = []
        inspect_frames_npz(p, problems)
        assert all(p.name in q for q in problems), problems

    yield "read_npz", lambda: npz.read_npz(p), p.name
    yield "members", members, p.name
    yield "inspect_frames_npz", inputs, p.name


def _arrow(case: Case, tmp: Path) -> Iterator[tuple[str, Callable[[], Any], str]]:
    cdir = tmp / KEY
    shard = cdir / farrow.PROCESSED_SUBDIR / "data-00000-of-00001.arrow"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(case.data)

    def table() -> None:
        t = farrow.read_processed_table(cdir, ["id", "task"])
        t.to_pylist()

    yield "read_processed_table", table, shard.name
    yield "read_processed_rows", lambda: read_processed_rows(cdir, ["id"]), shard.name
    yield "inspect_cache_dir", lambda: inspect_cache_dir(cdir), shard.name


def _jsonl(case: Case, tmp: Path) -> Iterator[tuple[str, Callable[[], Any], str]]:
    p = tmp / "pairs.jsonl"
    p.write_bytes(case.data)
    yield "lf", lambda: list(jsonl.iter_json_lines(case.data)), "line"
    yield "read_lf", lambda: list(jsonl.read_json_lines(p)), p.name
    yield "kit", lambda: list(kit_lines(p, [])), p.name
    yield (
        "universal",
        lambda: list(jsonl.iter_json_lines(case.data, newlines="universal", strip=True)),
        "line",
    )


def _toml(case: Case, tmp: Path) -> Iterator[tuple[str, Callable[[], Any], str]]:
    p = tmp / "profile.toml"
    p.write_bytes(case.data)
    yield "load_profile", lambda: load_profile(p), p.name


def _tar(case: Case, tmp: Path) -> Iterator[tuple[str, Callable[[], Any], str]]:
    p = tmp / f"{KEY}.tar"
    p.write_bytes(case.data)
    sha = hashlib.sha256(case.data).hexdigest()

    def opened() -> None:
        with open_archive_parts([p], verified=True) as tf:
            tf.getmembers()

    def extracted() -> None:
        rec = extract_cache_dir(KEY, [p], tmp / "root", archive_sha256={p.name: sha})
        assert isinstance(rec.problems, list)

    yield "open_archive_parts", opened, p.name
    yield "extract_cache_dir", extracted, p.name


READERS = {
    "npz": _npz,
    "npy_header": _npz,
    "arrow_stream": _arrow,
    "arrow_file": _arrow,
    "jsonl": _jsonl,
    "toml": _toml,
    "tar": _tar,
}


def test_the_corpus_is_deterministic_and_covers_every_region() -> None:
    again = list(corpus())
    assert [c.id for c in again] == [c.id for c in CASES] and [c.data for c in again] == [
        c.data for c in CASES
    ]
    regions = {(c.fmt, c.region.rstrip("0123456789").split(".")[-1]) for c in CASES}
    for need in [("npz", "local_header"), ("npz", "deflate"), ("npz", "central_directory"), ("npz", "end_record"),
                 ("npz", "deflate_stream"), ("npy_header", "header_dict"), ("arrow_file", "magic"),
                 ("arrow_file", "schema"), ("arrow_stream", "body"), ("jsonl", "line"), ("toml", "line"),
                 ("tar", "size"), ("tar", "chksum"), ("tar", "data"), ("tar", "whole")]:  # fmt: skip
        assert need in regions, need
    assert len(CASES) > 500


def test_every_mutated_input_ends_in_a_named_error(tmp_path: Path) -> None:
    """Every case through every reader of its format: success, or an error of the family naming the file."""
    bad: list[str] = []
    outcomes: dict[str, int] = {}
    for k, case in enumerate(CASES):
        tmp = tmp_path / str(k)
        tmp.mkdir()
        for reader, fn, name in READERS[case.fmt](case, tmp):
            why = _outcome(fn, name)
            if why:
                bad.append(f"{case.id} [{reader}]: {why}")
            outcomes[why[:8] or "ok/named"] = outcomes.get(why[:8] or "ok/named", 0) + 1
        shutil.rmtree(tmp)
    assert bad == [], "\n".join(bad[:40]) + f"\n({len(bad)} in all)"


def test_a_file_that_is_not_what_its_name_says_is_named_with_a_fix_that_works(tmp_path: Path) -> None:
    """A gzip- or zstd-compressed ``.tar`` pinned as such: the compression is named, and the fix is
    the profile, never "download it again" (the bytes would be the same); an ``.npz`` that is a
    plain ``.npy``; a gzip-compressed Arrow shard."""
    import gzip

    tar = base_tar()
    for kind, data in (
        ("gzip", gzip.compress(tar, mtime=0)),
        ("zstd", b"\x28\xb5\x2f\xfd" + hashlib.sha256(tar).digest() * 64),
    ):
        p = tmp_path / f"{KEY}.tar"
        p.write_bytes(data)
        with pytest.raises(FileTypeError) as e:
            extract_cache_dir(KEY, [p], tmp_path / "root", archive_sha256={p.name: "ab" * 32})
        text = str(e.value)
        assert f"{p.name} is not a tar: its bytes are {kind}-compressed" in text, text
        assert "download it again" not in text and "[[quarantined]]" in text and "uncompressed tar" in text
        # not verified: the file on disk may be a bad download, so downloading again can help
        with pytest.raises(FileTypeError, match="download it again"):
            extract_cache_dir(KEY, [p], tmp_path / "root", archive_sha256={p.name: None})
    plain = tmp_path / "trajectory_t1.npz"
    plain.write_bytes(npz.npy_bytes(__import__("numpy").zeros(3)))
    with pytest.raises(
        FileTypeError, match=r"trajectory_t1.npz: is not an .npz \(zip\) file: its bytes are a plain .npy"
    ):
        npz.read_npz(plain)
    shard = tmp_path / "c" / farrow.PROCESSED_SUBDIR / "data.arrow"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(gzip.compress(b"x" * 100, mtime=0))
    with pytest.raises(FileTypeError, match="is not an Arrow IPC file: its bytes are gzip-compressed"):
        farrow.read_shard(shard)


def test_an_archive_that_holds_another_cache_key_names_the_profile(tmp_path: Path) -> None:
    """A profile entry whose cache_key is not the folder its archive holds: the fix is the
    profile's cache_key, not "quarantine it upstream" or "download it again"."""
    p = tmp_path / "other_key.tar"
    p.write_bytes(base_tar())
    with pytest.raises(Stage2Error) as e:
        extract_cache_dir("other_key", [p], tmp_path / "root", archive_sha256={p.name: "ab" * 32})
    text = str(e.value)
    assert f"holds the cache directory {KEY!r}, but the profile lists it for cache_key 'other_key'" in text
    assert f'set cache_key = "{KEY}"' in text and "quarantined" not in text
    assert not (tmp_path / "root" / "processed_datasets" / "other_key").exists()


def test_a_verified_truncated_archive_is_never_downloaded_again(tmp_path: Path) -> None:
    p = tmp_path / f"{KEY}.tar"
    p.write_bytes(base_tar()[:3000])
    with pytest.raises(Stage2Error) as e:
        extract_cache_dir(KEY, [p], tmp_path / "root", archive_sha256={p.name: "ab" * 32})
    text = str(e.value)
    assert "truncated or corrupt" in text and "sha256 matches the pin" in text and "[[quarantined]]" in text
    assert "download it again" not in text


# ----- environment faults ------------------------------------------------------------------------------
@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder this process cannot write: a read-only tmpfs when running as root (permissions do
    not stop root), else a folder without write permission."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {r.stderr.decode().strip()}")
        try:
            yield d
        finally:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)
    else:
        d.chmod(0o555)
        try:
            yield d
        finally:
            d.chmod(0o755)


def _kit_file(kit_root: Path) -> None:
    """The corpus profile's kit paths, empty: a missing kit file is refused before the data root is
    looked at (the refusal these tests are after comes after that check)."""
    kit = tomllib.loads(base_toml().decode())["kit"]
    for key, rel in kit.items():
        path = kit_root / rel
        if key == "action_manifest_dir":
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")


def test_a_read_only_data_root_is_one_named_error(read_only_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileSystemError) as e, data_root_lock(read_only_dir):
        pass
    text = str(e.value)
    assert (
        str(read_only_dir) in text and "Fix:" in text and ("read-only" in text.lower() or "access" in text)
    ), text
    # extraction into it: named too, nothing half-written
    p = tmp_path / f"{KEY}.tar"
    p.write_bytes(base_tar())
    with pytest.raises(FileSystemError, match=str(read_only_dir)):
        extract_cache_dir(KEY, [p], read_only_dir, archive_sha256={p.name: "ab" * 32})
    # through the real command: one line, exit 2
    prof = tmp_path / "kit" / "profile.toml"
    prof.parent.mkdir()
    prof.write_bytes(base_toml())
    _kit_file(prof.parent)
    out = stage2(
        "build", "--profile", str(prof), "--data-root", str(read_only_dir), "--hub-folder", str(tmp_path)
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.tail()
    assert len(out.stderr.strip().splitlines()) == 1 and str(read_only_dir) in out.stderr, out.stderr


def test_a_file_where_a_folder_should_be_is_one_named_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_text("not a folder")
    for where in (root, root / "below"):
        with (
            pytest.raises(FileSystemError, match="a file stands where a folder is needed"),
            data_root_lock(where),
        ):
            pass
    good = tmp_path / "good"
    (good / "processed_datasets").parent.mkdir()
    (good / "processed_datasets").write_text("a file")
    p = tmp_path / f"{KEY}.tar"
    p.write_bytes(base_tar())
    with pytest.raises(FileSystemError, match="processed_datasets"):
        extract_cache_dir(KEY, [p], good, archive_sha256={p.name: "ab" * 32})
    prof = tmp_path / "profile.toml"
    prof.write_bytes(base_toml())
    _kit_file(tmp_path)
    for where in (root, root / "below"):  # the file, and a path under it (QA: that named an archive)
        out = stage2(
            "build", "--profile", str(prof), "--data-root", str(where), "--hub-folder", str(tmp_path)
        )
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.tail()
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert f"a file stands where a folder is needed: {root}; " in out.stderr, out.stderr
        # the data root itself is named, not the first path the build would have made below it
        assert out.stderr.startswith(f"stage2 build: error: --data-root: {where}: Not a directory."), (
            out.stderr
        )
        assert "archives" not in out.stderr, out.stderr


# ----- the user-facing paths ----------------------------------------------------------------------------
def test_a_sample_through_the_real_command_prints_one_line(tmp_path: Path) -> None:
    """Mutated profiles through `stage2 list` and `stage2 build` (subprocesses): exit 0 or 2, never a
    traceback, an error in one line."""
    sample = [c for c in CASES if c.fmt == "toml"][::20]
    assert len(sample) >= 4
    for k, case in enumerate(sample):
        prof = tmp_path / f"p{k}" / "profile.toml"
        prof.parent.mkdir()
        prof.write_bytes(case.data)
        cmd = ("list", str(prof), "--data-root", str(tmp_path / "root")) if k % 2 else (
            "build", "--profile", str(prof), "--data-root", str(tmp_path / "root"), "--endpoint", "http://127.0.0.1:9")  # fmt: skip
        out = stage2(*cmd, timeout=120)
        assert out.returncode in (0, 1, 2) and "Traceback" not in out.stdout + out.stderr, (
            case.id,
            out.tail(),
        )
        if out.returncode == 2:
            assert len(out.stderr.strip().splitlines()) == 1 or "problem(s):" in out.stderr, (
                case.id,
                out.stderr,
            )


def test_a_sample_through_a_dagster_run_is_named(tmp_path: Path, dagster_home: Path) -> None:
    """Mutated tars extracted by the `cache_dir` asset in a Dagster run (the library behind it is the
    one above): the step fails with the family's message naming the archive, never an opaque
    Dagster error."""
    from stage2_pipelines.config import BuildConfig
    from stage2_pipelines.runs import run_selection

    sample = [c for c in CASES if c.fmt == "tar" and c.region in ("whole", "header0.chksum", "data1")][:3]
    assert len(sample) >= 3
    for k, case in enumerate(sample):
        kit = tmp_path / f"kit{k}"
        kit.mkdir()
        (kit / "profile.toml").write_bytes(base_toml())
        root = tmp_path / f"root{k}"
        (root / "archives").mkdir(parents=True)
        (root / "archives" / f"{KEY}.tar").write_bytes(case.data)
        cfg = BuildConfig(
            profile_path=str(kit / "profile.toml"), data_root=str(root), endpoint="http://127.0.0.1:9"
        )
        r = run_selection(cfg.to_dict(), ["cache_dir"], KEY)
        text = " ".join(e["message"] for e in r["errors"])
        assert "internal error" not in text and "DagsterExecution" not in text and "Traceback" not in text, (
            text
        )
        if not r["success"]:
            assert f"{KEY}.tar" in text, (case.id, text)


def test_the_npz_of_a_tar_member_is_read_whole(tmp_path: Path) -> None:
    """The corpus' tar is a real cache directory: its frames npz reads back (the base is valid)."""
    p = tmp_path / f"{KEY}.tar"
    p.write_bytes(base_tar())
    rec = extract_cache_dir(KEY, [p], tmp_path / "root")
    assert rec.problems == [] and rec.frame_files == 1
    arrays = npz.read_npz(tmp_path / "root" / "processed_datasets" / FRAMES_MEMBER)
    assert arrays["frames"].shape == (2, 4, 4, 3) and int(arrays["num_frames"]) == 2
    with tarfile.open(p) as tf:
        assert FRAMES_MEMBER in tf.getnames()


def test_an_exception_outside_the_family_is_one_named_line_in_a_build_summary() -> None:
    """What escaped every guard of a step (Dagster wraps it in DagsterExecutionStepExecutionError)
    is summed up in one line naming the innermost exception, not Dagster's wrapper; a Failure (the
    family's message) is kept as it is."""
    from dagster._utils.error import SerializableErrorInfo

    from stage2_pipelines.runs import step_error_line

    inner = SerializableErrorInfo(
        "zlib.error: Error -3 while decompressing data: invalid block type\n", [], "error"
    )
    wrapped = SerializableErrorInfo(
        'dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred while executing op "vin_store":\n',
        ["  File ...\n"],
        "DagsterExecutionStepExecutionError",
        cause=inner,
    )
    line = step_error_line(wrapped)
    assert line.startswith(
        "internal error: zlib.error: Error -3 while decompressing data: invalid block type"
    )
    assert "\n" not in line and "DagsterExecution" not in line and "File" not in line
    failure = SerializableErrorInfo(
        "dagster._core.definitions.events.Failure: archive x.tar is not a tar. Fix: pin it\n", [], "Failure"
    )
    assert step_error_line(failure) == "archive x.tar is not a tar. Fix: pin it"
    perm = SerializableErrorInfo(
        "PermissionError: [Errno 13] Permission denied: '/data/derived'\n", [], "PermissionError"
    )
    wrapped_perm = SerializableErrorInfo("DagsterExecutionStepExecutionError: ...\n", [], "X", cause=perm)
    line = step_error_line(wrapped_perm)
    assert line.startswith(
        "PermissionError: [Errno 13] Permission denied: '/data/derived'. Fix: check that path"
    )
    assert "internal error" not in line
    # Dagster's own write of a step's events refused by a full disk under DAGSTER_HOME (QA): a full
    # disk, named, not a bug
    full = SerializableErrorInfo(
        "sqlite3.OperationalError: database or disk is full\n", [], "OperationalError"
    )
    line = step_error_line(
        SerializableErrorInfo("DagsterExecutionStepExecutionError: ...\n", [], "X", cause=full)
    )
    assert "internal error" not in line and "disk is full" in line and "DAGSTER_HOME" in line, line
