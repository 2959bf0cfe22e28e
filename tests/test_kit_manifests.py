"""stage2_data.kit.manifests: the pair manifest's fields, one problem per line (the whole rule set,
whatever decodes the manifests, is tests/test_kit_rules.py)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.kit import CK_A, A, frames_rel

from stage2_data import kit


def test_load_pairs_field_problems(tmp_path: Path) -> None:
    p = tmp_path / "pairs.jsonl"
    good = {
        "pair_id": "p1",
        "split": "train",
        "task": "t",
        "chosen_trajectory_id": A[0],
        "chosen_frames_path": frames_rel(CK_A, A[0]),
        "rejected_trajectory_id": A[1],
        "rejected_frames_path": frames_rel(CK_A, A[1]),
    }
    lines = [
        good,
        {k: v for k, v in good.items() if k != "task"} | {"pair_id": "p2"},
        dict(good, pair_id="p3", extra=1),
        dict(good, pair_id="p4", split="holdout"),
        dict(good, pair_id="p5", chosen_frames_path=frames_rel(CK_A, A[2])),
        dict(good, pair_id="p6", rejected_frames_path="frames/x.npz"),
        [1, 2],
    ]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    rows, problems = kit.load_pairs(p)
    assert [r.pair_id for r in rows] == ["p1", "p3", "p4", "p5", "p6"]
    assert [r.line for r in rows] == [1, 3, 4, 5, 6]
    text = "\n".join(problems)
    assert f"{p}:2: missing field(s) task" in text
    assert f"{p}:3: unknown field(s) extra" in text
    assert f"{p}:4: pair 'p4': split 'holdout' is not one of train, val, test" in text
    assert f"{p}:5: pair 'p5': chosen_frames_path {frames_rel(CK_A, A[2])!r} names trajectory {A[2]}" in text
    assert f"{p}:6: pair 'p6': rejected_frames_path 'frames/x.npz' is not" in text
    assert f"{p}:7: expected a JSON object, found list" in text
