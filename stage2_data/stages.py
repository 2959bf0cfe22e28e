"""The asset graph's names and the stages of a build: the one table that `stage2 build`
(``stage2_pipelines.runner``), the schedules and sensors (``stage2_pipelines.rebuild``), the checks
(``checks.py``) and the progress display (``stage2_pipelines.progress``) read. Dagster-free; imports nothing.

A build goes through five stages. A stage materializes its assets in one run of its named job; a
partitioned stage (per cache key) runs all its partitions in that one run (a single-run backfill),
largest first. What each asset reads is declared once (``READS``): the assets take their deps from
it, and a stage starts when the stages it needs (``Stage.after``: those holding an asset one of its
assets reads) are over, so stages that do not need each other run side by side: the kit stage (the
action sidecars, read from the kit alone) runs beside the downloads and the extraction, and the
store stage waits for both. What runs next is decided here, once:

- :func:`stages_after`: the stages that need a given one (none after the last);
- :func:`ready_stages`: the stages whose needs are all over;
- :func:`stage_partitions`: the partitions of a stage that may run, given the runs that failed
  before it: a partition whose upstream partition failed is left out (a cache key whose archive
  failed), and an unpartitioned stage runs only when nothing it needs failed.

`stage2 build` launches the stages' runs in this order (a stage beside the main line in a thread of
its own; the acquire and extract stages ``STREAMED``: runs of ``STREAM_JOB``, one per range of
cache keys (``stream_groups``)); a scheduled rebuild walks the same stages as Dagster runs (the
``advance_rebuilds`` sensor requests a stage once every stage it needs is complete, the streamed
ones as the same ranges), starting at the profile stage like the build.

To add a stage: add its assets below with what each reads (``READS``), a :class:`Stage` to
``STAGES`` (after the stages it needs), and the assets in ``stage2_assets``; the CLI, the rebuild
sensor and the progress display follow the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .profile import Profile

# ----- assets, in graph order ----------------------------------------------------------------------
PINNED_PROFILE = "pinned_profile"
ARCHIVE_FILE = "archive_file"  # one partition per cache key: its archive files
CACHE_DIR = "cache_dir"  # one partition per cache key
EXTRACTION_REPORT = "extraction_report"
ACTION_SIDECARS = "action_sidecars"
TRAJECTORY_JOIN = "trajectory_join"
SUBSET_CHECKSUMS = "subset_checksums"
VIN_STORE = "vin_store"
ASSETS: tuple[str, ...] = (
    PINNED_PROFILE,
    ARCHIVE_FILE,
    CACHE_DIR,
    EXTRACTION_REPORT,
    ACTION_SIDECARS,
    TRAJECTORY_JOIN,
    SUBSET_CHECKSUMS,
    VIN_STORE,
)

# What each asset reads: the asset graph's edges, declared once. The assets take their deps from it
# (``stage2_assets``: ``stage_asset``), so Dagster's graph is this table, and the order of the
# stages (``Stage.after``) is read from it too.
READS: dict[str, tuple[str, ...]] = {
    PINNED_PROFILE: (),
    ARCHIVE_FILE: (PINNED_PROFILE,),
    CACHE_DIR: (ARCHIVE_FILE,),
    EXTRACTION_REPORT: (CACHE_DIR,),
    ACTION_SIDECARS: (PINNED_PROFILE,),
    TRAJECTORY_JOIN: (EXTRACTION_REPORT, ACTION_SIDECARS),
    SUBSET_CHECKSUMS: (EXTRACTION_REPORT,),
    VIN_STORE: (TRAJECTORY_JOIN, SUBSET_CHECKSUMS),
}

# how a stage is partitioned: by cache key (a cache directory: its archives, then its extraction)
BY_CACHE_KEY = "cache_key"

# ----- jobs: what the schedules, the sensors and the UI launch ----------------------------------------
PROFILE_JOB = "check_profile"
ACQUIRE_JOB = "acquire_archives"
EXTRACT_JOB = "extract_cache_dirs"
KIT_JOB = "unpack_action_sidecars"
KIT_AND_STORE_JOB = "verify_kit_and_build_store"
VERIFY_JOB = "verify_existing_data"
STREAM_JOB = "download_and_extract"  # a range of cache keys: archives, then extraction (STREAMED)

DOWNLOADS_POOL = "downloads"  # the concurrency pool of archive_file's runs
# the tag of a run over a range of partitions naming the keys it runs (a range may hold keys whose
# upstream failed: they are left out); the assets read it, the build runner and the rebuild set it
PARTITIONS_TAG = "stage2/partitions"
# the tag of a run `stage2 build` starts naming its data root: a step executed by a process whose
# code location has another one (a Dask worker or pod with other settings) refuses to run
DATA_ROOT_TAG = "stage2/data_root"
#: the tag every run of one `stage2 build` carries: that build's id, which it also writes into the
#: data root's lock while it holds it (``publish.lock``): a step of such a run is covered by the
#: build's lock wherever it executes (a Dask worker, a pod), a re-executed old run is not
BUILD_TAG = "stage2/build"


@dataclass(frozen=True)
class Stage:
    name: str  # also the `stage2/stage` tag of a scheduled rebuild's runs
    label: str  # what the progress display calls it
    assets: tuple[str, ...]  # what the stage's run materializes (with their checks)
    partitioned_by: str | None  # BY_CACHE_KEY | None: unpartitioned
    job: str  # the named job a run of the stage belongs to (what `stage2 build` and a rebuild launch)
    max_parallel: int | None = None  # at most this many partitions at once in its run (None: the build's)
    beside: bool = False  # runs beside the main line (`stage2 build`: in a process of its own)

    @property
    def after(self) -> tuple[str, ...]:
        """The stages that must be over before it starts (by name, in table order): those holding
        an asset that one of its assets reads (``READS``)."""
        reads = {r for a in self.assets for r in READS[a]} - set(self.assets)
        return tuple(s.name for s in STAGES if reads & set(s.assets))


PROFILE = Stage("profile", "profile", (PINNED_PROFILE,), None, PROFILE_JOB)
ACQUIRE = Stage("acquire", "download+verify archives", (ARCHIVE_FILE,), BY_CACHE_KEY, ACQUIRE_JOB)
# the action sidecars need the kit only: unpacked beside the downloads and the extraction
KIT = Stage("kit", "unpack+check sidecars", (ACTION_SIDECARS,), None, KIT_JOB, beside=True)
EXTRACT = Stage(
    "extract",
    "extract cache dirs",
    (CACHE_DIR,),
    BY_CACHE_KEY,
    EXTRACT_JOB,
    max_parallel=2,
)
STORE = Stage(
    "store",
    "join, bytes, store",
    (EXTRACTION_REPORT, TRAJECTORY_JOIN, SUBSET_CHECKSUMS, VIN_STORE),
    None,
    KIT_AND_STORE_JOB,
)
STAGES: tuple[Stage, ...] = (PROFILE, ACQUIRE, KIT, EXTRACT, STORE)  # every stage after those it needs
# A launched build streams these stages: one run of STREAM_JOB per range of cache keys
# (``stream_groups``: their archives, then their extraction, as the asset graph orders them), several
# runs at once, so that one range's extraction goes on while the next ranges download. Run one after another (in process, or at
# --concurrency 1), the stages run as the table says: one run each, over every cache key.
STREAMED: tuple[Stage, ...] = (ACQUIRE, EXTRACT)
# The archive bytes a streamed run carries at least (its cache keys, largest first; the last run may
# carry less): a launched run costs seconds of start-up and a few CPU seconds whatever it carries,
# so cache keys smaller than this share a run (the demo's 11 MB: one run), and a key of the real
# profile (gigabytes) has one of its own. ``STAGE2_STREAM_RUN_MB`` sets it (stream_groups).
STREAM_RUN_BYTES = 1 << 30
REBUILD_FIRST_STAGE = PROFILE  # where a scheduled rebuild starts: the same stages as `stage2 build`

# The asset selection of every job: one job per stage (a run of `stage2 build` and of a rebuild is a
# run of its stage's whole job, launched through the instance as the UI launches it). The verify job materializes nothing: it runs the standalone checks
# (checks.STANDALONE_CHECKS) over what is on disk, so a verify leaves every asset as it was.
JOB_ASSETS: dict[str, tuple[str, ...]] = {
    PROFILE_JOB: PROFILE.assets,
    ACQUIRE_JOB: ACQUIRE.assets,
    KIT_JOB: KIT.assets,
    EXTRACT_JOB: EXTRACT.assets,
    KIT_AND_STORE_JOB: STORE.assets,
    VERIFY_JOB: (),
    STREAM_JOB: tuple(a for s in STREAMED for a in s.assets),
}


def stage(name: str) -> Stage:
    """The stage called ``name``."""
    for s in STAGES:
        if s.name == name:
            return s
    raise ValueError(f"unknown stage {name!r}; expected one of {', '.join(s.name for s in STAGES)}")


def stages_after(current: Stage) -> list[Stage]:
    """The stages that need ``current`` (in table order); none after the last."""
    return [s for s in STAGES if current.name in s.after]


def ready_stages(over: Iterable[str], started: Iterable[str] = ()) -> list[Stage]:
    """The stages not ``started`` whose needs are all ``over`` (names), in table order."""
    done, begun = set(over), set(started)
    return [s for s in STAGES if s.name not in begun and set(s.after) <= done]


def needs(current: Stage) -> set[str]:
    """The names of every stage ``current`` needs, directly or through another."""
    by_name = {s.name: s for s in STAGES}
    out: set[str] = set()
    todo = list(current.after)
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo += by_name[name].after
    return out


def stage_of(selection: Sequence[str]) -> Stage:
    """The stage a run of ``selection`` belongs to: the stage holding all its assets, else the last."""
    return next((s for s in STAGES if set(selection) <= set(s.assets)), STAGES[-1])


def stage_partitions(
    current: Stage, profile: Profile, failed: Iterable[tuple[Stage, str | None]] = ()
) -> list[str | None]:
    """The partitions of ``current`` that may run (None: the one run of an unpartitioned stage), in
    the order to run them: largest first, so that the stage ends soonest. ``failed`` lists the
    (stage, partition) of every failed run so far; only the failures of the stages ``current`` needs
    count: an unpartitioned stage runs only when none of them failed; a partitioned one leaves out
    what depends on a failure: everything, after a failed unpartitioned stage; a cache key, when it
    failed in a stage ``current`` needs (its archives)."""
    upstream = needs(current)
    failed = [(s, p) for s, p in failed if s.name in upstream]
    if current.partitioned_by is None:
        return [] if failed else [None]
    if any(s.partitioned_by is None for s, _ in failed):
        return []
    failed_keys = {p for s, p in failed if s.partitioned_by == BY_CACHE_KEY}
    return [k for k in profile.cache_keys_largest_first() if k not in failed_keys]


def stream_groups(
    profile: Profile, keys: Sequence[str], min_bytes: int = STREAM_RUN_BYTES
) -> list[list[str]]:
    """``keys`` as the cache keys of each streamed run, the run with the most archive bytes first.
    A run's keys are a whole range of the partitions (consecutive in ``profile.cache_keys()``): in a
    run over part of a range an asset after the first cannot run (``assets._common``). Each run
    takes the next keys in that order until its archives hold at least ``min_bytes``, and ends
    before a key not in ``keys`` (one left out: its upstream failed)."""
    by_key = profile.archives_by_cache_key()
    wanted = set(keys)

    def size(group: list[str]) -> int:
        return sum(a.size or 0 for k in group for a in by_key[k])

    groups: list[list[str]] = [[]]
    for key in profile.cache_keys():
        if key not in wanted or size(groups[-1]) >= min_bytes:
            groups.append([])
        if key in wanted:
            groups[-1].append(key)
    return sorted((g for g in groups if g), key=lambda g: (-size(g), g[0]))
