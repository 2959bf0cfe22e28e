"""stage2_data.kit.join: the trajectory join table, on the tiny kit (tests/helpers/kit.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.kit import ACTIONS_REL, CASES, CK_B, PAIRS_REL, Spec, build, build_case, the_only_problem

from stage2_data import kit, layout
from stage2_data.errors import KitError


def test_join_without_sha_check_leaves_it_null(tmp_path: Path) -> None:
    b = build(tmp_path)
    join = kit.build_join_table(b.profile, b.data_root, check_sidecar_sha256=False)
    assert join.problems == []
    assert set(pq.read_table(join.table_path).column("sidecar_sha256_ok").to_pylist()) == {None}


def test_join_is_by_id_not_row_order(tmp_path: Path) -> None:
    ref = build(tmp_path / "ref")
    ref_join = kit.build_join_table(ref.profile, ref.data_root)

    def shuffle(s: Spec) -> None:
        s.rng_shuffle = 7

    shuf = build(tmp_path / "shuf", shuffle)
    # the files really are in another order
    assert shuf.kit(PAIRS_REL).read_text() != ref.kit(PAIRS_REL).read_text()
    assert (shuf.kit(ACTIONS_REL) / "roboarena.jsonl").read_text() != (
        ref.kit(ACTIONS_REL) / "roboarena.jsonl"
    ).read_text()
    ids_of = [
        pa.ipc.open_file(
            str(layout.cache_dir(x.data_root, CK_B) / "processed_dataset" / "data-00000-of-00001.arrow")
        )
        .read_all()
        .column("id")
        .to_pylist()
        for x in (ref, shuf)
    ]
    assert ids_of[0] != ids_of[1] and sorted(ids_of[0]) == sorted(ids_of[1])

    shuf_join = kit.build_join_table(shuf.profile, shuf.data_root)
    assert shuf_join.problems == [] and ref_join.problems == []
    t_ref, t_shuf = pq.read_table(ref_join.table_path), pq.read_table(shuf_join.table_path)
    assert t_shuf.equals(t_ref)
    assert shuf_join.table_path.read_bytes() == ref_join.table_path.read_bytes()


def test_join_is_deterministic_and_atomic(tmp_path: Path) -> None:
    b = build(tmp_path)
    first = kit.build_join_table(b.profile, b.data_root).table_path.read_bytes()
    second = kit.build_join_table(b.profile, b.data_root).table_path.read_bytes()
    assert first == second
    # nothing left behind but the table and its sha256 (no temp file), the digest the table's
    written = sorted(p.name for p in layout.join_table_path(b.data_root).parent.iterdir())
    assert written == sorted([layout.JOIN_TABLE, layout.join_sha256_path(b.data_root).name])
    assert kit.read_join_rows(b.data_root) == pq.read_table(layout.join_table_path(b.data_root)).to_pylist()


def test_join_uses_what_the_unpack_read_and_rereads_a_changed_file(tmp_path: Path) -> None:
    """The join takes each sidecar's facts from the unpack's index while the file's size and mtime
    are what the unpack wrote (it parsed those very bytes), and reads the file again otherwise."""
    import json
    import os

    b = build(tmp_path)
    derived = b.data_root / "derived"
    index_path = derived / kit.SIDECAR_INDEX
    doc = json.loads(index_path.read_text())
    rel = sorted(doc["files"])[0]
    # the index says another width for one file (its bytes unchanged): the join believes the index
    doc["files"][rel]["info"]["raw_width"] = 99
    index_path.write_text(json.dumps(doc))
    join = kit.build_join_table(b.profile, b.data_root)
    assert [p for p in join.problems if "raw action width 99" in p], join.problems
    # the same file touched since: read again, and the truth is back
    path = derived / rel
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert kit.build_join_table(b.profile, b.data_root).problems == []
    # an index of another unpack (another tar) is not used at all
    doc["tar_sha256"] = "0" * 64
    index_path.write_text(json.dumps(doc))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert kit.build_join_table(b.profile, b.data_root).problems == []


# ------------------------------------------------------------------------------------------------
# Problems, each injected alone (helpers.kit.CASES)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_problem_alone_is_named(tmp_path: Path, case: str) -> None:
    b, needles = build_case(tmp_path, case)
    join = kit.build_join_table(b.profile, b.data_root)
    the_only_problem(join.problems, needles)
    # the table is still written, with every row
    assert join.table_path.is_file()
    with pytest.raises(KitError) as ei:
        kit.raise_for_problems(join.problems, "trajectory join")
    assert needles[0] in str(ei.value)


def test_width_against_profile_expected(tmp_path: Path) -> None:
    def mutate(s: Spec) -> None:
        s.expected["action_width_by_source"] = {"autoeval": 7, "roboarena": 9}

    b = build(tmp_path, mutate)
    join = kit.build_join_table(b.profile, b.data_root)
    assert len(join.problems) == 5
    assert all("contradicts source 'roboarena' width 9 (profile" in p for p in join.problems)
    assert pq.read_table(join.table_path).column("width_ok").to_pylist().count(False) == 5
