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

CACHE_KEY_RE = re.compile(r"[A-Za-z0-9][\w.\-]*")  # whole names only: fullmatch
LAYOUT_PREFIXED = "processed_datasets/<key>/"
LAYOUT_BARE = "<key>/"
LAYOUT_MIXED = "mixed"

REDOWNLOAD_FIX = (
    "if the archive is not the pinned upstream file, delete it and re-run the build to download it again; "
    "if it is (its .verified.json record matches the pin), the upstream file itself is bad: list it under "
    "[[quarantined]] in the profile (or pin another revision) and report it upstream"
)


def quarantine_fix(archive: str) -> str:
    """The fix for a verified archive (its sha256 matched the pin) that cannot be extracted: its
    bytes are the pinned upstream's, so downloading it again cannot help."""
    return (
        f"{archive} is the pinned upstream file (its sha256 matches the pin), so downloading it again "
        "gives the same bytes: list it under [[quarantined]] in the profile (or pin another revision) "
        "and report it upstream"
    )


# Defense in depth: besides our own checks, a member must pass Python's tarfile 'data' filter. It
# runs in the planning step, before anything exists on disk, against a folder that does not exist
# (so its checks are about the names alone: our destination is a fresh folder we create and that
# never holds a link). Members that are plainly safe by a strict whitelist (a regular file or
# directory whose every name component starts with a letter, digit or '_' and uses only
# [A-Za-z0-9_.-]) skip it: the filter provably accepts them, and its cost a member adds up over
# archives of tens of thousands of members.
_FILTER_ROOT = "/.stage2-extract-check"
_PLAIN_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)
_PLAIN_NAME_RE = re.compile(
    r"(?:\./)?[A-Za-z0-9_][\w.\-]*(?:/[A-Za-z0-9_][\w.\-]*)*/?", re.ASCII
)  # fullmatch


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
        if not (m.type in _PLAIN_TYPES and _PLAIN_NAME_RE.fullmatch(name)):
            try:  # defense in depth: Python's own 'data' extraction filter must agree
                tarfile.data_filter(m, _FILTER_ROOT)
            except tarfile.FilterError as e:
                problems.append((name, f"is refused by tarfile's data filter: {e}"))
                continue
            except (ValueError, OSError) as e:  # e.g. a NUL in a pax name: the filter cannot judge it
                problems.append((name, f"has a name that cannot be checked ({type(e).__name__}: {e})"))
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


def _unsafe_error(
    archive: str, problems: Sequence[tuple[str, str]], *, verified: bool | None = None
) -> UnsafeArchiveError:
    """``verified``: the archive's sha256 matched its pin (then only the profile can fix it: the
    bytes downloaded again are the same), False: it did not (download it again), None: unknown."""
    first_name, first_reason = problems[0]
    msg = f"unsafe archive {archive}: member {first_name!r} {first_reason}"
    if len(problems) > 1:
        shown = "; ".join(f"{n!r} {r}" for n, r in problems[1:20])
        more = f"; ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        msg += f"; and {len(problems) - 1} more refused member(s): {shown}{more}"
    if verified:
        fix = quarantine_fix(archive)
    elif verified is False:
        fix = f"the file on disk is not the verified pinned one: delete {archive} and re-run the build to download it again"
    else:
        fix = REDOWNLOAD_FIX
    return UnsafeArchiveError(msg + ". Nothing was extracted.", fix=fix)


def other_cache_key(members: Sequence[tarfile.TarInfo], cache_key: str) -> str | None:
    """The one cache directory every member of the archive lies in, when it is not ``cache_key``
    (``<other>/...`` or ``processed_datasets/<other>/...``): the profile then names the wrong
    cache key for this archive (or lists the wrong archive for it). None otherwise."""
    tops: set[str] = set()
    for m in members:
        comps = [c for c in m.name.split("/") if c not in ("", ".")]
        if not comps or (comps == [layout.PROCESSED_DIR] and m.isdir()):
            continue
        key = comps[1] if comps[0] == layout.PROCESSED_DIR and len(comps) > 1 else comps[0]
        tops.add(key)
        if len(tops) > 1:
            return None
    if len(tops) != 1:
        return None
    (key,) = tops
    if key == cache_key or not CACHE_KEY_RE.fullmatch(key) or key in ("..", layout.PROCESSED_DIR):
        return None
    return key


def profile_mismatch_error(archive: str, found: str, cache_key: str) -> ArchiveError:
    return ArchiveError(
        f"archive {archive} holds the cache directory {found!r}, but the profile lists it for cache_key "
        f"{cache_key!r}. Nothing was extracted.",
        fix=f'in the profile, set cache_key = "{found}" for {archive} (or list the archive that holds '
        f"{cache_key!r}); downloading it again gives the same bytes",
    )


def _check_cache_key(cache_key: str) -> None:
    if not CACHE_KEY_RE.fullmatch(cache_key) or cache_key == layout.PROCESSED_DIR:
        raise ArchiveError(
            f"invalid cache key {cache_key!r}: it must be one folder name ({CACHE_KEY_RE.pattern}).",
            fix="fix the cache_key of this archive in the profile",
        )
