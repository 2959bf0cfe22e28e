"""Every ```python block of README.md runs, so the README's code cannot drift from the library.

The convention (stated in README.md beside the blocks): each block is a whole program, run as it is
in a fresh ``python`` process, except that the data root ``/data/stage2`` it names is replaced by the
data root of a small store this module builds (``stores/stage2_core_v1/current`` -> that store,
built from real npz files of two resolutions and the sources ``autoeval`` and ``racer``). A block
that imports torch runs where torch is importable and is skipped elsewhere, saying so.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from helpers.cli import python
from test_store import build, make_upstream

REPO = Path(__file__).resolve().parent.parent
DATA_ROOT = "/data/stage2"


def python_blocks() -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of README.md."""
    text = (REPO / "README.md").read_text()
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)
    ]


BLOCKS = python_blocks()


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("readme-code")
    up = make_upstream(base / "up", range(1, 41))
    stores = base / "root" / "stores" / "stage2_core_v1"
    build(stores / "v1-0123456789abcdef", up, rows_per_shard=4)
    (stores / "current").symlink_to("v1-0123456789abcdef")
    return base / "root"


def test_the_readme_has_the_blocks_this_runs() -> None:
    codes = [code for _, code in BLOCKS]
    assert any("VinOfflineDataset" in c for c in codes)
    assert any("PoolLoader" in c for c in codes) and any("DataLoader(" in c for c in codes)


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs(line: int, code: str, data_root: Path) -> None:
    if re.search(r"^\s*(import|from) torch\b", code, re.M) and importlib.util.find_spec("torch") is None:
        pytest.skip(f"README.md:{line} imports torch, which is not installed here")
    ran = python(code.replace(DATA_ROOT, str(data_root)), cwd=data_root.parent, timeout=240)
    assert ran.returncode == 0, f"README.md:{line} failed:\n{ran.tail()}"
