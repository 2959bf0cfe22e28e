"""Scale out: the production instance on a real PostgreSQL server, the build on a real Dask cluster of
worker processes, and the Kubernetes configuration validated against dagster-k8s's schemas."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import yaml
from helpers.cli import REPO, stage2, subprocess_env
from helpers.env import environ, free_port
from helpers.faults import copy_kit

from stage2_data import checks as C
from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubFaults, HubServer
from stage2_data.profile import load_profile
from stage2_data.stages import ACQUIRE_JOB, ARCHIVE_FILE, CACHE_DIR, STAGES
from stage2_data.store import VinOfflineStoreReader
from stage2_pipelines.config import BuildConfig
from stage2_pipelines.runner import build_all

DEPLOY = REPO / "deploy"
PG_BINS = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))


def _as_pg_user(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: run its binaries as the `postgres` system user then
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class Postgres:
    """A real PostgreSQL server (Debian's binaries) on 127.0.0.1, in a throw-away data directory."""

    def __init__(self) -> None:
        if not PG_BINS:
            pytest.fail(
                "PostgreSQL is not installed: run `bash scripts/system-deps.sh` (Debian `postgresql`)"
            )
        self.bin = PG_BINS[-1].parent
        self.port = free_port()
        self.user = "stage2"
        self.password = secrets.token_hex(12)
        self.dir = Path(tempfile.mkdtemp(prefix="stage2-pg-"))
        self.data = self.dir / "data"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Postgres:
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        subprocess.run(
            _as_pg_user(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    self.user,
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
        )
        self.proc = subprocess.Popen(
            _as_pg_user(
                [
                    str(self.bin / "postgres"),
                    "-D",
                    str(self.data),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.dir),
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=200",
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "server.log", "wb"),  # noqa: SIM115 (closed with the process)
        )
        import psycopg2

        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg2.connect(**self.dsn("postgres")).close()
                return self
            except psycopg2.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL did not start: {(self.dir / 'server.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.1)

    def dsn(self, db: str) -> dict[str, object]:
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": db,
        }

    def create_database(self, name: str) -> None:
        import psycopg2

        conn = psycopg2.connect(**self.dsn("postgres"))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()

    def query(self, db: str, sql: str) -> list[tuple]:
        import psycopg2

        with psycopg2.connect(**self.dsn(db)) as conn, conn.cursor() as cur:
            cur.execute(sql)
            rows = cur.fetchall()
        conn.close()
        return rows

    def env(self, db: str) -> dict[str, str]:
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": db,
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
        }

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            subprocess.run(
                _as_pg_user([str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w"]),
                capture_output=True,
                timeout=60,
            )
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    pg = Postgres().start()
    try:
        yield pg
    finally:
        pg.stop()


def _instance_env(pg: Postgres, db: str, home: Path) -> dict[str, str]:
    """The environment of the instance in ``home`` (deploy/dagster.yaml), on database ``db``."""
    return {**pg.env(db), "DAGSTER_HOME": str(home), "DAGSTER_COMPUTE_LOG_DIR": str(home / "logs")}


@contextmanager
def _use_instance(pg: Postgres, db: str, home: Path) -> Iterator[None]:
    """For the block: DAGSTER_HOME with deploy/dagster.yaml, connected to a new database ``db``."""
    pg.create_database(db)
    home.mkdir(parents=True)
    shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
    with environ(**_instance_env(pg, db, home)):
        yield


def _build(demo: DemoPaths, root: Path, **kw: object) -> dict:
    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as hub:
        config = BuildConfig(profile_path=str(demo.profile), data_root=str(root), endpoint=hub.url, **kw)  # type: ignore[arg-type]
        return build_all(config, concurrency=2)


@pytest.fixture(scope="module")
def pg_build(postgres: Postgres, demo_cache: DemoPaths, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The in-process build of the demo, recorded in the PostgreSQL instance of deploy/dagster.yaml."""
    base = tmp_path_factory.mktemp("pg-build")
    with _use_instance(postgres, "stage2_inprocess", base / "home"):
        summary = _build(demo_cache, base / "root")
        instance = dg.DagsterInstance.get()
        runs = instance.get_runs()
        checks = [
            e.dagster_event.event_specific_data
            for r in runs
            for e in instance.all_logs(r.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
            if e.dagster_event is not None
        ]
        storage = type(instance.run_storage).__name__, type(instance.event_log_storage).__name__
        instance.dispose()
    return {"summary": summary, "runs": runs, "checks": checks, "storage": storage, "db": "stage2_inprocess"}


def test_build_records_runs_and_checks_in_postgres(
    pg_build: dict, postgres: Postgres, demo_cache: DemoPaths
) -> None:
    s = pg_build["summary"]
    assert s["ok"], ([c for c in s["checks"] if not c["passed"]], s["errors"])
    assert pg_build["storage"] == ("PostgresRunStorage", "PostgresEventLogStorage")
    prof = load_profile(demo_cache.profile)
    # read back through the instance: every run of the build, succeeded, one per stage (a stage's
    # partitions in one run over their range), each a run of its stage's named job
    runs = pg_build["runs"]
    assert {r.run_id for r in runs} == {r["run_id"] for r in s["runs"]}
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    assert sorted(r.job_name for r in runs) == sorted(st.job for st in STAGES)
    # every check of every asset, and of every partition, was recorded as passed (a range run also
    # records one summary result per check of a partitioned asset: partition None)
    evals = pg_build["checks"]
    assert all(e.passed for e in evals)
    per_partition = [e for e in evals if e.partition is not None]
    assert sorted(
        e.partition for e in per_partition if e.check_name == C.ARCHIVE_SHA256_MATCHES_PIN
    ) == sorted(prof.cache_keys())  # archive_file: one partition per cache key
    assert len(per_partition) + len([e for e in evals if e.partition is None]) == len(evals)
    # every check of the definitions: the verify-only ones too, recorded from the build's own work
    assert {(e.asset_key.to_user_string(), e.check_name) for e in evals} == {
        (a, n) for a, names in C.ALL_CHECKS_BY_ASSET.items() for n in names
    }
    summaries = len(C.CHECKS_BY_ASSET[ARCHIVE_FILE]) + len(C.CHECKS_BY_ASSET[CACHE_DIR])
    assert len(evals) == len(s["checks"]) + summaries + len(C.RECORDED_BY_BUILD)
    # and straight from PostgreSQL: one materialization per partition
    db = pg_build["db"]
    [(n_runs,)] = postgres.query(db, "SELECT count(*) FROM runs WHERE status = 'SUCCESS'")
    assert n_runs == len(s["runs"]) == len(STAGES)
    counts = dict(postgres.query(db, "SELECT dagster_event_type, count(*) FROM event_logs GROUP BY 1"))
    assert counts["ASSET_CHECK_EVALUATION"] == len(evals)
    assert counts["ASSET_MATERIALIZATION"] == sum(
        sum(len(d) for d in r["partitions"].values()) if r["partitions"] else len(r["materialized"])
        for r in s["runs"]
    )
    rows = postgres.query(
        db,
        f"SELECT execution_status FROM asset_check_executions WHERE check_name = '{C.ARCHIVE_SHA256_MATCHES_PIN}'",
    )
    assert {st for (st,) in rows} == {"SUCCEEDED"}


@contextmanager
def _daemon(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`dagster-daemon run` over workspace.yaml, as deploy/dagster.yaml documents it, for the block;
    its stderr in ``log``."""
    daemon = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),  # noqa: SIM115
    )
    try:
        yield daemon
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def test_a_second_build_with_work_to_do_on_the_same_postgres_instance_succeeds(
    pg_build: dict, postgres: Postgres, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """After the first build the `downloads` pool's row exists in PostgreSQL: creating it again made
    Dagster's initializer update inside the transaction the duplicate key had aborted, so every
    later build with work to do (another data root, an edited kit) ended in an internal error
    (QA). A build into a new data root on the same database succeeds."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
    with environ(**_instance_env(postgres, pg_build["db"], home)):
        s = _build(demo_cache, tmp_path / "root")
    assert s["ok"], s["errors"]


def test_daemon_runs_schedules_and_sensors_on_postgres(
    pg_build: dict, postgres: Postgres, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    # `dagster-daemon run` as documented in deploy/dagster.yaml, on the instance of the build above
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
    env = subprocess_env(
        **_instance_env(postgres, pg_build["db"], home),
        STAGE2_PROFILE=str(demo_cache.profile),
        STAGE2_DATA_ROOT=str(tmp_path / "root"),
    )
    want = {"SCHEDULER", "SENSOR", "QUEUED_RUN_COORDINATOR"}
    got: set[str] = set()
    with (
        _daemon(env, tmp_path / "daemon.log") as daemon,
        environ(**_instance_env(postgres, pg_build["db"], home)),
    ):
        instance = dg.DagsterInstance.get()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and daemon.poll() is None:
            got = set(instance.get_daemon_heartbeats())
            if want <= got and len({sel for sel, _ in _sensor_ticks(postgres, pg_build["db"])}) >= DEFAULT_ON:
                break
            time.sleep(0.5)
        instance.dispose()
    log = (tmp_path / "daemon.log").read_text()[-3000:]
    assert want <= got, log
    # every default-on sensor (the two alert sensors, advance_rebuilds) ticked without an error; their
    # state lives in PostgreSQL
    ticks = _sensor_ticks(postgres, pg_build["db"])
    assert len({sel for sel, _ in ticks}) >= DEFAULT_ON, (ticks, log)
    assert all(status != "FAILURE" for _, status in ticks), (ticks, log)


def test_the_daemon_carries_a_rebuild_started_by_hand_streamed_two_at_once(
    pg_build: dict, postgres: Postgres, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """A rebuild started as docs/operating.md says (`dagster job launch` of check_profile with the
    rebuild's tags) on the production instance (deploy/dagster.yaml: the queued run coordinator), then
    left to `dagster-daemon run`: the advance_rebuilds sensor requests the streamed runs (three ranges
    here) and the kit's; the `downloads` pool's two slots let at most two ranges download at once
    (the run queue holds the third until a slot frees); then the store's run; the store is the one
    `stage2 build` made."""
    home = tmp_path / "home"
    db = "stage2_rebuild"
    postgres.create_database(db)
    home.mkdir()
    shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
    root = tmp_path / "root"
    rebuild = "by-hand"
    # one 1 MB/s link for every download (the demo's 11 MB: 11 s or more), so that the ranges'
    # downloads would overlap without the pool's limit
    slow = HubFaults(link_rate=1_000_000)
    with HubServer(
        demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision, faults=slow
    ) as hub:
        env = subprocess_env(
            **_instance_env(postgres, db, home),
            STAGE2_PROFILE=str(demo_cache.profile),
            STAGE2_DATA_ROOT=str(root),
            STAGE2_HUB_ENDPOINT=hub.url,
            STAGE2_STREAM_RUN_MB="3",  # the demo's 11 MB as three ranges
        )
        bin_dir = Path(sys.executable).parent
        tags = {"stage2/rebuild": rebuild, "stage2/stage": "profile"}
        launched = subprocess.run(
            [str(bin_dir / "dagster"), "job", "launch", "-w", str(REPO / "workspace.yaml"), "-j", "check_profile",
             "--tags", json.dumps(tags)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-3000:]
        records: list[dg.RunRecord] = []
        with _daemon(env, tmp_path / "daemon.log") as daemon, environ(**_instance_env(postgres, db, home)):
            instance = dg.DagsterInstance.get()
            deadline = time.monotonic() + 420
            while time.monotonic() < deadline and daemon.poll() is None:
                records = list(instance.get_run_records(dg.RunsFilter(tags={"stage2/rebuild": rebuild})))
                store = [r for r in records if r.dagster_run.tags.get("stage2/stage") == "store"]
                failed = [r for r in records if r.dagster_run.status == dg.DagsterRunStatus.FAILURE]
                if failed or (store and store[0].dagster_run.is_finished):
                    break
                time.sleep(2)
            downloads = _step_spans(instance, [r.dagster_run.run_id for r in records], "archive_file")
            instance.dispose()
    log = (tmp_path / "daemon.log").read_text()[-3000:]
    by_stage: dict[str, list[dg.RunRecord]] = {}
    for r in records:
        by_stage.setdefault(r.dagster_run.tags.get("stage2/stage", ""), []).append(r)
    assert sorted((k, len(v)) for k, v in by_stage.items()) == [
        ("kit", 1),
        ("profile", 1),
        ("store", 1),
        ("stream", 3),
    ], (sorted((r.dagster_run.job_name, r.dagster_run.status.value) for r in records), log)
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records), log
    assert sorted(r.dagster_run.tags["stage2/part"] for r in by_stage["stream"]) == ["1/3", "2/3", "3/3"]
    # the `downloads` pool's two slots: never more than two ranges downloading at once
    spans = [(r.start_time, r.end_time) for r in by_stage["stream"]]
    assert all(a is not None and b is not None for a, b in spans)
    assert len(downloads) == 3, downloads
    most = max(sum(1 for a, b in downloads if a <= t < b) for t, _ in downloads)
    assert most <= 2, (downloads, spans)
    # the store's run started after every streamed run ended
    assert by_stage["store"][0].start_time >= max(b for _, b in spans)  # type: ignore[operator,type-var]
    reader = VinOfflineStoreReader(layout.current_store_path(root, load_profile(demo_cache.profile).name))
    assert reader.manifest["fingerprint"] == pg_build["summary"]["fingerprint"]


def _step_spans(instance: dg.DagsterInstance, run_ids: list[str], step: str) -> list[tuple[float, float]]:
    """(start, end) of the step ``step`` in each of the runs that ran it, from their event logs."""
    spans = []
    for run_id in run_ids:
        times: dict[str, float] = {}
        for entry in instance.all_logs(run_id):
            ev = entry.dagster_event
            if (
                ev is not None
                and entry.step_key == step
                and ev.event_type_value in ("STEP_START", "STEP_SUCCESS")
            ):
                times[ev.event_type_value] = entry.timestamp
        if times:
            spans.append((times["STEP_START"], times["STEP_SUCCESS"]))
    return spans


DEFAULT_ON = 3  # sensors on by default: alert_on_failed_check, alert_on_failed_run, advance_rebuilds


def _sensor_ticks(pg: Postgres, db: str) -> list[tuple]:
    return pg.query(db, "SELECT selector_id, status FROM job_ticks WHERE type = 'SENSOR'")


def test_full_build_on_a_dask_cluster_of_worker_processes(
    pg_build: dict, postgres: Postgres, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    from dask.distributed import Client, LocalCluster

    with _use_instance(postgres, "stage2_dask", tmp_path / "home"):
        with (
            LocalCluster(
                n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
            ) as cluster,
            Client(cluster.scheduler_address) as client,
        ):
            worker_pids = set(client.run(os.getpid).values())
            s = _build(demo_cache, tmp_path / "root", executor="dask", dask_address=cluster.scheduler_address)
        instance = dg.DagsterInstance.get()
        step_pids: dict[str, set[int]] = {}
        for r in s["runs"]:
            for e in instance.all_logs(r["run_id"], of_type=dg.DagsterEventType.STEP_START):
                assert e.dagster_event is not None
                step_pids.setdefault(e.step_key or "", set()).add(int(e.dagster_event.pid or 0))
        runs = instance.get_runs()
        instance.dispose()
    assert s["ok"], ([c for c in s["checks"] if not c["passed"]], s["errors"])
    # the same store as the in-process build
    assert s["fingerprint"] == pg_build["summary"]["fingerprint"]
    prof = load_profile(demo_cache.profile)
    assert len(worker_pids) == 2 and os.getpid() not in worker_pids
    # every step ran in a Dask worker process, never in this one
    all_pids = set().union(*step_pids.values())
    assert all_pids <= worker_pids, (all_pids, worker_pids)
    # one run of each stage's named job; the archive partitions (one per cache key) in one run (one
    # Dask task, its downloads in threads), each partition with its own materialization and checks
    assert sorted(r.job_name for r in runs) == sorted(st.job for st in STAGES)
    assert all(r.tags.get("stage2/executor") == "dask" for r in runs)
    archive_run = next(r for r in s["runs"] if r["job"] == ACQUIRE_JOB)
    assert set(archive_run["partitions"]) == set(prof.cache_keys())
    sha_checks = [c for c in s["checks"] if c["check"] == C.ARCHIVE_SHA256_MATCHES_PIN]
    assert sorted(c["partition"] for c in sha_checks) == sorted(prof.cache_keys())
    assert all(c["passed"] for c in sha_checks)


def test_a_failed_blocking_check_on_dask_publishes_nothing(
    built: dict, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """`stage2 build --executor dask` with an expected total the join contradicts: the join's
    blocking check fails, and the store step after it does not run (dagster-dask ran every step once
    its upstream steps were done, whatever they did: a new store was published with exit 1 and the
    summary said none was). `current` stays where it was."""
    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    profile = copy_kit(demo_cache, tmp_path / "kit")
    text = profile.read_text()
    rows = re.search(r"^pair_rows = (\d+)$", text, re.M)
    assert rows
    text = text.replace(rows.group(0), f"pair_rows = {int(rows.group(1)) + 1}")
    text = re.sub(r"^(description = .*)$", r"\1\nmax_frames = 40", text, count=1, flags=re.M)  # a new store
    profile.write_text(text)
    name = load_profile(profile).name
    before = layout.current_store_path(root, name).resolve()
    r = stage2(
        "build", "--profile", str(profile), "--data-root", str(root), "--hub-folder", str(demo_cache.upstream),
        "--executor", "dask", env=subprocess_env(drop=("DAGSTER_HOME", "CI")), timeout=600,
    )  # fmt: skip
    assert r.returncode == 1 and "BUILD FAILED" in r.stdout, r.tail()
    assert "link_totals_match_expected" in r.stdout + r.stderr, r.tail()
    assert layout.current_store_path(root, name).resolve() == before
    assert sorted(p.name for p in layout.stores_root(root, name).iterdir() if p.name.startswith("v")) == [
        before.name
    ]


def test_kubernetes_configuration_validates_against_dagster_k8s(demo_cache: DemoPaths) -> None:
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster_k8s import K8sRunLauncher, k8s_job_executor
    from kubernetes.client import ApiClient, V1PersistentVolumeClaim

    from stage2_pipelines.definitions import build_definitions
    from stage2_pipelines.executors import k8s_executor_config

    k8s = DEPLOY / "k8s"
    exec_cfg = k8s_executor_config(k8s / "executor.yaml")

    @dg.op
    def step() -> None:
        pass

    @dg.job(executor_def=k8s_job_executor)
    def one_pod_per_step() -> None:
        step()

    resolved = dg.validate_run_config(one_pod_per_step, {"execution": {"config": exec_cfg}})
    k8s_cfg = resolved["execution"]["k8s"]
    # a config error is caught: an unknown key fails validation
    with pytest.raises(dg.DagsterInvalidConfigError):
        dg.validate_run_config(one_pod_per_step, {"execution": {"config": {**exec_cfg, "pod_per_step": 1}}})
    # the instance: PostgreSQL storage and the K8sRunLauncher config, valid for dagster-k8s
    pg_env = {"DAGSTER_PG_HOST": "db", "DAGSTER_PG_PORT": "5432", "DAGSTER_PG_DB": "d"}
    pg_env |= {"DAGSTER_PG_USER": "u", "DAGSTER_PG_PASSWORD": "p"}
    with environ(**pg_env):
        inst_cfg, _ = dagster_instance_config(str(k8s))
    assert "postgres" in inst_cfg["storage"]
    launcher = inst_cfg["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    assert process_config(K8sRunLauncher.config_type(), launcher["config"]).success
    # one shared data root: the claim of the PVC manifest, mounted at STAGE2_DATA_ROOT in run and step pods
    pvc_doc = yaml.safe_load((k8s / "data-root-pvc.yaml").read_text())
    pvc = ApiClient()._ApiClient__deserialize(pvc_doc, V1PersistentVolumeClaim)
    assert pvc.kind == "PersistentVolumeClaim" and "ReadWriteMany" in pvc.spec.access_modes
    for cfg in (k8s_cfg, launcher["config"]):
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in cfg["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in cfg["volume_mounts"]}
        assert claims == {"data-root": pvc.metadata.name}
        assert f"STAGE2_DATA_ROOT={mounts['data-root']}" in cfg["env_vars"]
    # STAGE2_EXECUTOR=k8s makes it the executor of every job of the Definitions
    defs = build_definitions(
        BuildConfig(profile_path=str(demo_cache.profile), data_root="/data/stage2", executor="k8s")
    )
    for name in ("acquire_archives", "extract_cache_dirs", "verify_kit_and_build_store"):
        assert defs.resolve_job_def(name).executor_def.name == "k8s"
