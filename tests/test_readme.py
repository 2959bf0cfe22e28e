"""README.md is a landing page: short, narrow, true to the Makefile and pyproject.toml, and its links
lead to pages that exist. (Its code blocks run in tests/test_readme_code.py; the benchmark table and
the fault matrix live in the docs: tests/test_docs.py.)"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_LINES, MAX_WIDTH = 250, 100


def _text() -> str:
    return README.read_text(encoding="utf-8")


def test_readme_is_short_and_narrow() -> None:
    lines = _text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; at most {MAX_LINES}"
    wide = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > MAX_WIDTH]
    assert wide == [], f"README.md lines over {MAX_WIDTH} characters (line, width): {wide}"


def test_readme_two_setup_commands_exist_in_makefile() -> None:
    readme = _text()
    assert "make demo" in readme and "make test" in readme
    targets = subprocess.run(
        ["make", "-pRrq", "-f", "Makefile"], cwd=REPO, capture_output=True, text=True
    ).stdout
    for t in ("demo:", "test:", "ui:", "bench:", "docs:"):
        assert re.search(rf"^{t}", targets, re.M), t
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_readme_lists_every_extra() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = _text()
    missing = [name for name in extras if f"| `{name}` |" not in readme]
    assert missing == [], f"README.md's extras table lacks {missing}"


def test_readme_says_how_to_install_without_a_package_index() -> None:
    readme = _text()
    assert "pip install stage2-data" not in readme  # not on an index: it would find nothing
    assert "pip install ." in readme and "pip wheel" in readme and "git+" in readme


def test_readme_defines_its_words_before_using_them() -> None:
    readme = _text()
    assert "VIN offline store format" in readme
    for word in ("kit", "sidecar"):
        first = re.search(rf"\b{word}\b", readme)
        assert first is not None, word
        defined = readme.find(f"**{word}**")
        assert defined != -1 and defined <= first.start() - 2, f"README.md uses '{word}' before defining it"


def test_readme_opens_the_demo_store_and_trains_spawn_safe() -> None:
    readme = _text()
    assert ".demo/data/stores/stage2_core_v1_demo/current" in readme
    assert 'if __name__ == "__main__":' in readme and "persistent_workers=True" in readme
    assert "/data/stage2" not in readme  # the demo's own path, so the code runs as pasted


def test_readme_links_lead_somewhere() -> None:
    """Every relative link of README.md names a file of the repository (and a docs page's anchor, a
    heading of that page)."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = REPO / path
        if not file.is_file():
            bad.append(target)
            continue
        if anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            if anchor not in slugs:
                bad.append(target)
    assert bad == [], f"README.md links to missing files or headings: {bad}"
    assert "docs/index.md" in _text() or "docs/getting-started.md" in _text()
