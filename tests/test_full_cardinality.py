"""Acceptance at real cardinality: the full-cardinality demo (the real profile's shape, tiny payloads)
reaches exactly the four real totals and the per-source sidecar counts, with zero problems.

One session-scoped pipeline: generate the demo, extract its 13 cache directories straight from the
upstream tars (``extract_cache_dir``; no hub needed here), unpack the sidecars; then the join, the
link check, the byte check and the ``stage2 verify --bytes --json`` command run on it.
The numbers below are the facts of ``stage2_core_v1`` (docs/spec/kit-format.md), written out
rather than read from the generated profile, so that the profile's [expected] table is tested too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.cli import stage2

from stage2_data import kit, layout
from stage2_data.demo import DemoPaths
from stage2_data.extract import extract_cache_dir
from stage2_data.profile import Profile, load_profile

CACHE_DIRS = 13
TRAJECTORIES = 53_765
PAIR_ROWS = 2_689
UNIQUE_FRAME_FILES = 4_323
ACTION_MANIFEST_ROWS = 23_359
RESOLVED_SIDECARS = 20_620
SIDECARS_BY_SOURCE = {"autoeval": 5_939, "libero_success": 1_709, "racer": 593, "roboarena": 12_379}


@dataclass
class FullCard:
    demo: DemoPaths
    profile: Profile
    data_root: Path
    seconds: dict[str, float]
    trajectories: int
    sidecars: kit.SidecarUnpackResult


@pytest.fixture(scope="session")
def full_card(tmp_path_factory: pytest.TempPathFactory, full_card_demo: tuple[DemoPaths, float]) -> FullCard:
    base = tmp_path_factory.mktemp("full-card")
    demo, generate_cpu = full_card_demo
    seconds: dict[str, float] = {"generate_cpu": generate_cpu}
    profile = load_profile(demo.profile)
    data_root = base / "data"
    t = time.perf_counter()
    trajectories = 0
    for key, specs in profile.archives_by_cache_key().items():
        rec = extract_cache_dir(key, [demo.upstream / a.path for a in specs], data_root)
        assert rec.problems == [], rec.problems
        trajectories += rec.frame_files
    seconds["extract"] = time.perf_counter() - t
    t = time.perf_counter()
    sidecars = kit.unpack_sidecars(profile, data_root)
    seconds["unpack_sidecars"] = time.perf_counter() - t
    return FullCard(demo, profile, data_root, seconds, trajectories, sidecars)


def test_profile_and_data_have_the_real_shape(full_card: FullCard) -> None:
    e = full_card.profile.expected
    assert (e.cache_dirs, e.trajectories) == (CACHE_DIRS, TRAJECTORIES)
    assert (e.pair_rows, e.unique_frame_files, e.action_manifest_rows, e.resolved_sidecars) == (
        PAIR_ROWS,
        UNIQUE_FRAME_FILES,
        ACTION_MANIFEST_ROWS,
        RESOLVED_SIDECARS,
    )
    assert dict(e.sidecars_by_source) == SIDECARS_BY_SOURCE
    assert len(full_card.profile.cache_keys()) == CACHE_DIRS
    assert full_card.trajectories == TRAJECTORIES
    assert (full_card.sidecars.files, full_card.sidecars.by_source) == (RESOLVED_SIDECARS, SIDECARS_BY_SOURCE)


def test_link_check_reaches_the_real_totals(full_card: FullCard) -> None:
    rep = kit.link_check(full_card.profile, full_card.data_root)
    assert rep.problems == []
    assert (rep.pair_rows, rep.unique_frame_files, rep.action_manifest_rows, rep.resolved_sidecars) == (
        PAIR_ROWS,
        UNIQUE_FRAME_FILES,
        ACTION_MANIFEST_ROWS,
        RESOLVED_SIDECARS,
    )
    assert rep.sidecars_by_source == SIDECARS_BY_SOURCE
    assert (rep.missing_frames, rep.missing_sidecars) == (0, 0)
    assert rep.totals_vs_expected(full_card.profile) == []


def test_join_has_no_problem_at_real_cardinality(full_card: FullCard) -> None:
    join = kit.build_join_table(full_card.profile, full_card.data_root)
    assert join.problems == []
    c = join.counts
    assert (c["pair_rows"], c["in_pairs"], c["action_manifest_rows"]) == (
        PAIR_ROWS,
        UNIQUE_FRAME_FILES,
        ACTION_MANIFEST_ROWS,
    )
    assert (c["sidecars_present"], c["sidecars_by_source"]) == (RESOLVED_SIDECARS, SIDECARS_BY_SOURCE)
    assert c["frames_present"] == join.rows == c["in_processed_dataset"]
    assert join.table_path == layout.join_table_path(full_card.data_root)


def test_byte_check_at_real_cardinality(full_card: FullCard) -> None:
    rep = kit.verify_subset_bytes(full_card.profile, full_card.data_root)
    assert rep.ok, rep.details[:5]
    assert (rep.files, rep.matched) == (UNIQUE_FRAME_FILES, UNIQUE_FRAME_FILES)
    assert rep.mismatched == rep.missing == rep.unlisted == rep.details == []


def test_stage2_verify_bytes_json(full_card: FullCard) -> None:
    proc = stage2(
        "verify", str(full_card.demo.profile), "--data-root", str(full_card.data_root), "--bytes", "--json",
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.tail(2000)
    out = proc.json()
    assert out["ok"] is True and out["problems"] == []
    assert {t["name"]: (t["found"], t["expected"], t["ok"]) for t in out["totals"]} == {
        "pair_rows": (PAIR_ROWS, PAIR_ROWS, True),
        "unique_frame_files": (UNIQUE_FRAME_FILES, UNIQUE_FRAME_FILES, True),
        "action_manifest_rows": (ACTION_MANIFEST_ROWS, ACTION_MANIFEST_ROWS, True),
        "resolved_sidecars": (RESOLVED_SIDECARS, RESOLVED_SIDECARS, True),
    }
    assert {s["source"]: (s["found"], s["expected"], s["ok"]) for s in out["sidecars_by_source"]} == {
        k: (v, v, True) for k, v in SIDECARS_BY_SOURCE.items()
    }
    b = out["bytes"]
    assert (b["ok"], b["files"], b["matched"], b["mismatched"], b["missing"], b["unlisted"]) == (
        True,
        UNIQUE_FRAME_FILES,
        UNIQUE_FRAME_FILES,
        0,
        0,
        0,
    )
    # the generation/extraction cost of this module, for the record (pytest -s shows it)
    print(f"full-cardinality fixture seconds: {full_card.seconds}")
