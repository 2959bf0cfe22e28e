"""The link check: every pair's frames file and every recovered row's sidecar exists, plus the
manifests' own problems. Names only: nothing is opened or hashed."""

from __future__ import annotations

import os
import stat
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import layout
from ..profile import Profile
from .listing import sidecar_dirs
from .manifests import RECOVERED, read_action_manifests, read_pair_manifest
from .problems import missing_frames_problem, unnamed_sidecar_problem

__all__ = ["LINK_TOTALS", "LinkReport", "link_check"]


# The totals of ``[expected]`` the link check counts (fields of LinkReport and of ExpectedTotals).
LINK_TOTALS = ("pair_rows", "unique_frame_files", "action_manifest_rows", "resolved_sidecars")


@dataclass
class LinkReport:
    pair_rows: int
    unique_frame_files: int
    action_manifest_rows: int
    resolved_sidecars: int
    sidecars_by_source: dict[str, int]
    missing_frames: int
    missing_sidecars: int
    problems: list[str]
    seconds: float
    fs_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def totals_vs_expected(self, profile: Profile) -> list[str]:
        e = profile.expected
        out: list[str] = []
        for name in ("pair_rows", "unique_frame_files", "action_manifest_rows", "resolved_sidecars"):
            want, got = getattr(e, name), getattr(self, name)
            if want != got:
                out.append(f"{name}: expected {want}, found {got}")
        if e.sidecars_by_source:
            for source in sorted(set(e.sidecars_by_source) | set(self.sidecars_by_source)):
                want_s = e.sidecars_by_source.get(source, 0)
                got_s = self.sidecars_by_source.get(source, 0)
                if want_s != got_s:
                    out.append(f"sidecars_by_source.{source}: expected {want_s}, found {got_s}")
        return out


def link_check(profile: Profile, data_root: Path) -> LinkReport:
    """Check that every pair's frames file and every recovered row's sidecar exists, plus the
    manifests' own problems. Names only, nothing is opened or hashed: one ``stat`` per frames file
    the pairs use (a few thousand among tens of thousands of trajectories) and one ``scandir`` per
    sidecar folder (which also finds sidecars no row names)."""
    t0 = time.perf_counter()
    data_root = Path(data_root)
    pairs_path = profile.kit_file("pair_manifest")
    pairs, problems = read_pair_manifest(pairs_path)
    frame_paths: dict[str, tuple[str, int]] = {}  # frames path -> (trajectory id, first line)
    setdefault = frame_paths.setdefault
    for o, line in zip(pairs.rows, pairs.lines, strict=True):
        setdefault(o.chosen_frames_path, (o.chosen_trajectory_id, line))
        setdefault(o.rejected_frames_path, (o.rejected_trajectory_id, line))
    action_files, action_problems = read_action_manifests(profile.kit_file("action_manifest_dir"))
    problems += action_problems

    # --- frames files ------------------------------------------------------------------------
    t_fs = time.perf_counter()
    root = os.fspath(data_root) + os.sep
    match = layout.FRAMES_PATH_RE.match
    gone: list[tuple[str, str, str, int]] = []  # (folder, frames path, trajectory id, line)
    unmatched = 0  # already reported by the pair rules
    for fpath, (tid, line) in frame_paths.items():
        if match(fpath) is None:
            unmatched += 1
            continue
        try:
            present = stat.S_ISREG(os.stat(root + fpath).st_mode)
        except (OSError, ValueError):
            present = False
        if not present:
            gone.append((fpath.rpartition("/")[0], fpath, tid, line))
    gone.sort(key=lambda g: g[0])  # by folder; pair-manifest order within a folder
    problems.extend(
        missing_frames_problem(pairs_path, line, fpath, tid, data_root) for _, fpath, tid, line in gone
    )

    # --- sidecars: a row's sidecar counts once (a duplicate row is a manifest problem) --------
    derived = layout.derived_root(data_root)
    on_disk = {
        f"{layout.SIDECARS_DIR}/{source}/{name}"
        for source, names in sidecar_dirs(derived).items()
        for name in names
    }
    named: set[str] = set()
    resolved: list[str] = []  # the source of each sidecar found
    missing_sidecars = 0
    for m in action_files:
        for a, line in zip(m.rows, m.lines, strict=True):
            sp = a.sidecar_path
            if sp is None or sp in named:
                continue
            named.add(sp)
            if sp in on_disk:
                resolved.append(a.source)
            elif a.status == RECOVERED:
                missing_sidecars += 1
                problems.append(
                    f"{m.path}:{line}: trajectory {a.stage2_trajectory_id} is {RECOVERED!r} but its "
                    f"sidecar {derived / sp} is missing"
                )
    problems.extend(unnamed_sidecar_problem(derived, rel) for rel in sorted(on_disk - named))
    by_source = Counter(resolved)
    t_end = time.perf_counter()
    return LinkReport(
        pair_rows=len(pairs.rows),
        unique_frame_files=len(frame_paths),
        action_manifest_rows=sum(len(m.rows) for m in action_files),
        resolved_sidecars=len(resolved),
        sidecars_by_source=dict(sorted(by_source.items())),
        missing_frames=len(gone) + unmatched,
        missing_sidecars=missing_sidecars,
        problems=problems,
        seconds=t_end - t0,
        fs_seconds=t_end - t_fs,
    )
