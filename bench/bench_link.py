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

``*_cpu_s`` is the CPU time each way used, user and system, from its start to its end: ``own``, its
process and every descendant it waited for (``RUSAGE_CHILDREN``: the build's code server and run
workers, which the code server reaps, are in it); ``hub``, this process (the loopback hub's
threads, paced serving included); ``machine``, every core's busy time (``/proc/stat``).
``ours_cpu_floor_s`` is the least wall time the build's own CPU time allows on this machine's cores,
however its work were ordered (``own`` plus the hub's share over ``cpus``), and
``cpu_floor_ratio`` that floor over the baseline's time: above the target, no orchestration meets
the target on this machine; only less CPU work per byte, or more cores, does.
``ours_cpu_by_process`` splits the build's CPU seconds by kind of process (``ProcessCpu``: the
build's own process, the code server, the webserver, each run's worker, Dagster's step-log
helpers), read from ``/proc`` while it runs.

At another rate than the issue's 100 MB/s (``STAGE2_BENCH_LINK_MB_S``) the entry is named
``whole_build_at_link_rate_<rate>mb_s``, and at another frame scale than the ~4 GB profile's
(``STAGE2_BENCH_LINK_SCALE``) ``whole_build_at_link_rate_scale<scale>``; neither has a target: the
same build over a slower link says how the fixed costs weigh as the transfer grows, and at another
scale (the same files, the same trajectories, fewer frame bytes) the CPU seconds of both scales
split the build's work into a part per file and a part per byte.

One round of each way (``STAGE2_BENCH_LINK_ROUNDS``; best of each): hf download first, then the
build; before each, the page cache is dropped (as root) and the disk left to go quiet; the
machine's load average before each is recorded: the hub, the clients and the build's steps share
the CPU with whatever else runs, so a loaded machine slows both ways below the link's rate.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_acquire import _cpu_children, _cpu_self
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

    def _ticks(self, start: float, end: float) -> tuple[int, int] | None:
        """The busy and total clock ticks between the samples nearest inside ``start`` and ``end``
        (``time.monotonic()``); None when fewer than two samples lie inside."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return None
        (_, b0, t0), (_, b1, t1) = inside[0], inside[-1]
        return b1 - b0, t1 - t0

    def busy_seconds(self, start: float, end: float) -> float | None:
        """The CPU seconds every core was busy from ``start`` to ``end``."""
        ticks = self._ticks(start, end)
        return None if ticks is None else round(ticks[0] / os.sysconf("SC_CLK_TCK"), 2)

    def busy(self, start: float, end: float) -> float | None:
        """The busy fraction of all cores from ``start`` to ``end``; None without two samples
        inside or ticks between them."""
        ticks = self._ticks(start, end)
        return None if not ticks or ticks[1] == 0 else round(ticks[0] / ticks[1], 3)


def _kind(cmdline: list[str]) -> str:
    """What a process of a build is, from its command line: ``dagster api grpc`` (the code server),
    the webserver that launches its runs, ``dagster job launch``, a run's worker (the code server
    starts each as a ``multiprocessing`` child, counted with the worker processes a step starts the
    same way, e.g. the store writer's; a run launcher that runs ``dagster api execute_run`` gives its
    job's name), Dagster's step-log helpers (``tail``, ``watch_orphans.py``), the build itself, else
    its first words ("" when it has none: a process that has exited)."""
    text = " ".join(cmdline)
    if "execute_run" in text:
        job = re.search(r'\\?"(?:job|pipeline)_name\\?":\s*\\?"([A-Za-z0-9_]+)', text)
        return f"run worker: {job.group(1) if job else '?'}"
    for needle, kind in (
        ("api grpc", "code server (dagster api grpc)"),
        ("dagster-webserver", "webserver (dagster-webserver)"),
        ("job launch", "dagster job launch"),
        ("multiprocessing", "run workers and their worker processes (multiprocessing)"),
        ("watch_orphans", "step-log helper (watch_orphans.py)"),
        ("stage2_data.cli", "stage2 build (the build's own process)"),
    ):
        if needle in text:
            return kind
    return " ".join(Path(a).name if i == 0 else a for i, a in enumerate(cmdline[:3]))[:80]


class ProcessCpu:
    """The CPU seconds (user and system) of every process that descends from ``root_pid``, by kind
    (:func:`_kind`): ``/proc`` is read every ``interval`` seconds in a thread and each process's
    last reading kept (a process that lived less than one interval is missed). Use as a context
    manager around the way measured, once its process exists."""

    def __init__(self, root_pid: int, interval: float = 0.2) -> None:
        self.root = root_pid
        self.seen: dict[int, tuple[str, float]] = {}
        self._interval = interval
        self._tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-cpu", daemon=True)

    def _read(self) -> None:
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for proc in os.scandir("/proc"):
            if not proc.name.isdigit():
                continue
            try:
                with open(f"/proc/{proc.name}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(proc.name)
            parents[pid] = int(fields[1])
            cpu[pid] = (int(fields[11]) + int(fields[12])) / self._tick
        for pid, seconds in cpu.items():
            p, depth = pid, 0
            while p not in (0, 1, self.root) and depth < 64:
                p, depth = parents.get(p, 0), depth + 1
            if p != self.root and pid != self.root:
                continue
            try:  # read each time: a forked child takes its own command line when it execs
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                continue
            kind = _kind(cmd)
            if not kind and pid in self.seen:  # exited (its command line gone): keep what it was
                kind = self.seen[pid][0]
            self.seen[pid] = (kind or "?", seconds)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._read()

    def __enter__(self) -> ProcessCpu:
        self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def by_kind(self) -> dict[str, dict[str, float]]:
        """Per kind: how many processes were seen and their CPU seconds, most CPU first."""
        out: dict[str, dict[str, float]] = {}
        for kind, seconds in self.seen.values():
            k = out.setdefault(kind, {"processes": 0, "cpu_s": 0.0})
            k["processes"] += 1
            k["cpu_s"] += seconds
        return {
            k: {"processes": v["processes"], "cpu_s": round(v["cpu_s"], 2)}
            for k, v in sorted(out.items(), key=lambda kv: -kv[1]["cpu_s"])
        }


def _first_request(hub: Any, t0: float) -> float:
    """Seconds after ``t0`` (``time.monotonic()``) of the hub's first request since then."""
    return min((t for t, *_ in hub.timed_log() if t >= t0), default=float("nan")) - t0


class CpuUse(CpuSampler):
    """A :class:`CpuSampler` that also counts, from its start to its end, the CPU seconds (user and
    system) of this process's waited-for children (``own``: the way measured), of this process
    (``hub``: the loopback hub's threads) and of every core (``machine``): :attr:`seconds`."""

    def __enter__(self) -> CpuUse:
        self._rusage = (_cpu_children(), _cpu_self(), time.monotonic())
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        c0, s0, t0 = self._rusage
        self.seconds: dict[str, float | None] = {
            "own": round(_cpu_children() - c0, 2),
            "hub": round(_cpu_self() - s0, 2),
            "machine": self.busy_seconds(t0, time.monotonic()),
        }


def _hf_download(demo: Any, hub: Any, dest: Path) -> tuple[float, float, float, dict[str, float | None]]:
    """Wall seconds of ``hf download`` of every archive of the profile, when (seconds after its
    start) the hub got its first request and sent the last paced byte, and its CPU seconds
    (:class:`CpuUse`)."""
    from stage2_data.profile import load_profile

    paths = [a.path for a in load_profile(demo.profile).archives]
    argv = [HF, "download", "--repo-type", "dataset", demo.repo_id, *paths,
            "--revision", demo.revision, "--local-dir", str(dest), "--quiet"]  # fmt: skip
    with CpuUse() as cpu:
        t0 = time.monotonic()
        subprocess.run(argv, check=True, env=_env(HF_ENDPOINT=hub.url), stdout=subprocess.DEVNULL)
        took = time.monotonic() - t0
    return took, _first_request(hub, t0), hub.link_free_at - t0, cpu.seconds


def _stage2_build(demo: Any, hub: Any, root: Path) -> tuple[float, float, float, float, dict[str, Any]]:
    """Wall seconds of one `stage2 build --json`, when (seconds after its start) the hub got its
    first request and sent the last paced byte, the wall-clock time it started (``time.time()``)
    and its JSON summary, with ``cpu_busy`` added (``CpuSampler``: before the first request, while
    the bytes arrived, after the last byte) and ``cpu_s`` (:class:`CpuUse`)."""
    argv = [sys.executable, "-m", "stage2_data.cli", "build", "--profile", str(demo.profile),
            "--data-root", str(root), "--endpoint", hub.url, "--json", "--no-progress"]  # fmt: skip
    started = time.time()
    with CpuUse() as cpu:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env()
        )
        with ProcessCpu(proc.pid) as processes:
            out, err = proc.communicate()
        took = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"stage2 build failed ({proc.returncode}): {out[-2000:]}{err[-2000:]}")
    first, last = _first_request(hub, t0), hub.link_free_at - t0
    summary = json.loads(out)
    summary["cpu_busy"] = {
        "before_first_request": cpu.busy(t0, t0 + first),
        "while_downloading": cpu.busy(t0 + first, t0 + last),
        "after_last_byte": cpu.busy(t0 + last, t0 + took),
    }
    summary["cpu_s"] = cpu.seconds
    summary["cpu_by_process"] = processes.by_kind()
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
    base: list[tuple[float, float, float, dict[str, float | None]]] = []
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
    base_took, base_first, base_last, base_cpu = min(base, key=lambda b: b[0])
    cpus = os.cpu_count() or 1
    ours_cpu = summary["cpu_s"]
    floor = (ours_cpu["own"] + ours_cpu["hub"]) / cpus
    for *_, r in ours:
        shutil.rmtree(r, ignore_errors=True)
    issue_rate = LINK_MB_S == 100.0
    name = "whole_build_at_link_rate" + ("" if issue_rate else f"_{LINK_MB_S:g}mb_s")
    name += "" if SCALE == SCALE_4GB else f"_scale{SCALE:g}"
    return entry(
        name,
        took,
        f"`hf download` of the same archives alone over the same {LINK_MB_S:g} MB/s link",
        base_took,
        1.1 if name == "whole_build_at_link_rate" else None,
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
        ours_cpu_s=ours_cpu,
        baseline_cpu_s=base_cpu,
        ours_cpu_by_process=summary["cpu_by_process"],
        ours_cpu_floor_s=round(floor, 2),
        cpu_floor_ratio=round(floor / base_took, 3),
        fingerprint=summary.get("fingerprint"),
        frame_scale=SCALE,
        trajectories=load_profile(demo.profile).expected.trajectories,
        cpus=cpus,
        load_avg_1min_before=loads,
        waited_for_quiet_io_s=waited,
        caches=caches_note(dropped, "run"),
    )


BENCHMARKS = [whole_build_at_link_rate]
