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
import operator
import os
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import WrapperStore

from .. import layout
from ..errors import CODE_ERRORS, LoaderError, StoreError, StoreNotFoundError, StoreValidationError
from ..formats.sha256sums import file_kind
from ..publish import is_temp_name
from ..storage import LocalLocation, StoreLocation, current_candidates, current_error
from .format import (
    BLOCK_ACTIONS,
    BLOCK_FRAMES,
    MANIFEST_NAME,
    PAIRS_NAME,
    SAMPLE_INDEX_NAME,
    SPLITS_DIR,
    ZARR_JSON,
    StoreChecksumError,
    check_split,
)
from .manifest import load_manifest_strict, rebuild_command
from .retention import StoreLease, acquire_lease
from .shard_files import ShardFiles
from .shard_io import (
    MISSING,
    DirectArray,
    decode_checked,
    direct_array,
    split_buffers,
    split_checked,
    uncompressed_size,
)
from .tables import check_sha256, listed_sha256, read_jsonl, read_npy, read_store_file

#: shard files a local reader keeps open (least recently used closed first)
_MAX_OPEN_FILES = 64


class _Unreadable(StoreChecksumError):
    """Bytes of a shard file the reader cannot have (the file is missing, or shorter than its
    index says): ``detail`` says which and why; the reader names the shard, array and sample."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ReaderClosedError(StoreError):
    """A read from a reader (or the dataset or selection over it) after its ``close()`` (or the end
    of its ``with`` block): it holds no lease on its store any more, so ``stage2 gc`` may have
    removed the store, and it reads nothing. Open the store again."""


def _check_regular(path: Path) -> None:
    """:class:`_Unreadable` when ``path`` (a local shard file, before it is opened) is there but is
    not a regular file: a FIFO, device, socket or folder is named, never opened (opening a FIFO
    blocks until something writes to it). Nothing there passes (the read that follows names it)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(mode):
        raise _Unreadable(
            f"{path} is {file_kind(mode)}, not a regular file (a store holds only regular files and "
            "folders); nothing was read from it"
        )


class _CheckedMetadata(WrapperStore[Any]):
    """A shard folder's zarr store whose ``zarr.json`` documents are checked against the manifest's
    sha256 (``check(key, data)``, raising) from the very bytes zarr then parses: the dtype, shape,
    fill value and codecs a reader decodes with are the ones the store was written with. Every other
    key (the shard objects, each chunk with its own crc32c) is read as it is, but never as absent:
    zarr reads an absent chunk as the array's fill value (zero frames, NaN actions), while a store's
    writer writes every chunk (``write_empty_chunks``) and lists each in the manifest, so an absent
    one is a damaged store: ``missing(key)`` raises (:class:`_Unreadable`).

    On a local disk (``local``: the shard folder) nothing but a regular file is opened, so nothing
    blocks: a ``zarr.json`` is read by ``read(key)`` (:func:`.tables.read_store_file`: None when
    absent, StoreChecksumError naming a FIFO, device, socket or folder there), and any other key is
    looked at (:func:`_check_regular`) before zarr opens it."""

    def __init__(
        self,
        store: Any,
        check: Any,
        missing: Callable[[str], None],
        read: Callable[[str], bytes | None] | None = None,
        local: Path | None = None,
    ) -> None:
        super().__init__(store)
        self._check = check
        self._missing = missing
        self._read = read
        self._local = local

    def _with_store(self, store: Any) -> _CheckedMetadata:
        return type(self)(store, self._check, self._missing, self._read, self._local)

    def _regular(self, key: str) -> None:
        if self._local is not None:
            _check_regular(self._local / key)

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        if key.rsplit("/", 1)[-1] != ZARR_JSON:
            self._regular(key)
            got = await self._store.get(key, prototype, byte_range)
            if got is None:
                self._missing(key)
            return got
        if self._read is not None:
            data = self._read(key)
            buf = None if data is None else prototype.buffer.from_bytes(data)
        else:
            buf = await self._store.get(key, prototype)
        if buf is None:
            return None  # absent: zarr says so (a damaged store, named by the reader)
        self._check(key, buf.to_bytes())
        return buf if byte_range is None else await self._store.get(key, prototype, byte_range)

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
        key_ranges = list(key_ranges)
        if any(k.rsplit("/", 1)[-1] == ZARR_JSON for k, _ in key_ranges):
            return [await self.get(k, prototype, r) for k, r in key_ranges]
        for k, _ in key_ranges:
            self._regular(k)
        got: list[Any] = await self._store.get_partial_values(prototype, key_ranges)
        for (k, _), b in zip(key_ranges, got, strict=True):
            if b is None:
                self._missing(k)
        return got


def resolve_store(
    path: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
) -> StoreLocation:
    """The store ``path`` names, resolved now: a local path through ``os.path.realpath`` (so
    ``stores/<profile>/current`` becomes the folder it points at); on object storage a prefix without
    a manifest that is ``<profile>/current`` or ``<profile>`` itself is the folder named by the
    profile's ``CURRENT`` object (read once). A local one keeps the path as given (for messages)."""
    loc = StoreLocation.parse(path, storage_options)
    if isinstance(loc, LocalLocation):
        return loc.resolved()
    if loc.is_file(loc.root / MANIFEST_NAME):
        return loc
    for c in current_candidates(loc):
        cur = c.current()
        if cur is not None:
            return cur
    err = current_error(loc)  # a CURRENT object that names no store: said so, not "nothing there"
    if err is not None:
        raise err
    return loc


class VinOfflineStoreReader:
    """Strict reader: refuses a store without ``manifest.json`` or of another format/version.

    The store is resolved once, at open (:func:`resolve_store`): ``.path`` / ``.resolved`` name it,
    ``.opened_as`` what was given (e.g. ``.../current``), ``.fingerprint`` its fingerprint. A local
    reader holds a lease on it (``.lease``) until :meth:`close` (also on ``with``, and when the reader
    is garbage-collected); a pickled reader (DataLoader workers, spawn) carries the resolved store and
    takes its own lease where it is unpickled.

    Shard groups are opened lazily (one ``zarr.open_group`` per shard on first use, then cached).
    Every ``zarr.json`` zarr reads for them (the shard's group, each array it opens) is checked
    against the sha256 the shard's manifest entry lists for it, from the very bytes zarr parses
    (:class:`_CheckedMetadata`), before any value is decoded with its dtype, shape, fill value or
    codecs: a mismatch is a :class:`StoreChecksumError` naming the file and the rebuild command; a
    ``zarr.json`` the manifest does not list is a damaged manifest (:class:`StoreValidationError`).
    Arrays with the layout this module writes are read directly: the shard index once per shard
    (checked against its crc32c, then cached), then ONE ranged read of the sample's own inner chunk,
    checked against its crc32c and decoded (:func:`.shard_io.decode_checked`); anything else is read
    through zarr (whose crc32c codec checks the same bytes). Bytes that fail their crc32c raise
    :class:`StoreChecksumError` naming the store, the shard, the array and the sample; nothing
    decoded from them is ever returned. So do bytes the reader cannot have: a shard object that is
    missing (zarr would read it as the fill value: the writer writes every chunk, so absent is
    damaged, never zeros or NaN), shorter than its index says, or a row its index lists no chunk
    for. The files read whole (``sample_index.jsonl``,
    ``pairs.jsonl``, ``splits/<name>.npy``, each once, on first use) are checked against their
    sha256 in the manifest before any of their rows is used (:func:`.tables.read_checked`): a
    mismatch is a :class:`StoreChecksumError` naming the file.

    A local shard file is opened once (:class:`.shard_files.ShardFiles`, at most ``_MAX_OPEN_FILES``
    at once) and read with ``preadv``, never mapped: a file truncated while it is open is a short
    read, named, where a mapping would kill the process with SIGBUS.

    :meth:`read_frames` returns the sample's ``T`` frames as a new array (a chunk Blosc stored
    uncompressed is read straight into it, those frames only, the rest of the chunk into the
    reader's buffer, then checked over both; a compressed one is read into the reader's buffer,
    checked, then decoded by Blosc); :meth:`read_frames_into` decodes them into an array of yours
    (a padded batch's slot: read into the reader's buffer, checked, then copied).
    """

    def __init__(
        self, path: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
    ) -> None:
        given = StoreLocation.parse(path, storage_options)
        #: what the reader was opened on (``.../current`` stays that here; ``resolved`` is the store)
        self.opened_as: str = given.url
        self.lease: StoreLease | None = None
        for attempt in range(3):
            self._closed = False
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
        self._n = sum(int(s["num_rows"]) for s in self._shards)
        #: per sample: (shard_id, row, num_frames), from the sample index on first read
        self._where: list[tuple[int, int, int]] | None = None
        self._sample_index: list[dict[str, Any]] | None = None
        self._pairs: list[dict[str, Any]] | None = None
        self._splits: dict[str, np.ndarray[Any, Any]] = {}
        self._groups: dict[int, Any] = {}
        self._arrays: dict[tuple[int, str], Any] = {}
        self._direct_cache: dict[tuple[int, str], DirectArray | None] = {}
        self._files = ShardFiles(_MAX_OPEN_FILES)
        #: the local shard files found regular files (:func:`_check_regular`) before their first open
        self._regular: set[Path] = set()
        self._tls = threading.local()  # per thread: ``buf``, the buffer chunks are read into
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
        shard files this reader has open. The reader reads nothing afterwards: a read (of a sample,
        the sample index, a split or the pairs) raises :class:`ReaderClosedError`; open the store
        again to read it. Closing twice is harmless."""
        self._closed = True
        self._close_files()
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()

    def _close_files(self) -> None:
        files = getattr(self, "_files", None)
        if files is not None:
            files.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run (the reader then reads nothing: :class:`ReaderClosedError`)."""
        return getattr(self, "_closed", False)

    def _check_open(self) -> None:
        """:class:`ReaderClosedError` once :meth:`close` has run: a closed reader holds no lease, so
        its store may be gone (removed by ``stage2 gc``), and it is never read without its lease."""
        if self._closed:
            raise ReaderClosedError(
                f"{self.location.url}: this dataset was closed (close(), or the end of its `with` "
                "block; or the selection or reader it is): a closed one reads nothing, as it no longer "
                "holds its lease on the store, which `stage2 gc` may remove.",
                fix=f"open it again (e.g. VinOfflineDataset({self.opened_as!r}, split=...)) and read "
                "from the new one",
            )

    @property
    def _open_paths(self) -> list[Path]:
        """The shard files open now (least recently used first)."""
        return self._files.paths

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
    # which takes its own lease on the same (resolved) store. A closed reader stays closed there (as a
    # forked copy of it does): it takes no lease and reads nothing.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_groups"] = {}
        state["_arrays"] = {}
        state["_direct_cache"] = {}
        state["_files"] = None
        state["_regular"] = set()
        state["_tls"] = None
        state["lease"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._files = ShardFiles(_MAX_OPEN_FILES)
        self._regular = set()
        self._tls = threading.local()
        self._pid = os.getpid()
        self._closed = state.get("_closed", False)
        if self._closed:
            return
        self.lease = self._take_lease()
        if self.location.is_local and not (self.location.root / MANIFEST_NAME).is_file():
            self.close()
            # opened through `current`: that again; opened on a store's own folder (now gone): the
            # `current` beside it, which names the store published now
            current = self.location.root.parent / layout.CURRENT_LINK
            again = self.opened_as
            if Path(again).name != layout.CURRENT_LINK:
                again = str(current) if os.path.lexists(current) else "its stores folder's `current`"
            raise StoreNotFoundError(
                f"{self.location.url}: the store this reader was opened on is gone (removed since).",
                fix=f"open the published store again (e.g. {again})",
            )

    @property
    def num_samples(self) -> int:
        return self._n

    def __len__(self) -> int:
        return self.num_samples

    @property
    def sample_index(self) -> list[dict[str, Any]]:
        self._check_open()
        if self._sample_index is None:
            rows = read_jsonl(self.location, self.manifest, SAMPLE_INDEX_NAME)
            if len(rows) != self.num_samples:
                raise StoreError(
                    f"{self.path / SAMPLE_INDEX_NAME}: {len(rows)} rows but the manifest has {self.num_samples}.",
                    fix=f"validate the store (`validate_vin_offline_store`) and rebuild: "
                    f"{rebuild_command(self.location, self.manifest)}",
                )
            self._sample_index = rows
        return self._sample_index

    def split(self, name: str) -> np.ndarray[Any, Any]:
        self._check_open()
        check_split(name)
        if name not in self._splits:
            arr = read_npy(self.location, self.manifest, f"{SPLITS_DIR}/{name}.npy")
            self._splits[name] = np.asarray(arr, dtype=np.int64)
        return self._splits[name]

    def pairs(self) -> list[dict[str, Any]]:
        self._check_open()
        if self._pairs is None:
            self._pairs = read_jsonl(self.location, self.manifest, PAIRS_NAME)
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
            self._files = ShardFiles(_MAX_OPEN_FILES)  # the parent's: dropped here (its files stay open)
            self._tls = threading.local()
            self._pid = os.getpid()

    def _group(self, shard_id: int) -> Any:
        self._check_open()
        self._check_fork()
        g = self._groups.get(shard_id)
        if g is None:
            entry = self._shards[shard_id]
            local = self.path / entry["dir"] if self.location.is_local else None
            try:
                g = zarr.open_group(
                    store=_CheckedMetadata(
                        self._open_store(self.path / entry["dir"]),
                        self._metadata_check(shard_id),
                        self._missing_check(shard_id),
                        self._metadata_read(shard_id) if local is not None else None,
                        local,
                    ),
                    mode="r",
                    zarr_format=3,
                    use_consolidated=False,
                )
            except StoreError:  # a zarr.json that is not the manifest's (or is not listed in it)
                raise
            except CODE_ERRORS:
                raise
            except Exception as e:  # zarr parsing the group's zarr.json: any failure is a damaged store
                raise self._damaged_metadata(shard_id, "", e) from e
            self._groups[shard_id] = g
        return g

    def _array(self, shard_id: int, name: str) -> Any:
        g = self._group(shard_id)
        a = self._arrays.get((shard_id, name))
        if a is None:
            try:
                a = g[name]
            except StoreError:  # a zarr.json that is not the manifest's (or is not listed in it)
                raise
            except CODE_ERRORS:
                raise
            except Exception as e:  # zarr parsing the array's zarr.json: any failure is a damaged store
                raise self._damaged_metadata(shard_id, name, e) from e
            self._arrays[(shard_id, name)] = a
        return a

    def _metadata_check(self, shard_id: int) -> Any:
        """``check(key, data)`` for the shard's zarr store (:class:`_CheckedMetadata`): the bytes
        of the shard folder's ``key`` (a ``zarr.json``) against the sha256 the shard's manifest
        entry lists for it. StoreChecksumError naming the file and the rebuild command when they
        differ; StoreValidationError when the manifest does not list it. Each document is read and
        checked once per reader (zarr's group and arrays are cached)."""
        # (no reference to the reader itself: the group zarr caches holds this, and a cycle through
        # the reader would keep it, and its lease, alive after its last use until a GC pass)
        entry, loc, manifest = self._shards[shard_id], self.location, self.manifest

        def check(key: str, data: bytes) -> None:
            rel = f"{entry['dir']}/{key}"
            want = listed_sha256(loc, manifest, rel, entry.get("files") or [])
            check_sha256(loc, manifest, rel, data, want)

        return check

    def _metadata_read(self, shard_id: int) -> Callable[[str], bytes | None]:
        """``read(key)`` for a local shard's zarr store (:class:`_CheckedMetadata`): the bytes of the
        shard folder's ``key`` (a ``zarr.json``), None when it is absent; a FIFO, device, socket or
        folder there is never opened (:func:`.tables.read_store_file`: StoreChecksumError)."""
        entry, loc, manifest = self._shards[shard_id], self.location, self.manifest

        def read(key: str) -> bytes | None:
            return read_store_file(loc, manifest, f"{entry['dir']}/{key}")

        return read

    def _missing_check(self, shard_id: int) -> Callable[[str], None]:
        """``missing(key)`` for the shard's zarr store (:class:`_CheckedMetadata`): raises
        :class:`_Unreadable` for a chunk key of the shard folder that zarr found absent."""
        entry, loc = self._shards[shard_id], self.location

        def missing(key: str) -> None:
            rel = f"{entry['dir']}/{key}"
            listed = any(isinstance(f, dict) and f.get("path") == rel for f in entry.get("files") or [])
            why = "listed in the manifest" if listed else "not even listed in the manifest"
            raise _Unreadable(
                f"{loc.display(loc.root / rel)} is missing ({why}; a store's writer writes every chunk, "
                "and zarr would read an absent one as the fill value)"
            )

        return missing

    def _damaged_metadata(self, shard_id: int, name: str, e: Exception) -> StoreValidationError:
        """The error for a shard's group or array metadata (``zarr.json``) that zarr cannot open."""
        where = self.path / self._shards[shard_id]["dir"] / name / "zarr.json"  # name "": the group's
        return StoreValidationError(
            f"VIN offline store {self.location.url} is damaged",
            [f"{where}: zarr cannot open it ({type(e).__name__}: {e})"],
            fix=f"rebuild it: {rebuild_command(self.location, self.manifest)}",
        )

    # -- direct shard reads ------------------------------------------------------------------------
    def _read_into(self, path: Path, offset: int, buffers: Sequence[Any]) -> None:
        """Fill ``buffers`` (writable byte buffers, in order) with the bytes of ``path`` from
        ``offset`` on: one ``preadv`` of a local file (a hook: tests wrap it to count reads).
        :class:`_Unreadable` when the file is missing, is not a regular file (a FIFO: never opened,
        so never waited on) or ends first (truncated)."""
        self._check_open()
        self._check_fork()
        views = [memoryview(b).cast("B") for b in buffers]
        length = sum(len(v) for v in views)
        try:
            if self.location.is_local:
                if path not in self._regular:  # (once per file: store files are never replaced)
                    _check_regular(path)
                    self._regular.add(path)
                got = self._files.read_into(path, offset, views)
            else:
                data = self.location.read_range(path, offset, length)
                got, at = len(data), 0
                for v in views:
                    part = data[at : at + len(v)]
                    v[: len(part)] = part
                    at += len(v)
        except FileNotFoundError:
            raise _Unreadable(f"{path} is missing") from None
        if got != length:
            raise _Unreadable(
                f"{path} is truncated ({got} of {length} bytes at offset {offset}: "
                "the file ends before its index says)"
            )

    def _shard_file_size(self, path: Path) -> int:
        """The size of the shard object ``path`` (:func:`.shard_io.direct_array`'s ``size_of``): a
        local one that is not a regular file is :class:`_Unreadable` (looked at, never opened: a
        FIFO's size, 0, would be taken for a truncated file); FileNotFoundError when it is missing."""
        if self.location.is_local:
            _check_regular(path)
            self._regular.add(path)
        return self.location.size(path)

    def _buffer(self, length: int) -> memoryview:
        """This thread's read buffer, ``length`` bytes of it (valid until this thread's next read;
        grown by a new buffer, never resized under a view of the old one)."""
        tls = self._tls
        buf = getattr(tls, "buf", None)
        if buf is None or len(buf) < length:
            buf = tls.buf = bytearray(max(length, 1 << 16))
        return memoryview(buf)[:length]

    def _read_range(self, path: Path, offset: int, length: int) -> memoryview:
        """``length`` bytes of ``path`` at ``offset``, in this thread's read buffer: valid until
        this thread's next read (:meth:`_read_into`)."""
        view = self._buffer(length)
        self._read_into(path, offset, [view])
        return view

    def _direct(self, shard_id: int, name: str) -> DirectArray | None:
        """The shard index of one array, read once and cached, when the array has the layout this
        module writes (else None: zarr reads it). A sample then costs one read of its own chunk.
        :class:`_Unreadable` when its shard object is missing or too short for its index."""
        key = (shard_id, name)
        if key in self._direct_cache:
            return self._direct_cache[key]
        arr = self._array(shard_id, name)
        path = self.path / self._shards[shard_id]["dir"] / name
        try:
            d = direct_array(arr, path, self._read_range, self._shard_file_size)
        except FileNotFoundError as e:
            where = self.location.display(Path(e.filename)) if e.filename else self.location.display(path)
            raise _Unreadable(
                f"{where} is missing (a store's writer writes every chunk, and zarr would read an absent "
                "one as the fill value)"
            ) from None
        except (StoreChecksumError, ReaderClosedError):
            raise
        except StoreError as e:  # too short to hold its index: truncated
            raise _Unreadable(f"{e.message} (truncated)") from None
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
            fix=f"the store is damaged; rebuild it: {rebuild_command(self.location, self.manifest)}",
        )

    def _decode(self, shard_id: int, name: str, d: DirectArray, row: int, n: int, out: Any = None) -> Any:
        """The first ``n`` entries of row ``row`` of a direct array, its crc32c checked: a new array
        (``out`` None), or decoded into ``out[:n]`` (:func:`.shard_io.decode_checked`)."""
        off, nbytes = d.entries[row]
        if off == MISSING and nbytes == MISSING:  # never written by a store's writer
            raise self._corrupt(
                shard_id,
                name,
                row,
                "the shard index lists no chunk for it (a store's writer writes every chunk)",
            )
        try:
            if out is None and nbytes == uncompressed_size(d):
                header, copy, rest = split_buffers(d, n)  # its data read straight into the new array
                tail = self._buffer(rest)
                self._read_into(d.path, off, [header, copy, tail])
                got = split_checked(d, header, copy, tail)
                if got is False:
                    raise self._corrupt(
                        shard_id, name, row, f"{nbytes} bytes at offset {off} fail their crc32c"
                    )
                if got is not True:
                    return got
            decoded = decode_checked(d, self._read_range(d.path, off, nbytes), n, out)
        except _Unreadable as e:
            raise self._corrupt(shard_id, name, row, e.detail) from None
        except (RuntimeError, ValueError) as e:  # intact bytes that Blosc refuses: not our writer's
            raise self._corrupt(shard_id, name, row, f"cannot be decompressed ({e})") from None
        if decoded is None:
            raise self._corrupt(shard_id, name, row, f"{nbytes} bytes at offset {off} fail their crc32c")
        return decoded

    def _checked_direct(self, shard_id: int, name: str, row: int) -> DirectArray | None:
        if (shard_id, name) not in self._direct_cache:
            # the array's metadata first: a damaged zarr.json is named as it is (its file), never
            # as a shard index failing its crc32c
            self._array(shard_id, name)
        try:
            return self._direct(shard_id, name)
        except _Unreadable as e:
            raise self._corrupt(shard_id, name, row, e.detail) from None
        except StoreChecksumError as e:
            raise self._corrupt(
                shard_id, name, row, f"the shard index fails its crc32c ({e.message})"
            ) from None

    def _read_row(self, shard_id: int, name: str, row: int) -> np.ndarray[Any, Any] | None:
        """One whole row of a direct array (padding included), or None (zarr reads it)."""
        d = self._checked_direct(shard_id, name, row)
        if d is None:
            return None
        return self._decode(shard_id, name, d, row, d.inner[1])  # type: ignore[no-any-return]

    def _zarr_read(self, shard_id: int, name: str, sel: Any) -> np.ndarray[Any, Any]:
        """``array[sel]`` through zarr; bytes failing zarr's crc32c codec raise StoreChecksumError."""
        arr = self._array(shard_id, name)
        row = sel[0] if isinstance(sel, tuple) and isinstance(sel[0], int) else None
        try:
            return np.asarray(arr[sel])
        except _Unreadable as e:  # a chunk zarr found absent (it would give the fill value)
            raise self._corrupt(shard_id, name, row, e.detail) from None
        except ValueError as e:  # a crc32c mismatch, or bytes the array's metadata cannot decode
            detail = f"fails its crc32c ({e})" if "checksum" in str(e) else f"cannot be decoded ({e})"
            raise self._corrupt(shard_id, name, row, detail) from None

    def _padded_row(self, shard_id: int, name: str, row: int) -> np.ndarray[Any, Any]:
        """One whole row of an array (padding included), decoded as :meth:`read_frames` decodes it."""
        direct = self._read_row(shard_id, name, row)
        if direct is not None:
            return direct
        return self._zarr_read(shard_id, name, (row,))

    def _row(self, i: int) -> dict[str, Any]:
        i = operator.index(i)
        self._locate(i)
        return self.sample_index[i]

    def _locate(self, i: int) -> tuple[int, int, int]:
        """(shard_id, row, num_frames) of sample ``i``, or IndexError (ReaderClosedError once
        closed)."""
        self._check_open()
        i = operator.index(i)
        if not 0 <= i < self._n:
            raise IndexError(f"sample index {i} out of range [0, {self._n})")
        where = self._where
        if where is None:
            rows = self.sample_index
            where = [(int(r["shard_id"]), int(r["row"]), int(r["num_frames"])) for r in rows]
            self._where = where
        return where[i]

    def read_frames(self, i: int) -> np.ndarray[Any, Any]:
        """Sample ``i``'s frames, uint8 ``(T, H, W, 3)``: a new writable array (never a view of the
        store's bytes), its chunk's crc32c checked first."""
        shard_id, row, t = self._locate(i)
        d = self._checked_direct(shard_id, BLOCK_FRAMES, row)
        if d is None:
            return self._zarr_read(shard_id, BLOCK_FRAMES, (row, slice(0, t)))
        return self._decode(shard_id, BLOCK_FRAMES, d, row, t)  # type: ignore[no-any-return]

    def read_frames_into(self, i: int, out: np.ndarray[Any, Any]) -> int:
        """Sample ``i``'s ``T`` frames decoded straight into ``out[:T]``, and zeros into ``out[T:]``;
        returns ``T``. ``out``: a writable, C-contiguous uint8 array ``(N, H, W, 3)`` with ``N >= T``,
        e.g. one sample's slot of a batch padded to its longest sample (``batch[b]``), so a frame
        goes from the page cache to the batch in one copy. The chunk's crc32c is checked first, as
        by :meth:`read_frames`: nothing is written into ``out`` from bytes that fail it."""
        shard_id, row, t = self._locate(i)
        d = self._checked_direct(shard_id, BLOCK_FRAMES, row)
        frame = tuple(d.inner[2:] if d is not None else self._array(shard_id, BLOCK_FRAMES).shape[2:])
        ok = isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.shape[1:] == frame
        if not (ok and out.shape[0] >= t and out.flags.c_contiguous and out.flags.writeable):
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            flags = (
                ""
                if not isinstance(out, np.ndarray)
                else f" (C-contiguous: {out.flags.c_contiguous}, writeable: {out.flags.writeable})"
            )
            raise LoaderError(
                f"read_frames_into({i}, out): sample {i} is {t} frames of {frame}; out is {got}{flags}.",
                fix="give a writable C-contiguous uint8 array of shape "
                f"({', '.join(['N', *map(str, frame)])}) with N >= {t}, e.g. "
                f"np.zeros(({', '.join(map(str, (t, *frame)))}), np.uint8)",
            )
        if d is None:
            out[:t] = self._zarr_read(shard_id, BLOCK_FRAMES, (row, slice(0, t)))
        else:
            self._decode(shard_id, BLOCK_FRAMES, d, row, t, out)
        out[t:] = 0
        return t

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
