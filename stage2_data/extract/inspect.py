"""What an extracted cache directory holds: counts cross-checked, its rows, stray entries."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa

from .. import layout
from ..errors import ArchiveError
from ..formats import FormatError
from ..formats import arrow as farrow
from ..fsutil import tree_usage
from ..publish import is_temp_name
from ..publish.quarantine import KeptEntry

_MAX_LISTED = 100  # per-kind cap on listed ids in inspection problems (the count is always given)


@dataclass
class CacheDirInfo:
    """What an extracted cache directory holds. ``total_trajectories`` is -1 when
    ``dataset_info.json`` is missing or unreadable (that is then one of the ``problems``)."""

    cache_key: str
    frame_ids: set[str]
    rows: int
    row_ids: list[str]
    total_trajectories: int
    problems: list[str]


def _listed(kind: str, ids: Sequence[str]) -> list[str]:
    out = [f"{kind}: {i}" for i in ids[:_MAX_LISTED]]
    if len(ids) > _MAX_LISTED:
        out.append(f"{kind}: ... and {len(ids) - _MAX_LISTED} more")
    return out


def inspect_cache_dir(cache_dir: Path) -> CacheDirInfo:
    """Count and cross-check an extracted cache directory: ``dataset_info.json``'s
    ``total_trajectories``, ``frames/trajectory_<ID>.npz`` files and the ids of the
    ``processed_dataset/*.arrow`` rows. Every disagreement is a line of ``problems``."""
    cache_dir = Path(cache_dir)
    key = cache_dir.name
    problems: list[str] = []
    if not cache_dir.is_dir():
        return CacheDirInfo(key, set(), 0, [], -1, [f"{key}: cache directory {cache_dir} does not exist"])

    total = -1
    info_path = cache_dir / "dataset_info.json"
    if not info_path.is_file():
        problems.append(f"{key}: missing dataset_info.json")
    else:
        try:
            doc = json.loads(info_path.read_text(encoding="utf-8"))
            t = doc.get("total_trajectories") if isinstance(doc, dict) else None
            if isinstance(t, int) and not isinstance(t, bool) and t >= 0:
                total = t
            else:
                problems.append(f"{key}: dataset_info.json has no valid total_trajectories (got {t!r})")
        except (OSError, ValueError) as e:
            problems.append(f"{key}: dataset_info.json is not valid JSON: {e}")

    frame_ids: set[str] = set()
    frames_dir = cache_dir / layout.FRAMES_SUBDIR
    if not frames_dir.is_dir():
        problems.append(f"{key}: missing {layout.FRAMES_SUBDIR}/ folder")
    else:
        odd: list[str] = []
        with os.scandir(frames_dir) as it:
            for entry in it:
                m = layout.FRAME_FILE_RE.match(entry.name)
                if m and entry.is_file(follow_symlinks=False):
                    frame_ids.add(m.group("id"))
                else:
                    odd.append(entry.name)
        problems.extend(_listed(f"{key}: unexpected entry in {layout.FRAMES_SUBDIR}/", sorted(odd)))

    row_ids: list[str] = []
    shards = farrow.list_shards(cache_dir)
    if not shards:
        problems.append(f"{key}: no processed_dataset/*.arrow files")
    for shard in shards:
        rel = f"processed_dataset/{shard.name}"
        try:
            with farrow.arrow_batches(shard) as (schema, batches):
                if "id" not in schema.names:
                    problems.append(f"{key}: {rel} has no 'id' column (columns: {', '.join(schema.names)})")
                    continue
                for batch in batches:
                    col = batch.column("id")
                    if col.null_count:
                        problems.append(f"{key}: {rel} has {col.null_count} row(s) with a null id")
                    row_ids.extend(str(v) for v in col.to_pylist() if v is not None)
        except FormatError as e:
            problems.append(f"{key}: {rel}: {e.detail}")
        except OSError as e:
            problems.append(f"{key}: {rel} cannot be read: {e.strerror or e}")

    rows = len(row_ids)
    counts: dict[str, int] = {}
    for rid in row_ids:
        counts[rid] = counts.get(rid, 0) + 1
    dups = sorted(rid for rid, c in counts.items() if c > 1)
    problems.extend(_listed(f"{key}: duplicate row id", dups))
    n_frames = len(frame_ids)
    if total >= 0 and total != n_frames:
        problems.append(f"{key}: dataset_info.json total_trajectories={total} but {n_frames} frame files")
    if total >= 0 and total != rows:
        problems.append(
            f"{key}: dataset_info.json total_trajectories={total} but {rows} processed_dataset rows"
        )
    if n_frames != rows:
        problems.append(f"{key}: {n_frames} frame files but {rows} processed_dataset rows")
    row_set = set(counts)
    problems.extend(_listed(f"{key}: frame file without a row, id", sorted(frame_ids - row_set)))
    problems.extend(_listed(f"{key}: row without a frame file, id", sorted(row_set - frame_ids)))
    return CacheDirInfo(
        cache_key=key,
        frame_ids=frame_ids,
        rows=rows,
        row_ids=row_ids,
        total_trajectories=total,
        problems=problems,
    )


def read_processed_rows(cache_dir: Path, columns: Sequence[str] | None = None) -> pa.Table:
    """All Arrow shards of ``processed_dataset/`` concatenated in file-name order (only
    ``columns`` if given, in that order). A shard without one of ``columns`` is an ArchiveError."""
    cache_dir = Path(cache_dir)
    fix = f"delete {cache_dir} and re-run the build to extract it again from the pinned archive"
    try:
        return farrow.read_processed_table(cache_dir, columns, missing="error")
    except FormatError as e:
        raise ArchiveError(f"{e}.", fix=fix) from e


def stray_entries(data_root: Path, expected_cache_keys: Iterable[str]) -> list[str]:
    """Names in ``processed_datasets/`` that are not an expected cache directory (a directory, or
    a link to one), sorted. The product's own temporary names (staging folders, moved-aside old
    versions: :func:`stage2_data.publish.is_temp_name`) are ignored."""
    root = layout.processed_root(data_root)
    if not root.is_dir():
        return []
    expected = set(expected_cache_keys)
    out: list[str] = []
    with os.scandir(root) as it:
        for entry in it:
            if is_temp_name(entry.name):
                continue
            if entry.name in expected and entry.is_dir(follow_symlinks=True):
                continue
            out.append(entry.name)
    return sorted(out)


@dataclass(frozen=True)
class UnusedDir:
    """A cache directory a build moved aside because the profile no longer lists it."""

    path: Path  # <data_root>/unused/processed_datasets/<key>[.N]
    cache_key: str  # the key it was extracted as (its extraction record says; else its name)
    files: int
    size: int
    # its extraction record, moved beside it under unused/reports/extraction/ (None: there is none,
    # so no build moved the folder there)
    record: Path | None = None

    def to_dict(self) -> dict[str, object]:
        return {"path": str(self.path), "cache_key": self.cache_key, "files": self.files, "size": self.size}


def unused_cache_dirs(data_root: Path) -> list[UnusedDir]:
    """Every cache directory under ``<data_root>/unused/processed_datasets/`` (what
    :func:`move_aside_unused` moved there), sorted by name, with its file count and size (links not
    followed) and the cache key its extraction record (moved beside it) names, else its name
    without a ``.N`` suffix. `stage2 list` shows them; only the user removes them
    (:func:`remove_unused`, `stage2 gc --unused`)."""
    from .extract import load_extraction_record

    unused = layout.unused_root(Path(data_root))
    root = unused / layout.PROCESSED_DIR
    out: list[UnusedDir] = []
    if not root.is_dir():
        return out
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        record = layout.extraction_record_path(unused, d.name)  # unused/reports/extraction/<name>.json
        rec = load_extraction_record(unused, d.name)
        key = rec.cache_key if rec is not None and rec.cache_key else re.sub(r"\.\d+$", "", d.name)
        out.append(UnusedDir(d, key, *tree_usage(d), record=record if record.is_file() else None))
    return out


def move_aside_unused(data_root: Path, expected_cache_keys: Iterable[str]) -> list[tuple[Path, Path]]:
    """Move each folder of ``processed_datasets/`` that the build itself extracted (it has its
    extraction record, naming it) but that is not an expected cache directory (the profile no
    longer lists it) to ``<data_root>/unused/processed_datasets/<key>/`` (``<key>.1``, ``.2``, ...
    when that is taken: nothing is overwritten, nothing deleted), its record beside it under
    ``unused/reports/extraction/``. Anything else stays (:func:`stray_entries` names it). Returns
    [(from, to)]."""
    from .extract import load_extraction_record

    moved: list[tuple[Path, Path]] = []
    root = layout.processed_root(data_root)
    unused = layout.unused_root(data_root)
    for name in stray_entries(data_root, expected_cache_keys):
        src = root / name
        rec = load_extraction_record(data_root, name)
        if rec is None or rec.cache_key != name or src.is_symlink() or not src.is_dir():
            continue
        dest_root = unused / layout.PROCESSED_DIR
        dest_root.mkdir(parents=True, exist_ok=True)
        rec_root = unused / layout.REPORTS_DIR / "extraction"
        rec_root.mkdir(parents=True, exist_ok=True)
        n, dest = 0, name
        while any(os.path.lexists(p) for p in (dest_root / dest, rec_root / f"{dest}.json")):
            n += 1
            dest = f"{name}.{n}"
        os.rename(src, dest_root / dest)  # same file system: the data root
        os.rename(layout.extraction_record_path(data_root, name), rec_root / f"{dest}.json")
        moved.append((src, dest_root / dest))
    return moved


@dataclass
class UnusedRemoval:
    """What :func:`remove_unused` removed (or, for a dry run, would remove)."""

    root: Path  # <data_root>/unused
    dry_run: bool
    # removed: moved here by a build (their extraction record beside them); ``files`` and ``size``
    # count the files removed (those the record lists), not what else the folder holds
    dirs: list[UnusedDir]
    kept: list[UnusedDir]  # not moved here by a build (no extraction record): left as they are
    # inside the folders of ``dirs``: what their extraction record does not list (a user's notes,
    # a file changed since it was extracted), or a whole folder whose record lists no file: kept
    entries: list[KeptEntry] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(d.size for d in self.dirs)

    def lines(self) -> list[str]:
        """One line per cache directory, then the totals."""
        from ..fsutil import human_bytes

        verb = "would remove" if self.dry_run else "removed"
        if not self.dirs and not self.kept and not self.entries:
            return [f"unused {self.root}: empty, nothing {'to remove' if self.dry_run else 'removed'}"]
        out = [f"unused {self.root}:"]
        out += [
            f"  {verb}  {d.path.name} (cache key {d.cache_key}): {d.files} file(s), {human_bytes(d.size)}"
            for d in self.dirs
        ]
        out += [
            f"  kept  {d.path.name}: no extraction record beside it, so no build moved it here "
            "(remove it yourself if you no longer need it)"
            for d in self.kept
        ]
        out += [f"  {k.line()}" for k in self.entries]
        total = f"unused: {verb} {len(self.dirs)} folder(s), {human_bytes(self.bytes)}"
        if self.entries:
            total += f"; kept {len(self.entries)} item(s) the extraction records do not list (named above)"
        out.append(total)
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "dry_run": self.dry_run,
            "dirs": [d.to_dict() for d in self.dirs],
            "kept": [d.to_dict() for d in self.kept],
            "kept_entries": [k.to_dict() for k in self.entries],
            "removed_dirs": 0 if self.dry_run else len(self.dirs),
            "bytes": self.bytes,
        }


#: why :func:`remove_unused` keeps an entry of a cache directory a build moved to unused/
NOT_EXTRACTED = "not written by its extraction: its extraction record does not list it"
CHANGED = "changed since it was extracted: not the bytes its extraction record lists"


def _extracted_files(d: UnusedDir, data_root: Path) -> tuple[list[str], list[KeptEntry]] | None:
    """What of ``d`` (moved here by a build) its extraction record lists as written by the
    extraction, unchanged (its stats as recorded, else its bytes the recorded sha256): those files
    (paths under ``d``), and everything else in it as kept entries (a folder the record lists
    nothing under is one entry, never looked into). None when the record lists no file (unreadable,
    or of an older version): nothing in ``d`` can be told to be the extraction's."""
    from .aside import foreign_entries
    from .extract import load_extraction_record

    unused = layout.unused_root(data_root)
    rec = load_extraction_record(unused, d.path.name)
    if rec is None or not rec.entries:
        return None
    recorded = {
        rel: (str(e[0]), (int(e[1]), int(e[2]), int(e[3]), int(e[4]))) for rel, e in rec.entries.items()
    }
    # the record file stands for the replacing folder: never a folder, so no other folder is looked into
    assert d.record is not None
    foreign = foreign_entries(d.path, d.record, recorded, {})
    base = d.path.relative_to(data_root).as_posix()
    kept = []
    for rel in foreign:
        p = d.path / rel
        is_dir = stat.S_ISDIR(os.lstat(p).st_mode)
        if is_dir:
            why = "a folder its extraction record lists nothing in"
        else:
            why = CHANGED if rel in recorded else NOT_EXTRACTED
        kept.append(KeptEntry(p, f"{base}/{rel}", is_dir, why))
    skip = set(foreign)
    ours: list[str] = []  # what the walk finds (never a recorded path outside the folder)
    for dirpath, dirnames, filenames in os.walk(d.path):
        here = Path(dirpath).relative_to(d.path).as_posix()
        prefix = "" if here == "." else here + "/"
        dirnames[:] = sorted(n for n in dirnames if prefix + n not in skip)
        for name in sorted(filenames):
            rel = prefix + name
            if rel not in skip and rel in recorded and stat.S_ISREG(os.lstat(d.path / rel).st_mode):
                ours.append(rel)
    return ours, kept


def _remove_extracted(d: UnusedDir, files: list[str]) -> None:
    """``files`` (paths under ``d``) removed, then each folder they leave empty, ``d`` included; a
    folder still holding anything (what was kept) stays."""
    dirs: set[Path] = {d.path}
    for rel in files:
        p = d.path / rel
        p.unlink()
        dirs.update(q for q in p.parents if q != d.path and d.path in q.parents)
    for folder in sorted(dirs, key=lambda q: len(q.parts), reverse=True):  # deepest first
        try:
            folder.rmdir()
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                raise


def remove_unused(data_root: Path, *, dry_run: bool) -> UnusedRemoval:
    """Remove what :func:`move_aside_unused` moved under ``<data_root>/unused/``: in each cache
    directory with its extraction record beside it, exactly the files that record lists as the
    extraction wrote them (unchanged: :func:`~stage2_data.extract.aside.foreign_entries`), the
    folders they leave empty, and the record; everything else in it (a user's notes or results,
    a file changed since) is kept and named (:class:`KeptEntry`), and a folder whose record lists no
    file is kept whole and named (nothing in it can be told to be the extraction's). A dry run
    removes nothing and says what it would. A folder without its record beside it was not moved
    there by a build (the user's own): it is kept, and said so. The user asks for it (`stage2 gc
    --unused`): a build never removes these."""
    from ..oserrors import fs_error
    from ..publish.readonly import make_writable

    data_root = Path(data_root)
    listed = unused_cache_dirs(data_root)
    removed: list[UnusedDir] = []
    entries: list[KeptEntry] = []
    for d in (d for d in listed if d.record is not None):
        try:
            plan = _extracted_files(d, data_root)
            if plan is None:
                why = (
                    "its extraction record lists no file, so nothing in it can be told to be the extraction's"
                )
                entries.append(KeptEntry(d.path, d.path.relative_to(data_root).as_posix(), True, why))
                continue
            files, kept = plan
            size = sum(os.lstat(d.path / rel).st_size for rel in files)
            removed.append(replace(d, files=len(files), size=size))
            entries += kept
            if not dry_run:
                make_writable(d.path)
                _remove_extracted(d, files)
                if d.record is not None:
                    d.record.unlink(missing_ok=True)
        except OSError as e:
            raise fs_error(e, "removing an unused cache directory", where=str(d.path)) from e
    kept_dirs = [d for d in listed if d.record is None]
    return UnusedRemoval(layout.unused_root(data_root), dry_run, removed, kept_dirs, entries)
