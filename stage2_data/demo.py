"""The deterministic demo generator: a miniature of the real ``stage2_core_v1`` profile.

It writes, byte-identically on every run and every machine (same Python/zlib/pyarrow family):

- ``<root>/upstream/``: the folder the loopback hub serves as the dataset repository
  ``robometer/processed_datasets``: one uncompressed tar per cache key (RoboArena split into
  ``.tar.part-aa`` / ``.tar.part-ab``, cut inside a member's data), the quarantined LIBERO Goal
  failure tar, and files no profile names (``README.md``, ``some_other_dataset.tar``);
- ``<root>/kit/``: ``profile.toml``, the pair manifest, the subset ``SHA256SUMS``, the action
  manifests, the sidecar tar and its ``.sha256``, in the formats of shared/spec/kit-format.md.

Two modes:

- small (default): ~230 trajectories over 13 cache keys, 60 pairs over 100 unique frame files,
  two frame resolutions (32x32 and 48x64), 3..16 frames a trajectory; a few MB in all.
- full cardinality (``full_cardinality=True``): the exact totals of ``stage2_core_v1`` (13 cache
  dirs, 53,765 trajectories, 2,689 pairs over 4,323 unique frame files, 23,359 action-manifest
  rows, 20,620 sidecars: AutoEval 5,939, LIBERO success 1,709, RoboArena 12,379, RACER 593)
  with tiny payloads (1..3 frames of 4x4 or 4x6 pixels).

Cache keys. The spec names 8 real cache keys (AutoEval, RoboArena, RACER and the 5 LIBERO-256
success sets). The real profile has 13; the other 5 are INVENTED here, in the same style, for
sources without action recovery: ``jesbu1_toto_rfm_toto``, ``jesbu1_soar_rfm_soar``,
``jesbu1_utd_so100_clean_rfm_utd_so100_clean``, ``aliangdw_metaworld_rfm_metaworld_train`` and
``jesbu1_epic_rfm_epic``. Task strings, trajectory counts per cache key and the split of action
rows into recovered / not recovered are invented too (only the totals above are real facts).

Determinism: all randomness comes from ``random.Random(<str seed>)`` (sha512 seeding, stable
across Python versions) and ``hashlib.shake_128`` (pixel noise, action values). Tars are GNU
format with sorted members, fixed mtime, uid/gid 0, empty uname/gname and fixed modes. ``.npz``
files are written like ``numpy.savez_compressed`` but with a fixed zip timestamp
(1980-01-01 00:00:00) and a fixed ``create_system``. The deflate streams come from zlib; a
different zlib build (e.g. zlib-ng) could compress differently; all digests are computed from
what was written, so the demo stays self-consistent in any case.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import shutil
import struct
import sys
import tarfile
import uuid
import zipfile
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import Stage2Error
from .fsutil import atomic_write_text, publish_dir, staging_dir
from .hashing import sha256_bytes, sha256_file
from .layout import PROCESSED_DIR, SIDECARS_DIR, frames_relpath, sidecar_relpath
from .profile import (
    ArchiveSpec,
    ExpectedTotals,
    KitSpec,
    Profile,
    QuarantinedSpec,
    SourceSpec,
    dump_profile_toml,
    load_profile,
)

__all__ = [
    "DemoPaths",
    "generate_demo",
    "repin_profile",
    "write_sidecar_sha256",
    "main",
    "GENERATOR_VERSION",
    "MARKER_NAME",
    "REPO_ID",
    "CACHE_KEYS",
    "ACTION_SOURCES",
    "QUARANTINED_ARCHIVE",
    "SPLIT_CACHE_KEY",
]

GENERATOR_VERSION = 1
MARKER_NAME = ".demo-complete.json"
REPO_ID = "robometer/processed_datasets"
TAR_MTIME = 1724587200  # 2024-08-25T12:00:00Z
TAR_FORMAT = tarfile.GNU_FORMAT
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
CACHE_TIMESTAMP = "2025-08-25T12:00:00"
PROFILE_NAME_SMALL = "stage2_core_v1_demo"
PROFILE_NAME_FULL = "stage2_core_v1_fullcard"

KIT_PAIR_MANIFEST = "manifests/phase2_remediation_pairs_v1.jsonl"
KIT_SUBSET_CHECKSUMS = "manifests/stage2_subset_SHA256SUMS"
KIT_ACTION_MANIFEST_DIR = "derived/action_manifests"
KIT_SIDECAR_ARCHIVE = "derived/action_sidecars_stage2_action_sidecar_v1.tar"
KIT_SIDECAR_ARCHIVE_SHA256 = KIT_SIDECAR_ARCHIVE + ".sha256"

QUARANTINED_ARCHIVE = "ykorkmaz_libero_failure_rfm_libero_goal_failure.tar"
QUARANTINE_REASON = "known-bad LIBERO Goal failure set; excluded from the active profile"
SPLIT_CACHE_KEY = "jesbu1_roboarena_0825_rfm_roboarena"
SPLIT_PARTS = ("part-aa", "part-ab")

# Totals of the real stage2_core_v1 profile (shared/spec/kit-format.md).
FULL_TRAJECTORIES = 53765
FULL_PAIR_ROWS = 2689
FULL_UNIQUE_FRAME_FILES = 4323
FULL_ACTION_ROWS = 23359
FULL_SIDECARS = {"autoeval": 5939, "libero_success": 1709, "roboarena": 12379, "racer": 593}


@dataclass(frozen=True)
class DemoPaths:
    root: Path
    upstream: Path
    kit_root: Path
    profile: Path
    repo_id: str
    revision: str


@dataclass(frozen=True)
class ActionSourceSpec:
    name: str
    raw_width: int
    action_names: tuple[str, ...] | None
    convention: str
    rows_small: int
    recovered_small: int
    rows_full: int
    recovered_full: int
    pilot_task: str | None = None  # RACER: only this task was recovered (pilot)


@dataclass(frozen=True)
class CacheKeySpec:
    cache_key: str
    dataset_path: str
    subset: str
    data_source: str
    action_source: str | None
    prefixed: bool  # tar members under processed_datasets/<key>/ (True) or <key>/ (False)
    res_small: tuple[int, int]
    res_full: tuple[int, int]
    n_small: int
    n_full: int
    tasks: tuple[str, ...]
    is_robot: bool = True
    shards: int = 1


RACER_PILOT_TASK = "insert_onto_square_peg"

# fmt: off
ACTION_SOURCES: dict[str, ActionSourceSpec] = {
    "autoeval": ActionSourceSpec(
        "autoeval", 7, None,
        "autoeval_widowx_eef_delta_7d: upstream order, dimensions unnamed; do not reinterpret",
        20, 17, 6512, 5939,
    ),
    "libero_success": ActionSourceSpec(
        "libero_success", 7, None,
        "libero_osc_pose_delta_7d: upstream OSC_POSE order (6 deltas + gripper), unnamed",
        40, 34, 1762, 1709,
    ),
    "roboarena": ActionSourceSpec(
        "roboarena", 8, None,
        "droid_joint_position_7_plus_gripper_8d: upstream order, refined alignment, unnamed",
        26, 21, 14187, 12379,
    ),
    "racer": ActionSourceSpec(
        "racer", 9, ("x", "y", "z", "qx", "qy", "qz", "qw", "gripper_open", "ignore_collision"),
        "racer_keyframe_pose_9d", 12, 6, 898, 593, pilot_task=RACER_PILOT_TASK,
    ),
}
# fmt: on

_LIBERO_TASKS = (
    "put the bowl on the plate",
    "open the top drawer of the cabinet",
    "put the black bowl on top of the cabinet",
    "turn on the stove",
    "pick up the alphabet soup and place it in the basket",
    "put both moka pots on the stove",
)
_BIG = (48, 64)
_SMALL = (32, 32)
_FULL_A = (4, 4)
_FULL_B = (4, 6)

# Columns: cache_key, dataset_path, subset, data_source, action source, prefixed layout,
# resolution (small), resolution (full), trajectories (small), trajectories (full), tasks.
# fmt: off
CACHE_KEYS: tuple[CacheKeySpec, ...] = (
    CacheKeySpec("jesbu1_auto_eval_rfm_auto_eval_rfm", "jesbu1/auto_eval_rfm", "auto_eval_rfm", "auto_eval",
                 "autoeval", False, _BIG, _FULL_B, 24, 7200,
                 ("open the drawer", "close the drawer", "put the eggplant in the sink", "flip the pot upright")),
    CacheKeySpec("jesbu1_roboarena_0825_rfm_roboarena", "jesbu1/roboarena_0825_rfm", "roboarena", "roboarena",
                 "roboarena", True, _BIG, _FULL_B, 30, 18000,
                 ("put the marker in the cup", "wipe the table with the towel", "stack the blocks",
                  "move the banana to the plate", "close the laptop"), shards=2),
    CacheKeySpec("jesbu1_racer_rfm_racer_train", "jesbu1/racer_rfm", "racer_train", "racer",
                 "racer", True, _SMALL, _FULL_A, 18, 2400,
                 (RACER_PILOT_TASK, "put_item_in_drawer", "stack_blocks", "close_jar")),
    CacheKeySpec("abraranwar_libero_rfm_libero256_90", "abraranwar/libero_rfm", "libero256_90", "libero_90",
                 "libero_success", True, _SMALL, _FULL_A, 20, 4000, _LIBERO_TASKS),
    CacheKeySpec("abraranwar_libero_rfm_libero256_10", "abraranwar/libero_rfm", "libero256_10", "libero_10",
                 "libero_success", False, _SMALL, _FULL_A, 12, 400, _LIBERO_TASKS[:4]),
    CacheKeySpec("abraranwar_libero_rfm_libero256_goal", "abraranwar/libero_rfm", "libero256_goal", "libero_goal",
                 "libero_success", True, _SMALL, _FULL_A, 14, 430, _LIBERO_TASKS[1:5]),
    CacheKeySpec("abraranwar_libero_rfm_libero256_object", "abraranwar/libero_rfm", "libero256_object",
                 "libero_object", "libero_success", False, _SMALL, _FULL_A, 14, 450, _LIBERO_TASKS[2:6]),
    CacheKeySpec("abraranwar_libero_rfm_libero256_spatial", "abraranwar/libero_rfm", "libero256_spatial",
                 "libero_spatial", "libero_success", True, _SMALL, _FULL_A, 14, 440, _LIBERO_TASKS[:3]),
    # ---- invented (the spec names only the 8 keys above) ----
    CacheKeySpec("jesbu1_toto_rfm_toto", "jesbu1/toto_rfm", "toto", "toto", None, False, _BIG, _FULL_B, 16, 2900,
                 ("pour the cup", "scoop the beans")),
    CacheKeySpec("jesbu1_soar_rfm_soar", "jesbu1/soar_rfm", "soar", "soar", None, True, _BIG, _FULL_B, 22, 8000,
                 ("put the spoon in the pot", "move the cloth to the left", "open the microwave")),
    CacheKeySpec("jesbu1_utd_so100_clean_rfm_utd_so100_clean", "jesbu1/utd_so100_clean_rfm", "utd_so100_clean",
                 "utd_so100_clean", None, False, _BIG, _FULL_B, 14, 1100,
                 ("pick up the red cube", "push the cube to the goal")),
    CacheKeySpec("aliangdw_metaworld_rfm_metaworld_train", "aliangdw/metaworld_rfm", "metaworld_train",
                 "metaworld", None, True, _SMALL, _FULL_A, 20, 2200,
                 ("button-press-v2", "drawer-open-v2", "door-open-v2", "reach-v2")),
    CacheKeySpec("jesbu1_epic_rfm_epic", "jesbu1/epic_rfm", "epic", "epic", None, False, _BIG, _FULL_B, 16, 6245,
                 ("cut the onion", "wash the plate", "open the fridge"), is_robot=False),
)

_QUARANTINED_SPEC = CacheKeySpec(
    "ykorkmaz_libero_failure_rfm_libero_goal_failure", "ykorkmaz/libero_failure_rfm", "libero_goal_failure",
    "libero_goal_failure", None, True, _SMALL, _FULL_A, 6, 6, _LIBERO_TASKS[1:5],
)
_OTHER_SPEC = CacheKeySpec(
    "some_other_dataset", "someone/other_dataset", "other", "other", None, False, _SMALL, _FULL_A, 3, 3,
    ("do something else",),
)
# fmt: on

_STATUS_NO_ACTIONS = "source_has_no_actions"
_STATUS_NO_CONSENSUS = "rejected_refinement_no_consensus"
_STATUS_RECOVERED = "recovered"

_HF_FEATURES: dict[str, Any] = {
    "id": {"dtype": "string", "_type": "Value"},
    "task": {"dtype": "string", "_type": "Value"},
    "data_source": {"dtype": "string", "_type": "Value"},
    "frames": {"dtype": "string", "_type": "Value"},
    "is_robot": {"dtype": "bool", "_type": "Value"},
    "quality_label": {"dtype": "string", "_type": "Value"},
    "partial_success": {"dtype": "float32", "_type": "Value"},
    "num_frames": {"dtype": "int64", "_type": "Value"},
}
ARROW_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("task", pa.string()),
        pa.field("data_source", pa.string()),
        pa.field("frames", pa.string()),
        pa.field("is_robot", pa.bool_()),
        pa.field("quality_label", pa.string()),
        pa.field("partial_success", pa.float32()),
        pa.field("num_frames", pa.int64()),
    ],
    metadata={"huggingface": json.dumps({"info": {"features": _HF_FEATURES}}, sort_keys=True)},
)
ARROW_BATCH_ROWS = 1000


# ================================================================================================
# The plan: every trajectory, pair and action row, decided before anything is written.
# ================================================================================================
@dataclass
class _Traj:
    id: str
    cache_key: str
    task: str
    quality: str
    partial: float | None
    num_frames: int
    is_robot: bool


@dataclass
class _ActionRow:
    traj: _Traj
    source: str
    status: str


@dataclass
class _Pair:
    split: str
    task: str
    chosen: _Traj
    rejected: _Traj


@dataclass
class _Plan:
    full: bool
    trajs: dict[str, list[_Traj]]  # cache_key -> trajectories (dataset row order)
    pairs: list[_Pair]
    action_rows: dict[str, list[_ActionRow]]  # source -> rows (file order)
    extra_trajs: dict[str, list[_Traj]] = field(default_factory=dict)  # quarantined + other


def _uuid4(rng: random.Random) -> str:
    return str(uuid.UUID(bytes=rng.randbytes(16), version=4))


def _largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    wsum = sum(weights)
    raw = [total * w / wsum for w in weights]
    out = [int(r) for r in raw]
    order = sorted(range(len(weights)), key=lambda i: (-(raw[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def _component_shape(full: bool) -> tuple[int, int]:
    """(components of 2 pairs over 3 trajectories, components of 1 pair over 2 trajectories).

    Every component is a path (a tree), so unique trajectories = pairs + components.
    """
    if full:
        comps = FULL_UNIQUE_FRAME_FILES - FULL_PAIR_ROWS  # 1634
        two = FULL_PAIR_ROWS - comps  # 1055
        return two, comps - two  # (1055, 579): 2*1055 + 579 = 2689 pairs, 3*1055 + 2*579 = 4323 files
    return 20, 20  # 60 pairs over 100 unique trajectories


def _plan(full: bool) -> _Plan:
    mode = "full" if full else "small"
    grng = random.Random(f"stage2-demo/{mode}/global")
    two, one = _component_shape(full)
    sizes = [3] * two + [2] * one
    grng.shuffle(sizes)
    n_comp = len(sizes)
    split_counts = _largest_remainder(n_comp, [8, 1, 1])
    splits = ["train"] * split_counts[0] + ["val"] * split_counts[1] + ["test"] * split_counts[2]
    grng.shuffle(splits)
    counts = [(s.n_full if full else s.n_small) for s in CACHE_KEYS]
    comps_per_key = _largest_remainder(n_comp, counts)

    trajs: dict[str, list[_Traj]] = {}
    members_by_key: dict[str, list[_Traj]] = {}
    pairs: list[_Pair] = []
    ci = 0
    for spec, n, k in zip(CACHE_KEYS, counts, comps_per_key, strict=True):
        rng = random.Random(f"stage2-demo/{mode}/{spec.cache_key}")
        ids = [_uuid4(rng) for _ in range(n)]
        key_trajs: list[_Traj] = []
        pos = 0
        members: list[_Traj] = []
        for _ in range(k):
            size, split = sizes[ci], splits[ci]
            ci += 1
            task = rng.choice(spec.tasks)
            labels = (
                ["successful", "suboptimal", "failure"]
                if size == 3
                else ["successful", rng.choice(["suboptimal", "failure"])]
            )
            comp = [_new_traj(rng, full, spec, ids[pos + j], task, labels[j]) for j in range(size)]
            pos += size
            if size == 2:
                pairs.append(_Pair(split, task, comp[0], comp[1]))
            elif rng.random() < 0.5:
                pairs += [_Pair(split, task, comp[0], comp[1]), _Pair(split, task, comp[0], comp[2])]
            else:
                pairs += [_Pair(split, task, comp[0], comp[1]), _Pair(split, task, comp[1], comp[2])]
            members += comp
        if pos > n:
            raise RuntimeError(f"demo plan: {spec.cache_key} has {n} trajectories but pairs need {pos}")
        key_trajs += members
        for j, tid in enumerate(ids[pos:]):
            if spec.action_source == "racer":
                task = RACER_PILOT_TASK if j % 5 < 3 else rng.choice(spec.tasks[1:])
            else:
                task = rng.choice(spec.tasks)
            if spec.action_source == "libero_success":
                quality = "successful"
            else:
                quality = rng.choices(["successful", "suboptimal", "failure"], [6, 3, 2])[0]
            key_trajs.append(_new_traj(rng, full, spec, tid, task, quality))
        rng.shuffle(key_trajs)  # dataset row order says nothing (join by id, never by row)
        trajs[spec.cache_key] = key_trajs
        members_by_key[spec.cache_key] = members

    grng.shuffle(pairs)
    action_rows = _plan_actions(mode, full, trajs, members_by_key)

    extra: dict[str, list[_Traj]] = {}
    for spec in (_QUARANTINED_SPEC, _OTHER_SPEC):
        rng = random.Random(f"stage2-demo/{mode}/{spec.cache_key}")
        quality = "failure" if spec is _QUARANTINED_SPEC else "successful"
        extra[spec.cache_key] = [
            _new_traj(rng, full, spec, _uuid4(rng), rng.choice(spec.tasks), quality)
            for _ in range(spec.n_small)
        ]
    return _Plan(full, trajs, pairs, action_rows, extra)


def _new_traj(rng: random.Random, full: bool, spec: CacheKeySpec, tid: str, task: str, quality: str) -> _Traj:
    num_frames = rng.randint(1, 3) if full else rng.randint(3, 16)
    partial: float | None
    if rng.random() < 0.15:
        partial = None
    elif quality == "successful":
        partial = 1.0
    elif quality == "failure":
        partial = 0.0
    else:
        partial = rng.randint(1, 9) / 10.0
    return _Traj(tid, spec.cache_key, task, quality, partial, num_frames, spec.is_robot)


def _plan_actions(
    mode: str, full: bool, trajs: dict[str, list[_Traj]], members_by_key: dict[str, list[_Traj]]
) -> dict[str, list[_ActionRow]]:
    out: dict[str, list[_ActionRow]] = {}
    for src in ACTION_SOURCES.values():
        rng = random.Random(f"stage2-demo/{mode}/actions/{src.name}")
        keys = [s.cache_key for s in CACHE_KEYS if s.action_source == src.name]
        members = [t for k in keys for t in members_by_key[k]]
        member_ids = {t.id for t in members}
        others = [t for k in keys for t in trajs[k] if t.id not in member_ids]
        rng.shuffle(members)
        rng.shuffle(others)
        # Roughly a third of the action rows go to trajectories that are in no pair.
        n_rows = src.rows_full if full else src.rows_small
        n_rec = src.recovered_full if full else src.recovered_small
        pref = members[: max(0, n_rows - n_rows // 3)]
        pref += others + members[len(pref) :]
        if len(pref) < n_rows:
            raise RuntimeError(f"demo plan: source {src.name} has {len(pref)} trajectories, needs {n_rows}")
        eligible = [t for t in pref if src.pilot_task is None or t.task == src.pilot_task]
        if len(eligible) < n_rec:
            raise RuntimeError(f"demo plan: source {src.name} has {len(eligible)} eligible, needs {n_rec}")
        recovered = eligible[:n_rec]
        rec_ids = {t.id for t in recovered}
        rest = [t for t in pref if t.id not in rec_ids][: n_rows - n_rec]
        rows = [_ActionRow(t, src.name, _STATUS_RECOVERED) for t in recovered]
        for i, t in enumerate(rest):
            # both statuses always occur in every source; the RoboArena refinement rejects most
            if i == 0:
                status = _STATUS_NO_ACTIONS
            elif i == 1:
                status = _STATUS_NO_CONSENSUS
            else:
                p = 0.8 if src.name == "roboarena" else 0.25
                status = _STATUS_NO_CONSENSUS if rng.random() < p else _STATUS_NO_ACTIONS
            rows.append(_ActionRow(t, src.name, status))
        rows.sort(key=lambda r: (r.traj.cache_key, r.traj.id))
        out[src.name] = rows
    return out


# ================================================================================================
# Deterministic bytes: npz, tar, arrow
# ================================================================================================
_NPY_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}
_ZIP_DOSDATE = (ZIP_DATE_TIME[0] - 1980) << 9 | ZIP_DATE_TIME[1] << 5 | ZIP_DATE_TIME[2]
_ZIP_DOSTIME = ZIP_DATE_TIME[3] << 11 | ZIP_DATE_TIME[4] << 5 | ZIP_DATE_TIME[5] // 2
_ZIP_VERSION = 20  # deflate, no zip64
_ZIP_EXTERNAL_ATTR = 0o600 << 16
_ZIP_CREATE_SYSTEM = 3  # unix


def npy_bytes(arr: np.ndarray) -> bytes:
    """``numpy.lib.format.write_array`` output for a C-contiguous, non-object array (header cached)."""
    a = np.asarray(arr)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    if a.dtype.hasobject:
        raise TypeError("npy_bytes: object arrays are never written (they would need pickle)")
    key = (a.dtype.str, a.shape)
    header = _NPY_HEADERS.get(key)
    if header is None:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, a, allow_pickle=False)
        full = buf.getvalue()
        header = full[: len(full) - a.nbytes]
        _NPY_HEADERS[key] = header
    return header + a.tobytes()


def npz_bytes(arrays: Iterable[tuple[str, np.ndarray]]) -> bytes:
    """An ``.npz`` as ``numpy.savez_compressed`` writes it (one deflated ``<key>.npy`` entry per array),
    but with a fixed zip timestamp (1980-01-01 00:00:00) and without zip64 extra fields.

    The bytes equal what ``zipfile`` writes for ``ZipInfo(date_time=ZIP_DATE_TIME)``,
    ``create_system=3``, ``external_attr=0o600 << 16``, ``ZIP_DEFLATED`` (see tests/test_demo.py);
    writing the records directly is ~5x faster, which the full-cardinality mode needs."""
    out = bytearray()
    central = bytearray()
    count = 0
    for key, arr in arrays:
        name = (key + ".npy").encode("ascii")
        data = npy_bytes(arr)
        crc = zlib.crc32(data)
        # A window just larger than the data (+ zlib's 262-byte lookahead) gives the same deflate
        # stream as the default 32 KiB window, with a much cheaper setup for tiny arrays.
        bits = max(9, min(15, (len(data) + 262).bit_length()))
        comp = zlib.compress(data, zlib.Z_DEFAULT_COMPRESSION, -bits)
        offset = len(out)
        out += struct.pack(
            "<4s2B4HL2L2H", b"PK\x03\x04", _ZIP_VERSION, 0, 0, zipfile.ZIP_DEFLATED,
            _ZIP_DOSTIME, _ZIP_DOSDATE, crc, len(comp), len(data), len(name), 0,
        )  # fmt: skip
        out += name
        out += comp
        central += struct.pack(
            "<4s4B4HL2L5H2L", b"PK\x01\x02", _ZIP_VERSION, _ZIP_CREATE_SYSTEM, _ZIP_VERSION, 0, 0,
            zipfile.ZIP_DEFLATED, _ZIP_DOSTIME, _ZIP_DOSDATE, crc, len(comp), len(data), len(name),
            0, 0, 0, 0, _ZIP_EXTERNAL_ATTR, offset,
        )  # fmt: skip
        central += name
        count += 1
    cd_offset = len(out)
    out += central
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(central), cd_offset, 0)
    if len(out) >= 0xFFFFFFFF:
        raise ValueError("npz_bytes: archive too large for a non-zip64 npz")
    return bytes(out)


def _tarinfo(name: str, size: int | None) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mtime = TAR_MTIME
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    if size is None:
        ti.type = tarfile.DIRTYPE
        ti.mode = 0o755
        ti.size = 0
    else:
        ti.type = tarfile.REGTYPE
        ti.mode = 0o644
        ti.size = size
    return ti


Producer = Callable[[], bytes] | None  # None: a directory member


def write_tar(path: Path, entries: Iterable[tuple[str, Producer]]) -> None:
    """Write a deterministic tar: members sorted by name, produced lazily (memory bounded)."""
    ordered = sorted(entries, key=lambda e: e[0])
    with tarfile.open(path, mode="w", format=TAR_FORMAT, encoding="utf-8") as tf:
        for name, producer in ordered:
            if producer is None:
                tf.addfile(_tarinfo(name + "/", None))
            else:
                data = producer()
                tf.addfile(_tarinfo(name, len(data)), io.BytesIO(data))


def _dir_entries(path: str) -> list[tuple[str, Producer]]:
    parts = path.split("/")
    return [("/".join(parts[: i + 1]), None) for i in range(len(parts))]


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _const(data: bytes) -> Callable[[], bytes]:
    return lambda: data


# ---- frames ------------------------------------------------------------------------------------
def _frames_array(tid: str, t: int, h: int, w: int) -> np.ndarray:
    seed = hashlib.sha256(tid.encode()).digest()
    y = np.arange(h, dtype=np.int32)[:, None, None]
    x = np.arange(w, dtype=np.int32)[None, :, None]
    c = np.arange(3, dtype=np.int32)[None, None, :]
    base = (x * (160 // max(w, 1)) + y * (120 // max(h, 1)) + c * 60 + seed[0]).astype(np.int32)
    shift = (np.arange(t, dtype=np.int32) * (seed[1] % 7 + 1))[:, None, None, None]
    noise_u8 = np.frombuffer(hashlib.shake_128(seed).digest(t * h * w * 3), dtype=np.uint8)
    noise = (noise_u8 & 3).astype(np.int32).reshape(t, h, w, 3)
    return ((base[None] + shift + noise) % 256).astype(np.uint8)


def frame_npz_bytes(tid: str, t: int, h: int, w: int) -> bytes:
    frames = _frames_array(tid, t, h, w)
    return npz_bytes(
        [
            ("frames", frames),
            ("shape", np.asarray(frames.shape, dtype=np.int64)),
            ("num_frames", np.asarray(t, dtype=np.int64)),
        ]
    )


# ---- sidecars ----------------------------------------------------------------------------------
def sidecar_npz_bytes(row: _ActionRow, full: bool) -> bytes:
    src = ACTION_SOURCES[row.source]
    t = row.traj.num_frames
    seed = hashlib.sha256(f"sidecar/{row.traj.id}".encode()).digest()
    extra = seed[0] % (2 if full else t + 4)
    n = t + extra
    w = src.raw_width
    raw_u8 = np.frombuffer(hashlib.shake_128(seed).digest(n * w), dtype=np.uint8).reshape(n, w)
    raw = ((raw_u8.astype(np.float32) - 127.5) / 255.0).astype(np.float32)
    if src.name == "racer":
        q = raw[:, 3:7] + np.float32(0.01)
        raw[:, 3:7] = q / np.linalg.norm(q, axis=1, keepdims=True)
        raw[:, 7] = (raw_u8[:, 7] > 127).astype(np.float32)
        raw[:, 8] = (raw_u8[:, 8] > 200).astype(np.float32)
    else:
        raw[:, -1] = (raw_u8[:, -1] > 127).astype(np.float32)
    start = int.from_bytes(seed[2:4], "big") % 500
    source_indices = np.arange(start, start + n, dtype=np.int64)
    alignment = np.round(np.linspace(0, n - 1, t)).astype(np.int64) if t > 1 else np.zeros(1, np.int64)
    aligned = raw[alignment].astype(np.float32)
    meta = {
        "source": src.name,
        "cache_key": row.traj.cache_key,
        "stage2_trajectory_id": row.traj.id,
        "action_names": list(src.action_names) if src.action_names else None,
        "action_convention": src.convention,
        "raw_width": w,
        "num_raw_steps": n,
        "num_aligned_frames": t,
        "alignment": {
            "method": "nearest_timestamp",
            "notes": "aligned_actions[i] = raw_actions[alignment_indices[i]]; one row per kept frame; "
            "source_indices are the step indices in the upstream episode",
        },
        "generator": f"stage2_data.demo v{GENERATOR_VERSION}",
    }
    return npz_bytes(
        [
            ("metadata_json", np.array(json.dumps(meta, sort_keys=True))),
            ("raw_actions", raw),
            ("aligned_actions", aligned),
            ("source_indices", source_indices),
            ("alignment_indices", alignment),
        ]
    )


# ---- one cache directory -----------------------------------------------------------------------
def _arrow_bytes(spec: CacheKeySpec, rows: Sequence[_Traj]) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, ARROW_SCHEMA) as writer:
        for i in range(0, len(rows), ARROW_BATCH_ROWS):
            chunk = rows[i : i + ARROW_BATCH_ROWS]
            batch = pa.record_batch(
                [
                    pa.array([t.id for t in chunk], pa.string()),
                    pa.array([t.task for t in chunk], pa.string()),
                    pa.array([spec.data_source] * len(chunk), pa.string()),
                    pa.array([frames_relpath(spec.cache_key, t.id) for t in chunk], pa.string()),
                    pa.array([t.is_robot for t in chunk], pa.bool_()),
                    pa.array([t.quality for t in chunk], pa.string()),
                    pa.array([t.partial for t in chunk], pa.float32()),
                    pa.array([t.num_frames for t in chunk], pa.int64()),
                ],
                schema=ARROW_SCHEMA,
            )
            writer.write_batch(batch)
    return sink.getvalue()


def _cache_dir_entries(
    spec: CacheKeySpec, rows: Sequence[_Traj], full: bool, frame_digests: dict[str, str]
) -> list[tuple[str, Producer]]:
    """Every member of one cache directory's tar; frame digests are recorded as they are produced."""
    top = f"{PROCESSED_DIR}/{spec.cache_key}" if spec.prefixed else spec.cache_key
    h, w = spec.res_full if full else spec.res_small
    entries: list[tuple[str, Producer]] = _dir_entries(top)
    entries += [(f"{top}/frames", None), (f"{top}/processed_dataset", None)]
    info = {
        "dataset_path": spec.dataset_path,
        "subset": spec.subset,
        "total_trajectories": len(rows),
        "cache_timestamp": CACHE_TIMESTAMP,
        "config_hash": hashlib.sha256(f"{spec.dataset_path}/{spec.subset}".encode()).hexdigest()[:16],
    }
    entries.append((f"{top}/dataset_info.json", _const(_json_bytes(info))))
    by_quality: dict[str, list[int]] = defaultdict(list)
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(rows):
        by_quality[t.quality].append(i)
        by_task[t.task].append(i)
    mappings = {
        "robot_trajectories": [i for i, t in enumerate(rows) if t.is_robot],
        "human_trajectories": [i for i, t in enumerate(rows) if not t.is_robot],
        "quality_indices": {k: v for k, v in sorted(by_quality.items())},
        "task_indices": {k: v for k, v in sorted(by_task.items())},
        "source_indices": {spec.data_source: list(range(len(rows)))},
    }
    entries.append((f"{top}/index_mappings.json", _const(_json_bytes(mappings))))
    shards = max(1, min(spec.shards, len(rows)))
    bounds = [len(rows) * s // shards for s in range(shards + 1)]
    files: list[dict[str, str]] = []

    def arrow_producer(part: Sequence[_Traj]) -> Callable[[], bytes]:
        return lambda: _arrow_bytes(spec, part)

    for s in range(shards):
        fname = f"data-{s:05d}-of-{shards:05d}.arrow"
        files.append({"filename": fname})
        entries.append((f"{top}/processed_dataset/{fname}", arrow_producer(rows[bounds[s] : bounds[s + 1]])))
    hf_info = {"citation": "", "description": "", "features": _HF_FEATURES, "homepage": "", "license": ""}
    entries.append((f"{top}/processed_dataset/dataset_info.json", _const(_json_bytes(hf_info))))
    state: dict[str, Any] = {
        "_data_files": files,
        "_fingerprint": hashlib.sha256(("|".join(t.id for t in rows)).encode()).hexdigest()[:16],
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    entries.append((f"{top}/processed_dataset/state.json", _const(_json_bytes(state))))

    def frame_producer(t: _Traj) -> Callable[[], bytes]:
        def produce() -> bytes:
            data = frame_npz_bytes(t.id, t.num_frames, h, w)
            frame_digests[frames_relpath(spec.cache_key, t.id)] = sha256_bytes(data)
            return data

        return produce

    for t in rows:
        entries.append((f"{top}/frames/trajectory_{t.id}.npz", frame_producer(t)))
    return entries


def _split_tar(whole: Path, out_dir: Path, base: str) -> list[Path]:
    """Cut one tar stream in two, inside the data of the member that spans the middle."""
    total = whole.stat().st_size
    cut = None
    with tarfile.open(whole, mode="r:") as tf:
        best: tuple[int, int] | None = None
        for m in tf:
            if m.isfile() and m.size >= 4:
                mid = m.offset_data + m.size // 2
                d = abs(mid - total // 2)
                if best is None or d < best[0]:
                    best = (d, mid)
        if best is not None:
            cut = best[1]
    if cut is None:
        raise RuntimeError(f"demo: cannot split {whole}: no file member")
    if cut % 512 == 0:
        cut += 1
    paths = [out_dir / f"{base}.{SPLIT_PARTS[0]}", out_dir / f"{base}.{SPLIT_PARTS[1]}"]
    with open(whole, "rb") as src:
        for path, n in ((paths[0], cut), (paths[1], total - cut)):
            with open(path, "wb") as dst:
                left = n
                while left:
                    chunk = src.read(min(left, 8 << 20))
                    if not chunk:
                        raise RuntimeError(f"demo: {whole} shrank while splitting")
                    dst.write(chunk)
                    left -= len(chunk)
    whole.unlink()
    return paths


def _run_job(job: tuple[Callable[..., dict[str, str]], tuple[Any, ...]]) -> dict[str, str]:
    fn, args = job
    return fn(*args)


def _build_cache_tar(spec: CacheKeySpec, rows: list[_Traj], full: bool, path: str) -> dict[str, str]:
    """Write one cache directory's tar (split in parts for the RoboArena key); returns frame digests."""
    digests: dict[str, str] = {}
    out = Path(path)
    entries = _cache_dir_entries(spec, rows, full, digests)
    if spec.cache_key == SPLIT_CACHE_KEY:
        whole = out.with_name(f".{out.name}.whole")
        write_tar(whole, entries)
        _split_tar(whole, out.parent, out.name)
    else:
        write_tar(out, entries)
    return digests


def _build_sidecar_tar(action_rows: dict[str, list[_ActionRow]], full: bool, path: str) -> dict[str, str]:
    """Write the kit's sidecar tar; returns {sidecar_path: sha256}."""
    digests: dict[str, str] = {}
    entries: list[tuple[str, Producer]] = [(SIDECARS_DIR, None)]

    def producer(r: _ActionRow, rel: str) -> Callable[[], bytes]:
        def produce() -> bytes:
            data = sidecar_npz_bytes(r, full)
            digests[rel] = sha256_bytes(data)
            return data

        return produce

    for src, rows in action_rows.items():
        entries.append((f"{SIDECARS_DIR}/{src}", None))
        for r in rows:
            if r.status == _STATUS_RECOVERED:
                rel = sidecar_relpath(src, r.traj.id)
                entries.append((rel, producer(r, rel)))
    write_tar(Path(path), entries)
    return digests


# ================================================================================================
# Generation
# ================================================================================================
def _mode(full: bool) -> str:
    return "full_cardinality" if full else "small"


def _paths(root: Path, revision: str) -> DemoPaths:
    return DemoPaths(
        root=root,
        upstream=root / "upstream",
        kit_root=root / "kit",
        profile=root / "kit" / "profile.toml",
        repo_id=REPO_ID,
        revision=revision,
    )


def _read_marker(root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((root / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _complete(root: Path, full: bool) -> str | None:
    """The revision of a complete demo of this mode and generator version at ``root``, else None."""
    marker = _read_marker(root)
    if (
        marker is not None
        and marker.get("mode") == _mode(full)
        and marker.get("generator_version") == GENERATOR_VERSION
        and isinstance(marker.get("revision"), str)
    ):
        return str(marker["revision"])
    return None


def generate_demo(out: Path, *, full_cardinality: bool = False) -> DemoPaths:
    """Generate the demo into ``out`` and return its paths.

    Idempotent: if ``out`` already holds a complete demo of the same mode (its marker file is
    written last), it is returned as is. Otherwise the demo is written into a temporary sibling
    folder and moved into place; an existing demo of another mode or generator version is
    replaced, any other non-empty folder is refused.
    """
    root = Path(out).resolve()
    revision = _complete(root, full_cardinality)
    if revision is not None:
        return _paths(root, revision)
    if root.exists() and (not root.is_dir() or (_read_marker(root) is None and any(root.iterdir()))):
        raise Stage2Error(
            f"demo output {root} exists and is not a demo folder (no {MARKER_NAME}); refusing to replace it.",
            fix="pass an empty or new folder, or delete that one",
        )
    with staging_dir(root) as tmp:
        revision = _generate_into(tmp, full_cardinality)
        tmp.chmod(0o755)  # mkdtemp made it 0700
        if _complete(root, full_cardinality) == revision:  # another process finished the same demo first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            publish_dir(tmp, root)
    return _paths(root, revision)


def _generate_into(root: Path, full: bool) -> str:
    plan = _plan(full)
    upstream = root / "upstream"
    kit = root / "kit"
    upstream.mkdir(parents=True)
    (kit / "manifests").mkdir(parents=True)
    (kit / KIT_ACTION_MANIFEST_DIR).mkdir(parents=True)

    # ---- archives: independent jobs, each returns the digests of what it wrote ----
    jobs: list[tuple[Callable[..., dict[str, str]], tuple[Any, ...]]] = [
        (_build_sidecar_tar, (plan.action_rows, full, str(kit / KIT_SIDECAR_ARCHIVE)))
    ]
    archive_files: list[tuple[str, str]] = []  # (upstream path, cache_key)
    for spec in sorted(CACHE_KEYS, key=lambda s: -len(plan.trajs[s.cache_key])):
        name = f"{spec.cache_key}.tar"
        if spec.cache_key == SPLIT_CACHE_KEY:
            archive_files += [(f"{name}.{suffix}", spec.cache_key) for suffix in SPLIT_PARTS]
        else:
            archive_files.append((name, spec.cache_key))
        jobs.append((_build_cache_tar, (spec, plan.trajs[spec.cache_key], full, str(upstream / name))))
    for spec, name in ((_QUARANTINED_SPEC, QUARANTINED_ARCHIVE), (_OTHER_SPEC, "some_other_dataset.tar")):
        jobs.append((_build_cache_tar, (spec, plan.extra_trajs[spec.cache_key], full, str(upstream / name))))
    # Serial on purpose: ~20 s of CPU in full-cardinality mode. A process pool would halve the wall
    # time but "spawn" re-imports the caller's __main__ (breaks unguarded scripts and stdin) and
    # "fork" is unsafe once pyarrow holds native threads.
    digests: dict[str, str] = {}
    for job in jobs:
        digests.update(_run_job(job))
    write_sidecar_sha256(kit, KIT_SIDECAR_ARCHIVE)
    (upstream / "README.md").write_text(
        "# processed_datasets (demo)\n\nDeterministic miniature of robometer/processed_datasets generated by "
        f"stage2_data.demo v{GENERATOR_VERSION}. One uncompressed tar per cache directory.\n",
        encoding="utf-8",
    )

    # ---- kit: pairs and subset checksums ----
    lines = []
    used: set[str] = set()
    for i, p in enumerate(plan.pairs, start=1):
        cpath = frames_relpath(p.chosen.cache_key, p.chosen.id)
        rpath = frames_relpath(p.rejected.cache_key, p.rejected.id)
        used.update((cpath, rpath))
        row = {
            "pair_id": f"p{i:06d}",
            "split": p.split,
            "task": p.task,
            "chosen_trajectory_id": p.chosen.id,
            "chosen_frames_path": cpath,
            "rejected_trajectory_id": p.rejected.id,
            "rejected_frames_path": rpath,
        }
        lines.append(json.dumps(row) + "\n")
    (kit / KIT_PAIR_MANIFEST).write_text("".join(lines), encoding="utf-8")
    sums = "".join(f"{digests[p]}  {p}\n" for p in sorted(used))
    (kit / KIT_SUBSET_CHECKSUMS).write_text(sums, encoding="utf-8")

    # ---- kit: action manifests ----
    sidecars_by_source: dict[str, int] = {}
    for src, rows_ in plan.action_rows.items():
        sidecars_by_source[src] = sum(1 for r in rows_ if r.status == _STATUS_RECOVERED)
        out_lines = []
        for r in rows_:
            rel = sidecar_relpath(src, r.traj.id) if r.status == _STATUS_RECOVERED else None
            out_lines.append(
                json.dumps(
                    {
                        "stage2_trajectory_id": r.traj.id,
                        "source": src,
                        "cache_key": r.traj.cache_key,
                        "status": r.status,
                        "sidecar_path": rel,
                        "sidecar_sha256": digests[rel] if rel else None,
                    }
                )
                + "\n"
            )
        (kit / KIT_ACTION_MANIFEST_DIR / f"{src}.jsonl").write_text("".join(out_lines), encoding="utf-8")

    # ---- the profile ----
    upstream_digests = {p.name: sha256_file(p) for p in sorted(upstream.iterdir()) if p.is_file()}
    revision = hashlib.sha1(
        "".join(f"{name}\0{digest}\n" for name, digest in sorted(upstream_digests.items())).encode()
    ).hexdigest()
    archives = [
        ArchiveSpec(
            path=name, cache_key=key, size=(upstream / name).stat().st_size, sha256=upstream_digests[name]
        )
        for name, key in sorted(archive_files)
    ]
    expected = ExpectedTotals(
        cache_dirs=len(CACHE_KEYS),
        archives=len(archives),
        trajectories=sum(len(v) for v in plan.trajs.values()),
        pair_rows=len(plan.pairs),
        unique_frame_files=len(used),
        action_manifest_rows=sum(len(v) for v in plan.action_rows.values()),
        resolved_sidecars=sum(sidecars_by_source.values()),
        sidecars_by_source=sidecars_by_source,
        action_width_by_source={s.name: s.raw_width for s in ACTION_SOURCES.values()},
    )
    prof = Profile(
        name=PROFILE_NAME_FULL if full else PROFILE_NAME_SMALL,
        description=(
            f"Deterministic demo of stage2_core_v1 ({_mode(full)}), generated by stage2_data.demo "
            f"v{GENERATOR_VERSION}"
        ),
        source=SourceSpec(repo_id=REPO_ID, repo_type="dataset", revision=revision),
        kit=KitSpec(
            pair_manifest=KIT_PAIR_MANIFEST,
            subset_checksums=KIT_SUBSET_CHECKSUMS,
            action_manifest_dir=KIT_ACTION_MANIFEST_DIR,
            sidecar_archive=KIT_SIDECAR_ARCHIVE,
            sidecar_archive_sha256=KIT_SIDECAR_ARCHIVE_SHA256,
        ),
        archives=archives,
        quarantined=[QuarantinedSpec(path=QUARANTINED_ARCHIVE, reason=QUARANTINE_REASON)],
        expected=expected,
    )
    _write_profile(kit / "profile.toml", prof)

    marker = {
        "generator": "stage2_data.demo",
        "generator_version": GENERATOR_VERSION,
        "mode": _mode(full),
        "profile": prof.name,
        "repo_id": REPO_ID,
        "revision": revision,
    }
    (root / MARKER_NAME).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return revision


def _write_profile(path: Path, prof: Profile) -> None:
    text = dump_profile_toml(prof)
    atomic_write_text(path, text)
    path.chmod(0o644)
    back = load_profile(path)
    if back.model_dump() != prof.model_dump():
        raise RuntimeError(f"demo: {path} does not round-trip through load_profile")


def repin_profile(demo: DemoPaths) -> None:
    """Recompute size and sha256 of every ``[[archives]]`` entry from the upstream files.

    The revision is left as it is (the loopback hub serves whatever the upstream folder holds
    under the demo's revision)."""
    prof = load_profile(demo.profile)
    problems = [a.path for a in prof.archives if not (demo.upstream / a.path).is_file()]
    if problems:
        raise Stage2Error(
            f"cannot repin {demo.profile}: upstream file(s) missing in {demo.upstream}: {', '.join(problems)}.",
            fix="regenerate the demo (delete its folder and run `python -m stage2_data.demo OUT`)",
        )
    archives = [
        a.model_copy(
            update={
                "size": (demo.upstream / a.path).stat().st_size,
                "sha256": sha256_file(demo.upstream / a.path),
            }
        )
        for a in prof.archives
    ]
    _write_profile(demo.profile, prof.model_copy(update={"archives": archives}))


def write_sidecar_sha256(kit_root: Path, sidecar_tar_rel: str) -> None:
    """(Re)write ``<tar>.sha256`` in sha256sum format, naming the tar by its file name."""
    tar = Path(kit_root) / sidecar_tar_rel
    out = tar.with_name(tar.name + ".sha256")
    atomic_write_text(out, f"{sha256_file(tar)}  {tar.name}\n")
    out.chmod(0o644)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stage2_data.demo", description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="output folder (created; reused if it already holds this demo)")
    ap.add_argument(
        "--full-cardinality",
        action="store_true",
        help="the exact totals of stage2_core_v1 with tiny payloads",
    )
    args = ap.parse_args(argv)
    try:
        demo = generate_demo(args.out, full_cardinality=args.full_cardinality)
    except Stage2Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"root      {demo.root}")
    print(f"upstream  {demo.upstream}")
    print(f"kit_root  {demo.kit_root}")
    print(f"profile   {demo.profile}")
    print(f"repo_id   {demo.repo_id}")
    print(f"revision  {demo.revision}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
