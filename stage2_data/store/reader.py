"""The strict reader of a store (local or object storage): manifest, sample index, pairs, splits, and
one sample's frames and actions.

A reader owns its store: the path it is given is resolved ONCE, at open (a local path through
``os.path.realpath``, so ``stores/<profile>/current`` becomes the store folder it points at; on object
storage the ``CURRENT`` object is read once), and only that store is read for the reader's life,
whatever a rebuild publishes meanwhile. A local reader holds a lease on its store
(:mod:`.retention`) until :meth:`VinOfflineStoreReader.close`, so ``stage2 gc`` never removes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import operator
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from .. import layout
from ..errors import StoreError, StoreNotFoundError
from ..publish import is_temp_name
from ..storage import StoreLocation
from .format import (
    BLOCK_ACTIONS,
    BLOCK_FRAMES,
    MANIFEST_NAME,
    PAIRS_NAME,
    SAMPLE_INDEX_NAME,
    SPLIT_FILES,
    SPLITS_DIR,
    StoreChecksumError,
)
from .manifest import load_manifest_strict, rebuild_command
from .retention import StoreLease, acquire_lease
from .shard_io import CRC_BYTES, MISSING, DirectArray, chunk_intact, decode_chunk, direct_array
from .tables import read_jsonl, read_npy

#: shard files a local reader keeps mapped (least recently used unmapped first)
_MAX_MAPPED_FILES = 64


def resolve_store(
    path: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
) -> StoreLocation:
    """The store ``path`` names, resolved now: a local path through ``os.path.realpath`` (so
    ``stores/<profile>/current`` becomes the folder it points at); on object storage a prefix without
    a manifest that is ``<profile>/current`` or ``<profile>`` itself is the folder named by the
    profile's ``CURRENT`` object (read once)."""
    loc = StoreLocation.parse(path, storage_options)
    if loc.is_local:
        return StoreLocation.parse(os.path.realpath(loc.root))
    if loc.is_file(loc.root / MANIFEST_NAME):
        return loc
    candidates = [loc]
    if loc.root.name == layout.CURRENT_LINK:
        parent = loc.root.parent
        candidates.insert(
            0, dataclasses.replace(loc, root=parent, url=f"{loc.protocol}://{parent.as_posix()}")
        )
    for c in candidates:
        cur = c.current()
        if cur is not None:
            return cur
    return loc


class VinOfflineStoreReader:
    """Strict reader: refuses a store without ``manifest.json`` or of another format/version.

    The store is resolved once, at open (:func:`resolve_store`): ``.path`` / ``.resolved`` name it,
    ``.opened_as`` what was given (e.g. ``.../current``), ``.fingerprint`` its fingerprint. A local
    reader holds a lease on it (``.lease``) until :meth:`close` (also on ``with``, and when the reader
    is garbage-collected); a pickled reader (DataLoader workers, spawn) carries the resolved store and
    takes its own lease where it is unpickled.

    Shard groups are opened lazily (one ``zarr.open_group`` per shard on first use, then cached).
    Arrays with the layout this module writes are read directly: the shard index once per shard
    (checked against its crc32c, then cached), then ONE ranged read of the sample's own inner chunk,
    checked against its crc32c and decoded with Blosc into a fresh array; anything else is read
    through zarr (whose crc32c codec checks the same bytes). Bytes that fail their crc32c raise
    :class:`StoreChecksumError` naming the store, the shard, the array and the sample.

    A local shard file is mapped read-only once (``mmap``, kept for the reader's life, at most
    ``_MAX_MAPPED_FILES`` at once): a read is then no system call and no copy, the checksum and
    Blosc read the page cache in place. Store files are never rewritten in place (a rebuild
    publishes a new folder; gc unlinks, which a mapping survives), so a mapping stays valid.
    """

    def __init__(
        self, path: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
    ) -> None:
        given = StoreLocation.parse(path, storage_options)
        #: what the reader was opened on (``.../current`` stays that here; ``resolved`` is the store)
        self.opened_as: str = given.url
        self.lease: StoreLease | None = None
        for attempt in range(3):
            self.location = resolve_store(given)
            self.lease = self._take_lease()
            try:
                self.manifest: dict[str, Any] = load_manifest_strict(self.location)
                break
            except StoreNotFoundError:
                self.close()
                # removed between resolving and leasing (a rebuild moved current, then gc): resolve again
                if attempt == 2 or resolve_store(given).url == self.location.url:
                    raise
            except BaseException:
                self.close()
                raise
        #: the store's folder, or ``bucket/prefix`` on object storage (``location.url`` names it)
        self.path = self.location.root
        self._shards: list[dict[str, Any]] = list(self.manifest.get("shards", []))
        self._sample_index: list[dict[str, Any]] | None = None
        self._pairs: list[dict[str, Any]] | None = None
        self._splits: dict[str, np.ndarray[Any, Any]] = {}
        self._groups: dict[int, Any] = {}
        self._arrays: dict[tuple[int, str], Any] = {}
        self._direct_cache: dict[tuple[int, str], DirectArray | None] = {}
        self._maps: OrderedDict[Path, mmap.mmap] = OrderedDict()
        self._maps_lock = threading.Lock()
        self._pid = os.getpid()

    def _take_lease(self) -> StoreLease | None:
        """A lease on a local store of a profile's stores folder (one with a ``current`` link: the
        stores retention removes); None on object storage (no leases there), for a staging folder,
        a store elsewhere, or no store (refused next)."""
        loc = self.location
        if not loc.is_local or is_temp_name(loc.root.name) or not (loc.root / MANIFEST_NAME).is_file():
            return None
        if not (loc.root.parent / layout.CURRENT_LINK).is_symlink():
            return None
        return acquire_lease(loc.root)

    @property
    def resolved(self) -> str:
        """The store this reader reads (``current`` resolved at open): a folder, or a URL."""
        return self.location.url

    @property
    def fingerprint(self) -> str | None:
        fp = self.manifest.get("fingerprint")
        return fp if isinstance(fp, str) else None

    def close(self) -> None:
        """Release the lease (the store may be removed by ``stage2 gc`` from then on) and close the
        shard files this reader has mapped."""
        self._close_files()
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()

    def _close_files(self) -> None:
        maps = getattr(self, "_maps", None)
        if not maps:
            return
        with self._maps_lock:
            while maps:
                _, m = maps.popitem()
                with contextlib.suppress(BufferError, OSError):  # a view still alive: unmapped by GC
                    m.close()

    def __enter__(self) -> VinOfflineStoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # (also at interpreter exit, when modules are gone)
            self._close_files()
        lease = getattr(self, "lease", None)
        if lease is not None:
            lease.release()

    # pickling (DataLoader workers): drop open zarr handles and the lease; reopen lazily in the worker,
    # which takes its own lease on the same (resolved) store.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_groups"] = {}
        state["_arrays"] = {}
        state["_direct_cache"] = {}
        state["_maps"] = OrderedDict()
        state["_maps_lock"] = None
        state["lease"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._maps_lock = threading.Lock()
        self._pid = os.getpid()
        self.lease = self._take_lease()
        if self.location.is_local and not (self.location.root / MANIFEST_NAME).is_file():
            self.close()
            raise StoreNotFoundError(
                f"{self.location.url}: the store this reader was opened on is gone (removed since).",
                fix=f"open the published store again (e.g. {self.opened_as})",
            )

    @property
    def num_samples(self) -> int:
        return sum(int(s["num_rows"]) for s in self._shards)

    def __len__(self) -> int:
        return self.num_samples

    @property
    def sample_index(self) -> list[dict[str, Any]]:
        if self._sample_index is None:
            rows = read_jsonl(self.location, self.path / SAMPLE_INDEX_NAME)
            if len(rows) != self.num_samples:
                raise StoreError(
                    f"{self.path / SAMPLE_INDEX_NAME}: {len(rows)} rows but the manifest has {self.num_samples}.",
                    fix=f"validate the store (`validate_vin_offline_store`) and rebuild: "
                    f"{rebuild_command(self.path, self.manifest)}",
                )
            self._sample_index = rows
        return self._sample_index

    def split(self, name: str) -> np.ndarray[Any, Any]:
        if name not in SPLIT_FILES:
            raise KeyError(f"unknown split {name!r}; expected one of {', '.join(SPLIT_FILES)}")
        if name not in self._splits:
            arr = read_npy(self.location, self.path / SPLITS_DIR / f"{name}.npy")
            self._splits[name] = np.asarray(arr, dtype=np.int64)
        return self._splits[name]

    def pairs(self) -> list[dict[str, Any]]:
        if self._pairs is None:
            self._pairs = read_jsonl(self.location, self.path / PAIRS_NAME)
        return self._pairs

    # -- zarr access ---------------------------------------------------------------------------------
    def _open_store(self, shard_dir: Path) -> Any:
        """The zarr store of one shard folder (a hook: tests wrap it to count reads)."""
        return self.location.zarr_store(shard_dir, read_only=True)

    def _check_fork(self) -> None:
        if self._pid != os.getpid():  # forked: zarr handles and files of the parent are not reused
            self._groups = {}
            self._arrays = {}
            self._direct_cache = {}
            self._maps = OrderedDict()  # the parent's mappings: dropped here, unmapped in this child only
            self._maps_lock = threading.Lock()
            self._pid = os.getpid()

    def _group(self, shard_id: int) -> Any:
        self._check_fork()
        g = self._groups.get(shard_id)
        if g is None:
            entry = self._shards[shard_id]
            g = zarr.open_group(
                store=self._open_store(self.path / entry["dir"]),
                mode="r",
                zarr_format=3,
                use_consolidated=False,
            )
            self._groups[shard_id] = g
        return g

    def _array(self, shard_id: int, name: str) -> Any:
        g = self._group(shard_id)
        a = self._arrays.get((shard_id, name))
        if a is None:
            a = g[name]
            self._arrays[(shard_id, name)] = a
        return a

    # -- direct shard reads ------------------------------------------------------------------------
    def _view(self, path: Path, offset: int, length: int) -> memoryview:
        """``length`` bytes at ``offset`` of a local shard file, as a view of its read-only mapping
        (mapped once; taken under the lock, so an eviction never closes a mapping being read)."""
        with self._maps_lock:
            m = self._maps.get(path)
            if m is None:
                with open(path, "rb") as f:
                    if os.fstat(f.fileno()).st_size == 0:
                        return memoryview(b"")
                    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                self._maps[path] = m
                if len(self._maps) > _MAX_MAPPED_FILES:
                    _, old = self._maps.popitem(last=False)
                    with contextlib.suppress(BufferError):  # still being read: unmapped by GC
                        old.close()
            else:
                self._maps.move_to_end(path)
            return memoryview(m)[offset : offset + length]

    def _read_range(self, path: Path, offset: int, length: int) -> bytes | memoryview:
        """``length`` bytes of ``path`` at ``offset`` (a hook: tests wrap it to count reads); for a
        local store a view of the mapped file (no copy)."""
        self._check_fork()
        data: bytes | memoryview
        if self.location.is_local:
            try:
                data = self._view(path, offset, length)
            except FileNotFoundError:
                raise StoreNotFoundError(
                    f"{path}: missing (the store is incomplete or was removed).",
                    fix=f"validate the store and rebuild it: {rebuild_command(self.path, self.manifest)}",
                ) from None
        else:
            data = self.location.read_range(path, offset, length)
        if len(data) != length:
            raise StoreError(
                f"{path}: truncated ({len(data)} of {length} bytes at offset {offset}).",
                fix=f"validate the store with --deep and rebuild it: {rebuild_command(self.path, self.manifest)}",
            )
        return data

    def _direct(self, shard_id: int, name: str) -> DirectArray | None:
        """The shard index of one array, read once and cached, when the array has the layout this
        module writes (else None: zarr reads it). A sample then costs one read of its own chunk."""
        key = (shard_id, name)
        if key in self._direct_cache:
            return self._direct_cache[key]
        arr = self._array(shard_id, name)
        d = direct_array(
            arr, self.path / self._shards[shard_id]["dir"] / name, self._read_range, self.location.size
        )
        self._direct_cache[key] = d
        return d

    def _corrupt(self, shard_id: int, name: str, row: int | None, detail: str) -> StoreChecksumError:
        """The error for bytes of (``shard_id``, ``name``) that fail their crc32c: it names the store,
        the shard, the array and the sample (index and key) when one row is concerned."""
        entry = self._shards[shard_id]
        what = f"shard {entry['dir']}, array {name}"
        if row is not None:
            i = int(entry["row_start"]) + row
            key = ""
            with contextlib.suppress(StoreError, IndexError, KeyError, OSError, ValueError):
                key = f" ({self.sample_index[i]['sample_key']})"
            what += f", sample {i}{key} (row {row})"
        return StoreChecksumError(
            f"VIN offline store {self.location.url}: {what}: {detail}.",
            fix=f"the store is damaged; rebuild it: {rebuild_command(self.path, self.manifest)}",
        )

    def _read_row(self, shard_id: int, name: str, row: int) -> np.ndarray[Any, Any] | None:
        try:
            d = self._direct(shard_id, name)
        except StoreChecksumError as e:
            raise self._corrupt(
                shard_id, name, row, f"the shard index fails its crc32c ({e.message})"
            ) from None
        if d is None:
            return None
        off, nbytes = d.entries[row]
        out = np.empty(d.inner, dtype=d.dtype)
        if off == MISSING and nbytes == MISSING:  # an empty chunk (never written by this module)
            out[...] = d.fill
            return out[0]
        raw = self._read_range(d.path, off, nbytes)
        if not chunk_intact(raw):
            raise self._corrupt(shard_id, name, row, f"{nbytes} bytes at offset {off} fail their crc32c")
        try:
            decode_chunk(d.codec, memoryview(raw)[:-CRC_BYTES], out)
        except (RuntimeError, ValueError) as e:  # intact bytes that Blosc refuses: not our writer's
            raise self._corrupt(shard_id, name, row, f"cannot be decompressed ({e})") from None
        return out[0]

    def _zarr_read(self, shard_id: int, name: str, sel: Any) -> np.ndarray[Any, Any]:
        """``array[sel]`` through zarr; bytes failing zarr's crc32c codec raise StoreChecksumError."""
        try:
            return np.asarray(self._array(shard_id, name)[sel])
        except ValueError as e:
            if "checksum" not in str(e):
                raise
            row = sel[0] if isinstance(sel, tuple) and isinstance(sel[0], int) else None
            raise self._corrupt(shard_id, name, row, f"fails its crc32c ({e})") from None

    def _padded_row(self, shard_id: int, name: str, row: int) -> np.ndarray[Any, Any]:
        """One whole row of an array (padding included), decoded as :meth:`read_frames` decodes it."""
        direct = self._read_row(shard_id, name, row)
        if direct is not None:
            return direct
        return self._zarr_read(shard_id, name, (row,))

    def _row(self, i: int) -> dict[str, Any]:
        i = operator.index(i)
        n = self.num_samples
        if not 0 <= i < n:
            raise IndexError(f"sample index {i} out of range [0, {n})")
        return self.sample_index[i]

    def read_frames(self, i: int) -> np.ndarray[Any, Any]:
        meta = self._row(i)
        shard_id, row, t = int(meta["shard_id"]), int(meta["row"]), int(meta["num_frames"])
        direct = self._read_row(shard_id, BLOCK_FRAMES, row)
        if direct is not None:
            return direct[:t]
        return self._zarr_read(shard_id, BLOCK_FRAMES, (row, slice(0, t)))

    def read_actions(self, i: int) -> np.ndarray[Any, Any] | None:
        meta = self._row(i)
        width = int(meta["action_width"])
        entry = self._shards[int(meta["shard_id"])]
        if width <= 0 or int(entry["action_width_max"]) <= 0:
            return None
        shard_id, row, t = int(meta["shard_id"]), int(meta["row"]), int(meta["num_frames"])
        direct = self._read_row(shard_id, BLOCK_ACTIONS, row)
        if direct is not None:
            return direct[:t, :width]
        return self._zarr_read(shard_id, BLOCK_ACTIONS, (row, slice(0, t), slice(0, width)))

    def sample(self, i: int) -> dict[str, Any]:
        meta = self._row(i)
        return {
            "frames": self.read_frames(i),
            "actions": self.read_actions(i),
            "num_frames": int(meta["num_frames"]),
            "meta": meta,
        }
