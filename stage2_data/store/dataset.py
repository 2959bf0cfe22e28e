"""A map-style dataset over one split of a store (usable as a PyTorch dataset).

Like its reader, a dataset owns its store: ``stores/<profile>/current`` is resolved once, at open, and
a rebuild that moves ``current`` later changes nothing for it (nor for its pickled copies in
DataLoader workers, which carry the resolved store).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..storage import StoreLocation
from .format import SAMPLE_INDEX_FIELDS, check_split
from .reader import VinOfflineStoreReader


def checked_index(i: Any, n: int, what: str) -> int:
    """``i`` as a position in ``range(n)`` (negative counts from the end), or IndexError naming ``what``
    and the index as given (TypeError for anything that is not an integer, a sample key included)."""
    try:
        given = operator.index(i)
    except TypeError:
        raise TypeError(
            f"{what} is indexed by a position (an integer from 0 to {n - 1}), not by {type(i).__name__} {i!r}"
        ) from None
    at = given + n if given < 0 else given
    if not 0 <= at < n:
        raise IndexError(
            f"index {given} out of range for {what} of {n} samples (0 to {n - 1}, or -{n} to -1)"
        )
    return at


class VinOfflineDataset:
    """Map-style dataset over one split (or all samples); usable as a PyTorch dataset.

    ``ds[i]`` is a dict: ``frames`` uint8 (T, H, W, 3), ``actions`` float32 (T, W) (``(T, 0)`` when
    the sample has no actions, so every item has the same keys and types), ``num_frames``,
    ``action_width`` and the sample-index metadata (sample_index, sample_key, split, task, ...).

    ``path`` / ``resolved`` / ``fingerprint`` name the store it reads (resolved at open); ``close()``
    (or ``with``) releases the reader's lease on it, and from then on the dataset reads nothing:
    ``ds[i]`` raises :class:`~stage2_data.store.reader.ReaderClosedError` (the store may be removed
    once no lease holds it). A pickled copy (a DataLoader worker under spawn) takes its own lease;
    one of a closed dataset is closed too.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | StoreLocation,
        split: str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        check_split(split)  # a typo is named before the store is opened (and leased)
        self.reader = VinOfflineStoreReader(path, storage_options)
        self.split = split
        try:
            self.indices = self.reader.split(split if split is not None else "all")
        except BaseException:  # (a damaged split file): no lease outlives a dataset never returned
            self.reader.close()
            raise

    @property
    def path(self) -> Any:
        return self.reader.path

    @property
    def resolved(self) -> str:
        return self.reader.resolved

    @property
    def fingerprint(self) -> str | None:
        return self.reader.fingerprint

    @property
    def closed(self) -> bool:
        return self.reader.closed

    def close(self) -> None:
        """Release the reader's lease on the store; the dataset reads nothing afterwards."""
        self.reader.close()

    def __enter__(self) -> VinOfflineDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        index = int(self.indices[checked_index(i, len(self), "a dataset")])
        return self.sample_item(index, self.reader.read_frames(index))

    def sample_item(self, index: int, frames: Any) -> dict[str, Any]:
        """The item of the store's sample ``index`` (``ds[i]`` is ``sample_item(ds.indices[i],
        its frames)``) with ``frames`` as given: its frames array, or frames to be decoded later
        (``loader.select.DeferredFrames``)."""
        meta = self.reader.sample_index[index]
        t = int(meta["num_frames"])
        actions = self.reader.read_actions(index)
        if actions is None:
            actions = np.zeros((t, 0), dtype=np.float32)
        item: dict[str, Any] = {k: meta[k] for k in SAMPLE_INDEX_FIELDS}
        item.update({"frames": frames, "actions": actions, "num_frames": t})
        return item

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]


# ----- validation --------------------------------------------------------------------------------------
