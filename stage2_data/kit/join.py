"""The join: pairs, action manifests, processed_dataset rows, frame files and sidecars joined by
trajectory id (never by row order) into ``tables/trajectory_join.parquet``."""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .. import layout
from ..errors import InputsChangedError, KitError, Stage2Error
from ..formats import FormatError
from ..formats import arrow as farrow
from ..formats.sha256sums import format_sha256sums, read_single_sha256_file
from ..profile import Profile
from ..publish import UMASK_MODE, atomic_write_bytes
from .listing import file_sizes, list_files, sidecar_dirs
from .manifests import RECOVERED, ActionRow, PairRow, load_action_manifests, load_pairs
from .problems import missing_frames_problem, unnamed_sidecar_problem
from .sidecar_facts import _SidecarInfo, sidecar_infos

__all__ = ["JOIN_SCHEMA", "PROCESSED_COLUMNS", "JoinResult", "build_join_table", "read_join_rows"]

# The processed_dataset columns the join reads (a cache directory without one of them is a problem).
PROCESSED_COLUMNS = (
    "id",
    "task",
    "data_source",
    "is_robot",
    "quality_label",
    "partial_success",
    "num_frames",
)

JOIN_SCHEMA = pa.schema(
    [
        ("stage2_trajectory_id", pa.string()),
        ("cache_key", pa.string()),
        ("source", pa.string()),
        ("data_source", pa.string()),
        ("frames_path", pa.string()),
        ("frames_present", pa.bool_()),
        ("frames_bytes", pa.int64()),
        ("in_pairs", pa.bool_()),
        ("split", pa.string()),
        ("pair_count", pa.int64()),
        ("task", pa.string()),
        ("quality_label", pa.string()),
        ("partial_success", pa.float32()),
        ("is_robot", pa.bool_()),
        ("num_frames", pa.int64()),
        ("in_processed_dataset", pa.bool_()),
        ("action_source", pa.string()),
        ("action_status", pa.string()),
        ("sidecar_path", pa.string()),
        ("sidecar_present", pa.bool_()),
        ("sidecar_bytes", pa.int64()),
        ("sidecar_sha256", pa.string()),
        ("sidecar_sha256_ok", pa.bool_()),
        ("raw_width", pa.int64()),
        ("metadata_raw_width", pa.int64()),
        ("expected_width", pa.int64()),
        ("aligned_length", pa.int64()),
        ("width_ok", pa.bool_()),
        ("length_ok", pa.bool_()),
    ]
)


@dataclass
class JoinResult:
    table_path: Path
    rows: int
    problems: list[str]
    counts: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "table_path": str(self.table_path),
            "rows": self.rows,
            "problems": list(self.problems),
            "counts": self.counts,
        }


def _write_parquet_atomic(table: pa.Table, path: Path, sha256_path: Path) -> None:
    """Write the table atomically, then its sha256 to ``sha256_path``, each unless it already holds
    exactly these bytes (a rebuild of unchanged inputs leaves the files, and their mtimes, alone).
    The digest goes last: a table without its digest is never read (:func:`read_join_rows`)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", write_statistics=True)
    data = sink.getvalue().to_pybytes()
    line = format_sha256sums([(hashlib.sha256(data).hexdigest(), path.name)]).encode()
    for out, content in ((path, data), (sha256_path, line)):
        try:
            if out.stat().st_size == len(content) and out.read_bytes() == content:
                continue
        except OSError:
            pass
        atomic_write_bytes(out, content, mode=UMASK_MODE)


def read_join_rows(data_root: Path) -> list[dict[str, Any]]:
    """The join table's rows, parsed from the very bytes hashed against the sha256 the join wrote
    beside the table (read once: a table edited or replaced since the join, even within the same
    build, is refused, never read). Raises KitError naming the table and the fix."""
    path = layout.join_table_path(data_root)
    sums = layout.join_sha256_path(data_root)
    fix = "run `stage2 build` again: its store stage joins again and writes the table and its sha256 anew"
    try:
        expected, _ = read_single_sha256_file(sums)
        data = path.read_bytes()
    except (OSError, Stage2Error) as e:
        raise KitError(
            "the trajectory join table", [f"cannot be checked before it is read ({e})"], fix=fix
        ) from None
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise KitError(
            "the trajectory join table changed since the join wrote it",
            [f"{path}: sha256 {got}, not the {expected} the join recorded in {sums}"],
            fix=fix,
        )
    return list(pq.read_table(pa.BufferReader(data)).to_pylist())


def _where(derived_s: str, ar: ActionRow, tid: str) -> str:
    """A sidecar's problems name it so (made only for a problem)."""
    return f"{derived_s}/{ar.sidecar_path} (trajectory {tid}, {ar.where})"


def _first_action_rows(rows: Sequence[ActionRow]) -> dict[str, ActionRow]:
    out: dict[str, ActionRow] = {}
    for r in rows:
        out.setdefault(r.stage2_trajectory_id, r)
    return out


def _load_kit(profile: Profile) -> tuple[Path, list[PairRow], list[ActionRow], list[str]]:
    pairs_path = profile.kit_file("pair_manifest")
    pairs, p1 = load_pairs(pairs_path)
    actions, p2 = load_action_manifests(profile.kit_file("action_manifest_dir"))
    return pairs_path, pairs, actions, p1 + p2


@dataclass
class _PairFacts:
    pair_count: Counter[str] = field(default_factory=Counter)
    split_of: dict[str, str] = field(default_factory=dict)
    task_of: dict[str, str] = field(default_factory=dict)
    frames_of: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> (frames path, first line)


def _pair_facts(pairs: Sequence[PairRow]) -> _PairFacts:
    f = _PairFacts()
    for row in pairs:
        chosen, rejected = row.trajectories()
        for tid, fpath in (chosen, rejected) if chosen[0] != rejected[0] else (chosen,):
            f.pair_count[tid] += 1
            if row.split in layout.SPLITS:
                f.split_of.setdefault(tid, row.split)
            f.task_of.setdefault(tid, row.task)
            f.frames_of.setdefault(tid, (fpath, row.line))
    return f


@dataclass
class _ProcessedFacts:
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> processed_dataset columns
    frames_bytes: dict[str, int] = field(default_factory=dict)  # id -> size of its frames file


def _processed_facts(
    data_root: Path,
    ids_by_ck: dict[str, list[str]],
    named_at: Callable[[str], str],
    problems: list[str],
    recorded: Mapping[str, Mapping[str, str]] | None,
) -> _ProcessedFacts:
    """processed_dataset rows (by id) and frame-file sizes of the trajectories each cache dir must
    hold. ``recorded``: by cache key, the sha256 of every file its extraction record holds (by path
    in the cache directory); the Arrow files of those cache directories are parsed from bytes hashed
    as read and held to it: InputsChangedError naming each file that differs (edited since its
    check, even within the same build). A cache directory without a record there (one the profile
    does not list, named by action rows only) is read as found: no row of it reaches a store."""
    out = _ProcessedFacts()
    changed: list[str] = []
    for ck in sorted(ids_by_ck):
        cdir = layout.cache_dir(data_root, ck)
        pdir = cdir / farrow.PROCESSED_SUBDIR
        wanted = ids_by_ck[ck]
        if not cdir.is_dir():
            problems.append(
                f"cache directory {cdir} is absent ({len(wanted)} trajectories named by the kit, "
                f"e.g. {wanted[0]} at {named_at(wanted[0])})"
            )
            continue
        held_to = recorded.get(ck) if recorded is not None else None
        read_as: dict[str, str] | None = {} if held_to is not None else None
        try:
            table: pa.Table | None = farrow.read_processed_table(
                cdir, PROCESSED_COLUMNS, missing="drop", sha256_into=read_as
            )
        except FormatError as e:
            problems.append(str(e))
            table = None
        for rel, got in sorted((read_as or {}).items()):
            holds = (held_to or {}).get(rel)
            if got != holds:
                held = (
                    f"not the {holds} its extraction record holds"
                    if holds
                    else "its extraction record has no sha256 of it"
                )
                changed.append(f"{cdir / rel}: sha256 {got}, {held}")
        if table is not None and "id" not in table.column_names:
            problems.append(f"{pdir}: has no 'id' column")
        elif table is not None:
            pcols = {c: table.column(c).to_pylist() for c in table.column_names if c != "id"}
            problems.extend(
                f"{pdir}: has no {c!r} column" for c in PROCESSED_COLUMNS if c != "id" and c not in pcols
            )
            want = set(wanted)
            row_of: dict[str, int] = {}
            for i, rid in enumerate(table.column("id").to_pylist()):
                if rid not in want:
                    continue
                if rid in row_of:
                    problems.append(f"{pdir}: duplicate id {rid} (rows {row_of[rid]} and {i})")
                    continue
                row_of[rid] = i
            for tid in wanted:
                i = row_of.get(tid, -1)
                if i < 0:
                    problems.append(f"trajectory {tid} (named at {named_at(tid)}) is not a row of {pdir}")
                else:
                    out.meta[tid] = {c: v[i] for c, v in pcols.items()}
        fdir = cdir / layout.FRAMES_SUBDIR
        names = list_files(fdir) or set()
        by_name = {f"trajectory_{t}.npz": t for t in wanted}
        for name, size in file_sizes(fdir, [n for n in by_name if n in names]).items():
            out.frames_bytes[by_name[name]] = size
    if changed:
        raise InputsChangedError(
            "the join: what it read changed since it was checked",
            changed,
            fix="run `stage2 build` again: its extract stage checks those folders and extracts again "
            "what changed (an edited file is moved aside, not deleted)",
        )
    return out


def _expected_widths(
    profile: Profile, widths_seen: dict[str, Counter[int]]
) -> tuple[dict[str, int], dict[str, str]]:
    """Per source: the profile's ``expected.action_width_by_source``, else the majority width (ties
    go to the smaller width) of that source's sidecars."""
    pinned = profile.expected.action_width_by_source
    expected: dict[str, int] = {}
    basis: dict[str, str] = {}
    for source in sorted(set(widths_seen) | set(pinned)):
        if source in pinned:
            expected[source] = pinned[source]
            basis[source] = "profile expected.action_width_by_source"
        elif widths_seen[source]:
            expected[source] = min(widths_seen[source].items(), key=lambda kv: (-kv[1], kv[0]))[0]
            basis[source] = "majority of the source's sidecars"
    return expected, basis


def build_join_table(
    profile: Profile,
    data_root: Path,
    *,
    check_sidecar_sha256: bool = True,
    workers: int | None = None,
    processed_sha256: Mapping[str, Mapping[str, str]] | None = None,
) -> JoinResult:
    """Join pairs, action manifests, processed_dataset rows, frame files and sidecars by trajectory
    id; write ``tables/trajectory_join.parquet`` atomically (sorted by id) and return the problems
    found (gathered, not raised). ``processed_sha256`` (by cache key, the sha256 of each file its
    extraction record holds): those processed_dataset files are held to it as read
    (InputsChangedError). A pair whose frames are in a cache directory the profile does not list is
    a problem: its bytes are pinned, extracted and checked by nothing this profile builds."""
    data_root = Path(data_root)
    pairs_path, pairs, actions, problems = _load_kit(profile)
    derived = layout.derived_root(data_root)
    derived_s = str(derived)
    pf = _pair_facts(pairs)
    action_of = _first_action_rows(actions)
    ids = sorted(set(pf.pair_count) | set(action_of))

    def named_at(tid: str) -> str:
        fr = pf.frames_of.get(tid)
        if fr is not None:
            return f"{pairs_path}:{fr[1]}"
        ar = action_of.get(tid)
        return ar.where if ar is not None else "?"

    # --- cache key of each trajectory: the pair's frames path, else the action row's ------------
    cache_key_of: dict[str, str | None] = {}
    ids_by_ck: dict[str, list[str]] = defaultdict(list)
    for tid in ids:
        ck: str | None = None
        fr = pf.frames_of.get(tid)
        if fr is not None:
            m = layout.FRAMES_PATH_RE.match(fr[0])
            ck = m.group("cache_key") if m else None
        ar = action_of.get(tid)
        if ar is not None:
            if ck is not None and ar.cache_key != ck:
                problems.append(
                    f"{ar.where}: trajectory {tid}: cache_key {ar.cache_key!r} differs from the pair "
                    f"manifest's {ck!r} ({named_at(tid)})"
                )
            elif ck is None:
                ck = ar.cache_key
        cache_key_of[tid] = ck
        if ck is not None:
            ids_by_ck[ck].append(tid)

    listed = set(profile.cache_keys())
    for tid in sorted(pf.pair_count):
        ck = cache_key_of.get(tid)
        if ck is not None and ck not in listed:
            problems.append(
                f"trajectory {tid} (named at {named_at(tid)}) is in cache directory {ck!r}, which the "
                f"profile {profile.profile_path or profile.name} does not list: add its archive to the "
                "profile's [[archives]] (`stage2 pin` fills its size and sha256), or remove the pair "
                "rows that use it from the kit"
            )
    proc = _processed_facts(data_root, ids_by_ck, named_at, problems, processed_sha256)

    # pair frames files missing (once per trajectory, at its first line)
    for tid, (fpath, line) in sorted(pf.frames_of.items(), key=lambda kv: (kv[1][1], kv[0])):
        if layout.FRAMES_PATH_RE.match(fpath) and tid not in proc.frames_bytes:
            problems.append(missing_frames_problem(pairs_path, line, fpath, tid, data_root))

    # --- sidecars: on disk vs named; then read the present ones -------------------------------
    on_disk = {
        f"{layout.SIDECARS_DIR}/{source}/{name}"
        for source, names in sidecar_dirs(derived).items()
        for name in names
    }
    named = {ar.sidecar_path for ar in actions if ar.sidecar_path is not None}
    to_read: list[str] = []
    for tid in ids:
        ar = action_of.get(tid)
        if ar is None or ar.sidecar_path is None:
            continue
        if ar.sidecar_path in on_disk:
            to_read.append(tid)
        elif ar.status == RECOVERED:
            problems.append(
                f"{ar.where}: trajectory {tid} is {RECOVERED!r} but its sidecar "
                f"{derived_s}/{ar.sidecar_path} is missing"
            )
    problems.extend(unnamed_sidecar_problem(derived, rel) for rel in sorted(on_disk - named))
    # what the unpack read in each sidecar as it wrote it, for files it still describes; the rest read
    read = sidecar_infos(
        derived, [str(action_of[t].sidecar_path) for t in to_read], check_sidecar_sha256, workers
    )
    infos = dict(zip(to_read, read, strict=True))
    widths_seen: dict[str, Counter[int]] = defaultdict(Counter)
    for tid, si in infos.items():
        problems.extend(si.problems)
        if si.raw_width is not None:
            widths_seen[action_of[tid].source][si.raw_width] += 1
    expected_width, width_basis = _expected_widths(profile, widths_seen)

    # --- assemble rows -------------------------------------------------------------------------
    rows: list[tuple[Any, ...]] = []  # one per id, in JOIN_SCHEMA order
    no_info = _SidecarInfo()
    for tid in ids:
        ck = cache_key_of[tid]
        md = proc.meta.get(tid, {})
        ar = action_of.get(tid)
        info = infos.get(tid)
        inf = info or no_info
        fr = pf.frames_of.get(tid)
        num_frames = md.get("num_frames")
        sha_ok: bool | None = None
        width_ok: bool | None = None
        length_ok: bool | None = None
        exp_w: int | None = None
        if ar is not None:
            exp_w = expected_width.get(ar.source)
            if info is not None and check_sidecar_sha256 and info.sha256 is not None:
                sha_ok = info.sha256 == ar.sidecar_sha256
                if not sha_ok:
                    problems.append(
                        f"{ar.where}: trajectory {tid}: sidecar {derived_s}/{ar.sidecar_path} has sha256 "
                        f"{info.sha256}, the manifest says {ar.sidecar_sha256}"
                    )
            raw_w = inf.raw_width
            if raw_w is not None:
                width_ok = True
                if exp_w is not None and raw_w != exp_w:
                    width_ok = False
                    problems.append(
                        f"{_where(derived_s, ar, tid)}: raw action width {raw_w} contradicts source {ar.source!r} width {exp_w} "
                        f"({width_basis.get(ar.source, '')})"
                    )
                if inf.metadata_raw_width is not None and inf.metadata_raw_width != raw_w:
                    width_ok = False
                    problems.append(
                        f"{_where(derived_s, ar, tid)}: metadata_json raw_width {inf.metadata_raw_width} but raw_actions width {raw_w}"
                    )
                if inf.aligned_width is not None and inf.aligned_width != raw_w:
                    width_ok = False
                    problems.append(
                        f"{_where(derived_s, ar, tid)}: aligned_actions width {inf.aligned_width} but raw_actions width {raw_w}"
                    )
            if inf.aligned_length is not None and isinstance(num_frames, int):
                length_ok = inf.aligned_length == num_frames
                if not length_ok:
                    problems.append(
                        f"{_where(derived_s, ar, tid)}: aligned_actions has {inf.aligned_length} rows but the trajectory has "
                        f"num_frames {num_frames}"
                    )
        data_source = md.get("data_source")
        task = md.get("task")
        rows.append(
            (
                tid,  # stage2_trajectory_id
                ck,  # cache_key
                ar.source if ar is not None else data_source,  # source
                data_source,  # data_source
                fr[0] if fr is not None else (layout.frames_relpath(ck, tid) if ck else None),  # frames_path
                tid in proc.frames_bytes,  # frames_present
                proc.frames_bytes.get(tid),  # frames_bytes
                tid in pf.pair_count,  # in_pairs
                pf.split_of.get(tid),  # split
                pf.pair_count.get(tid, 0),  # pair_count
                task if task is not None else pf.task_of.get(tid),  # task
                md.get("quality_label"),  # quality_label
                md.get("partial_success"),  # partial_success
                md.get("is_robot"),  # is_robot
                num_frames,  # num_frames
                tid in proc.meta,  # in_processed_dataset
                ar.source if ar is not None else None,  # action_source
                ar.status if ar is not None else None,  # action_status
                ar.sidecar_path if ar is not None else None,  # sidecar_path
                (info is not None)
                if ar is not None and ar.sidecar_path is not None
                else None,  # sidecar_present
                inf.bytes,  # sidecar_bytes
                ar.sidecar_sha256 if ar is not None else None,  # sidecar_sha256
                sha_ok,  # sidecar_sha256_ok
                inf.raw_width,  # raw_width
                inf.metadata_raw_width,  # metadata_raw_width
                exp_w,  # expected_width
                inf.aligned_length,  # aligned_length
                width_ok,  # width_ok
                length_ok,  # length_ok
            )
        )
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in JOIN_SCHEMA]
    cols = {f.name: list(c) for f, c in zip(JOIN_SCHEMA, columns, strict=True)}
    try:
        table = pa.table(cols, schema=JOIN_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise KitError(
            "trajectory join",
            [f"a processed_dataset column has an unexpected type ({e})"],
            fix="check the processed_dataset schema of the cache directories against kit-format.md",
        ) from None
    out = layout.join_table_path(data_root)
    _write_parquet_atomic(table, out, layout.join_sha256_path(data_root))

    status_counts = Counter(ar.status for ar in action_of.values())
    counts: dict[str, Any] = {
        "rows": len(ids),
        "pair_rows": len(pairs),
        "in_pairs": len(pf.pair_count),
        "action_manifest_rows": len(actions),
        "with_action_row": len(action_of),
        "action_status": dict(sorted(status_counts.items())),
        "sidecars_named": sum(1 for a in action_of.values() if a.sidecar_path),
        "sidecars_present": len(infos),
        "sidecars_by_source": dict(sorted(Counter(action_of[t].source for t in infos).items())),
        "frames_present": len(proc.frames_bytes),
        "in_processed_dataset": len(proc.meta),
        "split": dict(sorted(Counter(pf.split_of.values()).items())),
        "expected_width_by_source": dict(sorted(expected_width.items())),
        "width_basis": dict(sorted(width_basis.items())),
        "sidecar_sha256_checked": check_sidecar_sha256,
        "problems": len(problems),
    }
    return JoinResult(table_path=out, rows=len(ids), problems=problems, counts=counts)
