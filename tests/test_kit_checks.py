"""Each kit problem of issue 4, injected alone into a copy of the small demo's kit (or its data root),
fails the right Dagster asset check with a message that names the file, the line and the id.

The kit assets run as one real Dagster run (``stage2_pipelines.runner.run_selection``) on a data root that
already holds the demo's extracted cache directories (extracted once per session with
``extract_cache_dir`` straight from the demo's upstream tars; no hub is involved).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stage2_data import checks as C
from stage2_data import layout
from stage2_data.demo import DemoPaths, write_sidecar_sha256
from stage2_data.extract import extract_cache_dir
from stage2_data.profile import Profile, load_profile

KIT_ASSETS = ["extraction_report", "action_sidecars", "trajectory_join", "subset_checksums"]
ALL_KIT_CHECKS = {c for a in KIT_ASSETS for c in C.CHECKS_BY_ASSET[a]}


# ------------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def extracted_root(demo_cache: DemoPaths, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding the small demo's 13 extracted cache directories (read-only: copy it)."""
    root = tmp_path_factory.mktemp("kit-checks") / "data"
    prof = load_profile(demo_cache.profile)
    for key, specs in prof.archives_by_cache_key().items():
        extract_cache_dir(key, [demo_cache.upstream / a.path for a in specs], root)
    return root


@pytest.fixture
def data_root(extracted_root: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "data"
    shutil.copytree(extracted_root, dst, symlinks=True)
    return dst


class Kit:
    """The private demo copy's kit files, with small editing helpers."""

    def __init__(self, demo: DemoPaths, data_root: Path) -> None:
        self.demo = demo
        self.data_root = data_root
        self.profile: Profile = load_profile(demo.profile)
        self.pairs = self.profile.kit_file("pair_manifest")
        self.actions_dir = self.profile.kit_file("action_manifest_dir")
        self.tar = self.profile.kit_file("sidecar_archive")
        self.derived = layout.derived_root(data_root.resolve())

    # --- JSON Lines -------------------------------------------------------------------------
    @staticmethod
    def lines(path: Path) -> list[str]:
        return path.read_text(encoding="utf-8").splitlines()

    @staticmethod
    def write_lines(path: Path, lines: list[str]) -> None:
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    def action_file(self, source: str) -> Path:
        return self.actions_dir / f"{source}.jsonl"

    def action_rows(self, source: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines(self.action_file(source))]

    def pair_rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines(self.pairs)]

    def first_row(self, source: str, recovered: bool, skip: int = 0) -> tuple[int, dict[str, Any]]:
        """(1-based line, row) of the first (after ``skip``) recovered / not recovered row."""
        found = [
            (i, r)
            for i, r in enumerate(self.action_rows(source), start=1)
            if (r["status"] == "recovered") == recovered
        ]
        return found[skip]

    # --- the sidecar tar --------------------------------------------------------------------
    def members(self) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        with tarfile.open(self.tar) as tf:
            for m in tf.getmembers():
                if m.isfile():
                    f = tf.extractfile(m)
                    assert f is not None
                    out[m.name] = f.read()
        return out

    def write_tar(self, members: dict[str, bytes]) -> None:
        with tarfile.open(self.tar, "w", format=tarfile.GNU_FORMAT) as tf:
            for name in sorted(members):
                ti = tarfile.TarInfo(name)
                ti.size = len(members[name])
                ti.mode = 0o644
                tf.addfile(ti, io.BytesIO(members[name]))
        write_sidecar_sha256(self.demo.kit_root, self.profile.kit.sidecar_archive)


@pytest.fixture
def kit(demo: DemoPaths, data_root: Path) -> Kit:
    return Kit(demo, data_root)


def run_kit_assets(kit: Kit) -> dict[str, Any]:
    from stage2_pipelines.runs import run_selection

    config = {
        "profile_path": str(kit.demo.profile),
        "data_root": str(kit.data_root),
        "endpoint": "http://127.0.0.1:9",  # never contacted: no archive asset is selected
    }
    return run_selection(config, KIT_ASSETS)


def failed_checks(summary: dict[str, Any]) -> dict[str, str]:
    return {c["check"]: c["description"] for c in summary["checks"] if not c["passed"]}


def assert_fails(kit: Kit, expected: dict[str, list[str]]) -> dict[str, str]:
    """Run the kit assets; exactly the checks in ``expected`` fail, each description containing every
    given fragment; every other kit check ran and passed (unless skipped behind a blocking check)."""
    summary = run_kit_assets(kit)
    failed = failed_checks(summary)
    assert set(failed) == set(expected), (failed, summary["errors"])
    for name, fragments in expected.items():
        for frag in fragments:
            assert frag in failed[name], f"{name}: {frag!r} not in {failed[name]!r}"
    return failed


# ------------------------------------------------------------------------------------------------
# Baseline: the untouched demo passes every kit check (so each failure below is the injection's)
# ------------------------------------------------------------------------------------------------
def test_untouched_demo_passes_every_kit_check(kit: Kit, dagster_home: Path) -> None:
    summary = run_kit_assets(kit)
    assert summary["success"], summary["errors"]
    assert failed_checks(summary) == {}
    assert {c["check"] for c in summary["checks"]} == ALL_KIT_CHECKS
    assert summary["materialized"] == sorted(KIT_ASSETS)


# ------------------------------------------------------------------------------------------------
# The problems of issue 4, one at a time
# ------------------------------------------------------------------------------------------------
def test_duplicate_trajectory_id(kit: Kit, dagster_home: Path) -> None:
    # Line j becomes a copy of line i (both not recovered): the row count is unchanged.
    path = kit.action_file("autoeval")
    i, row = kit.first_row("autoeval", recovered=False)
    j, _ = kit.first_row("autoeval", recovered=False, skip=1)
    lines = kit.lines(path)
    lines[j - 1] = lines[i - 1]
    kit.write_lines(path, lines)
    tid = row["stage2_trajectory_id"]
    assert_fails(
        kit,
        {C.JOIN_HAS_NO_PROBLEMS: [f"{path}:{j}: duplicate stage2_trajectory_id {tid} (first at {path}:{i})"]},
    )


def test_duplicate_pair_id(kit: Kit, dagster_home: Path) -> None:
    rows = kit.pair_rows()
    first = rows[1]["pair_id"]
    rows[4]["pair_id"] = first
    kit.write_lines(kit.pairs, [json.dumps(r) for r in rows])
    assert_fails(
        kit, {C.JOIN_HAS_NO_PROBLEMS: [f"{kit.pairs}:5: duplicate pair_id {first!r} (first on line 2)"]}
    )


def test_sidecar_for_unknown_trajectory(kit: Kit, dagster_home: Path) -> None:
    members = kit.members()
    stranger = str(uuid.UUID(int=0x5EED, version=4))
    name = layout.sidecar_relpath("autoeval", stranger)
    members[name] = next(v for k, v in members.items() if k.startswith("action_sidecars/autoeval/"))
    kit.write_tar(members)
    n = kit.profile.expected.sidecars_by_source["autoeval"]
    assert_fails(
        kit,
        {
            # The join names the file and the trajectory; the per-source count is off by one too.
            C.JOIN_HAS_NO_PROBLEMS: [
                f"{kit.derived / name}: sidecar file for trajectory {stranger} that no action manifest row names"
            ],
            C.SIDECARS_BY_SOURCE_MATCH_EXPECTED: [f"autoeval is {n + 1}, expected {n}"],
        },
    )


def test_recovered_row_whose_sidecar_is_missing(kit: Kit, dagster_home: Path) -> None:
    line, row = kit.first_row("autoeval", recovered=True, skip=3)
    members = kit.members()
    del members[row["sidecar_path"]]
    kit.write_tar(members)
    tid, path = row["stage2_trajectory_id"], kit.action_file("autoeval")
    e = kit.profile.expected
    assert_fails(
        kit,
        {
            C.JOIN_HAS_NO_PROBLEMS: [
                f"{path}:{line}: trajectory {tid} is 'recovered' but its sidecar "
                f"{kit.derived / row['sidecar_path']} is missing"
            ],
            C.LINK_TOTALS_MATCH_EXPECTED: [
                f"resolved_sidecars is {e.resolved_sidecars - 1}, expected {e.resolved_sidecars}"
            ],
            C.SIDECARS_BY_SOURCE_MATCH_EXPECTED: [
                f"autoeval is {e.sidecars_by_source['autoeval'] - 1}, expected {e.sidecars_by_source['autoeval']}"
            ],
        },
    )


def test_pair_whose_frames_file_is_missing(kit: Kit, dagster_home: Path) -> None:
    # The rejected trajectory of some pair, used by no other pair, is replaced by an id whose frames
    # file is not in the data root: pair rows and unique frame files stay the same.
    rows = kit.pair_rows()
    uses: dict[str, int] = {}
    for r in rows:
        for role in ("chosen", "rejected"):
            uses[r[f"{role}_trajectory_id"]] = uses.get(r[f"{role}_trajectory_id"], 0) + 1
    idx = next(i for i, r in enumerate(rows) if uses[r["rejected_trajectory_id"]] == 1)
    old = rows[idx]["rejected_frames_path"]
    cache_key = layout.FRAMES_PATH_RE.match(old).group("cache_key")  # type: ignore[union-attr]
    ghost = str(uuid.UUID(int=0xFACE, version=4))
    fpath = layout.frames_relpath(cache_key, ghost)
    rows[idx].update(rejected_trajectory_id=ghost, rejected_frames_path=fpath)
    kit.write_lines(kit.pairs, [json.dumps(r) for r in rows])
    line = idx + 1
    assert_fails(
        kit,
        {
            C.JOIN_HAS_NO_PROBLEMS: [
                f"{kit.pairs}:{line}: frames file {fpath} of trajectory {ghost} is missing under "
                f"{kit.data_root.resolve()}",
                f"trajectory {ghost} (named at {kit.pairs}:{line}) is not a row of",
            ],
            # the ghost's frames file is also absent from SHA256SUMS: the byte check says so
            C.SUBSET_BYTES_MATCH_SHA256SUMS: [f"{fpath}: used by the pairs but not listed in"],
        },
    )


def test_frames_file_deleted_from_the_data_root(kit: Kit, dagster_home: Path) -> None:
    # The same problem on the data side: a frames file that a pair uses is gone after extraction.
    # The extraction report's checks see it first (blocking: the join does not run on such data);
    # they name the cache directory and the trajectory id.
    row = kit.pair_rows()[0]
    tid, fpath = row["chosen_trajectory_id"], row["chosen_frames_path"]
    (kit.data_root / fpath).unlink()
    cache_key = fpath.split("/")[1]
    n = kit.profile.expected.trajectories
    summary = run_kit_assets(kit)
    failed = failed_checks(summary)
    assert set(failed) <= set(C.CHECKS_BY_ASSET["extraction_report"]), failed
    assert f"trajectories is {n - 1}, expected {n}" in failed[C.TRAJECTORIES_MATCH_EXPECTED]
    assert any(cache_key in d and tid in d for d in failed.values()), failed
    ran = {c["check"] for c in summary["checks"]}
    assert C.JOIN_HAS_NO_PROBLEMS not in ran and C.SUBSET_BYTES_MATCH_SHA256SUMS not in ran


def test_leakage_across_splits(kit: Kit, dagster_home: Path) -> None:
    rows = kit.pair_rows()
    first_use: dict[str, int] = {}
    for i, r in enumerate(rows):
        shared = [t for t in (r["chosen_trajectory_id"], r["rejected_trajectory_id"]) if t in first_use]
        if shared:
            tid, j = shared[0], i
            break
        for t in (r["chosen_trajectory_id"], r["rejected_trajectory_id"]):
            first_use[t] = i
    else:  # pragma: no cover - the demo always has trajectories shared by two pairs
        pytest.fail("no trajectory is used by two pairs in the demo")
    i = first_use[tid]
    old_split = rows[i]["split"]
    new_split = "test" if old_split != "test" else "val"
    rows[j]["split"] = new_split
    kit.write_lines(kit.pairs, [json.dumps(r) for r in rows])
    assert_fails(
        kit,
        {
            C.JOIN_HAS_NO_PROBLEMS: [
                f"{kit.pairs}:{j + 1}: leakage: trajectory {tid} is used by a {new_split!r} pair here "
                f"(pair {rows[j]['pair_id']!r}) and by a {old_split!r} pair on line {i + 1}"
            ]
        },
    )


def test_malformed_manifest_line(kit: Kit, dagster_home: Path) -> None:
    path = kit.action_file("autoeval")
    line, _ = kit.first_row("autoeval", recovered=False)
    lines = kit.lines(path)
    lines[line - 1] = lines[line - 1].rstrip("}")  # a truncated line
    kit.write_lines(path, lines)
    e = kit.profile.expected
    assert_fails(
        kit,
        {
            C.JOIN_HAS_NO_PROBLEMS: [f"{path}:{line}: malformed JSON ("],
            # the unreadable row is not counted
            C.LINK_TOTALS_MATCH_EXPECTED: [
                f"action_manifest_rows is {e.action_manifest_rows - 1}, expected {e.action_manifest_rows}"
            ],
        },
    )


def _with_lone_surrogate(path: Path, line: int, field: str) -> None:
    """Line ``line``'s ``field`` value begins with the six characters ``\\ud800``: a JSON escape of
    a lone surrogate (valid JSON syntax; not Unicode text)."""
    lines = Kit.lines(path)
    before = f'"{field}": "'
    assert before in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(before, before + "\\ud800", 1)
    Kit.write_lines(path, lines)


def test_lone_surrogate_escape_in_a_pair_line_fails_the_blocking_join_check(
    kit: Kit, dagster_home: Path
) -> None:
    """It passed every check, then the store's pairs.jsonl writer crashed (an internal error)."""
    _with_lone_surrogate(kit.pairs, 1, "task")
    summary = run_kit_assets(kit)
    failed = failed_checks(summary)
    assert set(failed) == {C.JOIN_HAS_NO_PROBLEMS, C.LINK_TOTALS_MATCH_EXPECTED}, (failed, summary["errors"])
    assert (
        f"{kit.pairs}:1: field 'task' holds a lone surrogate (\\ud800), which is not valid Unicode text"
        in failed[C.JOIN_HAS_NO_PROBLEMS]
    )
    assert "fix: correct the text of line 1" in failed[C.JOIN_HAS_NO_PROBLEMS]
    e = kit.profile.expected
    assert f"pair_rows is {e.pair_rows - 1}, expected {e.pair_rows}" in failed[C.LINK_TOTALS_MATCH_EXPECTED]
    # blocking: the run fails on the check (nothing downstream of the join may run), not on a bug
    assert not summary["success"]
    assert "internal error" not in json.dumps(summary["errors"]), summary["errors"]


def test_stage2_verify_names_a_lone_surrogate_escape_in_either_manifest(kit: Kit) -> None:
    """`stage2 verify` (a subprocess, as a user runs it) passes the clean kit, then fails naming the
    file, the line, the field and the fix of a lone surrogate escape in the pair manifest and in an
    action manifest; no traceback, no internal error."""
    from helpers.cli import stage2, subprocess_env

    from stage2_data.kit import unpack_sidecars

    unpack_sidecars(kit.profile, kit.data_root)
    argv = ["verify", str(kit.demo.profile), "--data-root", str(kit.data_root)]
    env = subprocess_env(drop=("DAGSTER_HOME", "CI"))
    r = stage2(*argv, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("VERIFIED"), r.tail()

    _with_lone_surrogate(kit.pairs, 1, "task")
    aline, _ = kit.first_row("roboarena", recovered=False)
    _with_lone_surrogate(kit.action_file("roboarena"), aline, "status")
    r = stage2(*argv, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, r.tail()
    fix = "fix: correct the text of line {n}: write the character itself, or escape it as a surrogate pair"
    for path, line, field in ((kit.pairs, 1, "task"), (kit.action_file("roboarena"), aline, "status")):
        said = f"{path}:{line}: field '{field}' holds a lone surrogate (\\ud800), which is not valid Unicode text"
        assert said in out and fix.format(n=line) in out, out
    assert "internal error" not in out and "Traceback" not in out, out
    assert out.rstrip().endswith("FAILED"), out


def _widen(npz: bytes) -> bytes:
    """The same sidecar with one more action column (metadata raw_width follows: self-consistent)."""
    with np.load(io.BytesIO(npz), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["metadata_json"]))
    meta["raw_width"] += 1
    arrays["metadata_json"] = np.array(json.dumps(meta))
    for k in ("raw_actions", "aligned_actions"):
        a = arrays[k]
        arrays[k] = np.concatenate([a, np.zeros((a.shape[0], 1), a.dtype)], axis=1)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def test_width_contradicting_its_source(kit: Kit, dagster_home: Path) -> None:
    path = kit.action_file("autoeval")
    line, row = kit.first_row("autoeval", recovered=True, skip=2)
    members = kit.members()
    members[row["sidecar_path"]] = data = _widen(members[row["sidecar_path"]])
    kit.write_tar(members)
    lines = kit.lines(path)
    lines[line - 1] = json.dumps(dict(row, sidecar_sha256=hashlib.sha256(data).hexdigest()))
    kit.write_lines(path, lines)
    tid = row["stage2_trajectory_id"]
    assert_fails(
        kit,
        {
            C.JOIN_HAS_NO_PROBLEMS: [
                f"{kit.derived / row['sidecar_path']} (trajectory {tid}, {path}:{line}): raw action width 8 "
                "contradicts source 'autoeval' width 7"
            ]
        },
    )


# ------------------------------------------------------------------------------------------------
# `stage2 verify` on the same data (no Dagster): exit 0 when all matches, 1 naming every problem
# ------------------------------------------------------------------------------------------------
def test_stage2_verify_passes_then_names_every_problem(kit: Kit, capsys: pytest.CaptureFixture[str]) -> None:
    from stage2_data.cli import main
    from stage2_data.kit import unpack_sidecars

    unpack_sidecars(kit.profile, kit.data_root)
    args = ["verify", str(kit.demo.profile), "--data-root", str(kit.data_root), "--bytes"]
    assert main(args) == 0
    out = capsys.readouterr().out
    e = kit.profile.expected
    assert re.search(rf"\nresolved_sidecars +{e.resolved_sidecars} +{e.resolved_sidecars} +ok\n", out)
    assert out.rstrip().endswith("VERIFIED")

    # one sidecar gone from the data root, one byte flipped in one subset frames file
    line, row = kit.first_row("roboarena", recovered=True)
    (kit.derived / row["sidecar_path"]).unlink()
    sums = kit.profile.kit_file("subset_checksums")
    sums_line, entry = next(enumerate(kit.lines(sums), start=1))
    rel = entry.split("  ", 1)[1]
    victim = kit.data_root / rel
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))

    assert main(args) == 1
    out = capsys.readouterr().out
    n = e.resolved_sidecars
    assert re.search(rf"\nresolved_sidecars +{n - 1} +{n} +MISMATCH\n", out)
    assert (
        f"{kit.action_file('roboarena')}:{line}: trajectory {row['stage2_trajectory_id']} is 'recovered' "
        f"but its sidecar {kit.derived / row['sidecar_path']} is missing"
    ) in out
    assert f"{sums}:{sums_line}: {kit.data_root.resolve() / rel} has sha256 " in out
    assert out.rstrip().endswith("FAILED")

    assert main([*args, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and len(report["problems"]) == 2
    assert {t["name"]: t["ok"] for t in report["totals"]} == {
        "pair_rows": True,
        "unique_frame_files": True,
        "action_manifest_rows": True,
        "resolved_sidecars": False,
    }
    assert report["bytes"]["mismatched"] == 1


def test_stage2_verify_refuses_a_missing_data_root(kit: Kit, capsys: pytest.CaptureFixture[str]) -> None:
    from stage2_data.cli import main

    missing = kit.data_root / "nope"
    assert main(["verify", str(kit.demo.profile), "--data-root", str(missing)]) == 2
    assert f"data root {missing} does not exist" in capsys.readouterr().err


def test_link_check_fast_path_reports_exactly_what_the_exact_parsers_do(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """link_check decodes a clean kit with msgspec (fast path); with the fast path switched off the
    exact parsers run. Same totals, same problems in the same order, clean or with missing files."""
    from stage2_data import kit as kitmod
    from stage2_data.kit import manifests

    kitmod.unpack_sidecars(kit.profile, kit.data_root)
    _, row = kit.first_row("racer", recovered=True)
    (kit.derived / row["sidecar_path"]).unlink()  # a missing sidecar
    stray = kit.derived / layout.sidecar_relpath("racer", str(uuid.UUID(int=7, version=4)))
    stray.write_bytes(b"x")  # a sidecar no row names
    pair = kit.pair_rows()[3]
    (kit.data_root / pair["rejected_frames_path"]).unlink()  # a missing frames file

    def report() -> dict[str, Any]:
        d = kitmod.link_check(kit.profile, kit.data_root).to_dict()
        del d["seconds"], d["fs_seconds"]
        return d

    fast = report()
    assert (
        manifests._pairs_fast(kit.pairs) is not None and manifests._actions_fast(kit.actions_dir) is not None
    )
    monkeypatch.setattr(manifests, "_pairs_fast", lambda path: None)
    monkeypatch.setattr(manifests, "_actions_fast", lambda d: None)
    exact = report()
    assert fast == exact
    assert (fast["missing_frames"], fast["missing_sidecars"], len(fast["problems"])) == (1, 1, 3)


def test_stage2_verify_names_a_field_given_twice_on_a_line(kit: Kit) -> None:
    """A pair line giving ``split`` twice (the second value another split) and an action line giving
    ``status`` twice: `stage2 verify` fails naming each file, line and field with its fix, rather
    than reading the last value as Python's and msgspec's decoders would (a reader keeping the first
    would build another table)."""
    from helpers.cli import stage2, subprocess_env

    from stage2_data.kit import unpack_sidecars

    unpack_sidecars(kit.profile, kit.data_root)
    lines = Kit.lines(kit.pairs)
    other = "test" if '"split": "train"' in lines[2] else "train"
    lines[2] = lines[2][:-1] + f', "split": "{other}"}}'
    Kit.write_lines(kit.pairs, lines)
    path = kit.action_file("autoeval")
    aline, _ = kit.first_row("autoeval", recovered=True)
    lines = Kit.lines(path)
    lines[aline - 1] = lines[aline - 1][:-1] + ', "status": "source_has_no_actions"}'
    Kit.write_lines(path, lines)
    argv = ["verify", str(kit.demo.profile), "--data-root", str(kit.data_root)]
    r = stage2(*argv, env=subprocess_env(drop=("DAGSTER_HOME", "CI")), timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, r.tail()
    for where, field, n in ((kit.pairs, "split", 3), (path, "status", aline)):
        said = f"{where}:{n}: field(s) {field} given more than once on one line"
        assert said in out and f"fix: keep one {field!r} on line {n}" in out, out
    assert "internal error" not in out and "Traceback" not in out, out
