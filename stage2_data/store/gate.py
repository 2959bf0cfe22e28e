"""The publication gate: the one full check a store passes before it is published, re-published (a
kept store the profile returns to), resumed (a folder a stopped build left) or reused, whatever path
led there (docs/spec/vin-store.md, "Publication gate").

The gate is :func:`~.validate.validate_vin_offline_store` with ``deep`` and ``decode``: every file
of the store hashed against the manifest and the content recomputed from those hashes (it must give
the manifest's fingerprint), every sample decoded as the reader does and compared with its
``frames_sha256``. For a build, the store must also be the build's own (:func:`other_build`: the
manifest's profile, inputs and writer options), checked first. A local store is made read-only first (stage2_data/publish/readonly.py) and the
(inode, size, mtime, ctime) of every entry is taken before the check and again after it: a store
that changed while it was checked fails. Those stats are what a no-op rebuild compares against
(:func:`tree_stats`): only a rebuild that publishes nothing may skip the gate, and only while every
entry still has the stats the last passed gate recorded.

A store holds regular files and folders only. A symbolic link's own stats say nothing of the file
it points at (that file may be replaced or edited while no entry of the store changes), and a FIFO
or a device may block or never end when read; so the validation fails a local store holding any
other entry, naming it, before anything is read through it (:func:`non_regular_entries`), and
:func:`tree_stats` marks such an entry so that a tree holding one never equals a passed gate's
record.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StoreError
from ..formats.sha256sums import file_kind
from ..publish.readonly import make_read_only
from ..storage import StoreLocation


@dataclass
class GateResult:
    """What the gate found: ``problems`` (empty: the store may be published), the ``stats`` of every
    entry of a local store as checked (None on object storage), and how long it took."""

    problems: list[str]
    stats: dict[str, list[int]] | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def tree_stats(root: Path) -> dict[str, list[int]] | None:
    """(inode, size, mtime_ns, ctime_ns) of every entry under ``root`` by relative path (folders
    end with ``/``; one walk, no file read, no link followed); None when ``root`` is not a folder.
    Size and mtime can be kept while bytes change; ctime cannot.

    An entry that is neither a regular file nor a folder (a symbolic link, a FIFO, a socket, a
    device) has a fifth value, its file type (``stat.S_IFMT``): the gate fails a store holding one,
    so no passed gate's record holds such an entry, and a tree holding one never equals a record
    (not even one that holds the link's own four stats)."""
    try:
        if not root.is_dir():
            return None
    except OSError:
        return None
    out: dict[str, list[int]] = {}
    stack = [(str(root), "")]
    while stack:
        path, rel = stack.pop()
        with os.scandir(path) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                is_dir = e.is_dir(follow_symlinks=False)
                name = f"{rel}{e.name}{'/' if is_dir else ''}"
                out[name] = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
                if is_dir:
                    stack.append((e.path, name))
                elif not stat.S_ISREG(st.st_mode):
                    out[name].append(stat.S_IFMT(st.st_mode))
    return out


def non_regular_entries(root: Path) -> list[str]:
    """Every entry under ``root`` that is neither a regular file nor a folder, as a problem naming
    it and what it is (a link: and where it points); sorted by path (one walk, no file read)."""
    out: list[str] = []
    for rel, st in sorted((tree_stats(root) or {}).items()):
        if len(st) < 5:
            continue
        kind = file_kind(st[4])
        if st[4] == stat.S_IFLNK:
            with contextlib.suppress(OSError):
                kind += f" to {os.readlink(root / rel)}"
        out.append(f"{root / rel}: {kind}, not a regular file (a store holds only regular files and folders)")
    return out


def other_build(loc: StoreLocation, expect: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Problems when the manifest at ``loc`` records another build than ``expect`` says: for each
    manifest key (``profile``, ``inputs``, ``options``), the values it must hold, each key named
    when it differs. A store that validates holds what its manifest says, not what this build
    would write: a store of other inputs (a copy, a folder restored under another name) is never
    published for this build. [] when the manifest is unreadable (the validation names that)."""
    from .manifest import read_manifest

    try:
        manifest = read_manifest(loc)
    except StoreError:
        return []
    out: list[str] = []
    for field_name, want in expect.items():
        have = manifest.get(field_name)
        have = have if isinstance(have, dict) else {}
        keys = set(want) if field_name == "options" else set(want) | set(have)
        differ = sorted(k for k in keys if have.get(k) != want.get(k))
        if differ:
            shown = ", ".join(f"{k}: {have.get(k)!r}, this build {want.get(k)!r}" for k in differ[:3])
            more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
            out.append(
                f"{loc.url}/manifest.json: {field_name} not this build's ({shown}{more}): "
                "a store of other inputs under this build's name"
            )
    return out


def publication_gate(
    loc: StoreLocation, expect: Mapping[str, Mapping[str, Any]] | None = None, **validate_kw: Any
) -> GateResult:
    """Run the full check on the store at ``loc`` (see the module's docstring). With ``expect``,
    the store must also be this build's (:func:`other_build`): checked first, from the manifest
    alone. ``validate_kw`` is passed to the validation (``storage_options``)."""
    from .validate import validate_vin_offline_store  # zarr: not for a no-op build's tree_stats

    t0 = time.perf_counter()
    if expect:
        foreign = other_build(loc, expect)
        if foreign:
            return GateResult(foreign, None, time.perf_counter() - t0)
    before: dict[str, list[int]] | None = None
    if loc.is_local:
        try:
            make_read_only(loc.root)
        except OSError as e:  # a store we cannot protect is still checked; the gate says so
            notes = [f"could not make {loc.root} read-only ({e})"]
        else:
            notes = []
        before = tree_stats(loc.root)
    else:
        notes = []
    problems = validate_vin_offline_store(loc, deep=True, decode=True, **validate_kw)
    after = tree_stats(loc.root) if loc.is_local else None
    if not problems and before != after:
        problems.append(
            f"{loc.url}: changed while it was checked (check again; is another process writing it?)"
        )
    return GateResult(problems, after if not problems else None, time.perf_counter() - t0, notes)
