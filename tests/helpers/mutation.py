"""The mutation bench: a built data root, one file mutated, `stage2 build` again, and the verdict.

A :class:`Bench` builds the demo once (the clean data root and its fingerprint), then keeps a
working copy of it. :meth:`Bench.run` applies one :class:`Mutation` to the working copy, runs
``stage2 build --json`` (a subprocess, the real client against a loopback hub), and judges it:

- pass A (refused): the build exits 1 or 2 with a named error (``--json`` ``errors``, none saying
  "internal error", no traceback); once the mutated files are restored (their original bytes put
  back) or removed (a stray), the next build exits 0 and the published store's content is clean;
- pass B (accepted): the build exits 0 and the published store's content is clean;
- always: every archive of the clean build is still in the data root, at its place or moved aside
  under ``quarantine/`` with the same bytes, and a mutated archive's bytes are not deleted either
  (moved aside, never removed: it had been verified).

"Clean content" is recomputed from the published store's bytes, never read from its manifest:
``store_fingerprint`` hashes every file of the store (the recomputation ``validate --deep`` does)
and must give the clean build's fingerprint (the content equality of docs/spec/vin-store.md), and
``validate --deep --decode`` of ``current`` must find no problem.

After every mutation the working copy is brought back to the clean content (restore, rebuild); when
it cannot be, the verdict says so and the working copy is replaced by a fresh copy of the clean
build (settled by one build, so that its stat records are its own).
"""

from __future__ import annotations

import bisect
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stage2_data import layout

# --------------------------------------------------------------------------------------------------
# file classes
# --------------------------------------------------------------------------------------------------
CLASSES = (
    "archives",  # archives/*.tar, *.part-*
    "archive_records",  # archives/*.verified.json
    "frames",  # processed_datasets/<key>/frames/*.npz
    "extracted_metadata",  # processed_datasets/<key>/** but the frames (arrow, json)
    "sidecars",  # derived/action_sidecars/**
    "reports",  # extraction_report.json, reports/** but the records
    "join_table",  # tables/trajectory_join.parquet
    "store_chunks",  # stores/<p>/<current>/shards/**/c/**
    "store_metadata",  # zarr.json, sample_index.jsonl, pairs.jsonl, splits/*
    "manifests",  # stores/<p>/<current>/manifest.json
    "records",  # reports/store_stage.json, reports/extraction/*.json, derived/.*.json, other records
)

MUTATIONS = ("flip", "edit", "truncate", "delete", "add", "swap")

# Never mutated: the build's Dagster instance, the lock, what was set aside, downloads in progress,
# the leases and the `current` link (a link, not a file of the store).
_SKIP_TOP = {".dagster", layout.LOCK_FILE, layout.QUARANTINE_DIR}


def classify(rel: str, current: str | None) -> str | None:
    """The class of the data-root file ``rel`` (posix, relative), or None when it is never mutated.
    ``current``: ``stores/<profile>/<target>`` of the published store."""
    parts = rel.split("/")
    top = parts[0]
    name = parts[-1]
    if top in _SKIP_TOP:
        return None
    if top == layout.ARCHIVES_DIR:
        if layout.PARTIAL_DIR in parts:
            return None
        if name.endswith(layout.VERIFIED_SUFFIX):
            return "archive_records"
        return "archives"
    if top == layout.PROCESSED_DIR:
        if len(parts) >= 4 and parts[2] == layout.FRAMES_SUBDIR:
            return "frames"
        return "extracted_metadata"
    if top == layout.DERIVED_DIR:
        if len(parts) >= 2 and parts[1] == layout.SIDECARS_DIR:
            return "sidecars"
        return "records"
    if rel == layout.EXTRACTION_REPORT:
        return "reports"
    if top == layout.REPORTS_DIR:
        if rel == f"{layout.REPORTS_DIR}/store_stage.json" or (len(parts) >= 2 and parts[1] == "extraction"):
            return "records"
        return "reports"
    if top == layout.TABLES_DIR:
        return "join_table"
    if top == layout.STORES_DIR:
        if current is None or not rel.startswith(current + "/"):
            return None  # other stores, the leases, the `current` link
        inner = rel[len(current) + 1 :].split("/")
        if inner == ["manifest.json"]:
            return "manifests"
        if inner[0] == "shards" and "c" in inner[:-1]:
            return "store_chunks"
        return "store_metadata"
    if name.endswith(".json"):
        return "records"
    return None


def current_target(root: Path) -> str | None:
    """``stores/<profile>/<target>`` of the published store (the first profile with a ``current``)."""
    stores = root / layout.STORES_DIR
    if not stores.is_dir():
        return None
    for prof in sorted(stores.iterdir()):
        link = prof / layout.CURRENT_LINK
        if link.is_symlink():
            return f"{layout.STORES_DIR}/{prof.name}/{os.readlink(link)}"
    return None


def files_by_class(root: Path) -> dict[str, list[str]]:
    """Every regular file of the data root that may be mutated, by class (sorted relative paths)."""
    current = current_target(root)
    out: dict[str, list[str]] = {c: [] for c in CLASSES}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in _SKIP_TOP]
        for n in filenames:
            rel = n if rel_dir == "." else f"{rel_dir}/{n}"
            p = Path(dirpath, n)
            if p.is_symlink() or not p.is_file():
                continue
            cls = classify(rel, current)
            if cls is not None:
                out[cls].append(rel)
    for v in out.values():
        v.sort()
    return out


# --------------------------------------------------------------------------------------------------
# mutations
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mutation:
    """One mutation of one file (two for ``swap``). ``pos`` and ``mask`` are taken modulo what the
    file allows (a byte offset, a truncation length, a character to change), so any integers do."""

    cls: str
    kind: str
    path: str
    partner: str | None = None  # swap: the other file of the same class
    pos: int = 0
    mask: int = 1  # flip/edit: the XOR mask (1..255); add: which stray

    def describe(self) -> str:
        extra = f" <-> {self.partner}" if self.partner else ""
        return f"{self.cls}/{self.kind} {self.path}{extra} (pos={self.pos}, mask={self.mask})"


@dataclass
class Applied:
    """What a mutation changed: each touched path's original bytes (None: it did not exist)."""

    originals: dict[str, bytes | None]
    note: str = ""


_TEXT_SUFFIXES = (".json", ".jsonl", ".toml", ".txt")


def _stray_name(name: str, mask: int) -> str:
    """A plausible new sibling of ``name``: another chunk index, another trajectory, another split
    part, or the same name with ``.stray`` before its suffixes."""
    if name.isdigit():
        return str(int(name) + 1 + mask % 3)
    m = re.match(r"\A(trajectory_)(.+)(\.npz)\Z", name)
    if m:
        return f"{m.group(1)}{m.group(2)[:-6]}stray{mask % 10}{m.group(3)}"
    m = layout.SPLIT_PART_RE.match(name)
    if m:
        return f"{m.group('base')}.part{m.group('sep')}zz"
    stem, dot, rest = name.partition(".")
    return f"{stem}.stray{mask % 10}{dot}{rest}" if dot else f"{name}.stray{mask % 10}"


def _edit_text(data: bytes, pos: int, mask: int) -> bytes | None:
    """A same-size edit that keeps a text file well-formed: one digit becomes another digit, one
    letter another letter of its kind (a hex digit stays a hex digit). None when not text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    spots = [i for i, c in enumerate(text) if c.isascii() and c.isalnum()]
    if not spots:
        return None
    i = spots[pos % len(spots)]
    c = text[i]
    step = 1 + mask % 5
    if c.isdigit():
        new = str((int(c) + step) % 10)
    elif c in "abcdef":
        new = "abcdef"[("abcdef".index(c) + step) % 6]
    elif c.islower():
        new = chr((ord(c) - 97 + step) % 26 + 97)
    else:
        new = chr((ord(c) - 65 + step) % 26 + 65)
    return (text[:i] + new + text[i + 1 :]).encode("utf-8")


_LETTER_RUN = re.compile(rb"[A-Za-z][A-Za-z ]{3,}")


def _edit_letters(data: bytes, pos: int, mask: int) -> bytes | None:
    """A same-size edit of a binary file that changes one letter of a run of at least four
    letters and spaces (a string stored in it: a task text, a column name): the first such letter
    at or after byte ``pos`` (modulo the size). None when there is none."""
    spots = [i for mt in _LETTER_RUN.finditer(data) for i in range(mt.start(), mt.end()) if data[i] != 32]
    if not spots:
        return None
    k = bisect.bisect_left(spots, pos % len(data))
    i = spots[k % len(spots)]
    c = data[i]
    base = 97 if c >= 97 else 65
    new = (c - base + 1 + mask % 25) % 26 + base
    return data[:i] + bytes([new]) + data[i + 1 :]


def _write_keep_times(p: Path, data: bytes, st: os.stat_result) -> None:
    """Write ``data`` into ``p`` in place (same inode), then put its access and modification times
    back (the change time still tells)."""
    with open(p, "r+b") as f:
        f.write(data)
        f.truncate(len(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def apply(root: Path, m: Mutation) -> Applied:
    """Apply ``m`` to the data root ``root``; return the original bytes of every path it touched."""
    p = root / m.path
    data = p.read_bytes()
    st = p.stat()
    originals: dict[str, bytes | None] = {m.path: data}
    if m.kind == "flip":
        if not data:
            p.write_bytes(b"\x01")
            return Applied(originals, "empty file: one byte written")
        off = m.pos % len(data)
        with open(p, "r+b") as f:
            f.seek(off)
            f.write(bytes([data[off] ^ (1 + m.mask % 255)]))
        return Applied(originals, f"byte {off} flipped")
    if m.kind == "edit":
        if p.name.endswith(_TEXT_SUFFIXES):
            new = _edit_text(data, m.pos, m.mask)
        elif m.mask % 2 == 0:
            new = _edit_letters(data, m.pos, m.mask)  # a string inside a binary file (a task text)
        else:
            new = None
        if new is None:
            if not data:
                return Applied(originals, "empty file: nothing to edit")
            off = m.pos % len(data)
            n = min(1 + m.mask % 8, len(data) - off)
            new = data[:off] + bytes(b ^ (1 + m.mask % 255) for b in data[off : off + n]) + data[off + n :]
        _write_keep_times(p, new, st)
        return Applied(originals, "same-size edit, times restored")
    if m.kind == "truncate":
        size = m.pos % len(data) if data else 0
        with open(p, "r+b") as f:
            f.truncate(size)
        return Applied(originals, f"truncated to {size} of {len(data)} bytes")
    if m.kind == "delete":
        p.unlink()
        return Applied(originals, "deleted")
    if m.kind == "add":
        stray = p.with_name(_stray_name(p.name, m.mask))
        if stray.exists():
            stray = p.with_name(f"{p.name}.stray")
        stray.write_bytes(data)
        rel = stray.relative_to(root).as_posix()
        return Applied({rel: None}, f"added {rel} (a copy of {m.path})")
    if m.kind == "swap":
        assert m.partner is not None
        q = root / m.partner
        other = q.read_bytes()
        qst = q.stat()
        originals[m.partner] = other
        _write_keep_times(p, other, st)
        _write_keep_times(q, data, qst)
        return Applied(originals, "contents exchanged, times restored")
    raise ValueError(f"unknown mutation {m.kind!r}")


def restore(root: Path, applied: Applied) -> list[str]:
    """Put every touched path back: the original bytes where they differ (or the file is gone), a
    stray removed. Returns the paths changed."""
    changed: list[str] = []
    for rel, data in applied.originals.items():
        p = root / rel
        if data is None:
            if p.is_file() or p.is_symlink():
                p.unlink()
                changed.append(rel)
            continue
        if p.is_file() and p.read_bytes() == data:
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() or p.is_symlink():
            p.unlink()
        p.write_bytes(data)
        changed.append(rel)
    return changed


# --------------------------------------------------------------------------------------------------
# builds and judging
# --------------------------------------------------------------------------------------------------
@dataclass
class Built:
    """One finished `stage2 build --json`."""

    rc: int
    stdout: str
    stderr: str
    seconds: float
    doc: dict[str, Any] | None = None

    def errors(self) -> list[str]:
        errs = self.doc.get("errors") if isinstance(self.doc, dict) else None
        return [str(e) for e in errs] if isinstance(errs, list) else []

    def first_error(self) -> str:
        errs = self.doc.get("errors") if isinstance(self.doc, dict) else None
        if isinstance(errs, list) and errs:
            e = errs[0]
            text = str(e.get("message", e)) if isinstance(e, dict) else str(e)
            return text.splitlines()[0][:300]
        tail = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return tail[-1][:300] if tail else "(no output)"


@dataclass
class Verdict:
    """How the build took one mutation (one step of a chain): ``outcome`` is "refused" (pass A),
    "accepted" (pass B) or "escape"; ``problems`` says what went wrong for an escape. ``chain``: the
    mutations of the chain before this one, still in place when it was applied."""

    mutation: Mutation
    outcome: str
    note: str
    first: Built
    chain: list[Mutation] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rerun: Built | None = None
    published: str = ""  # the content fingerprint of what `current` holds after the mutated build

    @property
    def escape(self) -> bool:
        return bool(self.problems)

    def summary(self) -> str:
        lines = [f"- {self.mutation.describe()}: {self.note}"]
        lines += [f"  after (still in place, accepted by earlier builds): {c.describe()}" for c in self.chain]
        lines += [
            f"  build: exit {self.first.rc} in {self.first.seconds:.1f} s"
            + (f"; first error: {self.first.first_error()}" if self.first.rc else ""),
            f"  published content after it: {self.published or '(none)'}",
        ]
        if self.rerun is not None:
            err = f"; first error: {self.rerun.first_error()}" if self.rerun.rc else ""
            lines.append(f"  rerun after restore: exit {self.rerun.rc}{err}")
        lines += [f"  ESCAPE: {p}" for p in self.problems]
        return "\n".join(lines)


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def published_fingerprint(root: Path) -> str | None:
    """The content fingerprint of the published store, recomputed from its bytes (None: no store,
    or none can be computed)."""
    from stage2_data.errors import Stage2Error
    from stage2_data.store.manifest import store_fingerprint

    target = current_target(root)
    if target is None:
        return None
    try:
        return store_fingerprint(root / target)
    except (OSError, Stage2Error):
        return None


def content_of(root: Path) -> tuple[str | None, list[str]]:
    """The published store's content fingerprint recomputed from its bytes (every file hashed, as
    ``validate --deep`` does), and the problems ``validate --deep --decode`` finds in it."""
    from stage2_data.errors import Stage2Error
    from stage2_data.store.manifest import store_fingerprint
    from stage2_data.store.validate import validate_vin_offline_store

    target = current_target(root)
    if target is None:
        return None, ["no published store (no stores/<profile>/current)"]
    store = root / target
    try:
        fp = store_fingerprint(store)
    except (OSError, Stage2Error) as e:
        return None, [f"cannot recompute the fingerprint of {target}: {e}"]
    try:
        problems = validate_vin_offline_store(store, deep=True, decode=True)
    except Exception as e:  # noqa: BLE001 - a crash of validation is itself a finding
        problems = [f"validate --deep --decode raised {type(e).__name__}: {e}"]
    return fp, problems


class Bench:
    """The clean build and a working copy to mutate (see the module docstring).

    Mutations come in chains: :meth:`step` applies one and builds; an accepted mutation stays in
    place for the next step of the chain (a latent change an accepted build left behind must not
    reach a store rebuilt later), a refused one ends the chain. :meth:`end_chain` restores every
    mutation still in place and checks that a build converges to the clean content."""

    def __init__(
        self,
        profile: Path,
        endpoint: str,
        base: Path,
        *,
        log: Callable[[str], None] = print,
        escapes_file: Path | None = None,
    ) -> None:
        self.profile = profile
        self.endpoint = endpoint
        self.base = base
        self.log = log
        self.escapes_file = escapes_file
        self.clean = base / "clean"
        self.work = base / "work"
        self.env = {k: v for k, v in os.environ.items() if k.upper() not in ("DAGSTER_HOME", "CI")}
        self.env.pop("HF_HUB_OFFLINE", None)
        # Set per chain: its builds run with HF_HUB_OFFLINE=1 (nothing can be downloaded again, so a
        # damaged archive must be refused and moved aside, never deleted).
        self.offline = False
        self.pending: list[tuple[Mutation, Applied, dict[str, str]]] = []
        self.resets = 0
        self.builds = 0
        first = self.build(self.clean)
        assert first.rc == 0, first.stdout[-3000:] + first.stderr[-3000:]
        fp, problems = content_of(self.clean)
        assert fp is not None and not problems, problems
        self.fingerprint = fp
        self.first_build_seconds = first.seconds
        noop = self.build(self.clean)
        assert noop.rc == 0, noop.stdout[-3000:] + noop.stderr[-3000:]
        self.noop_seconds = noop.seconds
        # every archive of the clean build, by path: its sha256
        self.archives = {rel: _sha256(self.clean / rel) for rel in files_by_class(self.clean)["archives"]}
        self.reset()

    def lane(self, name: str, *, log: Callable[[str], None]) -> Bench:
        """A bench of its own over the same clean build: its own working copy (``work-<name>``),
        chain and counts, so that two lanes of mutations run side by side, one on each core."""
        other = copy.copy(self)
        other.work = self.base / f"work-{name}"
        other.log = log
        other.pending = []
        other.offline = False
        other.resets = 0
        other.builds = 0
        other.reset()
        return other

    # -- builds ------------------------------------------------------------------------------------
    def build(self, root: Path) -> Built:
        argv = [
            sys.executable,
            "-m",
            "stage2_data.cli",
            "build",
            "--profile",
            str(self.profile),
            "--data-root",
            str(root),
            "--endpoint",
            self.endpoint,
            "--json",
            "--no-progress",
            "--concurrency",
            "2",
        ]
        t0 = time.monotonic()
        try:
            env = {**self.env, "HF_HUB_OFFLINE": "1"} if self.offline else self.env
            p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = -9, str(e.stdout or ""), f"timed out after 600 s\n{e.stderr or ''}"
        self.builds += 1
        built = Built(rc, out, err, time.monotonic() - t0)
        try:
            doc = json.loads(out)
            built.doc = doc if isinstance(doc, dict) else None
        except ValueError:
            built.doc = None
        return built

    def reset(self) -> None:
        """A fresh working copy of the clean build, settled by one build (its own stat records)."""
        self.pending = []
        self.offline = False
        if self.work.exists():
            shutil.rmtree(self.work)
        shutil.copytree(self.clean, self.work, symlinks=True)
        settle = self.build(self.work)
        assert settle.rc == 0, settle.stdout[-3000:] + settle.stderr[-3000:]
        fp, problems = content_of(self.work)
        assert fp == self.fingerprint and not problems, (fp, problems)
        self.resets += 1

    def candidates(self, cls: str) -> list[str]:
        """The files of class ``cls`` in the working copy now (sorted)."""
        return files_by_class(self.work)[cls]

    # -- judging -----------------------------------------------------------------------------------
    def _archives_kept(self) -> list[str]:
        """Every clean archive still in the data root (at its place or under quarantine/, same
        bytes), unless a mutation still in place changed it; and the bytes of every mutated archive
        not deleted (moved aside at most: it had been verified)."""
        root = self.work
        where: set[str] = set()
        quarantine = root / layout.QUARANTINE_DIR
        for top in (root / layout.ARCHIVES_DIR, quarantine):
            for dirpath, dirnames, filenames in os.walk(top):
                if Path(dirpath).parent == quarantine:  # quarantine/<UTC time>/: stores moved aside
                    # hold no archive; hashing them all at every step grew with each one moved
                    dirnames[:] = [d for d in dirnames if d != layout.STORES_DIR]
                for n in filenames:
                    p = Path(dirpath, n)
                    if p.is_file() and not p.is_symlink() and not n.endswith(layout.VERIFIED_SUFFIX):
                        where.add(_sha256(p))
        in_place = {rel for _, a, _ in self.pending for rel in a.originals}
        problems = [
            f"verified archive {rel} is gone (neither at its place nor under quarantine/)"
            for rel, sha in sorted(self.archives.items())
            if rel not in in_place and sha not in where
        ]
        for m, _, mutated in self.pending:
            if m.cls != "archives":
                continue
            problems += [
                f"the mutated verified archive {rel} was deleted (its bytes are neither at its place nor "
                "under quarantine/): a verified file is moved aside, never deleted"
                for rel, sha in sorted(mutated.items())
                if sha not in where and sha not in self.archives.values()
            ]
        return problems

    def _named_error_problems(self, b: Built) -> list[str]:
        problems: list[str] = []
        if b.rc not in (1, 2):
            problems.append(f"exit {b.rc} (a refusal exits 1 or 2; 3 is an internal error)")
        if b.doc is None:
            problems.append("no --json result on stdout")
        elif not b.errors():
            problems.append("a non-zero exit with no error in --json errors")
        text = b.stdout + b.stderr
        if "internal error" in text.lower():
            line = next(ln for ln in text.splitlines() if "internal error" in ln.lower())
            problems.append(f"'internal error' in the output: {line.strip()[:300]}")
        if "Traceback (most recent call last)" in text:
            problems.append("a traceback in the output")
        return problems

    def _converged(self) -> tuple[Built | None, list[str]]:
        """Restore every mutation still in place (newest first, so the oldest original wins), then,
        if anything was put back, one build that must exit 0 with the clean content published."""
        changed: list[str] = []
        for _, applied, _ in reversed(self.pending):
            changed += restore(self.work, applied)
        problems: list[str] = []
        self.pending = []
        if not changed:
            return None, problems
        rerun = self.build(self.work)
        fp, found = content_of(self.work)
        if rerun.rc != 0:
            problems.append(
                f"after the mutated files were restored ({', '.join(sorted(set(changed)))}), the rerun "
                f"exits {rerun.rc}: {rerun.first_error()}"
            )
        elif fp != self.fingerprint or found:
            problems.append(
                f"after the restore, the rerun exits 0 but the published content is {fp} "
                f"(clean: {self.fingerprint}); validation: {found[:3]}"
            )
        return rerun, problems + [f"after the restore: {p}" for p in self._archives_kept()]

    # -- chains ------------------------------------------------------------------------------------
    def step(self, m: Mutation) -> Verdict:
        """Apply ``m`` to the working copy (on top of the chain's accepted mutations), build, judge.
        A refusal or an escape ends the chain (restore, converge); an accepted mutation stays."""
        chain = [c for c, _, _ in self.pending]
        applied = apply(self.work, m)
        mutated = {
            rel: _sha256(self.work / rel)
            for rel, orig in applied.originals.items()
            if orig is not None and (self.work / rel).is_file()
        }
        self.pending.append((m, applied, mutated))
        before = published_fingerprint(self.work)
        first = self.build(self.work)
        v = Verdict(m, "", applied.note + (" (offline builds)" if self.offline else ""), first, chain)
        fp, store_problems = content_of(self.work)
        v.published = fp or ""
        if first.rc == 0:
            v.outcome = "accepted"
            if not (isinstance(first.doc, dict) and first.doc.get("ok") is True):
                v.problems.append("exit 0 but the --json result is not ok: true")
            if fp != self.fingerprint:
                v.problems.append(
                    f"exit 0 with a published store whose content gives {fp} (clean: {self.fingerprint})"
                )
            v.problems += [f"exit 0 but validate --deep --decode of current: {p}" for p in store_problems[:5]]
        else:
            v.outcome = "refused"
            v.problems += self._named_error_problems(first)
            if fp not in (None, self.fingerprint, before):
                v.problems.append(
                    f"exit {first.rc}, but `current` now holds a store whose content gives {fp} (before the "
                    f"build: {before}; clean: {self.fingerprint}): a refused build published other content"
                )
        v.problems += self._archives_kept()
        if first.rc != 0 or v.problems:
            v.rerun, more = self._converged()
            v.problems += more
        if v.problems:
            v.outcome = "escape"
            self._record(v)
            self.reset()  # whatever the escape left behind is not carried into the next mutation
        return v

    def end_chain(self) -> list[str]:
        """Restore what the chain left in place and check a build converges; the problems found
        (recorded as an escape of the chain's last mutation)."""
        if not self.pending:
            return []
        chain = [c for c, _, _ in self.pending]
        rerun, problems = self._converged()
        if problems:
            v = Verdict(chain[-1], "escape", "end of chain", rerun or Built(0, "", "", 0.0), chain[:-1])
            v.problems = problems
            v.rerun = rerun
            self._record(v)
            self.reset()
        return problems

    def run(self, m: Mutation) -> Verdict:
        """One mutation as a chain of its own: step, then end the chain."""
        v = self.step(m)
        if not v.escape:
            more = self.end_chain()
            if more:
                v.problems += more
                v.outcome = "escape"
        return v

    def _record(self, v: Verdict) -> None:
        self.log("ESCAPE\n" + v.summary())
        if self.escapes_file is not None:
            with open(self.escapes_file, "a") as f:
                f.write(v.summary() + "\n")
