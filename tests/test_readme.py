"""The README's benchmark table is generated from bench/results.json, so the two cannot drift."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from faults_table import FAULTS, readme_block, render_faults_table

from bench.run import render_table

REPO = Path(__file__).resolve().parent.parent


def _block(text: str, name: str) -> str:
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert m, f"README.md has no {name} block"
    return m.group(1).strip()


def test_readme_benchmark_table_matches_results() -> None:
    readme = (REPO / "README.md").read_text()
    doc = json.loads((REPO / "bench" / "results.json").read_text())
    assert _block(readme, "bench") == render_table(doc)
    names = {r["name"] for r in doc["results"]}
    for required in (
        "download_vs_curl",
        "extract_vs_gnu_tar",
        "verify_vs_sha256sum",
        "link_check_full_cardinality_vs_stat_loop",
        "store_build_vs_np_save",
        "store_read_vs_npz_load",
        "store_build_peak_memory",
    ):
        assert required in names


def test_readme_two_setup_commands_exist_in_makefile() -> None:
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    targets = subprocess.run(
        ["make", "-pRrq", "-f", "Makefile"], cwd=REPO, capture_output=True, text=True
    ).stdout
    for t in ("demo:", "test:", "ui:", "bench:"):
        assert re.search(rf"^{t}", targets, re.M), t
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_readme_fault_table_is_rendered_from_the_faults() -> None:
    assert readme_block(REPO / "README.md") == render_faults_table(FAULTS), (
        "README.md's fault table (between <!-- faults:begin --> and <!-- faults:end -->) differs from "
        "tests/faults_table.py's FAULTS; paste the output of `python tests/faults_table.py` there"
    )
