"""Render the fault matrix of tests/test_faults.py (``FAULTS``) as the README's Markdown table.

``python tests/faults_table.py`` prints the block to paste between the README markers; a test in
test_faults.py checks that README.md holds exactly this block, so the table cannot drift.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

BEGIN = "<!-- faults:begin -->"
END = "<!-- faults:end -->"
CATEGORIES = {
    "network": "Network and hub",
    "archive": "Archives",
    "kit": "Kit",
    "profile": "Profile",
    "process": "Process",
    "secrets": "Secrets",
}


class FaultRow(Protocol):
    id: str
    category: str
    fault: str
    sees: str
    kept: str
    rerun: str


_PLACEHOLDER_RE = re.compile(r"<([^<>\s][^<>]*)>")


def _cell(text: str) -> str:
    """One table cell: one line, ``|`` escaped, ``<placeholder>`` shown as ``‹placeholder›`` (a
    Markdown renderer would drop it as an unknown HTML tag)."""
    return _PLACEHOLDER_RE.sub(r"‹\1›", " ".join(text.split())).replace("|", "\\|")


def render_faults_table(faults: Iterable[FaultRow]) -> str:
    """The Markdown block (markers included): one table, rows grouped by category in table order."""
    rows = list(faults)
    lines = [
        BEGIN,
        "| | fault | what the user sees | what is kept | after the fix, a rerun |",
        "|---|---|---|---|---|",
    ]
    for cat, title in CATEGORIES.items():
        for r in (r for r in rows if r.category == cat):
            lines.append(
                f"| {title} | {_cell(r.fault)} | {_cell(r.sees)} | {_cell(r.kept)} | {_cell(r.rerun)} |"
            )
    lines.append(END)
    return "\n".join(lines) + "\n"


def readme_block(readme: Path) -> str | None:
    """The README's block between the markers (markers included), or None when they are absent."""
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        return None
    start = text.index(BEGIN)
    end = text.index(END, start) + len(END)
    return text[start:end] + "\n"


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_faults import FAULTS

    sys.stdout.write(render_faults_table(FAULTS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
