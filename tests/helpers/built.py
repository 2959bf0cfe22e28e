"""A demo data root built once through ``stage2 build`` (a subprocess, as a user runs it), and copies
of it for fault rows that mutate what a build left and run ``stage2 build`` again.

The fault matrix's ``prepared`` root (tests/fixtures/faults.py) holds downloads and extractions but
no store; :func:`build_once` builds its store through the CLI, so the copies hold every record a
real build writes (extraction records with the archives' sha256, the sidecars' record, the store
stage's record)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from helpers.cli import Ran, stage2, subprocess_env
from helpers.faults import NOWHERE, Prepared

#: The demo store's fingerprint: the same on every machine, executor and storage (a change of it is a
#: change of the store contract: docs/spec/vin-store.md, Changelog).
DEMO_FINGERPRINT = "b224ba59805fd9405527db87df623c32671237b12d60178651d0ee43a400eb16"


def build(profile: Path, root: Path, *extra: str, endpoint: str = NOWHERE, timeout: float = 300) -> Ran:
    """``stage2 build`` of ``profile`` into ``root`` (its Dagster instance under ``root/.dagster``;
    an endpoint never contacted unless given)."""
    env = subprocess_env(drop=("DAGSTER_HOME", "CI", "HF_TOKEN"), STAGE2_RUN_LOG_LEVEL="CRITICAL")
    return stage2(
        "build",
        "--profile",
        str(profile),
        "--data-root",
        str(root),
        "--endpoint",
        endpoint,
        *extra,
        env=env,
        timeout=timeout,
    )


def fingerprint(r: Ran) -> str | None:
    m = re.search(r"^fingerprint:\s+([0-9a-f]{64})$", r.stdout, re.M)
    return m.group(1) if m else None


def build_once(prepared: Prepared, dst: Path) -> Path:
    """``prepared.root`` copied to ``dst`` and built (a store published) through ``stage2 build``."""
    shutil.copytree(prepared.root, dst, symlinks=True, ignore=shutil.ignore_patterns("stores", ".dagster"))
    r = build(prepared.demo.profile, dst)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    return dst


def copy_built(built: Path, dst: Path) -> Path:
    """A private copy of a built data root (its Dagster instance left out: a copy makes its own)."""
    shutil.copytree(built, dst, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    return dst
