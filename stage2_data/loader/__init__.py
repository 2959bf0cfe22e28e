"""The store from the trainer's side: which samples (:class:`Selection`), in which seeded, resumable
order (:class:`SeededOrder`, :class:`ResolutionBatches`), batched how (:func:`collate`), loaded by
whom (a ``torch.utils.data.DataLoader``, or :class:`PoolLoader` without torch).

::

    from torch.utils.data import DataLoader
    from stage2_data.loader import ResolutionBatches, Selection, collate

    train = Selection("/data/stage2/stores/stage2_core_v1/current", "train", sources=["racer"])
    order = ResolutionBatches(train, batch_size=8, seed=0)  # holds the store's fingerprint
    loader = DataLoader(train, batch_sampler=order, collate_fn=collate, num_workers=2)
    for step, batch in enumerate(loader):  # batch["frames"]: uint8 (B, T, H, W, 3), masks, lengths
        ...
        state = order.state_dict(consumed=step + 1)  # save it with the checkpoint
    # resume: order.load_state_dict(state) on an order over the same selection of the same store

``consumed`` (the items the training loop has taken) is required once the order has handed out
items: a DataLoader takes them ahead of the loop (:mod:`.order`).

Modules: :mod:`.select` (Selection), :mod:`.order` (the orders), :mod:`.collate` (the batch),
:mod:`.pool` (PoolLoader). Nothing here imports torch: tensors come out when torch is in use.
"""

from __future__ import annotations

from .collate import ARRAY_KEYS, ITEM_ALIASES, collate
from .order import ResolutionBatches, SeededOrder, permutation
from .pool import PoolLoader, numpy_collate
from .select import Selection, Transform

__all__ = [
    "ARRAY_KEYS",
    "ITEM_ALIASES",
    "PoolLoader",
    "ResolutionBatches",
    "SeededOrder",
    "Selection",
    "Transform",
    "collate",
    "numpy_collate",
    "permutation",
]
