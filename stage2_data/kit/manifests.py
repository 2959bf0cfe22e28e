"""The kit's JSON Lines manifests (the pair manifest, the action manifests): their rows and their
rules, each rule stated once.

A manifest is read in two steps:

1. **Decoding** (structure only, no rule): the msgspec Structs :class:`PairLine` and
   :class:`ActionLine` *are* the row schemas (field names, required / optional, value types,
   unknown fields refused or ignored). A file is decoded fast by msgspec into those Structs when
   every line fits them (:func:`_pairs_fast`, :func:`_actions_fast`); otherwise the exact decoder
   (stdlib ``json``, ``_Schema.exact``) reads it line by line and checks each object against
   the *same* schema (read from the Struct by :class:`_Schema`), turning each misfit into a located
   problem. Either way the result is a :class:`ManifestFile`: the same rows, with their line
   numbers, and the lines' structural problems.
2. **Rules** (:func:`check_pairs`, :func:`check_actions`): one function per manifest, run on the
   decoded rows whatever decoded them, reporting every problem with its file, line and id.

So the fast and exact paths cannot disagree on a rule; ``tests/test_kit_rules.py`` checks on a
corpus of broken kits that they decode the same rows and report the same problems.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import msgspec

from .. import layout
from ..formats.sha256sums import file_kind
from ._lines import decode_lines_fast, iter_json_lines

__all__ = [
    "PAIR_FIELDS",
    "ACTION_REQUIRED",
    "ACTION_OPTIONAL",
    "ACTION_FIELDS",
    "RECOVERED",
    "PairLine",
    "ActionLine",
    "ManifestFile",
    "PairRow",
    "ActionRow",
    "read_pair_manifest",
    "read_action_manifests",
    "check_pairs",
    "check_actions",
    "load_pairs",
    "load_action_manifests",
]

RECOVERED = "recovered"

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


# ----------------------------------------------------------------------------------------------
# Schemas: one msgspec Struct per manifest row (``gc=False``: str fields only, no cycles)
# ----------------------------------------------------------------------------------------------
class PairLine(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A pair manifest line: exactly these seven fields, all non-empty strings."""

    pair_id: NonEmptyStr
    split: NonEmptyStr
    task: NonEmptyStr
    chosen_trajectory_id: NonEmptyStr
    chosen_frames_path: NonEmptyStr
    rejected_trajectory_id: NonEmptyStr
    rejected_frames_path: NonEmptyStr


class ActionLine(msgspec.Struct, gc=False):
    """An action manifest line: four non-empty strings, two optional strings; other fields are
    allowed (and ignored)."""

    stage2_trajectory_id: NonEmptyStr
    source: NonEmptyStr
    cache_key: NonEmptyStr
    status: NonEmptyStr
    sidecar_path: str | None = None
    sidecar_sha256: str | None = None


S = TypeVar("S", PairLine, ActionLine)

PAIR_FIELDS: tuple[str, ...] = PairLine.__struct_fields__
ACTION_FIELDS: tuple[str, ...] = ActionLine.__struct_fields__
ACTION_REQUIRED = ACTION_FIELDS[:4]
ACTION_OPTIONAL = ACTION_FIELDS[4:]


def _value_rule(t: msgspec.inspect.Type) -> Callable[[Any], bool]:
    """The test a JSON value must pass for a field of msgspec type ``t`` (only the types the row
    schemas use)."""
    if (
        isinstance(t, msgspec.inspect.StrType)
        and t.min_length == 1
        and t.max_length is None
        and not t.pattern
    ):
        return lambda v: type(v) is str and v != ""
    if (
        isinstance(t, msgspec.inspect.UnionType)
        and len(t.types) == 2
        and isinstance(t.types[0], msgspec.inspect.StrType)
        and t.types[0] == msgspec.inspect.StrType()
        and isinstance(t.types[1], msgspec.inspect.NoneType)
    ):
        return lambda v: v is None or type(v) is str
    raise TypeError(f"kit row schemas support non-empty str and str | None fields, not {t!r}")


@dataclass(frozen=True)
class ManifestFile(Generic[S]):
    """One decoded manifest file: its rows in file order, the line number of each, and the
    problems its lines had before any rule (unreadable line, missing / unknown field, wrong type)
    as (line number, message), in line order."""

    path: str
    rows: list[S]
    lines: Sequence[int]
    notes: list[tuple[int, str]]


class _Schema(Generic[S]):
    """A row Struct's schema, read from the Struct itself: what the exact decoder checks, in the
    manifest's own wording, and the msgspec decoders of the fast path.

    The fast path first tries the Struct with unknown fields refused (``known``): such a line
    holds flat values only, so it cannot nest. When the schema ignores unknown fields, a file that
    has some is decoded again with the Struct itself (its lines' nesting then bounded first)."""

    def __init__(self, struct: type[S], known: type[S], wrong_type: str) -> None:
        info = msgspec.inspect.type_info(struct)
        assert isinstance(info, msgspec.inspect.StructType)
        assert issubclass(known, struct) and msgspec.structs.fields(known) == msgspec.structs.fields(struct)
        assert known.__struct_config__.forbid_unknown_fields
        self.struct: type[S] = struct
        self.known: msgspec.json.Decoder[S] = msgspec.json.Decoder(known)
        self.lenient: msgspec.json.Decoder[S] | None = (
            None if info.forbid_unknown_fields else msgspec.json.Decoder(struct)
        )
        self.fields = tuple(f.name for f in info.fields)
        self.required = tuple(f.name for f in info.fields if f.required)
        self.forbid_unknown = info.forbid_unknown_fields
        self.value_ok = tuple((f.name, _value_rule(f.type)) for f in info.fields)
        self.wrong_type = wrong_type

    def fast(self, path: Path) -> ManifestFile[S] | None:
        once = {"fields": self.fields, "required": self.required}
        rows = decode_lines_fast(path, self.known, may_nest=False, **once)
        if rows is None and self.lenient is not None:
            rows = decode_lines_fast(path, self.lenient, may_nest=True, **once)
        return None if rows is None else ManifestFile(str(path), rows, range(1, len(rows) + 1), [])

    def exact(self, path: Path) -> ManifestFile[S]:
        notes: list[tuple[int, str]] = []
        rows: list[S] = []
        lines: list[int] = []
        fields = set(self.fields)
        for lineno, obj in iter_json_lines(path, notes, self.fields):
            where = f"{path}:{lineno}"
            missing = [k for k in self.required if k not in obj]
            if missing:
                notes.append((lineno, f"{where}: missing field(s) {', '.join(missing)}"))
            if self.forbid_unknown:
                extra = sorted(set(obj) - fields)
                if extra:
                    notes.append((lineno, f"{where}: unknown field(s) {', '.join(extra)}"))
            if missing:
                continue
            bad = [k for k, ok in self.value_ok if not ok(obj.get(k))]
            if bad:
                notes.append((lineno, f"{where}: field(s) {', '.join(bad)} {self.wrong_type}"))
                continue
            rows.append(self.struct(**{k: obj[k] for k in self.fields if k in obj}))
            lines.append(lineno)
        return ManifestFile(str(path), rows, lines, notes)


class _ActionLineKnownFields(ActionLine, forbid_unknown_fields=True):
    """An action manifest line with no other field (the usual case: decoded first)."""


_PAIRS = _Schema(PairLine, PairLine, "must be non-empty strings")
_ACTIONS = _Schema(ActionLine, _ActionLineKnownFields, "have the wrong type")


# ----------------------------------------------------------------------------------------------
# Decoding (the fast decoders are module attributes so that a test can switch them off)
# ----------------------------------------------------------------------------------------------
def _pairs_fast(path: Path) -> ManifestFile[PairLine] | None:
    """The pair manifest decoded by msgspec; None when the exact decoder must read it."""
    return _PAIRS.fast(path)


def _action_files(d: Path) -> list[Path]:
    return [p for p in layout.action_manifest_paths(d) if p.is_file()]


def _actions_fast(d: Path) -> list[ManifestFile[ActionLine]] | None:
    """Every action manifest (in file-name order) decoded by msgspec; None when the exact decoder
    must read them."""
    try:
        files = _action_files(d)
    except OSError:
        return None
    out: list[ManifestFile[ActionLine]] = []
    for path in files:
        m = _ACTIONS.fast(path)
        if m is None:
            return None
        out.append(m)
    return out


def _not_a_file(path: Path) -> str:
    """Why ``path`` (not a regular file) cannot be read, in words."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "does not exist"
    return f"is {file_kind(mode)}, not a regular file"


def read_pair_manifest(path: Path) -> tuple[ManifestFile[PairLine], list[str]]:
    """The pair manifest's rows (with their line numbers) and every problem found."""
    path = Path(path)
    if not path.is_file():
        what = _not_a_file(path)
        return ManifestFile(str(path), [], [], []), [f"{path}: pair manifest {what}"]
    m = _pairs_fast(path)
    if m is None:
        m = _PAIRS.exact(path)
    return m, check_pairs(m)


def read_action_manifests(d: Path) -> tuple[list[ManifestFile[ActionLine]], list[str]]:
    """Every ``<source>.jsonl`` of the action manifest folder (in name order) decoded, and every
    problem found."""
    d = Path(d)
    if not d.is_dir():
        what = "does not exist" if not d.exists() else "is not a folder"
        return [], [f"{d}: action manifest folder {what}"]
    odd = [p for p in layout.action_manifest_paths(d) if not p.is_file()]
    if odd:  # never opened: a FIFO would block
        return [], [f"{p}: action manifest {_not_a_file(p)}" for p in odd]
    files = _actions_fast(d)
    if files is None:
        files = [_ACTIONS.exact(p) for p in _action_files(d)]
    return files, check_actions(d, files)


# ----------------------------------------------------------------------------------------------
# Rules
# ----------------------------------------------------------------------------------------------
_NO_LINE = sys.maxsize


def _report_notes(notes: list[tuple[int, str]], k: int, line: int, problems: list[str]) -> tuple[int, int]:
    """Report the notes from ``notes[k]`` up to line ``line``; returns (next index, its line)."""
    while k < len(notes) and notes[k][0] <= line:
        problems.append(notes[k][1])
        k += 1
    return k, notes[k][0] if k < len(notes) else _NO_LINE


def check_pairs(m: ManifestFile[PairLine]) -> list[str]:
    """Every problem of a decoded pair manifest, in line order: its lines' own (``m.notes``), a
    duplicate pair_id, a split other than train/val/test, a frames path not of the form
    ``processed_datasets/<cache_key>/frames/trajectory_<ID>.npz`` or not naming its trajectory id,
    one trajectory with two frames paths, and leakage (one trajectory used by pairs of two splits)."""
    path = m.path
    problems: list[str] = []
    notes = m.notes
    k, next_note = 0, notes[0][0] if notes else _NO_LINE
    first_pair_line: dict[str, int] = {}
    split_lines: dict[str, dict[str, int]] = {}  # trajectory id -> {split: first line}
    frames_of: dict[str, tuple[str, int]] = {}
    match = layout.FRAMES_PATH_RE.match
    for o, lineno in zip(m.rows, m.lines, strict=True):
        if lineno >= next_note:
            k, next_note = _report_notes(notes, k, lineno, problems)
        pid, split = o.pair_id, o.split
        first = first_pair_line.setdefault(pid, lineno)
        if first != lineno:
            problems.append(f"{path}:{lineno}: duplicate pair_id {pid!r} (first on line {first})")
        split_ok = split in layout.SPLITS
        if not split_ok:
            problems.append(
                f"{path}:{lineno}: pair {pid!r}: split {split!r} is not one of {', '.join(layout.SPLITS)}"
            )
        for role, tid, fpath in (
            ("chosen", o.chosen_trajectory_id, o.chosen_frames_path),
            ("rejected", o.rejected_trajectory_id, o.rejected_frames_path),
        ):
            fm = match(fpath)
            if not fm:
                problems.append(
                    f"{path}:{lineno}: pair {pid!r}: {role}_frames_path {fpath!r} is not "
                    "processed_datasets/<cache_key>/frames/trajectory_<ID>.npz"
                )
            elif fm.group("id") != tid:
                problems.append(
                    f"{path}:{lineno}: pair {pid!r}: {role}_frames_path {fpath!r} names trajectory "
                    f"{fm.group('id')}, not its {role}_trajectory_id {tid}"
                )
            prev = frames_of.setdefault(tid, (fpath, lineno))
            if prev[0] != fpath:
                problems.append(
                    f"{path}:{lineno}: trajectory {tid} has frames path {fpath!r} here but {prev[0]!r} on line {prev[1]}"
                )
            if not split_ok:
                continue
            splits = split_lines.get(tid)
            if splits is None:
                split_lines[tid] = {split: lineno}
            elif split not in splits:
                for other, other_line in splits.items():
                    problems.append(
                        f"{path}:{lineno}: leakage: trajectory {tid} is used by a {split!r} pair here "
                        f"(pair {pid!r}) and by a {other!r} pair on line {other_line}"
                    )
                splits[split] = lineno
    problems.extend(msg for _, msg in notes[k:])
    return problems


_HEX_DIGITS = b"0123456789abcdef"


def _all_sha256(values: Sequence[str]) -> bool:
    """Every value is exactly 64 lowercase hex digits (C-level passes over all the values at once)."""
    joined = "".join(values)
    return (
        set(map(len, values)) <= {64}
        and joined.isascii()
        and not joined.encode().translate(None, _HEX_DIGITS)
    )


def _not_sha256(rows: Sequence[ActionLine], lines: Sequence[int]) -> set[int]:
    """The lines whose sidecar_sha256 is given but is not 64 lowercase hex digits."""
    given = [o.sidecar_sha256 for o in rows if o.sidecar_sha256 is not None]
    if _all_sha256(given):
        return set()
    return {
        line
        for o, line in zip(rows, lines, strict=True)
        if o.sidecar_sha256 is not None and not _all_sha256([o.sidecar_sha256])
    }


def check_actions(d: Path, files: Sequence[ManifestFile[ActionLine]]) -> list[str]:
    """Every problem of the decoded action manifests of folder ``d``, in file and line order: no
    manifest at all, the lines' own (``notes``), a duplicate ``stage2_trajectory_id`` (naming both
    file:line), ``source`` not equal to the file stem, a recovered row without sidecar path/sha256,
    a non-recovered row with a sidecar path, a sidecar_sha256 not 64 lowercase hex, a sidecar path
    not ``action_sidecars/<source>/trajectory_<ID>.npz`` for its own id and source."""
    problems: list[str] = []
    if not files:
        problems.append(f"{d}: no <source>.jsonl action manifest in this folder")
    first: dict[str, ActionLine] = {}  # id -> its first row
    where: dict[int, tuple[str, int]] = {}  # id(row) -> (file, line), made at the first duplicate
    sidecars_dir = layout.SIDECARS_DIR
    for m in files:
        fname = m.path
        stem = Path(fname).name[: -len(".jsonl")]
        notes = m.notes
        k, next_note = 0, notes[0][0] if notes else _NO_LINE
        bad_sha = _not_sha256(m.rows, m.lines)
        for o, lineno in zip(m.rows, m.lines, strict=True):
            if lineno >= next_note:
                k, next_note = _report_notes(notes, k, lineno, problems)
            tid, source, status = o.stage2_trajectory_id, o.source, o.status
            sp, sh = o.sidecar_path, o.sidecar_sha256
            prev = first.setdefault(tid, o)
            if prev is not o:
                where = where or {
                    id(r): (f.path, n) for f in files for r, n in zip(f.rows, f.lines, strict=True)
                }
                pfile, pline = where[id(prev)]
                problems.append(
                    f"{fname}:{lineno}: duplicate stage2_trajectory_id {tid} (first at {pfile}:{pline})"
                )
            if source != stem:
                problems.append(
                    f"{fname}:{lineno}: trajectory {tid}: source {source!r} is not the file's {stem!r}"
                )
            if status == RECOVERED:
                if not sp or not sh:
                    lacking = [f for f, v in zip(ACTION_OPTIONAL, (sp, sh), strict=True) if not v]
                    problems.append(
                        f"{fname}:{lineno}: trajectory {tid} is {RECOVERED!r} but has no {' / '.join(lacking)}"
                    )
            elif sp is not None:
                problems.append(
                    f"{fname}:{lineno}: trajectory {tid} has status {status!r} but a sidecar_path "
                    f"{sp!r} (only {RECOVERED!r} rows carry one)"
                )
            if bad_sha and lineno in bad_sha:
                problems.append(f"{fname}:{lineno}: trajectory {tid}: sidecar_sha256 is not 64 lowercase hex")
            if sp is not None and (
                sp != f"{sidecars_dir}/{source}/trajectory_{tid}.npz" or "/" in tid or "/" in source
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
        problems.extend(msg for _, msg in notes[k:])
    return problems


# ----------------------------------------------------------------------------------------------
# Public rows
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


def load_pairs(path: Path) -> tuple[list[PairRow], list[str]]:
    """Parse the pair manifest. Returns every structurally valid row (all seven fields present, all
    non-empty strings) and every problem found (see :func:`check_pairs`; also a malformed line and a
    missing / unknown field)."""
    m, problems = read_pair_manifest(path)
    return [
        PairRow(
            o.pair_id,
            o.split,
            o.task,
            o.chosen_trajectory_id,
            o.chosen_frames_path,
            o.rejected_trajectory_id,
            o.rejected_frames_path,
            line,
        )
        for o, line in zip(m.rows, m.lines, strict=True)
    ], problems


def load_action_manifests(dir: Path) -> tuple[list[ActionRow], list[str]]:
    """Parse every ``<source>.jsonl`` of the action manifest folder, in name order.

    Returns every structurally valid row (duplicates included, so row totals count lines) and every
    problem (see :func:`check_actions`; also a malformed line, a missing field, a wrong type)."""
    files, problems = read_action_manifests(dir)
    return [
        ActionRow(
            o.stage2_trajectory_id,
            o.source,
            o.cache_key,
            o.status,
            o.sidecar_path,
            o.sidecar_sha256,
            m.path,
            line,
        )
        for m in files
        for o, line in zip(m.rows, m.lines, strict=True)
    ], problems
