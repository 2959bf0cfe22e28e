"""docs/architecture.md's module map is the tree: every module of the library and of the Dagster layer
has its row, and every row names a module that exists. Its links and the paths it names resolve."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
PACKAGES = ("stage2_data", "assets", "resources", "pipelines", "deploy")


def _map_rows() -> list[str]:
    """The module column of every table row whose first cell is a backticked ``*.py`` path."""
    rows = re.findall(r"^\| `([^`]+\.py)` \|", DOC.read_text(), re.M)
    assert rows, "docs/architecture.md has no module map"
    return rows


def test_every_module_has_one_row_and_every_row_is_a_module() -> None:
    tree = sorted(str(p.relative_to(REPO)) for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))
    rows = _map_rows()
    assert len(rows) == len(set(rows)), "a module has two rows"
    assert sorted(set(tree) - set(rows)) == [], "modules missing from docs/architecture.md's module map"
    assert sorted(set(rows) - set(tree)) == [], "rows of docs/architecture.md naming no module"


def test_links_and_named_files_exist() -> None:
    text = DOC.read_text()
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (DOC.parent / link).exists(), link
    named = set(
        re.findall(r"`((?:tests|bench|stage2_data|assets|resources|pipelines|deploy)/[\w/.-]+\.\w+)`", text)
    )
    named |= set(re.findall(r"\b(tests/[\w/]+\.py)\b", text))
    assert named
    for path in sorted(named):
        assert (REPO / path).exists(), f"docs/architecture.md names {path}, which does not exist"
