"""Measurements live in docs/benchmarks.md and git, not in the product's docstrings and comments
(issue #28): no timing (``0.5 s``, ``30 us``, ``4-5 ms``), throughput (``70 MB/s``) or speed-up
(``4x faster``, ``12% faster``) in a comment or docstring of the product code, except the few
lines below, where the number is a setting or a fact of the platform, not something measured."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("stage2_data", "assets", "resources", "pipelines", "deploy", "scripts")

MEASUREMENT = re.compile(
    r"\d(?:\.\d+)? ?(?:ms|us|µs)\b"  # milli- and microseconds
    r"|\d(?:\.\d+)? s\b"  # seconds ("503s", a plural, is not a time)
    r"|\d ?[KMG]i?B/s\b"  # throughput
    r"|\d(?:\.\d+)? ?x (?:faster|slower)\b"  # speed-ups
    r"|\d(?:\.\d+)? ?% (?:faster|slower)\b"
    r"|\bCPU-s\b",
)

# (file, text of the line): settings and platform facts, each with its reason.
ALLOWED = {
    # the retry policy's default waits: a setting
    ("stage2_data/acquire/retry.py", "1, 2, 4, 8 s by default"),
    # the hub probe's pause, bounded by a setting
    ("pipelines/commands.py", "<= 0.5 s"),
    # the kernel's timestamp granularity, the reason for _RACY_NS
    ("stage2_data/extract/extract.py", "clock ticks: 1-10 ms"),
}


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every comment and docstring line of a Python file, or of every
    ``#`` comment of another text file."""
    src = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return [(n, line.split("#", 1)[1]) for n, line in enumerate(src.splitlines(), 1) if "#" in line]
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(src)):
        value = (
            node.value.value if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) else None
        )
        if isinstance(value, str):  # a docstring, or a bare string used as a comment
            out += [(node.lineno + i, line) for i, line in enumerate(value.splitlines())]
    return sorted(out)


def measurements_in(path: Path) -> list[str]:
    """``file:line: text`` of every comment or docstring line of ``path`` that holds a measurement
    and is not in :data:`ALLOWED`."""
    rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    return [
        f"{rel}:{n}: {text.strip()}"
        for n, text in _prose(path)
        if MEASUREMENT.search(text) and not any(f == rel and a in text for f, a in ALLOWED)
    ]


def _product_files() -> list[Path]:
    return sorted(
        p
        for d in PRODUCT
        for p in (REPO / d).rglob("*")
        if p.suffix in {".py", ".yaml", ".sh"} and "__pycache__" not in p.parts
    )


def test_no_measurement_in_product_docstrings_or_comments() -> None:
    files = _product_files()
    assert any(p.name == "shard_io.py" for p in files) and any(p.suffix == ".yaml" for p in files)
    found = [hit for p in files for hit in measurements_in(p)]
    assert not found, (
        "measurements belong in docs/benchmarks.md (Design measurements), not in the code:\n"
        + "\n".join(found)
    )


def test_the_check_finds_a_measurement(tmp_path: Path) -> None:
    # lines this sweep moved out of the code, each of which the check must catch
    originals = [
        "    measured ~70 MB/s here against ~300+ for this.",
        "#: start, and gains only on the per-sample Python work. A worker costs ~0.5 s to",
        "    one reads its config and checks its three storages' schemas: ~0.15 s, once a run before).",
        "zarr's create_array on a local store cost ~4-5 ms an array here",
        "# [A-Za-z0-9_.-]) skip it: the filter provably accepts them, and it costs ~30 us a member.",
        "from isal import isal_zlib  # ISA-L's inflate: the same bytes as zlib's, 2-3x faster (bench/)",
    ]
    for line in originals:
        assert MEASUREMENT.search(line), line
    # and as a file: a docstring and a comment, each found at its line
    probe = tmp_path / "probe.py"
    probe.write_text('"""A module.\n\nIt took 0.09 s instead of 0.20 s."""\n\nX = 1  # ~1 us a read\n')
    assert [h.split(":")[1] for h in measurements_in(probe)] == ["3", "5"]
    # settings and plurals are not measurements
    for line in ("transient 503s, pacing", "at most 4 threads", "a 64 KiB bound"):
        assert not MEASUREMENT.search(line), line
