"""The contracts live in the product (docs/spec/, see its README): every ``docs/spec/...`` path that
the README, the docs, the profiles or the code name exists, each contract records its changes, and
nothing points users at the project brief's copy, which a clone does not have."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "docs" / "spec"
SPEC_PATH = re.compile(r"docs/spec/[\w./-]*\w")
# The brief's copy, as a user would have been told to look for it.
BRIEF_COPY = re.compile(r"(?<![\w/])(?:\.\./)?shared[/]spec\b")
CODE_DIRS = ("stage2_data", "assets", "resources", "pipelines")


def _product_files() -> list[Path]:
    files = [
        REPO / "README.md",
        *sorted((REPO / "docs").rglob("*.md")),
        *sorted((REPO / "manifests").glob("*.toml")),
    ]
    for d in CODE_DIRS:
        files += sorted((REPO / d).rglob("*.py"))
    return [f for f in files if f.is_file()]


def test_every_named_spec_path_exists() -> None:
    named = {
        (f.relative_to(REPO).as_posix(), m.group(0))
        for f in _product_files()
        for m in SPEC_PATH.finditer(f.read_text(encoding="utf-8"))
    }
    assert any(path.startswith("README") for path, _ in named), "README.md names no docs/spec/ file"
    missing = sorted(f"{path}: {ref}" for path, ref in named if not (REPO / ref).exists())
    assert not missing, missing


def test_each_contract_has_a_changelog() -> None:
    contracts = sorted(p.name for p in SPEC.glob("*.md") if p.name != "README.md")
    assert contracts == ["kit-format.md", "profile.md", "vin-store.md"]
    readme = (SPEC / "README.md").read_text(encoding="utf-8")
    for name in contracts:
        assert name in readme, f"docs/spec/README.md does not list {name}"
        assert re.search(r"^## Changelog$", (SPEC / name).read_text(encoding="utf-8"), re.M), name


def test_nothing_points_at_the_briefs_copy() -> None:
    found = [
        f"{f.relative_to(REPO).as_posix()}:{n}: {line.strip()}"
        for f in _product_files()
        if f.parent != SPEC  # the contracts' changelogs say where they were copied from
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if BRIEF_COPY.search(line)
    ]
    assert not found, "point these at docs/spec/ instead:\n" + "\n".join(found)
