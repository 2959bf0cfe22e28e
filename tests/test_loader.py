"""The store from the trainer's side (stage2_data.loader): selection, seeded resumable orders, the
padding collate, and batches loaded by worker processes (a multiprocessing pool under fork and spawn
always; a torch DataLoader under fork and spawn when torch is importable). A real store on disk, built
from real npz files of two resolutions, lengths 1..32, action widths 7 and 9 and none."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_store import Upstream

from stage2_data.errors import LoaderError, MixedResolutionError
from stage2_data.loader import PoolLoader, ResolutionBatches, SeededOrder, Selection, collate, permutation
from stage2_data.loader.select import DeferredFrames

# the shared store (tests/fixtures/stores.py): 30 trajectories in shards of 4 rows
STORE_IDS = range(1, 31)
STORE_ROWS_PER_SHARD = 4


def first_frames(item: dict[str, Any]) -> dict[str, Any]:
    """A transform (module level, so it pickles under spawn): keep at most 4 frames and actions."""
    return item | {"frames": item["frames"][:4], "actions": item["actions"][:4]}


def _check_batch(batch: dict[str, Any], up: Upstream, keys: list[str], *, max_t: int | None = None) -> None:
    """Every padded array of ``batch`` against the upstream npz content of ``keys``, in order."""
    assert list(batch["sample_key"]) == keys
    want_frames = [up.frames[k][:max_t] for k in keys]
    want_actions = [up.actions[k] for k in keys]
    t = max(len(f) for f in want_frames)
    frames = np.asarray(batch["frames"])
    assert frames.shape == (len(keys), t, *want_frames[0].shape[1:]) and frames.dtype == np.uint8
    widths = [0 if a is None else a.shape[1] for a in want_actions]
    actions = np.asarray(batch["actions"])
    assert actions.shape == (len(keys), t, max(widths)) and actions.dtype == np.float32
    assert np.isfinite(actions).all()  # padding is 0.0, never NaN
    assert np.asarray(batch["lengths"]).tolist() == [len(f) for f in want_frames]
    assert np.asarray(batch["action_widths"]).tolist() == widths
    for b, (f, a) in enumerate(zip(want_frames, want_actions, strict=True)):
        n = len(f)
        assert np.array_equal(frames[b, :n], f)
        assert not frames[b, n:].any()
        assert np.asarray(batch["frame_mask"])[b].tolist() == [True] * n + [False] * (t - n)
        mask = np.asarray(batch["action_mask"])[b]
        assert mask.sum() == n * widths[b] and mask[:n, : widths[b]].all()
        if a is not None:
            assert np.array_equal(actions[b, :n, : widths[b]], a[:n].astype(np.float32))
        assert not actions[b][~mask].any()


# ----- selection ---------------------------------------------------------------------------------------
def test_selection_by_split_source_task_and_resolution(store: Path, up: Upstream) -> None:
    with Selection(store, "train", sources=["racer"]) as sel:
        want = sorted(s.sample_key for s in up.samples if s.split == "train" and s.source == "racer")
        assert sorted(sel.sample_keys) == want and len(sel) == len(want)
        assert [sel[i]["sample_key"] for i in range(len(sel))] == sel.sample_keys
        assert set(sel.sources) == {"racer"}
        assert sel.lengths.tolist() == [len(up.frames[k]) for k in sel.sample_keys]
        assert sel.resolutions == [up.frames[k].shape[1:3] for k in sel.sample_keys]
        assert sel[-1]["sample_key"] == sel.sample_keys[-1]
        with pytest.raises(IndexError):
            sel[len(sel)]
    every = Selection(store)
    assert len(every) == len(up.samples)
    one_res = Selection(store, resolutions=[(6, 12)], tasks=["task 0"])
    assert set(one_res.resolutions) == {(6, 12)}
    assert sorted(one_res.sample_keys) == sorted(
        s.sample_key
        for s in up.samples
        if up.frames[s.sample_key].shape[1:3] == (6, 12) and s.task == "task 0"
    )
    with pytest.raises(LoaderError, match=r"no source 'nope'; it has 'autoeval', 'racer'"):
        Selection(store, "val", sources=["nope"])
    with pytest.raises(LoaderError, match=r"split test has no resolution 1x1; it holds .*8x10"):
        Selection(store, "test", resolutions=[(1, 1)])
    with pytest.raises(LoaderError, match="no sample of split all matches"):
        Selection(store, resolutions=[(6, 12)], tasks=["task 1"])  # each held, not together


# ----- collate -----------------------------------------------------------------------------------------
def test_collate_pads_frames_and_actions_with_masks(store: Path, up: Upstream) -> None:
    sel = Selection(store, resolutions=[(8, 10)])
    items = [sel[i] for i in range(len(sel))]
    assert len({len(it["frames"]) for it in items}) > 1  # lengths differ
    assert {it["action_width"] for it in items} >= {0, 7, 9}  # no actions, and two widths
    batch = collate(items, to_torch=False)
    _check_batch(batch, up, sel.sample_keys)
    # one name per field: the items' num_frames / action_width are the batch's lengths / action_widths
    assert "num_frames" not in batch and "action_width" not in batch
    assert batch["lengths"].tolist() == [it["num_frames"] for it in items]
    assert batch["action_widths"].tolist() == [it["action_width"] for it in items]
    # metadata: ints and bools as arrays, the rest (strings, None) as lists
    assert batch["sample_index"].dtype == np.int64 and batch["is_robot"].dtype == bool
    assert batch["source"] == [it["source"] for it in items]
    assert None in batch["partial_success"] and isinstance(batch["partial_success"], list)


def test_deferred_frames_collate_straight_into_the_batch(store: Path, up: Upstream) -> None:
    """Selection.item(i, defer_frames=True): the same item, its frames decoded later (by collate,
    into their slot of the batch, or by np.asarray); a batch of them, or of them mixed with decoded
    items, is the batch of decoded items."""
    sel = Selection(store, resolutions=[(8, 10)])
    plain = [sel[i] for i in range(len(sel))]
    deferred = [sel.item(i, defer_frames=True) for i in range(len(sel))]
    for p, d in zip(plain, deferred, strict=True):
        assert isinstance(d["frames"], DeferredFrames) and d["frames"].shape == p["frames"].shape
        assert d.keys() == p.keys() and np.array_equal(np.asarray(d["frames"]), p["frames"])
        assert all(np.array_equal(d[k], p[k]) for k in ("actions", "num_frames", "sample_key"))
    want = collate(plain, to_torch=False)
    mixed = [d if k % 2 else p for k, (p, d) in enumerate(zip(plain, deferred, strict=True))]
    for items, ref in ((deferred, want), (mixed, want), (deferred[::-1], collate(plain[::-1]))):
        got = collate(items, to_torch=False)
        assert got.keys() == ref.keys()
        for k, v in got.items():
            same = np.array_equal(v, ref[k]) if isinstance(v, np.ndarray) else v == ref[k]
            assert same, k
    _check_batch(collate(deferred, to_torch=False), up, sel.sample_keys)
    with pytest.raises(MixedResolutionError):  # shapes come from the index: refused before decoding
        collate([deferred[0], Selection(store, resolutions=[(6, 12)]).item(0, defer_frames=True)])
    # a transform needs the frames: with one, the item is decoded as sel[i]
    assert isinstance(
        Selection(store, transform=first_frames).item(0, defer_frames=True)["frames"], np.ndarray
    )


def test_collate_refuses_a_batch_of_two_resolutions(store: Path) -> None:
    sel = Selection(store)
    a = next(i for i in range(len(sel)) if sel.resolutions[i] == (8, 10))
    b = next(i for i in range(len(sel)) if sel.resolutions[i] == (6, 12))
    with pytest.raises(MixedResolutionError) as err:
        collate([sel[a], sel[b]])
    msg = str(err.value)
    assert "8x10x3: 1" in msg and "6x12x3: 1" in msg and sel.sample_keys[a] in msg
    assert "ResolutionBatches" in msg  # the fix names the batch sampler
    with pytest.raises(LoaderError, match="empty batch"):
        collate([])


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_collate_to_torch_without_torch_is_a_named_error(store: Path) -> None:
    sel = Selection(store, "val")
    with pytest.raises(LoaderError, match="needs torch, which is not installed"):
        collate([sel[0]], to_torch=True)


# ----- orders ------------------------------------------------------------------------------------------
def test_seeded_order_is_deterministic_advances_and_resumes_mid_epoch() -> None:
    order = SeededOrder(50, seed=7)
    e0 = list(order)
    e1 = list(order)  # the next epoch by itself
    assert sorted(e0) == sorted(e1) == list(range(50)) and e0 != e1
    assert e0 == permutation(50, 7, 0).tolist() == list(SeededOrder(50, seed=7))
    assert e0 != list(SeededOrder(50, seed=8))
    assert list(SeededOrder(5, shuffle=False)) == [0, 1, 2, 3, 4]
    # stop after 13 samples of epoch 2 (the order itself ran ahead, as a prefetching loader does)
    it = iter(order)
    taken = [next(it) for _ in range(20)]
    state = order.state_dict(consumed=13)
    assert state == {"kind": "samples", "seed": 7, "shuffle": True, "epoch": 2, "start": 13, "size": 50}
    with pytest.raises(LoaderError, match="without consumed=, but the order has handed out 20 samples"):
        order.state_dict()  # what it handed out is not what was trained on
    resumed = SeededOrder(50, seed=7)
    resumed.load_state_dict(state)
    assert len(resumed) == 37
    rest = list(resumed)
    assert taken[:13] + rest == permutation(50, 7, 2).tolist()
    assert resumed.epoch == 3 and list(resumed) == permutation(50, 7, 3).tolist()
    # a whole epoch consumed is the start of the next one
    whole = SeededOrder(4, seed=1)
    list(whole)
    assert whole.state_dict(consumed=4)["epoch"] == 1 and whole.state_dict(consumed=4)["start"] == 0
    with pytest.raises(LoaderError, match="consumed=5, but the order has handed out only 4 samples"):
        whole.state_dict(consumed=5)
    with pytest.raises(LoaderError, match="size: saved 50, here 49"):
        SeededOrder(49, seed=7).load_state_dict(state)
    with pytest.raises(LoaderError, match="seed: saved 7, here 1"):
        SeededOrder(50, seed=1).load_state_dict(state)


def test_resolution_batches_one_resolution_each_and_resumable() -> None:
    res = [(8, 10) if i % 3 else (6, 12) for i in range(23)]
    order = ResolutionBatches(res, 4, seed=3)
    epoch0 = list(order)
    assert sorted(p for b in epoch0 for p in b) == list(range(23))  # every position once
    assert all(len({res[p] for p in b}) == 1 for b in epoch0)  # one resolution a batch
    assert all(1 <= len(b) <= 4 for b in epoch0)
    seq = [res[b[0]] for b in epoch0]  # resolutions mixed across batches, not one after the other
    assert seq != sorted(seq) and seq != sorted(seq, reverse=True)
    assert epoch0 == list(ResolutionBatches(res, 4, seed=3)) != list(order)  # seeded; epochs differ
    dropped = list(ResolutionBatches(res, 4, seed=3, drop_last=True))
    assert all(len(b) == 4 for b in dropped) and len(dropped) == 7 // 4 + 16 // 4
    # a batch_size no resolution fills: drop_last would drop every batch (an empty epoch, silently;
    # QA, stop 56); refused, naming the largest group
    assert len(list(ResolutionBatches(res, 15, drop_last=True))) == 1  # 8x10 has 15 positions
    with pytest.raises(LoaderError, match=r"largest resolution group \(8x10\) has 15 positions") as ei:
        ResolutionBatches(res, 16, drop_last=True)
    assert ei.value.fix is not None and "batch_size <= 15" in ei.value.fix
    assert len(list(ResolutionBatches(res, 16))) == 2  # without drop_last: one batch a resolution
    assert list(ResolutionBatches(res, 4, shuffle=False))[0] == [0, 3, 6, 9]
    # resume after 2 batches of epoch 0
    again = ResolutionBatches(res, 4, seed=3)
    it = iter(again)
    first = [next(it), next(it), next(it)]
    state = again.state_dict(consumed=2)
    assert (
        state["start"] == 2 and state["kind"] == "batches" and state["resolutions"] == {"6x12": 8, "8x10": 15}
    )
    resumed = ResolutionBatches(res, 4, seed=3)
    resumed.load_state_dict(state)
    assert first[:2] + list(resumed) == epoch0
    with pytest.raises(LoaderError, match="batch_size: saved 4, here 5"):
        ResolutionBatches(res, 5, seed=3).load_state_dict(state)
    with pytest.raises(LoaderError, match="kind: saved 'batches', here 'samples'"):
        SeededOrder(23, seed=3).load_state_dict(state)


@pytest.mark.parametrize("size", [0, 2, 10, 23])
def test_orders_share_an_epoch_out_across_ranks(size: int) -> None:
    """With world_size > 1 every rank walks the same epoch permutation and takes every world_size-th
    item of it, padded by its first items: equal shares that cover the epoch, disjoint but for the
    padding, new each epoch, and a state that resumes only on its own rank."""
    ws = 3
    ranks = [SeededOrder(size, seed=5, rank=r, world_size=ws) for r in range(ws)]
    for epoch in range(2):
        whole = SeededOrder(size, seed=5, epoch=epoch).items(epoch)
        shares = [list(o) for o in ranks]
        per = -(-size // ws)
        assert [len(sh) for sh in shares] == [per] * ws  # no rank waits for another
        assert sorted(p for sh in shares for p in sh) == sorted(whole + whole[: per * ws - size])
        assert [shares[i % ws][i // ws] for i in range(size)] == whole  # interleaved, in epoch order
    if size > ws:
        with pytest.raises(LoaderError, match="rank: saved 1, here 0"):
            SeededOrder(size, seed=5, rank=0, world_size=ws).load_state_dict(
                SeededOrder(size, seed=5, rank=1, world_size=ws).state_dict()
            )
        with pytest.raises(LoaderError, match="world_size: saved 3, here 1"):
            SeededOrder(size, seed=5).load_state_dict(ranks[0].state_dict(consumed=0))
        mid = SeededOrder(size, seed=5, rank=1, world_size=ws)
        it = iter(mid)
        next(it)
        back = SeededOrder(size, seed=5, rank=1, world_size=ws)
        back.load_state_dict(mid.state_dict(consumed=1))
        assert list(back) == mid.items(0)[1:]
    res = [(8, 10) if i % 3 else (6, 12) for i in range(size)]
    batches = [list(ResolutionBatches(res, 4, seed=3, rank=r, world_size=ws)) for r in range(ws)]
    every = ResolutionBatches(res, 4, seed=3).items(0)
    assert len({len(b) for b in batches}) == 1
    assert {tuple(b) for share in batches for b in share} == {tuple(b) for b in every}
    with pytest.raises(LoaderError, match="0 <= rank < world_size"):
        SeededOrder(size, rank=3, world_size=3)


# ----- worker processes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_pool_loader_two_workers(store: Path, up: Upstream, context: str) -> None:
    """Two worker processes (fork and spawn: the reader is pickled, re-pins its store and takes its
    own lease there), with a transform; stopped after two batches and resumed from the order's state."""
    sel = Selection(store, "train", transform=first_frames)
    order = ResolutionBatches(sel.resolutions, 3, seed=11)
    want = list(ResolutionBatches(sel.resolutions, 3, seed=11))
    loader = PoolLoader(sel, order, workers=2, context=context)
    got = []
    for batch in loader:
        got.append(batch)
        if len(got) == 2:
            break
    state = order.state_dict(consumed=2)
    resumed = ResolutionBatches(sel.resolutions, 3, seed=11)
    resumed.load_state_dict(state)
    got += list(PoolLoader(sel, resumed, workers=2, context=context))
    assert len(got) == len(want)
    for batch, positions in zip(got, want, strict=True):
        assert isinstance(batch["frames"], np.ndarray)
        _check_batch(batch, up, [sel.sample_keys[p] for p in positions], max_t=4)
    # in this process (workers=0) the same batches
    inline = list(PoolLoader(sel, ResolutionBatches(sel.resolutions, 3, seed=11), workers=0))
    assert all(np.array_equal(a["frames"], b["frames"]) for a, b in zip(inline, got, strict=True))


def test_pool_loader_persistent_workers_serve_every_epoch(store: Path, up: Upstream) -> None:
    """persistent_workers: one pool and one /dev/shm folder for every epoch (an abandoned one too)
    until close(); each epoch's batches are right; close() ends the workers and removes the folder."""
    sel = Selection(store, "train")
    order = ResolutionBatches(sel.resolutions, 2, seed=4)
    ref = ResolutionBatches(sel.resolutions, 2, seed=4)
    with PoolLoader(sel, order, workers=2, context="fork", persistent_workers=True) as loader:
        epochs = [list(loader)]
        pool, folder = loader._pool, loader._folder
        assert pool is not None
        pids = set(pool._processes)
        epochs.append(list(loader))
        it = iter(loader)
        first = next(it)
        _check_batch(first, up, list(first["sample_key"]))
        it.close()  # left early: the workers stay
        epochs.append(list(loader))
        assert loader._pool is pool and set(pool._processes) == pids and loader._folder == folder
    assert loader._pool is None and (folder is None or not Path(folder).exists())
    for batches in epochs:
        assert sorted(k for b in batches for k in b["sample_key"]) == sorted(sel.sample_keys)
        for batch in batches:
            _check_batch(batch, up, list(batch["sample_key"]))  # still right: their files were not reused
    assert [list(b["sample_key"]) for b in epochs[0]] == [[sel.sample_keys[p] for p in b] for b in ref]


def test_pool_loader_reports_a_failing_batch(store: Path) -> None:
    sel = Selection(store, "train")
    with pytest.raises(MixedResolutionError):
        list(PoolLoader(sel, [list(range(len(sel)))], workers=2, context="fork"))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_dataloader_two_workers(store: Path, up: Upstream, context: str) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    sel = Selection(store, split="train", sources=["racer", "autoeval"])
    order = ResolutionBatches(sel.resolutions, 4, seed=5)
    want = list(ResolutionBatches(sel.resolutions, 4, seed=5))
    loader = DataLoader(
        sel, batch_sampler=order, collate_fn=collate, num_workers=2, multiprocessing_context=context
    )
    got = list(loader)
    assert len(got) == len(want)
    for batch, positions in zip(got, want, strict=True):
        assert isinstance(batch["frames"], torch.Tensor) and batch["frames"].dtype == torch.uint8
        assert batch["frame_mask"].dtype == torch.bool and isinstance(batch["sample_key"], list)
        _check_batch(
            {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in batch.items()},
            up,
            [sel.sample_keys[p] for p in positions],
        )
    # the sampler path: fixed batch size over one resolution, seeded order
    one = Selection(store, resolutions=[(8, 10)])
    batches = list(DataLoader(one, batch_size=4, sampler=SeededOrder(len(one), seed=2), collate_fn=collate))
    keys = [k for b in batches for k in b["sample_key"]]
    assert keys == [one.sample_keys[p] for p in permutation(len(one), 2, 0)]


def _root_base(a: np.ndarray) -> Any:
    """What owns an array's memory (an mmap for a batch received through /dev/shm)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_pool_loader_batches_arrive_in_shared_memory_and_leave_nothing(store: Path, up: Upstream) -> None:
    import mmap
    import os

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm here")
    mine = f"stage2-loader-{os.getpid()}-"
    sel = Selection(store, "val")
    batches = [list(range(i, min(i + 2, len(sel)))) for i in range(0, len(sel), 2)]
    batches = [b for b in batches if len({sel.resolutions[p] for p in b}) == 1]
    shared = list(PoolLoader(sel, batches, workers=2, context="fork"))
    pickled = list(PoolLoader(sel, batches, workers=2, context="fork", shared_memory=False))
    assert any(isinstance(_root_base(b["frames"]), mmap.mmap) for b in shared)  # mapped, not pickled
    assert not any(isinstance(_root_base(b["frames"]), mmap.mmap) for b in pickled)
    for a, b, positions in zip(shared, pickled, batches, strict=True):
        assert all(
            np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in ("frames", "actions", "lengths")
        )
        _check_batch(a, up, [sel.sample_keys[p] for p in positions])
    abandoned = iter(PoolLoader(sel, batches, workers=2, context="fork"))
    next(abandoned)
    abandoned.close()  # a loop left early: the pool and its folder go
    assert not [p.name for p in shm.iterdir() if p.name.startswith(mine)]


def test_pool_loader_reuses_released_shared_files_without_touching_held_batches(
    store: Path, up: Upstream
) -> None:
    import os

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm here")
    sel = Selection(store)
    by_res: dict[tuple[int, int], list[int]] = {}
    for p, r in enumerate(sel.resolutions):
        by_res.setdefault(r, []).append(p)
    batches = [ps[i : i + 2] for ps in by_res.values() for i in range(0, len(ps), 2)] * 3
    mine = f"stage2-loader-{os.getpid()}-"
    held, files_seen, through_shm = [], set(), 0
    for k, batch in enumerate(PoolLoader(sel, batches, workers=2, context="fork")):
        keys = [sel.sample_keys[p] for p in batches[k]]
        _check_batch(batch, up, keys)  # right on arrival
        through_shm += sum(batch[a].nbytes >= 4096 for a in ("frames", "actions"))
        if k % 9 == 0:
            held.append((batch, keys))  # kept: its files must not be reused
        del batch  # released: its files go back to the workers
        for folder in shm.iterdir():
            if folder.name.startswith(mine):
                files_seen |= {f.name for f in folder.iterdir() if f.name.startswith("batch-")}
    for batch, keys in held:
        _check_batch(batch, up, keys)  # unchanged after every later batch
    assert 0 < len(files_seen) < through_shm / 2, (files_seen, through_shm)  # files were reused


def test_selection_refuses_an_unknown_split_by_name(store: Path) -> None:
    for bogus in ("bogus", "Train", 1):
        with pytest.raises(
            LoaderError, match=r"split .* is not a split of a store; the splits are: train, val, test"
        ):
            Selection(store, split=bogus)  # type: ignore[arg-type]
    with Selection(store, split="all") as every, Selection(store) as default:
        assert len(every) == len(default)


@pytest.mark.parametrize(
    ("make", "state", "message"),
    [
        (lambda: SeededOrder(10), None, "the saved order state is NoneType None, not a dict"),
        (lambda: SeededOrder(10), [0, 1], "the saved order state is list"),
        (lambda: SeededOrder(10), {"kind": "samples"}, "has no 'seed', 'shuffle', 'epoch', 'start'"),
        (lambda: SeededOrder(10), {"epoch": "x"}, "epoch='x' is not an integer"),
        (lambda: SeededOrder(10), {"epoch": 0.5}, "epoch=0.5 is not an integer"),
        (lambda: SeededOrder(10), {"start": None}, "start=None is not an integer"),
        (lambda: SeededOrder(10), {"start": 11}, "start 11 is past the end of epoch 0 \\(10 samples\\)"),
        (lambda: SeededOrder(10), {"epoch": -1}, "epoch -1 and start 0: both must be >= 0"),
        (
            lambda: ResolutionBatches([(2, 2)] * 6, 2),
            {"start": 4},
            "start 4 is past the end of epoch 0 \\(3 batches\\)",
        ),
    ],
    ids=[
        "none",
        "list",
        "missing-keys",
        "epoch-text",
        "epoch-float",
        "start-none",
        "start-past-end",
        "epoch-negative",
        "batches-past-end",
    ],
)
def test_a_malformed_resume_state_is_a_named_error(make: Any, state: Any, message: str) -> None:
    order = make()
    if isinstance(state, dict) and "kind" not in state:
        state = order.state_dict() | state  # a real state with one value broken
    before = (order.epoch, order.start)
    with pytest.raises(LoaderError, match=message):
        order.load_state_dict(state)
    assert (order.epoch, order.start) == before  # refused: the order is where it was
    for consumed in ("3", 1.5, True):
        with pytest.raises(LoaderError, match="consumed=.* is not an integer"):
            order.state_dict(consumed=consumed)
