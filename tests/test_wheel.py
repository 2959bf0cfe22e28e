"""The wheel, installed as a user installs it (not editable, in fresh venvs without this project's
packages), runs the demo from an unrelated folder and reads the store; the core install (no extras)
reads a store without Dagster. System tier (tests/_tiers.py): it builds a wheel and installs two venvs
from the package index pip is configured with, about a minute or two.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.built import DEMO_FINGERPRINT

REPO = Path(__file__).resolve().parent.parent
# Never copied into the build: local state, caches and build output.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".demo",
    ".dagster_home",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "work",
    "stage2-bench-*",
    "artifacts",
)
# Import names that a wheel must not install at the top level (they collide with other projects').
GENERIC_NAMES = {"assets", "resources", "pipelines", "deploy", "tests", "bench"}

READ_STORE = """
import sys
from stage2_data.store import VinOfflineDataset

ds = VinOfflineDataset(sys.argv[1], split="train")
sample = ds[0]
frames = sample["frames"]
assert len(ds) > 0 and frames.dtype.name == "uint8" and frames.ndim == 4 and frames.shape[-1] == 3, frames
assert sample["split"] == "train" and sample["actions"].dtype.name == "float32", sample
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"dagster", "stage2_pipelines", "stage2_assets"})
assert not loaded, f"reading a store imported {loaded}"
print(len(ds))
"""


def _run(
    args: list[str | Path], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> str:
    out = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, (
        f"{' '.join(map(str, args))} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    )
    return out.stdout


def _venv(path: Path, requirement: str) -> Path:
    """A fresh venv (no system site-packages, no pip of its own) with ``requirement`` installed by this
    interpreter's pip, with the index configuration pip already uses (pip.conf, PIP_* variables).
    ``--no-compile``: what is imported is byte-compiled when first imported, instead of every module of
    every dependency at install (twice as long; a module that does not compile fails its import either
    way, and pip only warns about it)."""
    _run([sys.executable, "-m", "venv", "--without-pip", path], cwd=path.parent)
    python = path / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-compile",
            "--progress-bar",
            "off",
            requirement,
        ],
        cwd=path.parent,
    )
    return python


def _user_env(venv_python: Path, home: Path) -> dict[str, str]:
    """A user's shell with the venv active: none of this project's or the test session's settings."""
    keep = {"HOME", "LANG", "LC_ALL", "TMPDIR", "USER"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PATH"] = f"{venv_python.parent}:/usr/local/bin:/usr/bin:/bin"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["XDG_CACHE_HOME"] = str(home / "cache")
    return env


def _written_files(root: Path, since_ns: int) -> list[str]:
    """Files under ``root`` changed since ``since_ns``, byte-code caches aside."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.stat().st_mtime_ns > since_ns
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel`` of a copy of the working tree (the build writes build/ and *.egg-info into its
    source folder; the repository stays untouched)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(REPO, src, ignore=NOT_SOURCE, symlinks=True)
    dist = base / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--progress-bar", "off", "-w", dist, src],
        cwd=base,
    )
    (whl,) = dist.glob("stage2_data-*.whl")
    return whl


def test_wheel_installs_collision_free_import_names(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        top = {name.split("/")[0] for name in zf.namelist()}
    packages = {t for t in top if not t.endswith((".dist-info", ".data"))}
    assert "stage2_data" in packages
    assert not packages & GENERIC_NAMES, f"generic top-level import names: {sorted(packages & GENERIC_NAMES)}"
    assert all(p.startswith("stage2") for p in packages), sorted(packages)


def test_demo_from_the_installed_wheel_and_core_read(wheel: Path, tmp_path: Path) -> None:
    # The pipeline install: `stage2 demo` from a folder that is not the repository.
    venv = tmp_path / "venv-pipeline"
    python = _venv(venv, f"{wheel}[pipeline]")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out_dir = tmp_path / "out"
    marker = tmp_path / "installed"
    marker.touch()
    since = marker.stat().st_mtime_ns
    stdout = _run(
        [venv / "bin" / "stage2", "demo", "--out", out_dir], cwd=elsewhere, env=_user_env(python, tmp_path)
    )
    fields = dict(re.findall(r"^(\w[\w ]*?):\s+(\S+)", stdout, re.M))
    assert fields.get("fingerprint") == DEMO_FINGERPRINT, stdout
    store = Path(fields["store"])
    assert store.is_relative_to(out_dir) and (store / "manifest.json").is_file(), stdout
    # every path came from --out: nothing in the working folder, nothing inside the installed packages
    assert list(elsewhere.iterdir()) == []
    assert _written_files(venv / "lib", since) == []

    # The core install (no extras): no Dagster at all, yet it reads and validates the store.
    core = tmp_path / "venv-core"
    core_python = _venv(core, str(wheel))
    env = _user_env(core_python, tmp_path)
    _run(
        [core_python, "-c", "import importlib.util as u; assert u.find_spec('dagster') is None"],
        cwd=elsewhere,
        env=env,
    )
    assert int(_run([core_python, "-c", READ_STORE, store], cwd=elsewhere, env=env)) > 0
    doc = json.loads(_run([core / "bin" / "stage2", "validate", store, "--json"], cwd=elsewhere, env=env))
    assert doc["ok"] is True, doc
