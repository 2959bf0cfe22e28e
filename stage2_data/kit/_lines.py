"""The two decoders of a kit JSON Lines file: exact (the reference) and fast (msgspec).

Neither applies a kit rule. The exact decoder yields every non-blank line's JSON value, with its
line number, and turns an unreadable line (not UTF-8, malformed JSON, a string holding a lone
surrogate, not an object) into a located problem. The fast decoder returns the whole file's rows,
typed by a msgspec Struct, only when it is sure to have read exactly what the exact decoder would
(same lines, same values, no unreadable line); on any doubt it returns None and the caller runs the
exact decoder. (msgspec refuses a lone surrogate escape anywhere in a line, skipped fields
included, so such a file always reaches the exact decoder.)
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ..formats.jsonl import read_json_lines

S = TypeVar("S", bound=msgspec.Struct)

# A line's top-level (name, value) pairs, as written: the values are not needed, so numbers are not
# converted (a 5,000-digit integer is no error here) and nested objects stay pair lists.
_PAIRS = json.JSONDecoder(object_pairs_hook=lambda pairs: pairs, parse_int=len, parse_float=len)


def repeated_fields(text: str | bytes, fields: Collection[str]) -> list[str]:
    """The names in ``fields`` that a line's object (well-formed JSON) gives more than once, in
    order: JSON readers disagree on which of the values counts (Python's and msgspec's take the
    last, others the first), so such a line means two things. A line in which no name of ``fields``
    is spelled twice and which holds no ``\\u`` escape (a name may be spelled with one) is not
    decoded again."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    twice = [f for f in fields if raw.count(b'"%s"' % f.encode()) > 1]
    if not twice and b"\\u" not in raw:
        return []
    try:
        pairs = _PAIRS.raw_decode(raw.decode("utf-8").strip())[0]
    except RecursionError:  # a line at the edge of the recursion limit: judged by its spelling
        return twice
    seen: set[str] = set()
    repeated: list[str] = []
    for name, _ in pairs if isinstance(pairs, list) else ():
        if name in fields and name in seen and name not in repeated:
            repeated.append(name)
        seen.add(name)
    return repeated


def repeated_message(where: str, lineno: int, repeated: list[str]) -> str:
    """The problem of a line that gives fields more than once, with its fix."""
    return (
        f"{where}: field(s) {', '.join(repeated)} given more than once on one line (JSON readers "
        f"disagree on which value counts); fix: keep one {repeated[0]!r} on line {lineno}"
    )


def iter_json_lines(
    path: Path, problems: list[tuple[int, str]], fields: Collection[str] = ()
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; an unreadable line becomes a problem
    (appended as (line number, message) before the next line is read), and so does a line that
    gives a name of ``fields`` more than once (:func:`repeated_fields`).

    Lines are numbered as Python's text files count them (``\\n``, ``\\r\\n`` and a lone ``\\r`` end
    a line); surrounding whitespace is ignored."""
    for jl in read_json_lines(path, newlines="universal", strip=True, utf8_errors="line"):
        if not jl.utf8:
            problems.append((jl.line, f"{path}:{jl.line}: not UTF-8 text ({jl.error} at byte {jl.column})"))
        elif not jl.unicode:  # jl.error names the field and the escape
            problems.append(
                (
                    jl.line,
                    f"{path}:{jl.line}: {jl.error} (column {jl.column}); fix: correct the text of line "
                    f"{jl.line}: write the character itself, or escape it as a surrogate pair (a "
                    "\\ud800-\\udbff escape followed by a \\udc00-\\udfff one)",
                )
            )
        elif not jl.ok:
            problems.append(
                (
                    jl.line,
                    f"{path}:{jl.line}: malformed JSON ({jl.error} at column {jl.column}): {jl.text[:80]!r}",
                )
            )
        elif not jl.is_object:
            problems.append(
                (jl.line, f"{path}:{jl.line}: expected a JSON object, found {type(jl.value).__name__}")
            )
        elif fields and (repeated := repeated_fields(jl.text, fields)):
            problems.append((jl.line, repeated_message(f"{path}:{jl.line}", jl.line, repeated)))
        else:
            yield jl.line, jl.value


# Both decoders recurse once per nesting level, each with its own headroom: the fast decoder only
# reads lines whose nesting it can bound well below the recursion limit.
_MAX_FAST_NESTING = 64


def _may_repeat(data: bytes, lines: list[bytes], fields: Collection[str], required: Collection[str]) -> bool:
    """Whether a line of a decoded file gives a name of ``fields`` more than once. The whole file's
    spellings first: a name every line gives (``required``), spelled as many times as there are
    lines, is given once a line; a name whose every two spellings have a line break between them is
    given at most once a line. Only the lines left (a name spelled twice, or a ``\\u`` escape, with
    which a name can be spelled otherwise) are decoded again (:func:`repeated_fields`)."""
    twice = False
    for f in fields:
        pattern = b'"%s"' % f.encode()
        n = data.count(pattern)
        if n <= 1 or (f in required and n == len(lines)):
            continue
        if any(b"\n" not in between for between in data.split(pattern)[1:-1]):
            twice = True
            break
    escaped = b"\\u" in data
    if not twice and not escaped:
        return False
    # repeated_fields decodes again only a line with a name spelled twice or a \u escape
    return any(repeated_fields(line, fields) for line in lines)


def decode_lines_fast(
    path: Path,
    decoder: msgspec.json.Decoder[S],
    *,
    may_nest: bool,
    fields: Collection[str] = (),
    required: Collection[str] = (),
) -> list[S] | None:
    """Every line of ``path`` decoded into the decoder's Struct (one JSON object per line, none
    blank), so that row ``i`` is line ``i + 1``; None when the exact decoder must read the file.
    ``may_nest``: the Struct lets lines hold values of any depth (it ignores unknown fields).
    ``fields``: names a line may give once only (msgspec takes the last of two; the exact decoder
    names the line), of which ``required`` every decoded line gives."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\r" in data:  # a CR is a line break for the exact decoder: let it count the lines
        return None
    if not data.isascii():  # msgspec skips ignored fields unchecked: check the whole file's UTF-8
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    # Every decoded line is an object: with no "[" and one "{" per line, none is nested. Else
    # count the brackets line by line.
    if (
        may_nest
        and (b"[" in data or data.count(b"{") != len(lines))
        and any(line.count(b"{") + line.count(b"[") > _MAX_FAST_NESTING for line in lines)
    ):
        return None
    try:
        rows = list(map(decoder.decode, lines))
    except (msgspec.DecodeError, RecursionError):  # malformed, missing field, wrong type, ...
        return None
    return None if fields and _may_repeat(data, lines, fields, required) else rows
