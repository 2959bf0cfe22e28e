"""The launch folder a build's code server reads its ``workspace.yaml`` from (pipelines/launch.py):
named after the build's process, and removed by a later launch set-up once that process is dead (a
build killed with SIGKILL cannot remove its own); a live build's folder is never touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("dagster")

from stage2_data.publish.names import host_tag, proc_start_time  # noqa: E402
from stage2_pipelines.launch import LAUNCH_DIR_PREFIX, make_launch_dir, sweep_launch_dirs  # noqa: E402


def _dead_pid() -> tuple[int, int]:
    """(pid, start time) of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    start = proc_start_time(child.pid)
    child.communicate(b"")
    return child.pid, start


def _folder(tmp: Path, pid: int, start: int, host: str, rand: str = "ab12cd_x") -> Path:
    p = tmp / f"{LAUNCH_DIR_PREFIX}{pid}-{start}-{host}-{rand}"
    p.mkdir()
    (p / "workspace.yaml").write_text("load_from: []\n")
    return p


def test_a_dead_builds_launch_folder_is_removed_a_live_ones_kept(tmp_path: Path) -> None:
    pid, start = _dead_pid()
    me = os.getpid()
    dead = _folder(tmp_path, pid, start, host_tag())
    reused = _folder(tmp_path, me, proc_start_time(me) + 1, host_tag())  # this pid, a later process's
    live = _folder(tmp_path, me, proc_start_time(me), host_tag())
    elsewhere = _folder(tmp_path, pid, start, "0" * 8 if host_tag() != "0" * 8 else "1" * 8)
    older = tmp_path / f"{LAUNCH_DIR_PREFIX}k3j_9x2a"  # an older stage2's name: no owner to judge
    older.mkdir()
    a_file = tmp_path / f"{LAUNCH_DIR_PREFIX}{pid}-{start}-{host_tag()}-zz99zz99"  # not a folder
    a_file.write_text("a user's file")
    other = tmp_path / f"mine-{pid}"
    other.mkdir()

    removed = sweep_launch_dirs(tmp_path)

    assert sorted(removed) == sorted([dead, reused])
    assert not dead.exists() and not reused.exists()
    for kept in (live, elsewhere, older, a_file, other):
        assert kept.exists(), kept
    assert (live / "workspace.yaml").is_file()


def test_the_launch_set_up_names_its_folder_after_the_build_and_sweeps_first(tmp_path: Path) -> None:
    pid, start = _dead_pid()
    dead = _folder(tmp_path, pid, start, host_tag())
    made = make_launch_dir(tmp_path)
    assert made.is_dir() and made.parent == tmp_path and not dead.exists()
    assert made.name.startswith(
        f"{LAUNCH_DIR_PREFIX}{os.getpid()}-{proc_start_time(os.getpid())}-{host_tag()}-"
    )
    assert sweep_launch_dirs(tmp_path) == [] and made.is_dir()  # its owner (this process) is alive
    again = make_launch_dir(tmp_path)  # a second set-up of the same live build keeps the first
    assert again != made and made.is_dir() and again.is_dir()


def test_a_killed_builds_folder_goes_at_the_next_set_up(tmp_path: Path) -> None:
    """A process makes its launch folder and is killed with SIGKILL (nothing of it runs after):
    the folder stays until the next set-up, which removes it."""
    code = (
        "import os, signal, sys; from stage2_pipelines.launch import make_launch_dir; "
        "p = make_launch_dir(sys.argv[1]); print(p, flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == -9, out.stderr
    left = Path(out.stdout.strip())
    assert left.is_dir() and left.parent == tmp_path
    made = make_launch_dir(tmp_path)
    assert not left.exists() and made.is_dir()
