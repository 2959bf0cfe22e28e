"""A griffe extension (mkdocs.yml: mkdocstrings' ``extensions``): the library's docstrings use Sphinx
roles (``:class:`~stage2_data.loader.Selection```, ``:func:`collate```, ``:mod:`.order```); the
API reference shows each as code (``Selection``, ``collate``, ``.order``), as Sphinx would, instead of
the raw role."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every Sphinx role as a code span (``~a.b.C``: just ``C``)."""

    def repl(m: re.Match[str]) -> str:
        target = m[2].split(".")[-1] if m[1] == "~" else m[2]
        return f"`{target}`"

    return ROLE.sub(repl, text)


class SphinxRoles(Extension):
    def on_instance(self, *, obj: Any, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
