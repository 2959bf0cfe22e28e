"""Which members of an archive may be extracted, checked before anything is written.

Only regular files and directories inside the cache directory, in either member layout
(``processed_datasets/<key>/...`` or ``<key>/...``): no absolute path, no ``..``, no link, no device,
no FIFO, no duplicate. The checks are gathered and reported at once as an
:class:`~stage2_data.errors.UnsafeArchiveError`; Python's ``tarfile.data_filter`` is applied on top as
defense in depth.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass

from .. import layout
from ..errors import ArchiveError, UnsafeArchiveError

CACHE_KEY_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*$")
LAYOUT_PREFIXED = "processed_datasets/<key>/"
LAYOUT_BARE = "<key>/"
LAYOUT_MIXED = "mixed"

REDOWNLOAD_FIX = (
    "if the archive is not the pinned upstream file, delete it and re-run the build to download it again; "
    "if it is (its .verified.json record matches the pin), the upstream file itself is bad: list it under "
    "[[quarantined]] in the profile (or pin another revision) and report it upstream"
)
# Defense in depth: besides our own checks, a member must pass Python's tarfile 'data' filter. It
# runs in the planning step, before anything exists on disk, against a folder that does not exist
# (so its checks are about the names alone: our destination is a fresh folder we create and that
# never holds a link). Members that are plainly safe by a strict whitelist (a regular file or
# directory whose every name component starts with a letter, digit or '_' and uses only
# [A-Za-z0-9_.-]) skip it: the filter provably accepts them, and it costs ~30 us a member.
_FILTER_ROOT = "/.stage2-extract-check"
_PLAIN_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)
_PLAIN_NAME_RE = re.compile(r"^(?:\./)?[A-Za-z0-9_][\w.\-]*(?:/[A-Za-z0-9_][\w.\-]*)*/?$", re.ASCII)


@dataclass
class _Plan:
    dirs: list[tuple[str, tarfile.TarInfo]]  # (path relative to the cache dir, member)
    files: list[tuple[str, tarfile.TarInfo]]
    layout: str
    problems: list[tuple[str, str]]  # (member name, reason)


def _member_type_problem(m: tarfile.TarInfo) -> str:
    if m.issym():
        return f"is a symbolic link (-> {m.linkname!r}); links are refused"
    if m.islnk():
        return f"is a hard link (-> {m.linkname!r}); links are refused"
    if m.ischr():
        return "is a character device"
    if m.isblk():
        return "is a block device"
    if m.isfifo():
        return "is a FIFO"
    if m.issparse():
        return "is a sparse file"
    if not (m.isreg() or m.isdir()):
        return f"has unsupported member type {m.type!r} (only regular files and directories are allowed)"
    return ""


def _plan_members(members: Sequence[tarfile.TarInfo], cache_key: str) -> _Plan:
    problems: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    dirs: list[tuple[str, tarfile.TarInfo]] = []
    files: list[tuple[str, tarfile.TarInfo]] = []
    layouts: set[str] = set()
    for m in members:
        name = m.name
        reason = _member_type_problem(m)
        if reason:
            problems.append((name, reason))
            continue
        if name.startswith("/"):
            problems.append((name, "has an absolute path"))
            continue
        comps = [c for c in name.split("/") if c not in ("", ".")]
        if ".." in comps:
            problems.append((name, "has a '..' path component"))
            continue
        if not comps:  # "./" itself
            if not m.isdir():
                problems.append((name, "is not a directory"))
            continue
        if comps[0] == layout.PROCESSED_DIR:
            if len(comps) == 1:
                if not m.isdir():
                    problems.append((name, f"is not a directory but is named {layout.PROCESSED_DIR!r}"))
                continue
            if comps[1] != cache_key:
                problems.append(
                    (name, f"is outside the cache directory: it belongs to {comps[1]!r}, not {cache_key!r}")
                )
                continue
            rest = comps[2:]
            layouts.add(LAYOUT_PREFIXED)
        elif comps[0] == cache_key:
            rest = comps[1:]
            layouts.add(LAYOUT_BARE)
        else:
            problems.append(
                (
                    name,
                    f"is outside the cache directory: top-level entry {comps[0]!r} is neither "
                    f"{cache_key!r} nor '{layout.PROCESSED_DIR}/{cache_key}'",
                )
            )
            continue
        if not rest:
            if not m.isdir():
                problems.append((name, "is not a directory but names the cache directory itself"))
            continue
        rel = "/".join(rest)
        if rel in seen:
            problems.append((name, f"is a duplicate: same path as the earlier member {seen[rel]!r}"))
            continue
        seen[rel] = name
        if not (m.type in _PLAIN_TYPES and _PLAIN_NAME_RE.match(name)):
            try:  # defense in depth: Python's own 'data' extraction filter must agree
                tarfile.data_filter(m, _FILTER_ROOT)
            except tarfile.FilterError as e:
                problems.append((name, f"is refused by tarfile's data filter: {e}"))
                continue
        (dirs if m.isdir() else files).append((rel, m))
    file_paths = {rel for rel, _ in files}
    for rel, m in [*dirs, *files]:
        parts = rel.split("/")
        for k in range(1, len(parts)):
            anc = "/".join(parts[:k])
            if anc in file_paths:
                problems.append((m.name, f"lies under {anc!r}, which is a regular file in the archive"))
                break
    if not layouts:
        lay = LAYOUT_PREFIXED
    elif len(layouts) == 1:
        lay = next(iter(layouts))
    else:
        lay = LAYOUT_MIXED
    return _Plan(dirs=dirs, files=files, layout=lay, problems=problems)


def _unsafe_error(archive: str, problems: Sequence[tuple[str, str]]) -> UnsafeArchiveError:
    first_name, first_reason = problems[0]
    msg = f"unsafe archive {archive}: member {first_name!r} {first_reason}"
    if len(problems) > 1:
        shown = "; ".join(f"{n!r} {r}" for n, r in problems[1:20])
        more = f"; ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        msg += f"; and {len(problems) - 1} more refused member(s): {shown}{more}"
    return UnsafeArchiveError(msg + ". Nothing was extracted.", fix=REDOWNLOAD_FIX)


def _check_cache_key(cache_key: str) -> None:
    if not CACHE_KEY_RE.match(cache_key) or cache_key == layout.PROCESSED_DIR:
        raise ArchiveError(
            f"invalid cache key {cache_key!r}: it must be one folder name ({CACHE_KEY_RE.pattern}).",
            fix="fix the cache_key of this archive in the profile",
        )
