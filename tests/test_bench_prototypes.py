"""The measured alternatives under bench/ still load: a change of the product's assets, checks or
resources that breaks a prototype fails here, not in the next `make bench` (which takes minutes).

``bench/onerun_defs.py`` is the whole build as one run of one job, a cache directory being two
assets of its own (docs/architecture.md, "Orchestration"); ``bench/bench_onerun.py`` launches it.
"""

from __future__ import annotations

import dagster as dg
import pytest

from stage2_data.demo import DemoPaths
from stage2_data.profile import load_profile


def test_the_one_run_prototype_loads_on_the_demo(
    demo: DemoPaths, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGE2_PROFILE", str(demo.profile))
    monkeypatch.setenv("STAGE2_DATA_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("STAGE2_HUB_ENDPOINT", "http://127.0.0.1:9")
    from bench.onerun_defs import _key, build_defs

    defs = build_defs()
    job = defs.resolve_job_def("build")
    graph = defs.resolve_asset_graph()
    keys = load_profile(demo.profile).cache_keys()
    archives = {dg.AssetKey(["archive_file", _key(k)]) for k in keys}
    cache_dirs = {dg.AssetKey(["cache_dir", _key(k)]) for k in keys}

    def parents(name: str | dg.AssetKey) -> set[dg.AssetKey]:
        key = name if isinstance(name, dg.AssetKey) else dg.AssetKey(name)
        return set(graph.get(key).parent_keys)

    # every cache directory two assets, its extraction after its own download only
    assert archives | cache_dirs <= set(graph.get_all_asset_keys())
    for k in keys:
        assert parents(dg.AssetKey(["cache_dir", _key(k)])) == {dg.AssetKey(["archive_file", _key(k)])}
    # the kit and the store after every extraction, as in the product's graph
    assert parents("extraction_report") == cache_dirs
    assert parents("trajectory_join") == {dg.AssetKey("extraction_report"), dg.AssetKey("action_sidecars")}
    assert parents("vin_store") == {dg.AssetKey("trajectory_join"), dg.AssetKey("subset_checksums")}
    # the one job selects all of it, and carries the product's asset checks
    assert set(job.asset_layer.selected_asset_keys) == set(graph.get_all_asset_keys())
    assert any(c.asset_key == dg.AssetKey("vin_store") for c in graph.asset_check_keys)
