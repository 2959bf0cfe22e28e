"""The loader's API edges (issue #28), on real stores on disk (tests/fixtures/stores.py: trajectories
of two resolutions, 8x10 and 6x12, the test split holding 8x10 only):

* ``Selection(resolutions=)`` takes (H, W) pairs and ``"HxW"`` strings; a malformed or unknown one
  is a LoaderError naming the resolutions the split (and the store) holds;
* ``state_dict()`` needs ``consumed=`` once the order has handed out items (a DataLoader and a
  PoolLoader take them ahead of the training loop), and the state resumes at what was consumed;
* an order built from a Selection saves its store's fingerprint and refuses to resume on a store of
  another fingerprint, or from a state without one;
* a batch names each field once: ``lengths`` / ``action_widths``, no ``num_frames`` / ``action_width``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_store import Upstream, build

from stage2_data.errors import LoaderError
from stage2_data.loader import (
    ARRAY_KEYS,
    ITEM_ALIASES,
    PoolLoader,
    ResolutionBatches,
    SeededOrder,
    Selection,
    collate,
)
from stage2_data.store.format import SAMPLE_INDEX_FIELDS


def first_frames(item: dict[str, Any]) -> dict[str, Any]:
    """A transform (module level, so it pickles): keep at most 4 frames and actions."""
    return item | {"frames": item["frames"][:4], "actions": item["actions"][:4]}


@pytest.fixture(scope="module")
def other_store(tmp_path_factory: pytest.TempPathFactory, up: Upstream) -> Path:
    """The same trajectories in shards of 4 rows, not 3: the same selections, another fingerprint."""
    out = tmp_path_factory.mktemp("other") / "store"
    build(out, up, rows_per_shard=4)
    return out


def _held(up: Upstream, split: str | None) -> dict[tuple[int, int], int]:
    held: dict[tuple[int, int], int] = {}
    for s in up.samples:
        if split is None or s.split == split:
            hw = up.frames[s.sample_key].shape[1:3]
            held[hw] = held.get(hw, 0) + 1
    return held


# ----- resolutions ---------------------------------------------------------------------------------
def test_resolutions_as_pairs_or_hxw_strings(store: Path, up: Upstream) -> None:
    want = sorted(s.sample_key for s in up.samples if up.frames[s.sample_key].shape[1:3] == (8, 10))
    for given in (
        [(8, 10)],
        ["8x10"],
        ["8X10"],
        [" 8 x 10 "],
        [[8, 10]],
        [(np.int64(8), np.int32(10))],
        {"8x10", (8, 10)},
        "8x10",  # one alone
        (8, 10),
    ):
        with Selection(store, resolutions=given) as sel:  # type: ignore[arg-type]
            assert sorted(sel.sample_keys) == want, given
            assert set(sel.resolutions) == {(8, 10)}
    with Selection(store, resolutions=["6x12", (8, 10)]) as both, Selection(store) as every:
        assert sorted(both.sample_keys) == sorted(every.sample_keys)


def test_a_bare_string_is_one_source_task_or_resolution(store: Path, up: Upstream) -> None:
    """``sources="racer"`` is ``sources=["racer"]`` (not the letters of "racer"); so for ``tasks=``,
    and for the per-position resolutions of a ResolutionBatches."""
    train = [s for s in up.samples if s.split == "train"]
    task = train[0].task
    for field, name in (("sources", "racer"), ("tasks", task)):
        want = sorted(s.sample_key for s in train if getattr(s, field[:-1]) == name)
        assert want
        with (
            Selection(store, "train", **{field: name}) as one,
            Selection(store, "train", **{field: [name]}) as listed,
        ):
            assert sorted(one.sample_keys) == sorted(listed.sample_keys) == want, field
    racer = next(s for s in train if s.source == "racer")
    h, w = up.frames[racer.sample_key].shape[1:3]
    with Selection(store, "train", sources="racer", tasks=racer.task, resolutions=f"{h}x{w}") as sel:
        assert racer.sample_key in sel.sample_keys
        assert set(sel.sources) == {"racer"} and set(sel.resolutions) == {(h, w)}
    with pytest.raises(LoaderError, match=r"has no source 'nobody'; it has 'autoeval', 'racer'"):
        Selection(store, "train", sources="nobody")
    order = ResolutionBatches("8x10", 4, seed=0)  # one position's resolution
    assert order.size == 1 and list(order) == [[0]]


@pytest.mark.parametrize(
    "given",
    [["48by64"], ["8x10x3"], ["8x"], [(0, 10)], [(8, -10)], [(8,)], [(8, 10, 3)], [("8", "10")], [8.0], 8],
    ids=["by", "three", "half", "zero", "negative", "one-int", "three-ints", "texts", "float", "int"],
)
def test_a_malformed_resolution_names_the_held_ones(store: Path, up: Upstream, given: Any) -> None:
    held = _held(up, "train")
    with pytest.raises(LoaderError) as err:
        Selection(store, "train", resolutions=given)
    msg = str(err.value)
    assert f"{store}: split train: resolution " in msg and "is neither (H, W) nor 'HxW'" in msg, msg
    assert f"the split holds 6x12 ({held[(6, 12)]} samples), 8x10 ({held[(8, 10)]} samples)" in msg, msg
    assert "Fix: give resolutions= as (H, W) pairs or 'HxW' strings" in msg


def test_an_unknown_resolution_names_the_held_ones(store: Path, up: Upstream) -> None:
    held = _held(up, None)
    with pytest.raises(LoaderError) as err:
        Selection(store, resolutions=["48x64", (8, 10)])
    assert str(err.value) == (
        f"{store}: split all has no resolution 48x64; it holds 6x12 ({held[(6, 12)]} samples), "
        f"8x10 ({held[(8, 10)]} samples). Fix: choose resolutions= among those the split holds "
        "(as (H, W) or 'HxW')"
    )
    # one the store holds but the split does not: both named
    assert set(_held(up, "test")) == {(8, 10)}  # (the fixture's test split)
    with pytest.raises(LoaderError) as err:
        Selection(store, "test", resolutions="6x12")
    assert (
        f"split test has no resolution 6x12; it holds 8x10 ({_held(up, 'test')[(8, 10)]} samples); "
        "the store as a whole: 6x12, 8x10." in str(err.value)
    )


# ----- consumed ------------------------------------------------------------------------------------
def _loader(kind: str, sel: Selection, order: ResolutionBatches) -> Any:
    if kind == "pool":
        return PoolLoader(sel, order, workers=2, context="fork")
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    return DataLoader(
        sel, batch_sampler=order, collate_fn=collate, num_workers=2, multiprocessing_context="fork"
    )


@pytest.mark.parametrize("kind", ["pool", "torch"])
def test_state_needs_consumed_once_the_loader_read_ahead(store: Path, kind: str) -> None:
    """A loader with two workers takes batches from the order ahead of the loop: after one batch
    consumed, ``state_dict()`` is refused (it would resume past the batches prefetched), the state
    of ``consumed=1`` resumes with the second batch, and a count beyond what was handed out is
    refused."""
    sel = Selection(store)
    order = ResolutionBatches(sel, 2, seed=9)
    want = list(ResolutionBatches(sel, 2, seed=9))
    assert len(want) > 4
    fresh = order.state_dict()  # nothing handed out yet: the order's own place
    assert (fresh["epoch"], fresh["start"]) == (0, 0)
    got = []
    for step, batch in enumerate(_loader(kind, sel, order)):
        got.append(list(batch["sample_key"]))
        with pytest.raises(LoaderError) as err:
            order.state_dict()
        msg = str(err.value)
        assert "state_dict() without consumed=, but the order has handed out" in msg
        assert "Fix: pass consumed= the number of batches your training loop has taken" in msg
        handed = int(msg.split("handed out ")[1].split(" ")[0])
        assert handed > step + 1  # the loader read ahead of the loop
        with pytest.raises(LoaderError, match=f"consumed={handed + 1}, but the order has handed out only"):
            order.state_dict(consumed=handed + 1)
        state = order.state_dict(consumed=step + 1)
        break
    assert state["start"] == 1
    resumed = ResolutionBatches(sel, 2, seed=9)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert resumed.state_dict() == state  # loaded, nothing handed out: the state as loaded
    rest = [list(b["sample_key"]) for b in _loader(kind, sel, resumed)]
    assert got + rest == [[sel.sample_keys[p] for p in b] for b in want]
    # the epoch's end: the whole epoch consumed is the start of the next one
    end = resumed.state_dict(consumed=len(want) - 1)
    assert (end["epoch"], end["start"]) == (1, 0)


def test_consumed_counts_from_the_iteration_under_way() -> None:
    """After a resume at batch 3, ``consumed`` counts from batch 3: the epoch's count (3 + k) is
    refused once it exceeds what the order handed out."""
    order = SeededOrder(10, seed=1, start=3)
    it = iter(order)
    taken = [next(it), next(it)]
    assert order.state_dict(consumed=2)["start"] == 5
    with pytest.raises(LoaderError, match=r"handed out only 2 samples of epoch 0 \(from item 3\)"):
        order.state_dict(consumed=5)
    assert taken == order.items(0)[3:5]
    with pytest.raises(
        LoaderError, match=r"a running sum of len\(batch\['sample_key'\]\), not \(step \+ 1\)"
    ):
        order.state_dict()
    order.set_epoch(4)  # placed: nothing handed out since
    assert order.state_dict() == {
        "kind": "samples",
        "seed": 1,
        "shuffle": True,
        "epoch": 4,
        "start": 0,
        "size": 10,
    }


# ----- the store's fingerprint -----------------------------------------------------------------------
def test_a_state_resumes_only_on_its_own_store(store: Path, other_store: Path) -> None:
    with Selection(store) as sel, Selection(other_store) as other:
        assert sel.fingerprint and other.fingerprint and sel.fingerprint != other.fingerprint
        assert sel.sample_keys == other.sample_keys  # the same selection: only the store differs
        order = ResolutionBatches(sel, 3, seed=2)
        it = iter(order)
        next(it), next(it)
        state = json.loads(json.dumps(order.state_dict(consumed=2)))
        assert state["fingerprint"] == sel.fingerprint

        elsewhere = ResolutionBatches(other, 3, seed=2)
        with pytest.raises(LoaderError) as err:
            elsewhere.load_state_dict(state)
        assert str(err.value).startswith(
            f"the saved order state was saved on the store of fingerprint {sel.fingerprint}; this "
            f"order reads {other.resolved} of fingerprint {other.fingerprint}: resuming would "
            "continue another store's order."
        )
        assert (elsewhere.epoch, elsewhere.start) == (0, 0)  # refused: unchanged

        with Selection(store) as again:  # the same store, opened anew: accepted
            same = ResolutionBatches(again, 3, seed=2)
            same.load_state_dict(state)
            assert (same.epoch, same.start) == (0, 2)
            assert list(same) == order.items(0)[2:]

        # a state without a fingerprint (saved before states held one): refused, with a fix that works
        old = {k: v for k, v in state.items() if k != "fingerprint"}
        fresh = ResolutionBatches(sel, 3, seed=2)
        with pytest.raises(LoaderError) as err:
            fresh.load_state_dict(old)
        msg = str(err.value)
        assert "the saved order state holds no store fingerprint" in msg
        assert f'add "fingerprint": "{sel.fingerprint}" to it and load it again' in msg
        fresh.load_state_dict(old | {"fingerprint": sel.fingerprint})
        assert (fresh.epoch, fresh.start) == (0, 2)

        # an order built from plain resolutions has no fingerprint: it refuses a state that has one
        plain = ResolutionBatches(sel.resolutions, 3, seed=2)
        with pytest.raises(LoaderError, match="Fix: build the order from the Selection"):
            plain.load_state_dict(state)
        plain.load_state_dict(old)  # plain to plain: as before
        named = ResolutionBatches(sel.resolutions, 3, seed=2, fingerprint=sel.fingerprint)
        named.load_state_dict(state)
        with pytest.raises(LoaderError, match="leave fingerprint= out"):
            ResolutionBatches(sel, 3, fingerprint=other.fingerprint)

        # the sampler too
        samples = SeededOrder(sel, seed=4)
        assert samples.size == len(sel) and samples.state_dict()["fingerprint"] == sel.fingerprint
        with pytest.raises(LoaderError, match=f"fingerprint {other.fingerprint}"):
            SeededOrder(other, seed=4).load_state_dict(samples.state_dict())
        with pytest.raises(LoaderError, match="fingerprint 7 is not a string"):
            samples.load_state_dict(samples.state_dict() | {"fingerprint": 7})


# ----- one name per batch field -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["pool", "torch"])
def test_a_batch_names_each_field_once(store: Path, kind: str) -> None:
    """The batch's fields: the collated arrays and the sample index's metadata, each once;
    ``lengths`` is the frames' length after the transform (4 at most), not the stored one."""
    sel = Selection(store, "train", transform=first_frames)
    batches = list(_loader(kind, sel, ResolutionBatches(sel, 3, seed=0)))
    stored = dict(zip(sel.sample_keys, sel.lengths.tolist(), strict=True))
    want_keys = set(ARRAY_KEYS) | set(SAMPLE_INDEX_FIELDS) - set(ITEM_ALIASES)
    assert ITEM_ALIASES == {"num_frames": "lengths", "action_width": "action_widths"}
    for batch in batches:
        assert set(batch) == want_keys
        assert [int(n) for n in batch["lengths"]] == [min(stored[k], 4) for k in batch["sample_key"]]
        assert np.asarray(batch["frames"]).shape[1] == max(np.asarray(batch["lengths"]))


# ----- indexing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dataset", "selection"])
def test_an_index_out_of_range_or_not_an_integer_is_named_as_given(store: Path, kind: str) -> None:
    """``ds[i]`` like a list: a negative index counts from the end; one out of range is named as it
    was given, with the range; a sample key (or any non-integer) is a TypeError that says positions
    are integers."""
    from stage2_data.store import VinOfflineDataset

    with VinOfflineDataset(store) if kind == "dataset" else Selection(store, None) as ds:
        n = len(ds)
        what = "a dataset" if kind == "dataset" else "a selection"
        assert ds[-1]["sample_key"] == ds[n - 1]["sample_key"]
        for i in (n, -n - 1, 10 * n):
            with pytest.raises(IndexError) as e:
                ds[i]
            assert (
                str(e.value)
                == f"index {i} out of range for {what} of {n} samples (0 to {n - 1}, or -{n} to -1)"
            )
        key = ds[0]["sample_key"]
        with pytest.raises(TypeError) as t:
            ds[key]
        assert (
            str(t.value)
            == f"{what} is indexed by a position (an integer from 0 to {n - 1}), not by str {key!r}"
        )


# ----- the orders' arguments ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("batch_size", 2.5, "batch_size=2.5 is not an integer"),
        ("batch_size", True, "batch_size=True is not an integer"),
        ("batch_size", "8", "batch_size='8' is not an integer"),
        ("batch_size", None, "batch_size=None is not an integer"),
        ("seed", None, "seed=None is not an integer"),
        ("seed", 1.0, "seed=1.0 is not an integer"),
        ("seed", -1, "seed=-1 is negative"),
        ("epoch", 0.5, "epoch=0.5 is not an integer"),
        ("start", "1", "start='1' is not an integer"),
        ("world_size", 2.0, "world_size=2.0 is not an integer"),
    ],
)
def test_an_orders_arguments_are_integers_named_when_not(name: str, value: Any, said: str) -> None:
    """A float, a bool, text or None where an order takes a count or a seed is a LoaderError that
    names the argument; it was taken silently (``batch_size=2.5`` gave batches of 2 and 1, ``True``
    batches of 1) or failed inside numpy with a TypeError."""
    given: dict[str, Any] = {"batch_size": 2, "seed": 0} | {name: value}
    with pytest.raises(LoaderError) as e:
        ResolutionBatches(["32x32"] * 5, **given)
    assert said in str(e.value), str(e.value)
    if name != "batch_size":
        with pytest.raises(LoaderError) as e:
            SeededOrder(5, **{name: value})
        assert said in str(e.value), str(e.value)
    order = SeededOrder(5, seed=np.int64(3))  # numpy's integers are integers
    with pytest.raises(LoaderError, match="epoch=1.5 is not an integer"):
        order.set_epoch(1.5)  # type: ignore[arg-type]


def test_a_store_path_under_home_is_expanded(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``VinOfflineDataset("~/stores/x", ...)`` in Python looked for a folder named ``~`` in the working
    folder (a shell expands ``~``; Python does not): expanded as the shell would."""
    from stage2_data.store import VinOfflineDataset

    home = tmp_path / "home"
    home.mkdir()
    (home / "mystore").symlink_to(store)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    ds = VinOfflineDataset("~/mystore", split="train")
    assert len(ds) == len(VinOfflineDataset(store, split="train"))
