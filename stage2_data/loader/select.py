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

import os
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from ..errors import LoaderError
from ..layout import SPLIT_NAMES
from ..storage import StoreLocation
from ..store import VinOfflineDataset, VinOfflineStoreReader
from ..store.dataset import checked_index
from ..store.format import SPLIT_FILES

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


def check_split(split: object) -> None:
    """``split`` as a selection takes it: one of ``train``, ``val``, ``test``, or ``all`` / None
    (every split); LoaderError listing them otherwise, before the store is opened."""
    if split is None or (isinstance(split, str) and split in SPLIT_FILES):
        return
    raise LoaderError(
        f"split {split!r} is not a split of a store; the splits are: {', '.join(SPLIT_NAMES)} "
        "(or 'all' / None: every split).",
        fix=f"pass split= one of {', '.join(map(repr, SPLIT_NAMES))}, or None",
    )


class Selection:
    """The samples of the store at ``path`` in ``split`` (None: every split) whose source is one of
    ``sources``, task one of ``tasks`` and (H, W) one of ``resolutions`` (None: any).

    ``sel[i]`` is the dataset item of the ``i``-th selected sample (``frames``, ``actions``,
    ``num_frames``, ``action_width`` and the sample-index metadata; see
    :class:`~stage2_data.store.VinOfflineDataset`), passed through ``transform`` when one is given
    (in the worker that loads it; under spawn it must be picklable: a module-level function). A
    name in ``sources`` / ``tasks`` that the split does not hold, or a selection of no sample, is a
    :class:`~stage2_data.errors.LoaderError` naming what the split holds; so is a ``split`` that is
    none of the store's (:func:`check_split`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | StoreLocation,
        split: str | None = None,
        *,
        sources: Collection[str] | None = None,
        tasks: Collection[str] | None = None,
        resolutions: Collection[tuple[int, int]] | None = None,
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
            wanted = {
                "source": None if sources is None else set(sources),
                "task": None if tasks is None else set(tasks),
            }
            for field, names in wanted.items():
                held = {rows[i][field] for i in idx}
                if names is not None and names - held:
                    raise LoaderError(
                        f"{self.dataset.resolved}: split {split or 'all'} has no {field} "
                        f"{', '.join(sorted(map(repr, names - held)))}; it has {', '.join(sorted(map(repr, held)))}.",
                        fix=f"choose {field}s among those",
                    )
            res = None if resolutions is None else {(int(h), int(w)) for h, w in resolutions}

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
