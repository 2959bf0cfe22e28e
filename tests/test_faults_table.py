"""The fault matrix's rows (tests/faults_table.py) and its tests (tests/test_faults_*.py) match one to
one: every row is tested, once, and every fault test is a row. (README.md's copy of the table:
tests/test_readme.py.)"""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path

from faults_table import CATEGORIES, FAULTS

HERE = Path(__file__).resolve().parent


def _tested_rows() -> list[str]:
    """The row id of every fault test: ``test_fault_<id>``, or each case id of a test parametrized
    with ``helpers.faults.fault_cases``."""
    ids: list[str] = []
    for path in sorted(HERE.glob("test_faults_*.py")):
        if path.name == Path(__file__).name:
            continue
        module = importlib.import_module(path.stem)
        for name, fn in vars(module).items():
            if not (name.startswith("test_fault_") and callable(fn)):
                continue
            cases = [
                m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize" and m.args[0] == "case"
            ]
            if cases:
                ids += [p.id for p in cases[0].args[1]]
            else:
                ids.append(name.removeprefix("test_fault_"))
    return ids


def test_every_row_has_a_test_and_every_test_a_row() -> None:
    rows = [f.id for f in FAULTS]
    assert len(rows) == len(set(rows))
    tested = _tested_rows()
    assert [i for i, n in Counter(tested).items() if n > 1] == []  # no row tested twice
    assert set(tested) == set(rows)
    assert {f.category for f in FAULTS} <= set(CATEGORIES)
    for f in FAULTS:
        assert f.fault and f.sees and f.kept and f.rerun, f.id
