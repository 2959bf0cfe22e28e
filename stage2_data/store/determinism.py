"""Process-wide settings of the libraries that write a store, which must not reach its bytes.

A store's bytes, and so its fingerprint, are a function of its declared inputs only. Three settings
that any library in the process, a config file or an environment variable may change would
otherwise enter them: Blosc's own threads, Blosc's split mode, and zarr's JSON indent. The writer
asks for the one fixed value of each before it writes (tests/test_determinism.py changes each and
compares every byte).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numcodecs.blosc


def single_threaded_blosc() -> None:
    """Blosc compresses a chunk with its own threads when called from the main thread with
    ``numcodecs.blosc.use_threads`` not False, and then its output depends on its thread count
    (``min(8, cores)`` by default): the same chunk gives other bytes on another machine, or after
    another library changed the setting, and so another fingerprint. zarr sets it False when it is
    imported; a store's bytes must not depend on that, so every write asks for it again (chunks
    are compressed in parallel on our own threads instead)."""
    numcodecs.blosc.use_threads = False  # type: ignore[attr-defined]


#: c-blosc 1.x's default split mode (``BLOSC_FORWARD_COMPAT_SPLIT`` in blosc.h)
_BLOSC_FORWARD_COMPAT_SPLIT = 4
_blosc_set_splitmode: Any = None  # c-blosc's ``blosc_set_splitmode`` in numcodecs' extension; False: none


def default_blosc_split_mode() -> None:
    """Put Blosc's split mode back to its default before a shard is compressed.

    Whether Blosc splits a block into one stream per byte of the type is a process-wide mode that
    every compression reads, ours included (numcodecs has no setting for it). Any compression through
    Blosc's global context (numcodecs with ``use_threads`` on, in any library) sets it from
    ``BLOSC_SPLITMODE`` when that variable is set: the same chunks then give other bytes, so another
    fingerprint. numcodecs' extension exports c-blosc's ``blosc_set_splitmode``; it is called with
    c-blosc 1.x's default. Where it is not exported, or Blosc is not 1.x, nothing is done."""
    global _blosc_set_splitmode
    if _blosc_set_splitmode is None:
        import ctypes

        import numcodecs.blosc

        try:
            fn: Any = ctypes.CDLL(numcodecs.blosc.__file__).blosc_set_splitmode
        except (OSError, AttributeError):
            fn = False
        if not str(getattr(numcodecs.blosc, "VERSION_STRING", "")).startswith("1."):
            fn = False
        _blosc_set_splitmode = fn
    if _blosc_set_splitmode:
        _blosc_set_splitmode(_BLOSC_FORWARD_COMPAT_SPLIT)


def canonical_zarr_json(paths: Sequence[Path]) -> None:
    """Rewrite each ``zarr.json`` among ``paths`` in one fixed form: ``json.dumps(indent=2)`` of what
    zarr wrote (zarr's own default form, so a default setup rewrites nothing). zarr formats its
    metadata by the process-wide ``zarr.config["json_indent"]``, which any library in the process,
    a zarr config file or ``ZARR_JSON_INDENT`` may change; a store's bytes, and so its fingerprint,
    must not depend on them."""
    for p in paths:
        if p.name != "zarr.json":
            continue
        raw = p.read_bytes()
        canon = json.dumps(json.loads(raw), indent=2, allow_nan=True).encode()
        if canon != raw:
            p.write_bytes(canon)
