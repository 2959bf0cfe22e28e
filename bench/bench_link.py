"""The whole build on a link: ``whole_build_at_link_rate``.

The ~4 GB full-cardinality profile of ``whole_build_vs_shell_way_4gb`` (``bench_noop.scaled_demo``,
frames x24.7) served by the loopback hub with every download paced together at ``LINK_MB_S``
(100 MB/s; ``HubFaults.link_rate``: one token bucket shared by all connections, as one link is).
Ours: a first `stage2 build --json` of a fresh data root and instance (a subprocess, the machine's
default concurrency). Baseline: ``hf download`` (the huggingface_hub CLI, ``HF_ENDPOINT`` = the
same hub) of the same archives at the pinned revision, alone, over the same link. Both are bound by
the link (``link_floor_s``: the archive bytes over the rate); the ratio says how much of the build
does not hide behind it.

Where the time goes, counted from the start of each way: ``*_first_request_s`` is when the hub got
its first request (start-up before it), ``*_last_byte_s`` when the hub sent the last paced byte
(the link's last booking, ``HubServer.link_free_at``); ``*_after_last_byte_s`` is the rest of that
way's wall time. ``*_link_mb_s``: the archive bytes over the time from the first request to the
last byte (the rate the link was used at: under ``link_mb_s`` when something else than the link
held a way back, e.g. the CPU). ``ours_runs`` (each Dagster run's start and end) and
``ours_steps`` (per step key: first start, last end, the sum over its executions and how much of
that sum lies after the last byte) come from the build's own Dagster instance (``dagster_home`` of
its ``--json`` output), counted from the start of the build; ``ours_store_s`` splits the store
step (``vin_store``) into writing the store and its publication gate (the step's own ``seconds``
and ``gate_seconds``), the part a store built in shares behind the link could and could not hide.
``ours_cpu_busy`` is how busy the machine's cores were (``/proc/stat``, every core, whatever ran
on them: the build, the hub and the kernel) from the build's start to its first request, from the
first request to the last byte, and from the last byte to its end, as a fraction of all cores: what
is idle while the bytes arrive is the room a store written in shares would have behind the link.

At another rate than the issue's 100 MB/s (``STAGE2_BENCH_LINK_MB_S``) the entry is named
``whole_build_at_link_rate_<rate>mb_s`` and has no target: the same build over a slower link says
how the fixed costs weigh as the transfer grows.

One round of each way (``STAGE2_BENCH_LINK_ROUNDS``; best of each): hf download first, then the
build; before each, the page cache is dropped (as root) and the disk left to go quiet; the
machine's load average before each is recorded: the hub, the clients and the build's steps share
the CPU with whatever else runs, so a loaded machine slows both ways below the link's rate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_noop import HF, REPO, SCALE_4GB, _env, scaled_demo
from bench.run import caches_note, drop_caches, entry, wait_for_quiet_io

LINK_MB_S = float(os.environ.get("STAGE2_BENCH_LINK_MB_S", "100"))
ROUNDS = int(os.environ.get("STAGE2_BENCH_LINK_ROUNDS", "1"))
SCALE = float(os.environ.get("STAGE2_BENCH_LINK_SCALE", str(SCALE_4GB)))


def _load() -> float:
    return round(os.getloadavg()[0], 2)


class CpuSampler:
    """The machine's busy and total CPU time (``/proc/stat``'s first line, in clock ticks), read every
    ``interval`` seconds in a thread with its ``time.monotonic()``; :meth:`busy` is the fraction of
    every core that was busy between two times. Use as a context manager."""

    def __init__(self, interval: float = 0.25) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        return sum(ticks) - idle, sum(ticks)

    def _loop(self) -> None:
        while True:
            self.samples.append((time.monotonic(), *self._read()))
            if self._stop.wait(self._interval):
                self.samples.append((time.monotonic(), *self._read()))
                return

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def busy(self, start: float, end: float) -> float | None:
        """The busy fraction of all cores from ``start`` to ``end`` (``time.monotonic()``), between
        the samples nearest inside them; None when fewer than two samples lie inside."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2 or inside[-1][2] == inside[0][2]:
            return None
        (_, b0, t0), (_, b1, t1) = inside[0], inside[-1]
        return round((b1 - b0) / (t1 - t0), 3)


def _first_request(hub: Any, t0: float) -> float:
    """Seconds after ``t0`` (``time.monotonic()``) of the hub's first request since then."""
    return min((t for t, *_ in hub.timed_log() if t >= t0), default=float("nan")) - t0


def _hf_download(demo: Any, hub: Any, dest: Path) -> tuple[float, float, float]:
    """Wall seconds of ``hf download`` of every archive of the profile, and when (seconds after its
    start) the hub got its first request and sent the last paced byte."""
    from stage2_data.profile import load_profile

    paths = [a.path for a in load_profile(demo.profile).archives]
    argv = [HF, "download", "--repo-type", "dataset", demo.repo_id, *paths,
            "--revision", demo.revision, "--local-dir", str(dest), "--quiet"]  # fmt: skip
    t0 = time.monotonic()
    subprocess.run(argv, check=True, env=_env(HF_ENDPOINT=hub.url), stdout=subprocess.DEVNULL)
    took = time.monotonic() - t0
    return took, _first_request(hub, t0), hub.link_free_at - t0


def _stage2_build(demo: Any, hub: Any, root: Path) -> tuple[float, float, float, float, dict[str, Any]]:
    """Wall seconds of one `stage2 build --json`, when (seconds after its start) the hub got its
    first request and sent the last paced byte, the wall-clock time it started (``time.time()``)
    and its JSON summary, with ``cpu_busy`` added (``CpuSampler``: before the first request, while
    the bytes arrived, after the last byte)."""
    argv = [sys.executable, "-m", "stage2_data.cli", "build", "--profile", str(demo.profile),
            "--data-root", str(root), "--endpoint", hub.url, "--json", "--no-progress"]  # fmt: skip
    started = time.time()
    with CpuSampler() as cpu:
        t0 = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=_env())
        took = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"stage2 build failed ({p.returncode}): {p.stdout[-2000:]}{p.stderr[-2000:]}")
    first, last = _first_request(hub, t0), hub.link_free_at - t0
    summary = json.loads(p.stdout)
    summary["cpu_busy"] = {
        "before_first_request": cpu.busy(t0, t0 + first),
        "while_downloading": cpu.busy(t0 + first, t0 + last),
        "after_last_byte": cpu.busy(t0 + last, t0 + took),
    }
    return took, first, last, started, summary


def _timeline(dagster_home: str, started: float, last_byte_s: float) -> tuple[list[dict], dict, dict]:
    """The build's runs (job, start, end) and steps (per step key: first start, last end, summed
    seconds, summed seconds after the last byte), in seconds after ``started``, and the store step's
    writing and gate seconds (its materialization's metadata), from its instance."""
    import dagster as dg

    runs: list[dict[str, Any]] = []
    steps: dict[str, dict[str, float]] = {}
    store: dict[str, float] = {}
    # (not `with`: an instance's exit leaves it as Dagster's current state storage, see tests/conftest.py)
    inst = dg.DagsterInstance.from_config(dagster_home)
    try:
        for run in inst.get_runs():
            st = inst.get_run_stats(run.run_id)
            if st.start_time is None or st.end_time is None:
                continue
            runs.append(
                {"job": run.job_name, "start_s": st.start_time - started, "end_s": st.end_time - started}
            )
            for step in inst.get_run_step_stats(run.run_id):
                if step.start_time is None or step.end_time is None:
                    continue
                a, b = step.start_time - started, step.end_time - started
                s = steps.setdefault(
                    step.step_key,
                    {"first_start_s": a, "last_end_s": b, "sum_s": 0.0, "after_last_byte_s": 0.0},
                )
                s["first_start_s"] = min(s["first_start_s"], a)
                s["last_end_s"] = max(s["last_end_s"], b)
                s["sum_s"] += b - a
                s["after_last_byte_s"] += max(0.0, b - max(a, last_byte_s))
        event = inst.get_latest_materialization_event(dg.AssetKey("vin_store"))
        md = event.asset_materialization.metadata if event and event.asset_materialization else {}
        for name, key in (("write", "seconds"), ("gate", "gate_seconds")):
            if key in md:
                store[name] = round(float(md[key].value), 2)
    finally:
        inst.dispose()
    runs.sort(key=lambda r: r["start_s"])
    out_runs = [{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()} for r in runs]
    out_steps = {
        k: {kk: round(vv, 2) for kk, vv in v.items()}
        for k, v in sorted(steps.items(), key=lambda kv: kv[1]["first_start_s"])
    }
    return out_runs, out_steps, store


def whole_build_at_link_rate(work: Path) -> dict[str, Any]:
    from stage2_data.demo.hubserver import HubFaults, HubServer
    from stage2_data.profile import load_profile

    demo = scaled_demo(work / "demo", SCALE)
    archive_bytes = sum(f.stat().st_size for f in demo.upstream.rglob("*") if f.is_file())
    rate = LINK_MB_S * 1e6
    base: list[tuple[float, float, float]] = []
    ours: list[tuple[float, float, float, float, dict[str, Any], Path]] = []
    waited: list[float] = []
    loads: list[float] = []
    dropped = True
    with HubServer(
        demo.upstream, repo_id=demo.repo_id, revision=demo.revision, faults=HubFaults(link_rate=rate)
    ) as hub:
        for i in range(ROUNDS):
            for way in ("hf", "ours"):
                dropped = drop_caches(page_cache=True) and dropped
                waited.append(wait_for_quiet_io())
                loads.append(_load())
                if way == "hf":
                    base.append(_hf_download(demo, hub, work / f"hf-{i}"))
                else:
                    root = work / f"root-{i}"
                    ours.append((*_stage2_build(demo, hub, root), root))
            shutil.rmtree(work / f"hf-{i}", ignore_errors=True)
    took, first_req, last_byte, started, summary, _ = min(ours, key=lambda o: o[0])
    runs, steps, store = _timeline(summary["dagster_home"], started, last_byte)
    base_took, base_first, base_last = min(base, key=lambda b: b[0])
    for *_, r in ours:
        shutil.rmtree(r, ignore_errors=True)
    issue_rate = LINK_MB_S == 100.0
    return entry(
        "whole_build_at_link_rate" if issue_rate else f"whole_build_at_link_rate_{LINK_MB_S:g}mb_s",
        took,
        f"`hf download` of the same archives alone over the same {LINK_MB_S:g} MB/s link",
        base_took,
        1.1 if issue_rate else None,
        link_mb_s=LINK_MB_S,
        archive_bytes=archive_bytes,
        link_floor_s=round(archive_bytes / rate, 2),
        ours_link_mb_s=round(archive_bytes / (last_byte - first_req) / 1e6, 1),
        baseline_link_mb_s=round(archive_bytes / (base_last - base_first) / 1e6, 1),
        ours_first_request_s=round(first_req, 2),
        ours_last_byte_s=round(last_byte, 2),
        ours_after_last_byte_s=round(took - last_byte, 2),
        baseline_first_request_s=round(base_first, 2),
        baseline_last_byte_s=round(base_last, 2),
        baseline_after_last_byte_s=round(base_took - base_last, 2),
        ours_all_s=[round(o[0], 2) for o in ours],
        baseline_all_s=[round(b[0], 2) for b in base],
        ours_runs=runs,
        ours_steps=steps,
        ours_store_s=store,
        ours_cpu_busy=summary["cpu_busy"],
        fingerprint=summary.get("fingerprint"),
        frame_scale=SCALE,
        trajectories=load_profile(demo.profile).expected.trajectories,
        cpus=os.cpu_count(),
        load_avg_1min_before=loads,
        waited_for_quiet_io_s=waited,
        caches=caches_note(dropped, "run"),
    )


BENCHMARKS = [whole_build_at_link_rate]
