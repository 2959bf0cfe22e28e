"""Tests of stage2_data.kit on a tiny, real data root + kit built in tmp_path.

Everything is real: npz files written by numpy, Arrow IPC stream/file written by pyarrow, real tar
files and sha256 files. Each injected problem is checked to be the *only* problem reported.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import tarfile
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stage2_data import kit, layout
from stage2_data.errors import ChecksumMismatchError, KitError, ProblemsError, UnsafeArchiveError
from stage2_data.profile import Profile, parse_profile

CK_A = "owner_auto_eval_rfm_auto_eval_rfm"
CK_B = "owner_roboarena_0825_rfm_roboarena"
SOURCES = {CK_A: ("autoeval", 7, "auto_eval"), CK_B: ("roboarena", 8, "roboarena")}
AUTO = "<auto>"


def tid(n: int) -> str:
    return str(uuid.UUID(int=n * 7919 + 12345, version=4))


A = [tid(i) for i in range(6)]
B = [tid(100 + i) for i in range(6)]
X0 = tid(999)  # in processed_dataset and on disk, named by nothing
UNKNOWN = tid(4242)

PAIRS_REL = "manifests/pairs_v1.jsonl"
SUMS_REL = "manifests/stage2_subset_SHA256SUMS"
ACTIONS_REL = "derived/action_manifests"
TAR_REL = "derived/action_sidecars_v1.tar"


def frames_rel(ck: str, t: str) -> str:
    return layout.frames_relpath(ck, t)


def sidecar_npz(
    source: str, width: int, n_raw: int, t_aligned: int, *, meta_width: int | None = None
) -> bytes:
    rng = np.random.default_rng(width * 1000 + n_raw * 10 + t_aligned)
    raw = rng.standard_normal((n_raw, width)).astype(np.float32)
    idx = np.linspace(0, n_raw - 1, t_aligned).astype(np.int64)
    meta = {
        "source": source,
        "raw_width": width if meta_width is None else meta_width,
        "alignment": "nearest",
    }
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        metadata_json=np.array(json.dumps(meta)),
        raw_actions=raw,
        aligned_actions=raw[idx],
        source_indices=np.arange(n_raw, dtype=np.int64),
        alignment_indices=idx,
    )
    return buf.getvalue()


@dataclass
class Spec:
    """Python-level description of a data root + kit; tests mutate it before ``write``."""

    trajectories: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[Any] = field(default_factory=list)  # dicts, or raw strings written verbatim
    actions: dict[str, list[Any]] = field(default_factory=dict)
    sidecars: dict[str, bytes] = field(default_factory=dict)  # tar member name -> bytes
    expected: dict[str, Any] = field(default_factory=dict)
    frames_missing: set[str] = field(default_factory=set)
    processed_missing: set[str] = field(default_factory=set)
    rng_shuffle: int | None = None

    def traj(self, t: str) -> dict[str, Any]:
        return next(r for r in self.trajectories if r["id"] == t)


def default_spec() -> Spec:
    s = Spec()
    for ck, ids in ((CK_A, A + [X0]), (CK_B, B)):
        source, _, data_source = SOURCES[ck]
        for i, t in enumerate(ids):
            s.trajectories.append(
                {
                    "id": t,
                    "cache_key": ck,
                    "task": f"{source} task {i % 2}",
                    "data_source": data_source,
                    "is_robot": True,
                    "quality_label": ("successful", "suboptimal", "failure")[i % 3],
                    "partial_success": None if i == 1 else 0.25 * (i % 5),
                    "num_frames": 3 + i % 3,
                }
            )

    def pair(pid: str, split: str, c: tuple[str, str], r: tuple[str, str]) -> dict[str, Any]:
        return {
            "pair_id": pid,
            "split": split,
            "task": "a task",
            "chosen_trajectory_id": c[1],
            "chosen_frames_path": frames_rel(*c),
            "rejected_trajectory_id": r[1],
            "rejected_frames_path": frames_rel(*r),
        }

    s.pairs = [
        pair("p000001", "train", (CK_A, A[0]), (CK_A, A[1])),
        pair("p000002", "train", (CK_A, A[0]), (CK_A, A[2])),
        pair("p000003", "val", (CK_B, B[0]), (CK_B, B[1])),
        pair("p000004", "test", (CK_B, B[2]), (CK_A, A[3])),
        pair("p000005", "train", (CK_A, A[4]), (CK_B, B[3])),
    ]
    statuses = {
        "autoeval": ["recovered"] * 5 + ["source_has_no_actions"],
        "roboarena": ["recovered"] * 4 + ["rejected_refinement_no_consensus", "recovered"],
    }
    for ck, ids in ((CK_A, A), (CK_B, B)):
        source, width, _ = SOURCES[ck]
        rows = []
        for i, t in enumerate(ids):
            st = statuses[source][i]
            rec = st == "recovered"
            rel = layout.sidecar_relpath(source, t)
            rows.append(
                {
                    "stage2_trajectory_id": t,
                    "source": source,
                    "cache_key": ck,
                    "status": st,
                    "sidecar_path": rel if rec else None,
                    "sidecar_sha256": AUTO if rec else None,
                }
            )
            if rec:
                nf = s.traj(t)["num_frames"]
                s.sidecars[rel] = sidecar_npz(source, width, 10 + i, nf)
        s.actions[source] = rows
    s.expected = {
        "cache_dirs": 2,
        "archives": 2,
        "trajectories": 13,
        "pair_rows": 5,
        "unique_frame_files": 9,
        "action_manifest_rows": 12,
        "resolved_sidecars": 10,
        "sidecars_by_source": {"autoeval": 5, "roboarena": 5},
    }
    return s


def write_tar(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        dirs = sorted({m.rsplit("/", 1)[0] for m in members} | {layout.SIDECARS_DIR})
        for d in dirs:
            ti = tarfile.TarInfo(d)
            ti.type = tarfile.DIRTYPE
            ti.mode = 0o755
            tf.addfile(ti)
        for name in sorted(members):
            ti = tarfile.TarInfo(name)
            ti.size = len(members[name])
            ti.mode = 0o644
            tf.addfile(ti, io.BytesIO(members[name]))


def write_sha_file(tar: Path, name: str | None = None) -> None:
    digest = hashlib.sha256(tar.read_bytes()).hexdigest()
    (tar.parent / (tar.name + ".sha256")).write_text(f"{digest}  {name or tar.name}\n")


@dataclass
class Built:
    root: Path
    data_root: Path
    kit_root: Path
    profile: Profile
    spec: Spec

    def kit(self, rel: str) -> Path:
        return self.kit_root / rel


def make_profile(kit_root: Path, expected: dict[str, Any]) -> Profile:
    return parse_profile(
        {
            "name": "tiny",
            "source": {"repo_id": "org/processed_datasets", "revision": "a" * 40},
            "kit": {
                "pair_manifest": PAIRS_REL,
                "subset_checksums": SUMS_REL,
                "action_manifest_dir": ACTIONS_REL,
                "sidecar_archive": TAR_REL,
                "sidecar_archive_sha256": TAR_REL + ".sha256",
            },
            "archives": [{"path": f"{ck}.tar", "cache_key": ck} for ck in (CK_A, CK_B)],
            "expected": expected,
        }
    ).with_kit_root(kit_root)


def write(root: Path, spec: Spec) -> Built:
    data_root, kit_root = root / "data", root / "kit"
    rng = random.Random(spec.rng_shuffle) if spec.rng_shuffle is not None else None

    def order(items: list[Any]) -> list[Any]:
        items = list(items)
        if rng is not None:
            rng.shuffle(items)
        return items

    # cache dirs: frames + processed_dataset (A: two Arrow *stream* files, B: one Arrow IPC *file*)
    sha_of_frames: dict[str, str] = {}
    for ck in (CK_A, CK_B):
        cdir = layout.cache_dir(data_root, ck)
        (cdir / "frames").mkdir(parents=True)
        rows = [r for r in spec.trajectories if r["cache_key"] == ck]
        for r in rows:
            if r["id"] in spec.frames_missing:
                continue
            t = r["num_frames"]
            frames = np.full((t, 4, 6, 3), hash(r["id"]) % 251, dtype=np.uint8)
            p = cdir / "frames" / f"trajectory_{r['id']}.npz"
            np.savez_compressed(p, frames=frames, shape=np.array(frames.shape), num_frames=np.int64(t))
            sha_of_frames[frames_rel(ck, r["id"])] = hashlib.sha256(p.read_bytes()).hexdigest()
        prow = order([r for r in rows if r["id"] not in spec.processed_missing])
        table = pa.table(
            {
                "id": [r["id"] for r in prow],
                "task": [r["task"] for r in prow],
                "data_source": [r["data_source"] for r in prow],
                "frames": [frames_rel(ck, r["id"]) for r in prow],
                "is_robot": [r["is_robot"] for r in prow],
                "quality_label": [r["quality_label"] for r in prow],
                "partial_success": pa.array([r["partial_success"] for r in prow], pa.float32()),
                "num_frames": pa.array([r["num_frames"] for r in prow], pa.int64()),
            }
        )
        pdir = cdir / "processed_dataset"
        pdir.mkdir()
        if ck == CK_A:
            half = table.num_rows // 2
            for i, part in enumerate((table.slice(0, half), table.slice(half))):
                with pa.ipc.new_stream(str(pdir / f"data-0000{i}-of-00002.arrow"), table.schema) as w:
                    w.write_table(part)
        else:
            with pa.ipc.new_file(str(pdir / "data-00000-of-00001.arrow"), table.schema) as fw:
                fw.write_table(table)

    # pair manifest + subset checksums
    pairs_path = kit_root / PAIRS_REL
    pairs_path.parent.mkdir(parents=True)
    pair_items = order(spec.pairs)
    pairs_path.write_text(
        "".join((p if isinstance(p, str) else json.dumps(p)) + "\n" for p in pair_items), encoding="utf-8"
    )
    used = sorted(
        {
            p[k]
            for p in spec.pairs
            if isinstance(p, dict)
            for k in ("chosen_frames_path", "rejected_frames_path")
        }
    )
    (kit_root / SUMS_REL).write_text(
        "".join(f"{sha_of_frames.get(u, '0' * 64)}  {u}\n" for u in used), encoding="utf-8"
    )

    # action manifests
    adir = kit_root / ACTIONS_REL
    adir.mkdir(parents=True)
    for source, rows in spec.actions.items():
        lines = []
        for r in order(rows):
            if isinstance(r, dict) and r.get("sidecar_sha256") == AUTO:
                r = dict(r, sidecar_sha256=hashlib.sha256(spec.sidecars[r["sidecar_path"]]).hexdigest())
            lines.append(r if isinstance(r, str) else json.dumps(r))
        (adir / f"{source}.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    # sidecar tar + sha256
    tar = kit_root / TAR_REL
    write_tar(tar, {f"{k}": v for k, v in spec.sidecars.items()})
    write_sha_file(tar)
    return Built(root, data_root, kit_root, make_profile(kit_root, spec.expected), spec)


def build(tmp_path: Path, mutate: Callable[[Spec], None] | None = None, *, unpack: bool = True) -> Built:
    spec = default_spec()
    if mutate is not None:
        mutate(spec)
    b = write(tmp_path, spec)
    if unpack:
        kit.unpack_sidecars(b.profile, b.data_root)
    return b


def rows_by_id(path: Path) -> dict[str, dict[str, Any]]:
    return {r["stage2_trajectory_id"]: r for r in pq.read_table(path).to_pylist()}


# ------------------------------------------------------------------------------------------------
# Happy path
# ------------------------------------------------------------------------------------------------
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
        ".sidecars.json",
        "action_sidecars",
    ]

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
    assert [p.name for p in layout.join_table_path(b.data_root).parent.iterdir()] == [layout.JOIN_TABLE]


# ------------------------------------------------------------------------------------------------
# Problems, each injected alone
# ------------------------------------------------------------------------------------------------
class Boom:
    """Unpickling this creates a folder: proof that a loader unpickled the array."""

    marker = ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.marker,))


def _sc(source: str, t: str) -> str:
    return layout.sidecar_relpath(source, t)


def _malformed_pair(s: Spec) -> None:
    s.pairs[2] = '{"pair_id": "p000003", "split": '


def _malformed_action(s: Spec) -> None:
    s.actions["autoeval"][5] = "this is not json"


def _dup_pair(s: Spec) -> None:
    s.pairs[4]["pair_id"] = "p000001"


def _leakage(s: Spec) -> None:
    s.pairs[4].update(rejected_trajectory_id=B[0], rejected_frames_path=frames_rel(CK_B, B[0]))


def _dup_action(s: Spec) -> None:
    s.actions["roboarena"].append(dict(s.actions["roboarena"][4]))


def _sidecar_missing(s: Spec) -> None:
    s.actions["autoeval"][1]["sidecar_sha256"] = "1" * 64
    del s.sidecars[_sc("autoeval", A[1])]


def _unknown_sidecar(s: Spec) -> None:
    s.sidecars[_sc("roboarena", UNKNOWN)] = sidecar_npz("roboarena", 8, 5, 3)


def _wrong_width(s: Spec) -> None:
    s.sidecars[_sc("roboarena", B[2])] = sidecar_npz("roboarena", 9, 12, 5)


def _wrong_meta_width(s: Spec) -> None:
    s.sidecars[_sc("roboarena", B[5])] = sidecar_npz("roboarena", 8, 15, 5, meta_width=7)


def _frames_missing(s: Spec) -> None:
    s.frames_missing.add(A[2])


def _sha_differs(s: Spec) -> None:
    s.actions["autoeval"][0]["sidecar_sha256"] = "f" * 64


def _wrong_length(s: Spec) -> None:
    s.sidecars[_sc("roboarena", B[1])] = sidecar_npz("roboarena", 8, 11, 5)


def _not_in_processed(s: Spec) -> None:
    s.processed_missing.add(A[5])


def _recovered_without_path(s: Spec) -> None:
    s.actions["roboarena"][5].update(sidecar_path=None, sidecar_sha256="2" * 64)
    del s.sidecars[_sc("roboarena", B[5])]


def _unrecovered_with_path(s: Spec) -> None:
    s.actions["autoeval"][5]["sidecar_path"] = _sc("autoeval", A[5])


def _source_not_stem(s: Spec) -> None:
    s.actions["autoeval"][5]["source"] = "racer"


CASES: dict[str, tuple[Callable[[Spec], None], list[str]]] = {
    "malformed pair line": (_malformed_pair, ["pairs_v1.jsonl:3: malformed JSON"]),
    "malformed action line": (_malformed_action, ["autoeval.jsonl:6: malformed JSON"]),
    "duplicate pair id": (_dup_pair, ["pairs_v1.jsonl:5: duplicate pair_id 'p000001' (first on line 1)"]),
    "leakage": (
        _leakage,
        [f"pairs_v1.jsonl:5: leakage: trajectory {B[0]}", "'train' pair here", "'val' pair on line 3"],
    ),
    "duplicate action id": (
        _dup_action,
        [f"roboarena.jsonl:7: duplicate stage2_trajectory_id {B[4]} (first at ", "roboarena.jsonl:5)"],
    ),
    "recovered row with missing sidecar": (
        _sidecar_missing,
        [f"autoeval.jsonl:2: trajectory {A[1]} is 'recovered' but its sidecar", "is missing"],
    ),
    "sidecar for unknown trajectory": (
        _unknown_sidecar,
        [
            f"trajectory_{UNKNOWN}.npz: sidecar file for trajectory {UNKNOWN} that no action manifest row names"
        ],
    ),
    "width contradicting its source": (
        _wrong_width,
        [
            f"trajectory_{B[2]}.npz (trajectory {B[2]}, ",
            "roboarena.jsonl:3): raw action width 9 contradicts source 'roboarena' width 8",
        ],
    ),
    "metadata raw_width contradicts raw_actions": (
        _wrong_meta_width,
        [f"(trajectory {B[5]}, ", "roboarena.jsonl:6): metadata_json raw_width 7 but raw_actions width 8"],
    ),
    "pair frames file missing": (
        _frames_missing,
        [f"pairs_v1.jsonl:2: frames file {frames_rel(CK_A, A[2])} of trajectory {A[2]} is missing"],
    ),
    "sidecar sha256 differs from manifest": (
        _sha_differs,
        [f"autoeval.jsonl:1: trajectory {A[0]}: sidecar", "the manifest says " + "f" * 64],
    ),
    "aligned length differs from num_frames": (
        _wrong_length,
        [
            f"(trajectory {B[1]}, ",
            "roboarena.jsonl:2): aligned_actions has 5 rows but the trajectory has num_frames 4",
        ],
    ),
    "id not in processed_dataset": (
        _not_in_processed,
        [f"trajectory {A[5]} (named at ", "autoeval.jsonl:6) is not a row of", f"{CK_A}/processed_dataset"],
    ),
    "recovered row without sidecar_path": (
        _recovered_without_path,
        [f"roboarena.jsonl:6: trajectory {B[5]} is 'recovered' but has no sidecar_path"],
    ),
    "non-recovered row with a sidecar_path": (
        _unrecovered_with_path,
        [f"autoeval.jsonl:6: trajectory {A[5]} has status 'source_has_no_actions' but a sidecar_path"],
    ),
    "action source differs from file": (
        _source_not_stem,
        [f"autoeval.jsonl:6: trajectory {A[5]}: source 'racer' is not the file's 'autoeval'"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_problem_alone_is_named(tmp_path: Path, case: str) -> None:
    mutate, needles = CASES[case]
    b = build(tmp_path, mutate)
    join = kit.build_join_table(b.profile, b.data_root)
    assert len(join.problems) == 1, join.problems
    for needle in needles:
        assert needle in join.problems[0], (needle, join.problems[0])
    # the table is still written, with every row
    assert join.table_path.is_file()
    with pytest.raises(KitError) as ei:
        kit.raise_for_problems(join.problems, "trajectory join")
    assert needles[0] in str(ei.value)


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
    mutate, needles = CASES[case]
    b = build(tmp_path, mutate)
    link = kit.link_check(b.profile, b.data_root)
    assert len(link.problems) == 1, link.problems
    for needle in needles:
        assert needle in link.problems[0], (needle, link.problems[0])
    if case == "pair frames file missing":
        assert link.missing_frames == 1
    if case == "recovered row with missing sidecar":
        assert (link.missing_sidecars, link.resolved_sidecars) == (1, 9)
        assert link.totals_vs_expected(b.profile) == [
            "resolved_sidecars: expected 10, found 9",
            "sidecars_by_source.autoeval: expected 5, found 4",
        ]


def test_width_against_profile_expected(tmp_path: Path) -> None:
    def mutate(s: Spec) -> None:
        s.expected["action_width_by_source"] = {"autoeval": 7, "roboarena": 9}

    b = build(tmp_path, mutate)
    join = kit.build_join_table(b.profile, b.data_root)
    assert len(join.problems) == 5
    assert all("contradicts source 'roboarena' width 9 (profile" in p for p in join.problems)
    assert pq.read_table(join.table_path).column("width_ok").to_pylist().count(False) == 5


def test_object_array_sidecar_is_refused_not_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    Boom.marker = str(marker)
    buf = io.BytesIO()
    np.savez(
        buf,
        metadata_json=np.array(json.dumps({"raw_width": 7})),
        raw_actions=np.array([Boom()], dtype=object),
        aligned_actions=np.zeros((5, 7)),
    )
    data = buf.getvalue()
    b = build(tmp_path / "root", lambda s: s.sidecars.__setitem__(_sc("autoeval", A[3]), data))
    join = kit.build_join_table(b.profile, b.data_root)
    assert len(join.problems) == 1, join.problems
    assert f"trajectory_{A[3]}.npz: key(s) raw_actions hold object (pickled) arrays" in join.problems[0]
    assert "not unpickled" in join.problems[0]
    assert not marker.exists()
    row = rows_by_id(join.table_path)[A[3]]
    assert row["sidecar_present"] is True and row["raw_width"] is None
    # control: the file really does run code when unpickled
    with np.load(b.data_root / "derived" / _sc("autoeval", A[3]), allow_pickle=True) as z:
        z["raw_actions"]
    assert marker.is_dir()


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


# ------------------------------------------------------------------------------------------------
# Sidecar archive safety
# ------------------------------------------------------------------------------------------------
def test_sidecar_tar_checksum_mismatch_unpacks_nothing(tmp_path: Path) -> None:
    b = build(tmp_path, unpack=False)
    tar = b.kit(TAR_REL)
    expected = (tar.parent / (tar.name + ".sha256")).read_text().split()[0]
    raw = bytearray(tar.read_bytes())
    raw[3000] ^= 0xFF  # inside the first member's data
    tar.write_bytes(bytes(raw))
    with pytest.raises(ChecksumMismatchError) as ei:
        kit.unpack_sidecars(b.profile, b.data_root)
    err = ei.value
    assert err.path == str(tar) and err.expected == expected
    assert err.actual == hashlib.sha256(bytes(raw)).hexdigest() != expected
    assert str(tar) in str(err) and err.fix and tar.name in err.fix
    assert not (b.data_root / "derived").exists()


def test_sidecar_sha_file_must_name_the_tar(tmp_path: Path) -> None:
    b = build(tmp_path, unpack=False)
    tar = b.kit(TAR_REL)
    write_sha_file(tar, "other.tar")
    with pytest.raises(KitError, match="names 'other.tar', not the archive"):
        kit.unpack_sidecars(b.profile, b.data_root)
    # a path prefix (sha256sum run from the kit root) is accepted
    write_sha_file(tar, "derived/" + tar.name)
    assert kit.unpack_sidecars(b.profile, b.data_root).files == 10


def _bad_member(kind: str) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(
        {
            "symlink": f"action_sidecars/autoeval/trajectory_{A[0]}.npz",
            "hardlink": f"action_sidecars/autoeval/trajectory_{A[0]}.npz",
            "dotdot": "action_sidecars/../../evil.npz",
            "absolute": "/tmp/evil.npz",
            "fifo": "action_sidecars/autoeval/fifo",
            "device": "action_sidecars/autoeval/dev",
            "no source": "action_sidecars/loose.npz",
            "outside": "elsewhere/trajectory_x.npz",
            "nested": "action_sidecars/autoeval/sub/trajectory_x.npz",
            "duplicate": _sc("roboarena", B[0]),
        }[kind]
    )
    if kind == "symlink":
        ti.type, ti.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "hardlink":
        ti.type, ti.linkname = tarfile.LNKTYPE, "/etc/passwd"
    elif kind == "fifo":
        ti.type = tarfile.FIFOTYPE
    elif kind == "device":
        ti.type = tarfile.CHRTYPE
    return ti


@pytest.mark.parametrize(
    "kind",
    [
        "symlink",
        "hardlink",
        "dotdot",
        "absolute",
        "fifo",
        "device",
        "no source",
        "outside",
        "nested",
        "duplicate",
    ],
)
def test_unsafe_sidecar_member_refused(tmp_path: Path, kind: str) -> None:
    b = build(tmp_path, unpack=False)
    tar = b.kit(TAR_REL)
    bad = _bad_member(kind)
    with tarfile.open(tar, "a") as tf:  # after the good members
        if bad.isreg():
            data = b"x" * 10
            bad.size = len(data)
            tf.addfile(bad, io.BytesIO(data))
        else:
            tf.addfile(bad)
    write_sha_file(tar)
    with pytest.raises(UnsafeArchiveError) as ei:
        kit.unpack_sidecars(b.profile, b.data_root)
    assert repr(bad.name) in str(ei.value)
    assert not (b.data_root / "derived").exists()


def test_refused_tar_leaves_previous_unpack_in_place(tmp_path: Path) -> None:
    b = build(tmp_path)
    before = sorted(p.name for p in (b.data_root / "derived" / "action_sidecars" / "autoeval").iterdir())
    tar = b.kit(TAR_REL)
    with tarfile.open(tar, "a") as tf:
        tf.addfile(_bad_member("symlink"))
    write_sha_file(tar)
    with pytest.raises(UnsafeArchiveError):
        kit.unpack_sidecars(b.profile, b.data_root)
    after = sorted(p.name for p in (b.data_root / "derived" / "action_sidecars" / "autoeval").iterdir())
    assert before == after and len(after) == 5
    assert sorted(p.name for p in (b.data_root / "derived").iterdir()) == [
        ".sidecars.json",
        "action_sidecars",
    ]


def test_unpack_skips_when_already_done_and_redoes_on_change(tmp_path: Path) -> None:
    b = build(tmp_path)
    again = kit.unpack_sidecars(b.profile, b.data_root)
    assert again.skipped and again.files == 10 and again.by_source == {"autoeval": 5, "roboarena": 5}
    # a file removed from the unpacked tree: unpacked again
    victim = b.data_root / "derived" / _sc("autoeval", A[0])
    victim.unlink()
    redo = kit.unpack_sidecars(b.profile, b.data_root)
    assert not redo.skipped and victim.is_file()
    # a new tar (new sha256 file): unpacked again, the old tree replaced
    tar = b.kit(TAR_REL)
    write_tar(tar, {_sc("autoeval", A[0]): b"new"})
    write_sha_file(tar)
    new = kit.unpack_sidecars(b.profile, b.data_root)
    assert not new.skipped and new.files == 1
    assert [p.name for p in (b.data_root / "derived" / "action_sidecars").iterdir()] == ["autoeval"]
    assert victim.read_bytes() == b"new"


# ------------------------------------------------------------------------------------------------
# Byte check and totals
# ------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------
# Sidecar container variants (the lean npz reader against numpy's own writer and other zips)
# ------------------------------------------------------------------------------------------------
def _rezip(
    npz: bytes, *, replace: dict[str, bytes] | None = None, comment: bytes = b"", method: int = 8
) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(npz))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=method) as dst:
        for name in src.namelist():
            dst.writestr(name, (replace or {}).get(name, src.read(name)))
        dst.comment = comment
    return out.getvalue()


def _npy_with_header(header: str, data: bytes) -> bytes:
    text = header.encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


def _stored_npz(source: str, width: int, n: int, t: int) -> bytes:
    return _rezip(sidecar_npz(source, width, n, t), method=zipfile.ZIP_STORED)


def _structured_object_npz() -> bytes:
    buf = io.BytesIO()
    arr = np.zeros(2, dtype=[("a", "f4"), ("b", "O")])
    np.savez(
        buf, metadata_json=np.array('{"raw_width": 8}'), raw_actions=arr, aligned_actions=np.zeros((4, 8))
    )
    return buf.getvalue()


VARIANTS: dict[str, tuple[Callable[[], bytes], int | None, str | None]] = {
    # name: (bytes of the B[1] sidecar (num_frames 4), expected raw_width, expected problem substring)
    "stored (np.savez)": (lambda: _stored_npz("roboarena", 8, 9, 4), 8, None),
    "zip comment (zipfile fallback)": (
        lambda: _rezip(sidecar_npz("roboarena", 8, 9, 4), comment=b"hi"),
        8,
        None,
    ),
    "reordered header keys (literal_eval)": (
        lambda: _rezip(
            sidecar_npz("roboarena", 8, 9, 4),
            replace={
                "raw_actions.npy": _npy_with_header(
                    "{'shape': (9, 8), 'fortran_order': False, 'descr': '<f4'}", bytes(9 * 8 * 4)
                )
            },
        ),
        8,
        None,
    ),
    "structured dtype with an object field": (_structured_object_npz, None, "hold object (pickled) arrays"),
    "not a zip": (lambda: b"definitely not an npz file", None, "unreadable sidecar npz"),
    "truncated": (lambda: sidecar_npz("roboarena", 8, 9, 4)[:-40], None, "unreadable sidecar npz"),
    "corrupt metadata member": (
        lambda: _rezip(sidecar_npz("roboarena", 8, 9, 4), replace={"metadata_json.npy": b"\x93NUMPY\x09"}),
        8,
        "metadata_json.npy",
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sidecar_container_variants(tmp_path: Path, variant: str) -> None:
    make, width, problem = VARIANTS[variant]
    data = make()
    b = build(tmp_path, lambda s: s.sidecars.__setitem__(_sc("roboarena", B[1]), data))
    join = kit.build_join_table(b.profile, b.data_root)
    row = rows_by_id(join.table_path)[B[1]]
    assert row["raw_width"] == width
    if problem is None:
        assert join.problems == []
        assert (row["aligned_length"], row["length_ok"], row["width_ok"]) == (4, True, True)
    else:
        assert len(join.problems) == 1, join.problems
        assert f"trajectory_{B[1]}.npz" in join.problems[0] and problem in join.problems[0]
    assert row["sidecar_sha256_ok"] is True and row["sidecar_bytes"] == len(data)


def test_link_check_never_opens_or_hashes(tmp_path: Path) -> None:
    """link_check looks at names only: garbage content in frames and sidecars changes nothing, while
    the join (which opens sidecars) and the byte check (which hashes frames) both notice."""
    b = build(tmp_path)
    (b.data_root / frames_rel(CK_A, A[0])).write_bytes(b"garbage")
    (b.data_root / "derived" / _sc("roboarena", B[0])).write_bytes(b"garbage")
    link = kit.link_check(b.profile, b.data_root)
    assert link.problems == [] and link.resolved_sidecars == 10
    assert link.fs_seconds <= link.seconds
    join = kit.build_join_table(b.profile, b.data_root)
    assert any(f"trajectory_{B[0]}.npz: unreadable sidecar npz" in p for p in join.problems)
    assert [m.split(":")[0] for m in kit.verify_subset_bytes(b.profile, b.data_root).mismatched] == [
        frames_rel(CK_A, A[0])
    ]
