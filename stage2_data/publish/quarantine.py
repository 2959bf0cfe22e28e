"""Files set aside, never deleted: the quarantine folder of a data root.

A verified archive (a final file under ``archives/``) that disagrees with its pin, where the hub
does not say the pin is the wrong side, is moved, with its ``.verified.json`` record, to
``<data_root>/quarantine/<UTC time>/archives/<path>``: one new folder per move (named by its UTC
time, ``-1``, ``-2`` ... added when that name exists), so nothing there is ever overwritten. Each
folder holds a ``moved.json`` saying what was moved from where, and why. ``stage2 list`` shows the
files and their size; only ``stage2 gc STORES_DIR --quarantine`` removes them: exactly what a
``moved.json`` records, each named; whatever else is there (a user's notes, a folder with no
``moved.json``, a file put into a move's folder) is kept and named, never deleted. The same folder
takes what any step sets aside: a store that fails the publication gate, a ``current`` that is not
a link, a user's files in a folder extracted again (``extract/aside.py``).

A store's folder (``stores/<profile>/<name>``, moved as one unit) is removed file by file: its
``manifest.json`` and the files that manifest lists, then the folders left empty; anything else in
it (a note the user put there, a file shaped like a chunk that the manifest does not list) is kept
and named, as retention keeps such a store whole. A store whose ``manifest.json`` cannot be read is kept
whole and named (with its ``moved.json``): nothing in it is guessed to be the store's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import layout
from ..fsutil import human_bytes, shown
from ..oserrors import fs_error
from .atomic import atomic_write_json, fsync_dir

MOVED_FILE = "moved.json"
"""In each quarantine folder: what was moved there (from, to), when and why."""


@dataclass(frozen=True)
class QuarantinedFile:
    """A file in the quarantine folder of a data root."""

    path: Path  # where it is now
    original: str  # its path under the data root before the move (e.g. archives/x.tar)
    size: int
    folder: str  # the quarantine folder's name (its UTC time)
    reason: str  # why it was moved ("" when moved.json is missing)
    unit: str  # what one move put there that holds it (a store's folder, or the file itself)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "original": self.original,
            "size": self.size,
            "folder": self.folder,
            "reason": self.reason,
        }


def new_quarantine_folder(root: Path) -> Path:
    """A new, empty folder under ``root`` named by the UTC time (never an existing one)."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    n = 0
    while True:
        folder = root / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1


def _move(src: Path, dst: Path) -> None:
    """``src`` (a file, a link or a folder) moved to ``dst`` (absent): a rename, or across file
    systems a copy (links as links) made durable before the original is removed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        if stat.S_ISDIR(os.lstat(src).st_mode):
            shutil.copytree(src, dst, symlinks=True)
            for dirpath, _dirs, files in os.walk(dst):
                for name in files:
                    p = Path(dirpath) / name
                    if not p.is_symlink():
                        with open(p, "rb") as f:
                            os.fsync(f.fileno())
                fsync_dir(Path(dirpath))
            shutil.rmtree(src)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)
            if not dst.is_symlink():
                with open(dst, "rb") as f:
                    os.fsync(f.fileno())
            src.unlink()
    fsync_dir(dst.parent)
    fsync_dir(src.parent)


def quarantine_files(data_root: Path, files: list[Path], reason: str, **details: Any) -> list[Path]:
    """Move each of ``files`` that exists (paths under ``data_root``) into a new quarantine folder,
    keeping its path under the data root (:func:`quarantine_moves`). Returns the new paths, in the
    order given (absent files are left out)."""
    present = [(Path(f), Path(f)) for f in files if os.path.lexists(f)]
    return [b for _, b in quarantine_moves(data_root, present, reason, **details)]


def _quarantine_rel(data_root: Path, known_as: Path) -> Path:
    """Where ``known_as`` goes under a quarantine folder: its path under the data root; a store
    folder of a stores folder elsewhere (``--store-url file://...``: ``<url>/<profile>/<name>``) as
    the data root's own stores are, ``stores/<profile>/<name>`` (its ``moved.json`` says where it
    was)."""
    try:
        return known_as.relative_to(data_root)
    except ValueError:
        return Path(layout.STORES_DIR, known_as.parent.name, known_as.name)


def quarantine_moves(
    data_root: Path, moves: Sequence[tuple[Path, Path]], reason: str, *, doing: str = "", **details: Any
) -> list[tuple[Path, Path]]:
    """Move each ``(src, known_as)`` of ``moves`` into one new quarantine folder, at ``known_as``'s
    path under ``data_root`` (``known_as``: where the user knew it; ``src``: where it is now, the
    same path or a replaced folder's temp name); write that folder's ``moved.json`` (``reason``,
    ``details``, and from where to where, also when a move fails part way). Returns
    [(known_as, its new path)]. An ``OSError`` is raised as a named error (the path and the fix)."""
    data_root = Path(data_root)
    moved: list[tuple[Path, Path]] = []
    if not moves:
        return moved
    try:
        folder = new_quarantine_folder(layout.quarantine_root(data_root))
        try:
            for src, known_as in moves:
                dst = folder / _quarantine_rel(data_root, Path(known_as))
                _move(Path(src), dst)
                moved.append((Path(known_as), dst))
        finally:
            atomic_write_json(
                folder / MOVED_FILE,
                {
                    "moved_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "reason": reason,
                    "files": [{"from": str(a), "to": str(b)} for a, b in moved],
                    **details,
                },
            )
    except OSError as e:
        raise fs_error(
            e, doing or "moving a file aside into the quarantine folder", where=str(data_root)
        ) from e
    return moved


def _record(folder: Path) -> dict[str, Any]:
    """The folder's ``moved.json`` ({} when it is missing or unreadable)."""
    with contextlib.suppress(OSError, ValueError):
        import json

        doc = json.loads((folder / MOVED_FILE).read_text(encoding="utf-8"))
        if isinstance(doc, dict):
            return doc
    return {}


def _moved_units(folder: Path, record: dict[str, Any]) -> list[str]:
    """What one move put into ``folder``, as paths under it (``archives/x.tar``, a store's folder
    ``stores/<profile>/<name>``): the ``to`` of each entry of its ``moved.json``, read relative to
    the folder's own name, so a data root moved elsewhere since still reads."""
    units: list[str] = []
    files = record.get("files")
    for entry in files if isinstance(files, list) else []:
        to = entry.get("to") if isinstance(entry, dict) else None
        parts = Path(str(to)).parts if to else ()
        if folder.name in parts:
            rel = parts[len(parts) - parts[::-1].index(folder.name) :]
            if rel:
                units.append(Path(*rel).as_posix())
    return units


def quarantined_files(data_root: Path, *, records: bool = False) -> list[QuarantinedFile]:
    """Every file (and symbolic link, never followed) in the quarantine folders of ``data_root`` (its
    ``moved.json`` files left out, and the archives' ``.verified.json`` records unless ``records``),
    sorted by folder and path."""
    root = layout.quarantine_root(Path(data_root))
    out: list[QuarantinedFile] = []
    if not root.is_dir():
        return out
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        record = _record(folder)
        reason = str(record.get("reason") or "")
        units = _moved_units(folder, record)
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            # a link to a folder (a cache folder's link moved aside) is one entry: never followed
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            for name in sorted([*filenames, *links]):
                p = Path(dirpath) / name
                rel = p.relative_to(folder)
                if rel.as_posix() == MOVED_FILE:
                    continue
                if not records and name.endswith(layout.VERIFIED_SUFFIX):
                    continue
                try:
                    size = p.lstat().st_size
                except OSError:
                    continue
                original = rel.as_posix()
                unit = next((u for u in units if original == u or original.startswith(u + "/")), original)
                out.append(QuarantinedFile(p, original, size, folder.name, reason, unit))
    return out


@dataclass(frozen=True)
class MovedItem:
    """One thing moved aside: an archive, or a whole folder (a store that failed the publication
    gate), with how many of the quarantine folder's files it holds and their size."""

    path: Path  # where it is now
    original: str  # its path under the data root before the move
    folder: str  # the quarantine folder's name (its UTC time)
    reason: str
    is_dir: bool
    files: int
    size: int

    def line(self) -> str:
        what = f"folder of {self.files} file(s), " if self.is_dir else ""
        return f"{self.folder}/{shown(self.original)}{'/' if self.is_dir else ''}  {what}{human_bytes(self.size)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "original": self.original,
            "folder": self.folder,
            "reason": self.reason,
            "is_dir": self.is_dir,
            "files": self.files,
            "size": self.size,
        }


def moved_items(files: list[QuarantinedFile], data_root: Path) -> list[MovedItem]:
    """``files`` (from :func:`quarantined_files`) grouped by what was moved: a store moved aside is
    one item, not its thousands of chunk files; a file no ``moved.json`` names is an item of its
    own. In the order of ``files``."""
    root = layout.quarantine_root(Path(data_root))
    items: dict[tuple[str, str], list[QuarantinedFile]] = {}
    for f in files:
        items.setdefault((f.folder, f.unit), []).append(f)
    out = []
    for (folder, unit), members in items.items():
        path = root / folder / unit
        is_dir = path.is_dir() and not path.is_symlink()
        out.append(
            MovedItem(
                path, unit, folder, members[0].reason, is_dir, len(members), sum(m.size for m in members)
            )
        )
    return out


@dataclass(frozen=True)
class KeptEntry:
    """Something that ``gc`` keeps because it may be a user's: in the quarantine folder, what
    stage2 did not move there (no ``moved.json`` records it) or what is in a store moved there and
    not the store's; in ``unused/``, what a cache directory's extraction record does not list."""

    path: Path  # where it is
    rel: str  # its path under the data root (quarantine/...)
    is_dir: bool
    why: str

    def line(self) -> str:
        return f"kept ({self.why}): {shown(self.rel)}{'/' if self.is_dir else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "rel": self.rel, "is_dir": self.is_dir, "why": self.why}


NOT_MOVED = "not moved there by stage2"


@dataclass
class QuarantineRemoval:
    """What ``remove_quarantine`` removed (or, for a dry run, would remove), and what it kept."""

    root: Path
    dry_run: bool
    files: list[QuarantinedFile]
    items: list[MovedItem]
    kept: list[KeptEntry] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def lines(self) -> list[str]:
        """One line per thing moved aside (a store's folder is one line), one per thing kept (and
        why), then the totals."""
        verb = "would remove" if self.dry_run else "removed"
        if not self.items and not self.kept:
            return [f"quarantine {self.root}: empty, nothing {'to remove' if self.dry_run else 'removed'}"]
        out = [f"quarantine {self.root}:"]
        out += [f"  {verb}  {item.line()}" for item in self.items]
        out += [f"  {k.line()}" for k in self.kept]
        total = f"quarantine: {verb} {len(self.files)} file(s), {human_bytes(self.bytes)}"
        if self.kept:
            total += f"; kept {len(self.kept)} item(s) that are not what stage2 moved there (named above)"
        out.append(total)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "dry_run": self.dry_run,
            "files": [f.to_dict() for f in self.files],
            "moved": [item.to_dict() for item in self.items],
            "kept": [k.to_dict() for k in self.kept],
            "removed_files": 0 if self.dry_run else len(self.files),
            "bytes": self.bytes,
        }


def _safe_unit(unit: str) -> bool:
    """``unit`` (from a ``moved.json``) names a path inside its folder: not the record itself, no
    ``..``."""
    parts = Path(unit).parts
    return bool(parts) and ".." not in parts and not Path(unit).is_absolute() and unit != MOVED_FILE


def _plan_folder(folder: Path, units: list[str]) -> tuple[list[str], list[tuple[str, bool]]]:
    """What of ``folder`` (one move's quarantine folder) its recorded ``units`` are (removable, in
    walk order) and what else is in it (kept: (path under the folder, is a folder)). A path to a
    unit is followed only through real folders: a link on the way is kept, never followed."""
    wanted = {u for u in units if _safe_unit(u)}
    removable: list[str] = []
    kept: list[tuple[str, bool]] = []

    def visit(d: Path, prefix: str) -> None:
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = prefix + e.name
            if rel == MOVED_FILE:
                continue
            if rel in wanted:
                removable.append(rel)
                continue
            is_dir = e.is_dir(follow_symlinks=False)
            if is_dir and any(u.startswith(rel + "/") for u in wanted):
                visit(Path(e.path), rel + "/")
            else:
                kept.append((rel, is_dir))

    visit(folder, "")
    return removable, kept


def _is_store_unit(folder: Path, unit: str) -> bool:
    """``unit`` (a thing one move put into ``folder``) is a store's folder: ``stores/<profile>/<name>``,
    a real folder."""
    parts = Path(unit).parts
    if len(parts) != 3 or parts[0] != layout.STORES_DIR:
        return False
    try:
        return stat.S_ISDIR(os.lstat(folder / unit).st_mode)
    except OSError:
        return False


def _manifest_paths(store: Path) -> tuple[set[str] | None, str]:
    """The paths the store's ``manifest.json`` lists (its own files and every shard's), or None
    and why it cannot be read (missing, not a regular file, not JSON, its file lists not lists of
    relative paths inside the store)."""
    import json

    from ..formats.sha256sums import file_kind

    manifest = store / "manifest.json"
    try:
        st = os.lstat(manifest)
        if not stat.S_ISREG(st.st_mode):
            return None, f"it is {file_kind(st.st_mode)}, not a regular file"
        with open(manifest, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return None, "there is none"
    except (OSError, ValueError) as e:
        return None, f"not JSON: {e}" if isinstance(e, ValueError) else (e.strerror or str(e))
    return manifest_listed_paths(doc)


def manifest_listed_paths(doc: Any) -> tuple[set[str] | None, str]:
    """The paths a store's manifest (``doc``, as parsed) lists: its own files and every shard's;
    or None and why they cannot be read (not an object, file lists that are not lists of relative
    paths inside the store)."""
    if not isinstance(doc, dict):
        return None, "not a JSON object"
    lists: list[Any] = [doc.get("files", [])]
    shards = doc.get("shards", [])
    if not isinstance(shards, list) or not all(isinstance(sh, dict) for sh in shards):
        return None, "its shards are not a list of objects"
    lists += [sh.get("files", []) for sh in shards]
    paths: set[str] = set()
    for files in lists:
        for entry in files if isinstance(files, list) else [None]:
            path = entry.get("path") if isinstance(entry, dict) else None
            if (
                not isinstance(path, str)
                or not path
                or path.startswith("/")
                or any(part in ("", ".", "..") for part in path.split("/"))
            ):
                return None, "its file lists are not lists of paths inside the store"
            paths.add(path)
    return paths, ""


def _plan_store(store: Path) -> tuple[list[str], list[tuple[str, bool, str]]] | str:
    """What of a store's folder moved aside is the store's: its files (paths under ``store``,
    ``manifest.json`` last, and the files its manifest lists: nothing else, whatever its name), and
    what else is in it (kept: path under ``store``, is a folder, why; a folder
    holding nothing of the store's is one entry). A reason (str) when its manifest cannot be read:
    then the whole folder is kept."""
    from ..formats.sha256sums import file_kind

    listed, why = _manifest_paths(store)
    if listed is None:
        return why
    files: list[str] = []
    kept: list[tuple[str, bool, str]] = []

    def visit(d: Path, prefix: str) -> bool:
        """Sort out ``d``'s entries; True when something of the store's is under it."""
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        found = False
        for e in entries:
            rel = prefix + e.name
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                mark = len(kept)
                if visit(Path(e.path), rel + "/"):
                    found = True
                else:  # nothing of the store's in it: kept as one entry
                    del kept[mark:]
                    kept.append((rel, True, "not the store's: no file of the store is in it"))
                continue
            ours = rel == "manifest.json" or rel in listed
            if ours and stat.S_ISREG(st.st_mode):
                if rel != "manifest.json":
                    files.append(rel)
                found = True
            elif ours:
                kept.append((rel, False, f"{file_kind(st.st_mode)} where the store has a file"))
            else:
                kept.append((rel, False, "not the store's: its manifest.json does not list it"))
        return found

    visit(store, "")
    if (store / "manifest.json").is_file():
        files.append("manifest.json")  # last: a store without its manifest is never complete
    return files, kept


def _remove_store_files(store: Path, files: list[str]) -> None:
    """``files`` (paths under ``store``) removed, then every folder under ``store`` (and ``store``)
    they leave empty, deepest first; a folder still holding something kept stays."""
    dirs: set[Path] = {store}
    for rel in files:
        p = store / rel
        p.unlink()
        dirs.update(q for q in p.parents if store in q.parents)
    for d in sorted(dirs, key=lambda q: len(q.parts), reverse=True):
        try:
            d.rmdir()
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                raise


def _remove_entry(path: Path) -> None:
    """``path`` removed: a link or a file unlinked (a link is never followed), a folder with all in
    it."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _prune_empty(start: Path, stop: Path) -> None:
    """The empty folders from ``start`` up to ``stop`` (included) removed; the first that is not
    empty ends it."""
    d = start
    while True:
        try:
            d.rmdir()
        except OSError:
            return
        if d == stop:
            return
        d = d.parent


def remove_quarantine(data_root: Path, *, dry_run: bool) -> QuarantineRemoval:
    """Remove what stage2 moved into the quarantine folder of ``data_root``: in each move's folder,
    each thing its ``moved.json`` records (a store's folder, an archive, its ``.verified.json``
    record, a link, removed as a link), then that ``moved.json``. Everything else there is kept and
    named (:class:`KeptEntry`): a file or link at the top of the quarantine folder, a folder with no
    ``moved.json``, anything in a move's folder its ``moved.json`` does not record; the folders that
    hold it stay. A dry run removes nothing and says what it would remove and keep."""
    data_root = Path(data_root)
    root = layout.quarantine_root(data_root)
    top = root.name
    kept: list[KeptEntry] = []
    plan: dict[str, list[str]] = {}  # quarantine folder name -> its units to remove
    reasons: dict[str, str] = {}
    # (quarantine folder name, a store's unit) -> the store's files (paths under the unit)
    store_files: dict[tuple[str, str], list[str]] = {}
    whole: set[str] = set()  # quarantine folders with a store kept whole: their moved.json stays
    try:
        entries = sorted(root.iterdir()) if root.is_dir() else []  # as the moves, through a link
        for entry in entries:
            if not stat.S_ISDIR(os.lstat(entry).st_mode):  # a file or a link: no move makes one here
                kept.append(KeptEntry(entry, f"{top}/{entry.name}", False, NOT_MOVED))
                continue
            record = _record(entry)
            units = _moved_units(entry, record)
            if not units:
                why = f"{NOT_MOVED}: no {MOVED_FILE} records anything in it"
                kept.append(KeptEntry(entry, f"{top}/{entry.name}", True, why))
                continue
            removable, others = _plan_folder(entry, units)
            for unit in [u for u in removable if _is_store_unit(entry, u)]:
                store_plan = _plan_store(entry / unit)
                rel_unit = f"{top}/{entry.name}/{unit}"
                if isinstance(store_plan, str):
                    removable.remove(unit)
                    whole.add(entry.name)
                    why = (
                        f"a store moved aside whose manifest.json cannot be read ({store_plan}): kept "
                        "whole, nothing in it is guessed to be the store's; remove it yourself if you "
                        "no longer need it"
                    )
                    kept.append(KeptEntry(entry / unit, rel_unit, True, why))
                    continue
                store_files[(entry.name, unit)], inside = store_plan
                for rel, is_dir, why in inside:
                    kept.append(KeptEntry(entry / unit / rel, f"{rel_unit}/{rel}", is_dir, why))
            plan[entry.name] = removable
            reasons[entry.name] = str(record.get("reason") or "")
            for rel, is_dir in others:
                why = f"{NOT_MOVED}: its {MOVED_FILE} does not record it"
                kept.append(KeptEntry(entry / rel, f"{top}/{entry.name}/{rel}", is_dir, why))
    except OSError as e:
        raise fs_error(e, "reading the quarantine folder", where=str(root)) from e
    ours = {k: {f"{k[1]}/{rel}" for rel in v} for k, v in store_files.items()}

    def removed(f: QuarantinedFile) -> bool:
        if f.unit not in plan.get(f.folder, ()):
            return False
        if (f.folder, f.unit) in ours:  # a store: only its own files
            return f.original in ours[(f.folder, f.unit)]
        return f.original == f.unit or f.original.startswith(f.unit + "/")

    files = [f for f in quarantined_files(data_root, records=True) if removed(f)]
    items = moved_items(files, data_root)  # read before the folders go
    listed = {(i.folder, i.original) for i in items}
    for name, units in plan.items():  # a recorded empty folder is removed too: listed as well
        for unit in units:
            if (name, unit) not in listed:
                path = root / name / unit
                is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
                items.append(MovedItem(path, unit, name, reasons[name], is_dir, 0, 0))
    items.sort(key=lambda i: i.folder)  # stable: within a folder, the walk's order
    if not dry_run:
        for name, units in plan.items():
            folder = root / name
            try:
                for unit in units:
                    path = folder / unit
                    if (name, unit) in store_files:
                        _remove_store_files(path, store_files[(name, unit)])
                        if os.path.lexists(path):  # what was kept in it stays, and its folders
                            continue
                    else:
                        _remove_entry(path)
                    if path.parent != folder:
                        _prune_empty(path.parent, folder / Path(unit).parts[0])
                if name not in whole:  # a store kept whole keeps the record of why it was moved
                    (folder / MOVED_FILE).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    folder.rmdir()  # stays when anything is kept in it
            except OSError as e:
                raise fs_error(e, "removing the quarantine folder", where=str(folder)) from e
        with contextlib.suppress(OSError):
            root.rmdir()  # stays when anything is kept in it
    return QuarantineRemoval(root, dry_run, files, items, kept)
