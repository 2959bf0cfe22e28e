"""Whether a stage of a build has anything to do, by stats only, so that an orchestrator can skip the
whole run of a stage that is up to date (a run costs seconds of fixed cost even when every step
skips its work).

- ``acquire``: every archive has a ``.verified.json`` record matching its file (no request, no hash);
- ``extract``: every cache key passes :func:`~stage2_data.extract.check_extraction` (its record
  names the archives' verified sha256 and this extractor; one ``scandir`` walk matches it), and
  what its record says that the extract stage checks and the extraction report shows (counts,
  ``problems``, ...: :func:`reported_extraction`) is what the last successful store stage saw of
  it (``reports/extraction_records_seen.json``, removed when a check or a build fails): a record
  changed since (an edit), or any record after a failed build, is checked again by the extract
  stage, as a first build checks it, build after build;
- ``kit``: the sidecars' record names the kit's sidecar tar as it is now (``kit.sidecars_status``);
- ``store``: the fingerprint of the stage's inputs and outputs (:func:`store_stage_fingerprint`:
  the stats of every kit file (and of the file a link names) and of the profile, every extraction
  record's content (all but the file stats a check refreshes), the archive pins, the stats of
  ``processed_datasets/``, of the extraction report, of the sidecars' record and its index, the
  join table, the stores' folder, the ``current`` link and every file of the store it points at,
  the versions and the settings) equals the one recorded by :func:`record_store_stage` after the
  last successful store stage;
- ``profile`` writes nothing: it is up to date when the acquire and extract stages are and the
  profile and the kit are those the last successful store stage recorded (a store modified in
  place makes the store stage alone run).

Whatever the stats say, a stage whose check failed in any run since the last successful build
(``reports/failed_checks/<stage>.json``: :func:`record_failed_checks`) runs: its checks run again, so
that a cause since gone leaves no failed check in the UI behind a build that did nothing.

:func:`build_status` returns ``{stage: None | why it must run}``. Nothing here writes, except
:func:`record_store_stage` (and only when what it records changed), and the checks' refreshes: an
extracted file or a sidecar whose stats changed and whose bytes did not (hashed again) has its
record rewritten with its stats now (``extract.check_extraction``, ``kit.sidecars_status``).
Given ``held`` (a list: ``stage2 build --dry-run``), those refreshes are not written: their paths
are appended to it, and the answer is the one a build that writes them would give (a refreshed
sidecar index changes the store stage's inputs' stats: that stage would run).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .. import __version__, layout
from ..acquire import archive_state, source_origin, verified_sha256s
from ..errors import InputsChangedError
from ..extract import (
    EXTRACTOR_VERSION,
    ExtractionRecord,
    check_extraction,
    load_extraction_record,
    reported_extraction,
    write_json_if_changed,
)
from ..fsutil import canonical_json
from ..kit.sidecar_facts import SIDECAR_INDEX, SIDECAR_MARKER
from ..kit.sidecars import sidecars_status
from ..profile import Profile
from ..stages import ACQUIRE, EXTRACT, KIT, PROFILE, STAGES, STORE, Stage
from ..store import OFFLINE_DATASET_VERSION
from ..store.gate import tree_stats

STORE_STAGE_RECORD = "store_stage.json"
STORE_GATE_RECORD = "store_gate.json"
#: what the last successful store stage saw of each extraction record: the extract stage's reference
#: (removed when a check or a build fails: the extract stage then checks every record again)
RECORDS_SEEN_RECORD = "extraction_records_seen.json"


def store_stage_record_path(data_root: Path) -> Path:
    return layout.reports_dir(data_root) / STORE_STAGE_RECORD


#: under ``reports/``: one ``<stage>.json`` per stage whose check failed in a run (any run: the UI's,
#: a schedule's, a build's) since the last successful build
FAILED_CHECKS_DIR = "failed_checks"
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def failed_checks_path(data_root: Path, stage: str) -> Path:
    return layout.reports_dir(data_root) / FAILED_CHECKS_DIR / f"{stage}.json"


def record_failed_checks(data_root: Path, stage: str, checks: list[str], run_id: str | None = None) -> None:
    """A check of ``stage`` failed: the next build runs that stage (not a no-op by stats), so its
    checks run again and what the UI shows of them is this data as it is, not the failure of a run
    whose cause is gone (a pin corrected, a file restored). Kept until a build succeeds. Written
    while a check is being failed, so never an error of its own: on a data root this process
    cannot write, or a full disk (whose own error the failing step reports), nothing is written."""
    path = failed_checks_path(data_root, stage)
    record = {"stage": stage, "checks": sorted(set(checks)), "run_id": run_id}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, sort_keys=True) + "\n", encoding="utf-8")


def failed_checks_status(data_root: Path, stage: str) -> str | None:
    """Why ``stage`` must run because a check of it failed since the last successful build, or None."""
    path = failed_checks_path(data_root, stage)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        record = {}
    checks = record.get("checks") if isinstance(record, dict) else None
    run_id = record.get("run_id") if isinstance(record, dict) else None
    named = ", ".join(str(c) for c in checks) if isinstance(checks, list) and checks else "a check"
    where = f" in run {str(run_id)[:8]}" if run_id else ""
    return f"{named} failed{where} since the last successful build: its checks run again"


def clear_failed_checks(data_root: Path) -> None:
    """A build succeeded: every stage's checks passed on this data (or were up to date)."""
    folder = layout.reports_dir(data_root) / FAILED_CHECKS_DIR
    for stage in STAGES:
        try:
            (folder / f"{stage.name}.json").unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in _READ_ONLY:
                raise


def _stat(p: Path) -> list[int | None] | None:
    """(inode, size, mtime_ns, ctime_ns) of ``p`` itself; for a symbolic link (a kit file may be
    one), then those of the file it names, or None where it names nothing: a link's own stats say
    nothing of the file read through it, which can be edited while the link stays the same."""
    try:
        st = os.lstat(p)
    except OSError:
        return None
    out: list[int | None] = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    if stat.S_ISLNK(st.st_mode):
        try:
            t = os.stat(p)
        except OSError:
            out.append(None)
        else:
            out += [t.st_ino, t.st_size, t.st_mtime_ns, t.st_ctime_ns]
    return out


def acquire_status(profile: Profile, data_root: Path) -> str | None:
    """None when every archive is verified, from the profile's source (repo and revision): a
    record of another source is confirmed with the hub by the acquire stage."""
    origin = source_origin(profile.source)
    states = [archive_state(data_root, a) for a in profile.archives]
    todo = [s.path for s in states if s.state != "verified" or s.origin != origin]
    if not todo:
        return None
    return f"{len(todo)} archive(s) to download or verify ({todo[0]}{', ...' if len(todo) > 1 else ''})"


def records_seen_path(data_root: Path) -> Path:
    return layout.reports_dir(data_root) / RECORDS_SEEN_RECORD


def _records_seen(data_root: Path) -> dict[str, Any] | None:
    """What the last successful store stage saw of each extraction record
    (:func:`reported_extraction`, by cache key); None when no store stage recorded it yet."""
    try:
        doc = json.loads(records_seen_path(data_root).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _changed_since_seen(rec: ExtractionRecord, seen: dict[str, Any] | None, data_root: Path) -> str | None:
    """Why the extract stage must check the extraction record ``rec`` again: what it says is not
    what the last successful build saw of it (it was edited, or written by an extraction whose build
    did not succeed; ``seen`` None: the last build failed, or none recorded it yet); None when it is
    the same."""
    record = layout.extraction_record_path(data_root, rec.cache_key)
    if seen is None:
        return f"its extraction record {record} is checked again (no successful build since it was seen)"
    was = seen.get(rec.cache_key)
    if not isinstance(was, dict):
        return f"its extraction record {record} was not seen by a successful build yet"
    says = reported_extraction(rec)
    differ = sorted(k for k in says if says[k] != was.get(k))
    if differ:
        k = differ[0]
        return (
            f"its extraction record {record} says {k} {says[k]!r}, the last successful build saw "
            f"{was.get(k)!r}: checked again"
        )
    return None


def extract_status(profile: Profile, data_root: Path, *, held: list[Path] | None = None) -> str | None:
    """None when every cache key passes :func:`~stage2_data.extract.check_extraction` and its
    record says what the last successful store stage saw of it (:func:`reported_extraction`), else
    why the extract stage must run (it checks the record's counts and problems again)."""
    seen = _records_seen(data_root)
    for key in profile.cache_keys():
        rec, reason = check_extraction(data_root, key, verified_sha256s(profile, data_root, key), held=held)
        if reason is None and rec is not None:
            reason = _changed_since_seen(rec, seen, data_root)
        if reason is not None:
            return f"cache_dir[{key}]: {reason}"
    return None


def require_inputs_as_recorded(profile: Profile, data_root: Path, reader: str) -> dict[str, ExtractionRecord]:
    """Raise :class:`InputsChangedError` unless every extracted file and every unpacked sidecar is
    what its record says, checked now, right before ``reader`` (the join, the store writer) reads
    them: by stats, and a file whose stats changed (an edit keeps size and mtime, never ctime) by
    its sha256. A file edited after the extract stage checked it would otherwise reach the store
    under the name its record's digest gives, and every later build would reuse that store.
    Returns the extraction records checked, by cache key (what the reader then holds its reads to)."""
    problems = []
    records: dict[str, ExtractionRecord] = {}
    for key in profile.cache_keys():
        rec = load_extraction_record(data_root, key)
        if rec is None:
            problems.append(f"cache_dir[{key}]: not extracted (no readable extraction record)")
            continue
        records[key] = rec
        if rec.invalidated:  # the subset byte check marked it: that check fails, and fails the build
            continue
        # the files against their record (which archives made it is the acquire and extract
        # stages' to check, not the readers')
        checked, reason = check_extraction(data_root, key, rec.archive_sha256)
        if reason is not None:
            problems.append(f"cache_dir[{key}]: {reason}")
        elif checked is not None:
            records[key] = checked
    sidecars = sidecars_status(profile, data_root)
    if sidecars is not None:
        problems.append(f"action sidecars: {sidecars}")
    if problems:
        raise InputsChangedError(
            f"{reader}: what it reads changed since it was checked",
            problems,
            fix="run `stage2 build` again: its extract stage and the unpack check those folders and "
            "extract or unpack again what changed (an edited file is moved aside, not deleted)",
        )
    return records


def recorded_sha256(records: Mapping[str, ExtractionRecord]) -> dict[str, str]:
    """Every extracted file's sha256 as its cache directory's extraction record (``records``, by
    cache key) holds it, by its path under the data root (``processed_datasets/<key>/...``, as the
    join names frames files): what a reader holds the bytes it reads to."""
    out: dict[str, str] = {}
    for key, rec in records.items():
        prefix = f"{layout.PROCESSED_DIR}/{key}"
        for rel, entry in rec.entries.items():
            if entry and isinstance(entry[0], str):
                out[f"{prefix}/{rel}"] = entry[0]
    return out


def published_store_stats(link: Path) -> dict[str, list[int]] | None:
    """(inode, size, mtime_ns, ctime_ns) of every entry under the store ``link`` points at, by
    relative path (one walk, no file read; :func:`~stage2_data.store.gate.tree_stats`): a store
    modified in place (a byte flipped in a shard, the manifest edited, a file deleted; ctime: even
    with its mtime set back) changes it. None when nothing is published there."""
    try:
        target = link.resolve(strict=True)
    except OSError:
        return None
    return tree_stats(target)


def gate_record_path(data_root: Path) -> Path:
    return layout.reports_dir(data_root) / STORE_GATE_RECORD


def write_gate_record(
    data_root: Path, profile_name: str, store_name: str, stats: dict[str, list[int]] | None
) -> None:
    """After a store passed the publication gate and was published: which store, and the stats of
    every entry the gate checked (what a no-op rebuild compares; docs/spec/vin-store.md)."""
    write_json_if_changed(
        gate_record_path(data_root), {"profile": profile_name, "store": store_name, "stats": stats}
    )


def clear_store_records(data_root: Path) -> None:
    """A failed check or build: remove the records that would let a later build skip the store stage,
    or an extraction record's check (what a successful build saw of them: a record edited before
    this failure is checked again, build after build, until a build succeeds). On a data root this
    process cannot write (a read-only mount the verify job checks) nothing is cleared: the check
    still fails, and the host that writes it finds the change by the entries' stats (a changed
    byte changes a file's ctime), as every later build does."""
    for p in (gate_record_path(data_root), store_stage_record_path(data_root), records_seen_path(data_root)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise


def gate_status(profile: Profile, data_root: Path) -> str | None:
    """None when the published store is the one the last passed publication gate checked, with the
    same (inode, size, mtime, ctime) for every entry; else why the gate must run again."""
    link = layout.current_store_path(data_root, profile.name)
    try:
        rec = json.loads(gate_record_path(data_root).read_text(encoding="utf-8"))
        name = os.readlink(link)
    except (OSError, ValueError):
        return "no record of the publication gate for the published store"
    if not isinstance(rec, dict) or rec.get("profile") != profile.name or rec.get("store") != name:
        return "the published store is not the one the publication gate last passed"
    if rec.get("stats") != published_store_stats(link):
        return "a file of the published store changed since it passed the publication gate"
    return None


def _kit_stats(profile: Profile) -> dict[str, Any]:
    """The stats (:func:`_stat`) of every kit file, by kit key; the action manifests' by file name."""
    kit: dict[str, Any] = {}
    for key in ("pair_manifest", "subset_checksums", "sidecar_archive", "sidecar_archive_sha256"):
        kit[key] = _stat(profile.kit_file(key))
    adir = profile.kit_file("action_manifest_dir")
    kit["action_manifests"] = (
        {f.name: _stat(f) for f in layout.action_manifest_paths(adir)} if adir.is_dir() else None
    )
    return kit


#: how long a kit file's newest ctime is let age before a step reads the kit (:func:`kit_held`):
#: a second, the coarsest clock a file system here may keep timestamps with
KIT_SETTLE_NS = 1_000_000_000


@contextlib.contextmanager
def kit_held(profile: Profile, reader: str) -> Iterator[None]:
    """Raise :class:`InputsChangedError` at the end of the block when any kit file (or the action
    manifest folder's list of files) changed during it. ``reader`` (the join, the byte check, the
    store writer) hashes the kit's files inside the block and parses them in separate reads: what it
    records or writes must come from the bytes it hashed, and an edit in between (kept or undone
    before the block ends) changes a file's ctime, which nothing can keep (a ``chmod`` changes it
    too: refused all the same, a rerun costs less than a store built from bytes no step hashed).
    Other files in the action manifest folder are not the kit's and are not watched. Before the
    block the newest of those ctimes is let age by a second (:data:`KIT_SETTLE_NS`), so that an
    edit right after gives a newer one even where timestamps count whole seconds."""
    adir = profile.kit_file("action_manifest_dir")
    before = _kit_stats(profile)
    # every ctime held: a file's own, and for a link the file it names (a :func:`_stat` list's 4th
    # and 8th entries)
    ctimes = [
        c
        for v in (*before.values(), *(before["action_manifests"] or {}).values())
        if isinstance(v, list)
        for c in v[3::4]
        if isinstance(c, int)
    ]
    wait = max(ctimes, default=0) + KIT_SETTLE_NS - time.time_ns()
    if wait > 0:  # a kit file changed within the last second: its next change must show
        time.sleep(min(wait, KIT_SETTLE_NS) / 1e9)
    yield
    after = _kit_stats(profile)
    if after == before:
        return
    changed = []
    for key in sorted(before.keys() | after.keys()):
        if key == "action_manifests":
            was, now = before[key] or {}, after[key] or {}
            changed += [
                f"{adir / name}: {'changed' if name in was and name in now else 'added or removed'} "
                f"while {reader} read it"
                for name in sorted(was | now)
                if was.get(name) != now.get(name)
            ]
        elif before.get(key) != after.get(key):
            changed.append(f"{profile.kit_file(key)}: changed while {reader} read it")
    raise InputsChangedError(
        f"{reader}: the kit changed while it was read",
        changed,
        fix="run `stage2 build` again once nothing edits the kit: what it read is not recorded as "
        "checked, nor written to a store",
    )


def store_stage_fingerprint(profile: Profile, data_root: Path, settings: dict[str, Any] | None = None) -> str:
    """sha256 of what the store stage reads and writes, by stats (no data file is read)."""
    return _fingerprints(profile, data_root, settings)[0]


def kit_fingerprint(profile: Profile) -> str:
    """sha256 of the profile and the kit (what the profile stage checks), by stats."""
    return _fingerprints(profile, None, None)[1]


def _fingerprints(
    profile: Profile, data_root: Path | None, settings: dict[str, Any] | None
) -> tuple[str, str]:
    """(the store stage's fingerprint (needs ``data_root``), the kit's)."""
    kit: dict[str, Any] = {"profile": _stat(profile.profile_path)} if profile.profile_path else {}
    kit.update(_kit_stats(profile))
    kit_blob = {
        "versions": [__version__, EXTRACTOR_VERSION, OFFLINE_DATASET_VERSION],
        "profile": profile.identity(),
        "pins": {a.path: [a.sha256, a.size] for a in profile.archives},
        "kit": kit,
    }
    kit_fp = hashlib.sha256(canonical_json(kit_blob).encode()).hexdigest()
    if data_root is None:
        return "", kit_fp
    records: dict[str, Any] = {}
    for key in profile.cache_keys():
        # what the record says, all of it but the file stats a check refreshes when a file's stats
        # change and its bytes do not (``entries``' stats, ``tree_digest``; every file's sha256 is
        # in ``content_digest``): its counts and ``problems`` are what a build reports and checks
        rec = load_extraction_record(data_root, key)
        records[key] = (
            None
            if rec is None
            else {k: v for k, v in rec.to_dict().items() if k not in ("entries", "tree_digest")}
        )
    derived = layout.derived_root(data_root)
    link = layout.current_store_path(data_root, profile.name)
    try:
        current: str | None = os.readlink(link)
    except OSError:
        current = None
    blob = {
        "versions": [__version__, EXTRACTOR_VERSION, OFFLINE_DATASET_VERSION],
        "settings": settings or {},
        "profile": profile.identity(),
        "pins": {a.path: [a.sha256, a.size] for a in profile.archives},
        "kit": kit,
        "extraction_records": records,
        "outputs": {
            # its entries' names: an entry that is not a cache key fails the extraction report
            "processed_datasets": _stat(layout.processed_root(data_root)),
            "extraction_report": _stat(layout.extraction_report_path(data_root)),
            "sidecar_marker": _stat(derived / SIDECAR_MARKER),
            # the unpack's index: the join trusts its facts for every sidecar still as written
            "sidecar_index": _stat(derived / SIDECAR_INDEX),
            "sidecars": _stat(derived / layout.SIDECARS_DIR),
            "join": _stat(layout.join_table_path(data_root)),
            "join_sha256": _stat(layout.join_sha256_path(data_root)),
            "stores": _stat(layout.stores_root(data_root, profile.name)),
            "current": [current, _stat(link)],
            "published": published_store_stats(link),
        },
    }
    return hashlib.sha256(canonical_json(blob).encode()).hexdigest(), kit_fp


def store_stage_home(data_root: Path) -> str | None:
    """The Dagster instance folder that recorded the runs of the last successful store stage (what
    a build with nothing to do names: its own instance may hold none), when it is still a folder."""
    try:
        home = json.loads(store_stage_record_path(data_root).read_text(encoding="utf-8")).get("dagster_home")
    except (OSError, ValueError, AttributeError):
        return None
    return home if isinstance(home, str) and os.path.isdir(home) else None


def store_status(profile: Profile, data_root: Path, settings: dict[str, Any] | None = None) -> str | None:
    path = store_stage_record_path(data_root)
    try:
        recorded = json.loads(path.read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return "no record of a successful store stage"
    if not (layout.current_store_path(data_root, profile.name) / "manifest.json").is_file():
        return "no store is published"
    gate = gate_status(profile, data_root)
    if gate is not None:
        return gate
    if recorded != store_stage_fingerprint(profile, data_root, settings):
        return "the kit, the extracted data or the stage's outputs changed since the last store stage"
    return None


def record_store_stage(
    profile: Profile,
    data_root: Path,
    settings: dict[str, Any] | None = None,
    *,
    kit_before: str | None = None,
    dagster_home: str | None = None,
) -> bool:
    """After a successful store stage: record its fingerprint, and what it saw of each extraction
    record (:func:`reported_extraction`: what ``extract_status`` compares); each written only when
    it changed (neither record is one of the stats the fingerprint covers). True when written.

    ``kit_before``: :func:`kit_fingerprint` taken before the stage started. When the profile or a
    kit file changed since (an edit while the stage ran, after its steps read them), what the stage
    built is not what the files now say: nothing is recorded and the store stage's records are
    removed, so that the next build runs it again, as it would after a failed check.
    ``dagster_home``: the instance that recorded the stage's runs (:func:`store_stage_home`)."""
    fingerprint, kit_fp = _fingerprints(profile, data_root, settings)
    if kit_before is not None and kit_fp != kit_before:
        clear_store_records(data_root)
        return False
    seen: dict[str, Any] = {}
    for key in profile.cache_keys():
        rec = load_extraction_record(data_root, key)
        seen[key] = None if rec is None else reported_extraction(rec)
    wrote_seen = write_json_if_changed(records_seen_path(data_root), seen)
    stage: dict[str, Any] = {"fingerprint": fingerprint, "kit": kit_fp}
    if dagster_home is not None:
        stage["dagster_home"] = dagster_home
    wrote = write_json_if_changed(store_stage_record_path(data_root), stage)
    return wrote or wrote_seen


def profile_status(profile: Profile, data_root: Path) -> str | None:
    """The profile stage (it writes nothing) is up to date when the profile and the kit are those of
    the last successful store stage (the store's own files may have changed: only the store runs)."""
    try:
        recorded = json.loads(store_stage_record_path(data_root).read_text(encoding="utf-8")).get("kit")
    except (OSError, ValueError, AttributeError):
        return "no record of a successful store stage"
    if recorded != kit_fingerprint(profile):
        return "the profile or the kit changed since the last store stage"
    return None


def _refreshed_inputs(data_root: Path, held: list[Path] | None) -> str | None:
    """Why the store stage runs when a check held (did not write) the refresh of a file whose stats
    its fingerprint covers (the sidecars' record or index: a build writes them before it compares
    the fingerprint, which then differs), else None. Without ``held``: None (written already)."""
    if not held:
        return None
    derived = layout.derived_root(data_root)
    covered = {derived / SIDECAR_MARKER, derived / SIDECAR_INDEX}
    refreshed = sorted({str(p) for p in held if p in covered})
    if not refreshed:
        return None
    return (
        f"the sidecars' check refreshes {', '.join(refreshed)} (a sidecar's stats changed, its bytes "
        "hashed again did not): the stage's inputs' stats change"
    )


def build_status(
    profile: Profile,
    data_root: Path,
    settings: dict[str, Any] | None = None,
    *,
    held: list[Path] | None = None,
) -> dict[str, str | None]:
    """``{stage name: None (up to date) | why it must run}`` for the five stages, in order. A stage
    after one that must run must run too (what it reads will change); the profile stage runs when
    the acquire, kit or extract stage does, or when the kit changed."""
    data_root = Path(data_root)

    def failed(stage: Stage) -> str | None:
        return failed_checks_status(data_root, stage.name)

    out: dict[str, str | None] = {ACQUIRE.name: acquire_status(profile, data_root) or failed(ACQUIRE)}
    out[KIT.name] = sidecars_status(profile, data_root, held=held) or failed(KIT)
    if out[ACQUIRE.name] is None:
        out[EXTRACT.name] = extract_status(profile, data_root, held=held) or failed(EXTRACT)
    else:
        out[EXTRACT.name] = "archives change"
    if out[EXTRACT.name] is not None:
        out[STORE.name] = "cache directories change"
    elif out[KIT.name] is not None:
        out[STORE.name] = "the action sidecars change"
    else:
        out[STORE.name] = (
            store_status(profile, data_root, settings) or _refreshed_inputs(data_root, held) or failed(STORE)
        )
    later = [v for v in (out[ACQUIRE.name], out[KIT.name], out[EXTRACT.name]) if v is not None]
    first = later[0] if later else (profile_status(profile, data_root) or failed(PROFILE))
    return {PROFILE.name: first, **{s.name: out[s.name] for s in STAGES if s.name in out}}
