"""The profile file: a pydantic model of ``profile.toml`` (see docs/spec/profile.md).

Every problem (unknown key, missing key, wrong form, unsafe path, quarantined-and-active)
is reported at once, naming the key and the file, before anything is downloaded.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import stat
import tomllib
from collections import defaultdict
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from .errors import ProfileError, UnknownArchivesError
from .formats.sha256sums import file_kind, read_regular_bytes
from .hashing import SHA256_RE
from .layout import HEX40_RE, PARTIAL_DIR, VERIFIED_SUFFIX, action_manifest_paths, split_base

#: the default frame bound (upstream's current preprocessing keeps at most 32 frames; older sets 64)
DEFAULT_MAX_FRAMES = 32
#: the longest profile name: it names folders (stores/<name>/, quarantine/.../<name>/)
NAME_MAX = 100

KIT_KEYS = (
    "pair_manifest",
    "subset_checksums",
    "action_manifest_dir",
    "sidecar_archive",
    "sidecar_archive_sha256",
)


#: the error type of a problem Profile's cross-checks find between entries (a path listed twice, ...):
#: raised at the key it is about, which format_validation_error names with its line
CROSS_CHECK = "profile_cross_check"


def check_relpath(value: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty relative path")
    p = PurePosixPath(value)
    if value.startswith("/") or p.is_absolute() or "\\" in value:
        raise ValueError(f"{value!r} is absolute; use a plain relative path")
    if any(part == ".." for part in p.parts):
        raise ValueError(f"{value!r} contains '..'; use a plain relative path")
    if any(part in ("", ".") for part in value.split("/")):
        raise ValueError(f"{value!r} is not a plain relative path")
    return value


def check_full_commit(value: str) -> str:
    """A pinned revision: a full 40-hex commit (a pydantic validator; ValueError otherwise)."""
    if not HEX40_RE.match(value):
        raise ValueError(
            f"{value!r} is not a full 40-hex commit; a branch name, tag or short hash is never a pin "
            "(`stage2 pin PROFILE --write` resolves a branch, tag or short hash on the hub and writes "
            "the full commit it names)"
        )
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class SourceSpec(_Strict):
    repo_id: Annotated[str, Field(min_length=3, pattern=r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")]
    repo_type: Annotated[str, Field(pattern=r"^(dataset|model|space)$")] = "dataset"
    revision: str

    _revision = field_validator("revision")(lambda cls, v: check_full_commit(v))


class KitSpec(_Strict):
    pair_manifest: str
    subset_checksums: str
    action_manifest_dir: str
    sidecar_archive: str
    sidecar_archive_sha256: str

    _paths = field_validator(*KIT_KEYS)(lambda cls, v: check_relpath(v))


def check_archive_path(value: str) -> str:
    """An archive's path: a plain relative path that is none of the build's own files beside the
    archives (``archives/<path>.verified.json``, ``archives/.partial/``): a pin naming one would have
    the build judge, and move aside, its own record of a verified archive."""
    check_relpath(value)
    if value.endswith(VERIFIED_SUFFIX) or PurePosixPath(value).parts[0] == PARTIAL_DIR:
        raise ValueError(
            f"{value!r} names a file stage2 keeps beside the archives (a verified archive's record "
            f"ends in {VERIFIED_SUFFIX}; {PARTIAL_DIR}/ holds downloads in progress), not an "
            "archive of the repository: use the archive's own path (`stage2 pin PROFILE` lists the "
            "repository's files)"
        )
    return value


class ArchiveSpec(_Strict):
    path: str
    cache_key: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.\-]*$")]
    # a file larger than the largest file offset (2^63 - 1 bytes) cannot exist: a size beyond is a typo
    size: Annotated[int, Field(gt=0, lt=2**63, strict=True)] | None = None
    sha256: str | None = None
    # The upstream name of this entry is not known: ``path`` and ``cache_key`` are a guess, used only
    # by `stage2 pin` to name the closest existing files; never requested, downloaded or extracted.
    unknown: bool = False

    _p = field_validator("path")(lambda cls, v: check_archive_path(v))

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str | None) -> str | None:
        if v is not None and not SHA256_RE.match(v):
            raise ValueError(f"{v!r} is not a 64-hex lowercase sha256")
        return v

    @model_validator(mode="after")
    def _unknown_unpinned(self) -> ArchiveSpec:
        if self.unknown and (self.size is not None or self.sha256 is not None):
            raise ValueError(
                f"{self.path!r} is marked unknown = true and also has a size/sha256; an unknown name "
                "is never pinned: set path and cache_key to the upstream name, remove unknown, then run `stage2 pin`"
            )
        return self

    @property
    def pinned(self) -> bool:
        return not self.unknown and self.size is not None and self.sha256 is not None


class QuarantinedSpec(_Strict):
    path: str
    reason: str = ""

    _p = field_validator("path")(lambda cls, v: check_relpath(v))


#: The totals of every profile's ``[expected]`` table, in the order a profile file lists them.
EXPECTED_TOTALS = (
    "cache_dirs",
    "archives",
    "trajectories",
    "pair_rows",
    "unique_frame_files",
    "action_manifest_rows",
    "resolved_sidecars",
)


class ExpectedTotals(_Strict):
    cache_dirs: Annotated[int, Field(ge=0, strict=True)]
    archives: Annotated[int, Field(ge=0, strict=True)]
    trajectories: Annotated[int, Field(ge=0, strict=True)]
    pair_rows: Annotated[int, Field(ge=0, strict=True)]
    unique_frame_files: Annotated[int, Field(ge=0, strict=True)]
    action_manifest_rows: Annotated[int, Field(ge=0, strict=True)]
    resolved_sidecars: Annotated[int, Field(ge=0, strict=True)]
    sidecars_by_source: dict[str, Annotated[int, Field(ge=0, strict=True)]] = Field(default_factory=dict)
    # Optional extension (not in the spec's example): the raw action width each source must have.
    action_width_by_source: dict[str, Annotated[int, Field(gt=0, strict=True)]] = Field(default_factory=dict)


class Profile(_Strict):
    # a folder name under stores/, quarantine/ and the lease table: well within a file name's 255 bytes
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.\-]*$", max_length=NAME_MAX)]
    description: str = ""
    # the frame bound: a trajectory of more frames is refused (docs/spec/profile.md; 32 upstream)
    max_frames: Annotated[int, Field(gt=0, strict=True)] = DEFAULT_MAX_FRAMES
    source: SourceSpec
    kit: KitSpec
    archives: Annotated[list[ArchiveSpec], Field(min_length=1)]
    quarantined: list[QuarantinedSpec] = Field(default_factory=list)
    expected: ExpectedTotals

    # Where the file came from (not part of the TOML).
    profile_path: Path | None = Field(default=None, exclude=True)
    kit_root_dir: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _cross_checks(self) -> Profile:
        problems: list[InitErrorDetails] = []

        def problem(loc: tuple[str | int, ...], value: Any, said: str) -> None:
            # at the key it is about: format_validation_error names that key and its line
            problems.append(
                InitErrorDetails(
                    type=PydanticCustomError(CROSS_CHECK, "{problem}", {"problem": said}),
                    loc=loc,
                    input=value,
                )
            )

        seen: dict[str, int] = {}
        for i, a in enumerate(self.archives):
            if a.path in seen:
                problem(
                    ("archives", i, "path"),
                    a.path,
                    f"{a.path!r} is listed twice (also as archives[{seen[a.path]}].path); "
                    "remove one of the two entries",
                )
            seen.setdefault(a.path, i)
        for i, q in enumerate(self.quarantined):
            if q.path in seen:
                problem(
                    ("quarantined", i, "path"),
                    q.path,
                    f"{q.path!r} is also listed under [[archives]]; "
                    "a quarantined file is never downloaded: remove one of the two entries",
                )
        keys_by_base: dict[str, set[str]] = defaultdict(set)
        for a in self.archives:
            keys_by_base[split_base(a.path)].add(a.cache_key)
        for base, keys in keys_by_base.items():
            if len(keys) > 1:
                problem(
                    ("archives",), sorted(keys), f"parts of {base!r} name different cache_keys {sorted(keys)}"
                )
        bases_by_key: dict[str, set[str]] = defaultdict(set)
        for a in self.archives:
            bases_by_key[a.cache_key].add(split_base(a.path))
        for key, bases in bases_by_key.items():
            if len(bases) > 1:
                problem(("archives",), key, f"cache_key {key!r} is fed by several tars {sorted(bases)}")
        if problems:  # raised inside a validator, each keeps its loc in the model's ValidationError
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self

    # ----- derived views -------------------------------------------------------------------
    @property
    def kit_root(self) -> Path:
        if self.kit_root_dir is not None:
            return self.kit_root_dir
        if self.profile_path is not None:
            return self.profile_path.parent
        return Path.cwd()

    def kit_file(self, key: str) -> Path:
        return self.kit_root / getattr(self.kit, key)

    def kit_path_problems(self) -> list[str]:
        """Every kit path that is there but is not what it must be: a regular file (a link to one
        is followed), a folder for ``action_manifest_dir`` (and a regular file for each ``*.jsonl``
        in it). Stats only: nothing is opened, so a FIFO cannot block. A missing path is not a
        problem here (the step that needs it names it)."""
        problems: list[str] = []

        def check(label: str, path: Path, folder: bool) -> bool:
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                return False
            except OSError as e:
                problems.append(f"{label}: {path} cannot be examined ({e.strerror or e})")
                return False
            ok = stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)
            if not ok:
                want = "a folder" if folder else "a regular file"
                problems.append(f"{label}: {path} is {file_kind(st.st_mode)}, not {want}")
            return ok

        for key in KIT_KEYS:
            folder = key == "action_manifest_dir"
            path = self.kit_file(key)
            if check(f"[kit] {key}", path, folder) and folder:
                for f in action_manifest_paths(path):
                    if check(f"[kit] {key}", f, False) or not os.path.islink(f):
                        continue
                    if not os.path.exists(f):  # a link to nothing: the hashing steps would stop on it
                        problems.append(f"[kit] {key}: {f} is a symbolic link to nothing, not a regular file")
        return problems

    def require_kit_paths(self) -> None:
        """Raise ProfileError naming every kit path that is not a regular file (or folder)."""
        problems = self.kit_path_problems()
        if problems:
            raise ProfileError(
                f"profile {self.profile_path or self.name}: {len(problems)} kit path(s) are not regular "
                "files: " + "; ".join(problems),
                fix="put the kit's own files at those paths (a FIFO, device, socket or folder is never read)",
            )

    def require_kit_found(self) -> None:
        """Raise ProfileError when a kit file is missing: every stage after the downloads needs the
        whole kit, so a missing one is refused before any download (on the real profile, a typo in
        one ``[kit]`` path would cost ~107 GiB of downloads first). None found at all: the wrong
        folder was given (or the profile was copied away from its kit); some: each is named with
        its ``[kit]`` key, the line it is on in the profile, and the path it resolves to."""
        missing = [key for key in KIT_KEYS if not os.path.lexists(self.kit_file(key))]
        if not missing:
            return
        if len(missing) == len(KIT_KEYS):
            listed = "; ".join(f"{key} {self.kit_file(key)}" for key in missing)
            raise ProfileError(
                f"the kit root {self.kit_root} holds none of the kit's files (missing: {listed}).",
                fix="pass --kit-root the folder holding the kit (by default it is the profile's own folder)",
            )
        text = None
        if self.profile_path is not None:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = self.profile_path.read_text(encoding="utf-8-sig")
        named = []
        for key in missing:
            line = _key_line(text, "kit", key)
            at = f" (line {line})" if line else ""
            named.append(f"[kit] {key} = {getattr(self.kit, key)!r}{at}: {self.kit_file(key)} does not exist")
        where = self.profile_path or self.name
        raise ProfileError(
            f"profile {where}: {len(missing)} of the kit's {len(KIT_KEYS)} files are missing: "
            + "; ".join(named)
            + ".",
            fix=f"correct the path under [kit] in {where} (relative to the kit root {self.kit_root}), "
            "or put the kit's file there",
        )

    def archive(self, path: str) -> ArchiveSpec:
        for a in self.archives:
            if a.path == path:
                return a
        raise KeyError(path)

    def archive_paths(self) -> list[str]:
        return sorted(a.path for a in self.archives)

    def cache_keys(self) -> list[str]:
        return sorted({a.cache_key for a in self.archives})

    def archive_paths_largest_first(self) -> list[str]:
        """Archive paths, largest first (then by path): with several downloads at once, the last one
        ends soonest when the largest start first (a 20 GiB split part started last would run alone)."""
        return [a.path for a in sorted(self.archives, key=lambda a: (-(a.size or 0), a.path))]

    def cache_keys_largest_first(self) -> list[str]:
        """Cache keys by the bytes of their archives, largest first (then by key)."""
        by_key = self.archives_by_cache_key()
        return sorted(by_key, key=lambda k: (-sum(a.size or 0 for a in by_key[k]), k))

    def archives_by_cache_key(self) -> dict[str, list[ArchiveSpec]]:
        out: dict[str, list[ArchiveSpec]] = defaultdict(list)
        for a in self.archives:
            out[a.cache_key].append(a)
        return {k: sorted(v, key=lambda a: a.path) for k, v in sorted(out.items())}

    def quarantined_paths(self) -> set[str]:
        return {q.path for q in self.quarantined}

    def total_archive_bytes(self) -> int:
        return sum(a.size or 0 for a in self.archives)

    def unpinned(self) -> list[str]:
        return [a.path for a in self.archives if not a.pinned]

    def unknown_archives(self) -> list[tuple[int, ArchiveSpec]]:
        """(index, entry) of every ``[[archives]]`` entry marked ``unknown = true``."""
        return [(i, a) for i, a in enumerate(self.archives) if a.unknown]

    def require_known(self) -> None:
        """Raise UnknownArchivesError (before anything is requested) when an entry is marked unknown."""
        unknown = self.unknown_archives()
        if unknown:
            where = shlex.quote(str(self.profile_path)) if self.profile_path else "<profile>"
            raise UnknownArchivesError(
                f"profile {self.profile_path or self.name}: {len(unknown)} [[archives]] "
                f"entr{'y is' if len(unknown) == 1 else 'ies are'} marked unknown = true (their upstream "
                "names are not known, and nothing is ever requested under a guessed name): "
                + ", ".join(f"archives[{i}] ({a.path})" for i, a in unknown)
                + ".",
                fix=f"run `stage2 pin {where}`: it names the closest files "
                "in the hub's listing for each; set that entry's path and cache_key to the right one, "
                f"delete its `unknown = true` line, and run `stage2 pin {where} --write`",
                entries=[a.path for _, a in unknown],
            )

    def with_kit_root(self, kit_root: Path | None) -> Profile:
        if kit_root is None:
            return self
        return self.model_copy(update={"kit_root_dir": Path(kit_root)})

    def where_is(self, key: str) -> str:
        """Where the dotted ``key`` (``expected.trajectories``) is written: ``" in <profile>, line
        N"`` (the line left out when it is not written as ``key = ...`` under its own table); ""
        for a profile not read from a file."""
        if self.profile_path is None:
            return ""
        try:
            text = Path(self.profile_path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = None
        line = _loc_line(text, tuple(key.split(".")))
        return f" in {self.profile_path}" + (f", line {line}" if line else "")

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "repo_id": self.source.repo_id, "revision": self.source.revision}

    def to_toml(self) -> str:
        return dump_profile_toml(self)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


#: what a string key's pattern allows, in words (a pattern itself is no help to a user)
PATTERN_WORDS = {
    r"^[A-Za-z0-9][\w.\-]*$": "it may hold only letters, digits, '_', '.' and '-', and must start "
    "with a letter or a digit",
    r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$": "it must be OWNER/NAME, each of letters, digits, '_', '.' and "
    "'-', the owner starting with a letter or a digit (e.g. robometer/processed_datasets)",
    r"^(dataset|model|space)$": "it must be dataset, model or space",
}


#: pydantic's error types for a value that is not a whole number, in words that say what to write
_INT_TYPES = {"int_type", "int_parsing", "int_from_float"}


def format_validation_error(err: ValidationError, text: str | None = None) -> list[str]:
    """Each problem pydantic found, by key, with the value found and, given the file's ``text``,
    its line (the caller names the file once)."""
    problems = []
    for e in err.errors():
        parts = tuple(e.get("loc", ()))
        loc = _loc(parts)
        kind = e.get("type", "")
        line = _loc_line(text, parts, header=kind == "missing")
        at = f" (line {line})" if line else ""
        if kind == "extra_forbidden":
            problems.append(f"unknown key {loc!r}{at}; remove it or check its spelling")
        elif kind == "missing":
            problems.append(f"missing key {loc!r}" + (f" in the table at line {line}" if line else ""))
        elif kind == "string_pattern_mismatch":
            pattern = str((e.get("ctx") or {}).get("pattern"))
            said = PATTERN_WORDS.get(pattern, f"it must match the pattern {pattern!r}")
            problems.append(f"key {loc!r} = {e.get('input')!r}{at}: {said}")
        elif kind in _INT_TYPES:
            key = str(parts[-1]) if parts else "key"
            problems.append(
                f"key {loc!r} = {e.get('input')!r}{at}: it must be a whole number, written without "
                f"quotes or a decimal point (e.g. `{key} = 4096`)"
            )
        elif kind == CROSS_CHECK:  # Profile's cross-checks: the message quotes the value already
            problems.append(f"key {loc!r}{at}: {e.get('msg', '')}")
        else:
            msg = e.get("msg", "").removeprefix("Value error, ")
            shown = e.get("input")
            # a validator of ours quotes the value in its message already
            simple = isinstance(shown, str | int | float | bool) and kind != "value_error"
            value = f" = {shown!r}" if simple else ""
            problems.append(f"key {loc!r}{value}{at}: {msg}")
    return problems


def _loc_line(text: str | None, loc: tuple[Any, ...], *, header: bool = False) -> int | None:
    """The line (1-based) in the profile's ``text`` of the key at ``loc`` (``('archives', 0,
    'size')``: ``size = ...`` in the first ``[[archives]]`` table), or with ``header`` of the table
    that should hold it; None when it is not written as ``key = ...`` under its own header."""
    if text is None or not loc:
        return None
    table: tuple[Any, ...] = tuple(loc[:-1])
    key = str(loc[-1])
    here: tuple[Any, ...] = ()
    arrays: dict[str, int] = {}
    key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for n, line in enumerate(text.splitlines(), 1):
        if m := _ARRAY_HEADER_RE.match(line):
            name = re.sub(r"\s+", "", m.group(1))
            arrays[name] = arrays.get(name, -1) + 1
            here = (*name.split("."), arrays[name])
        elif m := _TABLE_RE.match(line):
            here = tuple(re.sub(r"\s+", "", m.group(1)).split("."))
        else:
            if not header and here == table and key_re.match(line):
                return n
            continue
        if header and here == table:
            return n
    return None


#: a TOML table header (``[expected]``, ``[ expected . sidecars_by_source ]``), not an array's
_TABLE_RE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\s\"']+?)\s*\]\s*(?:#.*)?$")
_ARRAY_RE = re.compile(r"^\s*\[\[")
_ARRAY_HEADER_RE = re.compile(r"^\s*\[\[\s*([A-Za-z0-9_.\s]+?)\s*\]\]\s*(?:#.*)?$")


def _key_line(text: str | None, table: str, key: str) -> int | None:
    """The line (1-based) of ``key = ...`` under ``[table]`` in the profile's text, when it is
    written so (an inline table or a dotted key elsewhere: None)."""
    if text is None:
        return None
    here: str | None = ""
    key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for n, line in enumerate(text.splitlines(), 1):
        if _ARRAY_RE.match(line):
            here = None
            continue
        m = _TABLE_RE.match(line)
        if m:
            here = re.sub(r"\s+", "", m.group(1))
            continue
        if here == table and key_re.match(line):
            return n
    return None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def totals_problems(data: dict[str, Any], text: str | None = None) -> tuple[list[str], dict[str, int]]:
    """The ``[expected]`` totals that the profile's own entries already contradict, read from the
    TOML alone (no download, no kit): ``archives`` (one per ``[[archives]]`` entry, unknown ones
    included), ``cache_dirs`` (one per distinct ``cache_key``), and ``resolved_sidecars`` against the
    sum of ``[expected.sidecars_by_source]`` (every resolved sidecar counts under its source). Works
    on the raw mapping, so these come with every other problem of the file; a value of the wrong
    form is left to the model. Returns (problems, {key: the value that matches})."""
    archives, expected = data.get("archives"), data.get("expected")
    if not isinstance(archives, list) or not isinstance(expected, dict):
        return [], {}
    problems: list[str] = []
    values: dict[str, int] = {}

    def named(key: str, value: int, table: str = "expected") -> str:
        line = _key_line(text, table, key)
        return f"key '{table}.{key}' = {value}" + (f" (line {line})" if line else "")

    keys = [a.get("cache_key") if isinstance(a, dict) else None for a in archives]
    declared = _count(expected.get("cache_dirs"))
    if declared is not None and all(isinstance(k, str) for k in keys):
        found = len(set(keys))
        if declared != found:
            values["cache_dirs"] = found
            problems.append(
                f"{named('cache_dirs', declared)}, but [[archives]] name {found} distinct "
                f"cache_key{'' if found == 1 else 's'} (one cache directory each): write "
                f"`cache_dirs = {found}` under [expected], or correct the entries' cache_key"
            )
    listed = len(archives)
    declared = _count(expected.get("archives"))
    if declared is not None and declared != listed:
        values["archives"] = listed
        problems.append(
            f"{named('archives', declared)}, but [[archives]] lists {listed} entr"
            f"{'y' if listed == 1 else 'ies'} (one per file, unknown ones included): write "
            f"`archives = {listed}` under [expected], or "
            + ("list the missing entries" if declared > listed else "remove the extra entries")
        )
    by_source = expected.get("sidecars_by_source")
    declared = _count(expected.get("resolved_sidecars"))
    if isinstance(by_source, dict) and by_source and declared is not None:
        counts = {s: _count(n) for s, n in by_source.items()}
        if all(n is not None for n in counts.values()):
            total = sum(n for n in counts.values() if n is not None)
            if total != declared:
                values["resolved_sidecars"] = total
                terms = " + ".join(f"{s} {n}" for s, n in sorted(counts.items()))
                problems.append(
                    f"{named('resolved_sidecars', declared)}, but [expected.sidecars_by_source] sums "
                    f"to {total} ({terms}), and every resolved sidecar counts under its source: write "
                    f"`resolved_sidecars = {total}` under [expected], or correct sidecars_by_source"
                )
    return problems, values


def parse_profile(
    data: dict[str, Any],
    *,
    source: str = "<profile>",
    path: Path | None = None,
    check_totals: bool = False,
    text: str | None = None,
) -> Profile:
    """The profile of ``data`` (a parsed TOML file), or ProfileError naming every problem at once.
    ``check_totals``: also the ``[expected]`` totals its own entries contradict (``totals_problems``:
    a profile file is held to them when it loads; one built in code, e.g. a test's, need not be);
    ``text`` (the file's text) lets those name their line."""
    problems: list[str] = []
    prof: Profile | None = None
    try:
        prof = Profile.model_validate(data)
    except ValidationError as e:
        problems = format_validation_error(e, text)
    totals, values = totals_problems(data, text) if check_totals else ([], {})
    if problems or totals:
        fix = "correct the named key(s) in the profile (see docs/spec/profile.md)"
        if totals:
            exact = ", ".join(f"`{k} = {v}`" for k, v in values.items())
            fix = (
                f"{fix}; " if problems else ""
            ) + f"under [expected], write {exact} (or correct what they count)"
            if "archives" in values or "cache_dirs" in values:
                fix += (
                    "; a profile whose archives changed also needs a kit made for those archives, and "
                    "that kit's totals (trajectories, pair_rows, ...) under [expected]"
                )
        raise ProfileError("invalid profile " + source + ": " + "; ".join(problems + totals), fix=fix)
    assert prof is not None
    if path is not None:
        prof = prof.model_copy(update={"profile_path": path})
    return prof


def load_profile(path: str | Path, *, kit_root: str | Path | None = None) -> Profile:
    p = Path(path).resolve()
    try:
        mode = os.stat(p).st_mode
    except OSError:
        mode = None
    if mode is None or not stat.S_ISREG(mode):
        what = "does not exist" if mode is None else f"is {file_kind(mode)}, not a regular file"
        raise ProfileError(f"profile file {p} {what}.", fix="pass the path of a profile .toml")
    try:
        # a UTF-8 byte-order mark (some Windows editors write one) is not part of the TOML
        text = read_regular_bytes(p).decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise ProfileError(
            f"profile {p} is not UTF-8 text ({e.reason} at byte {e.start}).", fix="save the profile as UTF-8"
        ) from None
    except OSError as e:
        raise ProfileError(
            f"profile {p} cannot be read: {e.strerror or e}.",
            fix="give this user read access to the profile (or pass another --profile)",
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"profile {p} is not valid TOML: {e}.", fix="correct the TOML syntax") from None
    except RecursionError:
        raise ProfileError(f"profile {p} is nested too deeply.", fix="correct the TOML") from None
    prof = parse_profile(data, source=str(p), path=p, check_totals=True, text=text).with_kit_root(
        Path(kit_root).resolve() if kit_root else None
    )
    prof.require_kit_paths()  # a FIFO, device or folder where a kit file should be: named, never read
    return prof


# ----- a small TOML writer (no extra dependency) ----------------------------------------------
def _tv(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(type(v))


def dump_profile_toml(prof: Profile) -> str:
    lines = [f"name = {_tv(prof.name)}", f"description = {_tv(prof.description)}"]
    if prof.max_frames != DEFAULT_MAX_FRAMES:
        lines.append(f"max_frames = {prof.max_frames}")
    lines += ["", "[source]"]
    for k in ("repo_id", "repo_type", "revision"):
        lines.append(f"{k} = {_tv(getattr(prof.source, k))}")
    lines += ["", "[kit]"]
    for k in KIT_KEYS:
        lines.append(f"{k} = {_tv(getattr(prof.kit, k))}")
    for a in prof.archives:
        lines += ["", "[[archives]]", f"path = {_tv(a.path)}", f"cache_key = {_tv(a.cache_key)}"]
        if a.size is not None:
            lines.append(f"size = {a.size}")
        if a.sha256 is not None:
            lines.append(f"sha256 = {_tv(a.sha256)}")
        if a.unknown:
            lines.append("unknown = true")
    for q in prof.quarantined:
        lines += ["", "[[quarantined]]", f"path = {_tv(q.path)}", f"reason = {_tv(q.reason)}"]
    e = prof.expected
    lines += ["", "[expected]"]
    lines += [f"{k} = {getattr(e, k)}" for k in EXPECTED_TOTALS]
    if e.sidecars_by_source:
        lines += ["", "[expected.sidecars_by_source]"]
        lines += [f"{k} = {v}" for k, v in sorted(e.sidecars_by_source.items())]
    if e.action_width_by_source:
        lines += ["", "[expected.action_width_by_source]"]
        lines += [f"{k} = {v}" for k, v in sorted(e.action_width_by_source.items())]
    return "\n".join(lines) + "\n"
