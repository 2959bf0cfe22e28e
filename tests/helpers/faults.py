"""The fault matrix's machinery, shared by tests/test_faults_*.py (the rows: tests/faults_table.py;
the ``prepared`` data root: tests/fixtures/faults.py).

Each row asserts (a) the run fails or a check fails (:func:`refused`), (b) the message names the
culprit and the fix, (c) no store is published (:func:`no_store`) and nothing changed outside the data
root (:func:`outside`), (d) where the table says so, a rerun after the fix gives the clean fingerprint
(:func:`converge`) without downloading verified archives again (:func:`resolve_gets`).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import REPO, subprocess_env
from stage2_data import layout
from stage2_data.demo import DemoPaths, repin_profile
from stage2_data.demo.hubserver import HubServer

SECRET = "hf_FaultMatrixSecret_7c1d0e55b2a94f0e"  # a distinctive token: grep-able in any output
TOKEN_VAR = "STAGE2_FAULTS_TOKEN"
NOWHERE = "http://127.0.0.1:9"  # an endpoint never contacted (runs that need no hub)
SMALL = "abraranwar_libero_rfm_libero256_10"  # a small whole-tar cache key (bare member layout)
SPLIT = "jesbu1_roboarena_0825_rfm_roboarena"  # the split one: .tar.part-aa + .tar.part-ab


@dataclass
class Prepared:
    root: Path  # a fully extracted data root (archives verified, sidecars unpacked), no store
    home: Path  # the Dagster instance of these tests
    fingerprint: str  # of the clean store built from `root`
    profile_name: str
    demo: DemoPaths
    background: subprocess.Popen[str] | None


def fault_cases(**cases: Any) -> pytest.MarkDecorator:
    """Parametrize a test over fault rows: ``case`` takes each value, and the test's id is the row's id
    (the key), so ``-k arc_dotdot`` selects one row (tests/test_faults_table.py reads these ids)."""
    return pytest.mark.parametrize("case", [pytest.param(v, id=k) for k, v in cases.items()])


def subprocess_env_for(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a build process of these tests: their instance, no token but what is given."""
    return subprocess_env(drop=("HF_TOKEN", TOKEN_VAR), DAGSTER_HOME=str(home), PYTHONPATH=str(REPO), **extra)


def run_cfg(demo: DemoPaths, root: Path, url: str = NOWHERE, **kw: Any) -> dict[str, Any]:
    from stage2_pipelines.config import BuildConfig

    return BuildConfig(profile_path=str(demo.profile), data_root=str(root), endpoint=url, **kw).to_dict()


def demo_hub(demo: DemoPaths, **kw: Any) -> HubServer:
    return HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision, **kw)


def copy_kit(demo: DemoPaths, dst: Path) -> Path:
    """A copy of the demo's kit (its profile and manifests) at ``dst``, to edit; its profile's path."""
    shutil.copytree(demo.profile.parent, dst)
    return dst / demo.profile.name


def copy_root(prepared: Prepared, dst: Path) -> Path:
    shutil.copytree(prepared.root, dst, symlinks=True, ignore=shutil.ignore_patterns("stores", ".dagster"))
    return dst


def forget_archive(root: Path, path: str) -> None:
    """Remove a verified archive (and its record) from a data root, so the next run downloads it."""
    layout.archive_path(root, path).unlink()
    layout.verified_record_path(root, path).unlink()


def cache_key_of(demo: DemoPaths, path: str) -> str:
    """The ``archive_file`` partition that downloads the archive ``path``: its cache key (a
    partition downloads every archive of its cache key)."""
    from stage2_data.profile import load_profile

    return load_profile(demo.profile).archive(path).cache_key


def download(demo: DemoPaths, root: Path, paths: list[str]) -> list[str]:
    """Download ``paths`` from a fresh hub over the demo's upstream (the ``archive_file`` partitions
    of their cache keys); returns the archives it served."""
    from stage2_pipelines.runs import run_selection

    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        for key in dict.fromkeys(cache_key_of(demo, p) for p in paths):
            r = run_selection(cfg, ["archive_file"], key)
            assert r["success"], said(r)
        return resolve_gets(hub)


def save(*paths: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in paths}


def restore(saved: dict[Path, bytes]) -> None:
    for p, data in saved.items():
        p.write_bytes(data)


def outside(base: Path, *inside: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file under ``base`` except under ``inside`` (data roots)."""
    skip = [p.resolve() for p in inside]
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        d = Path(dirpath).resolve()
        if any(d == s or d.is_relative_to(s) for s in skip):
            dirnames[:] = []
            continue
        for name in filenames:
            st = os.lstat(Path(dirpath) / name)
            out[str(Path(dirpath, name).relative_to(base))] = (st.st_size, st.st_mtime_ns)
    return out


def said(r: dict[str, Any]) -> str:
    """Everything a user is told about a failed run: failed checks and step errors."""
    parts = [f"{c['check']}: {c['description']}" for c in r.get("checks", []) if not c["passed"]]
    parts += [e["message"] for e in r.get("errors", [])]
    return "\n".join(parts)


def refused(r: dict[str, Any], *names: str, check: str | None = None) -> str:
    """(a) the run failed; (b) the message names every one of ``names``; returns the message."""
    text = said(r)
    assert not r["success"], r
    assert text, r
    for n in names:
        assert n in text, f"{n!r} not named in:\n{text}"
    if check is not None:
        assert any(c["check"] == check and not c["passed"] for c in r["checks"]), text
    return text


def no_store(root: Path) -> None:
    """(c) nothing under stores/: no store, no `current`, no staging folder."""
    assert not (root / layout.STORES_DIR).exists(), sorted(p.name for p in (root / "stores").rglob("*"))


def final_refused(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path, *names: str, check: str | None = None
) -> tuple[dict[str, Any], Path]:
    """The final stage on a copy of the prepared root is refused, naming ``names``: nothing published,
    nothing changed outside the data root."""
    from helpers.final import FINAL_STAGE
    from stage2_pipelines.runs import run_selection

    root = copy_root(prepared, tmp_path / "root")
    before = outside(tmp_path, root)
    r = run_selection(run_cfg(demo, root), FINAL_STAGE)
    text = refused(r, *names, check=check)
    assert "vin_store" not in r["materialized"], text
    assert outside(tmp_path, root) == before
    no_store(root)
    return r, root


def resolve_gets(hub: HubServer) -> list[str]:
    return [p.rsplit("/", 1)[-1] for m, p, _ in hub.log_snapshot() if m == "GET" and "/resolve/" in p]


def converge(prepared: Prepared, cfg: dict[str, Any], root: Path, runs: list[tuple[str, str | None]]) -> None:
    """(d) rerun the given stages (asset, partition), then the final stage; the store's fingerprint
    must be the clean build's."""
    from helpers.final import FINAL_STAGE
    from stage2_pipelines.runs import run_selection

    for asset, part in runs:
        r = run_selection(cfg, [asset], part)
        assert r["success"], said(r)
    r = run_selection(cfg, FINAL_STAGE)
    assert r["success"], said(r)
    manifest = json.loads(
        (layout.current_store_path(root, prepared.profile_name) / "manifest.json").read_text()
    )
    assert manifest["fingerprint"] == prepared.fingerprint


# ----- hostile tars ------------------------------------------------------------------------------
Member = tuple[tarfile.TarInfo, bytes | None]


def read_members(*paths: Path) -> list[Member]:
    data = b"".join(p.read_bytes() for p in paths)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        out: list[Member] = []
        for m in tf.getmembers():
            f = tf.extractfile(m) if m.isreg() else None
            out.append((m, f.read() if f is not None else None))
    return out


def write_members(path: Path, members: list[Member]) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for m, data in members:
            tf.addfile(m, io.BytesIO(data) if data is not None else None)


def member(name: str, data: bytes | None = b"x", **kw: Any) -> Member:
    ti = tarfile.TarInfo(name)
    ti.mtime = 1724587200
    if data is not None:
        ti.size = len(data)
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti, data


def hostile_archive(demo: DemoPaths, key: str, edit: Callable[[list[Member], str], list[Member]]) -> str:
    """Rewrite the whole tar of ``key`` in the private upstream with ``edit(members, top)`` and
    re-pin the profile; returns the archive's path."""
    path = f"{key}.tar"
    f = demo.upstream / path
    members = read_members(f)
    top = next(m.name for m, _ in members if m.isdir()).split("/")[0]
    if top == layout.PROCESSED_DIR:
        top = f"{layout.PROCESSED_DIR}/{key}"
    write_members(f, edit(members, top))
    repin_profile(demo)
    return path
