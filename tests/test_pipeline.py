"""End to end through Dagster: the real client over a loopback hub, real tars, real Zarr, a real instance."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from helpers.cli import REPO, python, stage2
from helpers.env import environ, read_only_mount
from helpers.final import FINAL_STAGE

from stage2_data import checks as C
from stage2_data import layout
from stage2_data.demo import DemoPaths, repin_profile, write_sidecar_sha256
from stage2_data.demo.hubserver import HubServer
from stage2_data.profile import load_profile
from stage2_data.publish.lock import shared_holders_dir
from stage2_data.stages import ACQUIRE_JOB, EXTRACT_JOB, JOB_ASSETS, KIT_JOB, PROFILE_JOB, READS, STAGES
from stage2_data.store import VinOfflineDataset, VinOfflineStoreReader, validate_vin_offline_store
from stage2_pipelines.config import BuildConfig
from stage2_pipelines.definitions import build_definitions
from stage2_pipelines.runner import build_all
from stage2_pipelines.runs import run_selection


def _config(demo: DemoPaths, data_root: Path, url: str) -> BuildConfig:
    return BuildConfig(profile_path=str(demo.profile), data_root=str(data_root), endpoint=url)


def _failed(summary: dict) -> list[dict]:
    return [c for c in summary["checks"] if not c["passed"]]


def test_definitions_load_with_partitions_and_checks(demo_cache: DemoPaths) -> None:
    defs = build_definitions(BuildConfig(profile_path=str(demo_cache.profile), data_root="/nonexistent"))
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == set(C.CHECKS_BY_ASSET)
    prof = load_profile(demo_cache.profile)
    archive = defs.resolve_assets_def("archive_file")
    # one partition per cache key (its archives: a split cache key's parts are one partition)
    assert set(archive.partitions_def.get_partition_keys()) == set(prof.cache_keys())
    assert len(prof.archive_paths()) == 14 and len(prof.cache_keys()) == 13
    assert not prof.quarantined_paths() & set(archive.partitions_def.get_partition_keys())
    cache = defs.resolve_assets_def("cache_dir")
    assert set(cache.partitions_def.get_partition_keys()) == set(prof.cache_keys())
    check_names = {ck.name for ck in graph.asset_check_keys}
    assert check_names == {n for names in C.ALL_CHECKS_BY_ASSET.values() for n in names}
    for job in ("acquire_archives", "extract_cache_dirs", "verify_kit_and_build_store"):
        assert defs.resolve_job_def(job) is not None


@pytest.mark.parametrize("executor", [None, "in_process", "multiprocess"])
def test_a_run_launched_without_run_config_runs_on_the_configured_executor(
    demo_cache: DemoPaths, executor: str | None
) -> None:
    """The UI's Launch, schedules and sensors pass no executor in their run config: every job's own
    is ``STAGE2_EXECUTOR``'s (docs/operating.md; in_process when unset), and no run config is
    needed to launch it."""
    more = {"executor": executor} if executor else {}
    defs = build_definitions(
        BuildConfig(profile_path=str(demo_cache.profile), data_root="/nonexistent", **more)
    )
    for name in JOB_ASSETS:
        job = defs.resolve_job_def(name)
        assert job.executor_def.name == (executor or "in_process"), name
        assert dg.validate_run_config(job, {}) is not None


def test_the_asset_graph_is_the_one_table_of_what_reads_what(demo_cache: DemoPaths) -> None:
    """Dagster's asset graph has exactly the edges of ``stages.READS`` (the assets take their deps
    from it), and the stages' order is read from the same table."""
    defs = build_definitions(BuildConfig(profile_path=str(demo_cache.profile), data_root="/nonexistent"))
    graph = defs.resolve_asset_graph()
    edges = {
        k.to_user_string(): sorted(p.to_user_string() for p in graph.get(k).parent_keys)
        for k in graph.get_all_asset_keys()
    }
    assert edges == {a: sorted(r) for a, r in READS.items()}
    assert {s.name: s.after for s in STAGES} == {
        "profile": (),
        "acquire": ("profile",),
        "kit": ("profile",),
        "extract": ("acquire",),
        "store": ("kit", "extract"),
    }


def test_workspace_module_loads_the_real_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    # What `dagster dev -w workspace.yaml` loads when no demo is configured: the real profile.
    out = python(
        "from stage2_pipelines.definitions import defs; "
        "print(len(defs.resolve_assets_def('archive_file').partitions_def.get_partition_keys()))",
        env={"PATH": "/usr/bin:/bin", "STAGE2_PROFILE": str(REPO / "manifests/stage2_core_v1.toml")},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "13"  # the real profile's 13 cache directories (14 archive files)


def test_a_missing_dagster_command_is_named_and_leaves_no_server_running(
    demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build's servers: when Dagster's webserver command is not installed, the build names it
    with the fix, and the code server it had started is not left running."""
    from stage2_pipelines import launch

    real = launch._dagster_cli
    monkeypatch.setattr(
        launch, "_dagster_cli", lambda name="dagster": str(tmp_path / name) if name != "dagster" else real()
    )
    server = launch.CodeServer(
        _config(demo_cache, tmp_path / "root", "http://127.0.0.1:9"), tmp_path / "home"
    )
    with pytest.raises(launch.LaunchError) as err:
        server.start()
    assert "`dagster-webserver` is not installed beside this Python" in str(err.value)
    assert "Fix: install the pipeline extra" in str(err.value)
    assert server._ui is None


def test_a_code_location_that_does_not_load_is_named_before_any_run(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """The build's webserver serves its code location once loaded, or with the load's error: the
    build asks which (the webserver's GraphQL, as the UI reads it) before it launches a run, and
    names the error with the webserver's log. A location that loads is served by one code server:
    the webserver's own, never started twice."""
    from stage2_pipelines import launch

    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[source]\nrepo_id = 1\n')
    server = launch.CodeServer(
        BuildConfig(profile_path=str(bad), data_root=str(tmp_path / "root"), endpoint="http://127.0.0.1:9"),
        tmp_path / "home",
    )
    server.start()
    try:
        with pytest.raises(launch.LaunchError) as err:
            server.client()
        text = str(err.value)
        assert "the code location did not load" in text and str(bad) in text, text
        assert f"Its log: {server.log_path}" in text, text
    finally:
        server.stop()
    good = launch.CodeServer(_config(demo_cache, tmp_path / "root", "http://127.0.0.1:9"), tmp_path / "home2")
    good.start()
    try:
        good.client()
        assert launch.location_loaded(good.ui_port)
    finally:
        good.stop()
    log = good.log_path.read_text(encoding="utf-8", errors="replace")
    assert log.count("Starting Dagster code server") == 1, log


def test_the_builds_logs_leave_dagsters_telemetry_folders(tmp_path: Path) -> None:
    """Logs an earlier stage2 wrote to ``<DAGSTER_HOME>/logs`` (Dagster's telemetry folder, which a
    webserver moves to ``.logs_queue`` and posts away) are moved to ``stage2-logs``; Dagster's own
    files there, and a log already in ``stage2-logs``, are left as they are."""
    from stage2_pipelines.launch import logs_dir

    (tmp_path / "logs").mkdir()
    (tmp_path / ".logs_queue").mkdir()
    (tmp_path / "logs" / "code-server.log").write_text("old server")
    (tmp_path / "logs" / "event.log").write_text("dagster's own")
    (tmp_path / ".logs_queue" / "runs-console.log").write_text("moved by a webserver")
    (tmp_path / "stage2-logs").mkdir()
    (tmp_path / "stage2-logs" / "webserver.log").write_text("newer")
    (tmp_path / ".logs_queue" / "webserver.log").write_text("older")
    out = logs_dir(tmp_path)
    assert out == tmp_path / "stage2-logs"
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        "code-server.log": "old server",
        "runs-console.log": "moved by a webserver",
        "webserver.log": "newer",
    }
    assert [p.name for p in (tmp_path / "logs").iterdir()] == ["event.log"]
    assert [p.name for p in (tmp_path / ".logs_queue").iterdir()] == ["webserver.log"]


def test_build_end_to_end(built: dict, demo_cache: DemoPaths) -> None:
    s1 = built["summary"]
    assert s1["ok"], (_failed(s1), s1["errors"])
    prof = load_profile(demo_cache.profile)
    # only the profile's archives were ever requested: never the quarantined or unrelated files
    for path in built["requested"]:
        if "/resolve/" in path:
            assert path.rsplit("/", 1)[-1] in prof.archive_paths(), path
    store = Path(s1["store"])
    assert store.parent == layout.stores_root(built["root"], prof.name)
    assert layout.current_store_path(built["root"], prof.name).resolve() == store
    assert validate_vin_offline_store(store, deep=True) == []
    reader = VinOfflineStoreReader(store)
    assert reader.num_samples == prof.expected.unique_frame_files
    assert len(reader.pairs()) == prof.expected.pair_rows
    assert reader.manifest["fingerprint"] == s1["fingerprint"]
    ds = VinOfflineDataset(store, split="train")
    item = ds[0]
    assert item["frames"].dtype.name == "uint8" and item["frames"].shape[-1] == 3
    # every check of every asset ran and passed, and every run is in the instance
    ran = {(c["asset"], c["check"]) for c in s1["checks"]}
    assert ran == {(a, n) for a, names in C.CHECKS_BY_ASSET.items() for n in names}
    # one run per stage: every partition of a stage in one run (a single-run backfill)
    assert built["runs"] == len(s1["runs"]) == len(STAGES)
    assert [r["job"] for r in s1["runs"]] == [s.job for s in STAGES]
    # the suite builds with its runs executed in the build's process (tests/conftest.py: a launched
    # run, in a worker process of its own, is tests/test_launch.py's)
    assert all(built["pids"][s.job] - {None} == {built["build_pid"]} for s in STAGES), built["pids"]
    parts = {r["job"]: set(r["partitions"]) for r in s1["runs"]}
    assert parts[ACQUIRE_JOB] == set(prof.cache_keys()) and parts[EXTRACT_JOB] == set(prof.cache_keys())
    # each partition has its own materialization and its own check results
    for job, asset in ((ACQUIRE_JOB, "archive_file"), (EXTRACT_JOB, "cache_dir")):
        run = next(r for r in s1["runs"] if r["job"] == job)
        assert all(done == [asset] for done in run["partitions"].values()), run["partitions"]
    per_partition = {(c["asset"], c["partition"]) for c in s1["checks"] if c["partition"] is not None}
    assert per_partition == {("archive_file", k) for k in prof.cache_keys()} | {
        ("cache_dir", k) for k in prof.cache_keys()
    }


def test_runs_belong_to_named_jobs_and_verify_leaves_nothing_stale(
    built: dict, demo_cache: DemoPaths
) -> None:
    """Every run of `stage2 build` is a run of a job the Definitions (and the UI) list, none of
    `__ephemeral_asset_job__`; the verify job runs asset checks only, and after the build and a
    verify no asset (no partition) is stale in Dagster's own stale-status resolver (what the UI's
    asset graph shows). Archive partitions carry their sha256 as data version."""
    import dagster as dg
    from dagster._utils.test.data_versions import get_stale_status_resolver

    from stage2_data.stages import VERIFY_JOB

    prof = load_profile(demo_cache.profile)
    defs = build_definitions(BuildConfig(profile_path=str(demo_cache.profile), data_root=str(built["root"])))
    job_names = {j.name for j in defs.resolve_all_job_defs()}
    with environ(DAGSTER_HOME=str(built["home"])):
        instance = dg.DagsterInstance.get()
        runs = instance.get_runs()
        assert runs and {r.job_name for r in runs} <= job_names, {r.job_name for r in runs}
        r = defs.resolve_job_def(VERIFY_JOB).execute_in_process(instance=instance, raise_on_error=False)
        assert r.success
        assert r.get_asset_materialization_events() == []  # checks only
        assert {e.check_name for e in r.get_asset_check_evaluations()} == {
            n for names in C.STANDALONE_CHECKS.values() for n in names
        }
        assets = list(defs.assets or [])
        resolver = get_stale_status_resolver(instance, assets)
        stale = {}
        for a in assets:
            keys = a.partitions_def.get_partition_keys() if a.partitions_def else [None]
            for k in keys:
                status = resolver.get_status(a.key, k)
                if status.value != "FRESH":
                    stale[(a.key.to_user_string(), k)] = (status, resolver.get_stale_causes(a.key, k))
        assert stale == {}
        for key, specs in prof.archives_by_cache_key().items():
            rec = instance.get_latest_data_version_record(dg.AssetKey("archive_file"), False, key)
            mat = rec.asset_materialization if rec is not None else None
            # a partition's data version: a digest of its archives' paths and pinned sha256
            digest = hashlib.sha256("".join(f"{a.path} {a.sha256}\n" for a in specs).encode()).hexdigest()
            assert mat is not None and (mat.tags or {})["dagster/data_version"] == digest


def _stale(instance: Any, defs: dg.Definitions) -> dict[tuple[str, str | None], tuple[str, list[str]]]:
    """Every asset partition Dagster's stale-status resolver (the UI's stale marks) does not call
    fresh: its status and its causes, as the UI words them."""
    from dagster._utils.test.data_versions import get_stale_status_resolver

    assets = list(defs.assets or [])
    resolver = get_stale_status_resolver(instance, assets)
    out = {}
    for a in assets:
        for k in a.partitions_def.get_partition_keys() if a.partitions_def else [None]:
            status = resolver.get_status(a.key, k)
            if status.value != "FRESH":
                causes = [
                    f"{c.key.asset_key.to_user_string()} {c.reason}"
                    for c in resolver.get_stale_causes(a.key, k)
                ]
                out[(a.key.to_user_string(), k)] = (status.value, causes)
    return out


def test_an_edited_profile_is_marked_stale_until_a_build_of_it(
    built: dict, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """The UI's stale marks follow the profile, not only the code: after the build, an edit of
    the profile's description marks nothing stale; an edit of a pin marks the profile asset stale
    as soon as the definitions are loaded again (its code version carries the profile's digest);
    an edit of max_frames marks the store stale too (what the writer reads of the profile is in its
    code version); a build of the edited profile leaves nothing stale (what reads the profile is
    marked by its own data versions, refreshed where the build had work)."""
    home, root = tmp_path / "home", _copy_built(built, tmp_path)
    shutil.copytree(built["home"], home)
    prof = load_profile(demo_cache.profile)
    text = demo_cache.profile.read_text()
    edited = tmp_path / "profile.toml"

    def defs_of(text_now: str) -> dg.Definitions:
        edited.write_text(text_now)
        return build_definitions(
            BuildConfig(
                profile_path=str(edited),
                data_root=str(root),
                endpoint="http://127.0.0.1:9",
                kit_root=str(demo_cache.profile.parent),
            )
        )

    victim = prof.archives[0]
    with environ(DAGSTER_HOME=str(home)):
        instance = dg.DagsterInstance.get()
        assert _stale(instance, defs_of(text.replace(prof.description, "another description"))) == {}
        defs = defs_of(text.replace(victim.sha256, "f" * 64))
        # the pins are read by what the store stage builds from them too
        assert _stale(instance, defs) == {
            (name, None): ("STALE", [f"{name} has a new code version"])
            for name in ("pinned_profile", "trajectory_join", "subset_checksums", "vin_store")
        }
        shorter = text.replace("\n[source]", "max_frames = 31\n\n[source]", 1)
        assert _stale(instance, defs_of(shorter)) == {
            ("pinned_profile", None): ("STALE", ["pinned_profile has a new code version"]),
            ("vin_store", None): ("STALE", ["vin_store has a new code version"]),
        }
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        edited.write_text(shorter.replace(prof.quarantined[0].reason, "another reason"))
        with environ(DAGSTER_HOME=str(home)):
            s = build_all(
                BuildConfig(
                    profile_path=str(edited),
                    data_root=str(root),
                    endpoint=hub.url,
                    kit_root=str(demo_cache.profile.parent),
                ),
                concurrency=1,
            )
            assert s["ok"], _failed(s)
            assert _stale(dg.DagsterInstance.get(), defs_of(edited.read_text())) == {}


def test_an_edited_kit_is_marked_stale_until_a_build_of_it(
    built: dict, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """The UI's stale marks follow the kit's files too: a copy of the kit (its content unchanged)
    marks nothing stale; after an edit of the pair manifest (two lines swapped: the same pairs, other
    bytes) the join, the byte check and the store, which read it, are marked stale once the
    definitions are loaded again (their code versions carry the kit's digest); a build of the
    edited kit leaves nothing stale."""
    from helpers.faults import copy_kit

    home, root = tmp_path / "home", _copy_built(built, tmp_path)
    shutil.copytree(built["home"], home)
    profile = copy_kit(demo_cache, tmp_path / "kit")

    def config(endpoint: str = "http://127.0.0.1:9") -> BuildConfig:
        return BuildConfig(profile_path=str(profile), data_root=str(root), endpoint=endpoint)

    with environ(DAGSTER_HOME=str(home)):
        assert _stale(dg.DagsterInstance.get(), build_definitions(config())) == {}
        pm = load_profile(profile).kit_file("pair_manifest")
        lines = pm.read_text().splitlines(keepends=True)
        pm.write_text("".join([lines[1], lines[0], *lines[2:]]))
        assert _stale(dg.DagsterInstance.get(), build_definitions(config())) == {
            (name, None): ("STALE", [f"{name} has a new code version"])
            for name in ("trajectory_join", "subset_checksums", "vin_store")
        }
    with (
        HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub,
        environ(DAGSTER_HOME=str(home)),
    ):
        s = build_all(config(hub.url), concurrency=1)
        assert s["ok"], _failed(s)
        assert _stale(dg.DagsterInstance.get(), build_definitions(config())) == {}


def test_a_kit_edited_while_the_store_stage_runs_is_checked_by_the_next_build(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kit file edited while the store stage runs, after its steps read the kit (one SHA256SUMS
    line broken, size and mtime kept): the store published is the one the kit said when it was
    read. The build used to record the stage as up to date from the kit's stats taken after the
    run, edit included, so every later build was a no-op with exit 0 over a kit the byte check
    refuses (QA). Now nothing is recorded, and the next build runs the store stage: its byte check
    fails, naming the line."""
    from helpers.faults import copy_kit

    from stage2_data import steps

    home, root = tmp_path / "home", tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    shutil.copytree(built["home"], home)
    profile = copy_kit(demo_cache, tmp_path / "kit")
    prof = load_profile(profile)
    pm, sums = prof.kit_file("pair_manifest"), prof.kit_file("subset_checksums")
    lines = pm.read_text().splitlines(keepends=True)
    pm.write_text("".join([lines[1], lines[0], *lines[2:]]))  # a change: the store stage runs
    real = steps.step_store

    def store_then_edit(*a: Any, **k: Any) -> Any:
        res = real(*a, **k)
        st = sums.stat()
        text = sums.read_text()
        sums.write_text("0" * 64 + text[64:])
        os.utime(sums, ns=(st.st_atime_ns, st.st_mtime_ns))
        return res

    config = BuildConfig(profile_path=str(profile), data_root=str(root), endpoint="http://127.0.0.1:9")
    with environ(DAGSTER_HOME=str(home)):
        monkeypatch.setattr(steps, "step_store", store_then_edit)
        s = build_all(config, concurrency=1)
        assert s["ok"], _failed(s)
        monkeypatch.setattr(steps, "step_store", real)
        again = build_all(config, concurrency=1)
    assert not again["ok"] and "store" not in again["up_to_date"], again["up_to_date"]
    failed = [c for c in again["checks"] if not c["passed"]]
    assert [c["check"] for c in failed] == [C.SUBSET_BYTES_MATCH_SHA256SUMS], failed
    assert f"{sums}:1:" in failed[0]["description"], failed[0]["description"]


def test_a_build_names_the_stores_its_retention_removed(
    built: dict, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """A build that publishes a new store and removes the previous one by the retention policy
    (`STAGE2_KEEP_STORES=0`) names the removed store in its summary and in `--json`'s `retention`:
    a verified store is never removed without a word."""
    from helpers.cli import subprocess_env

    home, root = tmp_path / "home", tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    shutil.copytree(built["home"], home)
    old = layout.current_store_path(root, load_profile(demo_cache.profile).name).resolve()
    assert (old / "manifest.json").is_file()
    edited = tmp_path / "profile.toml"  # another max_frames: another store
    edited.write_text(demo_cache.profile.read_text().replace("\n[source]", "max_frames = 31\n\n[source]", 1))
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        r = stage2(
            "build", "--profile", str(edited), "--data-root", str(root), "--endpoint", hub.url,
            "--kit-root", str(demo_cache.profile.parent),
            env=subprocess_env(DAGSTER_HOME=str(home), STAGE2_KEEP_STORES="0"),
            timeout=600,
        )  # fmt: skip
    assert r.returncode == 0, r.tail()
    assert not old.exists()
    assert f"\nremoved:      {old.name} (retention: `current` and STAGE2_KEEP_STORES" in r.stdout, r.stdout


def test_same_inputs_in_another_root_same_fingerprint_via_cli(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        out = stage2(
            "build", "--profile", str(demo_cache.profile), "--data-root", str(tmp_path / "root2"),
            "--endpoint", hub.url, "--json", "--concurrency", "1",
            timeout=600,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = out.json()
    assert summary["ok"] is True
    assert Path(summary["store"]).is_dir()
    assert summary["fingerprint"] == built["summary"]["fingerprint"]
    assert all({"asset", "check", "passed", "description"} <= set(c) for c in summary["checks"])
    v = stage2("validate", summary["store"], "--deep")
    assert v.returncode == 0, v.stdout + v.stderr


def test_rebuild_downloads_nothing_and_keeps_the_fingerprint(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        s = build_all(_config(demo_cache, root, hub.url), concurrency=1)
        gets = [p for (m, p, _) in hub.request_log if m == "GET" and "/resolve/" in p]
    assert s["ok"], _failed(s)
    assert gets == []
    assert s["fingerprint"] == built["summary"]["fingerprint"]


def _copy_built(built: dict, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster", "stores"))
    return root


def test_wrong_archive_sha256_fails_its_check(demo: DemoPaths, tmp_path: Path, dagster_home: Path) -> None:
    text = demo.profile.read_text()
    prof = load_profile(demo.profile)
    victim = prof.archive_paths()[0]
    bad = "0" * 64
    text = text.replace(prof.archive(victim).sha256, bad)
    demo.profile.write_text(text)
    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as hub:
        s = build_all(_config(demo, tmp_path / "root", hub.url), concurrency=1)
    assert not s["ok"] and s["store"] is None
    failed = [c for c in _failed(s) if c["check"] == C.ARCHIVE_SHA256_MATCHES_PIN]
    assert failed and victim in failed[0]["description"] and bad in failed[0]["description"]
    victim_key = prof.archive(victim).cache_key
    assert [c["partition"] for c in failed] == [victim_key]  # reported with its partition, once
    assert [e["partition"] for e in s["errors"]] == [victim_key]
    assert not layout.archive_path(tmp_path / "root", victim).exists()
    assert not layout.stores_root(tmp_path / "root", prof.name).exists()
    # one run per stage; in the failed acquire run every other archive was materialized; the kit
    # stage needs no archive: it ran; the cache key of the failed archive was left out of the extract
    # run; the store stage did not run
    runs = {r["job"]: r for r in s["runs"]}
    assert list(runs) == [PROFILE_JOB, ACQUIRE_JOB, KIT_JOB, EXTRACT_JOB]
    assert not runs[ACQUIRE_JOB]["success"]
    assert {k for k, done in runs[ACQUIRE_JOB]["partitions"].items() if done} == set(prof.cache_keys()) - {
        victim_key
    }
    assert set(runs[EXTRACT_JOB]["partitions"]) == set(prof.cache_keys()) - {victim_key}
    assert s["stopped_after"] == "archive_file"


def _rewrite_sidecar_tar_without(demo: DemoPaths, source: str) -> str:
    """Drop one recovered sidecar of ``source`` from the sidecar tar; returns its trajectory id."""
    import tarfile

    prof = load_profile(demo.profile)
    tar_path = prof.kit_file("sidecar_archive")
    with tarfile.open(tar_path) as tf:
        members = [(m, tf.extractfile(m).read() if m.isfile() else None) for m in tf.getmembers()]
    victim = next(m for m, _ in members if m.isfile() and f"/{source}/" in m.name)
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tf:
        for m, data in members:
            if m.name == victim.name:
                continue
            import io

            tf.addfile(m, io.BytesIO(data) if data is not None else None)
    write_sidecar_sha256(demo.kit_root, prof.kit.sidecar_archive)
    return victim.name.rsplit("trajectory_", 1)[1].removesuffix(".npz")


def test_missing_sidecar_fails_the_join_check(
    built: dict, demo: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    traj = _rewrite_sidecar_tar_without(demo, "racer")
    root = _copy_built(built, tmp_path)
    shutil.rmtree(root / "derived")
    r = run_selection(_config(demo, root, "http://127.0.0.1:9").to_dict(), FINAL_STAGE)
    assert not r["success"]
    failed = {c["check"]: c["description"] for c in r["checks"] if not c["passed"]}
    assert "racer" in failed[C.SIDECARS_BY_SOURCE_MATCH_EXPECTED]
    assert traj in failed[C.JOIN_HAS_NO_PROBLEMS]
    assert "vin_store" not in r["materialized"]
    assert not layout.stores_root(root, load_profile(demo.profile).name).exists()


def test_wrong_expected_total_fails_the_link_check(
    built: dict, demo: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    prof = load_profile(demo.profile)
    text = demo.profile.read_text().replace(
        f"pair_rows = {prof.expected.pair_rows}", f"pair_rows = {prof.expected.pair_rows + 1}"
    )
    demo.profile.write_text(text)
    root = _copy_built(built, tmp_path)
    r = run_selection(_config(demo, root, "http://127.0.0.1:9").to_dict(), FINAL_STAGE)
    assert not r["success"]
    link = [c for c in r["checks"] if c["check"] == C.LINK_TOTALS_MATCH_EXPECTED and not c["passed"]]
    assert link and "pair_rows" in link[0]["description"]
    assert str(prof.expected.pair_rows + 1) in link[0]["description"]
    assert "vin_store" not in r["materialized"]
    assert not layout.stores_root(root, prof.name).exists()


def test_materialize_single_assets_directly(
    demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    """Single partitions through run_selection: real runs of the named jobs, partition by partition."""
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        cfg = _config(demo_cache, tmp_path / "root", hub.url)
        prof = load_profile(demo_cache.profile)
        key = "jesbu1_roboarena_0825_rfm_roboarena"
        parts = [a.path for a in prof.archives_by_cache_key()[key]]
        assert len(parts) == 2  # a split tar: both parts are the one partition of its cache key
        r = run_selection(cfg.to_dict(), ["archive_file"], key)
        assert r["success"], r
        assert all(layout.archive_path(tmp_path / "root", p).is_file() for p in parts)
        r = run_selection(cfg.to_dict(), ["cache_dir"], key)
        assert r["success"], r
        assert [c["check"] for c in r["checks"]] == [C.CACHE_DIR_COUNTS_CONSISTENT]
    assert (layout.cache_dir(tmp_path / "root", key) / "dataset_info.json").is_file()


def test_cli_bad_profile_is_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text('name = "x"\nbogus = 1\n')
    out = stage2("build", "--profile", str(bad), "--data-root", str(tmp_path / "r"))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "bogus" in out.stderr and str(bad) in out.stderr


def test_repin_after_upstream_change_is_detected(demo: DemoPaths) -> None:
    # Guard for the fixtures above: repin_profile really changes the pin of a mutated archive.
    prof = load_profile(demo.profile)
    victim = prof.archive_paths()[-1]
    f = demo.upstream / victim
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    repin_profile(demo)
    assert load_profile(demo.profile).archive(victim).sha256 != prof.archive(victim).sha256


def test_a_store_that_does_not_decode_is_never_published(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store step decodes a new store sample by sample (through zarr) before `current` moves to
    it. A writer fault (injected: one frames_sha256 recorded wrong) fails `store_validates` naming
    the sample; `current` keeps pointing at the previous store and the bad one is removed, so a
    rerun builds it again instead of reusing it."""
    from stage2_data import steps, store

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(demo_cache.profile)
    current = layout.current_store_path(root, prof.name)
    before = current.resolve()
    index_row = store.writer._index_row
    victim: list[str] = []

    def wrong_digest(r: store.plan.Row, digest: str) -> dict:
        row = index_row(r, digest)
        if not victim:
            victim.append(row["sample_key"])
            row["frames_sha256"] = "0" * 64
        return row

    monkeypatch.setattr(store.writer, "_index_row", wrong_digest)
    drawn: list[str] = []  # what the step drew alongside the validation (the UI's preview, in the asset)

    def alongside(url: str) -> dict:
        drawn.append(url)
        assert (Path(url) / "manifest.json").is_file()  # the new store, complete, while it is validated
        if (
            len(drawn) == 1
        ):  # the faulty writer's store: whatever drawing raises, the validation says what failed
            raise RuntimeError("the preview failed too")
        return {"drawn_from": url}

    res = steps.step_store(prof, root, rows_per_shard=5, alongside=alongside)  # other settings: a new store
    assert len(drawn) == 1 and "drawn_from" not in res.metadata  # not published: thrown away
    failed = {c.name: c.description for c in res.checks if not c.passed}
    assert set(failed) == {C.STORE_VALIDATES}, failed
    assert "frames_sha256" in failed[C.STORE_VALIDATES] and victim[0] in failed[C.STORE_VALIDATES]
    assert "not published" in failed[C.STORE_VALIDATES]
    assert current.resolve() == before and validate_vin_offline_store(current) == []
    stores = sorted(
        p.name for p in current.parent.iterdir() if not p.name.startswith(".")
    )  # .leases: readers
    assert stores == sorted(["current", before.name])

    monkeypatch.setattr(store.writer, "_index_row", index_row)  # the writer fixed: the rerun writes it anew
    res = steps.step_store(prof, root, rows_per_shard=5, alongside=alongside)
    assert all(c.passed for c in res.checks), [c.description for c in res.checks if not c.passed]
    assert res.metadata["rebuilt"] and res.metadata["decoded"] and current.resolve() != before
    assert res.metadata["drawn_from"] == drawn[-1] == str(current.resolve())  # published: kept
    res = steps.step_store(prof, root, rows_per_shard=5, alongside=alongside)  # reused: nothing to draw
    assert not res.metadata["rebuilt"] and len(drawn) == 2 and "drawn_from" not in res.metadata


def test_nightly_verify_rechecks_the_published_store(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    """The verify job (what nightly_verify runs) re-reads the published store without rebuilding
    it: a flipped byte in a shard file (bit rot: same size, only hashing sees it) fails
    store_bytes_match_manifest, naming the file; nothing else is touched."""
    import dagster as dg

    from stage2_data.stages import VERIFY_JOB

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    defs = build_definitions(BuildConfig(profile_path=str(demo_cache.profile), data_root=str(root)))
    job = defs.resolve_job_def(VERIFY_JOB)
    instance = dg.DagsterInstance.get()

    def verify(instance: dg.DagsterInstance = instance) -> tuple[dict, set[str]]:
        r = job.execute_in_process(instance=instance, raise_on_error=False)
        evals = {e.check_name: e for e in r.get_asset_check_evaluations()}
        done = {e.asset_key.to_user_string() for e in r.get_asset_materialization_events()}
        return evals, done

    evals, done = verify()
    assert evals[C.STORE_BYTES_MATCH_MANIFEST].passed, evals[C.STORE_BYTES_MATCH_MANIFEST].description
    assert done == set()  # checks only: nothing is re-materialized, the store is not rebuilt
    current = layout.current_store_path(root, load_profile(demo_cache.profile).name).resolve()
    manifest = json.loads((current / "manifest.json").read_text())
    rel = manifest["shards"][0]["files"][-1]["path"]
    data = bytearray((current / rel).read_bytes())
    data[len(data) // 2] ^= 0x01
    (current / rel).write_bytes(bytes(data))
    evals, _ = verify()
    bad = evals[C.STORE_BYTES_MATCH_MANIFEST]
    assert not bad.passed and rel in (bad.description or ""), bad.description
    # the UI's instance is not the data root's: the rebuild it names must record its runs here
    assert f"DAGSTER_HOME={dagster_home}" in (bad.description or ""), bad.description
    assert all(e.passed for name, e in evals.items() if name != C.STORE_BYTES_MATCH_MANIFEST)
    # the instance the run is given names it, not this process's DAGSTER_HOME: another one's
    # folder (quoted for the shell), and nothing when it is the data root's own (what a rebuild uses)
    (tmp_path / "ui home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "ui home")) as other:
        said = verify(other)[0][C.STORE_BYTES_MATCH_MANIFEST].description or ""
    assert f"DAGSTER_HOME={shlex.quote(str(tmp_path / 'ui home'))} in front" in said, said
    assert str(dagster_home) not in said, said
    (root / ".dagster").mkdir()
    with dg.DagsterInstance.local_temp(str(root / ".dagster")) as own:
        mine = verify(own)[0][C.STORE_BYTES_MATCH_MANIFEST]
    assert not mine.passed and rel in (mine.description or ""), mine.description
    assert "DAGSTER_HOME" not in (mine.description or ""), mine.description


def test_nightly_verify_finds_a_store_forged_with_its_manifest(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    """The published store edited together with its manifest (it validates deep: every byte agrees
    with the manifest): the verify job fails store_bytes_match_manifest, naming the fingerprint the
    data root's ledger recorded at publication and the one the store now gives."""
    import dagster as dg
    from helpers.forge import forge_store_consistently

    from stage2_data.stages import VERIFY_JOB

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    defs = build_definitions(BuildConfig(profile_path=str(demo_cache.profile), data_root=str(root)))
    job = defs.resolve_job_def(VERIFY_JOB)
    current = layout.current_store_path(root, load_profile(demo_cache.profile).name).resolve()
    clean = json.loads((current / "manifest.json").read_text())["fingerprint"]
    _, forged = forge_store_consistently(current)
    assert validate_vin_offline_store(current, deep=True) == []
    r = job.execute_in_process(instance=dg.DagsterInstance.get(), raise_on_error=False)
    bad = {e.check_name: e for e in r.get_asset_check_evaluations()}[C.STORE_BYTES_MATCH_MANIFEST]
    said = bad.description or ""
    assert not bad.passed and f"gives fingerprint {forged}" in said and f"published {clean}" in said, said


def test_the_verify_job_checks_a_read_only_data_root(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    """A data root on a read-only mount (a host that only verifies): the verify job's steps take
    the data root's lock shared through its lock file opened read-only, write no holder record,
    and check; a flipped byte there still fails its check. Without a lock file (no build ever ran
    there) nothing is locked and the steps still check."""
    import dagster as dg

    from stage2_data.stages import VERIFY_JOB

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    assert (root / layout.LOCK_FILE).is_file()  # the build made it
    current = layout.current_store_path(root, load_profile(demo_cache.profile).name).resolve()
    rel = json.loads((current / "manifest.json").read_text())["shards"][0]["files"][-1]["path"]
    instance = dg.DagsterInstance.get()

    def verify(data_root: Path) -> dict:
        defs = build_definitions(BuildConfig(profile_path=str(demo_cache.profile), data_root=str(data_root)))
        r = defs.resolve_job_def(VERIFY_JOB).execute_in_process(instance=instance, raise_on_error=False)
        assert r.success, [e.message for e in r.all_events if e.is_failure]
        return {e.check_name: e for e in r.get_asset_check_evaluations()}

    with read_only_mount(root) as ro:
        evals = verify(ro)
        assert evals and all(e.passed for e in evals.values()), [n for n, e in evals.items() if not e.passed]
        holders = shared_holders_dir(root)
        assert not holders.exists() or not any(holders.iterdir())  # nothing could be written
    data = bytearray((current / rel).read_bytes())
    data[len(data) // 2] ^= 0x01
    (current / rel).write_bytes(bytes(data))
    (root / layout.LOCK_FILE).unlink()
    with read_only_mount(root) as ro:
        evals = verify(ro)
    assert not evals[C.STORE_BYTES_MATCH_MANIFEST].passed
    assert rel.split("/")[-1] in (evals[C.STORE_BYTES_MATCH_MANIFEST].description or "")


def test_a_step_failed_by_its_blocking_checks_is_reported_as_those_checks() -> None:
    """Dagster fails a step whose blocking check failed (DagsterAssetCheckFailedError, listing them):
    the summary's error is each failed check with what it found, never an "internal error"; any
    other escaped exception still is one."""
    from dagster._utils.error import SerializableErrorInfo

    from stage2_pipelines.runs import check_failure_errors, failed_check_keys, step_error_line

    err = SerializableErrorInfo(
        "dagster._core.errors.DagsterAssetCheckFailedError: 2 blocking asset checks failed with ERROR "
        "severity:\nsubset_checksums: subset_bytes_match_sha256sums,other_check\nvin_store: v\n",
        [],
        "DagsterAssetCheckFailedError",
    )
    assert failed_check_keys(err) == [
        ("subset_checksums", "subset_bytes_match_sha256sums"),
        ("subset_checksums", "other_check"),
        ("vin_store", "v"),
    ]
    checks = [
        {"asset": "subset_checksums", "partition": None, "check": "subset_bytes_match_sha256sums",
         "passed": False, "description": "a.npz: expected 1, got 2 (fix: check the kit's SHA256SUMS)"},
        {"asset": "subset_checksums", "partition": None, "check": "passing", "passed": True, "description": ""},
    ]  # fmt: skip
    errors = check_failure_errors("subset_checksums", err, checks)
    assert errors is not None
    assert [e["message"] for e in errors] == [
        "check subset_checksums:subset_bytes_match_sha256sums failed: a.npz: expected 1, got 2 "
        "(fix: check the kit's SHA256SUMS)",
        "check subset_checksums:other_check failed",
        "check vin_store:v failed",
    ]
    assert all("internal error" not in e["message"] for e in errors)
    assert "internal error" not in step_error_line(err)
    bug = SerializableErrorInfo("KeyError: 'x'\n", [], "KeyError")
    assert check_failure_errors("s", bug, checks) is None
    assert step_error_line(bug).startswith("internal error: KeyError")


# ----- a cache key's chain in one run (the UI's "Materialize" of archive_file and cache_dir) -------
def _chain_run(demo: DemoPaths, root: Path, url: str, tags: dict[str, str]) -> Any:
    """One run of archive_file and cache_dir together, as the UI launches a materialization of both
    (the implicit asset job), over the partition or range ``tags`` name."""
    import dagster as dg

    defs = build_definitions(_config(demo, root, url))
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=dg.DagsterInstance.get(),
        asset_selection=[dg.AssetKey("archive_file"), dg.AssetKey("cache_dir")],
        tags=tags,
        raise_on_error=False,
    )


def _materialized(result: Any, asset: str) -> dict[str, dict[str, Any]]:
    """The partitions of ``asset`` a run materialized, with each one's metadata (as plain values)."""
    out = {}
    for e in result.get_asset_materialization_events():
        mat = e.event_specific_data.materialization
        if mat.asset_key.to_user_string() == asset:
            out[mat.partition] = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    return out


def test_a_cache_keys_archives_and_extraction_in_one_run(
    demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    """archive_file and cache_dir share their partitions, so one run may hold a cache key's whole
    chain: the extraction runs after the download in that run (never skipped while the run says
    success), for one partition and for a range, each partition materialized with its own metadata."""
    prof = load_profile(demo_cache.profile)
    key = "jesbu1_roboarena_0825_rfm_roboarena"  # a split tar: two parts
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        one = _chain_run(demo_cache, tmp_path / "one", hub.url, {"dagster/partition": key})
        assert one.success
        assert list(_materialized(one, "archive_file")) == [key]
        assert list(_materialized(one, "cache_dir")) == [key]
        assert (layout.cache_dir(tmp_path / "one", key) / "dataset_info.json").is_file()

        keys = prof.cache_keys()
        rng = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
        every = _chain_run(demo_cache, tmp_path / "all", hub.url, rng)
        assert every.success
        for asset in ("archive_file", "cache_dir"):
            got = _materialized(every, asset)
            assert sorted(got) == sorted(keys)
            assert all(md["cache_key"] == k for k, md in got.items())  # each partition's own metadata
        assert all((layout.cache_dir(tmp_path / "all", k) / "dataset_info.json").is_file() for k in keys)

        # one archive missing: its cache key fails, the run fails, nothing is extracted in it
        victim = prof.archive_paths_largest_first()[0]
        hub.faults.missing.add(victim)
        failed = _chain_run(demo_cache, tmp_path / "failed", hub.url, rng)
        assert not failed.success
        assert prof.archive(victim).cache_key not in _materialized(failed, "archive_file")
        assert _materialized(failed, "cache_dir") == {}


@pytest.mark.slow
def test_builds_of_two_data_roots_share_one_new_instance(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """Two builds of two data roots with one DAGSTER_HOME (a Dagster user's usual setting) on a new
    instance: the second waits while the first sets the instance up (creating a SQLite instance's
    tables in two processes at once failed, or stamped its schedule storage twice so that no build
    could open it again), then both build the same store, and a third build opens the instance and
    says that it also records the other two data roots' runs (the UI over it shows each asset as
    whichever data root built it last)."""
    import fcntl
    import subprocess
    import time

    from helpers.cli import STAGE2, subprocess_env

    from stage2_pipelines.runner import INSTANCE_LOCK

    home = tmp_path / "home"
    home.mkdir()
    env = subprocess_env(DAGSTER_HOME=str(home))

    def argv(root: str) -> list[str]:
        return [
            *STAGE2, "build", "--profile", str(demo_cache.profile), "--data-root", str(tmp_path / root),
            "--hub-folder", str(demo_cache.upstream), "--json", "--no-progress",
        ]  # fmt: skip

    # the lock held by another build's set-up: this build waits for it before creating anything
    with open(home / INSTANCE_LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        first = subprocess.Popen(
            argv("a"), env=env, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        time.sleep(5)
        assert first.poll() is None and not (home / "history").exists(), first.communicate()
        second = subprocess.Popen(
            argv("b"), env=env, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        fcntl.flock(held, fcntl.LOCK_UN)
    done = [p.communicate(timeout=600) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], done
    assert len({json.loads(out)["fingerprint"] for out, _ in done}) == 1
    # the third build's summary says the instance also holds the other two data roots' runs: its UI
    # shows each asset as whichever of them built it last (the first two ran side by side)
    third = stage2(*[a for a in argv("c")[len(STAGE2) :] if a != "--json"], env=env, timeout=600)
    assert third.returncode == 0, third.tail()
    said = [line for line in third.stdout.splitlines() if line.startswith("instance:")]
    others = ", ".join(str((tmp_path / r).resolve()) for r in ("a", "b"))
    assert said == [
        f"instance:     the Dagster instance {home.resolve()} also records the runs of 2 other data roots "
        f"({others}): its UI shows each asset, its checks and stale marks as whichever data root "
        "materialized it last (the store path in its metadata says which). Fix: one instance per data "
        f"root: DAGSTER_HOME={(tmp_path / 'c').resolve()}/.dagster for this data root's builds and its "
        "UI (what `stage2 build` uses when DAGSTER_HOME is unset)"
    ], third.stdout
