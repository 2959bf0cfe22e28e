"""Action sidecars: the kit's sidecar tar, verified and unpacked safely into the data root, and the
reading of one sidecar ``.npz``: its shapes and metadata (``.npy`` headers), and its data's sanity
(recovered actions finite; alignment indices within the raw actions; each aligned row equal to the
raw row it indexes; one source index per raw row), never unpickling anything."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tarfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .. import layout
from ..errors import ArchiveError, ChecksumMismatchError, KitError, Stage2Error, UnsafeArchiveError
from ..extract import (
    check_cancel,
    content_digest_of,
    hash_regular_file,
    settle_ctimes,
    stats_digest,
    walk_stats,
)
from ..formats.sha256sums import file_kind, read_regular_bytes, read_single_sha256_file
from ..fsutil import disk_full_as, require_free_space
from ..hashing import sha256_file
from ..profile import Profile
from ..publish import atomic_write_json, publish_dir, staging
from .sidecar_facts import (
    SIDECAR_INDEX,
    SIDECAR_MARKER,
    SIDECAR_READ_LIMIT,
    _parse_sidecar,
    _record,
    _write_index,
    entry_stats,
    recorded_sidecars,
)

__all__ = ["SidecarUnpackResult", "invalidate_sidecars", "sidecars_status", "unpack_sidecars"]

#: The form of the unpack's record (``derived/.sidecars.json`` and its index); a record of another
#: form is not trusted: the sidecars are unpacked again. 2: every sidecar's sha256 and stats.
SIDECAR_RECORD_VERSION = 2

log = logging.getLogger(__name__)

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
    """``dest`` created (mode 0o644) holding ``body``; its stat once written (mode set: a chmod
    changes the ctime the record keeps)."""
    fd = os.open(dest, _CREATE, 0o644)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
        st = os.fstat(fd)
        if st.st_mode & 0o7777 != 0o644:  # the umask took bits away
            os.fchmod(fd, 0o644)
            st = os.fstat(fd)
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
    os.chmod(dest, 0o644)
    return body, os.stat(dest)  # after the chmod: its ctime is what the file keeps


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
    # what this unpack moved aside from the folder it replaced (a user's files or edits), as
    # "<from> -> <to>" lines (stage2_data.extract.aside)
    moved_aside: list[str] = field(default_factory=list)

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


def _read_marker(marker: Path) -> dict[str, Any] | None:
    """The unpack's record (``derived/.sidecars.json``); None when absent or unreadable: not JSON,
    not an object, or not a regular file (a FIFO is never opened for reading: nothing blocks). The
    next unpack writes the record anew in its place."""
    try:
        rec = json.loads(read_regular_bytes(marker).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _unpacked_record(
    derived: Path,
    tar_path: Path,
    tar_sha256: str,
    tar_stat: os.stat_result,
    held: list[Path] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """(the sidecars' record, "") when ``derived/.sidecars.json`` records this tar (sha256 from its
    ``.sha256`` file, size, mtime; its inode and ctime, else its bytes hashed again: size and mtime
    can be kept while bytes change, ctime cannot) and ``derived/action_sidecars/`` holds exactly the
    sidecars the unpack wrote, with their bytes: every file's (inode, size, mtime_ns, ctime_ns)
    equal to the record's (nothing read), or, for a file whose stats differ, its sha256 (the
    record's stats are then refreshed), and the record agrees with its index (its file count, byte
    count and ``content_digest`` are its sidecars', as an extraction record's must be). Else (None,
    why they must be unpacked again, naming the file). With ``held`` (a dry run), a refresh is not
    written: the paths it would write are appended to ``held``."""
    marker = derived / SIDECAR_MARKER
    rec = _read_marker(marker)
    if rec is None:
        return None, "not unpacked yet" if not marker.exists() else f"{marker} is unreadable"
    if rec.get("version") != SIDECAR_RECORD_VERSION:
        return None, f"{marker} was written by another version of the unpack"
    if rec.get("invalidated"):
        return None, str(rec["invalidated"])
    if not (
        rec.get("tar_sha256") == tar_sha256
        and rec.get("tar_size") == tar_stat.st_size
        and rec.get("tar_mtime_ns") == tar_stat.st_mtime_ns
    ):
        return None, "the kit's sidecar tar is not the one unpacked"
    if (rec.get("tar_ino"), rec.get("tar_ctime_ns")) != (tar_stat.st_ino, tar_stat.st_ctime_ns):
        why = _tar_changed(derived, rec, tar_path, tar_sha256, tar_stat, held)
        if why:
            return None, why
    base = derived / layout.SIDECARS_DIR
    found = walk_stats(base)
    if found is None:
        return None, f"{base} is missing"
    stats = {f"{layout.SIDECARS_DIR}/{r}": v for r, v in found.items()}
    index = recorded_sidecars(derived)
    # a record at odds with its own index (its content_digest is what a store's input key folds
    # in) is not trusted; said once no sidecar is named
    inconsistent = _inconsistency(rec, index)
    if not inconsistent and len(stats) == rec.get("files") and stats_digest(stats) == rec.get("tree_digest"):
        return rec, ""  # every sidecar's stats are the recorded ones: nothing read
    missing = sorted(set(index) - set(stats))
    extra = sorted(set(stats) - set(index))
    if missing or extra or len(index) != rec.get("files"):
        named = [f"{derived / r} is missing" for r in missing[:3]] + [
            f"{derived / r} was not unpacked" for r in extra[:3]
        ]
        return (
            None,
            f"{base} holds {len(stats)} sidecars, the unpack wrote {rec.get('files')} ({'; '.join(named)})",
        )
    now: dict[str, tuple[int, int, int, int]] = {}
    for r, st in sorted(stats.items()):
        if not st[4]:
            return None, f"{derived / r} is not a regular file"
        now[r] = st[:4]
        if now[r] == entry_stats(index[r]):
            continue
        if st[1] != index[r].get("size"):
            return None, f"{derived / r} is {st[1]} bytes, the unpack wrote {index[r].get('size')}"
        try:
            sha, now[r] = hash_regular_file(derived / r)
        except OSError as e:
            return None, f"{derived / r} cannot be read ({e})"
        if sha != index[r].get("sha256"):
            return None, (
                f"{derived / r} was modified since it was unpacked: sha256 {sha}, unpacked as "
                f"{index[r].get('sha256')}"
            )
    if inconsistent:
        return None, f"{marker} is inconsistent ({inconsistent})"
    if held is not None:
        held += [derived / SIDECAR_INDEX, marker]
    else:
        _refresh(derived, rec, index, now)
    return rec, ""


def _inconsistency(rec: dict[str, Any], index: dict[str, dict[str, Any]]) -> str:
    """What in the sidecars' record disagrees with its index (every sidecar's sha256 and size):
    a damaged or edited record, or ""."""
    try:
        shas = {r: str(e["sha256"]) for r, e in index.items()}
        size = sum(int(e["size"]) for e in index.values())
    except (KeyError, TypeError, ValueError):
        return "an entry of its index has no sha256 or size"
    if len(shas) != rec.get("files"):
        return f"it counts {rec.get('files')} sidecars and its index lists {len(shas)}"
    if size != rec.get("bytes"):
        return f"it counts {rec.get('bytes')} bytes and its index's sidecars hold {size}"
    if content_digest_of(shas) != rec.get("content_digest"):
        return "its content_digest is not the digest of its sidecars' sha256"
    return ""


def _recorded_files(derived: Path) -> dict[str, tuple[str, tuple[int, int, int, int]]]:
    """What the last unpack wrote, by path under ``derived/action_sidecars/``: (sha256, stats); {}
    when its record and index are absent or disagree (then only bytes equal to what the new unpack
    writes count as the unpack's)."""
    rec = _read_marker(derived / SIDECAR_MARKER)
    if rec is None:
        return {}
    index = recorded_sidecars(derived)
    if _inconsistency(rec, index):
        return {}
    prefix = f"{layout.SIDECARS_DIR}/"
    out: dict[str, tuple[str, tuple[int, int, int, int]]] = {}
    for r, e in index.items():
        st = entry_stats(e)
        if r.startswith(prefix) and st is not None:
            out[r.removeprefix(prefix)] = (str(e.get("sha256")), st)
    return out


def _tar_changed(
    derived: Path,
    rec: dict[str, Any],
    tar_path: Path,
    tar_sha256: str,
    tar_stat: os.stat_result,
    held: list[Path] | None = None,
) -> str:
    """Why the sidecar tar, whose inode or ctime is not the recorded one, is not the tar unpacked:
    its bytes hashed again differ from its ``.sha256`` file; "" when they match (the record then
    takes the tar's stats, once)."""
    try:
        actual = sha256_file(tar_path)
    except OSError as e:
        return f"{tar_path} cannot be read ({e})"
    if actual != tar_sha256:
        return (
            f"{tar_path} changed since it was unpacked: sha256 {actual}, its .sha256 file says {tar_sha256}"
        )
    rec.update(tar_ino=tar_stat.st_ino, tar_ctime_ns=tar_stat.st_ctime_ns)
    if held is not None:  # a dry run: named, not written
        held.append(derived / SIDECAR_MARKER)
        return ""
    settle_ctimes(tar_stat.st_ctime_ns)
    with contextlib.suppress(OSError):  # a read-only data root: the check holds, unrecorded
        atomic_write_json(derived / SIDECAR_MARKER, rec)
    return ""


def _refresh(
    derived: Path,
    rec: dict[str, Any],
    index: dict[str, dict[str, Any]],
    now: dict[str, tuple[int, int, int, int]],
) -> None:
    """Rewrite the index and the record with the sidecars' stats ``now`` (their bytes were found
    unchanged)."""
    settle_ctimes(max((st[3] for st in now.values()), default=0))
    for r, (ino, size, mtime, ctime) in now.items():
        index[r].update(ino=ino, size=size, mtime_ns=mtime, ctime_ns=ctime)
    rec["tree_digest"] = stats_digest(now)
    with contextlib.suppress(OSError):  # a read-only data root: the check holds, unrecorded
        _write_index(derived / SIDECAR_INDEX, str(rec["tar_sha256"]), index)
        atomic_write_json(derived / SIDECAR_MARKER, rec)


def invalidate_sidecars(data_root: Path, why: str) -> bool:
    """Mark the sidecars' record as not to be trusted (a check found an unpacked sidecar damaged):
    the next build unpacks them again, saying ``why``. True when a record was marked."""
    marker = layout.derived_root(Path(data_root)) / SIDECAR_MARKER
    rec = _read_marker(marker)
    if rec is None:
        return False
    rec["invalidated"] = why
    atomic_write_json(marker, rec)
    return True


def sidecars_status(profile: Profile, data_root: Path, *, held: list[Path] | None = None) -> str | None:
    """None when :func:`unpack_sidecars` would skip (the sidecars unpacked from the kit's tar as it
    is now, by stats and the tar's ``.sha256`` file, and every sidecar as the unpack wrote it: by
    stats, or by sha256 for a file whose stats changed), else why it would unpack. With ``held``
    (a dry run), the record's refresh is not written: its paths are appended to ``held``."""
    tar_path = profile.kit_file("sidecar_archive")
    try:
        expected, _ = read_single_sha256_file(profile.kit_file("sidecar_archive_sha256"))
        st = tar_path.stat()
    except (OSError, Stage2Error) as e:
        return f"the kit's sidecar archive cannot be checked ({e})"
    rec, why = _unpacked_record(layout.derived_root(Path(data_root)), tar_path, expected, st, held)
    if rec is None:
        return f"the sidecars of {tar_path.name} must be unpacked again: {why}"
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
            try:
                what = f"is {file_kind(os.stat(p).st_mode)}, not a regular file"
            except OSError:
                what = "does not exist"
            raise KitError(
                "sidecar archive",
                [f"{p} {what}"],
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
        rec, _ = _unpacked_record(derived, tar_path, expected, st)
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
            # read before the record is removed; under ``force`` (--reverify) no record says which
            # old files were the unpack's: only bytes equal to what this unpack writes are
            previous = {} if force else _recorded_files(derived)
            moved: list[str] = []
            for stale in (marker, derived / SIDECAR_INDEX):
                stale.unlink(missing_ok=True)
            index: dict[str, dict[str, Any]] = {}
            # Each sidecar's headers and data are checked as it is written (its bytes are at hand),
            # for the join to use. (Inline: a parse thread beside the writer costs more CPU in GIL
            # hand-offs than it saves.)
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
                    rel = f"{layout.SIDECARS_DIR}/{source}/{fname}"
                    if body is not None:
                        info = _parse_sidecar(body, f"{final_s}/{source}/{fname}", True)
                        sha = info.sha256 or hashlib.sha256(body).hexdigest()
                        _record(index, rel, written_st, sha, info)
                    else:  # too large to parse: hashed from the file written (read again by the join)
                        sha, _ = hash_regular_file(dest)
                        _record(index, rel, written_st, sha, None)
                prefix = f"{layout.SIDECARS_DIR}/"
                written = {
                    r.removeprefix(prefix): (str(e["sha256"]), int(e["size"])) for r, e in index.items()
                }

                def keep(old: Path) -> None:  # what the last unpack did not write is moved aside
                    from ..extract.aside import set_aside_foreign

                    reason = (
                        "not what the previous unpack of the action sidecars wrote (a file its record "
                        "does not list, or one changed since) when they were unpacked again from the "
                        f"kit's {tar_path.name}: moved aside, never deleted"
                    )
                    moved.extend(set_aside_foreign(Path(data_root), old, final, previous, written, reason))

                publish_dir(tmp, final, keep=keep)
            for line in moved:
                log.warning("action sidecars: not written by their unpack; moved aside: %s", line)
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
        moved_aside=moved,
    )
    stats = {r: entry_stats(e) or (0, 0, 0, 0) for r, e in index.items()}
    settle_ctimes(max((*(st[3] for st in stats.values()), st.st_ctime_ns), default=0))
    _write_index(derived / SIDECAR_INDEX, actual, index)
    atomic_write_json(
        marker,
        {
            "version": SIDECAR_RECORD_VERSION,
            "tar_name": tar_path.name,
            "tar_sha256": actual,
            "tar_size": st.st_size,
            "tar_mtime_ns": st.st_mtime_ns,
            "tar_ino": st.st_ino,
            "tar_ctime_ns": st.st_ctime_ns,
            "files": result.files,
            "bytes": result.bytes,
            "by_source": result.by_source,
            "tree_digest": stats_digest(stats),
            "content_digest": content_digest_of({r: str(e["sha256"]) for r, e in index.items()}),
        },
    )
    result.seconds = time.perf_counter() - t0
    return result
