"""``sha256sum`` checksum files: every spelling ``sha256sum`` writes or ``sha256sum -c`` accepts.

One line per file, any of:

* ``<hex>  <name>`` (text mode) and ``<hex> *<name>`` (binary mode), as ``sha256sum`` writes;
* ``<hex> <name>`` (one space: the "reversed BSD" form ``sha256sum -c`` also accepts);
* ``SHA256 (<name>) = <hex>`` (``sha256sum --tag``; the space before ``(`` is optional);
* any of these with a leading ``\\``: the name is escaped (``\\\\`` a backslash, ``\\n`` a newline,
  ``\\r`` a carriage return), as ``sha256sum`` writes names holding those characters.

The digest may be upper or lower case (entries hold it in lower case). Lines end at ``\\n``; one
``\\r`` before it (a CRLF file) is dropped. A file holding NUL bytes is ``sha256sum -z`` output:
records end at NUL and names are not escaped. Blank lines and ``#`` comment lines are skipped.
Names are kept as written (a ``./`` prefix included): what a name may be, and which file it names,
is the caller's rule. A line repeated with the same digest (as ``cat a.sums b.sums`` gives) is
kept once; every malformed line (a line that is not UTF-8 included) and every name listed again
with another digest is gathered and reported at once, with its line number: :func:`read_sha256sums`
returns them beside the entries of the well-formed lines (one bad line is one problem, the other
lines still count, as the pair manifest's reader does), :func:`parse_sha256sums` raises them (a
:class:`~stage2_data.errors.ProblemsError`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import FileSystemError, ProblemsError
from ..fsutil import file_kind

__all__ = [
    "ChecksumEntry",
    "ChecksumFile",
    "file_kind",
    "format_sha256sums",
    "parse_sha256sums",
    "parse_sha256sums_text",
    "read_regular_bytes",
    "read_sha256sums",
    "read_sha256sums_text",
    "read_single_sha256_file",
]

_GNU_RE = re.compile(r"^(?P<hex>[0-9a-fA-F]{64})[ \t](?P<mode>[ *]?)(?P<name>.+)$", re.DOTALL)
_TAG_RE = re.compile(r"^SHA256 ?\((?P<name>.*)\)[ \t]*=[ \t]*(?P<hex>[0-9a-fA-F]{64})$", re.DOTALL)
_UNESCAPE = {"\\": "\\", "n": "\n", "r": "\r"}
_UNDECODED_RE = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, as surrogateescape keeps it


@dataclass(frozen=True)
class ChecksumEntry:
    digest: str  # 64 lowercase hex
    path: str  # the name as the file gives it (unescaped)
    line: int  # 1-based


@dataclass(frozen=True)
class ChecksumFile:
    """What a checksum file holds: the entries of its well-formed lines, every problem
    (``<file>:<line>: ...``), and each malformed line as (line number, its text)."""

    entries: list[ChecksumEntry]
    problems: list[str]
    malformed: list[tuple[int, str]]


def _unescape(name: str) -> str | None:
    out: list[str] = []
    i = 0
    while i < len(name):
        c = name[i]
        if c == "\\":
            nxt = _UNESCAPE.get(name[i + 1 : i + 2])
            if nxt is None:
                return None
            out.append(nxt)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _parse_line(line: str, *, zero: bool = False) -> tuple[str, str] | None:
    """(digest, name) of one line, or None when it is not a sha256sum line (``zero``: a record of
    ``sha256sum -z`` output, whose names are never escaped)."""
    s = line.lstrip(" \t")
    escaped = not zero and s.startswith("\\")
    if escaped:
        s = s[1:]
    m = _TAG_RE.match(s) or _GNU_RE.match(s)
    if m is None:
        return None
    name = m.group("name")
    if escaped:
        unescaped = _unescape(name)
        if unescaped is None:
            return None
        name = unescaped
    if not name:
        return None
    return m.group("hex").lower(), name


def read_sha256sums_text(text: str, where: str) -> ChecksumFile:
    """The entries of every well-formed line of a checksum file's text and every problem, each
    located (``<where>:<line>: ...``): a malformed line is one problem and is skipped; a name listed
    again with another digest is one problem and keeps its first line's digest."""
    entries: list[ChecksumEntry] = []
    problems: list[str] = []
    malformed: list[tuple[int, str]] = []
    seen: dict[str, ChecksumEntry] = {}
    zero = "\0" in text
    undecoded = _UNDECODED_RE.search(text) is not None  # text decoded with errors="surrogateescape"
    lines = text.split("\0" if zero else "\n")
    if lines and lines[-1] in ("", "\n"):
        lines.pop()
    for lineno, raw in enumerate(lines, start=1):
        line = raw[:-1] if raw.endswith("\r") and not zero else raw
        if undecoded and _UNDECODED_RE.search(line):
            problems.append(f"{where}:{lineno}: not UTF-8 text")
            malformed.append((lineno, line))
            continue
        if not line.strip() or line.startswith("#"):
            continue
        parsed = _parse_line(line, zero=zero)
        if parsed is None:
            problems.append(f"{where}:{lineno}: not '<64 hex>  <path>': {line[:80]!r}")
            malformed.append((lineno, line))
            continue
        digest, rel = parsed
        first = seen.get(rel)
        if first is not None:
            if first.digest != digest:
                problems.append(
                    f"{where}:{lineno}: {rel} listed again with another sha256 {digest} "
                    f"(line {first.line} says {first.digest})"
                )
            continue  # the same line again: sha256sum -c checks it twice; once is enough
        seen[rel] = entry = ChecksumEntry(digest, rel, lineno)
        entries.append(entry)
    return ChecksumFile(entries, problems, malformed)


def _malformed_error(where: str, problems: list[str]) -> ProblemsError:
    return ProblemsError(
        f"malformed checksum file {where}",
        problems,
        fix=f"regenerate {Path(where).name} with `sha256sum`",
    )


def parse_sha256sums_text(text: str, where: str) -> list[ChecksumEntry]:
    """Parse the text of a checksum file; ``where`` names it in problems (``<where>:<line>: ...``).
    Raises ProblemsError listing every problem (see :func:`read_sha256sums_text`)."""
    got = read_sha256sums_text(text, where)
    if got.problems:
        raise _malformed_error(where, got.problems)
    return got.entries


def not_regular_error(path: str | os.PathLike[str], mode: int) -> FileSystemError:
    """The error of a FIFO, device, socket or folder found where a regular file should be."""
    return FileSystemError(
        f"{os.fspath(path)} is {file_kind(mode)}, not a regular file; nothing was read from it.",
        fix=f"put the regular file itself at {os.fspath(path)} (a copy of the kit's file)",
    )


def read_regular_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file at ``path`` (a link to one is followed). A FIFO, device, socket
    or folder there raises :class:`~stage2_data.errors.FileSystemError` naming what it is, without
    blocking (:func:`~stage2_data.fsutil.open_regular`). Raises FileNotFoundError when nothing is
    there."""
    from ..fsutil import open_regular

    fd = open_regular(path, os.O_RDONLY, refuse=lambda mode: not_regular_error(path, mode))
    with os.fdopen(fd, "rb") as f:
        return f.read()


def read_sha256sums(path: str | os.PathLike[str]) -> ChecksumFile:
    """Read a ``sha256sum`` file (any spelling above): the entries of its well-formed lines and every
    problem (see :func:`read_sha256sums_text`); a line that is not UTF-8 is one problem, a file that
    is not UTF-8 text at all (NUL bytes too: UTF-16, say) one problem and no entries. Raises
    FileNotFoundError, or FileSystemError (not a regular file: a FIFO is never opened for reading,
    nothing blocks)."""
    p = Path(path)
    data = read_regular_bytes(p)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if b"\0" in data:
            lineno = data[: e.start].count(b"\n") + 1
            return ChecksumFile([], [f"{p}:{lineno}: not UTF-8 text"], [])
        text = data.decode("utf-8", errors="surrogateescape")
    return read_sha256sums_text(text, str(p))


def parse_sha256sums(path: str | os.PathLike[str]) -> list[ChecksumEntry]:
    """Parse a ``sha256sum`` file (any spelling above). Raises FileNotFoundError, FileSystemError
    (not a regular file: a FIFO is never opened for reading, nothing blocks), or ProblemsError
    listing every malformed line (file:line) and duplicate path; a line that is not UTF-8 is one
    problem (see :func:`read_sha256sums`, which returns them instead)."""
    got = read_sha256sums(path)
    if got.problems:
        raise _malformed_error(str(Path(path)), got.problems)
    return got.entries


def read_single_sha256_file(path: str | os.PathLike[str]) -> tuple[str, str]:
    """Read a one-line ``.sha256`` file; returns (digest, named file)."""
    entries = parse_sha256sums(path)
    if len(entries) != 1:
        raise ProblemsError(
            f"checksum file {path}",
            [f"expected exactly one line, found {len(entries)}"],
            fix=f"write it with `sha256sum FILE > {Path(path).name}`",
        )
    return entries[0].digest, entries[0].path


def format_sha256sums(entries: Iterable[tuple[str, str]]) -> str:
    """The text ``sha256sum`` writes (text mode) for (digest, name) pairs, in the given order; a
    name holding a backslash, newline or carriage return is escaped and its line starts with ``\\``."""
    out: list[str] = []
    for digest, name in entries:
        if any(c in name for c in "\\\n\r"):
            esc = name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
            out.append(f"\\{digest}  {esc}\n")
        else:
            out.append(f"{digest}  {name}\n")
    return "".join(out)
