"""Every code block of README.md and of the docs (docs/**/*.md) runs as written, so pasted code works.

The blocks run against the demo's store, in a folder laid out as the repository is after
`make demo`: ``.demo/`` built by ``stage2 demo --out .demo`` (what `make demo` runs) and ``.venv``
(this interpreter's environment, linked). A ```python block runs as a whole program in a fresh
``python`` process there; a ```bash (or sh, shell, console) block runs in ``bash -e`` there, with
``.venv/bin`` first on PATH. ```text blocks (diagrams, layouts, synopses) and data blocks (json,
toml) are not code.

A block that cannot run here is marked on the line above its opening fence with
``<!-- docs-test: skip=REASON (why) -->``, REASON one of :data:`SKIP_REASONS`; such blocks are
listed as skipped, with their file, line and reason. A python block that imports torch is skipped
where torch is not installed (CI installs ``torch==2.13.0`` in a step of its own, .ci/run); where
it is, the DataLoader blocks run with their workers started by spawn, as they are written.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.cli import python, stage2

REPO = Path(__file__).resolve().parent.parent
DEMO_STORE = ".demo/data/stores/stage2_core_v1_demo/current"
#: why a block may be left out: the real hub, a cluster (or a database server), a GPU, or the
#: set-up and install commands themselves (`make demo`, `make test`, `pip install`)
SKIP_REASONS = {"hub", "cluster", "gpu", "setup"}
RUNNABLE = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash", "console": "bash"}
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.S | re.M
)
MARKER = re.compile(r"<!--\s*docs-test:\s*skip=(?P<reason>[\w-]+)(?P<why>[^>]*)-->")


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository
    line: int  # of the opening fence
    lang: str
    code: str
    skip: str | None  # the marker's reason
    why: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def code_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` whose language is code (:data:`RUNNABLE`), with its marker."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in FENCE.finditer(text):
        lang = m["lang"].lower()
        if lang not in RUNNABLE:
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        code = "\n".join(x[len(m["indent"]) :] for x in m["code"].split("\n"))
        blocks.append(
            Block(
                file=str(path.relative_to(REPO)),
                line=line,
                lang=RUNNABLE[lang],
                code=code,
                skip=marker["reason"] if marker else None,
                why=marker["why"].strip() if marker else "",
            )
        )
    return blocks


BLOCKS = [b for p in markdown_files() for b in code_blocks(p)]


def test_the_docs_have_the_blocks_this_runs() -> None:
    readme = [b for b in BLOCKS if b.file == "README.md"]
    assert any("VinOfflineDataset" in b.code for b in readme)
    dataloader = [b for b in readme if "DataLoader(" in b.code]
    assert dataloader and all(
        'if __name__ == "__main__":' in b.code and "persistent_workers=True" in b.code and b.skip is None
        for b in dataloader
    ), "README's DataLoader block must be spawn-safe, keep its workers, and run in this test"
    assert all(DEMO_STORE in b.code for b in readme if b.lang == "python" and b.skip is None)
    docs = [b for b in BLOCKS if b.file.startswith("docs/")]
    assert any("PoolLoader" in b.code for b in docs) and any("load_state_dict" in b.code for b in docs)


def test_blocks_left_out_are_marked_with_a_known_reason() -> None:
    """Lists the blocks that do not run (pytest -rs shows them too), each with its reason."""
    left_out = [b for b in BLOCKS if b.skip is not None]
    for b in left_out:
        print(f"not run: {b.id} ({b.lang}) skip={b.skip} {b.why}")
    assert {b.skip for b in left_out} <= SKIP_REASONS, [b.id for b in left_out if b.skip not in SKIP_REASONS]
    assert len(left_out) < len(BLOCKS) / 2  # most blocks run


@pytest.fixture(scope="module")
def demo_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as the repository after `make demo`: ``.demo`` and ``.venv``."""
    ws = tmp_path_factory.mktemp("docs-code")
    (ws / ".venv").symlink_to(Path(sys.prefix))
    (ws / ".dagster_home").mkdir()  # as `make demo` does (the Makefile exports DAGSTER_HOME)
    built = stage2("demo", "--out", str(ws / ".demo"), cwd=ws, env=_env(ws), timeout=600)
    assert built.returncode == 0, built.tail()
    assert (ws / DEMO_STORE).is_dir()
    return ws


def _env(ws: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{ws / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    env["DAGSTER_HOME"] = str(ws / ".dagster_home")  # never the repository's instance
    return env


@pytest.mark.slow  # the demo_workspace fixture builds the demo (a whole `stage2 demo`)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_code_block_runs_as_written(block: Block, demo_workspace: Path) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.id}: marked skip={block.skip} {block.why}")
    if (
        block.lang == "python"
        and re.search(r"^\s*(import|from) torch\b", block.code, re.M)
        and importlib.util.find_spec("torch") is None
    ):
        pytest.skip(f"{block.id} imports torch, which is not installed here (.ci/run installs it)")
    if block.lang == "python":
        ran = python(block.code, cwd=demo_workspace, env=_env(demo_workspace), timeout=300)
        out, rc = ran.tail(), ran.returncode
    else:
        p = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.code],
            cwd=demo_workspace,
            env=_env(demo_workspace),
            capture_output=True,
            text=True,
            timeout=300,
        )
        out, rc = (p.stdout + p.stderr)[-3000:], p.returncode
    assert rc == 0, f"{block.id} ({block.lang}) failed with exit {rc}:\n{out}"
