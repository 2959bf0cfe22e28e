"""stage2_data.kit.subset_bytes: the byte check of the subset's frames files against SHA256SUMS,
on the tiny kit (tests/helpers/kit.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from helpers.kit import CK_A, CK_B, SUMS_REL, A, B, build, frames_rel

from stage2_data import kit


def test_byte_check_finds_flipped_byte_missing_and_unlisted(tmp_path: Path) -> None:
    b = build(tmp_path, unpack=False)
    rel = frames_rel(CK_B, B[1])
    f = b.data_root / rel
    expected = hashlib.sha256(f.read_bytes()).hexdigest()
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    f.write_bytes(bytes(raw))
    actual = hashlib.sha256(bytes(raw)).hexdigest()
    (b.data_root / frames_rel(CK_A, A[2])).unlink()
    sums = b.kit(SUMS_REL)
    lines = sums.read_text().splitlines()
    unlisted = frames_rel(CK_A, A[4])
    sums.write_text("".join(line + "\n" for line in lines if not line.endswith(unlisted)))
    seen: list[tuple[int, int]] = []
    rep = kit.verify_subset_bytes(
        b.profile, b.data_root, workers=2, progress=lambda d, t: seen.append((d, t))
    )
    assert rep.mismatched == [f"{rel}: expected {expected}, actual {actual}"]
    assert rep.missing == [frames_rel(CK_A, A[2])]
    assert rep.unlisted == [unlisted]
    assert (rep.files, rep.matched) == (8, 6)
    assert not rep.ok and rep.to_dict()["ok"] is False
    assert seen[-1] == (8, 8) and len(seen) == 8


def test_byte_check_never_opens_a_fifo_where_a_listed_file_should_be(tmp_path: Path) -> None:
    """A FIFO (or folder) at a listed path is a problem naming it, found from its stats: the check
    never opens it (a FIFO would block the hashing thread for ever)."""
    import os
    import threading

    b = build(tmp_path, unpack=False)
    fifo, folder = b.data_root / frames_rel(CK_B, B[1]), b.data_root / frames_rel(CK_A, A[1])
    fifo.unlink()
    os.mkfifo(fifo)
    folder.unlink()
    folder.mkdir()
    got: list[kit.ByteReport] = []
    t = threading.Thread(
        target=lambda: got.append(kit.verify_subset_bytes(b.profile, b.data_root, workers=2))
    )
    t.daemon = True
    t.start()
    t.join(20)
    assert not t.is_alive(), "the byte check blocked on a FIFO"
    rep = got[0]
    assert not rep.ok and (rep.files, rep.matched) == (9, 7)
    assert any(f"{fifo} is a FIFO, not a regular file" in p for p in rep.problems), rep.problems
    assert any(f"{folder} is a folder, not a regular file" in p for p in rep.problems), rep.problems
