"""The fault matrix, the training loader's rows of issue #28: a resolution the split does not hold (or
a malformed one), an order state saved without ``consumed=`` after a loader read ahead, and a state
resumed on another store. The library a trainer calls, on real stores on disk (tests/fixtures/
stores.py: resolutions 8x10 and 6x12). The matrix: tests/faults_table.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_store import Upstream, build

from stage2_data.errors import LoaderError
from stage2_data.loader import PoolLoader, ResolutionBatches, Selection


@pytest.fixture(scope="module")
def other_store(tmp_path_factory: pytest.TempPathFactory, up: Upstream) -> Path:
    """The same trajectories in shards of 4 rows: the same selections, another fingerprint (what a
    rebuild that moved ``current`` gives a trainer)."""
    out = tmp_path_factory.mktemp("other") / "store"
    build(out, up, rows_per_shard=4)
    return out


def test_fault_store_loader_resolution(store: Path) -> None:
    """A trainer asks for a resolution the split does not hold, or writes one malformed: a
    LoaderError naming the resolutions the split holds (not a bare unpacking ValueError, not an
    empty selection); the held one selects, as (H, W) or 'HxW'."""
    with Selection(store) as every:
        counts = {r: every.resolutions.count(r) for r in set(every.resolutions)}
    holds = f"6x12 ({counts[(6, 12)]} samples), 8x10 ({counts[(8, 10)]} samples)"
    with pytest.raises(LoaderError) as err:
        Selection(store, resolutions=["480x640"])
    assert str(err.value) == (
        f"{store}: split all has no resolution 480x640; it holds {holds}. Fix: choose resolutions= "
        "among those the split holds (as (H, W) or 'HxW')"
    )
    for bad in (["48by64"], [(0, 64)], [(48,)]):
        with pytest.raises(
            LoaderError, match=rf"is neither \(H, W\) nor 'HxW'.*; the split holds {re.escape(holds)}"
        ):
            Selection(store, resolutions=bad)
    with Selection(store, resolutions=["6x12"]) as a, Selection(store, resolutions=[(6, 12)]) as b:
        assert a.sample_keys == b.sample_keys and len(a) == counts[(6, 12)]


def test_fault_store_loader_unconsumed(store: Path) -> None:
    """A trainer saves the order's state without ``consumed=`` while two workers have read ahead:
    refused (it would resume past batches never trained on), saying what to pass; with
    ``consumed=`` the resumed order continues with the first batch not trained on."""
    sel = Selection(store)
    order = ResolutionBatches(sel, 2, seed=1)
    want = [[sel.sample_keys[p] for p in b] for b in ResolutionBatches(sel, 2, seed=1)]
    for step, batch in enumerate(PoolLoader(sel, order, workers=2, context="fork")):
        assert list(batch["sample_key"]) == want[step]
        with pytest.raises(LoaderError) as err:
            order.state_dict()
        assert str(err.value).startswith(
            "batches order: state_dict() without consumed=, but the order has handed out"
        )
        assert "Fix: pass consumed= the number of batches your training loop has taken" in str(err.value)
        state = order.state_dict(consumed=step + 1)
        break
    resumed = ResolutionBatches(sel, 2, seed=1)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert [[sel.sample_keys[p] for p in b] for b in resumed] == want[1:]
    sel.close()


def test_fault_store_loader_other_store(store: Path, other_store: Path) -> None:
    """A trainer resumes a saved order state on another store (same samples, other fingerprint), or
    from a state that holds no fingerprint: refused naming both fingerprints, the order where it
    was; on the store it was saved on the state resumes."""
    with Selection(store) as sel, Selection(other_store) as other:
        order = ResolutionBatches(sel, 2, seed=1)
        state = order.state_dict()
        moved = ResolutionBatches(other, 2, seed=1)
        with pytest.raises(LoaderError) as err:
            moved.load_state_dict(state | {"start": 2})
        msg = str(err.value)
        assert f"saved on the store of fingerprint {sel.fingerprint}" in msg
        assert f"this order reads {other_store} of fingerprint {other.fingerprint}" in msg
        assert (moved.epoch, moved.start) == (0, 0)
        old = {k: v for k, v in state.items() if k != "fingerprint"}
        with pytest.raises(LoaderError, match="the saved order state holds no store fingerprint"):
            moved.load_state_dict(old)
        order.load_state_dict(state | {"start": 2})
        assert (order.epoch, order.start) == (0, 2)
