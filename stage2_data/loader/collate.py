"""The collate of a batch of samples: frames and actions padded to the batch's longest sample, with
masks and lengths (numpy arrays; torch tensors when torch is in use, never a dependency).

:func:`collate` takes a list of items as :class:`~stage2_data.store.VinOfflineDataset` (or
:class:`~stage2_data.loader.Selection`) returns them and gives one dict:

============== ============================ =================================================
key            dtype, shape                 what
============== ============================ =================================================
frames         uint8 (B, T, H, W, 3)        zero past each sample's length (T = the batch's max)
frame_mask     bool (B, T)                  True for a real frame
lengths        int64 (B,)                   each sample's number of frames (its frames' length)
actions        float32 (B, Ta, A)           0.0 past a sample's length and width (never NaN, so
                                            ``loss * action_mask`` stays finite); A = the
                                            batch's widest action row (0 without actions)
action_mask    bool (B, Ta, A)              True for a real action value
action_widths  int64 (B,)                   each sample's action width (0 without actions)
<metadata>     int64 / bool (B,) or list    every other key of the items: a numpy array when
                                            every value is an int (or every one a bool), else a
                                            list of the B values (strings, None, floats)
============== ============================ =================================================

One name per field: the items' ``num_frames`` and ``action_width`` (the sample index's, see
:class:`~stage2_data.store.VinOfflineDataset`) are not copied into the batch (:data:`ITEM_ALIASES`):
``lengths`` and ``action_widths`` are those values, measured on the frames and actions collated
(so they stay right when a transform shortened a sample).

A batch holds one frame resolution: frames of different (H, W) (or channels) in one batch are
refused with :class:`~stage2_data.errors.MixedResolutionError`, which says what to do: batch with
:class:`~stage2_data.loader.ResolutionBatches` (each batch one resolution; a store's shard holds one
resolution, so a store of several resolutions always needs it), or resize in a transform. Nothing
is resized silently: the store keeps every trajectory's native resolution.

Tensors: ``to_torch=None`` (the default) returns torch tensors when torch is already imported in
this process (so in a ``torch.utils.data.DataLoader`` and its workers) and numpy arrays otherwise;
``True`` / ``False`` force it. In a DataLoader worker the padded tensors are allocated in shared
memory and filled in place, as torch's own collate does, so a batch reaches the training process
without a copy. Lists stay lists.

Frames given as :class:`~stage2_data.loader.select.DeferredFrames` (``Selection.item(i,
defer_frames=True)``, what a :class:`~stage2_data.loader.PoolLoader` worker passes) are decoded
straight into their slot of the padded batch (the chunk's crc32c checked first), with no array per
sample in between; the batch is the same.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import LoaderError, MixedResolutionError
from ..layout import SPLIT_NAMES
from .select import DeferredFrames

#: the keys :func:`collate` builds from ``frames`` and ``actions`` (they never pass through as metadata)
ARRAY_KEYS = ("frames", "frame_mask", "lengths", "actions", "action_mask", "action_widths")
#: item keys that the batch holds under another name (the collated array of :data:`ARRAY_KEYS`)
ITEM_ALIASES = {"num_frames": "lengths", "action_width": "action_widths"}


def collate(items: Sequence[dict[str, Any]], *, to_torch: bool | None = None) -> dict[str, Any]:
    """One batch (see the module docstring) from ``items``, dicts with at least ``frames`` (T, ...)
    and ``actions`` (T, A) (None or ``(T, 0)`` for a sample without actions)."""
    if len(items) == 0:
        raise LoaderError("collate was given an empty batch.", fix="give it at least one sample")
    for i, it in enumerate(items):  # (a transform's result, most often): named, not a KeyError
        if not isinstance(it, Mapping) or "frames" not in it:
            what = (
                f"a dict without 'frames' (keys: {', '.join(map(str, it))})"
                if isinstance(it, Mapping)
                else f"a {type(it).__name__}"
            )
            raise LoaderError(
                f"item {i} of the batch is {what}, not a sample: a dict holding at least 'frames'.",
                fix="a Selection's transform must return the item dict it is given, its 'frames' kept "
                "(change or add keys in it)",
            )
    torch = _torch_module(to_torch)
    frames = [_frames_of(it) for it in items]
    _check_one_resolution(items, frames)
    actions = [_actions_of(it, f) for it, f in zip(items, frames, strict=True)]
    n = len(items)
    lengths = [int(f.shape[0]) for f in frames]
    tmax = max(lengths)
    batch: dict[str, Any] = {}

    out_frames, shared_frames = _empty(torch, (n, tmax, *frames[0].shape[1:]), frames[0].dtype)
    for b, f in enumerate(frames):
        if isinstance(f, DeferredFrames) and out_frames.flags.c_contiguous:
            f.read_into(out_frames[b])  # decoded into the slot, zeros past its length
            continue
        out_frames[b, : f.shape[0]] = np.asarray(f)
        out_frames[b, f.shape[0] :] = 0
    frame_mask = np.arange(tmax)[None, :] < np.asarray(lengths)[:, None]

    a_len = [int(a.shape[0]) for a in actions]
    widths = [int(a.shape[1]) for a in actions]
    ta, amax = max(a_len), max(widths)
    out_actions, shared_actions = _empty(torch, (n, ta, amax), np.dtype(np.float32))
    out_actions[...] = 0.0
    action_mask = np.zeros((n, ta, amax), dtype=bool)
    for b, a in enumerate(actions):
        out_actions[b, : a.shape[0], : a.shape[1]] = a
        action_mask[b, : a.shape[0], : a.shape[1]] = True

    batch["frames"] = out_frames
    batch["frame_mask"] = frame_mask
    batch["lengths"] = np.asarray(lengths, dtype=np.int64)
    batch["actions"] = out_actions
    batch["action_mask"] = action_mask
    batch["action_widths"] = np.asarray(widths, dtype=np.int64)
    for key in items[0]:
        if key in ARRAY_KEYS or key in ITEM_ALIASES:  # built above from frames and actions
            continue
        batch[key] = _metadata_column(key, [it.get(key) for it in items])
    if torch is not None:
        batch = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        if shared_frames is not None:
            batch["frames"], batch["actions"] = shared_frames, shared_actions
    return batch


# -- helpers -------------------------------------------------------------------------------------------
def _torch_module(to_torch: bool | None) -> Any:
    """torch when the batch is to hold tensors, else None."""
    if to_torch is False:
        return None
    if to_torch is None and "torch" not in sys.modules:
        return None
    try:
        import torch
    except ImportError as e:  # only reachable with to_torch=True
        raise LoaderError(
            "collate(to_torch=True) needs torch, which is not installed.",
            fix="install torch, or leave to_torch unset (numpy arrays)",
        ) from e
    return torch


def _frames_of(item: dict[str, Any]) -> Any:
    """An item's frames: an array, or its :class:`DeferredFrames` as they are (shape and dtype known)."""
    f = item["frames"]
    return f if isinstance(f, DeferredFrames) else np.asarray(f)


def _check_one_resolution(items: Sequence[dict[str, Any]], frames: list[Any]) -> None:
    shapes: dict[tuple[int, ...], list[str]] = {}
    for it, f in zip(items, frames, strict=True):
        if f.ndim < 1:
            raise LoaderError(
                f"sample {it.get('sample_key', '?')}: frames is a scalar, not an array of frames.",
                fix="give collate items whose 'frames' has a leading time axis (T, H, W, 3)",
            )
        shapes.setdefault(tuple(f.shape[1:]), []).append(str(it.get("sample_key", "?")))
    if len(shapes) > 1:
        seen = "; ".join(
            f"{'x'.join(map(str, s))}: {len(keys)} ({', '.join(keys[:2])}{', ...' if len(keys) > 2 else ''})"
            for s, keys in shapes.items()
        )
        raise MixedResolutionError(
            f"a batch of {len(items)} samples holds frames of {len(shapes)} resolutions ({seen}); "
            "a batch must hold one.",
            fix=_one_resolution_fix(items, next(iter(shapes))),
        )


def _one_resolution_fix(items: Sequence[dict[str, Any]], shape: tuple[int, ...]) -> str:
    """The fix of a :class:`MixedResolutionError`: Python that runs as written once ``STORE`` is the
    store's path (the items' split and the batch's size filled in), between backticks."""
    splits = {it.get("split") for it in items}
    split = next(iter(splits)) if len(splits) == 1 else None
    split = split if isinstance(split, str) and split in SPLIT_NAMES else None
    name = split or "sel"
    one = f"'{shape[0]}x{shape[1]}'" if len(shape) >= 2 else "'HxW'"
    return (
        "batch by resolution, with a Selection of the store (it knows each sample's resolution "
        "from the sample index) and ResolutionBatches over it: `from torch.utils.data import "
        "DataLoader; from stage2_data.loader import "
        f"ResolutionBatches, Selection, collate; {name} = Selection(STORE, {split!r}); "
        f"loader = DataLoader({name}, batch_sampler=ResolutionBatches({name}, batch_size={len(items)}, "
        "seed=0), collate_fn=collate)` (STORE: the store's path, as you opened the dataset; batch_size: "
        "this batch's, or yours; without torch: `from stage2_data.loader import PoolLoader, "
        f"ResolutionBatches, Selection; {name} = Selection(STORE, {split!r}); loader = PoolLoader("
        f"{name}, ResolutionBatches({name}, batch_size={len(items)}, seed=0))`); or choose one "
        f"resolution: Selection(STORE, {split!r}, resolutions={one}); or resize in a transform"
    )


def _actions_of(item: dict[str, Any], frames: Any) -> np.ndarray:
    a = item.get("actions")
    if a is None:
        return np.zeros((frames.shape[0], 0), dtype=np.float32)
    a = np.asarray(a)
    if a.ndim != 2:
        raise LoaderError(
            f"sample {item.get('sample_key', '?')}: actions have shape {a.shape}, not (T, width).",
            fix="give collate items whose 'actions' is (T, width) (or None)",
        )
    return a


# where a worker of stage2_data.loader.pool wants the padded arrays (files in /dev/shm), or None
_ALLOCATE: Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray] | None = None


def set_allocator(allocate: Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray] | None) -> None:
    """Have :func:`collate` allocate its padded ``frames`` and ``actions`` with ``allocate(shape,
    dtype)`` in this process (None: numpy's). A loader's worker uses it to collate straight into
    memory the training process maps."""
    global _ALLOCATE
    _ALLOCATE = allocate


def _empty(torch: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[np.ndarray, Any]:
    """An uninitialised array to fill, and the tensor it is a view of: in a torch DataLoader worker
    a tensor in shared memory (so the batch reaches the training process without a copy), else
    None (a numpy array: from the allocator a loader's worker set, or numpy's)."""
    if torch is not None:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            t_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            try:  # as torch's default_collate does: a new shared storage, filled in place
                storage = torch.UntypedStorage._new_shared(nbytes)
                t = torch.empty(0, dtype=t_dtype).set_(storage, 0, shape)
            except (AttributeError, TypeError, RuntimeError):
                t = torch.empty(shape, dtype=t_dtype).share_memory_()
            return t.numpy(), t
    if _ALLOCATE is not None:
        return _ALLOCATE(shape, np.dtype(dtype)), None
    return np.empty(shape, dtype=dtype), None


def _metadata_column(key: str, values: list[Any]) -> Any:
    """An int64 or bool array when every value is one (bools are not ints here), else a list."""
    if all(isinstance(v, bool | np.bool_) for v in values):
        return np.asarray(values, dtype=bool)
    if all(isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_) for v in values):
        return np.asarray(values, dtype=np.int64)
    return list(values)
