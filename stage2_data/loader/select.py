"""Which samples a training run reads: :class:`Selection`, a map-style dataset over a store's samples
chosen by split, source, task and resolution, with an optional per-sample transform.

It is a :class:`~stage2_data.store.VinOfflineDataset` (the strict reader, its store pinned at open and
leased, pickled into DataLoader workers under fork and spawn) narrowed to the chosen samples.
Choosing reads only the sample index, never a frame; ``resolutions``, ``lengths``, ``sources`` and
``sample_keys`` describe every selected position without reading a frame either, for samplers such
as :class:`~stage2_data.loader.ResolutionBatches`.

``sel.item(i, defer_frames=True)`` is ``sel[i]`` with its frames not decoded yet
(:class:`DeferredFrames`): :func:`~stage2_data.loader.collate` decodes them straight into their slot
of the padded batch (one copy from the page cache, no per-sample array); a
:class:`~stage2_data.loader.PoolLoader` worker loads batches so.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import LoaderError
from ..storage import StoreLocation
from ..store import VinOfflineDataset, VinOfflineStoreReader
from ..store.dataset import checked_index
from ..store.format import check_split

Transform = Callable[[dict[str, Any]], dict[str, Any]]


class DeferredFrames:
    """A sample's frames, not decoded yet: ``shape`` (T, H, W, 3) and ``dtype`` (uint8) come from
    the sample index. ``read_into(out)`` decodes them into ``out[:T]`` and zeros ``out[T:]``
    (:meth:`~stage2_data.store.VinOfflineStoreReader.read_frames_into`: the chunk's crc32c checked
    first); ``np.asarray(frames)`` decodes them into a new array."""

    __slots__ = ("dtype", "index", "reader", "shape")

    def __init__(self, reader: VinOfflineStoreReader, index: int, shape: tuple[int, ...]) -> None:
        self.reader = reader
        self.index = index
        self.shape = shape
        self.dtype = np.dtype(np.uint8)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def read_into(self, out: np.ndarray[Any, Any]) -> int:
        return self.reader.read_frames_into(self.index, out)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        a = self.reader.read_frames(self.index)
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"DeferredFrames(sample {self.index}, shape={self.shape})"


_HXW = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def parse_resolution(value: object) -> tuple[int, int] | None:
    """``value`` as (H, W): a pair of positive integers (a tuple or list, numpy integers too) or an
    ``"HxW"`` string (``"48x64"``: height 48, width 64); None when it is neither."""
    if isinstance(value, str):
        m = _HXW.fullmatch(value)
        if m is None:
            return None
        h, w = int(m[1]), int(m[2])
    elif isinstance(value, Sequence | np.ndarray) and len(value) == 2 and all(map(_is_int, value)):
        h, w = int(value[0]), int(value[1])
    else:
        return None
    return (h, w) if h > 0 and w > 0 else None


def _names(value: Collection[str] | str | None) -> set[str] | None:
    """``sources=`` / ``tasks=`` as a set of names: a bare string is one name (``"racer"``, not
    its characters); None is any."""
    if value is None:
        return None
    return {value} if isinstance(value, str) else set(value)


def resolution_name(res: tuple[int, int]) -> str:
    """(H, W) as ``"HxW"``, the form a saved order state and the error messages use."""
    return f"{res[0]}x{res[1]}"


class Selection:
    """The samples of the store at ``path`` in ``split`` (None: every split) whose source is one of
    ``sources``, task one of ``tasks`` and (H, W) one of ``resolutions`` (None: any).

    Each of ``sources``, ``tasks`` and ``resolutions`` is a collection, or one value alone: a bare
    string is one value, never a collection of characters (``sources="racer"`` is
    ``sources=["racer"]``, ``tasks="close_jar"`` is ``tasks=["close_jar"]``).

    A resolution is given as a pair ``(H, W)`` or a string ``"HxW"`` (``resolutions=[(48, 64)]``
    and ``resolutions=["48x64"]`` select the same samples; one resolution alone, ``(48, 64)`` or
    ``"48x64"``, is a selection of one).

    ``sel[i]`` is the dataset item of the ``i``-th selected sample (``frames``, ``actions``,
    ``num_frames``, ``action_width`` and the sample-index metadata; see
    :class:`~stage2_data.store.VinOfflineDataset`), passed through ``transform`` when one is given
    (in the worker that loads it; under spawn it must be picklable: a module-level function);
    :func:`~stage2_data.loader.collate` turns ``num_frames`` / ``action_width`` into the batch's
    ``lengths`` / ``action_widths``. A name in ``sources`` / ``tasks`` or a resolution that the
    split does not hold, a malformed resolution, or a selection of no sample, is a
    :class:`~stage2_data.errors.LoaderError` naming what the split holds; so is a ``split`` that is
    none of the store's (:func:`check_split`).

    ``fingerprint`` is the store's (its manifest's): an order built from the selection
    (``ResolutionBatches(sel, ...)``, ``SeededOrder(sel)``) saves it in its state and refuses to
    resume on a store of another fingerprint.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | StoreLocation,
        split: str | None = None,
        *,
        sources: Collection[str] | str | None = None,
        tasks: Collection[str] | str | None = None,
        resolutions: Collection[tuple[int, int] | str] | tuple[int, int] | str | None = None,
        transform: Transform | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        check_split(split)
        self.dataset = VinOfflineDataset(path, split, storage_options)
        self.split = split
        self.transform = transform
        try:
            rows = self.dataset.reader.sample_index
            idx = self.dataset.indices.tolist()
            wanted = {"source": _names(sources), "task": _names(tasks)}
            for field, names in wanted.items():
                held = {rows[i][field] for i in idx}
                if names is not None and names - held:
                    raise LoaderError(
                        f"{self.dataset.resolved}: split {split or 'all'} has no {field} "
                        f"{', '.join(sorted(map(repr, names - held)))}; it has {', '.join(sorted(map(repr, held)))}.",
                        fix=f"choose {field}s among those",
                    )
            res = None if resolutions is None else self._wanted_resolutions(resolutions, rows, idx)

            def chosen(row: dict[str, Any]) -> bool:
                return all(names is None or row[f] in names for f, names in wanted.items()) and (
                    res is None or (int(row["frame_height"]), int(row["frame_width"])) in res
                )

            keep = [pos for pos, i in enumerate(idx) if chosen(rows[i])]
            if not keep:
                raise LoaderError(
                    f"{self.dataset.resolved}: no sample of split {split or 'all'} matches "
                    f"sources={sources}, tasks={tasks}, resolutions={resolutions}.",
                    fix="widen the selection",
                )
        except BaseException:
            self.close()
            raise
        #: positions in the split's dataset (``self.dataset``) of the selected samples, in store order
        self.positions = np.asarray(keep, dtype=np.int64)
        picked = [rows[idx[p]] for p in keep]
        #: per selected sample: (H, W) of its frames, its number of frames, source, sample key
        self.resolutions: list[tuple[int, int]] = [
            (int(r["frame_height"]), int(r["frame_width"])) for r in picked
        ]
        self.lengths = np.asarray([int(r["num_frames"]) for r in picked], dtype=np.int64)
        self.sources: list[str] = [str(r["source"]) for r in picked]
        self.sample_keys: list[str] = [str(r["sample_key"]) for r in picked]

    def _wanted_resolutions(
        self, resolutions: object, rows: list[dict[str, Any]], idx: list[int]
    ) -> set[tuple[int, int]]:
        """``resolutions=`` as a set of (H, W): each one a pair or an ``"HxW"`` string (one alone is
        taken as a collection of one); LoaderError naming the resolutions the split holds for one
        that is malformed or that the split does not hold."""
        held = collections.Counter((int(rows[i]["frame_height"]), int(rows[i]["frame_width"])) for i in idx)
        in_store = {(int(r["frame_height"]), int(r["frame_width"])) for r in rows}
        holds = ", ".join(f"{resolution_name(r)} ({n} samples)" for r, n in sorted(held.items()))
        if set(held) != in_store:
            holds += f"; the store as a whole: {', '.join(map(resolution_name, sorted(in_store)))}"
        where = f"{self.dataset.resolved}: split {self.split or 'all'}"
        one = isinstance(resolutions, str) or parse_resolution(resolutions) is not None
        given = [resolutions] if one else resolutions
        if not isinstance(given, Iterable):
            given = [resolutions]
        wanted: set[tuple[int, int]] = set()
        for value in given:
            res = parse_resolution(value)
            if res is None:
                raise LoaderError(
                    f"{where}: resolution {value!r} is neither (H, W) nor 'HxW' (e.g. (48, 64) or "
                    f"'48x64', positive integers); the split holds {holds}.",
                    fix="give resolutions= as (H, W) pairs or 'HxW' strings among those the split holds",
                )
            wanted.add(res)
        missing = sorted(wanted - set(held))
        if missing:
            raise LoaderError(
                f"{where} has no resolution {', '.join(map(resolution_name, missing))}; it holds {holds}.",
                fix="choose resolutions= among those the split holds (as (H, W) or 'HxW')",
            )
        return wanted

    # the store it reads (resolved at open), and its lease
    @property
    def resolved(self) -> str:
        return self.dataset.resolved

    @property
    def fingerprint(self) -> str | None:
        return self.dataset.fingerprint

    def close(self) -> None:
        """Release the reader's lease on its store."""
        self.dataset.close()

    def __enter__(self) -> Selection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = checked_index(i, len(self), "a selection")
        item = self.dataset[int(self.positions[i])]
        return self.transform(item) if self.transform is not None else item

    def item(self, i: int, *, defer_frames: bool = False) -> dict[str, Any]:
        """``sel[i]``; with ``defer_frames`` (and no transform, which needs the frames) its
        ``frames`` are :class:`DeferredFrames`, decoded later by :func:`~stage2_data.loader.collate`
        straight into the batch (the rest of the item is the same)."""
        if not defer_frames or self.transform is not None:
            return self[i]
        ds = self.dataset
        index = int(ds.indices[int(self.positions[checked_index(i, len(self), "a selection")])])
        meta = ds.reader.sample_index[index]
        shape = (int(meta["num_frames"]), int(meta["frame_height"]), int(meta["frame_width"]), 3)
        return ds.sample_item(index, DeferredFrames(ds.reader, index, shape))
