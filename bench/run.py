"""`make bench`: run every benchmark side by side with the tool a user would otherwise run.

Each `bench/bench_*.py` module exposes ``BENCHMARKS``: callables ``f(workdir: Path) -> dict | list[dict]``
returning entries ``{name, ours_s, baseline, baseline_s, ratio, target, ...}`` with
``ratio = ours_s / baseline_s`` measured in the same run on the same files. Results go to
``bench/results.json`` (and a Markdown table on stdout for the README).

    python -m bench.run [--only NAME_SUBSTRING ...] [--workdir DIR] [--keep]

``--only`` (repeatable) runs the benchmark functions whose name holds one of the substrings and
merges their entries into the results already there.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def timed(fn: Any, *args: Any, repeat: int = 1, **kwargs: Any) -> float:
    """Best wall time of ``repeat`` calls."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t)
    return best


def best_alternating(ours: Any, baseline: Any, repeat: int = 3) -> tuple[float, float]:
    """Best wall times of ``ours()`` and ``baseline()``, run alternately ``repeat`` times each (so
    both see the same machine state); warm both first yourself if the first call is special."""
    best_ours = best_base = float("inf")
    for _ in range(repeat):
        best_ours = min(best_ours, timed(ours))
        best_base = min(best_base, timed(baseline))
    return best_ours, best_base


def entry(
    name: str,
    ours_s: float,
    baseline: str,
    baseline_s: float,
    target: float | None,
    **extra: Any,
) -> dict:
    """One result. ``target`` bounds the ratio; ``limit_s`` (optional, among ``extra``) bounds
    ``ours_s`` itself, for a claim that is a time rather than a comparison (such a claim lives here,
    never in a test's assertion)."""
    limit_s: float | None = extra.pop("limit_s", None)
    ratio = ours_s / baseline_s if baseline_s > 0 else float("inf")
    checks = ([ratio <= target] if target is not None else []) + (
        [ours_s <= limit_s] if limit_s is not None else []
    )
    out = {
        "name": name,
        "ours_s": round(ours_s, 4),
        "baseline": baseline,
        "baseline_s": round(baseline_s, 4),
        "ratio": round(ratio, 3),
        "target": target,
        "meets_target": all(checks) if checks else None,
    }
    if limit_s is not None:
        out["limit_s"] = limit_s
    out.update(extra)
    return out


def drop_caches(page_cache: bool = False) -> bool:
    """Best effort: flush dirty pages so one run's writes do not slow the next; with ``page_cache``,
    also drop the clean page cache where this process may (root: ``/proc/sys/vm/drop_caches``), so
    that a run finds nothing of an earlier one in memory and the memory it fills is freed memory
    the kernel reuses. Whether the page cache was dropped.

    Why it matters here: on this VM (virtio balloon) memory the guest has not touched lately is
    slow to touch, and a bench whose runs keep their outputs grows the page cache run after run.
    The same 400 MB build took 9.2-9.9 s after the previous run's data root was deleted and
    11.2-13.8 s when it was kept (its downloads 1.2 -> 2.1 s, its extraction 0.4 -> 1.0 s), with or
    without any fsync; with the page cache dropped before each run, 10.1-10.8 s every time."""
    os.sync()
    if not page_cache:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as f:
            f.write("1")
    except OSError:  # not root, or a container without it: synced only
        return False
    return True


def caches_note(dropped: bool, before: str) -> str:
    """What a bench entry's ``caches`` says: whether :func:`drop_caches` dropped the page cache
    before each ``before`` (e.g. "run") or could only sync (not root)."""
    if dropped:
        return f"page cache dropped before each {before}"
    return f"synced before each {before} (not root: not dropped)"


def wait_for_quiet_io(limit_pct: float = 2.0, timeout_s: float = 240.0) -> float:
    """Wait until the disk is quiet: the share of the last 10 s in which some task waited on I/O
    (``/proc/pressure/io``, "some avg10") is under ``limit_pct``; returns the seconds waited (0 where
    the kernel has no pressure information). Deleting a big tree here (an earlier run's folders)
    keeps the disk busy for a minute or two after ``rm`` returns (the file system is mounted with
    ``discard``: freed blocks are trimmed), and a run measured meanwhile pays for it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            with open("/proc/pressure/io", encoding="ascii") as f:
                some = float(f.readline().split()[1].split("=")[1])
        except (OSError, ValueError, IndexError):
            return 0.0
        if some < limit_pct:
            break
        time.sleep(1.0)
    return round(time.monotonic() - t0, 1)


def render_table(doc: dict) -> str:
    """The Markdown table the README shows (tests/test_readme.py keeps the README in sync with results.json)."""
    lines = [
        "| benchmark | ours (s) | baseline | baseline (s) | ratio | target | met |",
        "|---|---:|---|---:|---:|---:|:---:|",
    ]
    for r in doc["results"]:
        bounds = [f"≤ {r['target']}"] if r.get("target") is not None else []
        bounds += [f"ours ≤ {r['limit_s']} s"] if r.get("limit_s") is not None else []
        tgt = "; ".join(bounds) or "-"
        met = {True: "yes", False: "**no**", None: "-"}[r.get("meets_target")]
        base = str(r["baseline"]).replace("|", "\\|")
        lines.append(
            f"| {r['name']} | {r['ours_s']} | {base} | {r['baseline_s']} | {r['ratio']} | {tgt} | {met} |"
        )
    return "\n".join(lines)


def machine_loop_seconds(steps: int = 10_000_000) -> float:
    """Seconds of a plain Python loop of ``steps`` additions (best of two): the machine's speed for
    interpreted work at the moment, recorded beside every entry (``machine_loop_s``)."""
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        s = 0
        for i in range(steps):
            s += i
        best = min(best, time.perf_counter() - t0)
    return round(best, 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench")
    ap.add_argument("--only", action="append", default=None)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="stage2-bench-", dir=HERE))
    work.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    try:
        for mod_path in sorted(HERE.glob("bench_*.py")):
            mod = importlib.import_module(f"bench.{mod_path.stem}")
            for fn in getattr(mod, "BENCHMARKS", []):
                if args.only and not any(o in fn.__name__ for o in args.only):
                    continue
                sub = work / fn.__name__
                sub.mkdir(parents=True, exist_ok=True)
                print(f"running {mod_path.stem}.{fn.__name__} ...", file=sys.stderr, flush=True)
                # how fast the machine runs Python just before, and when: entries measured on other
                # days are compared with these in mind (this 2-core machine's speed varies 3x)
                loop_s, at = machine_loop_seconds(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                got = fn(sub)
                for r in got if isinstance(got, list) else [got]:
                    results.append({**r, "measured_at": at, "machine_loop_s": loop_s})
                if not args.keep:
                    shutil.rmtree(sub, ignore_errors=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    out = HERE / "results.json"
    previous = json.loads(out.read_text()) if out.is_file() else {}
    merged = {r["name"]: r for r in previous.get("results", [])} if args.only else {}
    merged.update({r["name"]: r for r in results})
    doc = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": list(merged.values()),
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(render_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
