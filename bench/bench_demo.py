"""Demo generator benchmarks (times that used to be tests' assertions).

- ``demo_regenerate_vs_generate``: ``generate_demo`` on a folder that already holds the demo (it
  reads the marker and returns) against generating the demo into a new folder; best of 5 and of
  3. Was tests/test_demo.py::test_paths_and_idempotence's ``process_time() < 0.5``: ``limit_s``
  0.5 (CPU seconds beside it).
- ``demo_full_cardinality_generate_vs_cp``: generating the full-cardinality demo (53,765
  trajectories) against ``cp -r`` of the tree it wrote (the same bytes, nothing computed); once
  each. Was tests/test_demo.py::test_full_cardinality_exact_totals's ``generate_cpu < 80`` (CPU
  seconds): ``limit_s`` 80 on the wall time of a quiet machine, CPU seconds beside it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.run import drop_caches, entry, timed


def _cpu_timed(fn: Any) -> tuple[float, float]:
    """(wall, CPU) seconds of one call."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def demo_regenerate_vs_generate(work: Path) -> dict[str, Any]:
    from stage2_data.demo import generate_demo

    demo = generate_demo(work / "demo")
    fresh = [work / f"fresh-{i}" for i in range(3)]
    generate_s = min(timed(generate_demo, root) for root in fresh)
    runs = [_cpu_timed(lambda: generate_demo(demo.root)) for _ in range(5)]
    if any(generate_demo(demo.root) != demo for _ in range(2)):
        raise RuntimeError("generate_demo on a complete demo returned another demo")
    return entry(
        "demo_regenerate_vs_generate",
        min(wall for wall, _ in runs),
        "generate_demo into a new folder",
        generate_s,
        0.05,
        limit_s=0.5,
        ours_cpu_s=round(min(cpu for _, cpu in runs), 4),
    )


def demo_full_cardinality_generate_vs_cp(work: Path) -> dict[str, Any]:
    from stage2_data.demo import generate_demo

    root = work / "full"
    generate_s, generate_cpu = _cpu_timed(lambda: generate_demo(root, full_cardinality=True))
    drop_caches()
    cp_s = timed(subprocess.run, ["cp", "-r", str(root), str(work / "copy")], check=True)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    shutil.rmtree(work / "copy")
    return entry(
        "demo_full_cardinality_generate_vs_cp",
        generate_s,
        "cp -r of the generated tree",
        cp_s,
        None,
        limit_s=80.0,
        ours_cpu_s=round(generate_cpu, 2),
        bytes=size,
    )


BENCHMARKS = [demo_regenerate_vs_generate, demo_full_cardinality_generate_vs_cp]
