"""What a file's first bytes say it is: the magic numbers of compressions and containers.

A file that is not what its name says (a ``.tar`` that is gzip- or zstd-compressed, an ``.npz``
that is not a zip, an HTML error page saved in place of a download) fails in its parser with a
message about corruption, whose usual fix (download it again) cannot work when the bytes are the
pinned ones. :func:`sniff` names the real format from the magic bytes so the error can say so.
"""

from __future__ import annotations

import os

__all__ = ["COMPRESSIONS", "describe", "looks_like_tar", "sniff", "sniff_file"]

#: magic bytes -> format name, longest first where prefixes overlap
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x5d\x00\x00", "lzma"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"7z\xbc\xaf\x27\x1c", "7z"),
    (b"Rar!\x1a\x07", "rar"),
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),  # an empty zip
    (b"\x93NUMPY", "npy"),
    (b"ARROW1", "arrow"),
    (b"PAR1", "parquet"),
    (b"\xff\xff\xff\xff", "arrow"),  # an Arrow IPC stream (continuation marker)
)
#: the compressions tarfile's random-access mode cannot read (stage2 extracts plain tars in place)
COMPRESSIONS = frozenset({"gzip", "zstd", "bzip2", "xz", "lzma", "lz4"})
_NAMES = {
    "gzip": "gzip-compressed",
    "zstd": "zstd-compressed",
    "bzip2": "bzip2-compressed",
    "xz": "xz-compressed",
    "lzma": "lzma-compressed",
    "lz4": "lz4-compressed",
    "7z": "a 7-Zip archive",
    "rar": "a RAR archive",
    "zip": "a zip file",
    "npy": "a plain .npy array",
    "arrow": "an Arrow IPC file",
    "parquet": "a Parquet file",
    "html": "an HTML page (an error or login page saved in place of the file?)",
    "json": "JSON text",
    "tar": "a tar archive",
    "empty": "empty",
}


def looks_like_tar(head: bytes) -> bool:
    """A tar header block: ``ustar`` at byte 257, or a valid header checksum."""
    if len(head) < 512:
        return False
    if head[257:262] == b"ustar":
        return True
    chk = head[148:156].rstrip(b"\0 ")
    try:
        want = int(chk or b"x", 8)
    except ValueError:
        return False
    return want == 256 + sum(head[:148]) + sum(head[156:512])


def sniff(head: bytes) -> str | None:
    """The format the first bytes of a file say (at least 512 of them for a tar), or None when
    they say nothing known. Names: see :data:`_NAMES` (``"gzip"``, ``"zstd"``, ``"zip"``, ``"tar"``,
    ``"html"``, ...)."""
    if not head:
        return "empty"
    if looks_like_tar(head):  # first: a member's name may begin like a magic number
        return "tar"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    text = head[:256].lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html", b"<?xml")):
        return "html"
    if text[:1] in (b"{", b"[") and b"\0" not in head[:256]:
        return "json"
    return None


def sniff_file(path: str | os.PathLike[str]) -> str | None:
    """:func:`sniff` of a file's first 512 bytes (None when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return sniff(f.read(512))
    except OSError:
        return None


def describe(kind: str) -> str:
    """``"gzip"`` -> ``"gzip-compressed"``; words for a message."""
    return _NAMES.get(kind, kind)
