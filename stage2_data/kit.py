"""The kit: sidecar unpacking, manifest parsing, the join by trajectory id, link check, byte check.

See shared/spec/kit-format.md. Everything here joins by trajectory id (``stage2_trajectory_id``),
never by row order. Validation gathers every problem (naming file, line and id) and returns them;
callers that want an exception use :func:`raise_for_problems`.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import struct
import tarfile
import threading
import time
import zipfile
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import layout
from .errors import ArchiveError, ChecksumMismatchError, KitError, ProblemsError, UnsafeArchiveError
from .fsutil import atomic_write_json, publish_dir, require_free_space, staging_dir
from .hashing import SHA256_RE, parse_sha256sums, read_single_sha256_file, sha256_file
from .profile import Profile

__all__ = [
    "PAIR_FIELDS",
    "ACTION_FIELDS",
    "RECOVERED",
    "SIDECAR_MARKER",
    "PairRow",
    "ActionRow",
    "SidecarUnpackResult",
    "JoinResult",
    "LinkReport",
    "ByteReport",
    "load_pairs",
    "load_action_manifests",
    "unpack_sidecars",
    "build_join_table",
    "link_check",
    "verify_subset_bytes",
    "raise_for_problems",
    "JOIN_SCHEMA",
]

PAIR_FIELDS = (
    "pair_id",
    "split",
    "task",
    "chosen_trajectory_id",
    "chosen_frames_path",
    "rejected_trajectory_id",
    "rejected_frames_path",
)
ACTION_REQUIRED = ("stage2_trajectory_id", "source", "cache_key", "status")
ACTION_OPTIONAL = ("sidecar_path", "sidecar_sha256")
ACTION_FIELDS = ACTION_REQUIRED + ACTION_OPTIONAL
RECOVERED = "recovered"
SIDECAR_MARKER = ".sidecars.json"
PROCESSED_SUBDIR = "processed_dataset"
PROCESSED_COLUMNS = (
    "id",
    "task",
    "data_source",
    "is_robot",
    "quality_label",
    "partial_success",
    "num_frames",
)
SIDECAR_KEYS = ("metadata_json", "raw_actions", "aligned_actions", "source_indices", "alignment_indices")
_SIDECAR_READ_LIMIT = 64 * 1024 * 1024


def raise_for_problems(problems: Sequence[str], what: str, *, fix: str | None = None) -> None:
    """Raise a :class:`KitError` listing every problem, if there is any."""
    if problems:
        raise KitError(
            what,
            problems,
            fix=fix or "correct the named kit file lines / data-root files, then run the step again",
        )


# ----------------------------------------------------------------------------------------------
# Manifests
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PairRow:
    pair_id: str
    split: str
    task: str
    chosen_trajectory_id: str
    chosen_frames_path: str
    rejected_trajectory_id: str
    rejected_frames_path: str
    line: int

    def trajectories(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """((chosen id, chosen frames path), (rejected id, rejected frames path))."""
        return (
            (self.chosen_trajectory_id, self.chosen_frames_path),
            (self.rejected_trajectory_id, self.rejected_frames_path),
        )


@dataclass(frozen=True)
class ActionRow:
    stage2_trajectory_id: str
    source: str
    cache_key: str
    status: str
    sidecar_path: str | None
    sidecar_sha256: str | None
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


_DECODER = json.JSONDecoder()


def _iter_json_lines(path: Path, problems: list[str]) -> Iterable[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; malformed lines become problems."""
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            text = raw.strip()
            if not text:
                continue
            try:
                obj, end = _DECODER.raw_decode(text)
                if end != len(text):
                    raise json.JSONDecodeError("extra data after the JSON value", text, end)
            except json.JSONDecodeError as e:
                problems.append(
                    f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno}): {text[:80]!r}"
                )
                continue
            if not isinstance(obj, dict):
                problems.append(f"{path}:{lineno}: expected a JSON object, found {type(obj).__name__}")
                continue
            yield lineno, obj


# Fast paths. A kit that is clean (the usual case) is decoded line by line by msgspec into typed
# structs (C-level type checks) and checked column by column; on the first anomaly of any kind they
# return None and the exact parsers below (stdlib json, every check, every message with its line
# number) run instead. So the rows and the problems reported are the same either way; only a clean
# kit is fast.
class _PairLine(msgspec.Struct, forbid_unknown_fields=True, gc=False):  # str fields only: no cycles
    pair_id: str
    split: str
    task: str
    chosen_trajectory_id: str
    chosen_frames_path: str
    rejected_trajectory_id: str
    rejected_frames_path: str


class _ActionLine(msgspec.Struct, gc=False):  # other fields are allowed (ignored), as by the exact parser
    stage2_trajectory_id: str
    source: str
    cache_key: str
    status: str
    sidecar_path: str | None = None
    sidecar_sha256: str | None = None


_PAIR_DECODER = msgspec.json.Decoder(_PairLine)
_ACTION_DECODER = msgspec.json.Decoder(_ActionLine)


def _decode_lines_fast(path: Path, decoder: msgspec.json.Decoder[Any]) -> list[Any] | None:
    """Every line decoded on its own (one JSON object per line, no blank line); else None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\r" in data:  # a CR is a line break for the exact parser: let it count the lines
        return None
    if not data.isascii():  # msgspec skips ignored fields unchecked: check the whole file's UTF-8
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    try:
        return list(map(decoder.decode, lines))
    except msgspec.DecodeError:  # malformed, missing field, wrong type (ValidationError included)
        return None


def _pairs_fast(path: Path) -> list[_PairLine] | None:
    """The pair manifest's rows when :func:`load_pairs` would find no problem at all; else None."""
    rows: list[_PairLine] | None = _decode_lines_fast(path, _PAIR_DECODER)
    if rows is None:
        return None
    match = layout.FRAMES_PATH_RE.match
    splits = layout.SPLITS
    pair_ids: set[str] = set()
    split_of: dict[str, str] = {}
    frames_of: dict[str, str] = {}
    for o in rows:
        pid, split = o.pair_id, o.split
        if not (pid and o.task and o.chosen_trajectory_id and o.rejected_trajectory_id):
            return None
        if pid in pair_ids or split not in splits:
            return None
        pair_ids.add(pid)
        for tid, fpath in (
            (o.chosen_trajectory_id, o.chosen_frames_path),
            (o.rejected_trajectory_id, o.rejected_frames_path),
        ):
            m = match(fpath)
            if m is None or m.group("id") != tid:
                return None
            if frames_of.setdefault(tid, fpath) != fpath or split_of.setdefault(tid, split) != split:
                return None
    return rows


_HEX_DIGITS = b"0123456789abcdef"


def _all_sha256(values: Sequence[str]) -> bool:
    """Every value is 64 lowercase hex (C-level passes over all values, not a regex per value)."""
    if not values:
        return True
    if set(map(len, values)) != {64}:
        return False
    try:
        joined = "".join(values).encode("ascii")
    except UnicodeEncodeError:
        return False
    return not joined.translate(None, _HEX_DIGITS)


class _FastActions(NamedTuple):
    file: str
    source: str  # the file's stem, which every row's source equals
    rows: list[_ActionLine]
    ids: list[str]
    statuses: list[str]


def _actions_fast(dir: Path) -> list[_FastActions] | None:
    """The action manifests (in file-name order) when :func:`load_action_manifests` would find no
    problem at all; else None. Checked column by column, with C-level loops."""
    try:
        files = sorted(p for p in dir.iterdir() if p.name.endswith(".jsonl") and p.is_file())
    except OSError:
        return None
    if not files:
        return None
    out: list[_FastActions] = []
    n_ids = 0
    all_ids: set[str] = set()
    for path in files:
        stem = path.name[: -len(".jsonl")]
        rows: list[_ActionLine] | None = _decode_lines_fast(path, _ACTION_DECODER)
        if rows is None or "/" in stem:
            return None
        if not rows:
            out.append(_FastActions(str(path), stem, rows, [], []))
            continue
        tids = [r.stage2_trajectory_id for r in rows]
        statuses = [r.status for r in rows]
        sources = {r.source for r in rows}
        cks = [r.cache_key for r in rows]
        if not (all(tids) and all(statuses) and all(cks) and sources == {stem}):
            return None
        if "/" in "".join(tids):
            return None
        n_ids += len(tids)
        all_ids.update(tids)
        if len(all_ids) != n_ids:  # a duplicate id
            return None
        prefix = f"{layout.SIDECARS_DIR}/{stem}/trajectory_"
        expected_sp = [
            prefix + t + ".npz" if st == RECOVERED else None for t, st in zip(tids, statuses, strict=True)
        ]
        if [r.sidecar_path for r in rows] != expected_sp:
            return None
        shas = [r.sidecar_sha256 for r in rows]
        given = [h for h in shas if h is not None]
        if len(given) != len(shas) and None in [
            h for h, st in zip(shas, statuses, strict=True) if st == RECOVERED
        ]:
            return None
        if not _all_sha256(given):
            return None
        out.append(_FastActions(str(path), stem, rows, tids, statuses))
    return out


def load_pairs(path: Path) -> tuple[list[PairRow], list[str]]:
    """Parse the pair manifest. Returns every structurally valid row (all seven fields present, all
    strings) and every problem found: malformed line, missing/extra field, bad split, duplicate
    pair_id, frames path not of the form ``processed_datasets/<cache_key>/frames/trajectory_<ID>.npz``
    or not naming its trajectory id, one trajectory with two frames paths, and leakage (one
    trajectory used by pairs of two splits)."""
    path = Path(path)
    problems: list[str] = []
    rows: list[PairRow] = []
    if not path.is_file():
        return rows, [f"{path}: pair manifest does not exist"]
    fast = _pairs_fast(path)
    if fast is not None:
        return [
            PairRow(
                o.pair_id,
                o.split,
                o.task,
                o.chosen_trajectory_id,
                o.chosen_frames_path,
                o.rejected_trajectory_id,
                o.rejected_frames_path,
                i,
            )
            for i, o in enumerate(fast, start=1)
        ], []
    first_pair_line: dict[str, int] = {}
    # trajectory id -> {split: first line}
    split_lines: dict[str, dict[str, int]] = {}
    frames_of: dict[str, tuple[str, int]] = {}
    fields = set(PAIR_FIELDS)
    for lineno, obj in _iter_json_lines(path, problems):
        keys = set(obj)
        missing = [k for k in PAIR_FIELDS if k not in keys]
        extra = sorted(keys - fields)
        where = f"{path}:{lineno}"
        if missing:
            problems.append(f"{where}: missing field(s) {', '.join(missing)}")
        if extra:
            problems.append(f"{where}: unknown field(s) {', '.join(extra)}")
        if missing:
            continue
        bad = [k for k in PAIR_FIELDS if not isinstance(obj[k], str) or not obj[k]]
        if bad:
            problems.append(f"{where}: field(s) {', '.join(bad)} must be non-empty strings")
            continue
        row = PairRow(**{k: obj[k] for k in PAIR_FIELDS}, line=lineno)
        rows.append(row)
        pid = row.pair_id
        if pid in first_pair_line:
            problems.append(f"{where}: duplicate pair_id {pid!r} (first on line {first_pair_line[pid]})")
        else:
            first_pair_line[pid] = lineno
        split_ok = row.split in layout.SPLITS
        if not split_ok:
            problems.append(
                f"{where}: pair {pid!r}: split {row.split!r} is not one of {', '.join(layout.SPLITS)}"
            )
        for role, (tid, fpath) in zip(("chosen", "rejected"), row.trajectories(), strict=True):
            m = layout.FRAMES_PATH_RE.match(fpath)
            if not m:
                problems.append(
                    f"{where}: pair {pid!r}: {role}_frames_path {fpath!r} is not "
                    "processed_datasets/<cache_key>/frames/trajectory_<ID>.npz"
                )
            elif m.group("id") != tid:
                problems.append(
                    f"{where}: pair {pid!r}: {role}_frames_path {fpath!r} names trajectory "
                    f"{m.group('id')}, not its {role}_trajectory_id {tid}"
                )
            prev = frames_of.get(tid)
            if prev is None:
                frames_of[tid] = (fpath, lineno)
            elif prev[0] != fpath:
                problems.append(
                    f"{where}: trajectory {tid} has frames path {fpath!r} here but {prev[0]!r} on line {prev[1]}"
                )
            if not split_ok:
                continue
            splits = split_lines.setdefault(tid, {})
            if row.split not in splits:
                for other, other_line in splits.items():
                    problems.append(
                        f"{where}: leakage: trajectory {tid} is used by a {row.split!r} pair here "
                        f"(pair {pid!r}) and by a {other!r} pair on line {other_line}"
                    )
                splits[row.split] = lineno
    return rows, problems


def load_action_manifests(dir: Path) -> tuple[list[ActionRow], list[str]]:
    """Parse every ``<source>.jsonl`` of the action manifest folder, in name order.

    Returns every structurally valid row (duplicates included, so row totals count lines) and every
    problem: malformed line, missing field, duplicate ``stage2_trajectory_id`` (naming both
    file:line), ``source`` not equal to the file stem, a recovered row without sidecar path/sha256,
    a non-recovered row with a sidecar path, a sidecar path not of the form
    ``action_sidecars/<source>/trajectory_<ID>.npz`` for its own id and source."""
    d = Path(dir)
    problems: list[str] = []
    rows: list[ActionRow] = []
    if not d.is_dir():
        return rows, [f"{d}: action manifest folder does not exist"]
    fast = _actions_fast(d)
    if fast is not None:
        return [
            ActionRow(
                o.stage2_trajectory_id,
                source,
                o.cache_key,
                o.status,
                o.sidecar_path,
                o.sidecar_sha256,
                fname,
                i,
            )
            for fname, source, objs, _, _ in fast
            for i, o in enumerate(objs, start=1)
        ], []
    files = sorted(p for p in d.iterdir() if p.name.endswith(".jsonl") and p.is_file())
    if not files:
        problems.append(f"{d}: no <source>.jsonl action manifest in this folder")
    first: dict[str, tuple[str, int]] = {}
    for path in files:
        stem = path.name[: -len(".jsonl")]
        fname = str(path)
        for lineno, obj in _iter_json_lines(path, problems):
            get = obj.get
            tid, source, ck, status = (
                get("stage2_trajectory_id"),
                get("source"),
                get("cache_key"),
                get("status"),
            )
            sp, sh = get("sidecar_path"), get("sidecar_sha256")
            if not (
                type(tid) is str
                and tid
                and type(source) is str
                and source
                and type(ck) is str
                and ck
                and type(status) is str
                and status
                and (sp is None or type(sp) is str)
                and (sh is None or type(sh) is str)
            ):
                where = f"{fname}:{lineno}"
                missing = [k for k in ACTION_REQUIRED if k not in obj]
                if missing:
                    problems.append(f"{where}: missing field(s) {', '.join(missing)}")
                    continue
                bad = [k for k in ACTION_REQUIRED if not isinstance(obj[k], str) or not obj[k]]
                bad += [k for k in ACTION_OPTIONAL if get(k) is not None and not isinstance(obj[k], str)]
                problems.append(f"{where}: field(s) {', '.join(bad)} have the wrong type")
                continue
            rows.append(ActionRow(tid, source, ck, status, sp, sh, fname, lineno))
            prev = first.get(tid)
            if prev is not None:
                problems.append(
                    f"{fname}:{lineno}: duplicate stage2_trajectory_id {tid} (first at {prev[0]}:{prev[1]})"
                )
            else:
                first[tid] = (fname, lineno)
            if source != stem:
                problems.append(
                    f"{fname}:{lineno}: trajectory {tid}: source {source!r} is not the file's {stem!r}"
                )
            if status == RECOVERED:
                if not sp or not sh:
                    lacking = [k for k, v in zip(ACTION_OPTIONAL, (sp, sh), strict=True) if not v]
                    problems.append(
                        f"{fname}:{lineno}: trajectory {tid} is {RECOVERED!r} but has no {' / '.join(lacking)}"
                    )
            elif sp is not None:
                problems.append(
                    f"{fname}:{lineno}: trajectory {tid} has status {status!r} but a sidecar_path "
                    f"{sp!r} (only {RECOVERED!r} rows carry one)"
                )
            if sh is not None and not SHA256_RE.match(sh):
                problems.append(f"{fname}:{lineno}: trajectory {tid}: sidecar_sha256 is not 64 lowercase hex")
            if sp is not None and (
                sp != f"{layout.SIDECARS_DIR}/{source}/trajectory_{tid}.npz" or "/" in tid or "/" in source
            ):
                if not layout.SIDECAR_PATH_RE.match(sp):
                    problems.append(
                        f"{fname}:{lineno}: trajectory {tid}: sidecar_path {sp!r} is not "
                        "action_sidecars/<source>/trajectory_<ID>.npz"
                    )
                else:
                    problems.append(
                        f"{fname}:{lineno}: trajectory {tid}: sidecar_path {sp!r} should be "
                        f"{layout.sidecar_relpath(source, tid)!r}"
                    )
    return rows, problems


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


# ----------------------------------------------------------------------------------------------
# Directory listings (one scandir per folder; no per-file stat unless sizes are asked for)
# ----------------------------------------------------------------------------------------------
def _list_files(d: Path) -> set[str] | None:
    """Names of the regular files (symlinks to files included) in ``d``; None when ``d`` is absent."""
    try:
        with os.scandir(d) as it:
            return {e.name for e in it if e.is_file()}
    except (FileNotFoundError, NotADirectoryError):
        return None


def _sizes(d: Path, names: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in names:
        with contextlib.suppress(FileNotFoundError):
            out[n] = os.stat(d / n).st_size
    return out


def _sidecar_dirs(derived: Path) -> dict[str, set[str]]:
    """{source: {file names}} of ``derived/action_sidecars/<source>/``."""
    root = derived / layout.SIDECARS_DIR
    out: dict[str, set[str]] = {}
    try:
        with os.scandir(root) as it:
            sources = sorted(e.name for e in it if e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return out
    for s in sources:
        out[s] = _list_files(root / s) or set()
    return out


# ----------------------------------------------------------------------------------------------
# Sidecar archive
# ----------------------------------------------------------------------------------------------
@dataclass
class SidecarUnpackResult:
    tar_path: Path
    tar_sha256: str
    files: int
    bytes: int
    by_source: dict[str, int]
    seconds: float
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tar_path"] = str(self.tar_path)
        return d


def _missing_frames_problem(pairs_path: Path, line: int, fpath: str, tid: str, data_root: Path) -> str:
    return f"{pairs_path}:{line}: frames file {fpath} of trajectory {tid} is missing under {data_root}"


def _unnamed_sidecar_problem(derived: Path, rel: str) -> str:
    m = layout.SIDECAR_PATH_RE.match(rel)
    what = f"trajectory {m.group('id')}" if m else "no trajectory"
    return f"{derived / rel}: sidecar file for {what} that no action manifest row names"


def _count_sidecar_files(derived: Path) -> int:
    return sum(len(v) for v in _sidecar_dirs(derived).values())


def _check_members(
    tar_name: str, members: Sequence[tarfile.TarInfo]
) -> tuple[list[tuple[str, str, tarfile.TarInfo]], list[str]]:
    """Every member must be a regular file ``action_sidecars/<source>/trajectory_<ID>.npz`` or one of
    the folders ``action_sidecars`` / ``action_sidecars/<source>``. Returns ([(source, file name,
    member)], refusals)."""
    refused: list[str] = []
    files: list[tuple[str, str, tarfile.TarInfo]] = []
    seen: set[str] = set()
    for m in members:
        name = m.name
        label = f"member {name!r} of {tar_name}"
        norm = name[2:] if name.startswith("./") else name
        stripped = norm.rstrip("/") if m.isdir() else norm
        if name.startswith("/") or PurePosixPath(name).is_absolute():
            refused.append(f"{label}: absolute path")
            continue
        parts = stripped.split("/")
        if any(p == ".." for p in parts):
            refused.append(f"{label}: contains '..'")
            continue
        if m.issym() or m.islnk():
            refused.append(f"{label}: is a {'symbolic' if m.issym() else 'hard'} link to {m.linkname!r}")
            continue
        if m.ischr() or m.isblk():
            refused.append(f"{label}: is a device")
            continue
        if m.isfifo():
            refused.append(f"{label}: is a FIFO")
            continue
        if not (m.isreg() or m.isdir()):
            refused.append(f"{label}: is neither a regular file nor a folder (type {m.type!r})")
            continue
        if stripped in ("", "."):
            if m.isdir():
                continue
            refused.append(f"{label}: empty name")
            continue
        if any(p in ("", ".") for p in parts) or "\x00" in stripped:
            refused.append(f"{label}: not a plain relative path")
            continue
        if stripped in seen:
            refused.append(f"{label}: appears twice")
            continue
        seen.add(stripped)
        if m.isdir():
            if parts[0] == layout.SIDECARS_DIR and len(parts) <= 2:
                continue
            refused.append(f"{label}: folder outside action_sidecars/<source>/")
            continue
        sm = layout.SIDECAR_PATH_RE.match(stripped)
        if not sm:
            refused.append(f"{label}: not action_sidecars/<source>/trajectory_<ID>.npz")
            continue
        files.append((sm.group("source"), parts[-1], m))
    return files, refused


def unpack_sidecars(profile: Profile, data_root: Path, *, force: bool = False) -> SidecarUnpackResult:
    """Verify the kit's sidecar tar against its ``.sha256`` file, then unpack it safely into
    ``<data_root>/derived/action_sidecars`` (staged under ``derived/``, published by rename).

    Skipped when ``derived/.sidecars.json`` records the same tar (sha256 from the ``.sha256`` file,
    size, mtime) and the unpacked folder still holds as many files; ``force`` re-verifies and
    re-unpacks. Raises ChecksumMismatchError / UnsafeArchiveError / ArchiveError / KitError; for a
    refused tar nothing is written."""
    t0 = time.perf_counter()
    tar_path = profile.kit_file("sidecar_archive")
    sha_path = profile.kit_file("sidecar_archive_sha256")
    for p in (tar_path, sha_path):
        if not p.is_file():
            raise KitError(
                "sidecar archive",
                [f"{p} does not exist"],
                fix=f"copy the kit's {p.name} into {p.parent} (profile [kit] names it)",
            )
    expected, named = read_single_sha256_file(sha_path)
    if PurePosixPath(named.lstrip("*")).name != tar_path.name:
        raise KitError(
            "sidecar archive checksum file",
            [f"{sha_path}: names {named!r}, not the archive {tar_path.name!r}"],
            fix=f"regenerate it: `sha256sum {tar_path.name} > {sha_path.name}`",
        )
    derived = layout.derived_root(Path(data_root))
    final = derived / layout.SIDECARS_DIR
    marker = derived / SIDECAR_MARKER
    st = tar_path.stat()
    if not force and marker.is_file() and final.is_dir():
        try:
            rec = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            rec = None
        if (
            isinstance(rec, dict)
            and rec.get("tar_sha256") == expected
            and rec.get("tar_size") == st.st_size
            and rec.get("tar_mtime_ns") == st.st_mtime_ns
            and rec.get("files") == _count_sidecar_files(derived)
        ):
            return SidecarUnpackResult(
                tar_path=tar_path,
                tar_sha256=expected,
                files=int(rec["files"]),
                bytes=int(rec.get("bytes", 0)),
                by_source={str(k): int(v) for k, v in dict(rec.get("by_source", {})).items()},
                seconds=time.perf_counter() - t0,
                skipped=True,
            )

    actual = sha256_file(tar_path)
    if actual != expected:
        raise ChecksumMismatchError(
            str(tar_path),
            expected,
            actual,
            fix=f"re-copy {tar_path.name} from the kit (it is damaged or not the one {sha_path.name} pins)",
        )
    try:
        with tarfile.open(tar_path, mode="r:") as tf:
            members = tf.getmembers()
            files, refused = _check_members(tar_path.name, members)
            if refused:
                raise UnsafeArchiveError(
                    f"refusing to unpack {tar_path}: {len(refused)} unsafe or unexpected member(s): "
                    + "; ".join(refused[:20])
                    + (f"; ... and {len(refused) - 20} more" if len(refused) > 20 else ""),
                    fix="rebuild the sidecar tar with only action_sidecars/<source>/trajectory_<ID>.npz files",
                )
            total = sum(m.size for _, _, m in files)
            require_free_space(derived, total + 16 * 1024 * 1024, f"unpacking {tar_path.name}")
            by_source: Counter[str] = Counter()
            if marker.exists():
                marker.unlink()
            with staging_dir(final) as tmp:
                made: set[str] = set()
                for source, fname, m in files:
                    if source not in made:
                        (tmp / source).mkdir(exist_ok=True)
                        made.add(source)
                    src = tf.extractfile(m)
                    if src is None:  # pragma: no cover - regular files always have data
                        raise ArchiveError(f"{tar_path}: cannot read member {m.name!r}")
                    dest = tmp / source / fname
                    with src, open(dest, "wb") as out:
                        shutil.copyfileobj(src, out, 1024 * 1024)
                        written = out.tell()
                    if written != m.size:
                        raise ArchiveError(
                            f"{tar_path}: member {m.name!r} is truncated ({written} of {m.size} bytes)",
                            fix=f"re-copy {tar_path.name} from the kit",
                        )
                    os.chmod(dest, 0o644)
                    by_source[source] += 1
                publish_dir(tmp, final)
    except (tarfile.TarError, EOFError) as e:
        raise ArchiveError(
            f"{tar_path}: not a readable tar ({e})", fix=f"re-copy {tar_path.name} from the kit"
        ) from None
    result = SidecarUnpackResult(
        tar_path=tar_path,
        tar_sha256=actual,
        files=len(files),
        bytes=total,
        by_source=dict(sorted(by_source.items())),
        seconds=0.0,
    )
    atomic_write_json(
        marker,
        {
            "tar_name": tar_path.name,
            "tar_sha256": actual,
            "tar_size": st.st_size,
            "tar_mtime_ns": st.st_mtime_ns,
            "files": result.files,
            "bytes": result.bytes,
            "by_source": result.by_source,
        },
    )
    result.seconds = time.perf_counter() - t0
    return result


# ----------------------------------------------------------------------------------------------
# processed_dataset rows (private reader: Arrow IPC stream files of a HF save_to_disk folder)
# ----------------------------------------------------------------------------------------------
def _read_processed_table(cache_dir: Path, columns: Sequence[str]) -> pa.Table:
    """Rows of ``<cache_dir>/processed_dataset/*.arrow`` (name order), only the asked columns that
    exist. Raises KitError when the folder or its files cannot be read."""
    pdir = cache_dir / PROCESSED_SUBDIR
    files = sorted(pdir.glob("*.arrow"))
    if not files:
        raise KitError(
            "processed_dataset", [f"{pdir}: no *.arrow file"], fix="re-extract this cache directory"
        )
    tables: list[pa.Table] = []
    for f in files:
        try:
            try:
                reader: Any = pa.ipc.open_stream(pa.memory_map(str(f)))
                batches = list(_select_batches(reader, columns))
                schema = _select_schema(reader.schema, columns)
            except pa.ArrowInvalid:
                freader = pa.ipc.open_file(pa.memory_map(str(f)))
                schema = _select_schema(freader.schema, columns)
                batches = [
                    _select_batch(freader.get_batch(i), columns) for i in range(freader.num_record_batches)
                ]
        except (pa.ArrowException, OSError) as e:
            raise KitError(
                "processed_dataset",
                [f"{f}: not a readable Arrow file ({e})"],
                fix="re-extract this cache directory",
            ) from None
        tables.append(pa.Table.from_batches(batches, schema=schema))
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid as e:
        raise KitError(
            "processed_dataset",
            [f"{pdir}: its Arrow files have different schemas ({e})"],
            fix="re-extract this cache directory",
        ) from None


def _select_schema(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    return pa.schema([schema.field(c) for c in columns if schema.get_field_index(c) >= 0])


def _select_batch(batch: pa.RecordBatch, columns: Sequence[str]) -> pa.RecordBatch:
    names = [c for c in columns if batch.schema.get_field_index(c) >= 0]
    return batch.select(names)


def _select_batches(reader: Any, columns: Sequence[str]) -> Iterable[pa.RecordBatch]:
    for batch in reader:
        yield _select_batch(batch, columns)


# ----------------------------------------------------------------------------------------------
# Sidecar npz reading (never unpickles)
# ----------------------------------------------------------------------------------------------
@dataclass
class _SidecarInfo:
    sha256: str | None = None
    bytes: int | None = None
    raw_width: int | None = None
    metadata_raw_width: int | None = None
    aligned_length: int | None = None
    aligned_width: int | None = None
    problems: list[str] = field(default_factory=list)


# numpy writes this exact dict literal; anything else goes through ast.literal_eval (literals only).
_NPY_DICT_RE = re.compile(
    r"^\{'descr': '(?P<descr>[^'\\]+)', 'fortran_order': (?:True|False), "
    r"'shape': \((?P<shape>[0-9, ]*)\), *\} *\n?$"
)
_NPY_MAGIC = b"\x93NUMPY"
_NPY_MAX_HEADER = 10000  # numpy's own default max_header_size
_HEADER_READ = _NPY_MAX_HEADER + 16


def _parse_npy_header(raw: bytes) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """(shape, dtype, offset of the array data) from the first bytes of a ``.npy`` member.

    Only the header (a literal) is parsed; no array data is interpreted, nothing is unpickled."""
    if raw[:6] != _NPY_MAGIC:
        raise ValueError("not a .npy member (bad magic)")
    major = raw[6] if len(raw) > 7 else 0
    if major == 1 and len(raw) >= 10:
        (hlen,) = struct.unpack_from("<H", raw, 8)
        start, enc = 10, "latin1"
    elif major in (2, 3) and len(raw) >= 12:
        (hlen,) = struct.unpack_from("<I", raw, 8)
        start, enc = 12, "latin1" if major == 2 else "utf8"
    else:
        raise ValueError(f"unsupported or truncated .npy header (version {major})")
    if hlen > _NPY_MAX_HEADER or len(raw) < start + hlen:
        raise ValueError(f"truncated or oversized .npy header ({hlen} bytes)")
    text = raw[start : start + hlen].decode(enc)
    m = _NPY_DICT_RE.match(text)
    if m is not None:
        dtype = np.dtype(m.group("descr"))
        shape = tuple(int(x) for x in m.group("shape").replace(" ", "").split(",") if x)
    else:
        d = ast.literal_eval(text)
        if not isinstance(d, dict) or not {"descr", "shape", "fortran_order"} <= set(d):
            raise ValueError(f".npy header is not a numpy header dict: {text[:80]!r}")
        shape_v = d["shape"]
        if not isinstance(shape_v, tuple) or not all(isinstance(x, int) for x in shape_v):
            raise ValueError(f".npy header shape is not a tuple of ints: {shape_v!r}")
        dtype = np.lib.format.descr_to_dtype(d["descr"])
        shape = shape_v
    return shape, dtype, start + hlen


class _Member(NamedTuple):
    name: str
    flag: int
    method: int
    crc: int
    csize: int
    usize: int
    offset: int


_CD_ENTRY = struct.Struct("<4s6H3I5HII")  # a zip central-directory entry (46 bytes)


def _zip_members_fast(data: bytes) -> list[_Member] | None:
    """The central directory of a plain zip (no archive comment, no zip64 fields), as numpy
    writes small npz files; None for anything else (then zipfile parses it)."""
    eocd = len(data) - 22
    if eocd < 0 or data[eocd : eocd + 4] != b"PK\x05\x06":
        return None
    _sig, disk, cd_disk, n_disk, n_total, _cd_size, cd_off, _clen = struct.unpack_from(
        "<IHHHHIIH", data, eocd
    )
    if disk or cd_disk or n_disk != n_total or n_total == 0xFFFF or cd_off >= eocd:
        return None
    out: list[_Member] = []
    pos = cd_off
    for _ in range(n_total):
        if pos + 46 > eocd:
            return None
        f = _CD_ENTRY.unpack_from(data, pos)
        if f[0] != b"PK\x01\x02" or 0xFFFFFFFF in (f[8], f[9], f[16]):
            return None
        nlen, xlen, clen = f[10], f[11], f[12]
        name = data[pos + 46 : pos + 46 + nlen].decode("utf-8" if f[3] & 0x800 else "cp437")
        out.append(_Member(name, f[3], f[4], f[7], f[8], f[9], f[16]))
        pos += 46 + nlen + xlen + clen
    return out


def _npz_members(data: bytes) -> dict[str, _Member]:
    members = _zip_members_fast(data)
    if members is None:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = [
                _Member(
                    zi.filename,
                    zi.flag_bits,
                    zi.compress_type,
                    zi.CRC,
                    zi.compress_size,
                    zi.file_size,
                    zi.header_offset,
                )
                for zi in zf.infolist()
            ]
    out: dict[str, _Member] = {}
    for m in members:
        if m.flag & 0x1:
            raise ValueError(f"member {m.name!r} is encrypted")
        if m.method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ValueError(
                f"member {m.name!r} uses zip compression method {m.method} (numpy writes 0 or 8)"
            )
        key = m.name[:-4] if m.name.endswith(".npy") else m.name
        if key in out:
            raise ValueError(f"member {m.name!r} appears twice")
        out[key] = m
    return out


def _member_bytes(data: bytes, m: _Member, limit: int | None) -> bytes:
    """The (decompressed) bytes of one member: all of them (CRC-checked), or at most ``limit``."""
    off = m.offset
    if data[off : off + 4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"bad local header for member {m.name!r}")
    n, x = struct.unpack_from("<HH", data, off + 26)
    start = off + 30 + n + x
    if start + m.csize > len(data):
        raise zipfile.BadZipFile(f"member {m.name!r} is truncated")
    comp = memoryview(data)[start : start + m.csize]
    if m.method == zipfile.ZIP_STORED:
        out = bytes(comp if limit is None else comp[:limit])
    else:
        dec = zlib.decompressobj(-15)
        out = dec.decompress(comp) + dec.flush() if limit is None else dec.decompress(comp, limit)
    if limit is None and (len(out) != m.usize or zlib.crc32(out) != m.crc):
        raise zipfile.BadZipFile(f"member {m.name!r} is corrupt (size or CRC)")
    return out


def _read_sidecar(path: str | Path, want_sha: bool) -> _SidecarInfo:
    """Widths and lengths of a sidecar from its ``.npy`` headers (+ the small metadata_json).

    A lean reader of the npz (zip) container: only headers are parsed, ``metadata_json`` is read
    with ``np.frombuffer`` after its dtype is checked; an object (pickled) array is a problem and is
    never unpickled."""
    info = _SidecarInfo()
    label = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(_SIDECAR_READ_LIMIT + 1)
            if len(data) > _SIDECAR_READ_LIMIT:
                info.bytes = os.fstat(f.fileno()).st_size
                if want_sha:
                    info.sha256 = sha256_file(path)
                info.problems.append(
                    f"{label}: {info.bytes} bytes, too large for an action sidecar; not read"
                )
                return info
        info.bytes = len(data)
        if want_sha:
            info.sha256 = hashlib.sha256(data).hexdigest()
        members = _npz_members(data)
        headers: dict[str, tuple[tuple[int, ...], np.dtype[Any], int]] = {}
        for key, zi in members.items():
            if not zi.name.endswith(".npy"):
                continue
            try:
                head = _member_bytes(data, zi, 256)
                try:
                    headers[key] = _parse_npy_header(head)
                except ValueError:
                    if len(head) < 256:
                        raise
                    headers[key] = _parse_npy_header(_member_bytes(data, zi, _HEADER_READ))
            except (ValueError, SyntaxError, TypeError, MemoryError, zipfile.BadZipFile, zlib.error) as e:
                info.problems.append(f"{label}: member {zi.name}: unreadable .npy ({type(e).__name__}: {e})")
        objects = [k for k, (_, dt, _) in headers.items() if dt.hasobject]
        if objects:
            info.problems.append(
                f"{label}: key(s) {', '.join(objects)} hold object (pickled) arrays; refused, not unpickled"
            )
            return info
        missing = [k for k in SIDECAR_KEYS if k not in members]
        if missing:
            info.problems.append(f"{label}: missing key(s) {', '.join(missing)}")
        raw = headers.get("raw_actions")
        if raw is not None:
            if len(raw[0]) == 2:
                info.raw_width = raw[0][1]
            else:
                info.problems.append(f"{label}: raw_actions has shape {raw[0]}, expected (N, W)")
        aligned = headers.get("aligned_actions")
        if aligned is not None:
            if len(aligned[0]) == 2:
                info.aligned_length, info.aligned_width = aligned[0]
            else:
                info.problems.append(f"{label}: aligned_actions has shape {aligned[0]}, expected (T, W)")
        if "metadata_json" in headers:
            shape, dtype, offset = headers["metadata_json"]
            meta = None
            if dtype.kind not in "US" or shape not in ((), (1,)):
                info.problems.append(f"{label}: metadata_json is {dtype} {shape}, expected a 0-d string")
            else:
                body = _member_bytes(data, members["metadata_json"], None)
                value = np.frombuffer(body, dtype=dtype, count=1, offset=offset)[0]
                text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
                try:
                    meta = json.loads(text)
                except ValueError as e:
                    info.problems.append(f"{label}: metadata_json is not JSON ({e})")
            if isinstance(meta, dict):
                rw = meta.get("raw_width")
                if isinstance(rw, int) and not isinstance(rw, bool):
                    info.metadata_raw_width = rw
                else:
                    info.problems.append(f"{label}: metadata_json has no integer raw_width")
            elif meta is not None:
                info.problems.append(f"{label}: metadata_json is not a JSON object")
    except (
        OSError,
        ValueError,
        SyntaxError,
        TypeError,
        MemoryError,
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
    ) as e:
        info.problems.append(f"{label}: unreadable sidecar npz ({type(e).__name__}: {e})")
    return info


def _read_sidecars(paths: Sequence[str], want_sha: bool, workers: int | None) -> list[_SidecarInfo]:
    """Read many sidecars; a couple of threads overlap the file I/O (the parsing holds the GIL)."""
    n = workers or min(2, os.cpu_count() or 1)
    if n <= 1 or len(paths) < 1024:
        return [_read_sidecar(p, want_sha) for p in paths]
    size = 512
    chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        parts = pool.map(lambda c: [_read_sidecar(p, want_sha) for p in c], chunks)
        return [info for part in parts for info in part]


# ----------------------------------------------------------------------------------------------
# The join
# ----------------------------------------------------------------------------------------------
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


def _write_parquet_atomic(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd", write_statistics=True)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    data_root: Path, ids_by_ck: dict[str, list[str]], named_at: Callable[[str], str], problems: list[str]
) -> _ProcessedFacts:
    """processed_dataset rows (by id) and frame-file sizes of the trajectories each cache dir must hold."""
    out = _ProcessedFacts()
    for ck in sorted(ids_by_ck):
        cdir = layout.cache_dir(data_root, ck)
        pdir = cdir / PROCESSED_SUBDIR
        wanted = ids_by_ck[ck]
        if not cdir.is_dir():
            problems.append(
                f"cache directory {cdir} is absent ({len(wanted)} trajectories named by the kit, "
                f"e.g. {wanted[0]} at {named_at(wanted[0])})"
            )
            continue
        try:
            table: pa.Table | None = _read_processed_table(cdir, PROCESSED_COLUMNS)
        except ProblemsError as e:
            problems.extend(e.problems)
            table = None
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
        names = _list_files(fdir) or set()
        by_name = {f"trajectory_{t}.npz": t for t in wanted}
        for name, size in _sizes(fdir, [n for n in by_name if n in names]).items():
            out.frames_bytes[by_name[name]] = size
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
) -> JoinResult:
    """Join pairs, action manifests, processed_dataset rows, frame files and sidecars by trajectory
    id; write ``tables/trajectory_join.parquet`` atomically (sorted by id) and return the problems
    found (gathered, not raised)."""
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

    proc = _processed_facts(data_root, ids_by_ck, named_at, problems)

    # pair frames files missing (once per trajectory, at its first line)
    for tid, (fpath, line) in sorted(pf.frames_of.items(), key=lambda kv: (kv[1][1], kv[0])):
        if layout.FRAMES_PATH_RE.match(fpath) and tid not in proc.frames_bytes:
            problems.append(_missing_frames_problem(pairs_path, line, fpath, tid, data_root))

    # --- sidecars: on disk vs named; then read the present ones -------------------------------
    on_disk = {
        f"{layout.SIDECARS_DIR}/{source}/{name}"
        for source, names in _sidecar_dirs(derived).items()
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
    problems.extend(_unnamed_sidecar_problem(derived, rel) for rel in sorted(on_disk - named))
    read = _read_sidecars(
        [f"{derived_s}/{action_of[t].sidecar_path}" for t in to_read], check_sidecar_sha256, workers
    )
    infos = dict(zip(to_read, read, strict=True))
    widths_seen: dict[str, Counter[int]] = defaultdict(Counter)
    for tid, si in infos.items():
        problems.extend(si.problems)
        if si.raw_width is not None:
            widths_seen[action_of[tid].source][si.raw_width] += 1
    expected_width, width_basis = _expected_widths(profile, widths_seen)

    # --- assemble rows -------------------------------------------------------------------------
    cols: dict[str, list[Any]] = {f.name: [] for f in JOIN_SCHEMA}
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
            where = f"{derived_s}/{ar.sidecar_path} (trajectory {tid}, {ar.where})"
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
                        f"{where}: raw action width {raw_w} contradicts source {ar.source!r} width {exp_w} "
                        f"({width_basis.get(ar.source, '')})"
                    )
                if inf.metadata_raw_width is not None and inf.metadata_raw_width != raw_w:
                    width_ok = False
                    problems.append(
                        f"{where}: metadata_json raw_width {inf.metadata_raw_width} but raw_actions width {raw_w}"
                    )
                if inf.aligned_width is not None and inf.aligned_width != raw_w:
                    width_ok = False
                    problems.append(
                        f"{where}: aligned_actions width {inf.aligned_width} but raw_actions width {raw_w}"
                    )
            if inf.aligned_length is not None and isinstance(num_frames, int):
                length_ok = inf.aligned_length == num_frames
                if not length_ok:
                    problems.append(
                        f"{where}: aligned_actions has {inf.aligned_length} rows but the trajectory has "
                        f"num_frames {num_frames}"
                    )
        data_source = md.get("data_source")
        task = md.get("task")
        cols["stage2_trajectory_id"].append(tid)
        cols["cache_key"].append(ck)
        cols["source"].append(ar.source if ar is not None else data_source)
        cols["data_source"].append(data_source)
        cols["frames_path"].append(
            fr[0] if fr is not None else (layout.frames_relpath(ck, tid) if ck else None)
        )
        cols["frames_present"].append(tid in proc.frames_bytes)
        cols["frames_bytes"].append(proc.frames_bytes.get(tid))
        cols["in_pairs"].append(tid in pf.pair_count)
        cols["split"].append(pf.split_of.get(tid))
        cols["pair_count"].append(pf.pair_count.get(tid, 0))
        cols["task"].append(task if task is not None else pf.task_of.get(tid))
        cols["quality_label"].append(md.get("quality_label"))
        cols["partial_success"].append(md.get("partial_success"))
        cols["is_robot"].append(md.get("is_robot"))
        cols["num_frames"].append(num_frames)
        cols["in_processed_dataset"].append(tid in proc.meta)
        cols["action_source"].append(ar.source if ar is not None else None)
        cols["action_status"].append(ar.status if ar is not None else None)
        cols["sidecar_path"].append(ar.sidecar_path if ar is not None else None)
        cols["sidecar_present"].append(
            (info is not None) if ar is not None and ar.sidecar_path is not None else None
        )
        cols["sidecar_bytes"].append(inf.bytes)
        cols["sidecar_sha256"].append(ar.sidecar_sha256 if ar is not None else None)
        cols["sidecar_sha256_ok"].append(sha_ok)
        cols["raw_width"].append(inf.raw_width)
        cols["metadata_raw_width"].append(inf.metadata_raw_width)
        cols["expected_width"].append(exp_w)
        cols["aligned_length"].append(inf.aligned_length)
        cols["width_ok"].append(width_ok)
        cols["length_ok"].append(length_ok)
    try:
        table = pa.table(cols, schema=JOIN_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise KitError(
            "trajectory join",
            [f"a processed_dataset column has an unexpected type ({e})"],
            fix="check the processed_dataset schema of the cache directories against kit-format.md",
        ) from None
    out = layout.join_table_path(data_root)
    _write_parquet_atomic(table, out)

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


# ----------------------------------------------------------------------------------------------
# Link check (paths only: one scandir per folder, no hashing, no npz opening)
# ----------------------------------------------------------------------------------------------
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
    problems: list[str] = []
    pairs_path = profile.kit_file("pair_manifest")
    frame_paths: dict[str, tuple[str, int]] = {}  # frames path -> (trajectory id, first line)
    pair_objs = _pairs_fast(pairs_path) if pairs_path.is_file() else None
    if pair_objs is not None:
        n_pairs = len(pair_objs)
        setdefault = frame_paths.setdefault
        for i, o in enumerate(pair_objs, start=1):
            setdefault(o.chosen_frames_path, (o.chosen_trajectory_id, i))
            setdefault(o.rejected_frames_path, (o.rejected_trajectory_id, i))
    else:
        pairs, pair_problems = load_pairs(pairs_path)
        problems += pair_problems
        n_pairs = len(pairs)
        for row in pairs:
            for tid, fpath in row.trajectories():
                frame_paths.setdefault(fpath, (tid, row.line))
    adir = profile.kit_file("action_manifest_dir")
    fast_actions = _actions_fast(adir) if adir.is_dir() else None
    actions: list[ActionRow] = []
    if fast_actions is None:
        actions, action_problems = load_action_manifests(adir)
        problems += action_problems
        n_actions = len(actions)
    else:
        n_actions = sum(len(fa.rows) for fa in fast_actions)

    # --- frames files ------------------------------------------------------------------------
    t_fs = time.perf_counter()
    root = os.fspath(data_root) + os.sep
    match = layout.FRAMES_PATH_RE.match
    gone: list[tuple[str, str, str, int]] = []  # (folder, frames path, trajectory id, line)
    unmatched = 0  # already reported by load_pairs
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
        _missing_frames_problem(pairs_path, line, fpath, tid, data_root) for _, fpath, tid, line in gone
    )
    missing_frames = len(gone) + unmatched

    # --- sidecars ----------------------------------------------------------------------------
    derived = layout.derived_root(data_root)
    on_disk = _sidecar_dirs(derived)  # {source: file names}
    resolved: dict[str, int] = {}
    missing_sidecars = 0
    unnamed: list[str] = []
    if fast_actions is not None:
        # clean manifests: unique ids, sidecar_path == action_sidecars/<file stem>/trajectory_<id>.npz
        named_by_source: dict[str, set[str]] = {}
        for fname, source, objs, ids, statuses in fast_actions:
            named = {f"trajectory_{t}.npz" for t, st in zip(ids, statuses, strict=True) if st == RECOVERED}
            named_by_source[source] = named
            lost = named - on_disk.get(source, set())
            if len(named) > len(lost):
                resolved[source] = len(named) - len(lost)
            if lost:
                missing_sidecars += len(lost)
                for i, a in enumerate(objs, start=1):
                    sp = a.sidecar_path
                    if sp and sp.rpartition("/")[2] in lost:
                        problems.append(
                            f"{fname}:{i}: trajectory {a.stage2_trajectory_id} is {RECOVERED!r} but its "
                            f"sidecar {derived / sp} is missing"
                        )
        for source, names in on_disk.items():
            extra = names - named_by_source.get(source, set())
            unnamed += [f"{layout.SIDECARS_DIR}/{source}/{n}" for n in extra]
    else:
        on_disk_rel = {
            f"{layout.SIDECARS_DIR}/{source}/{name}" for source, names in on_disk.items() for name in names
        }
        counted: Counter[str] = Counter()
        named_rel: set[str] = set()
        for ar in actions:
            sp = ar.sidecar_path
            if sp is None or sp in named_rel:  # a duplicate row (already reported) counts once
                continue
            named_rel.add(sp)
            if sp in on_disk_rel:
                counted[ar.source] += 1
            elif ar.status == RECOVERED:
                missing_sidecars += 1
                problems.append(
                    f"{ar.where}: trajectory {ar.stage2_trajectory_id} is {RECOVERED!r} but its sidecar "
                    f"{derived / sp} is missing"
                )
        resolved = dict(counted)
        unnamed = list(on_disk_rel - named_rel)
    problems.extend(_unnamed_sidecar_problem(derived, rel) for rel in sorted(unnamed))
    t_end = time.perf_counter()
    return LinkReport(
        pair_rows=n_pairs,
        unique_frame_files=len(frame_paths),
        action_manifest_rows=n_actions,
        resolved_sidecars=sum(resolved.values()),
        sidecars_by_source=dict(sorted(resolved.items())),
        missing_frames=missing_frames,
        missing_sidecars=missing_sidecars,
        problems=problems,
        seconds=t_end - t0,
        fs_seconds=t_end - t_fs,
    )


# ----------------------------------------------------------------------------------------------
# Byte check
# ----------------------------------------------------------------------------------------------
@dataclass
class ByteReport:
    """``matched`` counts the files whose digest matched; ``ok`` says whether everything passed
    (the brief's ``ok: int`` count and ``ok`` property cannot share one name: the count is
    ``matched`` so that ``if report.ok`` can never pass a failed check)."""

    files: int
    bytes: int
    matched: int
    mismatched: list[str]
    missing: list[str]
    unlisted: list[str]
    seconds: float
    problems: list[str] = field(default_factory=list)
    # Every finding as one located message (``<file>:<line>: ...``): the checksum file's line of a
    # mismatched or missing file, the pair manifest's first line of an unlisted one; plus problems.
    details: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.mismatched or self.missing or self.unlisted or self.problems) and (
            self.matched == self.files
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _plain_relpath(rel: str) -> bool:
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in rel.split("/"))


_HASH_BUFFER = 4 * 1024 * 1024
_thread_state = threading.local()


def _sha256_and_size(path: Path) -> tuple[str, int]:
    """sha256 and size of a file, read into one buffer per thread, reused for every file: a fresh
    buffer per file (``f.read()``) costs page faults that, for frame files, exceed the hashing
    itself. hashlib releases the GIL while it hashes, so threads hash in parallel."""
    buf: bytearray | None = getattr(_thread_state, "buf", None)
    if buf is None:
        buf = _thread_state.buf = bytearray(_HASH_BUFFER)
    view = memoryview(buf)
    h = hashlib.sha256()
    size = 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        while n := os.readv(fd, [buf]):
            h.update(view[:n])
            size += n
    finally:
        os.close(fd)
    return h.hexdigest(), size


def verify_subset_bytes(
    profile: Profile,
    data_root: Path,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ByteReport:
    """Hash every file the subset SHA256SUMS lists (relative to the data root), in parallel, and
    compare. Also lists the frame files used by pairs that SHA256SUMS does not list.
    ``progress(files_done, files_total)`` is called after each file."""
    t0 = time.perf_counter()
    data_root = Path(data_root)
    sums_path = profile.kit_file("subset_checksums")
    problems: list[str] = []
    try:
        entries = parse_sha256sums(sums_path)
    except FileNotFoundError:
        entries = []
        problems.append(f"{sums_path}: subset checksum file does not exist")
    except ProblemsError as err:
        entries = []
        problems.extend(err.problems)
    todo = []
    for ent in entries:
        if not _plain_relpath(ent.path):
            problems.append(
                f"{sums_path}:{ent.line}: path {ent.path!r} is not a plain relative path; not checked"
            )
            continue
        todo.append(ent)

    root = os.fspath(data_root) + os.sep

    def hash_chunk(rels: list[str]) -> list[tuple[str, str | None, int]]:
        out: list[tuple[str, str | None, int]] = []
        for rel in rels:
            try:
                out.append((rel, *_sha256_and_size(Path(root + rel))))
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                out.append((rel, None, 0))
        return out

    results: dict[str, tuple[str | None, int]] = {}
    n = workers or max(2, os.cpu_count() or 2)
    rels = [ent.path for ent in todo]
    # Chunks of files rather than one task per file: a hand-off per file between threads costs
    # about as much as hashing a small frame file. Several chunks per thread keep the load even.
    size = max(1, min(64, len(rels) // (n * 8)))
    with ThreadPoolExecutor(max_workers=n) as pool:
        futs = [pool.submit(hash_chunk, rels[i : i + size]) for i in range(0, len(rels), size)]
        done = 0
        for fut in as_completed(futs):
            for rel, digest, nbytes in fut.result():
                results[rel] = (digest, nbytes)
                done += 1
                if progress is not None:
                    progress(done, len(rels))
    mismatched: list[str] = []
    missing: list[str] = []
    details: list[str] = []
    ok = 0
    total_bytes = 0
    for ent in todo:
        actual, size = results[ent.path]
        if actual is None:
            missing.append(ent.path)
            details.append(f"{sums_path}:{ent.line}: {data_root / ent.path} is missing")
            continue
        total_bytes += size
        if actual == ent.digest:
            ok += 1
        else:
            mismatched.append(f"{ent.path}: expected {ent.digest}, actual {actual}")
            details.append(
                f"{sums_path}:{ent.line}: {data_root / ent.path} has sha256 {actual}, expected {ent.digest}"
            )
    listed = {ent.path for ent in entries}
    pairs_path = profile.kit_file("pair_manifest")
    pairs, pair_problems = load_pairs(pairs_path)
    first_line: dict[str, int] = {}
    for r in pairs:
        for _, fp in r.trajectories():
            first_line.setdefault(fp, r.line)
    unlisted = sorted(fp for fp in first_line if fp not in listed)
    details += [
        f"{pairs_path}:{first_line[fp]}: frames file {fp} is used by a pair but not listed in {sums_path}"
        for fp in unlisted
    ]
    if not pairs and pair_problems:
        problems.extend(pair_problems)
    return ByteReport(
        files=len(entries),
        bytes=total_bytes,
        matched=ok,
        mismatched=mismatched,
        missing=missing,
        unlisted=unlisted,
        seconds=time.perf_counter() - t0,
        problems=problems,
        details=problems + details,
    )
