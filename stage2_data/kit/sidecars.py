"""Action sidecars: the kit's sidecar tar, verified and unpacked safely into the data root, and the
reading of one sidecar ``.npz``: its shapes and metadata (``.npy`` headers), and its data's sanity
(recovered actions finite; alignment indices within the raw actions; each aligned row equal to the
raw row it indexes; one source index per raw row), never unpickling anything."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tarfile
import time
import zipfile
import zlib
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from .. import layout
from ..errors import ArchiveError, ChecksumMismatchError, KitError, UnsafeArchiveError
from ..formats import FormatError, npz
from ..formats.sha256sums import read_single_sha256_file
from ..fsutil import require_free_space
from ..hashing import sha256_file
from ..profile import Profile
from ..publish import atomic_write_json, publish_dir, staging
from .listing import count_sidecar_files, sidecar_dirs
from .sidecar_data import DATA_KEYS, check_sidecar_arrays

__all__ = [
    "SIDECAR_INDEX",
    "SIDECAR_MARKER",
    "SIDECAR_KEYS",
    "SidecarDataCheck",
    "SidecarUnpackResult",
    "check_sidecars_on_disk",
    "recorded_sidecars",
    "sidecar_infos",
    "unpack_sidecars",
]

SIDECAR_MARKER = ".sidecars.json"
#: what the unpack read in each sidecar it wrote (keyed by path under derived/, with the file's size
#: and mtime then), so the join need not read 20k files again: :func:`recorded_sidecars`
SIDECAR_INDEX = ".sidecars.index.json"
_PARSE_AHEAD = 256  # sidecars written but not yet parsed, at most
SIDECAR_KEYS = ("metadata_json", "raw_actions", "aligned_actions", "source_indices", "alignment_indices")
_SIDECAR_READ_LIMIT = 64 * 1024 * 1024


# ----------------------------------------------------------------------------------------------
# The sidecar archive
# ----------------------------------------------------------------------------------------------
@dataclass
class SidecarUnpackResult:
    tar_path: Path
    tar_sha256: str
    files: int
    bytes: int
    by_source: dict[str, int]
    seconds: float
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tar_path"] = str(self.tar_path)
        return d


def _check_members(
    tar_name: str, members: Sequence[tarfile.TarInfo]
) -> tuple[list[tuple[str, str, tarfile.TarInfo]], list[str]]:
    """Every member must be a regular file ``action_sidecars/<source>/trajectory_<ID>.npz`` or one of
    the folders ``action_sidecars`` / ``action_sidecars/<source>``. Returns ([(source, file name,
    member)], refusals)."""
    refused: list[str] = []
    files: list[tuple[str, str, tarfile.TarInfo]] = []
    seen: set[str] = set()
    for m in members:
        name = m.name
        label = f"member {name!r} of {tar_name}"
        norm = name[2:] if name.startswith("./") else name
        stripped = norm.rstrip("/") if m.isdir() else norm
        if name.startswith("/") or PurePosixPath(name).is_absolute():
            refused.append(f"{label}: absolute path")
            continue
        parts = stripped.split("/")
        if any(p == ".." for p in parts):
            refused.append(f"{label}: contains '..'")
            continue
        if m.issym() or m.islnk():
            refused.append(f"{label}: is a {'symbolic' if m.issym() else 'hard'} link to {m.linkname!r}")
            continue
        if m.ischr() or m.isblk():
            refused.append(f"{label}: is a device")
            continue
        if m.isfifo():
            refused.append(f"{label}: is a FIFO")
            continue
        if not (m.isreg() or m.isdir()):
            refused.append(f"{label}: is neither a regular file nor a folder (type {m.type!r})")
            continue
        if stripped in ("", "."):
            if m.isdir():
                continue
            refused.append(f"{label}: empty name")
            continue
        if any(p in ("", ".") for p in parts) or "\x00" in stripped:
            refused.append(f"{label}: not a plain relative path")
            continue
        if stripped in seen:
            refused.append(f"{label}: appears twice")
            continue
        seen.add(stripped)
        if m.isdir():
            if parts[0] == layout.SIDECARS_DIR and len(parts) <= 2:
                continue
            refused.append(f"{label}: folder outside action_sidecars/<source>/")
            continue
        sm = layout.SIDECAR_PATH_RE.match(stripped)
        if not sm:
            refused.append(f"{label}: not action_sidecars/<source>/trajectory_<ID>.npz")
            continue
        files.append((sm.group("source"), parts[-1], m))
    return files, refused


def unpack_sidecars(profile: Profile, data_root: Path, *, force: bool = False) -> SidecarUnpackResult:
    """Verify the kit's sidecar tar against its ``.sha256`` file, then unpack it safely into
    ``<data_root>/derived/action_sidecars`` (staged under ``derived/``, published by rename).

    Skipped when ``derived/.sidecars.json`` records the same tar (sha256 from the ``.sha256`` file,
    size, mtime) and the unpacked folder still holds as many files; ``force`` re-verifies and
    re-unpacks. Raises ChecksumMismatchError / UnsafeArchiveError / ArchiveError / KitError; for a
    refused tar nothing is written."""
    t0 = time.perf_counter()
    tar_path = profile.kit_file("sidecar_archive")
    sha_path = profile.kit_file("sidecar_archive_sha256")
    for p in (tar_path, sha_path):
        if not p.is_file():
            raise KitError(
                "sidecar archive",
                [f"{p} does not exist"],
                fix=f"copy the kit's {p.name} into {p.parent} (profile [kit] names it)",
            )
    expected, named = read_single_sha256_file(sha_path)
    if PurePosixPath(named.lstrip("*")).name != tar_path.name:
        raise KitError(
            "sidecar archive checksum file",
            [f"{sha_path}: names {named!r}, not the archive {tar_path.name!r}"],
            fix=f"regenerate it: `sha256sum {tar_path.name} > {sha_path.name}`",
        )
    derived = layout.derived_root(Path(data_root))
    final = derived / layout.SIDECARS_DIR
    marker = derived / SIDECAR_MARKER
    st = tar_path.stat()
    if not force and marker.is_file() and final.is_dir():
        try:
            rec = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            rec = None
        if (
            isinstance(rec, dict)
            and rec.get("tar_sha256") == expected
            and rec.get("tar_size") == st.st_size
            and rec.get("tar_mtime_ns") == st.st_mtime_ns
            and rec.get("files") == count_sidecar_files(derived)
        ):
            return SidecarUnpackResult(
                tar_path=tar_path,
                tar_sha256=expected,
                files=int(rec["files"]),
                bytes=int(rec.get("bytes", 0)),
                by_source={str(k): int(v) for k, v in dict(rec.get("by_source", {})).items()},
                seconds=time.perf_counter() - t0,
                skipped=True,
            )

    actual = sha256_file(tar_path)
    if actual != expected:
        raise ChecksumMismatchError(
            str(tar_path),
            expected,
            actual,
            fix=f"re-copy {tar_path.name} from the kit (it is damaged or not the one {sha_path.name} pins)",
        )
    try:
        with tarfile.open(tar_path, mode="r:") as tf:
            members = tf.getmembers()
            files, refused = _check_members(tar_path.name, members)
            if refused:
                raise UnsafeArchiveError(
                    f"refusing to unpack {tar_path}: {len(refused)} unsafe or unexpected member(s): "
                    + "; ".join(refused[:20])
                    + (f"; ... and {len(refused) - 20} more" if len(refused) > 20 else ""),
                    fix="rebuild the sidecar tar with only action_sidecars/<source>/trajectory_<ID>.npz files",
                )
            total = sum(m.size for _, _, m in files)
            require_free_space(derived, total + 16 * 1024 * 1024, f"unpacking {tar_path.name}")
            by_source: Counter[str] = Counter()
            for stale in (marker, derived / SIDECAR_INDEX):
                stale.unlink(missing_ok=True)
            index: dict[str, dict[str, Any]] = {}
            # Each sidecar's headers and data are checked as it is written, on one thread beside
            # this one (the parse holds the GIL, file creation does not), for the join to use.
            with staging(final, mode=0o700) as tmp, ThreadPoolExecutor(1) as parser:
                made: set[str] = set()
                parsing: deque[tuple[str, os.stat_result, Future[_SidecarInfo]]] = deque()
                for source, fname, m in files:
                    if source not in made:
                        (tmp / source).mkdir(exist_ok=True)
                        made.add(source)
                    src = tf.extractfile(m)
                    if src is None:  # pragma: no cover - regular files always have data
                        raise ArchiveError(f"{tar_path}: cannot read member {m.name!r}")
                    dest = tmp / source / fname
                    rel = f"{layout.SIDECARS_DIR}/{source}/{fname}"
                    body = src.read(m.size) if m.size <= _SIDECAR_READ_LIMIT else None
                    with src, open(dest, "wb") as out:
                        if body is None:
                            shutil.copyfileobj(src, out, 1024 * 1024)
                        else:
                            out.write(body)
                        written = out.tell()
                        out.flush()  # (then its size and mtime are what the file keeps)
                        written_st = os.fstat(out.fileno())
                    if written != m.size:
                        raise ArchiveError(
                            f"{tar_path}: member {m.name!r} is truncated ({written} of {m.size} bytes)",
                            fix=f"re-copy {tar_path.name} from the kit",
                        )
                    os.chmod(dest, 0o644)
                    by_source[source] += 1
                    if body is not None and fname.endswith(".npz"):
                        label = str(final / source / fname)
                        parsing.append((rel, written_st, parser.submit(_parse_sidecar, body, label, True)))
                    while len(parsing) > _PARSE_AHEAD or (parsing and parsing[0][2].done()):
                        _record(index, *parsing.popleft())
                while parsing:
                    _record(index, *parsing.popleft())
                publish_dir(tmp, final)
    except (tarfile.TarError, EOFError) as e:
        raise ArchiveError(
            f"{tar_path}: not a readable tar ({e})", fix=f"re-copy {tar_path.name} from the kit"
        ) from None
    result = SidecarUnpackResult(
        tar_path=tar_path,
        tar_sha256=actual,
        files=len(files),
        bytes=total,
        by_source=dict(sorted(by_source.items())),
        seconds=0.0,
    )
    atomic_write_json(derived / SIDECAR_INDEX, {"tar_sha256": actual, "files": index})
    atomic_write_json(
        marker,
        {
            "tar_name": tar_path.name,
            "tar_sha256": actual,
            "tar_size": st.st_size,
            "tar_mtime_ns": st.st_mtime_ns,
            "files": result.files,
            "bytes": result.bytes,
            "by_source": result.by_source,
        },
    )
    result.seconds = time.perf_counter() - t0
    return result


# ----------------------------------------------------------------------------------------------
# One sidecar npz (never unpickles)
# ----------------------------------------------------------------------------------------------
@dataclass
class _SidecarInfo:
    sha256: str | None = None
    bytes: int | None = None
    raw_width: int | None = None
    metadata_raw_width: int | None = None
    aligned_length: int | None = None
    aligned_width: int | None = None
    problems: list[str] = field(default_factory=list)


def _read_sidecar(path: str | Path, want_sha: bool) -> _SidecarInfo:
    """Widths and lengths of a sidecar from its ``.npy`` headers (+ the small metadata_json).

    A lean reader of the npz (zip) container: only headers are parsed, ``metadata_json`` is read
    with ``np.frombuffer`` after its dtype is checked; an object (pickled) array is a problem and is
    never unpickled."""
    label = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(_SIDECAR_READ_LIMIT + 1)
            if len(data) > _SIDECAR_READ_LIMIT:
                info = _SidecarInfo(bytes=os.fstat(f.fileno()).st_size)
                if want_sha:
                    info.sha256 = sha256_file(path)
                info.problems.append(
                    f"{label}: {info.bytes} bytes, too large for an action sidecar; not read"
                )
                return info
    except OSError as e:
        return _SidecarInfo(problems=[f"{label}: unreadable sidecar npz ({type(e).__name__}: {e})"])
    return _parse_sidecar(data, label, want_sha)


def _parse_sidecar(data: bytes, label: str, want_sha: bool) -> _SidecarInfo:
    """:func:`_read_sidecar` of a sidecar's bytes (``label`` names it in problems)."""
    info = _SidecarInfo()
    try:
        info.bytes = len(data)
        if want_sha:
            info.sha256 = hashlib.sha256(data).hexdigest()
        members = npz.npz_members(data)
        headers: dict[str, npz.NpyHeader] = {}
        bodies: dict[str, np.ndarray[Any, Any] | None] = {}  # data keys: inflated once, whole
        for key, zi in members.items():
            if not zi.name.endswith(".npy"):
                continue
            try:
                if key in DATA_KEYS and zi.usize <= _SIDECAR_READ_LIMIT:
                    headers[key], bodies[key] = npz.member_npy(data, zi, file=label)
                else:
                    headers[key] = npz.member_header(data, zi)
            except (ValueError, SyntaxError, TypeError, MemoryError, zipfile.BadZipFile, zlib.error) as e:
                why = e.detail if isinstance(e, FormatError) else e  # the member is named already
                info.problems.append(
                    f"{label}: member {zi.name}: unreadable .npy ({type(e).__name__}: {why})"
                )
        objects = [k for k, (_, dt, _) in headers.items() if dt.hasobject]
        if objects:
            info.problems.append(
                f"{label}: key(s) {', '.join(objects)} hold object (pickled) arrays; refused, not unpickled"
            )
            return info
        missing = [k for k in SIDECAR_KEYS if k not in members]
        if missing:
            info.problems.append(f"{label}: missing key(s) {', '.join(missing)}")
        raw = headers.get("raw_actions")
        if raw is not None:
            if len(raw[0]) == 2:
                info.raw_width = raw[0][1]
            else:
                info.problems.append(f"{label}: raw_actions has shape {raw[0]}, expected (N, W)")
        aligned = headers.get("aligned_actions")
        if aligned is not None:
            if len(aligned[0]) == 2:
                info.aligned_length, info.aligned_width = aligned[0]
            else:
                info.problems.append(f"{label}: aligned_actions has shape {aligned[0]}, expected (T, W)")
        if "metadata_json" in headers:
            shape, dtype, offset = headers["metadata_json"]
            meta = None
            if dtype.kind not in "US" or shape not in ((), (1,)):
                info.problems.append(f"{label}: metadata_json is {dtype} {shape}, expected a 0-d string")
            else:
                body = npz.member_bytes(data, members["metadata_json"])
                value = np.frombuffer(body, dtype=dtype, count=1, offset=offset)[0]
                text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
                try:
                    meta = json.loads(text)
                except ValueError as e:
                    info.problems.append(f"{label}: metadata_json is not JSON ({e})")
            if isinstance(meta, dict):
                rw = meta.get("raw_width")
                if isinstance(rw, int) and not isinstance(rw, bool):
                    info.metadata_raw_width = rw
                else:
                    info.problems.append(f"{label}: metadata_json has no integer raw_width")
            elif meta is not None:
                info.problems.append(f"{label}: metadata_json is not a JSON object")
        arrays: dict[str, np.ndarray[Any, Any]] = {}
        for k in DATA_KEYS:
            if k not in headers:
                continue
            shape, dtype, offset = headers[k]
            need = offset + math.prod(shape) * dtype.itemsize  # Python ints: no overflow
            if need != members[k].usize or need > _SIDECAR_READ_LIMIT:
                info.problems.append(
                    f"{label}: member {members[k].name}: its shape {shape} needs {need} bytes, it holds "
                    f"{members[k].usize}{' (too large for an action sidecar)' if need > _SIDECAR_READ_LIMIT else ''}"
                )
                continue
            whole = bodies.get(k)
            arrays[k] = whole if whole is not None else npz.member_array(data, members[k], file=label)
        check_sidecar_arrays(label, arrays, info.problems)
    except (
        OSError,
        ValueError,
        SyntaxError,
        TypeError,
        MemoryError,
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
    ) as e:
        info.problems.append(f"{label}: unreadable sidecar npz ({type(e).__name__}: {e})")
    return info


def _record(
    index: dict[str, dict[str, Any]], rel: str, st: os.stat_result, fut: Future[_SidecarInfo]
) -> None:
    index[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "info": asdict(fut.result())}


def recorded_sidecars(derived: Path) -> dict[str, dict[str, Any]]:
    """What the last unpack read in each sidecar it wrote, by path under ``derived/`` (with the
    file's size and mtime then), when the index belongs to the unpack the marker records; else {}."""
    try:
        marker = json.loads((derived / SIDECAR_MARKER).read_text(encoding="utf-8"))
        doc = json.loads((derived / SIDECAR_INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not (isinstance(marker, dict) and isinstance(doc, dict) and isinstance(doc.get("files"), dict)):
        return {}
    if doc.get("tar_sha256") != marker.get("tar_sha256"):
        return {}
    return doc["files"]  # type: ignore[no-any-return]


def sidecar_infos(
    derived: Path, rels: Sequence[str], want_sha: bool, workers: int | None = None
) -> list[_SidecarInfo]:
    """The facts of the sidecars ``rels`` (paths under ``derived/``): from the unpack's index for a
    file whose size and mtime are still what the unpack wrote (the unpack parsed those very bytes),
    read again for any other."""
    recorded = recorded_sidecars(derived)
    out: list[_SidecarInfo | None] = []
    again: list[tuple[int, str]] = []
    for rel in rels:
        rec = recorded.get(rel)
        path = f"{derived}/{rel}"
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if (
            rec is not None
            and st is not None
            and (st.st_size, st.st_mtime_ns) == (rec["size"], rec["mtime_ns"])
        ):
            try:
                out.append(_SidecarInfo(**rec["info"]))
                continue
            except TypeError:  # an index of another version: read the file
                pass
        again.append((len(out), path))
        out.append(None)
    for (i, _), info in zip(again, _read_sidecars([p for _, p in again], want_sha, workers), strict=True):
        out[i] = info
    return [o if o is not None else _SidecarInfo() for o in out]


@dataclass
class SidecarDataCheck:
    """The standalone re-check of the unpacked sidecars (``check_sidecars_on_disk``)."""

    files: int
    problems: list[str]
    seconds: float


def check_sidecars_on_disk(data_root: Path, *, workers: int | None = None) -> SidecarDataCheck:
    """Every unpacked sidecar under ``derived/action_sidecars/`` read again: its keys, shapes and
    metadata, and its data (:func:`.sidecar_data.check_sidecar_arrays`). Reads only."""
    t0 = time.perf_counter()
    derived = layout.derived_root(Path(data_root))
    base = derived / layout.SIDECARS_DIR
    paths = [
        str(base / source / name)
        for source, names in sorted(sidecar_dirs(derived).items())
        for name in sorted(names)
        if name.endswith(".npz")
    ]
    infos = _read_sidecars(paths, False, workers)
    problems = [p for info in infos for p in info.problems]
    return SidecarDataCheck(len(paths), problems, time.perf_counter() - t0)


def _read_sidecars(paths: Sequence[str], want_sha: bool, workers: int | None) -> list[_SidecarInfo]:
    """Read many sidecars; a couple of threads overlap the file I/O (the parsing holds the GIL)."""
    n = workers or min(2, os.cpu_count() or 1)
    if n <= 1 or len(paths) < 1024:
        return [_read_sidecar(p, want_sha) for p in paths]
    size = 512
    chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        parts = pool.map(lambda c: [_read_sidecar(p, want_sha) for p in c], chunks)
        return [info for part in parts for info in part]
