"""Seeded, resumable epoch orders: :class:`SeededOrder` (a sampler of sample positions) and
:class:`ResolutionBatches` (a batch sampler whose every batch holds one frame resolution).

Both are plain iterables, so they work as a ``torch.utils.data.DataLoader``'s ``sampler`` /
``batch_sampler`` and with :class:`~stage2_data.loader.PoolLoader`, and they live in the process
that iterates them (never in a worker).

* **Deterministic.** An epoch's order depends only on ``(seed, epoch)`` and what is ordered (the
  number of samples; for batches also their resolutions and ``batch_size`` / ``drop_last``): numpy's
  PCG64 seeded with ``[seed, epoch]`` draws one float64 per item and the order is their stable
  argsort, on every machine.
* **Epochs advance by themselves.** Iterating to the end moves the order to the next epoch (a new
  permutation each epoch, no ``set_epoch`` to forget); ``set_epoch(e)`` chooses one.
* **Sharded across ranks.** With ``world_size`` > 1 (data-parallel training, one order per rank),
  each epoch's items (the same permutation on every rank) are padded by repeating its first items
  to a multiple of ``world_size``, and rank ``r`` takes items ``r, r + world_size, ...``: the
  ranks' shares are disjoint but for the padding, cover the epoch, and are equally long, so no rank
  waits for another at the epoch's end (what ``torch.utils.data.DistributedSampler`` does).
* **Resumable mid-epoch.** ``state_dict(consumed=k)`` is where training stands after the training
  loop has taken ``k`` items (samples for :class:`SeededOrder`, batches for
  :class:`ResolutionBatches`) from the iteration under way (counted from where that iteration
  started: 0, or the ``start`` a loaded state gave); ``load_state_dict`` of it (on an order over the
  same selection) continues with the next item of that epoch's permutation. A ``consumed`` that
  reaches the end of the epoch is the start of the next one.

  **The rule for ``consumed``**: it is required as soon as the order has handed out an item since
  it was built, placed (``set_epoch``) or loaded. A ``torch.utils.data.DataLoader`` (its workers and
  prefetching) or a :class:`~stage2_data.loader.PoolLoader` takes items from the order ahead of the
  training loop, so the order cannot know how many were trained on: ``state_dict()`` without
  ``consumed`` then raises :class:`~stage2_data.errors.LoaderError` rather than save the read-ahead
  position. With a ``batch_sampler`` (e.g. :class:`ResolutionBatches`), in ``for step, batch in
  enumerate(loader)`` save ``state_dict(consumed=step + 1)``; with a ``sampler`` (e.g.
  :class:`SeededOrder`) and ``batch_size=B``, save the samples taken, a running sum of
  ``len(batch["sample_key"])`` (not ``(step + 1) * B``: an epoch's last batch may be shorter).
  ``consumed`` larger than what the order has handed out is refused too (the loop cannot have
  taken more). Before any item is handed out, ``state_dict()`` is the order's own ``epoch`` /
  ``start``.
* **Bound to its store.** An order built from a :class:`~stage2_data.loader.Selection`
  (``ResolutionBatches(sel, batch_size)``, ``SeededOrder(sel)``) holds the store's ``fingerprint``
  and writes it into its state; ``load_state_dict`` refuses a state saved on a store of another
  fingerprint, naming both, and a state without a fingerprint (saved by an order built from plain
  resolutions or a size), since it cannot tell which store that state walked. An order built from
  plain resolutions or a size has no fingerprint and refuses a state that has one. A state is
  plain JSON: ``kind``, ``seed``, ``shuffle``, ``epoch``, ``start``, ``fingerprint`` (when the order
  has one), ``rank`` / ``world_size`` (when ``world_size`` > 1), and what must match (``size``; for
  batches also ``resolutions``, ``batch_size``, ``drop_last``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Sized
from typing import Any, Generic, TypeVar

import numpy as np

from ..errors import LoaderError
from .select import parse_resolution, resolution_name

Item = TypeVar("Item")


def permutation(size: int, seed: int, epoch: int, *more: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The permutation of ``range(size)`` of ``(seed, epoch, *more)``: the stable argsort of ``size``
    float64 drawn from PCG64 seeded with ``[seed, epoch, *more]`` (the same on every machine)."""
    key = [int(seed), int(epoch), *(int(m) for m in more)]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))
    return np.argsort(rng.random(size), kind="stable").astype(np.int64)


class _EpochOrder(Generic[Item]):
    """What both orders share: seed, epoch, start offset, the state dict, epochs that advance."""

    kind = ""

    def __init__(
        self,
        *,
        seed: int,
        shuffle: bool,
        epoch: int,
        start: int,
        rank: int = 0,
        world_size: int = 1,
        fingerprint: str | None = None,
        store: str | None = None,
    ) -> None:
        seed = _count(seed, "seed")
        rank, world_size = _count(rank, "rank"), _count(world_size, "world_size")
        if seed < 0:  # numpy's SeedSequence takes non-negative integers only
            raise LoaderError(f"seed={seed} is negative.", fix="give seed as an integer >= 0")
        if world_size < 1 or not 0 <= rank < world_size:
            raise LoaderError(
                f"rank {rank} of world_size {world_size}: need world_size >= 1 and 0 <= rank < world_size.",
                fix="give each data-parallel process its rank (0 .. world_size-1) and the number of processes",
            )
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.rank, self.world_size = int(rank), int(world_size)
        #: the fingerprint of the store the order walks (None: built from plain resolutions or a size)
        self.fingerprint = fingerprint
        self._store = store  # where that store is, for messages only (never saved: paths differ)
        #: the epoch the next iteration walks, and the item of it the next iteration starts at
        self.epoch = self.start = 0
        # the epoch and start of the iteration under way (what ``consumed`` counts from), items handed out
        self._running = (0, 0)
        self._handed = 0
        self._place(epoch, start)

    # subclasses: the items of one epoch (every rank's), in order, and what must match for a state to apply
    def epoch_items(self, epoch: int) -> list[Item]:
        raise NotImplementedError

    def items(self, epoch: int) -> list[Item]:
        """This rank's items of ``epoch``, in order (all of them when ``world_size`` is 1)."""
        every = self.epoch_items(epoch)
        if self.world_size == 1 or not every:
            return every
        per = -(-len(every) // self.world_size)  # items per rank, the epoch's rounded up
        padded = [every[k % len(every)] for k in range(per * self.world_size)]
        return padded[self.rank :: self.world_size]

    def _identity(self) -> dict[str, Any]:
        raise NotImplementedError

    def __len__(self) -> int:
        """Items the next iteration yields (the epoch's, less ``start``)."""
        return max(0, len(self.items(self.epoch)) - self.start)

    def __iter__(self) -> Iterator[Item]:
        epoch, start = self.epoch, self.start
        items = self.items(epoch)
        if start > len(items):
            raise LoaderError(
                f"{self.kind} order: start {start} is past the end of epoch {epoch} ({len(items)} items).",
                fix="load a state saved by an order over the same selection, or give start=0",
            )
        self._running, self._handed = (epoch, start), 0
        for item in items[start:]:
            self._handed += 1
            yield item
        self.epoch, self.start = epoch + 1, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Walk ``epoch`` next, from its item ``start``."""
        self._place(epoch, start)

    def _place(self, epoch: int, start: int) -> None:
        epoch, start = _count(epoch, "epoch"), _count(start, "start")
        if epoch < 0 or start < 0:
            raise LoaderError(
                f"epoch {epoch} and start {start}: both must be >= 0.",
                fix="give a non-negative epoch and start",
            )
        self.epoch, self.start = int(epoch), int(start)
        self._running, self._handed = (self.epoch, self.start), 0

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where training stands after the training loop has taken ``consumed`` items (samples or
        batches, as the order yields them) from the iteration under way, counted from where it
        started.

        ``consumed`` is required once the order has handed out an item since it was built, placed
        or loaded (a DataLoader takes items ahead of the loop; see the module docstring): without
        it that is a :class:`~stage2_data.errors.LoaderError`, and so is a ``consumed`` larger than
        what the order has handed out. Before any item is handed out ``state_dict()`` is the order's
        own ``epoch`` / ``start``. The state holds the store's ``fingerprint`` when the order has
        one."""
        epoch, start = self._running
        if consumed is None:
            if self._handed:
                raise LoaderError(
                    f"{self.kind} order: state_dict() without consumed=, but the order has handed out "
                    f"{self._handed} {self.kind} of epoch {epoch} (from item {start}); a DataLoader or "
                    "PoolLoader takes them ahead of the training loop, so the order cannot tell how many "
                    "were trained on.",
                    fix=f"pass consumed= the number of {self.kind} your training loop has taken from this "
                    "iteration, e.g. state_dict(consumed=step + 1) in `for step, batch in enumerate(loader)`"
                    + (
                        " (when a DataLoader batches this sampler: the samples taken, a running sum of "
                        "len(batch['sample_key']), not (step + 1) * batch_size: an epoch's last batch may "
                        "be shorter)"
                        if self.kind == "samples"
                        else ""
                    ),
                )
            taken = 0
        else:
            taken = _count(consumed, "consumed")
        if taken < 0:
            raise LoaderError(f"consumed={taken} is negative.", fix="give the number of items taken so far")
        if taken > self._handed:
            raise LoaderError(
                f"{self.kind} order: consumed={taken}, but the order has handed out only {self._handed} "
                f"{self.kind} of epoch {epoch} (from item {start}) in the iteration under way; the "
                "training loop cannot have taken more.",
                fix=f"count the {self.kind} taken from this iteration only (a resumed iteration counts from "
                "its first item, not from the epoch's; an epoch's count starts again at 0)",
            )
        pos = start + taken  # at most the epoch's end: the order hands out no more than that
        if pos == len(self.items(epoch)):
            epoch, pos = epoch + 1, 0
        head = {"kind": self.kind, "seed": self.seed, "shuffle": self.shuffle, "epoch": epoch, "start": pos}
        store = {"fingerprint": self.fingerprint} if self.fingerprint is not None else {}
        return head | store | (self._ranks() if self.world_size > 1 else {}) | self._identity()

    def _ranks(self) -> dict[str, int]:
        return {"rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` (from :meth:`state_dict`) stood; refused (a
        :class:`~stage2_data.errors.LoaderError`, the order unchanged) when it was saved by an order
        of another kind, seed, rank or selection, or on a store of another fingerprint (see the module
        docstring: a state without a fingerprint is refused by an order that has one)."""
        if not isinstance(state, Mapping):
            raise LoaderError(
                f"the saved order state is {type(state).__name__} {_short(state)}, not a dict.",
                fix=f"pass the dict {type(self).__name__}.state_dict() returned (as saved, e.g. with json)",
            )
        missing = [k for k in ("kind", "seed", "shuffle", "epoch", "start") if k not in state]
        if missing:
            raise LoaderError(
                f"the saved order state has no {', '.join(map(repr, missing))}; a state holds "
                f"{', '.join(map(repr, ['kind', 'seed', 'shuffle', 'epoch', 'start', *self._identity()]))}.",
                fix=f"pass the dict {type(self).__name__}.state_dict() returned, unchanged",
            )
        self._check_store(state.get("fingerprint"))
        mine = (
            {"kind": self.kind, "seed": self.seed, "shuffle": self.shuffle} | self._ranks() | self._identity()
        )
        single = {"rank": 0, "world_size": 1}  # a state saved without ranks is a single process's
        theirs = {k: state.get(k, single.get(k)) for k in mine}
        if theirs != mine:
            diff = ", ".join(
                f"{k}: saved {theirs[k]!r}, here {mine[k]!r}" for k in mine if theirs[k] != mine[k]
            )
            raise LoaderError(
                f"the saved order state does not match this order ({diff}).",
                fix="resume with the same selection, seed and batch settings the state was saved with",
            )
        epoch, start = _count(state["epoch"], "epoch"), _count(state["start"], "start")
        if epoch < 0 or start < 0:
            self._place(epoch, start)  # refused, naming both
        total = len(self.items(epoch))
        if start > total:
            raise LoaderError(
                f"the saved order state's start {start} is past the end of epoch {epoch} ({total} "
                f"{self.kind}).",
                fix="pass the dict state_dict() returned, unchanged, to an order over the same selection",
            )
        self._place(epoch, start)

    def _check_store(self, saved: object) -> None:
        """The store fingerprint a state was saved with (None: it holds none) against this order's."""
        here = self.fingerprint
        reads = f"this order reads {self._store or 'a store'}"
        if saved is not None and not isinstance(saved, str):
            raise LoaderError(
                f"the saved order state's fingerprint {_short(saved)} is not a string.",
                fix="pass the dict state_dict() returned, unchanged",
            )
        if saved == here:
            return
        if saved is not None and here is not None:
            raise LoaderError(
                f"the saved order state was saved on the store of fingerprint {saved}; {reads} of "
                f"fingerprint {here}: resuming would continue another store's order.",
                fix="resume on the store the state was saved on (open its folder, not `current` after a "
                "rebuild), or start this store's order from the beginning (no load_state_dict)",
            )
        if here is not None:
            raise LoaderError(
                f"the saved order state holds no store fingerprint (it was saved by an order built from "
                f"plain resolutions or a size, or before states held one); {reads} of fingerprint {here} "
                "and cannot tell whether the state walked that store.",
                fix=f'if the state was saved on this store, add "fingerprint": "{here}" to it and load it '
                "again; otherwise start this store's order from the beginning",
            )
        raise LoaderError(
            f"the saved order state was saved on the store of fingerprint {saved}, but this order was "
            "built from plain resolutions or a size, without its store, so it cannot check that it "
            "walks the same store.",
            fix="build the order from the Selection: ResolutionBatches(selection, batch_size=...) or "
            "SeededOrder(selection)",
        )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _count(value: object, name: str) -> int:
    """``value`` as a count (an integer, numpy's too; never a bool, a float or text); LoaderError
    naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise LoaderError(
            f"{name}={_short(value)} is not an integer.",
            fix=f"give {name} as an integer (in a saved state: the value state_dict() wrote, unchanged)",
        )
    return int(value)


def _store_of(data: object, fingerprint: str | None) -> dict[str, Any]:
    """The ``fingerprint`` and ``store`` (resolved path) of the dataset an order is built from (a
    Selection has both; a plain size or list neither), or the ``fingerprint`` given; LoaderError
    when both are there and differ."""
    own = getattr(data, "fingerprint", None)
    own = own if isinstance(own, str) else None
    if fingerprint is not None and own is not None and fingerprint != own:
        raise LoaderError(
            f"fingerprint={fingerprint!r} given for a selection of the store of fingerprint {own}.",
            fix="leave fingerprint= out when building the order from a Selection",
        )
    store = getattr(data, "resolved", None)
    return {"fingerprint": fingerprint or own, "store": store if isinstance(store, str) else None}


class SeededOrder(_EpochOrder[int]):
    """The positions ``0 .. size-1`` of a dataset, in a seeded permutation per epoch (in order when
    ``shuffle=False``); a DataLoader ``sampler``. ``size`` is a dataset (a
    :class:`~stage2_data.loader.Selection`: its ``len()``, and its store's ``fingerprint`` for the
    saved state) or a number of samples. See the module docstring for epochs and resuming."""

    kind = "samples"

    def __init__(
        self,
        size: int | Sized,
        *,
        seed: int = 0,
        shuffle: bool = True,
        epoch: int = 0,
        start: int = 0,
        rank: int = 0,
        world_size: int = 1,
        fingerprint: str | None = None,
    ) -> None:
        if not isinstance(size, int | np.integer | Sized):
            raise LoaderError(
                f"SeededOrder({_short(size)}): not a dataset or a number of samples.",
                fix="give the Selection (or dataset) to order, or its len()",
            )
        n = int(size) if isinstance(size, int | np.integer) else len(size)
        if n < 0:
            raise LoaderError(f"size {n} is negative.", fix="give the dataset, or its len()")
        self.size = n
        super().__init__(
            seed=seed,
            shuffle=shuffle,
            epoch=epoch,
            start=start,
            rank=rank,
            world_size=world_size,
            **_store_of(size, fingerprint),
        )

    def epoch_items(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        return permutation(self.size, self.seed, epoch).tolist()

    def _identity(self) -> dict[str, Any]:
        return {"size": self.size}


class ResolutionBatches(_EpochOrder[list[int]]):
    """Batches of dataset positions, each of ONE frame resolution: a DataLoader ``batch_sampler``.

    ``resolutions`` is a :class:`~stage2_data.loader.Selection` (its ``resolutions``, and its store's
    ``fingerprint`` for the saved state), or a sequence whose item ``i`` is position ``i``'s (H, W)
    (a pair or an ``"HxW"`` string; such an order has no fingerprint unless ``fingerprint=`` gives
    it; a bare ``"HxW"`` string is one position's, never a sequence of characters). Per epoch, each
    resolution's positions are permuted (seeded by ``(seed, epoch)``), cut into batches of
    ``batch_size`` (the last one of a resolution smaller unless ``drop_last``), and the batches of
    every resolution are then permuted together, so resolutions are mixed across batches, never
    within one. ``start`` and ``consumed`` count batches; with ``world_size`` > 1 the batches are
    shared out across ranks (module docstring), each batch whole on one rank.
    """

    kind = "batches"

    def __init__(
        self,
        resolutions: Sequence[tuple[int, int] | str] | Any,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        epoch: int = 0,
        start: int = 0,
        rank: int = 0,
        world_size: int = 1,
        fingerprint: str | None = None,
    ) -> None:
        if _count(batch_size, "batch_size") < 1:
            raise LoaderError(f"batch_size {batch_size} is not positive.", fix="give batch_size >= 1")
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        store = _store_of(resolutions, fingerprint)
        per_position = getattr(resolutions, "resolutions", resolutions)
        if isinstance(per_position, str):
            per_position = [per_position]  # one position's, not one per character
        groups: dict[tuple[int, int], list[int]] = {}
        for pos, value in enumerate(per_position):
            res = parse_resolution(value)
            if res is None:
                raise LoaderError(
                    f"position {pos}'s resolution {_short(value)} is neither (H, W) nor 'HxW'.",
                    fix="give a Selection, or its .resolutions (one (H, W) per position)",
                )
            groups.setdefault(res, []).append(pos)
        self.groups = {res: np.asarray(pos, dtype=np.int64) for res, pos in sorted(groups.items())}
        self.size = sum(len(p) for p in groups.values())
        largest = max((len(p) for p in groups.values()), default=0)
        if self.drop_last and 0 < largest < self.batch_size:
            # every batch would be dropped: an epoch of nothing, which a training loop takes for done
            h, w = max(groups, key=lambda r: len(groups[r]))
            raise LoaderError(
                f"batch_size {self.batch_size} with drop_last gives no batch: a batch holds one "
                f"resolution, and the largest resolution group ({h}x{w}) has {largest} positions.",
                fix=f"give batch_size <= {largest}, or drop_last=False (the last batch of each resolution smaller)",
            )
        super().__init__(
            seed=seed,
            shuffle=shuffle,
            epoch=epoch,
            start=start,
            rank=rank,
            world_size=world_size,
            **store,
        )
        self._cache: tuple[int, list[list[int]]] | None = None

    def epoch_items(self, epoch: int) -> list[list[int]]:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        batches: list[list[int]] = []
        for k, positions in enumerate(self.groups.values()):
            order = positions
            if self.shuffle:
                order = positions[permutation(len(positions), self.seed, epoch, k + 1)]
            for i in range(0, len(order), self.batch_size):
                chunk = order[i : i + self.batch_size]
                if len(chunk) == self.batch_size or not self.drop_last:
                    batches.append(chunk.tolist())
        if self.shuffle:
            batches = [batches[i] for i in permutation(len(batches), self.seed, epoch)]
        self._cache = (epoch, batches)
        return batches

    def _identity(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "resolutions": {resolution_name(res): len(p) for res, p in self.groups.items()},
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }
