"""What a build would do now, and why, without running anything (``stage2 build --dry-run``).

The answer is the one a build computes before it runs its first stage (:func:`.status.build_status`:
each stage up to date, or why it must run), with the rules a build adds to it: ``--reverify`` runs
every stage, a store on object storage always runs its stage, and a data root that does not exist
yet is a first build. Nothing is read but records and file stats (and the bytes of a file whose
stats changed since its record, hashed again as a build's check hashes them), nothing is written,
and the hub is not asked: a record a build's check would refresh (the file's bytes are the recorded
ones, its stats are not) is named, not written (``held``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..acquire.state import required_free_parts
from ..fsutil import free_bytes, human_bytes
from ..profile import Profile
from ..stages import STAGES, STORE
from .status import build_status

REVERIFY = "--reverify: every stage runs and trusts none of the build's own records"
FIRST_BUILD = "the data root does not exist yet (a first build)"
OBJECT_STORE = "the store goes to --store-url (object storage, or a stores folder outside the data root): its stage always runs"


@dataclass(frozen=True)
class StagePlan:
    """One stage of the plan: its name (as a build's ``up_to_date`` names it), what the progress
    display calls it, and why it would run (None: up to date, a build would not run it)."""

    stage: str
    label: str
    why: str | None

    @property
    def runs(self) -> bool:
        return self.why is not None


@dataclass(frozen=True)
class BuildPlan:
    """What a build of ``profile`` into ``data_root`` would do now."""

    profile: str
    data_root: str
    stages: tuple[StagePlan, ...]
    download_bytes: int  # archive bytes still to download
    extract_bytes: int  # what the extraction of every cache key a build extracts (again) writes (estimated)
    free_bytes: int  # free disk where the data root is (or will be)
    # the records a build's checks would refresh first (files hashed again, bytes as recorded)
    refreshes: tuple[str, ...] = ()

    @property
    def up_to_date(self) -> bool:
        return not any(s.runs for s in self.stages)

    def lines(self) -> list[str]:
        """The plan as ``stage2 build --dry-run`` prints it."""
        n = len(self.stages)
        out = [
            f"dry run of a build of profile {self.profile} into {self.data_root}: nothing was run or changed"
        ]
        for i, s in enumerate(self.stages, 1):
            out.append(f"[{i}/{n}] {s.label}: " + (f"would run: {s.why}" if s.runs else "up to date"))
        if self.refreshes:
            out.append(
                "a build would first refresh the stats these records hold (files whose stats changed, "
                "hashed now: their bytes are the recorded ones): " + ", ".join(self.refreshes)
            )
        out.append(
            f"disk: {human_bytes(self.download_bytes)} to download + {human_bytes(self.extract_bytes)} "
            f"to extract; {human_bytes(self.free_bytes)} free"
        )
        if self.up_to_date:
            out.append("a build now would run nothing (every stage is up to date)")
        else:
            ran = ", ".join(s.stage for s in self.stages if s.runs)
            out.append(f"a build now would run: {ran}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "profile": self.profile,
            "data_root": self.data_root,
            "up_to_date": self.up_to_date,
            "stages": [{**asdict(s), "runs": s.runs} for s in self.stages],
            "download_bytes": self.download_bytes,
            "extract_bytes": self.extract_bytes,
            "free_bytes": self.free_bytes,
            "refreshes": list(self.refreshes),
        }


def stage_reasons(
    profile: Profile,
    data_root: Path,
    settings: dict[str, Any] | None = None,
    *,
    reverify: bool = False,
    store_url: str | None = None,
    held: list[Path] | None = None,
) -> dict[str, str | None]:
    """``{stage name: None (up to date) | why it runs}`` for every stage of a build: what a build
    decides from (``pipelines.uptodate.stage_status``) and what its dry run says. Call it holding
    the data root's lock when the data root exists (a build running beside it would change the
    answer); ``settings``: the store stage's (``pipelines.uptodate.store_stage_settings``), which
    a changed setting makes run; ``held``: a list for a dry run, which writes nothing (the records
    a build's checks would refresh are appended to it: :func:`.status.build_status`)."""
    data_root = Path(data_root)
    if reverify:
        why: dict[str, str | None] = dict.fromkeys((s.name for s in STAGES), REVERIFY)
    elif not data_root.is_dir():
        why = dict.fromkeys((s.name for s in STAGES), FIRST_BUILD)
    else:
        why = build_status(profile, data_root, settings, held=held)
    if store_url and not reverify and data_root.is_dir():  # whatever its records say (the URL is one
        why[STORE.name] = OBJECT_STORE  # of the settings they cover): it is why the stage runs
    return why


def build_plan(
    profile: Profile,
    data_root: Path,
    settings: dict[str, Any] | None = None,
    *,
    reverify: bool = False,
    store_url: str | None = None,
) -> BuildPlan:
    """What a build would do now (:func:`stage_reasons`, and the disk it needs), under the same
    conditions."""
    data_root = Path(data_root)
    held: list[Path] = []  # a dry run writes nothing: what a build's checks would refresh is named
    why = stage_reasons(profile, data_root, settings, reverify=reverify, store_url=store_url, held=held)
    download, extract = required_free_parts(profile, data_root)  # no data root: every archive
    return BuildPlan(
        profile=profile.name,
        data_root=str(data_root),
        stages=tuple(StagePlan(s.name, s.label, why.get(s.name)) for s in STAGES),
        download_bytes=download,
        extract_bytes=extract,
        free_bytes=free_bytes(data_root),
        refreshes=tuple(sorted({str(p) for p in held})),
    )
