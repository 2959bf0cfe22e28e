"""The core CLI where the pipeline extra (Dagster) is missing: `stage2 build --help` lists every option
and the line that installs the extra, running it says what to install (exit 2), and every extra of
pyproject.toml is named. Dagster is hidden from a real interpreter (``sys.modules['dagster'] = None``:
``find_spec`` answers None and an import fails, as where it is not installed)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from helpers.cli import REPO

HIDE_DAGSTER = "import sys; sys.modules['dagster'] = None; from stage2_data.cli import main; "


def _without_dagster(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = HIDE_DAGSTER + f"sys.exit(main({args!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def _extras() -> list[str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"])


def test_build_help_without_the_extra_lists_options_and_the_install_line(tmp_path: Path) -> None:
    from stage2_data.cli import install_line

    out = _without_dagster(["build", "--help"], tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for option in ("--profile", "--data-root", "--endpoint", "--executor", "--store-url", "--json"):
        assert option in text, text
    assert install_line() in text  # on a line of its own: pasted as it is
    assert any(ln.strip() == install_line() for ln in text.splitlines()), text
    # this checkout is installed editable: the line installs the extra from it
    assert install_line() == f"pip install -e '{REPO}[pipeline]'"
    said = " ".join(text.split())
    assert all(e in said for e in _extras()), (_extras(), text)
    demo = _without_dagster(["demo", "--help"], tmp_path)
    assert demo.returncode == 0 and "--out" in demo.stdout and install_line() in demo.stdout, demo


def test_build_without_the_extra_says_what_to_install_and_every_extra(tmp_path: Path) -> None:
    from stage2_data.cli import install_line

    out = _without_dagster(["build"], tmp_path)  # no required option asked for: it cannot run anyway
    assert out.returncode == 2 and out.stdout == "", out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("stage2 build: error: this command needs the 'pipeline' extra"), lines[0]
    assert f". Fix: install it with {install_line()}" in lines[0], lines[0]
    assert all(e in lines[0] for e in _extras()), (_extras(), lines[0])
    top = _without_dagster(["--help"], tmp_path)
    assert "build" in top.stdout and "not installed" in top.stdout


def test_the_extras_are_the_checkouts() -> None:
    """An editable install names the extras of its checkout's pyproject.toml (its installed metadata
    is as old as its last `pip install`)."""
    from stage2_data.cli import extras

    assert extras() == _extras()


def test_an_executor_whose_extra_is_missing_says_what_to_install(tmp_path: Path) -> None:
    """`stage2 build --executor dask` where the dask extra is not installed (its modules hidden as
    Dagster is above): one line naming the extra and the command that installs it here, exit 2,
    before any work, not an internal error from the import."""
    from stage2_data.cli import install_line

    root = tmp_path / "root"
    hide = "import sys; sys.modules['dagster_dask'] = None; sys.modules['distributed'] = None; "
    args = ["build", "--profile", str(tmp_path / "p.toml"), "--data-root", str(root), "--executor", "dask"]
    code = hide + f"from stage2_data.cli import main; sys.exit(main({args!r}))"
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2, p.stderr
    line = p.stderr.strip()
    assert "internal error" not in line and "Traceback" not in line, line
    assert line.startswith("stage2 build: error: the dask executor needs the 'dask' extra"), line
    assert f"install it with: {install_line('dask')}" in line, line
    assert not root.exists()
