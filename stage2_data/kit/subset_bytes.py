"""The byte check: every file the kit's subset SHA256SUMS lists, hashed in parallel and compared;
plus the frame files the pairs use that SHA256SUMS does not list.

Which file a listed name stands for (:func:`listed_relpath`): the checksum file may have been
written from another folder than the data root, so a name is matched to a data-root path by these
rules, in order: ``.`` segments and repeated ``/`` are dropped (``./processed_datasets/...``); a
name holding ``processed_datasets/<cache_key>/frames/trajectory_<ID>.npz`` stands for that path
whatever precedes it (``/data/stage2/processed_datasets/...``, ``stage2/processed_datasets/...``);
``<cache_key>/frames/trajectory_<ID>.npz`` of a cache key of the profile (written from inside
``processed_datasets/``) stands for ``processed_datasets/<cache_key>/frames/...``; any other
plain relative path is relative to the data root. Anything else (absolute, ``..``) is reported,
not checked. Two names for one file are one entry (a second digest for it is a problem).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import layout
from ..extract import NotRegularFile, hash_regular_file
from ..formats.sha256sums import ChecksumEntry, read_sha256sums
from ..profile import Profile
from .manifests import load_pairs

__all__ = ["ByteReport", "verify_subset_bytes"]


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
    # each mismatched file as (data-root relative path, expected sha256, actual sha256, line)
    mismatched_entries: list[tuple[str, str, str, int]] = field(default_factory=list)
    # each missing file as (data-root relative path, expected sha256, line)
    missing_entries: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.mismatched or self.missing or self.unlisted or self.problems) and (
            self.matched == self.files
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


_FRAMES_TAIL_RE = re.compile(
    rf"(?:\A|/)(?P<rel>{layout.PROCESSED_DIR}/[^/]+/{layout.FRAMES_SUBDIR}/trajectory_[^/]+\.npz)\Z"
)


def _plain_relpath(rel: str) -> bool:
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in rel.split("/"))


def listed_relpath(name: str, cache_keys: frozenset[str] | set[str]) -> str | None:
    """The data-root relative path a name of the checksum file stands for (the rules in the
    module's docstring), or None when it stands for none."""
    absolute = name.startswith("/")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    norm = "/".join(parts)
    m = _FRAMES_TAIL_RE.search(norm)
    if m is not None:
        return m.group("rel")
    if absolute or not _plain_relpath(norm):
        return None
    if len(parts) == 3 and parts[0] in cache_keys and parts[1] == layout.FRAMES_SUBDIR:
        candidate = f"{layout.PROCESSED_DIR}/{norm}"
        if layout.FRAMES_PATH_RE.match(candidate):
            return candidate
    return norm


def _matched_entries(
    entries: list[ChecksumEntry], cache_keys: set[str], sums_path: Path, problems: list[str]
) -> list[ChecksumEntry]:
    """The entries with their names replaced by the data-root paths they stand for; one per path."""
    out: dict[str, ChecksumEntry] = {}
    for ent in entries:
        rel = listed_relpath(ent.path, cache_keys)
        if rel is None:
            problems.append(
                f"{sums_path}:{ent.line}: path {ent.path!r} is not a plain relative path; not checked"
            )
            continue
        first = out.get(rel)
        if first is None:
            out[rel] = ChecksumEntry(ent.digest, rel, ent.line)
        elif first.digest != ent.digest:
            problems.append(
                f"{sums_path}:{ent.line}: {ent.path!r} names {rel} again with another sha256 "
                f"{ent.digest} (line {first.line} says {first.digest})"
            )
    return list(out.values())


_FRAMES_NAME_RE = re.compile(r"trajectory_[^/]*?\.npz")


def _frames_named_by(lines: list[tuple[int, str]]) -> Callable[[str], bool]:
    """Whether a line of ``lines`` names a frames file (a data-root path), as written from the data
    root or from inside ``processed_datasets/``: its lines by file name, so each test is cheap."""
    by_name: dict[str, list[str]] = {}
    for _, text in lines:
        for name in set(_FRAMES_NAME_RE.findall(text)):
            by_name.setdefault(name, []).append(text)

    def named(rel: str) -> bool:
        tail = rel.split("/", 1)[-1]  # <cache_key>/frames/trajectory_<ID>.npz
        return any(tail in text for text in by_name.get(rel.rsplit("/", 1)[-1], ()))

    return named


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
    entries: list[ChecksumEntry] = []
    malformed: list[tuple[int, str]] = []
    try:
        # a malformed line is one problem; the well-formed lines are checked all the same
        sums = read_sha256sums(sums_path)
    except FileNotFoundError:
        problems.append(f"{sums_path}: subset checksum file does not exist")
    else:
        entries, malformed = sums.entries, sums.malformed
        problems.extend(sums.problems)
    todo = _matched_entries(entries, set(profile.cache_keys()), sums_path, problems)

    root = os.fspath(data_root) + os.sep

    odd: dict[str, str] = {}  # a listed path that is not a regular file: what it is

    def hash_chunk(rels: list[str]) -> list[tuple[str, str | None, int]]:
        out: list[tuple[str, str | None, int]] = []
        for rel in rels:
            try:  # never opens (nor blocks on) a FIFO, device or folder where a file should be
                sha, st = hash_regular_file(root + rel)
                out.append((rel, sha, st[1]))
            except (FileNotFoundError, NotADirectoryError):
                out.append((rel, None, 0))
            except NotRegularFile as e:
                odd[rel] = str(e)
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
    mismatched_entries: list[tuple[str, str, str, int]] = []
    missing_entries: list[tuple[str, str, int]] = []
    details: list[str] = []
    ok = 0
    total_bytes = 0
    for ent in todo:
        actual, size = results[ent.path]
        if ent.path in odd:
            problems.append(f"{sums_path}:{ent.line}: {odd[ent.path]}")
            continue
        if actual is None:
            missing.append(ent.path)
            missing_entries.append((ent.path, ent.digest, ent.line))
            details.append(f"{sums_path}:{ent.line}: {data_root / ent.path} is missing")
            continue
        total_bytes += size
        if actual == ent.digest:
            ok += 1
        else:
            mismatched.append(f"{ent.path}: expected {ent.digest}, actual {actual}")
            mismatched_entries.append((ent.path, ent.digest, actual, ent.line))
            details.append(
                f"{sums_path}:{ent.line}: {data_root / ent.path} has sha256 {actual}, expected {ent.digest}"
            )
    listed = {ent.path for ent in todo}
    pairs_path = profile.kit_file("pair_manifest")
    pairs, pair_problems = load_pairs(pairs_path)
    first_line: dict[str, int] = {}
    for r in pairs:
        for _, fp in r.trajectories():
            first_line.setdefault(fp, r.line)
    # a frames file that a malformed line names is reported by that line's problem alone (adding a
    # line for it would list it twice)
    named = _frames_named_by(malformed)
    unlisted = sorted(fp for fp in first_line if fp not in listed and not named(fp))
    details += [
        f"{pairs_path}:{first_line[fp]}: frames file {fp} is used by a pair but not listed in {sums_path}"
        for fp in unlisted
    ]
    if not pairs and pair_problems:
        problems.extend(pair_problems)
    return ByteReport(
        files=len(todo),
        bytes=total_bytes,
        matched=ok,
        mismatched=mismatched,
        missing=missing,
        unlisted=unlisted,
        seconds=time.perf_counter() - t0,
        problems=problems,
        details=problems + details,
        mismatched_entries=mismatched_entries,
        missing_entries=missing_entries,
    )
