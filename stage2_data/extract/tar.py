"""Opening a whole or split tar in random-access mode, with every header read and checked.

Headers are parsed by a fast path for the common header (:class:`_FastTarInfo`); a truncated or
corrupt stream (tarfile stops listing silently on a bad header) is an
:class:`~stage2_data.errors.ArchiveError` naming the archive, whatever tarfile raised. A file that
is not a tar at all (gzip, zstd, zip, an HTML page, ...: its magic bytes say so) is a
:class:`~stage2_data.errors.FileTypeError` saying what it is.

The fix depends on whether the archive is the verified pinned file (``verified``): its bytes are
then exactly the upstream's, so "download it again" cannot help and is never offered; the fix is
the profile (a part it does not list, a file it should quarantine).
"""

from __future__ import annotations

import contextlib
import struct
import tarfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from ..errors import ArchiveError, FileTypeError, Stage2Error
from ..formats.sniff import COMPRESSIONS, describe, sniff
from .multipart import MultiPartReader, _archive_label, _order_parts
from .safety import quarantine_fix

_HEADER = struct.Struct("100s8s8s8s12s12s8s1s100s8x32s32s8s8s155s")  # ustar/GNU header up to byte 500
_CHKSUM = slice(148, 156)


class _FastTarInfo(tarfile.TarInfo):
    """TarInfo whose header parsing has a fast path for the common header (plain octal numbers,
    unsigned checksum, not old-GNU sparse); anything else goes to the stock ``frombuf``, which
    the fast path matches field for field (tested)."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        if len(buf) != tarfile.BLOCKSIZE or buf[156:157] == tarfile.GNUTYPE_SPARSE:
            return super().frombuf(buf, encoding, errors)
        try:
            (name, mode, uid, gid, size, mtime, chk, type_, linkname, uname, gname, dmaj, dmin, prefix) = (
                _HEADER.unpack_from(buf)
            )
            # Plain octal numbers, NUL/space padded. Anything else (a NUL inside, GNU base-256
            # numbers) raises ValueError and goes to the stock parser.
            chksum = int(chk.rstrip(b"\0 ") or b"0", 8)
            if chksum != 256 + sum(buf) - sum(buf[_CHKSUM]):
                return super().frombuf(buf, encoding, errors)
            obj = cls()
            obj.name = name.split(b"\0", 1)[0].decode(encoding, errors)
            obj.mode = int(mode.rstrip(b"\0 ") or b"0", 8)
            obj.uid = int(uid.rstrip(b"\0 ") or b"0", 8)
            obj.gid = int(gid.rstrip(b"\0 ") or b"0", 8)
            obj.size = int(size.rstrip(b"\0 ") or b"0", 8)
            obj.mtime = int(mtime.rstrip(b"\0 ") or b"0", 8)
            obj.chksum = chksum
            obj.type = type_
            obj.linkname = linkname.split(b"\0", 1)[0].decode(encoding, errors)
            obj.uname = uname.split(b"\0", 1)[0].decode(encoding, errors)
            obj.gname = gname.split(b"\0", 1)[0].decode(encoding, errors)
            obj.devmajor = int(dmaj.rstrip(b"\0 ") or b"0", 8)
            obj.devminor = int(dmin.rstrip(b"\0 ") or b"0", 8)
            pre = prefix.split(b"\0", 1)[0].decode(encoding, errors)
        except (ValueError, UnicodeError):
            return super().frombuf(buf, encoding, errors)
        if obj.type == tarfile.AREGTYPE and obj.name.endswith("/"):
            obj.type = tarfile.DIRTYPE
        if obj.isdir():
            obj.name = obj.name.rstrip("/")
        if pre and obj.type not in tarfile.GNU_TYPES:
            obj.name = pre + "/" + obj.name
        return obj


class _PartsTarFile(tarfile.TarFile):
    """A TarFile that owns its MultiPartReader: closing the tar closes the parts."""

    tarinfo = _FastTarInfo
    reader: MultiPartReader | None = None
    archive_name: str = ""
    archive_parts: list[Path]

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.reader is not None:
                self.reader.close()

    def __exit__(
        self, typ: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        # TarFile.__exit__ does not call close() when leaving on an exception.
        try:
            super().__exit__(typ, value, tb)
        finally:
            if self.reader is not None:
                self.reader.close()


def _not_a_tar(name: str, head: bytes, kind: str, verified: bool | None) -> FileTypeError:
    what = describe(kind)
    starts = f" (it starts with {head[:6].hex(' ')})" if head else ""
    msg = f"archive {name} is not a tar: its bytes are {what}{starts}; stage2 extracts uncompressed tars."
    if verified:
        if kind in COMPRESSIONS:
            fix = (
                f"{name} is the pinned upstream file (its sha256 matches the pin) and it is {what}, so "
                "downloading it again gives the same bytes: pin the upstream's uncompressed tar instead, "
                "or list this file under [[quarantined]] in the profile and report it upstream"
            )
        else:
            fix = quarantine_fix(name)
    elif verified is False:
        fix = f"the file on disk is not the verified pinned one: delete {name} and re-run the build to download it again"
    else:
        fix = (
            f"if {name} is the pinned upstream file, pin an uncompressed tar or list it under "
            "[[quarantined]] in the profile; if not, delete it and re-run the build to download it again"
        )
    return FileTypeError(msg, found=kind, fix=fix)


def open_archive_parts(paths: Sequence[Path], *, verified: bool | None = None) -> tarfile.TarFile:
    """Open a whole tar, or the split parts of one tar (sorted by name, checked for gaps), in
    random-access mode over a :class:`MultiPartReader`, and read every member header.

    The returned TarFile has all its members loaded (``getmembers()`` is free) and has been checked
    to end with an end-of-archive block: a truncated or corrupt stream raises ArchiveError naming
    the archive (whatever tarfile raised), a file that is another format (gzip, zstd, zip, ...)
    FileTypeError. ``verified`` (every part's sha256 matched its pin; None: not known) chooses the
    fix: a verified archive is never "download it again". Closing the TarFile closes the part files.
    """
    plist = _order_parts(paths)
    name, split = _archive_label(plist)
    for p in plist:
        if not p.is_file():
            what = "split part" if split else "archive"
            raise ArchiveError(
                f"archive {name}: {what} {p} is missing or not a file.",
                fix="re-run the build to download it again",
            )
    try:
        reader = MultiPartReader(plist)
    except OSError as e:
        raise ArchiveError(
            f"archive {name}: cannot read {e.filename or plist}: {e.strerror or e}.",
            fix="check the file's permissions, or delete it and re-run the build to download it again",
        ) from e
    corrupt_fix = (
        f"delete {name} (all its parts) and re-run the build to download it again"
        if split
        else f"delete {name} and re-run the build to download it again"
    )
    if verified and split:
        corrupt_fix = (
            f"check that the profile lists every part of {name} ({plist[0].name} and the ones after it; "
            "`stage2 pin` lists the hub's files), in one sequence; if it does, " + quarantine_fix(name)
        )
    elif verified:
        corrupt_fix = quarantine_fix(name)
    hint = (
        f" The split parts ({', '.join(p.name for p in plist)}) may be incomplete, missing or out of order."
        if split
        else ""
    )
    tar: _PartsTarFile | None = None
    try:
        head = reader.read(tarfile.BLOCKSIZE)
        reader.seek(0)
        kind = sniff(head)
        if kind not in (None, "tar", "empty"):  # an empty file is a truncated tar
            raise _not_a_tar(name, head, kind, verified)
        try:
            tar = _PartsTarFile.open(fileobj=reader, mode="r:")  # type: ignore[assignment]
            assert isinstance(tar, _PartsTarFile)
            tar.reader = reader
            tar.archive_name = name
            tar.archive_parts = plist
            members = tar.getmembers()
        except Stage2Error:
            raise
        except Exception as e:  # noqa: BLE001 - tarfile raises TarError, EOFError, ValueError, ... on odd bytes
            raise ArchiveError(
                f"archive {name} is truncated or corrupt ({reader.size} bytes): {type(e).__name__}: {e}.{hint}",
                fix=corrupt_fix,
            ) from e
        problem = _check_end_of_archive(reader, tar.offset, members)
        if problem:
            raise ArchiveError(f"archive {name} is truncated or corrupt: {problem}.{hint}", fix=corrupt_fix)
    except BaseException:
        if tar is not None:
            tar.reader = None
            with contextlib.suppress(Exception):
                tar.close()
        reader.close()
        raise
    return tar


def _check_end_of_archive(reader: MultiPartReader, end: int, members: Sequence[tarfile.TarInfo]) -> str:
    """'' if the member list ended on an end-of-archive (zero) block, else what is wrong.

    tarfile stops listing silently on a header that is cut off or fails its checksum anywhere
    but at the very start; this is where such a stream is caught."""
    for m in members:
        if m.isreg() and m.offset_data + m.size > reader.size:
            return f"member {m.name!r} needs bytes up to {m.offset_data + m.size} but the data ends at {reader.size}"
    reader.seek(end)
    block = reader.read(tarfile.BLOCKSIZE)
    if len(block) == 0:
        return (
            f"the stream ends at byte {end} without the end-of-archive marker (after {len(members)} members)"
        )
    if len(block) < tarfile.BLOCKSIZE:
        return f"the stream ends inside a header at byte {end} (after {len(members)} members)"
    if block.count(0) != tarfile.BLOCKSIZE:
        return f"invalid tar header at byte {end} (after {len(members)} members)"
    return ""
