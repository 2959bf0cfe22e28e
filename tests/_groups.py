"""Worker groups for pytest-xdist, assigned at collection: the tests that share an expensive
module- or session-scoped fixture (a whole build, a web server, a generated data set) carry the
``xdist_group`` mark of that fixture, and ``make test`` runs with ``--dist loadgroup``, so one
worker runs them and makes the fixture once per run instead of once per worker that happens to get
one of them. Every other test is handed out on its own, as with ``--dist load``; xdist starts the
groups first (largest first), and the single tests fill the workers up at the end.

A test using several of these fixtures goes to the group of the first one in ``GROUPS`` (xdist
would otherwise make a group of their combination, and the fixture would be made in two groups).

Registered from ``tests/conftest.py`` with ``pytest_plugins = ["_groups"]``.
"""

from __future__ import annotations

import pytest

# (fixture, group), in priority order.
GROUPS: list[tuple[str, str]] = [
    ("mutation_bench", "mutation"),  # tests/test_mutation.py: a build, a no-op build, a settled copy
    ("ui_instance", "ui"),  # tests/test_ui.py: a launched build in its own instance, a webserver
    ("browser", "ui"),  # ... and headless Chromium
    ("full_card_demo", "full_card"),  # the full-cardinality demo (53,765 trajectories)
    ("prepared", "prepared"),  # tests/fixtures/faults.py: the demo downloaded, extracted and built
    ("gated", "gated"),  # tests/test_faults_gate.py: a whole build
    ("world", "world"),  # tests/test_faults_outputs.py: a whole build
    ("noop_rebuilt", "noop_rebuilt"),  # tests/test_noop_rebuild.py: two whole builds
    ("extracted_root", "extracted_root"),  # tests/test_kit_checks.py: the demo downloaded, extracted
    ("postgres", "postgres"),  # tests/test_scale.py: a PostgreSQL server, a build into it
    ("demo_workspace", "demo_workspace"),  # tests/test_readme_code.py: `stage2 demo` in a workspace
    ("site", "docs_site"),  # tests/test_docs.py: the documentation site built
    ("wheel", "wheel"),  # tests/test_wheel.py: the wheel built
    ("small_store", "small_store"),  # tests/test_store_cli.py: a store written
    ("ups", "retention"),  # tests/test_retention.py: two upstreams, their stores built
    ("dirs", "extend"),  # tests/test_extend.py: cache directories generated
    ("built", "built"),  # tests/conftest.py: one whole `stage2 build` of the demo
]


def group_of(fixturenames: set[str]) -> str | None:
    """The worker group of a test using ``fixturenames`` (None: handed out on its own)."""
    return next((group for fixture, group in GROUPS if fixture in fixturenames), None)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks (its hook adds "@<group>" to node ids)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(set(getattr(item, "fixturenames", ())))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
