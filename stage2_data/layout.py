"""Version constants and every on-disk path pattern, in one place.

<DATA_ROOT>/
  archives/<archive path>                        verified archives (+ .verified.json records)
  archives/.partial/<archive path>.part          downloads in progress (resumable)
  processed_datasets/<cache_key>/...             extracted cache directories
  derived/action_sidecars/<source>/trajectory_<ID>.npz
  reports/extraction/<cache_key>.json            per cache key extraction record
  extraction_report.json                         all cache keys
  tables/trajectory_join.parquet                 the trajectory/sidecar join
  reports/*.json                                 verification reports
  stores/<profile>/v<VERSION>-<inputkey16>/      immutable VIN stores, one per input set
  stores/<profile>/current -> v<VERSION>-...     the published store (symlink swapped atomically)
  unused/processed_datasets/<cache_key>[.N]/     a cache directory the profile no longer lists, moved
                                                 aside by the build (never deleted), with its record
                                                 in unused/reports/extraction/
  quarantine/<UTC time>/archives/<archive path>  a verified archive that disagreed with its pin, moved
                                                 aside (never deleted; `stage2 gc --quarantine` removes)
"""

from __future__ import annotations

import re
from pathlib import Path

ARCHIVES_DIR = "archives"
PARTIAL_DIR = ".partial"
PROCESSED_DIR = "processed_datasets"
DERIVED_DIR = "derived"
SIDECARS_DIR = "action_sidecars"
REPORTS_DIR = "reports"
TABLES_DIR = "tables"
STORES_DIR = "stores"
CURRENT_LINK = "current"
VERIFIED_SUFFIX = ".verified.json"
EXTRACTION_REPORT = "extraction_report.json"
JOIN_TABLE = "trajectory_join.parquet"
LOCK_FILE = ".stage2.lock"
UNUSED_DIR = "unused"
QUARANTINE_DIR = "quarantine"

FRAMES_SUBDIR = "frames"
# Every pattern is anchored with \A and \Z: "$" would also match before a trailing newline, so a
# name ending in "\n" would pass for one without it.
FRAME_FILE_RE = re.compile(r"\Atrajectory_(?P<id>[^/]+)\.npz\Z")
SIDECAR_PATH_RE = re.compile(r"\Aaction_sidecars/(?P<source>[^/]+)/trajectory_(?P<id>[^/]+)\.npz\Z")
FRAMES_PATH_RE = re.compile(
    r"\Aprocessed_datasets/(?P<cache_key>[^/]+)/frames/trajectory_(?P<id>[^/]+)\.npz\Z"
)
#: A split part of one tar stream: ``<base>.tar.part-aa`` or ``<base>.tar.partaa`` (upstream's own
#: untar script accepts both spellings); ``sep`` is ``-`` or empty, ``suffix`` GNU split's suffix.
SPLIT_PART_RE = re.compile(r"\A(?P<base>.+\.tar)\.part(?P<sep>-?)(?P<suffix>[a-z]+)\Z")
#: A pinned revision: a full 40-hex (lowercase) git commit id. The one spelling of that pattern.
HEX40 = "[0-9a-f]{40}"
HEX40_RE = re.compile(rf"\A{HEX40}\Z")  # \Z: "$" would also accept a trailing newline
#: The split names, in their order (pair manifest, join table, store). ``SPLIT_NAMES`` is the same tuple.
SPLITS = ("train", "val", "test")
SPLIT_NAMES = SPLITS


def archives_dir(data_root: Path) -> Path:
    return data_root / ARCHIVES_DIR


def archive_path(data_root: Path, path: str) -> Path:
    return data_root / ARCHIVES_DIR / path


def partial_path(data_root: Path, path: str) -> Path:
    return data_root / ARCHIVES_DIR / PARTIAL_DIR / (path + ".part")


def verified_record_path(data_root: Path, path: str) -> Path:
    return data_root / ARCHIVES_DIR / (path + VERIFIED_SUFFIX)


def quarantine_root(data_root: Path) -> Path:
    """Where files set aside are moved: ``<data_root>/quarantine`` (one folder per move, named by
    its UTC time, keeping the file's path under the data root)."""
    return data_root / QUARANTINE_DIR


def processed_root(data_root: Path) -> Path:
    return data_root / PROCESSED_DIR


def cache_dir(data_root: Path, cache_key: str) -> Path:
    return data_root / PROCESSED_DIR / cache_key


def frames_relpath(cache_key: str, trajectory_id: str) -> str:
    return f"{PROCESSED_DIR}/{cache_key}/{FRAMES_SUBDIR}/trajectory_{trajectory_id}.npz"


def derived_root(data_root: Path) -> Path:
    return data_root / DERIVED_DIR


def sidecar_relpath(source: str, trajectory_id: str) -> str:
    return f"{SIDECARS_DIR}/{source}/trajectory_{trajectory_id}.npz"


def reports_dir(data_root: Path) -> Path:
    return data_root / REPORTS_DIR


def checked_record_path(data_root: Path, asset: str) -> Path:
    """``reports/<asset>.checked.json``: the inputs the join (``trajectory_join``) or the subset byte
    check (``subset_checksums``) last judged, and whether its checks passed (the store step requires
    both)."""
    return data_root / REPORTS_DIR / f"{asset}.checked.json"


def extraction_record_path(data_root: Path, cache_key: str) -> Path:
    return data_root / REPORTS_DIR / "extraction" / f"{cache_key}.json"


def unused_root(data_root: Path) -> Path:
    """Where the build moves what it made and no longer uses (a cache directory the profile no
    longer lists): ``<data_root>/unused``, keeping each one's path under the data root."""
    return data_root / UNUSED_DIR


def extraction_report_path(data_root: Path) -> Path:
    return data_root / EXTRACTION_REPORT


def join_table_path(data_root: Path) -> Path:
    return data_root / TABLES_DIR / JOIN_TABLE


def join_sha256_path(data_root: Path) -> Path:
    """The join table's sha256, written by the join after the table (``sha256sum`` format): the
    store writer reads the table's bytes only when they have it."""
    return data_root / TABLES_DIR / f"{JOIN_TABLE}.sha256"


def stores_root(data_root: Path, profile_name: str) -> Path:
    return data_root / STORES_DIR / profile_name


def current_store_path(data_root: Path, profile_name: str) -> Path:
    return stores_root(data_root, profile_name) / CURRENT_LINK


def split_base(path: str) -> str:
    """``x.tar.part-ab`` (or ``x.tar.partab``) -> ``x.tar``; a whole tar is its own base."""
    m = SPLIT_PART_RE.match(path)
    return m.group("base") if m else path


def action_manifest_paths(folder: Path) -> list[Path]:
    """The kit's action manifests in ``folder``: its ``*.jsonl`` entries in name order, whatever
    they are (their readers name one that is not a regular file), hidden ones aside (``.name``: an
    editor's lock file or backup, as Emacs's ``.#racer.jsonl`` link, is never the kit's)."""
    return sorted(p for p in Path(folder).glob("*.jsonl") if not p.name.startswith("."))
