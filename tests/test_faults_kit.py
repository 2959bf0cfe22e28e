"""The fault matrix, kit rows: a broken kit (pairs, action manifests, sidecars, SHA256SUMS) or broken
frames fail a check before the store, naming the file and line; nothing is published, and once the kit
is put back every check passes again (or the store's fingerprint is the clean one).

The matrix: tests/faults_table.py (rows), tests/helpers/faults.py (what every row asserts).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.built import build as build_cli
from helpers.built import build_once, copy_built, fingerprint
from helpers.cli import stage2, subprocess_env
from helpers.faults import (
    NOWHERE,
    SMALL,
    Member,
    Prepared,
    converge,
    copy_root,
    demo_hub,
    fault_cases,
    final_refused,
    forget_archive,
    hostile_archive,
    member,
    outside,
    read_members,
    refused,
    resolve_gets,
    restore,
    run_cfg,
    said,
    save,
    write_members,
)
from helpers.final import FINAL_STAGE

from stage2_data import checks as C
from stage2_data import layout
from stage2_data.demo import DemoPaths, write_sidecar_sha256
from stage2_data.profile import load_profile
from stage2_pipelines.runs import run_selection

pytestmark = pytest.mark.usefixtures("fault_instance")

CHECK_STAGES = ["extraction_report", "action_sidecars", "trajectory_join", "subset_checksums"]


def _restore_and_converge(
    prepared: Prepared, demo: DemoPaths, root: Path, saved: dict[Path, bytes], *, full: bool = False
) -> None:
    """Put the kit back; ``full``: the store's fingerprint is the clean one (d); else (cheaper) every
    check before the store passes again."""
    restore(saved)
    if full:
        converge(prepared, run_cfg(demo, root), root, [])
    else:
        r = run_selection(run_cfg(demo, root), CHECK_STAGES)
        assert r["success"] and all(c["passed"] for c in r["checks"]), said(r)


def _sidecar_tar(demo: DemoPaths) -> Path:
    return load_profile(demo.profile).kit_file("sidecar_archive")


def _rewrite_sidecar_tar(demo: DemoPaths, edit: Callable[[list[Member]], list[Member]]) -> None:
    tar = _sidecar_tar(demo)
    write_members(tar, edit(read_members(tar)))
    write_sidecar_sha256(demo.kit_root, load_profile(demo.profile).kit.sidecar_archive)


def _kit_files(demo: DemoPaths) -> list[Path]:
    prof = load_profile(demo.profile)
    files = [
        prof.kit_file(k)
        for k in ("pair_manifest", "subset_checksums", "sidecar_archive", "sidecar_archive_sha256")
    ]
    return files + sorted(prof.kit_file("action_manifest_dir").glob("*.jsonl"))


def _pairs(demo: DemoPaths) -> Path:
    return load_profile(demo.profile).kit_file("pair_manifest")


def _pair_rows(demo: DemoPaths) -> tuple[Path, list[dict[str, Any]]]:
    p = _pairs(demo)
    return p, [json.loads(x) for x in p.read_text().splitlines()]


def _write_rows(f: Path, rows: list[dict[str, Any]]) -> None:
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _recovered_rows(demo: DemoPaths, source: str) -> tuple[Path, list[dict[str, Any]]]:
    f = load_profile(demo.profile).kit_file("action_manifest_dir") / f"{source}.jsonl"
    return f, [json.loads(x) for x in f.read_text().splitlines()]


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _replace_sidecar(
    demo: DemoPaths, source: str, make: Callable[[dict[str, np.ndarray]], bytes]
) -> dict[str, Any]:
    """Replace one recovered sidecar of ``source`` (its manifest sha256 follows, so only the
    intended problem remains); returns its manifest row."""
    f, rows = _recovered_rows(demo, source)
    row = next(r for r in rows if r["status"] == "recovered")
    members = read_members(_sidecar_tar(demo))
    old = next(d for m, d in members if m.name == row["sidecar_path"])
    assert old is not None
    with np.load(io.BytesIO(old), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    new = make(arrays)
    out = []
    for m, d in members:
        if m.name == row["sidecar_path"]:
            m.size = len(new)
            d = new
        out.append((m, d))
    _rewrite_sidecar_tar(demo, lambda ms: out)
    row["sidecar_sha256"] = hashlib.sha256(new).hexdigest()
    _write_rows(f, rows)
    return row


# ----- the kit breaks: each returns what the refusal names -----------------------------------------
def _tar_sha(demo: DemoPaths) -> tuple[str, ...]:
    tar = _sidecar_tar(demo)
    data = bytearray(tar.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tar.write_bytes(bytes(data))
    return str(tar), "sha256 mismatch", "Fix:", "re-copy"


def _bad_json(demo: DemoPaths) -> tuple[str, ...]:
    p = _pairs(demo)
    lines = p.read_text().splitlines(keepends=True)
    lines[4] = lines[4][: len(lines[4]) // 2] + "\n"
    p.write_text("".join(lines))
    return f"{p}:5:", "malformed JSON"


def _dup_pair(demo: DemoPaths) -> tuple[str, ...]:
    p, rows = _pair_rows(demo)
    rows[7]["pair_id"] = rows[2]["pair_id"]
    _write_rows(p, rows)
    return f"{p}:8:", f"duplicate pair_id {rows[2]['pair_id']!r}", "first on line 3"


def _leak(demo: DemoPaths) -> tuple[str, ...]:
    p, rows = _pair_rows(demo)
    i = next(i for i, r in enumerate(rows) if r["split"] == "train")
    j = next(j for j, r in enumerate(rows) if r["split"] == "val")
    tid = rows[i]["chosen_trajectory_id"]
    rows[j]["chosen_trajectory_id"] = tid
    rows[j]["chosen_frames_path"] = rows[i]["chosen_frames_path"]
    _write_rows(p, rows)
    return "leakage", tid, f"{p}:"


def _missing_sidecar(demo: DemoPaths) -> tuple[str, ...]:
    _, rows = _recovered_rows(demo, "autoeval")
    victim = next(r for r in rows if r["status"] == "recovered")
    _rewrite_sidecar_tar(demo, lambda ms: [(m, d) for m, d in ms if m.name != victim["sidecar_path"]])
    return victim["stage2_trajectory_id"], "'recovered' but its sidecar", "is missing"


def _unknown_sidecar(demo: DemoPaths) -> tuple[str, ...]:
    stranger = "00000000-1111-4222-8333-444444444444"
    some = next(d for m, d in read_members(_sidecar_tar(demo)) if m.isreg())
    _rewrite_sidecar_tar(
        demo, lambda ms: ms + [member(f"action_sidecars/racer/trajectory_{stranger}.npz", some)]
    )
    return stranger, "that no action manifest row names"


def _sidecar_width(demo: DemoPaths) -> tuple[str, ...]:
    def narrower(a: dict[str, np.ndarray]) -> bytes:
        meta = json.loads(str(a["metadata_json"]))
        meta["raw_width"] = 7
        return _npz(
            metadata_json=np.array(json.dumps(meta)),
            raw_actions=a["raw_actions"][:, :7],
            aligned_actions=a["aligned_actions"][:, :7],
            source_indices=a["source_indices"],
            alignment_indices=a["alignment_indices"],
        )

    row = _replace_sidecar(demo, "roboarena", narrower)
    return row["stage2_trajectory_id"], "raw action width 7 contradicts source 'roboarena' width 8"


def _sidecar_nonfinite(demo: DemoPaths) -> tuple[str, ...]:
    def poisoned(a: dict[str, np.ndarray]) -> bytes:
        aligned = a["aligned_actions"].copy()
        aligned[1, 0] = np.nan
        aligned[2, 1] = np.inf
        return _npz(**{**a, "aligned_actions": aligned})

    row = _replace_sidecar(demo, "autoeval", poisoned)
    name = row["sidecar_path"].rsplit("/", 1)[-1]
    return name, "aligned_actions holds 2 non-finite value(s)", "first at row 1, column 0"


def _sidecar_alignment(demo: DemoPaths) -> tuple[str, ...]:
    def misaligned(a: dict[str, np.ndarray]) -> bytes:
        aligned = a["aligned_actions"].copy()
        aligned[0] = aligned[0] + np.float32(0.5)  # no longer the raw row it indexes
        idx = a["alignment_indices"].copy()
        idx[-1] = len(a["raw_actions"]) + 3  # outside the raw actions
        return _npz(**{**a, "aligned_actions": aligned, "alignment_indices": idx})

    row = _replace_sidecar(demo, "roboarena", misaligned)
    other = _replace_sidecar(
        demo,
        "racer",
        lambda a: _npz(**{**a, "aligned_actions": a["aligned_actions"] + np.float32(0.25)}),
    )
    return (
        row["sidecar_path"].rsplit("/", 1)[-1],
        "is outside raw_actions'",
        other["sidecar_path"].rsplit("/", 1)[-1],
        "aligned_actions row 0 differs from raw_actions row",
    )


def _sha256sums(demo: DemoPaths) -> tuple[str, ...]:
    sums = load_profile(demo.profile).kit_file("subset_checksums")
    lines = sums.read_text().splitlines()
    digest, path = lines[3].split("  ", 1)
    wrong = "f" * 64 if digest != "f" * 64 else "e" * 64
    lines[3] = f"{wrong}  {path}"
    sums.write_text("\n".join(lines) + "\n")
    return path, wrong, digest


@dataclass(frozen=True)
class Broken:
    breaks: Callable[[DemoPaths], tuple[str, ...]]  # breaks the kit; returns what the refusal names
    check: str  # the check that fails
    converges: bool = False  # the rerun: the clean fingerprint; else every check before the store


@fault_cases(
    kit_sidecar_tar_sha=Broken(_tar_sha, C.SIDECAR_TAR_SHA256_MATCHES),
    kit_bad_json=Broken(_bad_json, C.JOIN_HAS_NO_PROBLEMS, converges=True),
    kit_dup_pair=Broken(_dup_pair, C.JOIN_HAS_NO_PROBLEMS),
    kit_leak=Broken(_leak, C.JOIN_HAS_NO_PROBLEMS),
    kit_missing_sidecar=Broken(_missing_sidecar, C.JOIN_HAS_NO_PROBLEMS),
    kit_unknown_sidecar=Broken(_unknown_sidecar, C.JOIN_HAS_NO_PROBLEMS),
    kit_sidecar_width=Broken(_sidecar_width, C.JOIN_HAS_NO_PROBLEMS),
    kit_sha256sums=Broken(_sha256sums, C.SUBSET_BYTES_MATCH_SHA256SUMS),
    kit_sidecar_nonfinite=Broken(_sidecar_nonfinite, C.JOIN_HAS_NO_PROBLEMS),
    kit_sidecar_alignment=Broken(_sidecar_alignment, C.JOIN_HAS_NO_PROBLEMS),
)
def test_fault_kit_refused(prepared: Prepared, demo: DemoPaths, tmp_path: Path, case: Broken) -> None:
    saved = save(*_kit_files(demo))
    names = case.breaks(demo)
    _, root = final_refused(prepared, demo, tmp_path, *names, check=case.check)
    _restore_and_converge(prepared, demo, root, saved, full=case.converges)


class _Tripwire:
    """Unpickling this calls ``open(path, "w")``: the file's existence proves something unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_fault_kit_npz_object(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = save(*_kit_files(demo))
    tripwire = tmp_path / "UNPICKLED"

    def pickled(a: dict[str, np.ndarray]) -> bytes:
        obj = np.empty(len(a["aligned_actions"]), dtype=object)
        obj[0] = _Tripwire(str(tripwire))
        return _npz(**{**a, "aligned_actions": obj})

    row = _replace_sidecar(demo, "libero_success", pickled)
    # the payload is live: loading it with pickle allowed would trip the wire (proved on a copy)
    probe = _npz(x=np.array([_Tripwire(str(tmp_path / "probe"))], dtype=object))
    np.load(io.BytesIO(probe), allow_pickle=True)["x"]
    assert (tmp_path / "probe").exists()
    (tmp_path / "probe").unlink()
    r, root = final_refused(
        prepared,
        demo,
        tmp_path,
        "aligned_actions",
        "object (pickled) arrays",
        "not unpickled",
        check=C.JOIN_HAS_NO_PROBLEMS,
    )
    assert row["sidecar_path"].rsplit("/", 1)[-1] in said(r)
    assert not tripwire.exists()
    _restore_and_converge(prepared, demo, root, saved)
    assert not tripwire.exists()


def test_fault_kit_frames_npz(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    saved = save(*_kit_files(demo), demo.profile, demo.upstream / f"{SMALL}.tar")
    pairs = [json.loads(x) for x in _pairs(demo).read_text().splitlines()]
    used = sorted(
        {p[k] for p in pairs for k in ("chosen_frames_path", "rejected_frames_path") if f"/{SMALL}/" in p[k]}
    )
    assert len(used) >= 2
    bad_dtype, bad_shape = used[0], used[1]
    new_digests: dict[str, str] = {}

    def damage(ms: list[Member], top: str) -> list[Member]:
        out = []
        for m, data in ms:
            rel = f"{layout.PROCESSED_DIR}/{SMALL}/" + m.name.split(f"{SMALL}/", 1)[-1]
            if rel in (bad_dtype, bad_shape) and data is not None:
                with np.load(io.BytesIO(data), allow_pickle=False) as z:
                    frames = z["frames"]
                frames = (
                    frames.astype(np.float32)
                    if rel == bad_dtype
                    else np.concatenate([frames, frames[..., :1]], axis=-1)
                )
                buf = io.BytesIO()
                np.savez_compressed(
                    buf,
                    frames=frames,
                    shape=np.asarray(frames.shape, dtype=np.int64),
                    num_frames=np.asarray(len(frames), dtype=np.int64),
                )
                data = buf.getvalue()
                m.size = len(data)
                new_digests[rel] = hashlib.sha256(data).hexdigest()
            out.append((m, data))
        return out

    path = hostile_archive(demo, SMALL, damage)
    sums = load_profile(demo.profile).kit_file("subset_checksums")
    text = sums.read_text()
    for rel, dg in new_digests.items():
        text = re.sub(rf"^[0-9a-f]{{64}}  {re.escape(rel)}$", f"{dg}  {rel}", text, flags=re.M)
    sums.write_text(text)
    root = copy_root(prepared, tmp_path / "root")
    forget_archive(root, path)
    before = outside(tmp_path, root)
    with demo_hub(demo) as hub:
        cfg = run_cfg(demo, root, hub.url)
        assert run_selection(cfg, ["archive_file"], SMALL)["success"]
        assert run_selection(cfg, ["cache_dir"], SMALL)["success"]
        r = run_selection(cfg, FINAL_STAGE)
        refused(
            r,
            bad_dtype.rsplit("/", 1)[-1],
            "dtype float32; expected uint8",
            bad_shape.rsplit("/", 1)[-1],
            "expected (T, H, W, 3)",
            check=C.STORE_OPENS_STRICT,
        )
        assert outside(tmp_path, root) == before
        assert not layout.current_store_path(root, prepared.profile_name).exists()
        leftovers = (
            list(layout.stores_root(root, prepared.profile_name).glob("*"))
            if layout.stores_root(root, prepared.profile_name).exists()
            else []
        )
        assert leftovers == [], leftovers
        restore(saved)
        hub.clear_log()
        converge(prepared, cfg, root, [("archive_file", SMALL), ("cache_dir", SMALL)])
        assert resolve_gets(hub) == [path]


def test_fault_kit_path_newline(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """A frames path ending in a newline is a malformed path (every layout pattern is anchored with
    ``\\Z``), not a frames file reported missing under a name with a newline in it."""
    saved = save(*_kit_files(demo))
    p, rows = _pair_rows(demo)
    bad = rows[5]["chosen_frames_path"] + "\n"
    rows[5]["chosen_frames_path"] = bad
    _write_rows(p, rows)
    root = copy_root(prepared, tmp_path / "root")
    r = run_selection(run_cfg(demo, root), CHECK_STAGES)
    text = refused(
        r,
        f"{p}:6:",
        f"chosen_frames_path {bad!r} is not processed_datasets/<cache_key>/frames/trajectory_<ID>.npz",
        check=C.JOIN_HAS_NO_PROBLEMS,
    )
    assert "is missing" not in text, text
    _restore_and_converge(prepared, demo, root, saved)


def _sha256sum(args: list[str], cwd: Path, names: list[str]) -> bytes:
    return subprocess.run(["sha256sum", *args, *names], cwd=cwd, capture_output=True, check=True).stdout


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="coreutils sha256sum not installed")
def test_fault_kit_sums_spellings(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """The subset SHA256SUMS as `sha256sum` writes it from other folders or with other flags, and as
    `sha256sum -c` accepts it: every listed file is found and checked; nothing is "not listed"."""
    from stage2_data.kit import verify_subset_bytes

    prof = load_profile(demo.profile)
    sums = prof.kit_file("subset_checksums")
    saved = save(sums)
    root = copy_root(prepared, tmp_path / "root")
    rels = [line.split("  ", 1)[1] for line in sums.read_text().splitlines()]
    pd = layout.processed_root(root)
    plain = _sha256sum([], root, rels)
    variants = {
        "./ paths": _sha256sum([], root, ["./" + r for r in rels]),
        "absolute paths": _sha256sum([], root, [str(root / r) for r in rels]),
        "from the parent folder": _sha256sum([], root.parent, [f"{root.name}/{r}" for r in rels]),
        "from processed_datasets/": _sha256sum([], pd, [r.split("/", 1)[1] for r in rels]),
        "--tag": _sha256sum(["--tag"], root, rels),
        "--binary": _sha256sum(["--binary"], root, rels),
        "-z": _sha256sum(["-z"], root, rels),
        "escaped lines": b"".join(b"\\" + line + b"\n" for line in plain.splitlines()),
        "upper-case hex": b"".join(x[:64].upper() + x[64:] + b"\n" for x in plain.splitlines()),
        "CRLF": plain.replace(b"\n", b"\r\n"),
        "repeated lines": plain + plain,
    }
    for name, text in variants.items():
        sums.write_bytes(text)
        rep = verify_subset_bytes(prof, root, workers=2)
        assert rep.ok and (rep.files, rep.matched) == (len(rels), len(rels)), (name, rep.details[:3])
    # the whole check stage, on one of them
    sums.write_bytes(variants["./ paths"])
    r = run_selection(run_cfg(demo, root), CHECK_STAGES)
    assert r["success"] and all(c["passed"] for c in r["checks"]), said(r)
    # one file named twice (two spellings) with two digests: named, with both lines
    first = plain.splitlines()[0]
    sums.write_bytes(plain + b"0" * 64 + b"  ./" + first[66:] + b"\n")
    rep = verify_subset_bytes(prof, root, workers=2)
    assert not rep.ok
    assert any(f"names {first[66:].decode()} again with another sha256" in p for p in rep.problems), (
        rep.problems
    )
    restore(saved)


# ----- records that cover content, kit inputs that are regular files -----------------------------
# These rows drive `stage2 build` (and `stage2 verify`) as a user runs them, on a copy of a root
# that a `stage2 build` filled (tests/helpers/built.py).
@pytest.fixture(scope="module")
def built(prepared: Prepared, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_once(prepared, tmp_path_factory.mktemp("built-kit") / "root")


def test_fault_kit_sidecar_edit(prepared: Prepared, built: Path, tmp_path: Path) -> None:
    """An unpacked sidecar edited in place with its size and mtime restored: its changed ctime
    makes it hashed again, the sha256 the unpack recorded tells, and the sidecars are unpacked
    again from the kit's tar; the store stays the clean one."""
    from stage2_data.kit import sidecars_status

    demo = prepared.demo
    root = copy_built(built, tmp_path / "root")
    r = build_cli(demo.profile, root)  # the copy's records take its own inodes and ctimes
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    prof = load_profile(demo.profile)
    assert sidecars_status(prof, root) is None
    victim = sorted((layout.derived_root(root) / layout.SIDECARS_DIR).rglob("*.npz"))[0]
    st = victim.stat()
    old = victim.read_bytes()
    data = bytearray(old)
    data[len(data) // 2] ^= 0x01
    with open(victim, "r+b") as f:
        f.write(data)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (victim.stat().st_size, victim.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    why = sidecars_status(prof, root) or ""
    assert str(victim) in why and "modified since it was unpacked" in why, why
    r = build_cli(demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    assert victim.read_bytes() == old
    assert sidecars_status(prof, root) is None


def _not_regular(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:  # a device, through a link to one
        os.symlink("/dev/null", path)


@pytest.mark.parametrize("kind", ["FIFO", "folder", "device"])
def test_fault_kit_not_regular(
    prepared: Prepared, demo: DemoPaths, built: Path, tmp_path: Path, kind: str
) -> None:
    """A kit SHA256SUMS (or sidecar .sha256) that is a FIFO, a folder or a device is refused by
    name, at once (exit 2), by `stage2 build` and `stage2 verify --bytes`: nothing opens it (a FIFO
    would block them forever). Put back, the build gives the clean store."""
    prof = load_profile(demo.profile)
    root = copy_built(built, tmp_path / "root")
    for key in ("subset_checksums", "sidecar_archive_sha256"):
        path = prof.kit_file(key)
        saved = save(path)
        _not_regular(path, kind)
        said_kind = {"FIFO": "a FIFO", "folder": "a folder", "device": "a character device"}[kind]
        for argv in (
            ("build", "--profile", str(demo.profile), "--data-root", str(root), "--endpoint", NOWHERE),
            ("verify", str(demo.profile), "--data-root", str(root), "--bytes"),
        ):
            r = stage2(*argv, env=subprocess_env(drop=("DAGSTER_HOME", "CI")), timeout=60)
            out = r.stdout + r.stderr
            assert r.returncode == 2, (argv[0], r.tail())
            assert f"{path} is {said_kind}, not a regular file" in out and f"[kit] {key}" in out, out
            assert "does not exist" not in out and "internal error" not in out, out
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
        restore(saved)
    r = build_cli(demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()


def test_fault_kit_sums_other_release(
    prepared: Prepared, demo: DemoPaths, built: Path, tmp_path: Path
) -> None:
    """The kit's SHA256SUMS disagrees with a frame file that is exactly what its pinned, verified
    archive holds: the failure names the sums file and says the kit and the pins come from
    different releases (extracting again would change nothing, and the extraction is kept)."""
    from stage2_data.extract import load_extraction_record

    root = copy_built(built, tmp_path / "root")
    sums = load_profile(demo.profile).kit_file("subset_checksums")
    saved = save(sums)
    path, wrong, _ = _sha256sums(demo)
    key = path.split("/")[1]
    r = build_cli(demo.profile, root)
    out = r.stdout + r.stderr
    assert r.returncode == 1, r.tail()
    for name in (str(root / path), wrong, str(sums), "disagree", "different releases", "changes nothing"):
        assert name in out, (name, out)
    assert "internal error" not in out, out
    rec = load_extraction_record(root, key)
    assert rec is not None and rec.invalidated == ""  # the extraction is intact: not redone
    restore(saved)
    r = build_cli(demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()


def test_a_reunpack_moves_the_users_files_aside_never_deletes_them(
    prepared: Prepared, built: Path, tmp_path: Path
) -> None:
    """A file of the user's among the unpacked sidecars makes the build unpack them again (it passes);
    the file is moved into the data root's quarantine folder under its path (`stage2 list` shows
    it), never deleted; the unpacked sidecars are not moved (they are made again from the kit's tar)."""
    demo = prepared.demo
    root = copy_built(built, tmp_path / "root")
    base = layout.derived_root(root) / layout.SIDECARS_DIR
    (base / "my_extra.txt").write_text("mine\n")
    r = build_cli(demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    assert any(ln.startswith("moved aside:") and "quarantine" in ln for ln in r.stdout.splitlines()), r.stdout
    assert not (base / "my_extra.txt").exists()
    (folder,) = layout.quarantine_root(root).iterdir()
    kept = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert kept == ["derived/action_sidecars/my_extra.txt", "moved.json"]
    assert (folder / "derived" / "action_sidecars" / "my_extra.txt").read_text() == "mine\n"
    ls = stage2("list", str(demo.profile), "--data-root", str(root), "--json")
    assert ls.returncode == 0, ls.tail()
    moved = json.loads(ls.stdout)["quarantine"]["moved"]
    assert [m["original"] for m in moved] == ["derived/action_sidecars/my_extra.txt"]
    assert "never deleted" in moved[0]["reason"]
