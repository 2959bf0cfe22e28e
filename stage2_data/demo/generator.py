"""The deterministic demo generator: a miniature of the real ``stage2_core_v1`` profile.

``generate_demo`` plans the demo (``plan.py``), writes its archives (``archives.py``), then the kit
(pair manifest, subset checksums, action manifests, sidecar ``.sha256``) and the profile pinned to
what was written, and last the marker file that says the folder is complete. It writes into a
staging sibling and moves it into place, so a folder with a marker is always a whole demo.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import Stage2Error
from ..formats.jsonl import jsonl_bytes
from ..formats.sha256sums import format_sha256sums
from ..hashing import sha256_file
from ..layout import frames_relpath, sidecar_relpath
from ..profile import (
    ArchiveSpec,
    ExpectedTotals,
    KitSpec,
    Profile,
    QuarantinedSpec,
    SourceSpec,
    dump_profile_toml,
    load_profile,
)
from ..publish import UMASK_MODE, atomic_write_json, atomic_write_text, publish_dir, staging
from .archives import build_cache_tar, build_sidecar_tar
from .hubserver.repository import HUB_MARKER
from .plan import Plan, make_plan
from .spec import (
    ACTION_SOURCES,
    CACHE_KEYS,
    GENERATOR_VERSION,
    KIT_ACTION_MANIFEST_DIR,
    KIT_PAIR_MANIFEST,
    KIT_SIDECAR_ARCHIVE,
    KIT_SIDECAR_ARCHIVE_SHA256,
    KIT_SUBSET_CHECKSUMS,
    MARKER_NAME,
    OTHER_ARCHIVE,
    OTHER_SPEC,
    PROFILE_NAME_FULL,
    PROFILE_NAME_SMALL,
    QUARANTINE_REASON,
    QUARANTINED_ARCHIVE,
    QUARANTINED_SPEC,
    REPO_ID,
    SPLIT_CACHE_KEY,
    SPLIT_PARTS,
    STATUS_RECOVERED,
    mode_name,
)


@dataclass(frozen=True)
class DemoPaths:
    root: Path
    upstream: Path
    kit_root: Path
    profile: Path
    repo_id: str
    revision: str


def _declare(upstream: Path, repo_id: str, revision: str) -> None:
    """The upstream folder's declaration of what it mirrors, for `--hub-folder` (not a file of the
    repository: it adds nothing to the revision, and files added to the folder later leave it the
    commit the profile pins)."""
    (upstream / HUB_MARKER).write_text(
        json.dumps({"repo_id": repo_id, "revision": revision}) + "\n", encoding="utf-8"
    )


def _paths(root: Path, revision: str) -> DemoPaths:
    return DemoPaths(
        root=root,
        upstream=root / "upstream",
        kit_root=root / "kit",
        profile=root / "kit" / "profile.toml",
        repo_id=REPO_ID,
        revision=revision,
    )


# ---- the marker: written last, it says the folder holds a complete demo ------------------------
def _read_marker(root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((root / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _complete(root: Path, full: bool) -> str | None:
    """The revision of a complete demo of this mode and generator version at ``root``, else None."""
    marker = _read_marker(root)
    if (
        marker is not None
        and marker.get("mode") == mode_name(full)
        and marker.get("generator_version") == GENERATOR_VERSION
        and isinstance(marker.get("revision"), str)
    ):
        return str(marker["revision"])
    return None


def demo_hub_folder(profile_path: Path | str | None) -> Path | None:
    """The hub folder of the demo whose profile is ``profile_path`` (``<demo>/kit/profile.toml``:
    ``<demo>/upstream``, what ``--hub-folder`` serves), when that file is a complete demo's; else
    None. A demo's profile names the real hub's repo, which this machine may not reach: its
    archives are in that folder."""
    if profile_path is None:
        return None
    root = Path(profile_path).absolute().parent.parent
    paths = _paths(root, "")
    if _read_marker(root) is None or paths.profile != Path(profile_path).absolute():
        return None
    return paths.upstream if paths.upstream.is_dir() else None


def _write_marker(root: Path, full: bool, profile_name: str, revision: str) -> None:
    marker = {
        "generator": "stage2_data.demo",
        "generator_version": GENERATOR_VERSION,
        "mode": mode_name(full),
        "profile": profile_name,
        "repo_id": REPO_ID,
        "revision": revision,
    }
    atomic_write_json(root / MARKER_NAME, marker, mode=UMASK_MODE)


# ---- generation --------------------------------------------------------------------------------
def generate_demo(out: Path, *, full_cardinality: bool = False) -> DemoPaths:
    """Generate the demo into ``out`` and return its paths.

    Idempotent: if ``out`` already holds a complete demo of the same mode (its marker file is
    written last), it is returned as is. Otherwise the demo is written into a temporary sibling
    folder and moved into place; an existing demo of another mode or generator version is
    replaced, any other non-empty folder is refused.
    """
    root = Path(out).resolve()
    revision = _complete(root, full_cardinality)
    if revision is not None:
        paths = _paths(root, revision)
        # a demo made before its folder declared what it mirrors gets the declaration (a read-only
        # one stays at its files' digest: the same commit)
        if not os.path.lexists(paths.upstream / HUB_MARKER):
            with contextlib.suppress(OSError):
                _declare(paths.upstream, paths.repo_id, revision)
        return paths
    if root.exists() and (not root.is_dir() or (_read_marker(root) is None and any(root.iterdir()))):
        raise Stage2Error(
            f"demo output {root} exists and is not a demo folder (no {MARKER_NAME}); refusing to replace it.",
            fix="pass an empty or new folder, or delete that one",
        )
    with staging(root) as tmp:  # removed at exit unless published
        revision = _generate_into(tmp, full_cardinality)
        tmp.chmod(0o755)  # whatever the umask
        if _complete(root, full_cardinality) != revision:  # else another process finished the same demo first
            publish_dir(tmp, root)
    return _paths(root, revision)


def _generate_into(root: Path, full: bool) -> str:
    plan = make_plan(full)
    upstream = root / "upstream"
    kit = root / "kit"
    upstream.mkdir(parents=True)
    (kit / "manifests").mkdir(parents=True)
    (kit / KIT_ACTION_MANIFEST_DIR).mkdir(parents=True)

    digests, archive_files = _write_archives(plan, upstream, kit)
    write_sidecar_sha256(kit, KIT_SIDECAR_ARCHIVE)
    (upstream / "README.md").write_text(
        "# processed_datasets (demo)\n\nDeterministic miniature of robometer/processed_datasets generated by "
        f"stage2_data.demo v{GENERATOR_VERSION}. One uncompressed tar per cache directory.\n",
        encoding="utf-8",
    )
    unique_frame_files = _write_pairs(plan, kit, digests)
    sidecars_by_source = _write_action_manifests(plan, kit, digests)
    revision, prof = _make_profile(plan, upstream, archive_files, unique_frame_files, sidecars_by_source)
    _declare(upstream, prof.source.repo_id, revision)
    _write_profile(kit / "profile.toml", prof)
    _write_marker(root, full, prof.name, revision)
    return revision


def _write_archives(plan: Plan, upstream: Path, kit: Path) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Every tar of the demo; returns the sha256 of every ``.npz`` written (by kit path) and the
    ``(upstream file, cache_key)`` of every archive the profile names."""
    full = plan.full
    jobs: list[tuple[Callable[..., dict[str, str]], tuple[Any, ...]]] = [
        (build_sidecar_tar, (plan.action_rows, full, kit / KIT_SIDECAR_ARCHIVE))
    ]
    archive_files: list[tuple[str, str]] = []  # (upstream path, cache_key)
    for spec in sorted(CACHE_KEYS, key=lambda s: -len(plan.trajs[s.cache_key])):
        name = f"{spec.cache_key}.tar"
        if spec.cache_key == SPLIT_CACHE_KEY:
            archive_files += [(f"{name}.{suffix}", spec.cache_key) for suffix in SPLIT_PARTS]
        else:
            archive_files.append((name, spec.cache_key))
        jobs.append((build_cache_tar, (spec, plan.trajs[spec.cache_key], full, upstream / name)))
    for spec, name in ((QUARANTINED_SPEC, QUARANTINED_ARCHIVE), (OTHER_SPEC, OTHER_ARCHIVE)):
        jobs.append((build_cache_tar, (spec, plan.extra_trajs[spec.cache_key], full, upstream / name)))
    # Serial on purpose: a process pool would shorten the full-cardinality mode's wall time, but
    # "spawn" re-imports the caller's __main__ (breaks unguarded scripts and stdin) and "fork" is
    # unsafe once pyarrow holds native threads.
    digests: dict[str, str] = {}
    for fn, args in jobs:
        digests.update(fn(*args))
    return digests, archive_files


def _write_pairs(plan: Plan, kit: Path, digests: dict[str, str]) -> int:
    """The pair manifest and the subset checksums; returns the number of unique frame files."""
    rows = []
    used: set[str] = set()
    for i, p in enumerate(plan.pairs, start=1):
        cpath = frames_relpath(p.chosen.cache_key, p.chosen.id)
        rpath = frames_relpath(p.rejected.cache_key, p.rejected.id)
        used.update((cpath, rpath))
        row = {
            "pair_id": f"p{i:06d}",
            "split": p.split,
            "task": p.task,
            "chosen_trajectory_id": p.chosen.id,
            "chosen_frames_path": cpath,
            "rejected_trajectory_id": p.rejected.id,
            "rejected_frames_path": rpath,
        }
        rows.append(row)
    (kit / KIT_PAIR_MANIFEST).write_bytes(jsonl_bytes(rows, compact=False))
    sums = format_sha256sums((digests[p], p) for p in sorted(used))
    (kit / KIT_SUBSET_CHECKSUMS).write_text(sums, encoding="utf-8")
    return len(used)


def _write_action_manifests(plan: Plan, kit: Path, digests: dict[str, str]) -> dict[str, int]:
    """One action manifest per source; returns the number of sidecars of each source."""
    sidecars_by_source: dict[str, int] = {}
    for src, rows_ in plan.action_rows.items():
        sidecars_by_source[src] = sum(1 for r in rows_ if r.status == STATUS_RECOVERED)
        manifest = []
        for r in rows_:
            rel = sidecar_relpath(src, r.traj.id) if r.status == STATUS_RECOVERED else None
            manifest.append(
                {
                    "stage2_trajectory_id": r.traj.id,
                    "source": src,
                    "cache_key": r.traj.cache_key,
                    "status": r.status,
                    "sidecar_path": rel,
                    "sidecar_sha256": digests[rel] if rel else None,
                }
            )
        (kit / KIT_ACTION_MANIFEST_DIR / f"{src}.jsonl").write_bytes(jsonl_bytes(manifest, compact=False))
    return sidecars_by_source


def _make_profile(
    plan: Plan,
    upstream: Path,
    archive_files: list[tuple[str, str]],
    unique_frame_files: int,
    sidecars_by_source: dict[str, int],
) -> tuple[str, Profile]:
    """The revision (a sha1 over the upstream files' names and digests) and the profile pinned to it."""
    full = plan.full
    upstream_digests = {p.name: sha256_file(p) for p in sorted(upstream.iterdir()) if p.is_file()}
    revision = hashlib.sha1(
        "".join(f"{name}\0{digest}\n" for name, digest in sorted(upstream_digests.items())).encode()
    ).hexdigest()
    archives = [
        ArchiveSpec(
            path=name, cache_key=key, size=(upstream / name).stat().st_size, sha256=upstream_digests[name]
        )
        for name, key in sorted(archive_files)
    ]
    expected = ExpectedTotals(
        cache_dirs=len(CACHE_KEYS),
        archives=len(archives),
        trajectories=sum(len(v) for v in plan.trajs.values()),
        pair_rows=len(plan.pairs),
        unique_frame_files=unique_frame_files,
        action_manifest_rows=sum(len(v) for v in plan.action_rows.values()),
        resolved_sidecars=sum(sidecars_by_source.values()),
        sidecars_by_source=sidecars_by_source,
        action_width_by_source={s.name: s.raw_width for s in ACTION_SOURCES.values()},
    )
    prof = Profile(
        name=PROFILE_NAME_FULL if full else PROFILE_NAME_SMALL,
        description=(
            f"Deterministic demo of stage2_core_v1 ({mode_name(full)}), generated by stage2_data.demo "
            f"v{GENERATOR_VERSION}"
        ),
        source=SourceSpec(repo_id=REPO_ID, repo_type="dataset", revision=revision),
        kit=KitSpec(
            pair_manifest=KIT_PAIR_MANIFEST,
            subset_checksums=KIT_SUBSET_CHECKSUMS,
            action_manifest_dir=KIT_ACTION_MANIFEST_DIR,
            sidecar_archive=KIT_SIDECAR_ARCHIVE,
            sidecar_archive_sha256=KIT_SIDECAR_ARCHIVE_SHA256,
        ),
        archives=archives,
        quarantined=[QuarantinedSpec(path=QUARANTINED_ARCHIVE, reason=QUARANTINE_REASON)],
        expected=expected,
    )
    return revision, prof


# ---- the profile and the sidecar checksum, also rewritten by tests that alter a demo ----------
def _write_profile(path: Path, prof: Profile) -> None:
    text = dump_profile_toml(prof)
    atomic_write_text(path, text)
    path.chmod(0o644)
    back = load_profile(path)
    if back.model_dump() != prof.model_dump():
        raise RuntimeError(f"demo: {path} does not round-trip through load_profile")


def repin_profile(demo: DemoPaths) -> None:
    """Recompute size and sha256 of every ``[[archives]]`` entry from the upstream files.

    The revision is left as it is (the loopback hub serves whatever the upstream folder holds
    under the demo's revision)."""
    prof = load_profile(demo.profile)
    problems = [a.path for a in prof.archives if not (demo.upstream / a.path).is_file()]
    if problems:
        raise Stage2Error(
            f"cannot repin {demo.profile}: upstream file(s) missing in {demo.upstream}: {', '.join(problems)}.",
            fix="regenerate the demo (delete its folder and run `python -m stage2_data.demo OUT`)",
        )
    archives = [
        a.model_copy(
            update={
                "size": (demo.upstream / a.path).stat().st_size,
                "sha256": sha256_file(demo.upstream / a.path),
            }
        )
        for a in prof.archives
    ]
    _write_profile(demo.profile, prof.model_copy(update={"archives": archives}))


def write_sidecar_sha256(kit_root: Path, sidecar_tar_rel: str) -> None:
    """(Re)write ``<tar>.sha256`` in sha256sum format, naming the tar by its file name."""
    tar = Path(kit_root) / sidecar_tar_rel
    out = tar.with_name(tar.name + ".sha256")
    atomic_write_text(out, format_sha256sums([(sha256_file(tar), tar.name)]))
    out.chmod(0o644)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stage2_data.demo", description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="output folder (created; reused if it already holds this demo)")
    ap.add_argument(
        "--full-cardinality",
        action="store_true",
        help="the exact totals of stage2_core_v1 with tiny payloads",
    )
    args = ap.parse_args(argv)
    try:
        demo = generate_demo(args.out, full_cardinality=args.full_cardinality)
    except Stage2Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"root      {demo.root}")
    print(f"upstream  {demo.upstream}")
    print(f"kit_root  {demo.kit_root}")
    print(f"profile   {demo.profile}")
    print(f"repo_id   {demo.repo_id}")
    print(f"revision  {demo.revision}")
    return 0
