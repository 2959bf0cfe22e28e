"""A command's last run's imports are kept and read ahead at its next start (stage2_data/warmstart.py):
through the real CLI, the real page-cache hint, and files on disk."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from helpers.cli import stage2, subprocess_env

from stage2_data import warmstart


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(warmstart.ENV, "1")
    return tmp_path / "cache"


def test_record_lists_the_modules_and_libraries_this_process_loaded(cache: Path) -> None:
    import numpy  # an extension module: its shared libraries are mapped

    path = warmstart.record("probe")
    assert path is not None and path.is_relative_to(cache / "stage2-data" / "warmstart")
    files = path.read_text().splitlines()
    assert len(files) == len(set(files)) and all(os.path.isabs(f) and os.path.isfile(f) for f in files)
    mine = {warmstart.__file__, importlib.util.cache_from_source(warmstart.__file__)}
    assert mine & set(files)  # this module (its bytecode if it has any, else its source)
    assert any(f.startswith(os.path.dirname(numpy.__file__)) and ".so" in f for f in files)
    before = path.stat().st_mtime_ns
    assert warmstart.record("probe") == path and path.stat().st_mtime_ns == before  # unchanged: not rewritten


def test_prefetch_reads_the_list_ahead_and_skips_what_is_gone(cache: Path, tmp_path: Path) -> None:
    real = tmp_path / "a.bin"
    real.write_bytes(b"x" * 4096)
    listed = warmstart.list_path("probe")
    listed.parent.mkdir(parents=True)
    listed.write_text(f"{real}\n{tmp_path / 'gone.bin'}\n")
    assert warmstart.read_ahead([str(real), str(tmp_path / "gone.bin")]) == 1
    t = warmstart.prefetch("probe")
    assert t is not None and t.daemon
    t.join(30)
    assert not t.is_alive()


def test_nothing_without_a_list_or_when_turned_off(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert warmstart.prefetch("never-ran") is None
    monkeypatch.setenv(warmstart.ENV, "0")
    assert warmstart.record("probe") is None and not (cache / "stage2-data").exists()
    assert warmstart.prefetch("probe") is None


def test_the_cli_keeps_each_commands_list_for_its_next_start(tmp_path: Path) -> None:
    env = subprocess_env(XDG_CACHE_HOME=str(tmp_path / "cache"), **{warmstart.ENV: "1"})
    ran = stage2("validate", str(tmp_path / "no-store"), env=env)  # a command that fails still ran
    assert ran.returncode != 0
    lists = list((tmp_path / "cache" / "stage2-data" / "warmstart").glob("validate-*.txt"))
    assert len(lists) == 1
    files = lists[0].read_text().splitlines()
    assert any("stage2_data" in f and "store" in f for f in files)  # validate's own imports
    again = stage2("validate", str(tmp_path / "no-store"), env=env)  # the list read ahead: same answer
    assert (again.returncode, again.stderr) == (ran.returncode, ran.stderr)


def test_a_shorter_run_adds_to_the_list_and_gone_files_drop_out(cache: Path, tmp_path: Path) -> None:
    """A no-op build imports less than a build that runs: the list keeps what the longer run
    imported (first, in its order) instead of shrinking to the last run's; deleted files drop out."""
    gone, kept = tmp_path / "gone.pyc", tmp_path / "kept.pyc"
    kept.write_bytes(b"x")
    listed = warmstart.list_path("probe")
    listed.parent.mkdir(parents=True)
    listed.write_text(f"{kept}\n{gone}\n")
    files = warmstart.record("probe").read_text().splitlines()  # type: ignore[union-attr]
    assert files[0] == str(kept) and str(gone) not in files
    assert set(warmstart.loaded_files()) <= set(files)
