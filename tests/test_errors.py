"""Every error of the library survives pickling whole (a store shard written in a worker process
raises it there and the caller sees it as raised: message, fix and the fields that name the culprit)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
from helpers.cli import run, stage2, subprocess_env

from stage2_data.demo import DemoPaths
from stage2_data.errors import (
    ChecksumMismatchError,
    FormatError,
    KitError,
    Stage2Error,
    UnknownArchivesError,
)
from stage2_data.store import StoreInputError

ERRORS = {
    "plain": Stage2Error("something is wrong.", fix="do this"),
    "checksum": ChecksumMismatchError("a.tar", "0" * 64, "1" * 64, fix="re-download a.tar"),
    "format": FormatError("bad magic", file="x.npz", member="frames.npy"),
    "problems": StoreInputError("cannot build the store", ["x.npz: unreadable"], fix="correct it"),
    "kit": KitError("kit", ["p1", "p2"]),
    "unknown": UnknownArchivesError("guessed names", fix="stage2 pin", entries=["a.tar"]),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_survive_pickling(name: str) -> None:
    err = ERRORS[name]
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err) and back.args == err.args
    assert back.__dict__ == err.__dict__  # message, fix, problems, file, member, paths, entries
    assert isinstance(back, Exception)


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("a.tar is missing", "a.tar is missing. Fix: do this"),
        ("a.tar is missing.", "a.tar is missing. Fix: do this"),
        ("a pin is short (run `stage2 pin`)", "a pin is short (run `stage2 pin`). Fix: do this"),
        ("2 problem(s):\n  - a\n  - b", "2 problem(s):\n  - a\n  - b\nFix: do this"),
    ],
    ids=["no-stop", "stop", "parenthesis", "a-list"],
)
def test_the_fix_reads_as_a_sentence_of_its_own(message: str, shown: str) -> None:
    """The one line a user reads: the message ends with a full stop before "Fix:", and under a list
    of problems the fix is a line of its own (not glued to the last problem)."""
    assert str(Stage2Error(message, fix="do this")) == shown


def test_an_invalid_profile_names_its_file_once(demo: DemoPaths, tmp_path: Path) -> None:
    """Every key problem of a profile in one line that names the file once, then the fix."""
    text = demo.profile.read_text()
    bad = tmp_path / "profile.toml"
    revision = next(ln for ln in text.splitlines() if ln.startswith("revision = "))
    bad.write_text("bogus = 1\n" + text.replace(revision, 'revision = "f9da5e59a8"', 1))
    p = stage2("list", str(bad), "--data-root", str(tmp_path / "root"), timeout=120)
    assert p.returncode == 2, p.tail()
    err = p.stderr.strip()
    assert err.count(str(bad)) == 1, err
    assert err.startswith(f"stage2 list: error: invalid profile {bad}: "), err
    line = 1 + next(n for n, ln in enumerate(text.splitlines(), 1) if ln == revision)  # after "bogus"
    assert f"key 'source.revision' (line {line}): 'f9da5e59a8' is not a full 40-hex commit" in err, err
    assert "`stage2 pin PROFILE --write` resolves a branch, tag or short hash" in err, err
    assert "unknown key 'bogus' (line 1); remove it or check its spelling" in err, err
    assert err.endswith(
        "spelling. Fix: correct the named key(s) in the profile (see docs/spec/profile.md)"
    ), err


@pytest.mark.parametrize(
    ("name", "value"),
    [("STAGE2_STREAM_RUN_MB", "1GiB"), ("STAGE2_STREAM_RUN_MB", "inf"), ("STAGE2_QUEUED_WARN_S", "-1")],
)
def test_a_setting_that_does_not_parse_is_named_before_anything_runs(
    name: str, value: str, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """A ``STAGE2_*`` number setting that is not one: `stage2 build` names the variable, its value
    and the fix in one line (exit 2, no traceback) before it downloads anything."""
    root = tmp_path / "root"
    r = stage2(
        "build", "--profile", str(demo_cache.profile), "--data-root", str(root),
        "--hub-folder", str(demo_cache.upstream), env=subprocess_env(**{name: value}),
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.tail()
    line = r.stderr.strip().splitlines()[-1]
    assert name in line and repr(value) in line and "Fix:" in line, line
    assert not (root / "archives").exists()


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("STAGE2_STREAM_RUN_MB", "1GiB", None),
        ("STAGE2_KEEP_STORES", "abc", None),
        ("STAGE2_STORE_URL", "s3:/bucket/stores", None),
        # parsed when the definitions load (BuildConfig.from_env), not read late: named all the same
        ("STAGE2_EXECUTOR", "foo", None),
        ("STAGE2_STORE_OPTIONS", "[1]", "STAGE2_STORE_OPTIONS holds a JSON array"),
    ],
)
def test_the_code_location_refuses_to_load_with_a_setting_that_does_not_parse(
    name: str, value: str, says: str | None
) -> None:
    """The same settings in the environment of the UI's or the daemon's code location (read late: when
    a rebuild requests its streamed runs, when the store stage applies retention): its definitions
    fail to load with the named error (Dagster's own `definitions validate`, as a deployment checks
    them), so a bad value is seen when the daemon starts, not when a weekly rebuild reaches it."""
    r = run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate",
         "-m", "stage2_pipelines.definitions", "-a", "defs"],
        env=subprocess_env(drop=("DAGSTER_HOME",), **{name: value}),
        timeout=300,
    )  # fmt: skip
    said = r.stdout + r.stderr
    assert r.returncode != 0, said[-3000:]
    named = f"Error: {says or f'{name}={value!r}'}"
    assert "Validation failed" in said and named in said and "Fix:" in said, said[-3000:]


def _build_into(data_root: Path, demo: DemoPaths) -> tuple[int, str]:
    """`stage2 build` of the demo into ``data_root``: its exit code and its one line of stderr."""
    r = stage2(
        "build", "--profile", str(demo.profile), "--data-root", str(data_root),
        "--hub-folder", str(demo.upstream), timeout=120,
    )  # fmt: skip
    assert "Traceback" not in r.stdout + r.stderr, r.tail()
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    return r.returncode, err


def test_a_data_root_that_is_a_device_is_not_to_be_deleted(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """`--data-root /dev/null`: named as the character device it is, and the fix is another data root;
    never "delete that file" (deleting /dev/null breaks the machine)."""
    code, err = _build_into(Path("/dev/null"), demo_cache)
    assert code == 2, err
    assert err.startswith("stage2 build: error: --data-root: /dev/null: Not a directory."), err
    assert "Fix: /dev/null is a character device, not a folder" in err, err
    assert "choose another --data-root" in err and "delete" not in err, err


def test_a_file_above_the_data_root_is_the_one_named(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """`--data-root <file>/sub`: the fix names the file that is in the way (``<file>``), not the first
    path the build would have made below it (``<file>/sub/archives/<tar>``)."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder\n")
    code, err = _build_into(blocker / "sub", demo_cache)
    assert code == 2, err
    assert f"Fix: a file stands where a folder is needed: {blocker}; move or delete that file" in err, err


def test_a_pipe_in_the_way_is_named_as_one_and_left_alone(tmp_path: Path) -> None:
    """An OSError whose path goes through a named pipe: the fix names the pipe as what it is and
    says to choose another path (or the folder ``where`` names) instead of deleting it."""
    import errno
    import os

    from stage2_data.oserrors import fs_error

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    e = NotADirectoryError(errno.ENOTDIR, "Not a directory", str(pipe / "sub" / "x.tar"))
    said = str(fs_error(e, ""))
    assert said.startswith(f"{pipe}/sub/x.tar: Not a directory. Fix: {pipe} is a FIFO"), said
    assert "a path that does not go through it" in said and "delete" not in said, said
    assert f"another folder than {tmp_path}" in str(fs_error(e, "extracting", where=str(tmp_path)))
