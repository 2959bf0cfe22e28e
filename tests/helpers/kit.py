"""A tiny, real data root + kit, built in tmp_path, for the tests of stage2_data.kit (tests/test_kit*.py).

Everything is real: npz files written by numpy, Arrow IPC stream/file written by pyarrow, real tar
files and sha256 files. A test describes the kit as a :class:`Spec`, mutates it, and ``build``s it.
``CASES`` are the problems injected one at a time (each must be the *only* problem reported).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.profiles import profile_data
from stage2_data import kit, layout
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
        profile_data(
            "tiny",
            {"repo_id": "org/processed_datasets", "revision": "a" * 40},
            [{"path": f"{ck}.tar", "cache_key": ck} for ck in (CK_A, CK_B)],
            kit={
                "pair_manifest": PAIRS_REL,
                "subset_checksums": SUMS_REL,
                "action_manifest_dir": ACTIONS_REL,
                "sidecar_archive": TAR_REL,
                "sidecar_archive_sha256": TAR_REL + ".sha256",
            },
            expected=expected,
        )
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


def sidecar_rel(source: str, t: str) -> str:
    return layout.sidecar_relpath(source, t)


# ------------------------------------------------------------------------------------------------
# Problems, each injected alone
# ------------------------------------------------------------------------------------------------
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
    del s.sidecars[sidecar_rel("autoeval", A[1])]


def _unknown_sidecar(s: Spec) -> None:
    s.sidecars[sidecar_rel("roboarena", UNKNOWN)] = sidecar_npz("roboarena", 8, 5, 3)


def _wrong_width(s: Spec) -> None:
    s.sidecars[sidecar_rel("roboarena", B[2])] = sidecar_npz("roboarena", 9, 12, 5)


def _wrong_meta_width(s: Spec) -> None:
    s.sidecars[sidecar_rel("roboarena", B[5])] = sidecar_npz("roboarena", 8, 15, 5, meta_width=7)


def _frames_missing(s: Spec) -> None:
    s.frames_missing.add(A[2])


def _sha_differs(s: Spec) -> None:
    s.actions["autoeval"][0]["sidecar_sha256"] = "f" * 64


def _wrong_length(s: Spec) -> None:
    s.sidecars[sidecar_rel("roboarena", B[1])] = sidecar_npz("roboarena", 8, 11, 5)


def _not_in_processed(s: Spec) -> None:
    s.processed_missing.add(A[5])


def _recovered_without_path(s: Spec) -> None:
    s.actions["roboarena"][5].update(sidecar_path=None, sidecar_sha256="2" * 64)
    del s.sidecars[sidecar_rel("roboarena", B[5])]


def _unrecovered_with_path(s: Spec) -> None:
    s.actions["autoeval"][5]["sidecar_path"] = sidecar_rel("autoeval", A[5])


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


def build_case(tmp_path: Path, case: str) -> tuple[Built, list[str]]:
    """The tiny kit with the problem ``case`` injected, and the substrings its report must hold."""
    mutate, needles = CASES[case]
    return build(tmp_path, mutate), needles


def the_only_problem(problems: list[str], needles: list[str]) -> str:
    """The one problem reported, checked to hold every needle."""
    assert len(problems) == 1, problems
    for needle in needles:
        assert needle in problems[0], (needle, problems[0])
    return problems[0]
