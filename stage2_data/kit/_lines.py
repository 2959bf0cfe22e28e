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

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ..formats.jsonl import read_json_lines

S = TypeVar("S", bound=msgspec.Struct)


def iter_json_lines(path: Path, problems: list[tuple[int, str]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; an unreadable line becomes a problem
    (appended as (line number, message) before the next line is read).

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
        else:
            yield jl.line, jl.value


# Both decoders recurse once per nesting level, each with its own headroom: the fast decoder only
# reads lines whose nesting it can bound well below the recursion limit.
_MAX_FAST_NESTING = 64


def decode_lines_fast(path: Path, decoder: msgspec.json.Decoder[S], *, may_nest: bool) -> list[S] | None:
    """Every line of ``path`` decoded into the decoder's Struct (one JSON object per line, none
    blank), so that row ``i`` is line ``i + 1``; None when the exact decoder must read the file.
    ``may_nest``: the Struct lets lines hold values of any depth (it ignores unknown fields)."""
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
        return list(map(decoder.decode, lines))
    except (msgspec.DecodeError, RecursionError):  # malformed, missing field, wrong type, ...
        return None
