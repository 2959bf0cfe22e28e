"""O(change) profile updates (stage2_data/store/extend.py): a profile that adds a cache directory extends
the published store (a sidecar store of the new trajectories, merged by copying whole shards) and the
result equals a fresh build, fingerprint included; anything else rebuilds, saying why. Stores built
per cache directory and merged, in any order, equal one store built from all of them at once.

"Equal in content" (docs/spec/vin-store.md, Updates): the same trajectory ids, each with the same
decoded frames, decoded actions and sample-index metadata (every field but ``sample_index``,
``shard_id`` and ``row``); the same pairs by trajectory id; the same split of every trajectory; the same
manifest ``profile``, ``inputs``, ``options`` and per-split / per-source counts. For parts that hold
disjoint cache directories the layout and the fingerprint are equal too (docs/spec/vin-store.md,
Shards and padding): that is asserted where it holds.

The "profile" here is a set of synthetic cache directories (npz frames and sidecars, as
tests/test_store.py writes them), driven through the same call the store step makes
(``write_or_extend`` with the published ``current`` store), then validated and published as the step does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.cli import stage2
from test_store import frames_npz, tid

from stage2_data.storage import StoreLocation
from stage2_data.store import (
    PairSpec,
    SampleSpec,
    VinOfflineStoreReader,
    merge_vin_offline_stores,
    validate_vin_offline_store,
)
from stage2_data.store import extend as extend_mod
from stage2_data.store.extend import write_or_extend

PROFILE = {"name": "ext_demo", "repo_id": "org/processed_datasets", "revision": "b" * 40}
SIDECARS = "kit/sidecars.tar"
PER_DIR = 7


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


@dataclass
class CacheDir:
    key: str
    samples: list[SampleSpec]
    pairs: list[PairSpec]  # pairs whose chosen trajectory is in this cache dir


def make_cache_dir(root: Path, n: int) -> CacheDir:
    """Cache dir ``n``: PER_DIR trajectories (two resolutions, some without sidecar), pairs inside the
    dir by split, and one pair from its first trajectory to a trajectory of cache dir 0 (same split)."""
    rng = np.random.default_rng(100 + n)
    key = f"cache_{n:02d}"
    samples: list[SampleSpec] = []
    for j in range(PER_DIR):
        i = n * 100 + j
        h, w = (8, 10) if j % 3 else (6, 12)
        t = int(rng.integers(2, 20))
        fpath = root / "processed_datasets" / key / "frames" / f"trajectory_{tid(i)}.npz"
        fpath.parent.mkdir(parents=True, exist_ok=True)
        frames_npz(fpath, rng.integers(0, 256, size=(t, h, w, 3), dtype=np.uint8))
        sidecar = None
        if j % 4 != 0:
            sidecar = root / "derived" / key / f"trajectory_{tid(i)}.npz"
            sidecar.parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(sidecar, aligned_actions=rng.normal(size=(t, 7)))
        samples.append(
            SampleSpec(
                sample_key=tid(i),
                cache_key=key,
                source=f"src{n % 2}",
                task=f"task {j % 2}",
                quality_label=("successful", "failure")[j % 2],
                partial_success=round(0.1 * j, 3),
                is_robot=True,
                split=("train", "val", "test")[j % 3],
                frames_path=fpath,
                sidecar_path=sidecar,
                action_status="recovered" if sidecar else "source_has_no_actions",
            )
        )
    pairs: list[PairSpec] = []
    for sp in ("train", "val", "test"):
        ss = [s for s in samples if s.split == sp]
        pairs += [
            PairSpec(f"p{n:02d}_{sp}_{k}", sp, ss[k].task, ss[k].sample_key, ss[k + 1].sample_key)
            for k in range(len(ss) - 1)
        ]
    if n > 0:  # a pair joining this cache dir to cache dir 0 (j=0 is "train" in both)
        pairs.append(PairSpec(f"p{n:02d}_x", "train", "task 0", samples[0].sample_key, tid(0)))
    return CacheDir(key, samples, pairs)


@dataclass
class Build:
    name: str
    update: str
    store: Path


def inputs_of(dirs: Sequence[CacheDir], *, archive_tag: str = "", sidecar_tag: str = "") -> dict[str, str]:
    out = {f"archive/{d.key}.tar": sha(d.key + archive_tag) for d in dirs}
    out["kit/pairs.jsonl"] = sha("|".join(p.pair_id for d in dirs for p in d.pairs))
    out[SIDECARS] = sha("sidecars" + sidecar_tag)  # unchanged unless asked: the actions need no re-check
    return out


def step(
    stores: Path,
    dirs: Sequence[CacheDir],
    *,
    rows_per_shard: int = 3,
    inputs: dict[str, str] | None = None,
    samples: list[SampleSpec] | None = None,
    pairs: list[PairSpec] | None = None,
    profile: dict[str, Any] | None = None,
) -> Build:
    """What stage2_data/steps/store.py does: the store named by its inputs, written or extended from
    the published one, decoded and validated, then published as ``current``."""
    inputs = inputs or inputs_of(dirs)
    samples = samples if samples is not None else [s for d in dirs for s in d.samples]
    pairs = pairs if pairs is not None else [p for d in dirs for p in d.pairs]
    profile = profile or PROFILE
    named = [inputs, rows_per_shard] if profile == PROFILE else [inputs, rows_per_shard, profile]
    name = "v1-" + sha(json.dumps(named, sort_keys=True))[:16]
    root = StoreLocation.parse(stores)
    out = root.child(name)
    update = write_or_extend(
        out,
        root.current(),
        samples,
        pairs,
        profile=profile,
        inputs=inputs,
        rows_per_shard=rows_per_shard,
        actions_input=SIDECARS,
    )
    assert validate_vin_offline_store(out, decode=True) == []
    root.publish_current(name)
    return Build(name, update, stores / name)


def content(store: Path) -> dict[str, Any]:
    """A store's content as "equal in content" defines it (see the module doc)."""
    r = VinOfflineStoreReader(store)
    layout = {"sample_index", "shard_id", "row"}
    samples = {}
    for i, row in enumerate(r.sample_index):
        a = r.read_actions(i)
        samples[row["sample_key"]] = (
            {k: v for k, v in row.items() if k not in layout},
            hashlib.sha256(np.ascontiguousarray(r.read_frames(i)).tobytes()).hexdigest(),
            None if a is None else (a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()),
        )
    keys = [row["sample_key"] for row in r.sample_index]
    pairs = sorted(
        (
            p["pair_id"],
            p["split"],
            p["task"],
            keys[p["chosen_sample_index"]],
            keys[p["rejected_sample_index"]],
        )
        for p in r.pairs()
    )
    splits = {sp: sorted(keys[i] for i in r.split(sp)) for sp in ("all", "train", "val", "test")}
    m = r.manifest
    st = m["stats"]
    return {
        "samples": samples,
        "pairs": pairs,
        "splits": splits,
        "manifest": {
            k: m[k] for k in ("format", "version", "profile", "inputs", "options", "blocks", "codec")
        },
        "stats": {k: st.get(k) for k in ("samples", "pairs", "per_split", "per_source")},
    }


def shard_files(store: Path) -> dict[str, tuple[int, str]]:
    """Every shard file: (inode, sha256), by path relative to the store."""
    return {
        p.relative_to(store).as_posix(): (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted((store / "shards").rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> list[CacheDir]:
    root = tmp_path_factory.mktemp("upstream")
    return [make_cache_dir(root, n) for n in range(4)]


class WriteSpy:
    """Records the trajectories every VinOfflineWriter.write call in the extension module was given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[str]] = []
        real = extend_mod.VinOfflineWriter.write
        spy = self

        def write(self_: Any, samples: Sequence[SampleSpec], pairs: Sequence[PairSpec]) -> dict[str, Any]:
            spy.calls.append(sorted(s.sample_key for s in samples))
            return real(self_, samples, pairs)

        monkeypatch.setattr(extend_mod.VinOfflineWriter, "write", write)


def test_adding_a_cache_dir_extends_and_equals_a_fresh_build(
    tmp_path: Path, dirs: list[CacheDir], monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = tmp_path / "stores"
    first = step(stores, dirs[:3])
    assert first.update == "rebuilt: no store is published for this profile"
    old_files = shard_files(first.store)
    old_manifest = json.loads((first.store / "manifest.json").read_text())

    spy = WriteSpy(monkeypatch)
    second = step(stores, dirs)
    new_keys = sorted(s.sample_key for s in dirs[3].samples)
    n_pairs = len(dirs[3].pairs)
    nsh = len(old_manifest["shards"])
    assert second.update.startswith(f"extended {first.name} by {PER_DIR} samples and {n_pairs} pairs ")
    assert f"({nsh} shards copied, " in second.update
    assert spy.calls == [new_keys]  # the writer wrote the new trajectories and nothing else

    # the old store's shard files are the new store's: the same inodes (hard links), never
    # rewritten; the old store is untouched and still valid
    new_files = shard_files(second.store)
    assert set(old_files.values()) <= set(new_files.values())
    assert shard_files(first.store) == old_files
    assert validate_vin_offline_store(first.store, deep=True, decode=True) == []
    assert validate_vin_offline_store(second.store, deep=True, decode=True) == []

    m = json.loads((second.store / "manifest.json").read_text())
    assert m["extended_from"] == {
        "store": first.name,
        "fingerprint": old_manifest["fingerprint"],
        "samples": 3 * PER_DIR,
        "shards": nsh,
    }
    assert [e["role"] for e in m["merged_from"]] == ["base", "sidecar"]
    assert m["merged_from"][1]["samples"] == PER_DIR

    # equal to a fresh build of the bigger profile: in content, in layout, in fingerprint
    fresh = step(tmp_path / "fresh", dirs)
    assert fresh.update == "rebuilt: no store is published for this profile"
    assert fresh.name == second.name  # the same inputs name the same store
    assert content(second.store) == content(fresh.store)
    assert m["fingerprint"] == json.loads((fresh.store / "manifest.json").read_text())["fingerprint"]

    # a rerun of the bigger profile: the extended store's inputs match, so it is reused as is
    root = StoreLocation.parse(stores)
    assert root.current() is not None and root.current().root.name == second.name  # type: ignore[union-attr]


def fingerprint(store: Path) -> str:
    return str(json.loads((store / "manifest.json").read_text())["fingerprint"])


def test_extension_by_a_cache_dir_that_sorts_between_equals_a_fresh_build(
    tmp_path: Path, dirs: list[CacheDir]
) -> None:
    """The new cache directory's shards go between the old ones (the order a fresh build gives),
    the old shards hard-linked under their new numbers: the fingerprint is the fresh build's."""
    stores = tmp_path / "stores"
    first = step(stores, [dirs[0], dirs[1], dirs[3]])
    old_files = shard_files(first.store)
    second = step(stores, dirs)
    assert second.update.startswith(f"extended {first.name} by {PER_DIR} samples")
    assert set(old_files.values()) <= set(shard_files(second.store).values())  # linked, not copied
    keys = [r["cache_key"] for r in VinOfflineStoreReader(second.store).sample_index]
    assert keys == sorted(keys)  # cache_02's rows sit between cache_01's and cache_03's
    fresh = step(tmp_path / "fresh", dirs)
    assert fingerprint(second.store) == fingerprint(fresh.store)
    assert content(second.store) == content(fresh.store)


@pytest.mark.parametrize("base_first", [True, False])
def test_stores_of_cache_dirs_merged_equal_one_built_at_once(
    tmp_path: Path, dirs: list[CacheDir], base_first: bool
) -> None:
    """A store per part (two cache directories each), merged in either order, is the store built from
    all four at once: same shards, same sample index, same fingerprint (what lets a build write a
    store per cache directory as its parts arrive)."""
    fresh = step(tmp_path / "fresh", dirs)
    all_pairs = [p for d in dirs for p in d.pairs]
    parts = []
    for i, part in enumerate((dirs[:2], dirs[2:])):
        keys = {s.sample_key for d in part for s in d.samples}
        own = [p for d in part for p in d.pairs if {p.chosen_key, p.rejected_key} <= keys]
        parts.append(step(tmp_path / f"part{i}", part, pairs=own).store)
    base, side = parts if base_first else parts[::-1]
    out = tmp_path / "merged"
    merged = merge_vin_offline_stores(
        base, side, out, pairs=all_pairs, profile=PROFILE, inputs=inputs_of(dirs)
    )
    assert validate_vin_offline_store(out, deep=True, decode=True) == []
    assert merged["fingerprint"] == fingerprint(fresh.store)
    assert (out / "sample_index.jsonl").read_bytes() == (fresh.store / "sample_index.jsonl").read_bytes()
    assert {r: h for r, (_ino, h) in shard_files(out).items()} == {
        r: h for r, (_ino, h) in shard_files(fresh.store).items()
    }


def test_extension_of_an_extension(tmp_path: Path, dirs: list[CacheDir]) -> None:
    stores = tmp_path / "stores"
    step(stores, dirs[:2])
    b = step(stores, dirs[:3])
    c = step(stores, dirs)
    assert b.update.startswith("extended ") and c.update.startswith(f"extended {b.name} by {PER_DIR} samples")
    assert validate_vin_offline_store(c.store, deep=True, decode=True) == []
    assert content(c.store) == content(step(tmp_path / "fresh", dirs).store)


def _retask(s: SampleSpec) -> SampleSpec:
    return replace(s, task="another task")


@pytest.mark.parametrize(
    "change, reason",
    [
        ("remove_dir", "1 archives of the published store left the profile (archive/cache_02.tar)"),
        ("archive_sha", "1 archives of the published store changed sha256 (archive/cache_01.tar)"),
        ("old_task", "trajectory {k} of the published store changed (task)"),
        ("old_pair", "pair p01_train_0 of the published store changed"),
        ("old_actions", "the actions of 1 trajectories of the published store changed ({k})"),
        ("rows_per_shard", "the writer options changed"),
        ("same_samples", "no new trajectories, but inputs changed (kit/sidecars.tar)"),
        ("revision", "no new trajectories and the same kit and pins, but the source revision changed"),
    ],
)
def test_anything_but_an_addition_rebuilds_saying_why(
    tmp_path: Path, dirs: list[CacheDir], change: str, reason: str
) -> None:
    stores = tmp_path / "stores"
    first = step(stores, dirs[:3])
    old_files = shard_files(first.store)
    new_dirs = dirs if change != "remove_dir" else [dirs[0], dirs[1], dirs[3]]
    samples = [s for d in new_dirs for s in d.samples]
    pairs = [p for d in new_dirs for p in d.pairs]
    inputs = inputs_of(new_dirs)
    k = dirs[1].samples[1].sample_key
    kw: dict[str, Any] = {}
    if change == "archive_sha":
        inputs["archive/cache_01.tar"] = sha("cache_01 repacked")
    elif change == "old_task":
        samples = [_retask(s) if s.sample_key == k else s for s in samples]
    elif change == "old_pair":  # an old pair now points at another trajectory of the same split
        last_train = dirs[1].samples[6].sample_key  # p01_train_0 joins samples 0 and 3 (j % 3 == 0: train)
        pairs = [replace(p, rejected_key=last_train) if p.pair_id == "p01_train_0" else p for p in pairs]
    elif change == "old_actions":  # the sidecar archive changed, and with it one old trajectory's actions
        inputs = inputs_of(new_dirs, sidecar_tag="v2")
        s1 = dirs[1].samples[1]
        assert s1.sidecar_path is not None
        new_sidecar = tmp_path / "changed_sidecar.npz"
        with np.load(s1.sidecar_path) as z:
            np.savez_compressed(new_sidecar, aligned_actions=z["aligned_actions"] + 1.0)
        samples = [replace(s, sidecar_path=new_sidecar) if s.sample_key == k else s for s in samples]
    elif change == "rows_per_shard":
        kw["rows_per_shard"] = 4
    elif change == "same_samples":
        samples = [s for d in dirs[:3] for s in d.samples]
        pairs = [p for d in dirs[:3] for p in d.pairs]
        inputs = inputs_of(dirs[:3], sidecar_tag="v2")
    elif change == "revision":  # only the profile's [source] revision (QA: the reason said content)
        samples = [s for d in dirs[:3] for s in d.samples]
        pairs = [p for d in dirs[:3] for p in d.pairs]
        inputs = inputs_of(dirs[:3])
        kw["profile"] = {**PROFILE, "revision": "d" * 40}
    second = step(stores, new_dirs, inputs=inputs, samples=samples, pairs=pairs, **kw)
    assert second.update.startswith("rebuilt: " + reason.format(k=k)), second.update
    new_files = shard_files(second.store)
    assert not {ino for ino, _ in new_files.values()} & {ino for ino, _ in old_files.values()}
    assert validate_vin_offline_store(second.store, deep=True) == []


def test_new_actions_for_old_trajectories_unchanged_still_extend(
    tmp_path: Path, dirs: list[CacheDir]
) -> None:
    """The sidecar archive changes whenever a cache dir with actions is added: the old trajectories'
    actions are then read back and compared, and the extension goes ahead when they are equal."""
    stores = tmp_path / "stores"
    step(stores, dirs[:3])
    second = step(stores, dirs, inputs=inputs_of(dirs, sidecar_tag="v2"))
    assert second.update.startswith("extended "), second.update


# ----- the store step itself, on the demo ----------------------------------------------------------------
def _demo_without_a_cache_dir(demo_cache: Any, tmp_path: Path) -> tuple[Any, Any, Path]:
    """The demo downloaded and extracted with the library into ``tmp_path/root``, its sidecars
    unpacked; its profile, and the profile without one cache directory (with a kit whose pair
    manifest lacks the pairs that use it, and the totals to match), joined and byte-checked."""
    import shutil

    from stage2_data import layout
    from stage2_data.acquire import HubSource, download_profile
    from stage2_data.demo.hubserver import HubServer
    from stage2_data.extract import extract_cache_dir
    from stage2_data.profile import load_profile
    from stage2_data.steps.kit import step_join, step_sidecars, step_verify_bytes

    prof = load_profile(demo_cache.profile)
    root = tmp_path / "root"
    with HubServer(demo_cache.upstream, repo_id=demo_cache.repo_id, revision=demo_cache.revision) as hub:
        download_profile(prof, HubSource.from_profile(prof, endpoint=hub.url), root)
    for key, specs in prof.archives_by_cache_key().items():
        extract_cache_dir(key, [layout.archive_path(root, a.path) for a in specs], root)
    step_sidecars(prof, root)

    drop = "jesbu1_racer_rfm_racer_train"
    assert drop in prof.cache_keys()
    small_kit = tmp_path / "kit_small"
    shutil.copytree(prof.kit_root, small_kit)
    pm = small_kit / prof.kit.pair_manifest
    lines = pm.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if f"processed_datasets/{drop}/" not in ln]
    assert 0 < len(kept) < len(lines)
    pm.write_text("".join(kept))
    small = prof.model_copy(
        update={"archives": [a for a in prof.archives if a.cache_key != drop], "kit_root_dir": small_kit}
    )

    # the smaller profile expects the smaller kit's pairs and frame files (its checks must pass: the
    # store step publishes only what the join's and the byte check's checks passed)
    rows = [json.loads(ln) for ln in kept]
    frames = {r[k] for r in rows for k in ("chosen_frames_path", "rejected_frames_path")}
    expected = small.expected.model_copy(update={"pair_rows": len(rows), "unique_frame_files": len(frames)})
    small = small.model_copy(update={"expected": expected})
    step_join(small, root)
    step_verify_bytes(small, root)
    return prof, small, root


def test_store_step_extends_the_demo_store_when_its_profile_gains_a_cache_dir(
    demo_cache: Any, tmp_path: Path
) -> None:
    """The demo downloaded and extracted with the library; its profile without one cache directory
    (and a kit whose pair manifest lacks the pairs that use it) is built first, then the whole profile:
    the store step extends, the published store passes the deep check, and it equals in content the
    store the step builds from scratch."""
    from stage2_data import layout
    from stage2_data.steps.kit import step_join, step_verify_bytes
    from stage2_data.steps.store import step_store, verify_current_store

    prof, small, root = _demo_without_a_cache_dir(demo_cache, tmp_path)
    first = step_store(small, root)
    assert first.metadata["update"] == "rebuilt: no store is published for this profile"
    old = Path(first.metadata["store"])
    old_files = shard_files(old)

    step_join(prof, root)
    step_verify_bytes(prof, root)
    second = step_store(prof, root)
    assert second.ok, [c for c in second.checks if not c.passed]
    assert second.metadata["update"].startswith(f"extended {old.name} by "), second.metadata["update"]
    new = Path(second.metadata["store"])
    assert set(old_files.values()) <= set(shard_files(new).values())  # hard links, not rewritten
    assert verify_current_store(prof, root).passed
    ran = stage2("validate", str(layout.current_store_path(root, prof.name)), "--deep", "--decode")
    assert ran.returncode == 0, ran.tail()
    # a rerun: the same inputs, the extended store is reused
    assert (
        step_store(prof, root).metadata["update"]
        == f"reused {new.name} (same inputs; passed the publication gate)"
    )

    # the store the step builds from scratch for the whole profile
    aside = tmp_path / "extended"
    new.rename(aside)
    (layout.stores_root(root, prof.name) / layout.CURRENT_LINK).unlink()
    fresh = step_store(prof, root)
    assert fresh.metadata["update"] == "rebuilt: no store is published for this profile"
    assert Path(fresh.metadata["store"]).name == new.name
    assert content(aside) == content(Path(fresh.metadata["store"]))
    assert fingerprint(aside) == fingerprint(Path(fresh.metadata["store"]))


def test_a_damaged_published_store_is_moved_aside_once_its_rebuild_is_published(
    demo_cache: Any, tmp_path: Path
) -> None:
    """The store step about to extend the published store finds it damaged (a frames chunk's byte
    changed, size and mtime kept): it builds the store whole, and once that one is published moves
    the damaged one to the data root's quarantine, saying where. It stayed in the stores folder, and
    retention kept it as the previous store a user could return to (QA)."""
    import os

    from stage2_data import layout
    from stage2_data.steps.kit import step_join, step_verify_bytes
    from stage2_data.steps.store import step_store

    prof, small, root = _demo_without_a_cache_dir(demo_cache, tmp_path)
    old = Path(step_store(small, root).metadata["store"])
    m = json.loads((old / "manifest.json").read_text())
    sh = m["shards"][0]
    chunk = old / next(f["path"] for f in sh["files"] if f["path"].startswith(f"{sh['dir']}/frames/c/"))
    st = chunk.stat()
    os.chmod(chunk, 0o644)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.chmod(chunk, st.st_mode)

    step_join(prof, root)
    step_verify_bytes(prof, root)
    res = step_store(prof, root)
    assert res.ok, [c for c in res.checks if not c.passed]
    update = res.metadata["update"]
    assert update.startswith(f"rebuilt: the published store {old.name} does not validate"), update
    assert f"the store already at {old} was published but does not validate" in update, update
    assert "(a damaged store is never kept as a previous one)" in update, update
    stores = layout.stores_root(root, prof.name)
    assert sorted(p.name for p in stores.iterdir() if not p.name.startswith(".")) == [
        layout.CURRENT_LINK,
        Path(res.metadata["store"]).name,
    ]
    (aside,) = layout.quarantine_root(root).glob(f"*/{layout.STORES_DIR}/*/{old.name}")
    assert (aside / chunk.relative_to(old)).read_bytes() == bytes(data)
    assert f"{old} -> {aside}" in res.metadata["moved_aside"]


def test_retention_after_an_extension_leaves_the_extended_store_whole(
    tmp_path: Path, dirs: list[CacheDir]
) -> None:
    """An extended store hard-links its base's shards: removing the base (retention, once no reader
    holds it) frees only what the base alone had, and the extended store still validates, deep and
    decoded, and reads the same bytes. A reader of the base keeps it until it closes."""
    from stage2_data.store.retention import collect_stores

    stores = tmp_path / "stores"
    first = step(stores, dirs[:3])
    base_reader = VinOfflineStoreReader(stores / "current")  # pins the base and holds its lease
    base_content = content(first.store)
    second = step(stores, dirs)
    assert second.update.startswith(f"extended {first.name} ")
    linked = shard_files(first.store)
    assert {rel: shard_files(second.store)[rel] for rel in linked} == linked  # the same inodes
    extended = content(second.store)

    report = collect_stores(stores, keep=0)  # the base is leased: kept
    assert {e.name: e.action for e in report.entries}.get(first.name) == "kept"
    assert first.store.is_dir() and content(first.store) == base_content
    base_reader.close()

    report = collect_stores(stores, keep=0)
    gone = {e.name: e for e in report.entries}[first.name]
    assert gone.action == "removed" and not first.store.exists()
    assert gone.freed is not None and gone.bytes is not None and gone.freed < gone.bytes  # shared shards stay
    assert validate_vin_offline_store(second.store, deep=True, decode=True) == []
    assert content(second.store) == extended
    assert report.current == second.name


def test_a_published_store_unlike_the_ledger_is_not_extended(demo_cache: Any, tmp_path: Path) -> None:
    """The published store edited together with its manifest (consistently: it validates), then its
    profile gains a cache directory: its shards would go into the new store as they are, so the step
    extends only a store whose fingerprint is the one the data root's ledger recorded. This one's is
    not: the store is built whole, and once it is published the forged one is moved to quarantine.
    A published store the ledger does not name is not extended either, and is kept."""
    from helpers.forge import forge_store_consistently

    from stage2_data import layout
    from stage2_data.steps.kit import step_join, step_verify_bytes
    from stage2_data.steps.store import step_store

    prof, small, root = _demo_without_a_cache_dir(demo_cache, tmp_path)
    old = Path(step_store(small, root).metadata["store"])
    forged, forged_fp = forge_store_consistently(old)

    step_join(prof, root)
    step_verify_bytes(prof, root)
    res = step_store(prof, root)
    assert res.ok, [c for c in res.checks if not c.passed]
    update = res.metadata["update"]
    assert update.startswith(
        f"rebuilt: the published store {old.name} is not the one this data root published"
    ), update
    assert f"the store already at {old} is not the store this data root published under its name" in update, (
        update
    )
    assert forged_fp in update, update
    (aside,) = layout.quarantine_root(root).glob(f"*/{layout.STORES_DIR}/*/{old.name}")
    assert (aside / "sample_index.jsonl").read_bytes() == forged

    # no entry for the published store: built whole, the published store kept as the previous one
    prof2, small2, root2 = _demo_without_a_cache_dir(demo_cache, tmp_path / "second")
    old2 = Path(step_store(small2, root2).metadata["store"])
    (root2 / layout.REPORTS_DIR / "published_stores.json").unlink()
    step_join(prof2, root2)
    step_verify_bytes(prof2, root2)
    res2 = step_store(prof2, root2)
    assert res2.ok, [c for c in res2.checks if not c.passed]
    assert res2.metadata["update"] == (
        f"rebuilt: the published store {old2.name} is not in this data root's ledger of published stores"
    ), res2.metadata["update"]
    assert old2.is_dir() and Path(res2.metadata["store"]).name != old2.name
