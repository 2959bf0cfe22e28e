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

At another rate than the issue's 100 MB/s (``STAGE2_BENCH_LINK_MB_S``) the entry is named
``whole_build_at_link_rate_<rate>mb_s`` and has no target: the same build over a slower link says
how the fixed costs weigh as the transfer grows.

One round of each way (``STAGE2_BENCH_LINK_ROUNDS``; best of each): hf download first, then the
build; before each, the page cache is dropped (as root) and the disk left to go quiet; the
machine's load average before each is recorded: the hub, the clients and the build's steps share
the CPU with whatever else runs, so a loaded machine slows both ways below the link's rate.

``STAGE2_BENCH_INSTANCE`` (``public-storage`` or ``public-all``; unset: stage2's own) runs the
build on another instance configuration: the build's instance folder (``<data root>/.dagster``,
the environment has no ``DAGSTER_HOME``) is created beforehand with a ``dagster.yaml`` that is not
stage2's, which ``write_instance_yaml`` keeps (:func:`public_instance_yaml`).

``link_rate_instance_storages`` (informational, no target) measures what the two storages kept on
Dagster's internals (docs/architecture.md, "Kept on Dagster's internals") are worth on this build:
the same first build, one variant after another in each round (the order reversed every other
round, so that each variant sees the same load; ``STAGE2_BENCH_INSTANCE_ROUNDS``, default 2):

- ``stage2``: stage2's own ``dagster.yaml`` (``pipelines/eventlog.py``'s consolidated event log
  and ``pipelines/computelogs.py``'s step logs);
- ``public-storage``: Dagster's public ``storage: sqlite:`` (a database per run) and stage2's step
  logs;
- ``public-all``: public storage and Dagster's default compute-log manager (only public
  configuration).

Per variant: each round's wall time, when the last paced byte left the hub, the time after it, the
build's CPU seconds (its process and the children it waited for), the load average before it, and
the difference of its mean wall time to ``stage2``'s as a share of ``stage2``'s; each build is
checked (exit 0, a fingerprint, the same fingerprint for every variant) and so is the storage it
really used (the instance's storage classes, and per-run event-log databases for the public
storage). ``ours_s`` is ``public-all``'s mean wall time, ``baseline_s`` ``stage2``'s.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.bench_noop import HF, REPO, SCALE_4GB, _env, scaled_demo
from bench.run import caches_note, drop_caches, entry, wait_for_quiet_io

LINK_MB_S = float(os.environ.get("STAGE2_BENCH_LINK_MB_S", "100"))
ROUNDS = int(os.environ.get("STAGE2_BENCH_LINK_ROUNDS", "1"))
SCALE = float(os.environ.get("STAGE2_BENCH_LINK_SCALE", str(SCALE_4GB)))
INSTANCE = os.environ.get("STAGE2_BENCH_INSTANCE") or "stage2"
INSTANCE_ROUNDS = int(os.environ.get("STAGE2_BENCH_INSTANCE_ROUNDS", "2"))
INSTANCE_VARIANTS = ("stage2", "public-storage", "public-all")


def public_instance_yaml(home: Path, variant: str) -> str:
    """A ``dagster.yaml`` of Dagster's public configuration for the instance at ``home``:
    ``public-storage``: ``storage: sqlite:`` under ``home/storage`` and stage2's step logs
    (``pipelines/computelogs.py``, as stage2's own file configures them); ``public-all``: the same
    storage and Dagster's default compute-log manager (``home/storage``). Its first line is not
    ``INSTANCE_YAML_MARK``, so a build keeps it."""
    import yaml

    from stage2_pipelines.config import instance_config

    if variant not in ("public-storage", "public-all"):
        raise ValueError(f"unknown instance variant {variant!r} (public-storage | public-all)")
    cfg: dict[str, Any] = {
        "telemetry": {"enabled": False},
        "nux": {"enabled": False},
        "storage": {"sqlite": {"base_dir": str(home / "storage")}},
    }
    if variant == "public-storage":
        cfg["compute_logs"] = instance_config(home)["compute_logs"]
    return f"# bench: {variant} (Dagster's public storage configuration)\n" + yaml.safe_dump(
        cfg, sort_keys=False
    )


def prewrite_instance(root: Path, variant: str) -> None:
    """The instance folder of a build of ``root`` (``root/.dagster``) with ``variant``'s
    ``dagster.yaml``; nothing for ``stage2`` (the build writes its own)."""
    if variant == "stage2":
        return
    home = root / ".dagster"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(public_instance_yaml(home.resolve(), variant), encoding="utf-8")


def _instance_evidence(home: Path) -> dict[str, Any]:
    """What storage a build's instance really used: its storages' classes (as the instance loads
    them from its ``dagster.yaml``), its runs, its SQLite files (per-run event-log databases
    ``storage/history/runs/<run id>.db`` of the public storage; the consolidated ``history/``
    database of stage2's) and its step-log files."""
    import dagster as dg

    inst = dg.DagsterInstance.from_config(str(home))
    try:
        classes = {
            "run_storage": type(inst.run_storage).__name__,
            "event_log_storage": f"{type(inst.event_log_storage).__module__}.{type(inst.event_log_storage).__name__}",
            "compute_log_manager": f"{type(inst.compute_log_manager).__module__}.{type(inst.compute_log_manager).__name__}",
        }
        run_ids = {r.run_id for r in inst.get_runs()}
    finally:
        inst.dispose()
    per_run = [f for f in (home / "storage" / "history" / "runs").glob("*.db") if f.stem in run_ids]
    logs = [f for f in (home / "storage").rglob("*") if f.is_file() and f.suffix in (".out", ".err", ".log")]
    return {
        **classes,
        "runs": len(run_ids),
        "per_run_event_dbs": len(per_run),
        "sqlite_files": sorted(str(f.relative_to(home)) for f in home.rglob("*.db") if f.stem not in run_ids),
        "step_log_files": len(logs),
    }


def _load() -> float:
    return round(os.getloadavg()[0], 2)


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
    and its JSON summary."""
    argv = [sys.executable, "-m", "stage2_data.cli", "build", "--profile", str(demo.profile),
            "--data-root", str(root), "--endpoint", hub.url, "--json", "--no-progress"]  # fmt: skip
    prewrite_instance(root, INSTANCE)
    started = time.time()
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=_env())
    took = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"stage2 build failed ({p.returncode}): {p.stdout[-2000:]}{p.stderr[-2000:]}")
    return took, _first_request(hub, t0), hub.link_free_at - t0, started, json.loads(p.stdout)


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
        fingerprint=summary.get("fingerprint"),
        frame_scale=SCALE,
        trajectories=load_profile(demo.profile).expected.trajectories,
        cpus=os.cpu_count(),
        load_avg_1min_before=loads,
        waited_for_quiet_io_s=waited,
        caches=caches_note(dropped, "run"),
        instance=INSTANCE,
    )


def _variant_build(demo: Any, hub: Any, root: Path, variant: str) -> dict[str, Any]:
    """One first build of ``root`` on ``variant``'s instance, checked: its times, CPU seconds,
    fingerprint and what storage its instance used."""
    prewrite_instance(root, variant)
    argv = [sys.executable, "-m", "stage2_data.cli", "build", "--profile", str(demo.profile),
            "--data-root", str(root), "--endpoint", hub.url, "--json", "--no-progress"]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=_env())
    took = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    last_byte = hub.link_free_at - t0
    if p.returncode != 0:
        raise RuntimeError(
            f"stage2 build ({variant}) failed ({p.returncode}): {p.stdout[-2000:]}{p.stderr[-2000:]}"
        )
    summary = json.loads(p.stdout)
    if not summary.get("fingerprint"):
        raise RuntimeError(f"stage2 build ({variant}) gave no fingerprint: {p.stdout[-2000:]}")
    home = Path(summary["dagster_home"])
    evidence = _instance_evidence(home)
    public = variant != "stage2"
    if public != (evidence["per_run_event_dbs"] > 0) or public == (
        "stage2_pipelines" in evidence["event_log_storage"]
    ):
        raise RuntimeError(f"build ({variant}) did not use the storage it was meant to: {evidence}")
    if (variant == "public-all") == ("stage2_pipelines" in evidence["compute_log_manager"]):
        raise RuntimeError(f"build ({variant}) did not use the step logs it was meant to: {evidence}")
    _, steps, _ = _timeline(str(home), started, last_byte)
    return {
        "wall_s": round(took, 2),
        "first_request_s": round(_first_request(hub, t0), 2),
        "last_byte_s": round(last_byte, 2),
        "after_last_byte_s": round(took - last_byte, 2),
        "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
        "steps_sum_s": round(sum(s["sum_s"] for s in steps.values()), 2),
        "steps_after_last_byte_s": round(sum(s["after_last_byte_s"] for s in steps.values()), 2),
        "fingerprint": summary["fingerprint"],
        "instance": evidence,
    }


def link_rate_instance_storages(work: Path) -> dict[str, Any]:
    from stage2_data.demo.hubserver import HubFaults, HubServer

    demo = scaled_demo(work / "demo", SCALE)
    archive_bytes = sum(f.stat().st_size for f in demo.upstream.rglob("*") if f.is_file())
    got: dict[str, list[dict[str, Any]]] = {v: [] for v in INSTANCE_VARIANTS}
    dropped = True
    with HubServer(
        demo.upstream,
        repo_id=demo.repo_id,
        revision=demo.revision,
        faults=HubFaults(link_rate=LINK_MB_S * 1e6),
    ) as hub:
        for i in range(INSTANCE_ROUNDS):
            order = INSTANCE_VARIANTS if i % 2 == 0 else INSTANCE_VARIANTS[::-1]
            for variant in order:
                root = work / f"root-{variant}-{i}"
                dropped = drop_caches(page_cache=True) and dropped
                waited = wait_for_quiet_io()
                load = _load()
                print(f"  round {i + 1} {variant} (load {load}) ...", file=sys.stderr, flush=True)
                r = _variant_build(demo, hub, root, variant)
                r.update(round=i + 1, load_avg_1min_before=load, waited_for_quiet_io_s=waited)
                got[variant].append(r)
                print(
                    f"    {r['wall_s']} s, after last byte {r['after_last_byte_s']} s",
                    file=sys.stderr,
                    flush=True,
                )
                shutil.rmtree(root, ignore_errors=True)
    fingerprints = {r["fingerprint"] for rs in got.values() for r in rs}
    if len(fingerprints) != 1:
        raise RuntimeError(f"the variants built different stores: {sorted(fingerprints)}")
    base = statistics.mean(r["wall_s"] for r in got["stage2"])
    variants: dict[str, Any] = {}
    for v, rs in got.items():
        mean = statistics.mean(r["wall_s"] for r in rs)
        variants[v] = {
            "rounds": len(rs),
            "wall_mean_s": round(mean, 2),
            "wall_all_s": [r["wall_s"] for r in rs],
            "after_last_byte_mean_s": round(statistics.mean(r["after_last_byte_s"] for r in rs), 2),
            "after_last_byte_all_s": [r["after_last_byte_s"] for r in rs],
            "cpu_mean_s": round(statistics.mean(r["cpu_s"] for r in rs), 2),
            "delta_vs_stage2_pct_of_whole_build": round(100 * (mean - base) / base, 1),
            "load_avg_1min_before": [r["load_avg_1min_before"] for r in rs],
            "builds": rs,
        }
    storage = variants["public-storage"]["wall_mean_s"] - variants["stage2"]["wall_mean_s"]
    logs = variants["public-all"]["wall_mean_s"] - variants["public-storage"]["wall_mean_s"]
    return entry(
        "link_rate_instance_storages",
        variants["public-all"]["wall_mean_s"],
        "the same first build on stage2's own dagster.yaml (eventlog.py + computelogs.py), mean wall",
        base,
        None,
        link_mb_s=LINK_MB_S,
        archive_bytes=archive_bytes,
        link_floor_s=round(archive_bytes / (LINK_MB_S * 1e6), 2),
        frame_scale=SCALE,
        eventlog_worth_pct_of_whole_build=round(100 * storage / base, 1),
        computelogs_worth_pct_of_whole_build=round(100 * logs / base, 1),
        variants=variants,
        fingerprint=fingerprints.pop(),
        cpus=os.cpu_count(),
        caches=caches_note(dropped, "build"),
    )


BENCHMARKS = [whole_build_at_link_rate, link_rate_instance_storages]
