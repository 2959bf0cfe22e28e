"""The docs site (mkdocs.yml, docs/) builds strict, and its generated parts match their sources: the
fault matrix (tests/faults_table.py, filled in at build time by docs/_hooks/generated.py), the
benchmark table and plot (bench/results.json, written by ``python -m bench.readme``), and the API
reference of the public library modules."""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from faults_table import CATEGORIES, FAULTS, render_faults_table

from bench.readme import PAGE, PLOT, page_block, render_svg

REPO = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"


def _results() -> dict:
    return json.loads((REPO / "bench" / "results.json").read_text())


def test_benchmark_page_table_matches_results() -> None:
    doc = _results()
    page = PAGE.read_text(encoding="utf-8")
    m = re.search(r"<!-- bench:begin -->\n.*?<!-- bench:end -->", page, re.S)
    assert m, "docs/benchmarks.md has no bench block"
    assert m.group(0) == page_block(doc), (
        "docs/benchmarks.md's table differs from bench/results.json; run `python -m bench.readme`"
    )
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


def test_benchmark_plot_matches_results() -> None:
    doc = _results()
    assert PLOT.read_text(encoding="utf-8") == render_svg(doc), (
        "docs/assets/bench/ratios.svg differs from bench/results.json; run `python -m bench.readme`"
    )
    svg = render_svg(doc)
    with_target = [r for r in doc["results"] if r.get("target") is not None]
    assert svg.count("<circle ") == len(with_target)  # one dot per benchmark with a target
    missed = [r["name"] for r in with_target if not r.get("meets_target")]
    assert svg.count(" missed</text>") == len(missed)


def test_fault_hook_fills_the_table_from_the_rows() -> None:
    spec = importlib.util.spec_from_file_location("docs_hook_under_test", REPO / "docs/_hooks/generated.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (REPO / "docs" / "faults.md").read_text(encoding="utf-8")
    filled = hook.fill_faults(page)
    assert render_faults_table(FAULTS) in filled
    assert filled.count("<!-- faults:begin -->") == 1
    with pytest.raises(ValueError, match="faults:begin"):
        hook.fill_faults("# no table here\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built as CI builds it: ``mkdocs build --strict``."""
    if not MKDOCS.exists():
        pytest.skip("mkdocs is not installed (the `docs` extra; `dev` includes it)")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    p = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, f"mkdocs build --strict failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}"
    return out


def test_site_builds_strict_with_every_page(site: Path) -> None:
    for page in (
        "getting-started",
        "glossary",
        "training",
        "commands",
        "operating",
        "real-hub",
        "scaling",
        "benchmarks",
        "faults",
        "development",
        "architecture",
        "spec/vin-store",
        "spec/kit-format",
        "spec/profile",
        "api/store",
        "api/loader",
        "api/errors",
    ):
        assert (site / page / "index.html").is_file(), page
    assert (site / "assets" / "bench" / "ratios.svg").is_file()


def test_site_fault_matrix_has_every_row(site: Path) -> None:
    page = (site / "faults" / "index.html").read_text(encoding="utf-8")
    table = page[page.index("<table>") : page.index("</table>")]
    rows = re.findall(r"<tr>\s*<td>(.*?)</td>", table, re.S)
    assert len(rows) == len(FAULTS)
    for cat, title in CATEGORIES.items():
        assert sum(html.unescape(r) == title for r in rows) == sum(f.category == cat for f in FAULTS), title


def test_site_api_reference_documents_the_public_modules(site: Path) -> None:
    def ids(page: str) -> set[str]:
        return set(re.findall(r'id="(stage2_data\.[\w.]+)"', (site / page / "index.html").read_text()))

    store, loader, errors = ids("api/store"), ids("api/loader"), ids("api/errors")
    assert {
        "stage2_data.store.dataset.VinOfflineDataset",
        "stage2_data.store.reader.VinOfflineStoreReader",
        "stage2_data.store.validate.validate_vin_offline_store",
    } <= store
    assert {
        "stage2_data.loader.select.Selection",
        "stage2_data.loader.order.ResolutionBatches",
        "stage2_data.loader.order.SeededOrder",
        "stage2_data.loader.collate.collate",
        "stage2_data.loader.pool.PoolLoader",
    } <= loader
    assert {"stage2_data.errors.Stage2Error", "stage2_data.errors.LoaderError"} <= errors


def test_operating_guide_shows_the_ui_screenshots(site: Path) -> None:
    page = (REPO / "docs" / "operating.md").read_text(encoding="utf-8")
    shots = re.findall(r"\]\((assets/ui/[\w-]+\.png)\)", page)
    assert len(shots) >= 4
    for shot in shots:
        assert (site / shot).is_file(), shot
