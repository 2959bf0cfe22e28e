"""JSON Lines: line-exact reading (with line numbers and per-line problems) and canonical writing.

Two readings of "a line" exist in the product and both are kept, chosen by ``newlines``:

* ``"lf"`` (the store's files): lines end at ``"\\n"`` only. JSON text may hold U+2028 and the
  like (``str.splitlines`` would split on them) and a lone ``"\\r"`` is part of its line.
* ``"universal"`` (the kit's manifests, as ``open(path, encoding="utf-8")`` iterates them):
  ``"\\n"``, ``"\\r\\n"`` and a lone ``"\\r"`` each end a line.

and two ways of decoding a line, chosen by ``strip``:

* ``strip=False``: ``json.loads`` of the line (leading/trailing JSON whitespace allowed);
* ``strip=True`` (the kit): the line is ``str.strip()``-ed, then exactly one JSON value must fill
  it (anything after it is "extra data after the JSON value"); columns count in the stripped text.

:func:`iter_json_lines` yields every line as a :class:`JsonLine`: its number, its text, and either
the decoded value or the JSON error (message and column). What a caller requires of the value (an
object, these fields) and how it words a problem stays with the caller.

A line whose JSON is well formed but whose strings are not Unicode text is a problem of its own
(``unicode=False``), whoever reads it: a ``\\ud800``-style escape of a lone surrogate (a high
surrogate not followed by a low one, or a low one alone) decodes in Python to a str that no UTF-8
encoder accepts, so a value carried on would crash its writer far from the line. Keys count as
strings, and so do values nested at any depth or in fields the caller ignores (as a line's bytes
that are not UTF-8 do).
"""

from __future__ import annotations

import decimal
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import FormatError

__all__ = [
    "JsonLine",
    "Newlines",
    "Utf8Errors",
    "dumps_line",
    "iter_json_lines",
    "jsonl_bytes",
    "read_json_lines",
    "split_lines",
]

Newlines = Literal["lf", "universal"]
Utf8Errors = Literal["raise", "line"]

_INT_DIGITS = 4000  # below Python's int <-> str conversion limit (4300 digits)


def _json_int(text: str) -> int:
    """A JSON integer of any length (``int()`` refuses more than 4300 digits)."""
    return int(text) if len(text) <= _INT_DIGITS else int(decimal.Decimal(text))


_DECODER = json.JSONDecoder(parse_int=_json_int)


@dataclass(frozen=True, slots=True)
class JsonLine:
    """One line of a JSONL file. ``error`` is None when ``value`` was decoded."""

    line: int  # 1-based
    text: str  # the line without its line break (stripped when read with strip=True)
    value: Any = None
    error: str | None = None  # json's message, e.g. "Expecting value" (or why the line is not UTF-8)
    column: int = 0  # 1-based column of the error (byte, when the line is not UTF-8)
    utf8: bool = True  # False: the line is not UTF-8 text (``text`` is then "")
    unicode: bool = True  # False: a decoded string holds a lone surrogate (``error`` says which, where)
    key: str | None = None  # unicode=False: the top-level field holding it (None: the line is no object)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def is_object(self) -> bool:
        return self.error is None and isinstance(self.value, dict)


def split_lines(data: bytes | str, *, newlines: Newlines = "lf") -> list[str]:
    """The lines of a text (UTF-8 when bytes), without their line breaks; a last line without a
    break counts, an empty tail after the last break does not."""
    text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    if newlines == "universal":
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


# A lone surrogate can only come from a \\uD800-\\uDFFF escape (or be in str input already): a line
# without either is not walked (the cheap tests first: most lines have no "\\u" at all).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# The escapes of a decoded line, in order: a surrogate pair, a lone surrogate (group 1), any other
# escape (so "\\\\ud800" is a backslash and text), a surrogate character itself (group 2).
_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    r"|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})|\\.|([\ud800-\udfff])",
    re.DOTALL,
)
_SURROGATE = re.compile(r"[\ud800-\udfff]")

_Path = tuple[str | int, ...]


def _lone_surrogate(value: Any) -> tuple[str, _Path, bool] | None:
    """The first lone surrogate in the strings of a decoded JSON value (keys included, in document
    order): (the code point as a JSON escape, the keys and indexes leading to it, whether it is in a
    key); None when every string is Unicode text. (Iterative: a value may nest deeply.)"""
    stack: list[tuple[Any, _Path, bool]] = [(value, (), False)]
    while stack:
        v, path, is_key = stack.pop()
        if type(v) is str:
            m = _SURROGATE.search(v)
            if m:
                return f"\\u{ord(m.group()):04x}", path, is_key
        elif isinstance(v, dict):
            for k, item in reversed(v.items()):
                stack.append((item, (*path, k), False))
                stack.append((k, (*path, k), True))
        elif isinstance(v, list):
            stack.extend((item, (*path, i), False) for i, item in reversed(list(enumerate(v))))
    return None


def _where(path: _Path, is_key: bool) -> str:
    """A place in a line's value, in words: "field 'task'", "the name of field 'x'", "field 'extra'
    (at ['a'][0])", "field 'extra' (a key at ['a'])", "the line's value (at [2])". Names are
    ``repr``-ed (a lone surrogate shows as its escape)."""
    if path and isinstance(path[0], str):
        whole, rest = f"field {path[0]!r}", path[1:]
    else:
        whole, rest = "the line's value", path
    if is_key and not rest:
        return f"the name of {whole}"
    if not rest:
        return whole
    at = "".join(f"[{p!r}]" for p in rest)
    return f"{whole} ({'a key ' if is_key else ''}at {at})"


def _surrogate_column(text: str) -> int:
    """The 1-based column of the first lone surrogate in a decoded line's text (0: none seen)."""
    for m in _ESCAPE.finditer(text):
        if m.lastindex:
            return m.start() + 1
    return 0


def _not_unicode(lineno: int, text: str, value: Any) -> JsonLine | None:
    """The line as a problem when a string of its decoded value holds a lone surrogate."""
    if not (("\\u" in text and _SURROGATE_ESCAPE.search(text)) or _SURROGATE.search(text)):
        return None
    found = _lone_surrogate(value)
    if found is None:
        return None
    escape, path, is_key = found
    error = f"{_where(path, is_key)} holds a lone surrogate ({escape}), which is not valid Unicode text"
    key = path[0] if path and isinstance(path[0], str) else None
    return JsonLine(lineno, text, None, error, _surrogate_column(text), unicode=False, key=key)


def _decode(text: str, strip: bool) -> tuple[Any, str | None, int]:
    try:
        if not strip:
            return _DECODER.decode(text), None, 0
        obj, end = _DECODER.raw_decode(text)
        if end != len(text):
            raise json.JSONDecodeError("extra data after the JSON value", text, end)
        return obj, None, 0
    except json.JSONDecodeError as e:
        return None, e.msg, e.colno
    except RecursionError:
        return None, "nested too deeply", 1


def _split_bytes(data: bytes, newlines: Newlines) -> list[bytes]:
    """:func:`split_lines` of undecoded bytes (no UTF-8 sequence holds a CR or LF byte)."""
    if newlines == "universal":
        return data.splitlines()  # bytes: breaks at \n, \r\n and \r only
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def iter_json_lines(
    data: bytes | str,
    *,
    newlines: Newlines = "lf",
    strip: bool = False,
    skip_blank: bool = True,
    utf8_errors: Utf8Errors = "raise",
) -> Iterator[JsonLine]:
    """Every line of ``data`` decoded on its own. Blank lines (whitespace only) are skipped unless
    ``skip_blank`` is False (then they are lines with the error "Expecting value"). Bytes that are
    not UTF-8 raise FormatError (naming the line and byte), or with ``utf8_errors="line"`` make their
    line a :class:`JsonLine` with ``utf8=False`` (the other lines are read as usual)."""
    if utf8_errors == "line" and isinstance(data, bytes | bytearray):
        for lineno, raw_bytes in enumerate(_split_bytes(bytes(data), newlines), start=1):
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as e:
                yield JsonLine(lineno, "", None, e.reason, e.start + 1, utf8=False)
                continue
            yield from _decode_line(lineno, raw, strip, skip_blank)
        return
    try:
        lines = split_lines(data, newlines=newlines)
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1 if isinstance(data, bytes | bytearray) else 1
        raise FormatError(f"line {line}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for lineno, raw in enumerate(lines, start=1):
        yield from _decode_line(lineno, raw, strip, skip_blank)


def _decode_line(lineno: int, raw: str, strip: bool, skip_blank: bool) -> Iterator[JsonLine]:
    if skip_blank and not raw.strip():
        return
    text = raw.strip() if strip else raw
    value, error, column = _decode(text, strip)
    bad = _not_unicode(lineno, text, value) if error is None else None
    yield bad or JsonLine(lineno, text, value, error, column)


def read_json_lines(
    path: str | os.PathLike[str],
    *,
    newlines: Newlines = "lf",
    strip: bool = False,
    skip_blank: bool = True,
    utf8_errors: Utf8Errors = "raise",
) -> Iterator[JsonLine]:
    """:func:`iter_json_lines` over a file's bytes (UTF-8; see ``utf8_errors``). Raises OSError,
    or FormatError naming the file."""
    lines = iter_json_lines(
        Path(path).read_bytes(),
        newlines=newlines,
        strip=strip,
        skip_blank=skip_blank,
        utf8_errors=utf8_errors,
    )
    try:
        yield from lines
    except FormatError as e:
        raise FormatError(e.detail, file=os.fspath(path)) from None


def dumps_line(obj: Any, *, compact: bool = True) -> str:
    """One JSONL line (with its ``"\\n"``). ``compact`` (the store's canonical form): no spaces,
    UTF-8 kept, NaN refused. ``compact=False``: ``json.dumps`` defaults (the kit manifests the demo
    writes: ``", "`` / ``": "`` separators, ASCII escapes)."""
    if compact:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
    return json.dumps(obj) + "\n"


def jsonl_bytes(rows: Iterable[Any], *, compact: bool = True) -> bytes:
    """The UTF-8 bytes of a JSONL file, one :func:`dumps_line` per row."""
    return "".join(dumps_line(r, compact=compact) for r in rows).encode("utf-8")
