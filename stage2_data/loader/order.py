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
* **Resumable mid-epoch.** ``state_dict(consumed=k)`` is where training stands after it has taken
  ``k`` items (samples for :class:`SeededOrder`, batches for :class:`ResolutionBatches`) of the
  epoch being iterated; ``load_state_dict`` of it (on an order over the same selection) continues
  with item ``k`` of that epoch's permutation. Pass ``consumed``: a DataLoader with workers fetches
  ahead of the training loop, so the count the order has handed out (the default) is ahead of what
  was trained on. A ``consumed`` that reaches the end of the epoch is the start of the next one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from ..errors import LoaderError

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
        self, *, seed: int, shuffle: bool, epoch: int, start: int, rank: int = 0, world_size: int = 1
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise LoaderError(
                f"rank {rank} of world_size {world_size}: need world_size >= 1 and 0 <= rank < world_size.",
                fix="give each data-parallel process its rank (0 .. world_size-1) and the number of processes",
            )
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.rank, self.world_size = int(rank), int(world_size)
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
        if epoch < 0 or start < 0:
            raise LoaderError(
                f"epoch {epoch} and start {start}: both must be >= 0.",
                fix="give a non-negative epoch and start",
            )
        self.epoch, self.start = int(epoch), int(start)
        self._running, self._handed = (self.epoch, self.start), 0

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where training stands: ``consumed`` items taken from the iteration under way (default: the
        items this order has handed out, exact only without read-ahead). Before any iteration it is
        the order's own ``epoch`` / ``start``."""
        epoch, start = self._running
        taken = self._handed if consumed is None else _count(consumed, "consumed")
        if taken < 0:
            raise LoaderError(f"consumed={taken} is negative.", fix="give the number of items taken so far")
        pos = start + taken
        total = len(self.items(epoch))
        if pos > total:
            raise LoaderError(
                f"{self.kind} order: consumed={taken} from item {start} is past the end of epoch {epoch} "
                f"({total} items).",
                fix=f"count {self.kind} taken from this epoch's iteration only",
            )
        if pos == total:
            epoch, pos = epoch + 1, 0
        head = {"kind": self.kind, "seed": self.seed, "shuffle": self.shuffle, "epoch": epoch, "start": pos}
        return head | (self._ranks() if self.world_size > 1 else {}) | self._identity()

    def _ranks(self) -> dict[str, int]:
        return {"rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` (from :meth:`state_dict`) stood; refused when it was saved by an
        order of another kind, seed or selection."""
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


class SeededOrder(_EpochOrder[int]):
    """The positions ``0 .. size-1`` of a dataset, in a seeded permutation per epoch (in order when
    ``shuffle=False``); a DataLoader ``sampler``. See the module docstring for epochs and resuming."""

    kind = "samples"

    def __init__(
        self,
        size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        epoch: int = 0,
        start: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if size < 0:
            raise LoaderError(f"size {size} is negative.", fix="give the dataset's len()")
        self.size = int(size)
        super().__init__(
            seed=seed, shuffle=shuffle, epoch=epoch, start=start, rank=rank, world_size=world_size
        )

    def epoch_items(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        return permutation(self.size, self.seed, epoch).tolist()

    def _identity(self) -> dict[str, Any]:
        return {"size": self.size}


class ResolutionBatches(_EpochOrder[list[int]]):
    """Batches of dataset positions, each of ONE frame resolution: a DataLoader ``batch_sampler``.

    ``resolutions[i]`` is position ``i``'s (H, W) (``Selection.resolutions``). Per epoch, each
    resolution's positions are permuted (seeded by ``(seed, epoch)``), cut into batches of
    ``batch_size`` (the last one of a resolution smaller unless ``drop_last``), and the batches of
    every resolution are then permuted together, so resolutions are mixed across batches, never
    within one. ``start`` and ``consumed`` count batches; with ``world_size`` > 1 the batches are
    shared out across ranks (module docstring), each batch whole on one rank.
    """

    kind = "batches"

    def __init__(
        self,
        resolutions: Sequence[tuple[int, int]],
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        epoch: int = 0,
        start: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1:
            raise LoaderError(f"batch_size {batch_size} is not positive.", fix="give batch_size >= 1")
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        groups: dict[tuple[int, int], list[int]] = {}
        for pos, res in enumerate(resolutions):
            groups.setdefault((int(res[0]), int(res[1])), []).append(pos)
        self.groups = {res: np.asarray(pos, dtype=np.int64) for res, pos in sorted(groups.items())}
        self.size = len(resolutions)
        super().__init__(
            seed=seed, shuffle=shuffle, epoch=epoch, start=start, rank=rank, world_size=world_size
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
            "resolutions": {f"{h}x{w}": len(p) for (h, w), p in self.groups.items()},
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }
