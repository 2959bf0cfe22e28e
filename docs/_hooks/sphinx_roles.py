"""A griffe extension (mkdocs.yml: mkdocstrings' ``extensions``): the library's docstrings use Sphinx
roles (``:class:`~stage2_data.loader.Selection```, ``:func:`collate```, ``:mod:`.order```); the
API reference shows each as code (``Selection``, ``collate``, ``.order``), as Sphinx would, instead of
the raw role. An RST literal-block marker (a line ``::``, or ``text::``) becomes nothing (``text:``):
the indented block after it is already code in Markdown. An RST simple table (rows between lines
of ``===``) is shown as a text block, as written."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")
LITERAL_ALONE = re.compile(r"^[ \t]*::[ \t]*$", re.M)
LITERAL_END = re.compile(r"(\S)::[ \t]*$", re.M)
BORDER = re.compile(r"^[ \t]*=+(?: +=+)+[ \t]*$")


def fence_simple_tables(text: str) -> str:
    """Each RST simple table of ``text`` (top border, header rule, bottom border) in a text fence."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        if BORDER.match(lines[i]):
            borders = [j for j in range(i, len(lines)) if BORDER.match(lines[j])][:3]
            if len(borders) == 3:
                out += ["```text", *lines[i : borders[2] + 1], "```"]
                i = borders[2] + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def plain(text: str) -> str:
    """``text`` with every Sphinx role as a code span (``~a.b.C``: just ``C``)."""

    def repl(m: re.Match[str]) -> str:
        target = m[2].split(".")[-1] if m[1] == "~" else m[2]
        return f"`{target}`"

    text = fence_simple_tables(LITERAL_END.sub(r"\1:", LITERAL_ALONE.sub("", text)))
    return ROLE.sub(repl, text)


class SphinxRoles(Extension):
    def on_instance(self, *, obj: Any, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
