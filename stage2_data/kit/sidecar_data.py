"""The data of one action sidecar checked (kit-format.md section 3): recovered actions are finite
numbers; ``alignment_indices`` hold one index per aligned row, each within ``raw_actions``; each
aligned row equals the raw row it indexes; ``source_indices`` hold one index per raw row.

Pure numpy over arrays already read (never unpickled) by :mod:`.sidecars`; every problem names the
sidecar (whose file name is ``trajectory_<ID>.npz``: the trajectory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DATA_KEYS", "check_sidecar_arrays"]

DATA_KEYS = ("raw_actions", "aligned_actions", "source_indices", "alignment_indices")


def _first(mask: np.ndarray[Any, Any]) -> str:
    at = np.argwhere(mask)
    return ", ".join(f"{n} {int(x)}" for n, x in zip(("row", "column"), at[0], strict=False))


def check_sidecar_arrays(label: str, a: dict[str, np.ndarray[Any, Any]], problems: list[str]) -> None:
    """The data of one sidecar (any of :data:`DATA_KEYS` present), appending problems that name
    ``label``: ``aligned_actions`` finite floats; ``alignment_indices`` one integer per aligned row,
    each within ``raw_actions``' rows; each aligned row equal to the raw row it indexes (compared in
    the narrower float type: an aligned float32 copy of float64 raw actions is equal);
    ``source_indices`` one integer per raw row. Shapes the header checks already report are skipped."""
    raw, al = a.get("raw_actions"), a.get("aligned_actions")
    src, idx = a.get("source_indices"), a.get("alignment_indices")
    if al is not None and al.ndim == 2:
        if al.dtype.kind != "f":
            problems.append(f"{label}: aligned_actions has dtype {al.dtype}; expected a float array")
        elif not np.isfinite(al).all():
            bad = ~np.isfinite(al)
            problems.append(
                f"{label}: aligned_actions holds {int(bad.sum())} non-finite value(s) (NaN or inf; first at "
                f"{_first(bad)}): recovered actions must be finite numbers (repair the sidecar, or give its "
                "action-manifest row a status other than 'recovered')"
            )
    if (
        raw is not None
        and raw.ndim == 2
        and src is not None
        and (src.dtype.kind not in "iu" or src.shape != (raw.shape[0],))
    ):
        problems.append(
            f"{label}: source_indices is {src.dtype} {src.shape}; expected ({raw.shape[0]},) integers, "
            "one per raw_actions row"
        )
    if idx is None or al is None or al.ndim != 2:
        return
    if idx.dtype.kind not in "iu" or idx.shape != (al.shape[0],):
        problems.append(
            f"{label}: alignment_indices is {idx.dtype} {idx.shape}; expected ({al.shape[0]},) integers, "
            "one per aligned_actions row"
        )
        return
    if raw is None or raw.ndim != 2:
        return
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= raw.shape[0]):
        outside = (idx < 0) | (idx >= raw.shape[0])
        r = int(np.argmax(outside))
        problems.append(
            f"{label}: alignment_indices[{r}] = {int(idx[r])} is outside raw_actions' {raw.shape[0]} rows "
            f"({int(outside.sum())} such entries)"
        )
        return
    if raw.shape[1] != al.shape[1] or al.dtype.kind != "f" or raw.dtype.kind not in "fiu":
        return  # the width (or dtype) problem is reported on its own
    ref = raw[idx]
    dt = al.dtype if raw.dtype.kind != "f" or al.dtype.itemsize <= raw.dtype.itemsize else raw.dtype
    x, y = al.astype(dt, copy=False), ref.astype(dt, copy=False)
    if (x == y).all():  # (NaN never equals: then the rows are looked at below)
        return
    with np.errstate(invalid="ignore"):
        same = (x == y) | ~np.isfinite(x)  # a non-finite aligned value is reported above, once
    rows = np.nonzero(~same.all(axis=1))[0]
    if rows.size:
        r = int(rows[0])
        problems.append(
            f"{label}: aligned_actions row {r} differs from raw_actions row {int(idx[r])} that "
            f"alignment_indices[{r}] names ({rows.size} of {al.shape[0]} rows differ): an aligned row "
            "is the raw row it indexes"
        )
