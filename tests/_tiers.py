"""Test tiers, assigned at collection so that no test file has to move or carry a marker.

``system``: needs more than the library, the Dagster layer and a loopback hub: a browser, the Dagster
webserver, PostgreSQL, a Dask cluster, dagster-k8s, an S3 server (moto), or a wheel built and
installed into a fresh venv.
``slow``: runs a whole build (through Dagster or the CLI, or a chain of killed and resumed builds), or
generates the full-cardinality demo. Tests that run a few assets through Dagster stay fast.

``make test-fast`` runs ``-m "not slow and not system"`` (the fast tier: the library, the CLI and the
Dagster definitions, about 8 minutes on 2 cores); ``make test`` (and CI) runs everything. Tests are put in a
tier by their file, by the fixtures they use (a fixture that builds or starts a service puts every
test that uses it, directly or through another fixture, in its tier), or by name; a test marked
``@pytest.mark.slow`` in its file stays slow.

Registered from ``tests/conftest.py`` with ``pytest_plugins = ["_tiers"]``.
"""

from __future__ import annotations

import warnings

import pytest

# Whole files.
SYSTEM_FILES = {
    "test_scale.py",  # PostgreSQL server, Dagster daemon, Dask cluster, dagster-k8s
    "test_store_target.py",  # a full build into S3 (moto's server)
    "test_wheel.py",  # builds the wheel, installs it into fresh venvs, runs the demo there
}

# Fixtures (anywhere in a test's fixture closure).
SYSTEM_FIXTURES = {
    "webserver",  # a dagster-webserver process (GraphQL and the browser test)
    "browser",  # headless Chromium through selenium
    "postgres",  # a PostgreSQL server
    "pg_build",
    "s3_endpoint",  # moto's S3 server
    "s3",
}
SLOW_FIXTURES = {
    "built",  # one whole `stage2 build` of the demo through Dagster
    "gated",  # tests/test_faults_gate.py: the demo built once, then a whole `stage2 build` per row
    "prepared",  # tests/fixtures/faults.py: the demo downloaded, extracted and built once through Dagster
    "chain",  # tests/test_faults_process.py: three whole `stage2 build` processes, two of them killed
    "refused_then_rebuilt",  # a whole rebuild through the printed command
    "ui_instance",  # a Dagster instance filled by a whole build
    "full_card_demo",  # the full-cardinality demo (53,765 trajectories, ~20 s), generated once
    "noop_rebuilt",  # tests/test_noop_rebuild.py: the demo built twice on one data root (CLI)
    "mutation_bench",  # tests/test_mutation.py: the demo built, then rebuilt after each mutation (CLI)
}

# Parametrized ids that need a service (tests/test_store_backends.py: backend = local | s3).
SYSTEM_PARAM_IDS = {"s3"}

# Tests that run a whole build without one of the fixtures above (file::name). Tests that run a few
# assets through Dagster (the kit checks, one asset materialized) take about a second and stay fast.
SLOW_TESTS = {
    "test_cli_first_hour.py::test_the_help_example_builds_the_demo_as_pasted",  # a whole `stage2 build`
    "test_cli_first_hour.py::test_a_build_whose_step_raises_an_unnamed_error_exits_3",  # build_all
    "test_foreign_profile.py::test_build_on_a_foreign_profile",  # a whole `stage2 build` (~25 s)
    "test_pipeline.py::test_wrong_archive_sha256_fails_its_check",  # build_all, then a repaired rebuild
    "test_stops.py::test_stop",  # a `stage2 build` stopped by a signal, then a whole rebuild (per case)
    "test_stops.py::test_a_killed_launched_build_leaves_nothing_that_publishes",  # killed, then rebuilt
    # six training processes with real loader workers, killed (spawn and forkserver start slowly)
    "test_loader_orphans.py::test_workers_and_shm_go_when_the_training_process_is_killed",
}


def _tier(item: pytest.Item) -> str | None:
    path = item.path
    if path.name in SYSTEM_FILES:
        return "system"
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & SYSTEM_FIXTURES:
        return "system"
    callspec = getattr(item, "callspec", None)
    if callspec is not None and SYSTEM_PARAM_IDS & set(callspec.id.split("-")):
        return "system"
    name = getattr(item, "originalname", item.name)
    if fixtures & SLOW_FIXTURES or f"{path.name}::{name}" in SLOW_TESTS:
        return "slow"
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seen: set[str] = set()
    for item in items:
        path = item.path
        seen.add(f"{path.name}::{getattr(item, 'originalname', item.name)}")
        tier = _tier(item)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
    # A renamed test would silently fall into the fast tier: name it when its whole file was collected.
    if not config.option.keyword and all("::" not in str(a) for a in config.args):
        files = {item.path.name for item in items}
        stale = sorted(t for t in SLOW_TESTS if t.split("::")[0] in files and t not in seen)
        if stale:
            warnings.warn(
                pytest.PytestWarning(f"tests/_tiers.py: SLOW_TESTS names tests that do not exist: {stale}"),
                stacklevel=1,
            )
