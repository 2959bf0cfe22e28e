"""Planning a build: dedupe the samples, give each its split (leakage is an error), order the rows and
cut them into shards; the size estimate and the free-space check that come before writing.

Sample order: rows are grouped by cache directory (``cache_key``, ascending), then by frame
resolution (H, W) (ascending), then sorted by (``num_frames``, ``sample_key``) inside a group. A
shard holds rows of ONE cache directory and ONE resolution, of similar lengths, so the layout is a
function of the rows alone: stores built per cache directory and merged (:mod:`.merge`) have the
shards, the sample index and the fingerprint of one store built from all of them at once. A shard
takes at most ``rows_per_shard`` rows, and a row whose ``num_frames`` exceeds the
shard's first (shortest) row's by more than :func:`.format.pad_slack` starts a new shard, so no short
sample is ever padded to a rare long one (``Tmax`` of a shard is the longest sample in it; padding
per row is at most ``max(8, shortest // 4)`` frames). A sample over ``max_frames`` (the profile's
frame bound) is an error, and so is a frames file whose length contradicts the ``num_frames`` its
processed_dataset row declares (``SampleSpec.num_frames``). A sample's split is the split of the
pairs that use it (two splits = leakage = error); a sample no pair uses keeps its declared
``SampleSpec.split``; a declared split that contradicts its pairs is an error.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from itertools import groupby
from pathlib import Path

import numpy as np

from ..fsutil import require_free_space
from .format import (
    BLOCK_ACTIONS,
    BLOCK_FRAMES,
    BLOCK_NAMES,
    BLOCK_NUM_FRAMES,
    BLOCK_WIDTH,
    DEFAULT_MAX_FRAMES,
    SPLIT_NAMES,
    PairSpec,
    SampleSpec,
    StoreInputError,
    pad_slack,
)
from .inputs import inspect_frames_npz, inspect_sidecar_npz


@dataclass
class Row:
    spec: SampleSpec
    split: str
    num_frames: int
    height: int
    width: int
    action_width: int  # 0 when no sidecar or actions not included
    sample_index: int = -1
    shard_id: int = -1
    row: int = -1


@dataclass
class ShardPlan:
    shard_id: int
    row_start: int
    rows: list[Row]

    @property
    def tmax(self) -> int:
        return max(r.num_frames for r in self.rows)

    @property
    def hw(self) -> tuple[int, int]:
        return self.rows[0].height, self.rows[0].width

    @property
    def wmax(self) -> int:
        return max(r.action_width for r in self.rows)


def dedupe_samples(samples: Sequence[SampleSpec], problems: list[str]) -> dict[str, SampleSpec]:
    by_key: dict[str, SampleSpec] = {}
    for s in samples:
        if not isinstance(s, SampleSpec):
            problems.append(f"samples: {s!r} is not a SampleSpec")
            continue
        old = by_key.get(s.sample_key)
        if old is None:
            by_key[s.sample_key] = s
        elif old != s:
            diff = [f.name for f in fields(SampleSpec) if getattr(old, f.name) != getattr(s, f.name)]
            problems.append(
                f"sample {s.sample_key!r} appears twice with different data (fields {', '.join(diff)})"
            )
    return by_key


def _assign_splits(
    by_key: dict[str, SampleSpec], pairs: Sequence[PairSpec], problems: list[str]
) -> tuple[dict[str, str], list[PairSpec]]:
    pair_splits: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    seen_pairs: dict[str, PairSpec] = {}
    kept: list[PairSpec] = []
    for p in pairs:
        if not isinstance(p, PairSpec):
            problems.append(f"pairs: {p!r} is not a PairSpec")
            continue
        if p.pair_id in seen_pairs:
            if seen_pairs[p.pair_id] != p:
                problems.append(f"pair {p.pair_id!r} appears twice with different data")
            continue
        seen_pairs[p.pair_id] = p
        ok = True
        if p.split not in SPLIT_NAMES:
            problems.append(f"pair {p.pair_id!r}: split {p.split!r} is not one of {', '.join(SPLIT_NAMES)}")
            ok = False
        for role, key in (("chosen", p.chosen_key), ("rejected", p.rejected_key)):
            if key not in by_key:
                problems.append(f"pair {p.pair_id!r}: {role} trajectory {key!r} is not among the samples")
                ok = False
        if p.chosen_key == p.rejected_key:
            problems.append(
                f"pair {p.pair_id!r}: chosen and rejected are the same trajectory {p.chosen_key!r}"
            )
            ok = False
        if ok:
            pair_splits[p.chosen_key][p.split].append(p.pair_id)
            pair_splits[p.rejected_key][p.split].append(p.pair_id)
            kept.append(p)
    split_of: dict[str, str] = {}
    for key, s in by_key.items():
        used = pair_splits.get(key)
        if used and len(used) > 1:
            detail = "; ".join(f"{sp}: {', '.join(sorted(ids)[:3])}" for sp, ids in sorted(used.items()))
            problems.append(
                f"split leakage: trajectory {key!r} is used by pairs of several splits ({detail})"
            )
            continue
        if used:
            (sp,) = used
            if s.split != sp:
                problems.append(f"sample {key!r}: declared split {s.split!r} but its pairs are in {sp!r}")
                continue
            split_of[key] = sp
        elif s.split not in SPLIT_NAMES:
            problems.append(f"sample {key!r}: split {s.split!r} is not one of {', '.join(SPLIT_NAMES)}")
        else:
            split_of[key] = s.split
    return split_of, sorted(kept, key=lambda p: p.pair_id)


def _check_spec_fields(s: SampleSpec, problems: list[str]) -> None:
    for name in ("sample_key", "cache_key", "source", "task", "quality_label"):
        if not isinstance(getattr(s, name), str):
            problems.append(f"sample {s.sample_key!r}: {name} must be a string")
    if not s.sample_key:
        problems.append(f"a sample has an empty sample_key (frames {s.frames_path})")
    if s.partial_success is not None and (
        not isinstance(s.partial_success, int | float) or not math.isfinite(float(s.partial_success))
    ):
        problems.append(
            f"sample {s.sample_key!r}: partial_success {s.partial_success!r} is not a finite number"
        )
    if not isinstance(s.is_robot, bool | np.bool_):
        problems.append(f"sample {s.sample_key!r}: is_robot must be a bool")
    if s.num_frames is not None and (
        not isinstance(s.num_frames, int | np.integer) or isinstance(s.num_frames, bool)
    ):
        problems.append(f"sample {s.sample_key!r}: num_frames {s.num_frames!r} must be an integer or None")


def check_length(s: SampleSpec, num_frames: int, max_frames: int, problems: list[str]) -> None:
    """A sample's length against the frame bound and against its processed_dataset row."""
    if num_frames > max_frames:
        problems.append(
            f"{s.frames_path}: trajectory {s.sample_key} has {num_frames} frames, more than max_frames "
            f"{max_frames} (the profile's frame bound; upstream's preprocessing keeps at most 32, older "
            "sets 64): repair or drop the trajectory, or raise max_frames in the profile if this set "
            "was preprocessed with a larger bound"
        )
    if s.num_frames is not None and int(s.num_frames) != num_frames:
        problems.append(
            f"{s.frames_path}: trajectory {s.sample_key} holds {num_frames} frames but its "
            f"processed_dataset row says num_frames {int(s.num_frames)}"
        )


#: A shard holds rows that share the first SHARD_GROUP fields of their :func:`row_order`.
SHARD_GROUP = 3


def row_order(
    cache_key: str, height: int, width: int, num_frames: int, sample_key: str
) -> tuple[str, int, int, int, str]:
    """Where a row goes in a store (docs/spec/vin-store.md, "Shards and padding"): by cache
    directory, then resolution, then length, then trajectory id. The one statement of the order:
    the planner cuts shards in it, and a merge (:mod:`.merge`) numbers the shards of its inputs by
    their first rows in it."""
    return (cache_key, height, width, num_frames, sample_key)


def cut_shards(rows: list[Row], rows_per_shard: int) -> list[list[Row]]:
    """Rows of one cache directory and resolution, sorted by (num_frames, key), cut into shards of at most
    ``rows_per_shard`` rows whose longest row exceeds the shortest by at most ``pad_slack``."""
    out: list[list[Row]] = []
    for r in rows:
        cur = out[-1] if out else None
        if (
            cur is None
            or len(cur) >= rows_per_shard
            or r.num_frames > cur[0].num_frames + pad_slack(cur[0].num_frames)
        ):
            out.append([r])
        else:
            cur.append(r)
    return out


def plan_shards(
    samples: Sequence[SampleSpec],
    pairs: Sequence[PairSpec],
    include_actions: bool,
    rows_per_shard: int,
    max_frames: int = DEFAULT_MAX_FRAMES,
) -> tuple[list[ShardPlan], list[Row], list[PairSpec]]:
    problems: list[str] = []
    by_key = dedupe_samples(samples, problems)
    if not by_key and not problems:
        problems.append("no samples to write")
    split_of, kept_pairs = _assign_splits(by_key, pairs, problems)
    rows: list[Row] = []
    for key in sorted(by_key):
        s = by_key[key]
        _check_spec_fields(s, problems)
        info = inspect_frames_npz(Path(s.frames_path), problems)
        if info is not None:
            check_length(s, info.num_frames, max_frames, problems)
        width = 0
        if include_actions and s.sidecar_path is not None:
            w = inspect_sidecar_npz(Path(s.sidecar_path), info.num_frames if info else None, problems)
            width = w or 0
        if info is not None and key in split_of:
            rows.append(Row(s, split_of[key], info.num_frames, info.height, info.width, width))
    if problems:
        raise StoreInputError(
            "cannot build the VIN offline store",
            problems,
            fix="correct the named inputs (pair manifest, frame files, sidecars) and build again",
        )

    def order(r: Row) -> tuple[str, int, int, int, str]:
        return row_order(r.spec.cache_key, r.height, r.width, r.num_frames, r.spec.sample_key)

    rows.sort(key=order)
    shards: list[ShardPlan] = []
    ordered: list[Row] = []
    for _group, grp in groupby(rows, key=lambda r: order(r)[:SHARD_GROUP]):
        for chunk in cut_shards(list(grp), rows_per_shard):
            plan = ShardPlan(len(shards), len(ordered), chunk)
            for j, r in enumerate(chunk):
                r.sample_index = len(ordered)
                r.shard_id = plan.shard_id
                r.row = j
                ordered.append(r)
            shards.append(plan)
    return shards, ordered, kept_pairs


# ----- estimate ----------------------------------------------------------------------------------------
def estimate_store_bytes(samples: Sequence[SampleSpec], *, include_actions: bool = True) -> dict[str, int]:
    """Uncompressed payload bytes per block (unpadded), from npz headers only, plus ``total``.

    Frames are never decompressed: only each ``.npy`` member's header is read. The numbers equal
    ``manifest["stats"]["payload_bytes"]`` of the store these samples build; the stored arrays add
    zero/NaN padding up to each shard's ``Tmax`` (which compresses to almost nothing).
    """
    problems: list[str] = []
    by_key = dedupe_samples(samples, problems)
    out = dict.fromkeys(BLOCK_NAMES, 0)
    for key in sorted(by_key):
        s = by_key[key]
        info = inspect_frames_npz(Path(s.frames_path), problems)
        if info is None:
            continue
        out[BLOCK_FRAMES] += info.num_frames * info.height * info.width * 3
        out[BLOCK_NUM_FRAMES] += 4
        out[BLOCK_WIDTH] += 2
        if include_actions and s.sidecar_path is not None:
            w = inspect_sidecar_npz(Path(s.sidecar_path), info.num_frames, problems)
            if w:
                out[BLOCK_ACTIONS] += info.num_frames * w * 4
    if problems:
        raise StoreInputError(
            "cannot estimate the VIN offline store size",
            problems,
            fix="correct the named frame files or sidecars",
        )
    out["total"] = sum(out[b] for b in BLOCK_NAMES)
    return out


def check_free_space_for_store(out_dir: Path, estimate: dict[str, int], *, margin: float = 1.05) -> None:
    """Refuse (DiskSpaceError) when the folder that will hold ``out_dir`` lacks ``total * margin`` bytes.

    The uncompressed payload is an upper bound of what Blosc writes for real data; the margin covers
    metadata and padding. An existing store at ``out_dir`` stays until the new one is complete, so
    this free space is needed on top of it.
    """
    needed = int(estimate["total"] * margin) + (1 << 20)
    require_free_space(Path(out_dir).parent, needed, f"the VIN offline store {out_dir}")
