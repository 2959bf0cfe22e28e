"""The layers: the library never imports the Dagster layer; the Dagster layer has no import cycle and
builds nothing at import; the CLI works without the pipeline extra; the layer's packages import
under their own names from anywhere."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

from helpers.cli import python

import stage2_pipelines

REPO = Path(__file__).resolve().parent.parent
LAYER = ("dagster", "stage2_pipelines", "stage2_assets", "stage2_resources")
PIPELINES = Path(stage2_pipelines.__file__).parent


def test_the_library_never_imports_the_dagster_layer(tmp_path: Path) -> None:
    code = f"""
import importlib, json, pkgutil, sys
import stage2_data
walk = pkgutil.walk_packages(stage2_data.__path__, "stage2_data.")
names = [m.name for m in walk if not m.name.endswith(".__main__")]  # (importing one runs it)
for name in names:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {LAYER!r})
print(json.dumps({{"modules": names, "loaded": loaded}}))
"""
    out = python(code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert "stage2_data.cli" in doc["modules"] and "stage2_data.steps.store" in doc["modules"]
    assert doc["loaded"] == []


def _imports(path: Path, package: str) -> set[str]:
    """Every stage2_pipelines module ``path`` imports, at module level or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: within the package
                base = f"{package}.{base}" if base else package
            names = [base] if base != package else [f"{package}.{a.name}" for a in node.names]
            out.update(n for n in names if n.startswith(package + "."))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(package + "."))
    return out


def test_the_dagster_layer_has_no_import_cycle() -> None:
    """names (stage2_data.stages) -> assets, resources -> executors -> definitions -> runner: every
    import counted, function-level ones too."""
    graph = {
        f"stage2_pipelines.{p.stem}": _imports(p, "stage2_pipelines")
        for p in PIPELINES.glob("*.py")
        if p.stem != "__init__"
    }
    done: set[str] = set()

    def visit(mod: str, path: tuple[str, ...]) -> None:
        assert mod not in path, f"import cycle: {' -> '.join((*path, mod))}"
        if mod in done:
            return
        for dep in graph.get(mod, ()):
            visit(dep, (*path, mod))
        done.add(mod)

    for mod in graph:
        visit(mod, ())
    order = ["executors", "definitions", "runner"]
    for i, low in enumerate(order):
        for high in order[i + 1 :]:
            assert f"stage2_pipelines.{high}" not in graph[f"stage2_pipelines.{low}"], (low, high)
    for folder in ("assets", "resources"):
        for p in (REPO / folder).glob("*.py"):
            assert "stage2_pipelines" not in p.read_text(), p


def test_importing_the_definitions_reads_no_environment(tmp_path: Path) -> None:
    env = dict(os.environ, STAGE2_PROFILE=str(tmp_path / "missing.toml"))
    code = (
        "import stage2_pipelines.definitions as d, stage2_pipelines.runner, stage2_pipelines.ui; print('ok')"
    )
    out = python(code, cwd=tmp_path, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    # `defs` is built when asked for (what workspace.yaml's `attribute: defs` does)
    out = python("from stage2_pipelines.definitions import defs", cwd=tmp_path, env=env)
    assert out.returncode != 0 and "missing.toml" in out.stderr


def test_the_layer_imports_from_any_directory(tmp_path: Path) -> None:
    code = "import stage2_pipelines, stage2_assets, stage2_resources, stage2_deploy; print(stage2_deploy.path('k8s/executor.yaml').is_file())"
    out = python(code, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def test_without_the_pipeline_extra_build_says_what_to_install(tmp_path: Path) -> None:
    """The core CLI without Dagster: `stage2 build` is one line and exit 2, and every core command
    still works."""
    block = "import sys; sys.modules['dagster'] = None; from stage2_data.cli import main; "
    out = python(block + "sys.exit(main(['build', '--profile', 'p.toml', '--data-root', 'r']))", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    from stage2_data.cli import install_line  # from this checkout: stage2-data is on no package index

    assert len(lines) == 1 and install_line() in lines[0] and "package index" not in lines[0], out.stderr
    out = python(block + "sys.exit(main(['validate', 'no-such-store']))", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr and "validate" in out.stderr
    out = python(block + "main(['--help'])", cwd=tmp_path)
    assert "build" in out.stdout and "not installed" in out.stdout and "validate" in out.stdout


# Dagster's private modules (``dagster._...``) change without notice between releases. The product
# reaches none of them: by import, by a module path in a dagster.yaml, or by a class path matched as
# text. (A dagster.yaml names Dagster's classes as Dagster's own reference does: ``dagster.core...``.)
PRODUCT = ("stage2_data", "assets", "resources", "pipelines", "deploy")
PRIVATE = re.compile(r"\bdagster\s*\.\s*_|\bdagster_shared\b|[\"']dagster\._")


def _product_files() -> list[Path]:
    return sorted(
        p
        for folder in PRODUCT
        for p in (REPO / folder).rglob("*")
        if p.is_file() and p.suffix in {".py", ".yaml", ".yml", ".toml", ".json", ".cfg", ".txt"}
    )


def test_the_product_reaches_no_private_dagster_module() -> None:
    files = _product_files()
    assert any(p.name == "dagster.yaml" for p in files) and len(files) > 50, "the walk found the product"
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert found == [], "private Dagster modules reached:\n" + "\n".join(found)
