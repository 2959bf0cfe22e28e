"""stage2_data.kit.link: the link check (names only), on the tiny kit (tests/helpers/kit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.kit import (
    ACTIONS_REL,
    CK_A,
    PAIRS_REL,
    A,
    B,
    Spec,
    build,
    build_case,
    frames_rel,
    sidecar_rel,
    the_only_problem,
)

from stage2_data import kit
from stage2_data.errors import ProblemsError


@pytest.mark.parametrize(
    "case",
    [
        "malformed pair line",
        "duplicate pair id",
        "leakage",
        "duplicate action id",
        "recovered row with missing sidecar",
        "sidecar for unknown trajectory",
        "pair frames file missing",
    ],
)
def test_link_check_reports_path_problems(tmp_path: Path, case: str) -> None:
    b, needles = build_case(tmp_path, case)
    link = kit.link_check(b.profile, b.data_root)
    the_only_problem(link.problems, needles)
    if case == "pair frames file missing":
        assert link.missing_frames == 1
    if case == "recovered row with missing sidecar":
        assert (link.missing_sidecars, link.resolved_sidecars) == (1, 9)
        assert link.totals_vs_expected(b.profile) == [
            "resolved_sidecars: expected 10, found 9",
            "sidecars_by_source.autoeval: expected 5, found 4",
        ]


def test_link_check_totals_vs_profile_expected(tmp_path: Path) -> None:
    def mutate(s: Spec) -> None:
        s.expected.update(pair_rows=2689, unique_frame_files=9, resolved_sidecars=11)
        s.expected["sidecars_by_source"] = {"autoeval": 5, "roboarena": 5, "racer": 1}

    b = build(tmp_path, mutate)
    link = kit.link_check(b.profile, b.data_root)
    assert link.problems == []
    assert link.totals_vs_expected(b.profile) == [
        "pair_rows: expected 2689, found 5",
        "resolved_sidecars: expected 11, found 10",
        "sidecars_by_source.racer: expected 1, found 0",
    ]


def test_missing_kit_files_are_problems_not_crashes(tmp_path: Path) -> None:
    b = build(tmp_path)
    b.kit(PAIRS_REL).unlink()
    for f in b.kit(ACTIONS_REL).iterdir():
        f.unlink()
    link = kit.link_check(b.profile, b.data_root)
    assert any("pair manifest does not exist" in p for p in link.problems)
    assert any("no <source>.jsonl action manifest" in p for p in link.problems)
    # every unpacked sidecar is now unnamed
    assert sum("no action manifest row names" in p for p in link.problems) == 10
    with pytest.raises(ProblemsError):
        kit.raise_for_problems(link.problems, "link check")


def test_link_check_never_opens_or_hashes(tmp_path: Path) -> None:
    """link_check looks at names only: garbage content in frames and sidecars changes nothing, while
    the join (which opens sidecars) and the byte check (which hashes frames) both notice."""
    b = build(tmp_path)
    (b.data_root / frames_rel(CK_A, A[0])).write_bytes(b"garbage")
    (b.data_root / "derived" / sidecar_rel("roboarena", B[0])).write_bytes(b"garbage")
    link = kit.link_check(b.profile, b.data_root)
    assert link.problems == [] and link.resolved_sidecars == 10
    assert link.fs_seconds <= link.seconds
    join = kit.build_join_table(b.profile, b.data_root)
    assert any(f"trajectory_{B[0]}.npz: unreadable sidecar npz" in p for p in join.problems)
    assert [m.split(":")[0] for m in kit.verify_subset_bytes(b.profile, b.data_root).mismatched] == [
        frames_rel(CK_A, A[0])
    ]
