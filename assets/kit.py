"""The kit: action sidecars, the join by trajectory id, byte-level subset verification."""

import time
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_data import checks as C
from stage2_data import layout, steps
from stage2_data.kit import link_check
from stage2_data.kit.listing import sidecar_dirs
from stage2_data.kit.sidecar_facts import check_sidecars_on_disk, sidecar_infos
from stage2_data.profile import Profile
from stage2_data.stages import ACTION_SIDECARS, SUBSET_CHECKSUMS, TRAJECTORY_JOIN
from stage2_resources import DataRootResource, ProfileResource

from ._common import check_result, code_version_with, data_root_step_lock, forget_on_failure, standalone_check
from .step_asset import step_asset

GROUP = "kit"


# ----- the standalone checks' results a build records (checks.RECORDED_BY_BUILD) ----------------
def _links_outcome(prof: Profile, rep: Any) -> C.CheckOutcome:
    """links_on_disk_match_expected from a link check's report (the check's own code, below)."""
    problems = list(rep.problems) + steps.link_totals_problems(prof, rep)
    return C.outcome(
        C.LINKS_ON_DISK_MATCH_EXPECTED,
        problems,
        pair_rows=rep.pair_rows,
        unique_frame_files=rep.unique_frame_files,
        resolved_sidecars=rep.resolved_sidecars,
        seconds=round(rep.seconds, 3),
    )


def _sidecars_as_built(root: Path) -> C.CheckOutcome:
    """sidecars_on_disk_finite_and_consistent as the build knows it: every unpacked sidecar's keys,
    shapes and data as the unpack read them when it wrote them (a file whose inode, size, mtime and
    ctime are unchanged since), any other read again (``sidecar_infos``: what the join relies on).
    The check itself (the verify job, the UI's Execute) reads every one again."""
    t0 = time.perf_counter()
    derived = layout.derived_root(root)
    rels = [
        f"{layout.SIDECARS_DIR}/{source}/{name}"
        for source, names in sorted(sidecar_dirs(derived).items())
        for name in sorted(names)
        if name.endswith(".npz")
    ]
    problems = [p for info in sidecar_infos(derived, rels, False) for p in info.problems]
    return C.outcome(
        C.SIDECARS_ON_DISK_SANE,
        problems,
        f"checked by this build: all {len(rels)} unpacked sidecars, each as the unpack read it when it "
        "wrote it (unchanged since: inode, size, mtime, ctime) or read again; the verify job re-reads "
        "every one",
        sidecars=len(rels),
        seconds=round(time.perf_counter() - t0, 3),
    )


def _join(prof: Profile, root: Path) -> steps.StepResult:
    """The join step, and the sidecar facts of every unpacked sidecar (``_sidecars_as_built``),
    kept in the result's value; a problem those facts show that the join did not (a sidecar the
    join does not read) fails join_has_no_problems too, so a build's own checks report it."""
    res = steps.step_join(prof, root)
    sidecars = _sidecars_as_built(root)
    join_check = res.checks[0]
    if not sidecars.passed and join_check.name == C.JOIN_HAS_NO_PROBLEMS and join_check.passed:
        res.checks[0] = C.CheckOutcome(C.JOIN_HAS_NO_PROBLEMS, False, sidecars.description)
    res.value = (*res.value, sidecars)
    return res


def _join_standalone(prof: Profile, _root: Path, res: steps.StepResult) -> list[C.CheckOutcome]:
    _join_table, rep, sidecars = res.value
    return [_links_outcome(prof, rep), sidecars]


def _bytes_outcome(res: steps.StepResult) -> C.CheckOutcome:
    """subset_bytes_on_disk_match_sha256sums from the byte check's result (the check's own code)."""
    failed = [c for c in res.checks if not c.passed]
    desc = "; ".join(c.description for c in failed) if failed else res.checks[0].description
    return C.CheckOutcome(C.SUBSET_BYTES_ON_DISK_MATCH, not failed, desc, dict(res.metadata))


def build_kit_assets(kit: str) -> list[Any]:
    """The kit's assets; ``kit``: :func:`steps.kit_digest`. The join and the byte check read the
    kit's manifests and SHA256SUMS: their code versions follow them (an edit marks both stale in
    the UI until the next build)."""
    action_sidecars = step_asset(
        ACTION_SIDECARS,
        group=GROUP,
        description="derived/action_sidecars/: the sidecar tar unpacked after its sha256 check.",
        kind="npz",
        step=steps.step_sidecars,
        reverifies=True,
    )
    trajectory_join = step_asset(
        TRAJECTORY_JOIN,
        group=GROUP,
        description="tables/trajectory_join.parquet: trajectories x sidecars joined by stage2_trajectory_id; "
        "link check. Its code version ends with a digest of the kit's manifests, SHA256SUMS and the "
        "pins: an edit of those marks it stale until the next build.",
        kind="parquet",
        step=_join,
        standalone=_join_standalone,
        code_version=code_version_with(TRAJECTORY_JOIN, kit),
    )
    subset_checksums = step_asset(
        SUBSET_CHECKSUMS,
        group=GROUP,
        description="Every subset frame file hashed (in parallel) and compared with the kit's SHA256SUMS. "
        "Its code version ends with a digest of the kit's manifests, SHA256SUMS and the pins: an "
        "edit of those marks it stale until the next build.",
        kind="sha256",
        step=lambda prof, root: steps.step_verify_bytes(prof, root),
        standalone=lambda _prof, _root, res: [_bytes_outcome(res)],
        code_version=code_version_with(SUBSET_CHECKSUMS, kit),
    )
    return [action_sidecars, trajectory_join, subset_checksums]


def build_kit_checks(trajectory_join: Any, subset_checksums: Any) -> list[Any]:
    """Checks that re-read the kit's data on disk (the verify job runs them). Each holds the data
    root's lock as a step does (``data_root_step_lock``: shared, refused while a build writes): what
    a build is replacing would read as a false failure, and a failure clears the build's records
    (``forget_on_failure``)."""

    @standalone_check(trajectory_join, C.LINKS_ON_DISK_MATCH_EXPECTED)
    def links_on_disk_match_expected(
        profile: ProfileResource, data_root: DataRootResource
    ) -> dg.AssetCheckResult:
        prof = profile.load()
        with data_root_step_lock(data_root.root(), what=f"check {C.LINKS_ON_DISK_MATCH_EXPECTED}"):
            res = _links_outcome(prof, link_check(prof, data_root.root()))
            forget_on_failure(data_root.root(), [(res.name, res.passed)], TRAJECTORY_JOIN)
        return check_result(res.passed, res.description, res.metadata)

    @standalone_check(trajectory_join, C.SIDECARS_ON_DISK_SANE)
    def sidecars_on_disk_sane(data_root: DataRootResource) -> dg.AssetCheckResult:
        with data_root_step_lock(data_root.root(), what=f"check {C.SIDECARS_ON_DISK_SANE}"):
            rep = check_sidecars_on_disk(data_root.root())
            res = C.outcome(C.SIDECARS_ON_DISK_SANE, rep.problems)
            forget_on_failure(data_root.root(), [(res.name, res.passed)], TRAJECTORY_JOIN)
        return check_result(
            res.passed, res.description, {"sidecars": rep.files, "seconds": round(rep.seconds, 3)}
        )

    @standalone_check(subset_checksums, C.SUBSET_BYTES_ON_DISK_MATCH)
    def subset_bytes_on_disk_match(
        profile: ProfileResource, data_root: DataRootResource
    ) -> dg.AssetCheckResult:
        prof = profile.load()
        with data_root_step_lock(data_root.root(), what=f"check {C.SUBSET_BYTES_ON_DISK_MATCH}"):
            res = _bytes_outcome(steps.step_verify_bytes(prof, data_root.root(), record=False))
            forget_on_failure(data_root.root(), [(res.name, res.passed)], SUBSET_CHECKSUMS)
        return check_result(res.passed, res.description, res.metadata)

    return [links_on_disk_match_expected, sidecars_on_disk_sane, subset_bytes_on_disk_match]
