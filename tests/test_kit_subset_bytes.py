"""stage2_data.kit.subset_bytes: the byte check of the subset's frames files against SHA256SUMS,
on the tiny kit (tests/helpers/kit.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from helpers.cli import stage2, subprocess_env
from helpers.faults import Prepared, copy_root
from helpers.kit import CK_A, CK_B, SUMS_REL, A, B, build, frames_rel

from stage2_data import kit
from stage2_data.demo import DemoPaths
from stage2_data.profile import load_profile


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


def test_byte_check_a_malformed_sums_line_is_one_problem(tmp_path: Path) -> None:
    """A malformed line of SHA256SUMS (not a sha256sum line, a short digest, bytes that are not
    UTF-8) is one problem naming its line; the well-formed lines are checked as usual, and a frames
    file only a malformed line names is not also reported "not listed" (a second line for it would
    list it twice). The check fails all the same."""
    b = build(tmp_path, unpack=False)
    sums = b.kit(SUMS_REL)
    lines = sums.read_bytes().splitlines()
    n = len(lines)
    short = lines[2][:10] + lines[2][11:]  # a digest one hex digit short, its path kept
    lines[2] = short
    sums.write_bytes(b"".join(x + b"\n" for x in lines) + b"extra\n" + b"caf\xe9  x.npz\n")
    rep = kit.verify_subset_bytes(b.profile, b.data_root, workers=2)
    assert rep.problems == [
        f"{sums}:3: not '<64 hex>  <path>': {short.decode()[:80]!r}",
        f"{sums}:{n + 1}: not '<64 hex>  <path>': 'extra'",
        f"{sums}:{n + 2}: not UTF-8 text",
    ]
    assert rep.details == rep.problems
    assert (rep.files, rep.matched) == (n - 1, n - 1)
    assert rep.mismatched == rep.missing == rep.unlisted == []
    assert not rep.ok


def test_verify_bytes_reports_a_malformed_sums_line_once(
    prepared: Prepared, demo: DemoPaths, tmp_path: Path
) -> None:
    """`stage2 verify --bytes` on the demo with one line appended to its SHA256SUMS: that line is
    the one problem (exit 1); every listed file is still found listed and checked."""
    root = copy_root(prepared, tmp_path / "root")
    sums = load_profile(demo.profile).kit_file("subset_checksums")
    n = len(sums.read_text().splitlines())
    with sums.open("a") as f:
        f.write("extra\n")
    r = stage2(
        "verify",
        str(demo.profile),
        "--data-root",
        str(root),
        "--bytes",
        env=subprocess_env(drop=("DAGSTER_HOME", "CI")),
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, r.tail()
    assert f"{sums}:{n + 1}: not '<64 hex>  <path>': 'extra'" in out, out
    assert "problems (1):" in out and "not listed" not in out, out
    assert f"{n} matched, 0 mismatched, 0 missing, 0 unlisted" in out, out
