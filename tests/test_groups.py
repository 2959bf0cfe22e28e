"""The worker groups of tests/_groups.py take effect: under ``--dist loadgroup`` (what ``make test``
runs) the tests of one group run in one worker, so the fixture they share is made once per run.
pytest-xdist silently groups nothing when it cannot rewrite pytest's node ids (pytest-xdist issue
#1386, pytest 9.2), so this runs a small session the way the Makefile does and reads where each
test ran."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from _groups import GROUPS, group_of

CASES = """
import pytest

@pytest.fixture(scope="module")
def built():
    return 1

@pytest.mark.parametrize("i", range(6))
def test_shared(built, i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_single(i):
    pass
"""


# what `make test` runs (Makefile: XDIST), on two workers
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"]


def test_a_fixtures_tests_run_in_one_worker_under_loadgroup(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES, encoding="utf-8")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["_groups"]\n', encoding="utf-8")
    here = Path(__file__).resolve().parent
    done = subprocess.run(
        [*PYTEST, "-v", "--rootdir", str(tmp_path), str(tmp_path / "test_cases.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(here)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = {}
    for m in re.finditer(r"\[(gw\d+)\] \[\s*\d+%\] PASSED \S+::(test_\w+)\[", done.stdout):
        workers.setdefault(m.group(2), set()).add(m.group(1))
    assert workers.get("test_shared"), done.stdout
    assert len(workers["test_shared"]) == 1, f"the group ran on {sorted(workers['test_shared'])}"
    assert "@built" in done.stdout, "xdist did not add the group to the node ids"


def test_a_test_of_several_grouped_fixtures_goes_to_the_first_group() -> None:
    assert group_of({"built", "mutation_bench", "tmp_path"}) == "mutation"
    assert group_of({"tmp_path"}) is None
    assert len({f for f, _ in GROUPS}) == len(GROUPS)
