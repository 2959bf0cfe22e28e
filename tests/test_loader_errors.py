"""The loader's mistakes are named errors whose fix works as written, on a real store on disk
(tests/fixtures/stores.py: trajectories of two resolutions, 8x10 and 6x12):

* a batch of two resolutions (a ``VinOfflineDataset`` batched by a plain ``batch_size``) is a
  ``MixedResolutionError`` whose fix is Python that runs as written once ``STORE`` is the store's
  path (it used to say ``ResolutionBatches(ds.resolutions, ...)``: a dataset has no such attribute);
* a ``PoolLoader`` under spawn or forkserver of what does not pickle (a lambda transform or
  collate_fn, a local function, a dataset holding a lock) is a ``LoaderError`` naming it, raised
  before any worker starts (it used to be pickle's own ``PicklingError``), and its fix
  (``context="fork"``, or a module-level function) loads the batches.

Runs without torch; with torch installed the fix's ``DataLoader`` is torch's own.
"""

from __future__ import annotations

import importlib.util
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stage2_data.errors import LoaderError, MixedResolutionError
from stage2_data.loader import PoolLoader, ResolutionBatches, Selection, collate, numpy_collate
from stage2_data.store import VinOfflineDataset


def keep_all(sample: dict[str, Any]) -> dict[str, Any]:
    """A transform defined at module level (what the fix asks for): picklable."""
    return sample


# lambdas at module level: pickle refuses them by name (PicklingError), unlike local functions
# (AttributeError up to Python 3.13)
KEEP_ALL = lambda sample: sample  # noqa: E731
COLLATE = lambda items: collate(items)  # noqa: E731


# ----- a batch of two resolutions ---------------------------------------------------------------------
def _mixed_batch_error(ds: VinOfflineDataset, batch_size: int) -> MixedResolutionError:
    """What ``DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate)`` raises on the first
    batch holding both resolutions (the dataset's positions shuffled, batched by a plain size)."""
    positions = np.random.default_rng(0).permutation(len(ds)).tolist()
    for i in range(0, len(positions), batch_size):
        try:
            collate([ds[p] for p in positions[i : i + batch_size]])
        except MixedResolutionError as e:
            return e
    raise AssertionError("no batch held two resolutions")


@pytest.mark.parametrize("split", ["train", None])
def test_a_mixed_resolution_batchs_fix_runs_as_written(store: Path, split: str | None) -> None:
    with VinOfflineDataset(store, split=split) as ds:
        err = _mixed_batch_error(ds, 8)
    assert err.fix is not None
    code = re.findall(r"`([^`]+)`", err.fix)
    # two runnable snippets, between backticks: with torch's DataLoader, and with the PoolLoader
    assert len(code) == 2 and "torch" in code[0] and "PoolLoader" in code[1], err.fix
    assert "ds.resolutions" not in err.fix and all("STORE" in c for c in code)
    for snippet in code:
        if "torch" in snippet and importlib.util.find_spec("torch") is None:
            continue  # (the same code with the PoolLoader runs below)
        ns: dict[str, Any] = {}
        exec(snippet.replace("STORE", repr(str(store))), ns)  # as the user pastes it, their path in
        _loads_every_sample_once(ns, split, err, store)


def _loads_every_sample_once(
    ns: dict[str, Any], split: str | None, err: MixedResolutionError, store: Path
) -> None:
    sel = ns["train" if split == "train" else "sel"]
    try:
        assert isinstance(sel, Selection) and sel.split == split
        seen: list[str] = []
        for batch in ns["loader"]:  # every batch of one resolution: no MixedResolutionError
            frames = np.asarray(batch["frames"])
            assert frames.shape[0] == len(batch["sample_key"]) <= 8
            seen += list(batch["sample_key"])
        assert sorted(seen) == sorted(sel.sample_keys)  # the whole split, each sample once
        # the other way it names: a selection of one resolution, batched by a plain size
        one = re.search(r"Selection\(STORE, [^()]*resolutions=[^()]*\)", err.fix)
        assert one is not None, err.fix
        with eval(one[0].replace("STORE", repr(str(store))), {"Selection": Selection}) as single:
            assert len(set(single.resolutions)) == 1
            collate([single[i] for i in range(min(8, len(single)))])
    finally:
        sel.close()


# ----- what does not pickle, under spawn and forkserver ---------------------------------------------------
class _LockedSamples:
    """A dataset holding a lock: it does not pickle (TypeError)."""

    def __init__(self, sel: Selection) -> None:
        self.sel = sel
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.sel)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.sel[i]


class _RefusingSamples(_LockedSamples):
    """A dataset whose own ``__reduce__`` refuses with an error of its own (not pickle's)."""

    def __reduce__(self) -> Any:
        raise ValueError("this dataset refuses to be copied")


def _local_transform() -> Any:
    def local(sample: dict[str, Any]) -> dict[str, Any]:
        return sample

    return local


def _unpicklable(kind: str, store: Path) -> tuple[Any, dict[str, Any], str]:
    """A dataset, the PoolLoader's other arguments, and the name the error must give."""
    if kind == "lambda transform":
        return Selection(store, "train", transform=KEEP_ALL), {}, "transform <lambda> of the Selection"
    if kind == "local transform":
        return (
            Selection(store, "train", transform=_local_transform()),
            {},
            "transform _local_transform.<locals>.local of the Selection",
        )
    if kind == "lambda collate_fn":
        return Selection(store, "train"), {"collate_fn": COLLATE}, "collate_fn <lambda>"
    if kind == "refusing dataset":
        return _RefusingSamples(Selection(store, "train")), {}, "the dataset (_RefusingSamples)"
    return _LockedSamples(Selection(store, "train")), {}, "the dataset (_LockedSamples)"


def _batches(sel: Selection) -> list[list[int]]:
    return list(ResolutionBatches(sel, batch_size=4, seed=0))


def _keys(batches: Sequence[dict[str, Any]]) -> list[str]:
    return sorted(k for b in batches for k in b["sample_key"])


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
@pytest.mark.parametrize(
    "kind", ["lambda transform", "local transform", "lambda collate_fn", "locked dataset", "refusing dataset"]
)
def test_what_does_not_pickle_is_named_before_a_worker_starts(store: Path, context: str, kind: str) -> None:
    dataset, kwargs, named = _unpicklable(kind, store)
    sel = dataset.sel if isinstance(dataset, _LockedSamples) else dataset
    try:
        loader = PoolLoader(dataset, _batches(sel), workers=2, context=context, **kwargs)
        with pytest.raises(LoaderError) as err:
            next(iter(loader))
        assert type(err.value) is LoaderError  # named, not pickle's PicklingError / AttributeError
        msg, fix = str(err.value), err.value.fix or ""
        assert named in msg and "cannot be pickled" in msg and context in msg, msg
        assert 'context="fork"' in fix, fix
        if kind not in ("locked dataset", "refusing dataset"):
            assert "at the top level of a module" in fix and "not as a lambda" in fix, fix
        assert loader._pool is None and loader._shipped is None and loader._folder is None  # no worker
    finally:
        sel.close()


def test_the_fixes_of_an_unpicklable_transform_work(store: Path) -> None:
    """Its fix, either way: context="fork" (the lambda inherited, not pickled), or the transform
    defined at module level (pickled to the spawned workers)."""
    with Selection(store, "train") as plain:
        want = _keys(list(PoolLoader(plain, _batches(plain), workers=0)))
    with Selection(store, "train", transform=KEEP_ALL) as sel:
        assert _keys(list(PoolLoader(sel, _batches(sel), workers=2, context="fork"))) == want
    with Selection(store, "train", transform=keep_all) as sel:
        got = list(PoolLoader(sel, _batches(sel), workers=2, context="spawn", collate_fn=numpy_collate))
        assert _keys(got) == want


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"workers": "2"}, "workers='2', prefetch=2"),
        ({"workers": -1}, "workers=-1, prefetch=2"),
        ({"prefetch": 0}, "workers=2, prefetch=0"),
        ({"workers": True}, "workers=True, prefetch=2"),
        ({"context": "threads"}, "context='threads' is not a start method of this platform"),
    ],
)
def test_a_loader_setting_of_the_wrong_kind_is_named(store: Path, kwargs: dict[str, Any], named: str) -> None:
    """A worker count given as text, or a start method the platform lacks, raised Python's own
    TypeError or multiprocessing's ValueError at the first batch (QA, stop 56): a LoaderError
    (a Stage2Error) when the loader is made, naming the setting and what it may be."""
    with Selection(store, "train") as sel:
        with pytest.raises(LoaderError, match=re.escape(named)) as ei:
            PoolLoader(sel, _batches(sel), **kwargs)
        assert ei.value.fix
        assert PoolLoader(sel, _batches(sel), workers=np.int64(2)).workers == 2  # a numpy integer is one


@pytest.mark.parametrize(
    ("transform", "named"),
    [
        (lambda item: (item["frames"], item["actions"]), "item 0 of the batch is a tuple, not a sample"),
        (lambda item: {"x": item["frames"]}, "item 0 of the batch is a dict without 'frames' (keys: x)"),
    ],
)
def test_a_transform_that_returns_no_sample_is_named_by_collate(
    store: Path, transform: Any, named: str
) -> None:
    """A transform returning a tuple, or a dict without 'frames', failed inside collate with a
    TypeError or KeyError of its own (QA, stop 56): a LoaderError naming the item and the fix."""
    with Selection(store, "train", transform=transform) as sel:
        with pytest.raises(LoaderError, match=re.escape(named)) as ei:
            collate([sel[i] for i in range(2)])
        assert ei.value.fix is not None and "transform must return the item dict" in ei.value.fix
