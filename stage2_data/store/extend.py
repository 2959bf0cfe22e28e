"""Extending a published store: when the new inputs only ADD trajectories, write a sidecar store of the
new ones and merge it (:mod:`.merge`: whole shards copied, existing ones never rewritten) instead of
rebuilding; otherwise say why a rebuild is needed.

An extension is taken only when its result equals a fresh build of the new inputs in content (same
samples with the same frames, actions and metadata per trajectory id, same pairs, same splits). When
the new trajectories come in new cache directories, the row order, the shard layout and the
fingerprint are the fresh build's too (:mod:`.merge` numbers the shards as a fresh build cuts them);
new trajectories inside an existing cache directory give another layout and fingerprint.
:func:`decide_extension` checks, without decoding a frame:

* the published store opens strictly (format and version of this writer) with the same writer options
  and codec, for the same source repo, and validates deep (every file hashed against its manifest:
  its shards are copied as they are, so a damaged one is rebuilt, not carried into every later store);
* every input of the old store under ``archive_prefix`` (the archives its frames came from) is in the
  new inputs with the same sha256: an old trajectory's frames cannot have changed;
* the old trajectories are a strict subset of the new ones, each with the same metadata (cache key,
  source, task, quality, partial success, robot flag, action status) and the same split;
* every old pair is among the new pairs, unchanged; the new inputs plan without error (splits,
  leakage) as a fresh build would;
* when the input that carries the actions (``actions_input``, the sidecar archive) changed, each old
  trajectory's actions in the store equal its new sidecar's (read, not assumed).
"""

from __future__ import annotations

import shutil
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StoreError
from ..publish import make_staging_dir
from ..storage import StoreLocation
from .format import DEFAULT_MAX_FRAMES, PairSpec, SampleSpec, StoreChecksumError, codec_record
from .manifest import load_manifest_strict
from .merge import merge_vin_offline_stores
from .plan import _assign_splits, dedupe_samples
from .reader import VinOfflineStoreReader
from .validate import validate_vin_offline_store
from .writer import VinOfflineWriter

#: sample-index fields an old trajectory must keep, and the SampleSpec attribute each comes from
_SAME_FIELDS = (
    "cache_key",
    "source",
    "task",
    "quality_label",
    "partial_success",
    "is_robot",
    "action_status",
)


@dataclass
class Extension:
    """What an extension writes: the new trajectories (the sidecar store), and every pair of the new
    inputs (the merged store's pairs, by trajectory id)."""

    base: StoreLocation
    base_manifest: dict[str, Any]
    new_samples: list[SampleSpec]
    sidecar_pairs: list[PairSpec]  # pairs whose two trajectories are both new
    pairs: list[PairSpec]

    @property
    def base_name(self) -> str:
        return self.base.root.name


@dataclass
class ExtendDecision:
    """An :class:`Extension`, or the reason a full build is needed instead."""

    extension: Extension | None = None
    reason: str = ""
    damaged: list[str] = field(default_factory=list)  # the published store's problems, if damaged


@dataclass
class ExtendReport:
    manifest: dict[str, Any]
    base_name: str
    new_samples: int
    new_pairs: int
    shards_copied: int  # the old store's shards (hard-linked, or copied and verified)
    shards_written: int  # the sidecar's shards (written by the writer, then copied whole)

    @property
    def summary(self) -> str:
        return (
            f"extended {self.base_name} by {self.new_samples} samples and {self.new_pairs} pairs "
            f"({self.shards_copied} shards copied, {self.shards_written} new)"
        )


#: why a build with no published store (no ``current``) writes the store whole, on every backend
NO_PUBLISHED_STORE = "no store is published for this profile"


def _no(reason: str) -> ExtendDecision:
    return ExtendDecision(None, reason)


def _few(keys: Sequence[str], n: int = 3) -> str:
    ks = sorted(keys)
    return ", ".join(ks[:n]) + (f" and {len(ks) - n} more" if len(ks) > n else "")


def decide_extension(
    base: StoreLocation | None,
    samples: Sequence[SampleSpec],
    pairs: Sequence[PairSpec],
    *,
    profile: dict[str, Any],
    inputs: dict[str, str],
    options: dict[str, Any],
    archive_prefix: str = "archive/",
    actions_input: str | None = None,
) -> ExtendDecision:
    """Can the published store ``base`` be extended into the store of ``samples`` and ``pairs``
    (built with writer ``options``: ``rows_per_shard``, ``include_actions``, ``max_frames``)? See the module doc."""
    if base is None:
        return _no(NO_PUBLISHED_STORE)
    try:
        m = load_manifest_strict(base)
    except StoreError as e:
        return ExtendDecision(None, f"the published store {base.root.name} does not open ({e})", [str(e)])
    if m.get("profile", {}).get("repo_id") != profile.get("repo_id"):
        return _no(
            f"the source repo changed ({m.get('profile', {}).get('repo_id')} -> {profile.get('repo_id')})"
        )
    old_opts = {k: m.get("options", {}).get(k) for k in options}
    if old_opts != options:
        return _no(f"the writer options changed ({old_opts} -> {options})")
    if m.get("codec") != codec_record():
        return _no("the codec changed")
    old_inputs: dict[str, str] = m.get("inputs", {})
    removed = [k for k in old_inputs if k.startswith(archive_prefix) and k not in inputs]
    if removed:
        return _no(f"{len(removed)} archives of the published store left the profile ({_few(removed)})")
    changed = [k for k, v in old_inputs.items() if k.startswith(archive_prefix) and inputs[k] != v]
    if changed:
        return _no(f"{len(changed)} archives of the published store changed sha256 ({_few(changed)})")
    problems: list[str] = []
    by_key = dedupe_samples(samples, problems)
    split_of, kept = _assign_splits(by_key, pairs, problems)
    if problems:
        return _no(f"the new inputs do not plan ({len(problems)} problems, first: {problems[0]})")
    # its shards are copied as they are, so it must hold exactly what its manifest says: every file
    # hashed (deep), as the publication gate does; a damaged store is rebuilt instead, never extended
    damaged = validate_vin_offline_store(base, deep=True)
    if damaged:
        return ExtendDecision(
            None, f"the published store {base.root.name} does not validate ({damaged[0]})", damaged
        )
    try:
        with VinOfflineStoreReader(base) as reader:  # its lease keeps retention off it meanwhile
            return _decide(reader, m, by_key, split_of, kept, inputs, options, actions_input, profile)
    except StoreChecksumError as e:  # a damaged published store is rebuilt, never extended
        return ExtendDecision(
            None, f"the published store {base.root.name} is damaged ({e.message})", [e.message]
        )


def _decide(
    reader: VinOfflineStoreReader,
    m: dict[str, Any],
    by_key: dict[str, SampleSpec],
    split_of: dict[str, str],
    kept: list[PairSpec],
    inputs: dict[str, str],
    options: dict[str, Any],
    actions_input: str | None,
    profile: dict[str, Any],
) -> ExtendDecision:
    old_inputs: dict[str, str] = m.get("inputs", {})
    old_rows = reader.sample_index
    old_keys = {r["sample_key"] for r in old_rows}
    gone = old_keys - set(by_key)
    if gone:
        return _no(
            f"{len(gone)} trajectories of the published store are not in the new inputs ({_few(list(gone))})"
        )
    if len(old_keys) == len(by_key):
        diff = sorted(k for k in set(old_inputs) | set(inputs) if old_inputs.get(k) != inputs.get(k))
        if diff:
            return _no(f"no new trajectories, but inputs changed ({_few(diff)})")
        was, now = m.get("profile", {}).get("revision"), profile.get("revision")
        if was != now:  # the store records the revision it was built from
            return _no(
                f"no new trajectories and the same kit and pins, but the source revision changed ({was} -> {now})"
            )
        return _no(
            "no new trajectories and the same kit and pins, but the store's name differs: the content "
            "of the extracted data or the sidecars is not the published store's (or it was named by "
            "an older version)"
        )
    for r in old_rows:
        s = by_key[r["sample_key"]]
        new = {f: getattr(s, f) for f in _SAME_FIELDS}
        new["partial_success"] = None if s.partial_success is None else float(s.partial_success)
        new["is_robot"] = bool(s.is_robot)
        old = {f: r.get(f) for f in _SAME_FIELDS}
        if split_of.get(r["sample_key"]) != r["split"]:
            old["split"], new["split"] = r["split"], split_of.get(r["sample_key"])
        if old != new:
            fs = sorted(f for f in old if old[f] != new[f])
            return _no(f"trajectory {r['sample_key']} of the published store changed ({', '.join(fs)})")
    keys = [r["sample_key"] for r in old_rows]
    kept_by_id = {p.pair_id: p for p in kept}
    for p in reader.pairs():
        old_p = (p["split"], p["task"], keys[p["chosen_sample_index"]], keys[p["rejected_sample_index"]])
        q = kept_by_id.get(p["pair_id"])
        if q is None:
            return _no(f"pair {p['pair_id']} of the published store is not in the new pair manifest")
        if (q.split, q.task, q.chosen_key, q.rejected_key) != old_p:
            return _no(f"pair {p['pair_id']} of the published store changed")
    if actions_input is not None and old_inputs.get(actions_input) != inputs.get(actions_input):
        bad = _changed_actions(reader, by_key, bool(options.get("include_actions", True)))
        if bad:
            return _no(f"the actions of {len(bad)} trajectories of the published store changed ({_few(bad)})")
    new_samples = [by_key[k] for k in sorted(set(by_key) - old_keys)]
    new_keys = {s.sample_key for s in new_samples}
    sidecar_pairs = [p for p in kept if p.chosen_key in new_keys and p.rejected_key in new_keys]
    # a new trajectory that only pairs with old ones keeps its declared split in the sidecar: the
    # plan above checked it equals its pairs' split
    return ExtendDecision(Extension(reader.location, m, new_samples, sidecar_pairs, list(kept)))


def _changed_actions(
    reader: VinOfflineStoreReader, by_key: dict[str, SampleSpec], include: bool
) -> list[str]:
    """Old trajectories whose actions in the store differ from their (new) sidecar files."""
    bad: list[str] = []
    for i, r in enumerate(reader.sample_index):
        s = by_key[r["sample_key"]]
        old = reader.read_actions(i)
        new: np.ndarray[Any, Any] | None = None
        if include and s.sidecar_path is not None:
            try:
                with np.load(Path(s.sidecar_path), allow_pickle=False) as z:
                    new = np.asarray(z["aligned_actions"]).astype(np.float32)
            except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, zlib.error):
                bad.append(r["sample_key"])
                continue
        if (old is None) != (new is None) or (
            old is not None and new is not None and (old.shape != new.shape or old.tobytes() != new.tobytes())
        ):
            bad.append(r["sample_key"])
    return bad


def extend_store(ext: Extension, out: Path, **writer_kw: Any) -> ExtendReport:
    """Write the sidecar store of ``ext.new_samples`` (the same writer and options, ``writer_kw``:
    :class:`VinOfflineWriter`'s keywords, in a staging folder next to ``out``), merge it with the
    published store into ``out`` (published atomically), delete the sidecar. The merged manifest
    records ``extended_from`` (the old store's folder name, fingerprint, samples and shards) beside
    ``merged_from``. The merge hashes every file it takes from either store against their manifests;
    the publication gate on ``out`` is the caller's (the store step's, as for a fresh build)."""
    bm = ext.base_manifest
    with VinOfflineStoreReader(ext.base) as base_reader:
        old_samples, old_pairs = len(base_reader.sample_index), len(base_reader.pairs())
    scratch = make_staging_dir(Path(out))
    try:
        side = scratch / "sidecar"
        writer = VinOfflineWriter(side, **writer_kw)
        sm = writer.write(ext.new_samples, ext.sidecar_pairs)
        extended_from = {
            "store": ext.base_name,
            "fingerprint": bm["fingerprint"],
            "samples": old_samples,
            "shards": len(bm["shards"]),
        }
        manifest = merge_vin_offline_stores(
            ext.base,
            side,
            out,
            pairs=ext.pairs,
            profile=dict(writer.profile),
            inputs=writer_kw["inputs"],
            local=dict(writer.local),
            extra={"extended_from": extended_from},
            gate=False,  # the store step gates ``out`` before ``current`` names it, as a fresh build
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ExtendReport(
        manifest,
        ext.base_name,
        new_samples=len(ext.new_samples),
        new_pairs=len(ext.pairs) - old_pairs,
        shards_copied=len(bm["shards"]),
        shards_written=len(sm["shards"]),
    )


def write_or_extend(
    out: StoreLocation,
    base: StoreLocation | None,
    samples: Sequence[SampleSpec],
    pairs: Sequence[PairSpec],
    *,
    profile: dict[str, Any],
    inputs: dict[str, str],
    rows_per_shard: int,
    include_actions: bool = True,
    max_frames: int = DEFAULT_MAX_FRAMES,
    progress: Callable[[int], None] | None = None,
    profile_path: Path | None = None,
    data_root: Path | None = None,
    kit_root: Path | None = None,
    actions_input: str | None = None,
    processes: int = 1,
    damaged_base: list[str] | None = None,
    not_extendable: str | None = None,
) -> str:
    """Write the store of ``samples`` and ``pairs`` at ``out``: by extending the published store
    ``base`` when :func:`decide_extension` allows it, else with the writer. Returns one line for the
    step's metadata: ``extended <old> by N samples ...`` or ``rebuilt: <reason>``. ``damaged_base``
    (a list) is given the published store's problems when it was found damaged (the caller moves it
    aside once the new store is published). ``not_extendable``: why ``base`` must not be extended,
    as the caller found it (the store is then written whole, and the line says why)."""
    writer_kw: dict[str, Any] = {
        "profile": profile,
        "inputs": inputs,
        "rows_per_shard": rows_per_shard,
        "include_actions": include_actions,
        "max_frames": max_frames,
        "profile_path": profile_path,
        "data_root": data_root,
        "kit_root": kit_root,
        "progress": progress,
        "processes": processes,
    }
    if base is None:  # nothing to extend, on any backend (object storage included)
        decision = _no(NO_PUBLISHED_STORE)
    elif not_extendable is not None:
        decision = _no(not_extendable)
    elif not out.is_local or not base.is_local:
        decision = _no("the stores are on object storage (extension is local only)")
    elif base.root.resolve() == out.root.resolve():
        decision = _no(f"the published store {base.root.name} has these inputs but did not validate")
    else:
        decision = decide_extension(
            base,
            samples,
            pairs,
            profile=profile,
            inputs=inputs,
            options={
                "include_actions": include_actions,
                "rows_per_shard": rows_per_shard,
                "max_frames": max_frames,
            },
            actions_input=actions_input,
        )
    if decision.extension is not None:
        try:
            report = extend_store(decision.extension, out.root, **writer_kw)
        except StoreError as e:  # e.g. the published store's files fail validation: build it whole
            decision = _no(f"extending {decision.extension.base_name} failed ({e})")
        else:
            return report.summary
    if damaged_base is not None:
        damaged_base.extend(decision.damaged)
    VinOfflineWriter(out, **writer_kw).write(samples, pairs)
    return f"rebuilt: {decision.reason}"
