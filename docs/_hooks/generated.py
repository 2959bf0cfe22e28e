"""MkDocs hook: the fault matrix page (docs/faults.md) gets its table from tests/faults_table.py at
build time, so the site always shows the rows the fault tests check.

docs/faults.md holds the markers ``<!-- faults:begin -->`` / ``<!-- faults:end -->``; whatever is
between them in the file is replaced by ``render_faults_table(FAULTS)`` (what
``python tests/faults_table.py`` prints). A page without the markers fails the build.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FAULTS_PAGE = "faults.md"


def _faults_module() -> ModuleType:
    path = REPO / "tests" / "faults_table.py"
    spec = importlib.util.spec_from_file_location("stage2_docs_faults_table", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def fill_faults(markdown: str) -> str:
    """``markdown`` with its fault block replaced by the table rendered from tests/faults_table.py."""
    ft = _faults_module()
    pattern = re.compile(re.escape(ft.BEGIN) + r".*?" + re.escape(ft.END) + r"\n?", re.S)
    if not pattern.search(markdown):
        raise ValueError(f"docs/{FAULTS_PAGE} has no {ft.BEGIN} ... {ft.END} block for the fault table")
    return pattern.sub(lambda _: ft.render_faults_table(ft.FAULTS), markdown, count=1)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == FAULTS_PAGE:
        return fill_faults(markdown)
    return markdown
