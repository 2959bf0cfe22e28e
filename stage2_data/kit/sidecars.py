"""Action sidecars: the kit's sidecar tar, verified and unpacked safely into the data root, and the
reading of one sidecar ``.npz``: its shapes and metadata (``.npy`` headers), and its data's sanity
(recovered actions finite; alignment indices within the raw actions; each aligned row equal to the
raw row it indexes; one source index per raw row), never unpickling anything."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .. import layout
from ..errors import ArchiveError, ChecksumMismatchError, KitError, Stage2Error, UnsafeArchiveError
from ..extract import check_cancel
from ..formats.sha256sums import read_single_sha256_file
from ..fsutil import disk_full_as, require_free_space
from ..hashing import sha256_file
from ..profile import Profile
from ..publish import atomic_write_json, publish_dir, staging
from .listing import count_sidecar_files
from .sidecar_facts import (
    SIDECAR_INDEX,
    SIDECAR_MARKER,
    SIDECAR_READ_LIMIT,
    _parse_sidecar,
    _record,
    _write_index,
)

__all__ = ["SidecarUnpackResult", "unpack_sidecars"]

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
_READ_CHUNK = 4 * 1024 * 1024  # of the tar, read at once for the members in it


class _TarReader:
    """Plain members' bytes read straight from the tar: a few MB at a time (members come in tar
    order), not one read per member."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.start = 0
        self.buf = b""

    def body(self, m: tarfile.TarInfo) -> bytes | None:
        """``m``'s bytes; None for a sparse or large member, or one the tar holds fewer bytes of
        (tarfile reads those, and names the error)."""
        if m.sparse is not None or m.size > SIDECAR_READ_LIMIT:
            return None
        lo = m.offset_data - self.start
        if lo < 0 or lo + m.size > len(self.buf):
            self.start, lo = m.offset_data, 0
            self.buf = os.pread(self.fd, max(_READ_CHUNK, m.size), m.offset_data)
        body = self.buf[lo : lo + m.size]
        return body if len(body) == m.size else None


def _write_file(dest: str, body: bytes) -> os.stat_result:
    """``dest`` created (mode 0o644) holding ``body``; its stat once written."""
    fd = os.open(dest, _CREATE, 0o644)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
        st = os.fstat(fd)
        if st.st_mode & 0o7777 != 0o644:  # the umask took bits away
            os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    return st


def _extract_member(
    tf: tarfile.TarFile, m: tarfile.TarInfo, dest: str, tar_path: Path
) -> tuple[bytes | None, os.stat_result]:
    """``m`` written to ``dest`` through tarfile (a sparse or large member, or a short tar): its
    bytes (when small enough to parse) and the written file's stat."""
    src = tf.extractfile(m)
    if src is None:  # pragma: no cover - regular files always have data
        raise ArchiveError(f"{tar_path}: cannot read member {m.name!r}")
    body = src.read(m.size) if m.size <= SIDECAR_READ_LIMIT else None
    with src, open(dest, "wb") as out:
        if body is None:
            shutil.copyfileobj(src, out, 1024 * 1024)
        else:
            out.write(body)
        out.flush()  # (then its size and mtime are what the file keeps)
        written_st = os.fstat(out.fileno())
    os.chmod(dest, 0o644)
    return body, written_st


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


def _unpacked_record(derived: Path, tar_sha256: str, tar_stat: os.stat_result) -> dict[str, Any] | None:
    """The sidecars' record (``derived/.sidecars.json``) when it records this tar (sha256 from its
    ``.sha256`` file, size, mtime) and the unpacked folder still holds as many files; else None."""
    marker = derived / SIDECAR_MARKER
    if not (marker.is_file() and (derived / layout.SIDECARS_DIR).is_dir()):
        return None
    try:
        rec = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        isinstance(rec, dict)
        and rec.get("tar_sha256") == tar_sha256
        and rec.get("tar_size") == tar_stat.st_size
        and rec.get("tar_mtime_ns") == tar_stat.st_mtime_ns
        and rec.get("files") == count_sidecar_files(derived)
    ):
        return rec
    return None


def sidecars_status(profile: Profile, data_root: Path) -> str | None:
    """None when :func:`unpack_sidecars` would skip (the sidecars unpacked from the kit's tar as it
    is now, by stats and the tar's ``.sha256`` file: nothing is hashed), else why it would unpack."""
    tar_path = profile.kit_file("sidecar_archive")
    try:
        expected, _ = read_single_sha256_file(profile.kit_file("sidecar_archive_sha256"))
        st = tar_path.stat()
    except (OSError, Stage2Error) as e:
        return f"the kit's sidecar archive cannot be checked ({e})"
    if _unpacked_record(layout.derived_root(Path(data_root)), expected, st) is None:
        return f"the sidecars of {tar_path.name} are not unpacked as it is now"
    return None


def unpack_sidecars(profile: Profile, data_root: Path, *, force: bool = False) -> SidecarUnpackResult:
    """Verify the kit's sidecar tar against its ``.sha256`` file, then unpack it safely into
    ``<data_root>/derived/action_sidecars`` (staged under ``derived/``, published by rename).

    Skipped when ``derived/.sidecars.json`` records the same tar (sha256 from the ``.sha256`` file,
    size, mtime) and the unpacked folder still holds as many files; ``force`` re-verifies and
    re-unpacks. Raises ChecksumMismatchError / UnsafeArchiveError / ArchiveError / KitError, and
    DiskSpaceError when the disk fills up meanwhile; for a refused tar nothing is written."""
    derived = layout.derived_root(Path(data_root))
    with disk_full_as(
        f"the disk at {derived} filled up while unpacking the kit's sidecars "
        f"({profile.kit_file('sidecar_archive').name}); nothing was published.",
        fix="free disk space or choose another --data-root, then re-run",
    ):
        return _unpack_sidecars(profile, data_root, force=force)


def _unpack_sidecars(profile: Profile, data_root: Path, *, force: bool) -> SidecarUnpackResult:
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
    if not force:
        rec = _unpacked_record(derived, expected, st)
        if rec is not None:
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
            # Each sidecar's headers and data are checked as it is written (its bytes are at hand),
            # for the join to use. (Inline: a parse thread beside the writer cost more CPU in GIL
            # hand-offs than it saved, on 2 cores.)
            with staging(final, mode=0o700) as tmp:
                tmp_s, final_s = str(tmp), str(final)
                reader = _TarReader(tf.fileobj.fileno())  # type: ignore[attr-defined]
                made: set[str] = set()
                for source, fname, m in files:
                    check_cancel(tar_path.name)  # a stop: the staging folder is removed
                    if source not in made:
                        os.mkdir(f"{tmp_s}/{source}")
                        made.add(source)
                    dest = f"{tmp_s}/{source}/{fname}"
                    body = reader.body(m)
                    if body is not None:
                        written_st = _write_file(dest, body)
                    else:  # large, sparse or short: through tarfile (which names a short read)
                        body, written_st = _extract_member(tf, m, dest, tar_path)
                    if written_st.st_size != m.size:
                        raise ArchiveError(
                            f"{tar_path}: member {m.name!r} is truncated ({written_st.st_size} of {m.size} bytes)",
                            fix=f"re-copy {tar_path.name} from the kit",
                        )
                    by_source[source] += 1
                    if body is not None and fname.endswith(".npz"):
                        info = _parse_sidecar(body, f"{final_s}/{source}/{fname}", True)
                        _record(index, f"{layout.SIDECARS_DIR}/{source}/{fname}", written_st, info)
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
    _write_index(derived / SIDECAR_INDEX, actual, index)
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
