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
    assert "key 'source.revision': 'f9da5e59a8' is not a full 40-hex commit" in err, err
    assert "unknown key 'bogus'; remove it or check its spelling" in err, err
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
    ("name", "value"),
    [
        ("STAGE2_STREAM_RUN_MB", "1GiB"),
        ("STAGE2_KEEP_STORES", "abc"),
        ("STAGE2_STORE_URL", "s3:/bucket/stores"),
    ],
)
def test_the_code_location_refuses_to_load_with_a_setting_that_does_not_parse(name: str, value: str) -> None:
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
    assert "Validation failed" in said and f"Error: {name}={value!r}" in said and "Fix:" in said, said[-3000:]
