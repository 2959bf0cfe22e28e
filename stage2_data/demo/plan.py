"""The plan: every trajectory, pair and action row of the demo, decided before anything is written.

All randomness comes from ``random.Random(<str seed>)`` (sha512 seeding, stable across Python
versions), one generator per mode and cache key / action source, so the plan is the same on every
run and every machine.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from .spec import (
    ACTION_SOURCES,
    CACHE_KEYS,
    FULL_PAIR_ROWS,
    FULL_UNIQUE_FRAME_FILES,
    OTHER_SPEC,
    QUARANTINED_SPEC,
    RACER_PILOT_TASK,
    STATUS_NO_ACTIONS,
    STATUS_NO_CONSENSUS,
    STATUS_RECOVERED,
    CacheKeySpec,
)


@dataclass
class Traj:
    id: str
    cache_key: str
    task: str
    quality: str
    partial: float | None
    num_frames: int
    is_robot: bool


@dataclass
class ActionRow:
    traj: Traj
    source: str
    status: str


@dataclass
class Pair:
    split: str
    task: str
    chosen: Traj
    rejected: Traj


@dataclass
class Plan:
    full: bool
    trajs: dict[str, list[Traj]]  # cache_key -> trajectories (dataset row order)
    pairs: list[Pair]
    action_rows: dict[str, list[ActionRow]]  # source -> rows (file order)
    extra_trajs: dict[str, list[Traj]] = field(default_factory=dict)  # quarantined + other


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


def make_plan(full: bool) -> Plan:
    """The whole demo of one mode (``full``: full cardinality) as plain data."""
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

    trajs: dict[str, list[Traj]] = {}
    members_by_key: dict[str, list[Traj]] = {}
    pairs: list[Pair] = []
    ci = 0
    for spec, n, k in zip(CACHE_KEYS, counts, comps_per_key, strict=True):
        rng = random.Random(f"stage2-demo/{mode}/{spec.cache_key}")
        ids = [_uuid4(rng) for _ in range(n)]
        key_trajs: list[Traj] = []
        pos = 0
        members: list[Traj] = []
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
                pairs.append(Pair(split, task, comp[0], comp[1]))
            elif rng.random() < 0.5:
                pairs += [Pair(split, task, comp[0], comp[1]), Pair(split, task, comp[0], comp[2])]
            else:
                pairs += [Pair(split, task, comp[0], comp[1]), Pair(split, task, comp[1], comp[2])]
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

    extra: dict[str, list[Traj]] = {}
    for spec in (QUARANTINED_SPEC, OTHER_SPEC):
        rng = random.Random(f"stage2-demo/{mode}/{spec.cache_key}")
        quality = "failure" if spec is QUARANTINED_SPEC else "successful"
        extra[spec.cache_key] = [
            _new_traj(rng, full, spec, _uuid4(rng), rng.choice(spec.tasks), quality)
            for _ in range(spec.n_small)
        ]
    return Plan(full, trajs, pairs, action_rows, extra)


def _new_traj(rng: random.Random, full: bool, spec: CacheKeySpec, tid: str, task: str, quality: str) -> Traj:
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
    return Traj(tid, spec.cache_key, task, quality, partial, num_frames, spec.is_robot)


def _plan_actions(
    mode: str, full: bool, trajs: dict[str, list[Traj]], members_by_key: dict[str, list[Traj]]
) -> dict[str, list[ActionRow]]:
    out: dict[str, list[ActionRow]] = {}
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
        rows = [ActionRow(t, src.name, STATUS_RECOVERED) for t in recovered]
        for i, t in enumerate(rest):
            # both statuses always occur in every source; the RoboArena refinement rejects most
            if i == 0:
                status = STATUS_NO_ACTIONS
            elif i == 1:
                status = STATUS_NO_CONSENSUS
            else:
                p = 0.8 if src.name == "roboarena" else 0.25
                status = STATUS_NO_CONSENSUS if rng.random() < p else STATUS_NO_ACTIONS
            rows.append(ActionRow(t, src.name, status))
        rows.sort(key=lambda r: (r.traj.cache_key, r.traj.id))
        out[src.name] = rows
    return out
