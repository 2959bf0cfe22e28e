"""The kit end to end on the tiny kit (tests/helpers/kit.py): unpack, link check, join and byte check
agree on a clean kit. Each module's own tests: test_kit_manifests.py, test_kit_sidecars.py,
test_kit_join.py, test_kit_link.py, test_kit_subset_bytes.py (and test_kit_rules.py: one rule set
whatever decodes the manifests)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
from helpers.kit import CK_A, SUMS_REL, X0, A, B, Built, build, frames_rel, rows_by_id

from stage2_data import kit, layout


def test_happy_path_counts(tmp_path: Path) -> None:
    b = build(tmp_path, unpack=False)
    res = kit.unpack_sidecars(b.profile, b.data_root)
    assert (res.files, res.by_source, res.skipped) == (10, {"autoeval": 5, "roboarena": 5}, False)
    assert res.bytes == sum(len(v) for v in b.spec.sidecars.values())
    for rel, data in b.spec.sidecars.items():
        assert (b.data_root / "derived" / rel).read_bytes() == data
    assert (
        json.loads((b.data_root / "derived" / kit.SIDECAR_MARKER).read_text())["tar_sha256"] == res.tar_sha256
    )
    # no staging leftovers
    assert sorted(p.name for p in (b.data_root / "derived").iterdir()) == [
        ".sidecars.index.json",
        ".sidecars.json",
        "action_sidecars",
    ]
    # the index: what the unpack read in every sidecar it wrote, with the file's size and mtime then
    recorded = kit.recorded_sidecars(b.data_root / "derived")
    assert sorted(recorded) == sorted(b.spec.sidecars)
    for rel, rec in recorded.items():
        st = (b.data_root / "derived" / rel).stat()
        assert (
            (rec["size"], rec["mtime_ns"])
            == (st.st_size, st.st_mtime_ns)
            == (len(b.spec.sidecars[rel]), rec["mtime_ns"])
        )
        assert (
            rec["info"]["sha256"] == hashlib.sha256(b.spec.sidecars[rel]).hexdigest()
            and rec["info"]["problems"] == []
        )

    link = kit.link_check(b.profile, b.data_root)
    assert link.problems == []
    assert (link.pair_rows, link.unique_frame_files, link.action_manifest_rows, link.resolved_sidecars) == (
        5,
        9,
        12,
        10,
    )
    assert link.sidecars_by_source == {"autoeval": 5, "roboarena": 5}
    assert (link.missing_frames, link.missing_sidecars) == (0, 0)
    assert link.totals_vs_expected(b.profile) == []
    assert json.loads(json.dumps(link.to_dict()))["resolved_sidecars"] == 10

    join = kit.build_join_table(b.profile, b.data_root)
    assert join.problems == []
    assert join.table_path == layout.join_table_path(b.data_root)
    assert join.rows == 12
    assert join.counts["action_status"] == {
        "recovered": 9 + 1,
        "rejected_refinement_no_consensus": 1,
        "source_has_no_actions": 1,
    }
    assert join.counts["expected_width_by_source"] == {"autoeval": 7, "roboarena": 8}
    table = pq.read_table(join.table_path)
    assert table.column("stage2_trajectory_id").to_pylist() == sorted(A + B)
    assert table.schema.equals(kit.JOIN_SCHEMA)
    for name in (
        *("stage2_trajectory_id", "cache_key", "source", "frames_path", "frames_present", "frames_bytes"),
        *("in_pairs", "split", "pair_count", "task", "quality_label", "partial_success", "is_robot"),
        *("num_frames", "action_status", "sidecar_path", "sidecar_present", "sidecar_sha256_ok"),
        *("raw_width", "expected_width", "aligned_length", "width_ok", "length_ok"),
    ):
        assert name in table.column_names, name
    rows = rows_by_id(join.table_path)
    assert X0 not in rows  # only trajectories the kit names

    a0 = rows[A[0]]
    frames_file = b.data_root / frames_rel(CK_A, A[0])
    assert a0["cache_key"] == CK_A and a0["source"] == "autoeval" and a0["data_source"] == "auto_eval"
    assert (a0["split"], a0["pair_count"], a0["in_pairs"]) == ("train", 2, True)
    assert a0["frames_path"] == frames_rel(CK_A, A[0])
    assert (a0["frames_present"], a0["frames_bytes"]) == (True, frames_file.stat().st_size)
    assert (a0["num_frames"], a0["task"], a0["quality_label"]) == (3, "autoeval task 0", "successful")
    assert a0["action_status"] == "recovered" and a0["sidecar_present"] is True
    assert (a0["raw_width"], a0["expected_width"], a0["aligned_length"]) == (7, 7, 3)
    assert (a0["width_ok"], a0["length_ok"], a0["sidecar_sha256_ok"]) == (True, True, True)
    assert rows[A[1]]["partial_success"] is None and rows[A[2]]["partial_success"] == 0.5

    b2, b3 = rows[B[2]], rows[B[3]]
    assert (b2["split"], b2["raw_width"], b2["num_frames"], b2["aligned_length"]) == ("test", 8, 5, 5)
    assert b3["split"] == "train"
    # rows without a sidecar keep their explicit status
    a5, b4 = rows[A[5]], rows[B[4]]
    assert (a5["action_status"], a5["sidecar_path"], a5["sidecar_present"]) == (
        "source_has_no_actions",
        None,
        None,
    )
    assert a5["in_pairs"] is False and a5["split"] is None and a5["pair_count"] == 0
    assert a5["raw_width"] is None and a5["width_ok"] is None and a5["source"] == "autoeval"
    assert b4["action_status"] == "rejected_refinement_no_consensus"
    # action-only trajectory with a sidecar
    b5 = rows[B[5]]
    assert (b5["in_pairs"], b5["split"], b5["sidecar_present"], b5["length_ok"]) == (False, None, True, True)

    byte = kit.verify_subset_bytes(b.profile, b.data_root, workers=2)
    assert byte.ok, byte.to_dict()
    assert (byte.files, byte.matched, byte.mismatched, byte.missing, byte.unlisted) == (9, 9, [], [], [])
    assert byte.bytes == sum((b.data_root / p).stat().st_size for p in _sums_paths(b))


def _sums_paths(b: Built) -> list[str]:
    return [line.split("  ", 1)[1] for line in b.kit(SUMS_REL).read_text().splitlines()]
