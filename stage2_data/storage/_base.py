"""The common interface of a store location, and the parsing of a target into one."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..errors import StoreError

_CHUNK = 8 << 20
#: The backends, registered by their modules (``class LocalLocation(StoreLocation, backend="local")``).
_BACKENDS: dict[str, type[StoreLocation]] = {}
#: On object storage: the object naming the published store folder under ``<url>/<profile>/``.
CURRENT_OBJECT = "CURRENT"
#: A store's commit marker, written last (``store.format.MANIFEST_NAME``; the storage layer imports
#: nothing of the store module): a folder without it is not a complete store.
MANIFEST_NAME = "manifest.json"
#: On object storage: the folder of a profile's stores folder (``<url>/<profile>/.quarantine/``) that a
#: store failing the publication gate is moved into, under ``<UTC time>/<name>/`` (no rename exists
#: there: copied, then withdrawn). Hidden, as ``.leases`` is locally: retention never lists it.
QUARANTINE_DIR = ".quarantine"
#: In each quarantine folder: what was moved there (from, to), when and why (as locally).
MOVED_FILE = "moved.json"


def is_url(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is an fsspec URL (``scheme://...``) rather than a local path."""
    s = os.fspath(target)
    return "://" in s and s[:7].lower() != "file://"


def normal_url(target: str) -> str:
    """``target`` with its URL scheme in lower case (``S3://b/x`` is ``s3://b/x``; ``FILE:///x`` is
    ``file:///x``), as URL schemes are compared; a path as it is."""
    if "://" not in target:
        return target
    scheme, rest = target.split("://", 1)
    return f"{scheme.lower()}://{rest}" if _SCHEME.match(scheme + ":") else target


#: a URL scheme at the start of a target (two letters at least: ``s3:``, ``gs:``, ``memory:``)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


#: the package that gives fsspec a scheme, for the schemes a store is most often on
_BACKEND_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}  # fmt: skip


#: the URL schemes a store can be on: object storage (and fsspec's one-process memory, for tests)
STORE_SCHEMES = frozenset({*_BACKEND_PACKAGES, "memory"})


def unusable_store_url(s: str) -> StoreError | None:
    """The error for a URL no store can be at, else None: a scheme that is not object storage
    (``ftp://``, ``http://``, ``zip://``: stores are listed, read and written as whole objects), a
    ``file://`` URL whose path is not absolute (``file://relative/x`` would name a folder under the
    working folder)."""
    if s[:7].lower() == "file://":
        path = s[len("file://") :]
        if path.startswith("/"):
            return None
        return StoreError(
            f"{s!r} is not a file:// URL of a folder: its path must be absolute (file:// then /...).",
            fix=f"write file:///{path} if you meant /{path}, or the path alone ({path}) for a folder "
            "under the working folder",
        )
    if not is_url(s):
        return None
    scheme = s.split("://", 1)[0].lower()
    if scheme in STORE_SCHEMES:
        return None
    return StoreError(
        f"{s!r}: a store cannot be on {scheme}:// (stores are kept in a local folder or on object "
        "storage: s3://, gs://, az://).",
        fix="write a local folder (or file:///absolute/path), or s3://BUCKET/PREFIX (gs://, az:// likewise)",
    )


def backend_error(target: str, e: Exception) -> StoreError:
    """The error for an fsspec scheme whose backend cannot be loaded (fsspec names the package)."""
    package = _BACKEND_PACKAGES.get(target.split("://", 1)[0].lower())
    return StoreError(
        f"{target}: cannot open the storage ({e}).",
        fix=f"`pip install {package}`"
        if package
        else "install the package fsspec names above for this scheme",
    )


def _url_typo(s: str) -> StoreError | None:
    """The error for a URL mistyped into a local path (``s3:/bucket``, ``s3:bucket``), else None."""
    scheme = _SCHEME.match(s)
    if scheme is None or is_url(s):
        return None
    if scheme[1].lower() == "file":  # file:/x: a local folder's URL needs file:// then its path
        path = s[len(scheme[0]) :]
        return StoreError(
            f"{s!r} starts like a file:// URL but is not one (a URL is file:// then the path, "
            "e.g. file:///data/stores).",
            fix=f"write file://{path}, or the path alone"
            if path.startswith("/")
            else f"write the path alone ({path}), or file:// then its absolute path",
        )
    return StoreError(
        f"{s!r} starts like a URL but is not one (a URL is {scheme[1]}://BUCKET/PREFIX); as a path, "
        f"it would name a local folder {scheme[1]}:",
        fix=f"write {scheme[1]}://BUCKET/PREFIX, with two slashes (for a local folder of that name: ./{s})",
    )


def check_stores_url(target: str | os.PathLike[str]) -> None:
    """Refuse, before any work, a target for a profile's stores folder (``--store-url``) that cannot
    be one: a URL mistyped into a local path (``s3:/bucket``, ``s3:bucket``: a local folder of that
    name would be written), a URL without a bucket (``s3://``), or a scheme whose fsspec backend is
    not installed. A local folder (or ``file://``) passes."""
    s = normal_url(os.fspath(target))
    if (unusable := unusable_store_url(s)) is not None:
        raise unusable
    if s.startswith("file://"):
        return
    if not is_url(s):
        if (typo := _url_typo(s)) is not None:
            raise typo
        return
    protocol, rest = s.split("://", 1)
    if protocol.lower() == "memory":  # one process's memory: a build's runs are other processes
        raise StoreError(
            f"{s!r}: fsspec's memory:// file system lives in one process, and the store a build's run "
            "writes there is gone when that run ends (nothing could read it).",
            fix="write the store to a folder (leave out --store-url: it goes under --data-root) or to "
            "object storage (s3://BUCKET/PREFIX)",
        )
    if not rest.strip("/"):
        raise StoreError(
            f"{s!r} names no bucket.",
            fix=f"write {protocol}://BUCKET/PREFIX, e.g. {protocol}://bucket/stores",
        )
    import fsspec

    try:
        fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as e:
        raise backend_error(s, e) from None


def check_stores_target(
    target: str | os.PathLike[str], name: str, storage_options: dict[str, Any] | None = None
) -> None:
    """Refuse, before any work, a stores folder (``--store-url``) a build could not write the store
    of profile ``name`` under: :func:`check_stores_url`, then, on object storage, a probe of
    ``<target>/<name>/`` (:meth:`StoreLocation.check_writable`: credentials found and accepted, the
    endpoint answers, the bucket exists and takes a write there), each failure a named StoreError."""
    check_stores_url(target)
    s = os.fspath(target)
    if is_url(s):
        StoreLocation.parse(join_url(s, name), storage_options).check_writable()


def join_url(target: str, name: str) -> str:
    """``target`` (a local folder or a URL) with ``name`` under it; a URL keeps its ``scheme://``."""
    if is_url(target):
        protocol, rest = target.split("://", 1)
        return f"{protocol}://{rest.rstrip('/')}/{name}"
    return os.path.join(target, name)


@dataclass(frozen=True, eq=False)
class StoreLocation:
    """A local folder (:class:`LocalLocation`, ``fs is None``) or an fsspec prefix
    (:class:`FsspecLocation`, ``fs`` set, ``root`` = ``bucket/prefix``).

    Build one with :meth:`parse`; ``StoreLocation(root=..., url=..., fs=...)`` also gives the right
    subclass. Paths are :class:`pathlib.Path` values on both backends (``root / rel``);
    :meth:`display` names one for messages.

    ``given`` is the local path as the user gave it (``~`` expanded, not made absolute), kept
    beside ``root`` for messages (a relative one with nothing there is said to be taken relative
    to the working folder); ``""`` when the location was not parsed from a user's path.
    """

    root: Path
    url: str
    protocol: str = "file"
    storage_options: dict[str, Any] = field(default_factory=dict)
    fs: Any = None
    given: str = ""

    def __init_subclass__(cls, *, backend: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if backend is not None:
            _BACKENDS[backend] = cls

    def __new__(cls, *args: Any, **kwargs: Any) -> StoreLocation:
        if cls is StoreLocation:  # the base names no backend: pick it from ``fs``
            fs = kwargs.get("fs", args[4] if len(args) > 4 else None)
            cls = _BACKENDS["local" if fs is None else "fsspec"]
        return object.__new__(cls)

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def parse(
        cls,
        target: str | os.PathLike[str] | StoreLocation,
        storage_options: dict[str, Any] | None = None,
    ) -> StoreLocation:
        """A location from a local path (``~`` expanded), a ``file://`` URL, an fsspec URL
        (``s3://bucket/prefix``) or a location (returned as is). Raises StoreError for an unusable URL, and for a path that
        does not exist and reads as a mistyped URL (``s3:/bucket``)."""
        if isinstance(target, StoreLocation):
            return target
        s = normal_url(os.fspath(target))
        if (unusable := unusable_store_url(s)) is not None:
            raise unusable
        if s.startswith("file://"):
            s = s[len("file://") :]
        if not is_url(s):
            s = os.path.expanduser(s)  # `~/stores/...` in Python, as a shell would have expanded it
            if not os.path.lexists(s) and (typo := _url_typo(s)) is not None:
                raise typo  # a local folder of that name opens; a missing one was a URL's typo
            return _BACKENDS["local"].from_target(s, None)
        return _BACKENDS["fsspec"].from_target(s, storage_options)

    @classmethod
    def from_target(cls, target: str, storage_options: dict[str, Any] | None) -> StoreLocation:
        """This backend's location for ``target`` (a local path or a URL of this backend)."""
        raise NotImplementedError

    @property
    def is_local(self) -> bool:
        return self.fs is None

    def child(self, rel: str) -> StoreLocation:
        """The location of ``rel`` under this one (same backend)."""
        raise NotImplementedError

    def display(self, p: Path | None = None) -> str:
        """A path of this location (``root / rel``) as a user reads it (``s3://bucket/key`` remote)."""
        raise NotImplementedError

    def _k(self, p: Path) -> str:
        return p.as_posix()

    def check_writable(self) -> None:
        """Refuse a location a store cannot be written under, found by a cheap probe (object
        storage: no credentials, credentials refused, access denied, no such bucket, an endpoint
        that does not answer); locally nothing is probed (a folder's faults are named when written)."""

    # -- reads -------------------------------------------------------------------------------------
    def is_file(self, p: Path) -> bool:
        raise NotImplementedError

    def is_dir(self, p: Path) -> bool:
        raise NotImplementedError

    def exists(self, p: Path) -> bool:
        raise NotImplementedError

    def size(self, p: Path) -> int:
        raise NotImplementedError

    def read_bytes(self, p: Path) -> bytes:
        raise NotImplementedError

    def read_range(self, p: Path, offset: int, length: int) -> bytes:
        raise NotImplementedError

    def open_read(self, p: Path) -> IO[bytes]:
        """A binary file object reading ``p`` (close it)."""
        raise NotImplementedError

    def listdir_names(self, p: Path) -> set[str]:
        """Names of the entries directly under folder ``p`` (empty when absent)."""
        raise NotImplementedError

    def tree_files(self, sub: Path) -> list[str]:
        """Every file under ``sub``, as posix paths relative to ``root``, sorted."""
        raise NotImplementedError

    def file_sizes(self) -> dict[str, int]:
        """Every file under the location (relative posix path -> bytes)."""
        raise NotImplementedError

    def sha256_files(self, paths: Sequence[Path], workers: int = 8) -> dict[str, str]:
        """sha256 of each file, keyed by ``str(path)``."""
        raise NotImplementedError

    def zarr_store(self, p: Path, read_only: bool = True) -> Any:
        """zarr's ``LocalStore`` (local) or ``FsspecStore`` (object storage) over folder ``p``."""
        raise NotImplementedError

    # -- writes ------------------------------------------------------------------------------------
    def open_write(self, p: Path) -> IO[bytes]:
        """A binary file object writing ``p`` (parents created; close it)."""
        raise NotImplementedError

    def write_bytes(self, p: Path, data: bytes) -> None:
        """Write a whole object: one PUT on object storage (atomic per object); temp + rename locally."""
        raise NotImplementedError

    def put_file(self, local: Path, p: Path) -> None:
        """Upload a local file to ``p`` (copy when local)."""
        raise NotImplementedError

    def put_files(self, pairs: Sequence[tuple[Path, Path]], workers: int = 8) -> None:
        """Upload many (local file, destination) pairs in parallel."""
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(lambda lp: self.put_file(*lp), pairs))

    def copy_verified(self, src: StoreLocation, sp: Path, dp: Path, expected_sha: str) -> None:
        """Copy ``src``'s file ``sp`` to ``dp`` here, streaming; refuse when its sha256 differs
        (the partial copy is deleted)."""
        h = hashlib.sha256()
        fi = src.open_read(sp)
        fo = self.open_write(dp)
        ok = False
        try:
            with fi:
                while buf := fi.read(_CHUNK):
                    h.update(buf)
                    fo.write(buf)
                if h.hexdigest() != expected_sha:
                    raise StoreError(
                        f"{src.display(sp)}: sha256 {h.hexdigest()} differs from its manifest ({expected_sha}); "
                        "refusing to merge it.",
                        fix="validate the source store with deep=True and rebuild it",
                    )
            ok = True
        finally:
            if ok:
                fo.close()
            else:
                with contextlib.suppress(Exception):
                    fo.close()
                self.delete(dp)

    def delete(self, p: Path) -> None:
        """Delete one file (missing is fine)."""
        raise NotImplementedError

    def delete_tree(self, p: Path | None = None) -> None:
        """Delete everything under ``p`` (default: the whole location); missing is fine."""
        raise NotImplementedError

    def invalidate(self) -> None:
        """Forget cached listings (object storage)."""

    # -- the commit protocol -------------------------------------------------------------------------
    def commit(self, p: Path, data: bytes) -> None:
        """Write the commit marker ``p`` (a store's ``manifest.json``) LAST: its presence means
        complete. Locally a temp file renamed into place (ordinary permissions) and the folder
        fsynced; on object storage one PUT (no rename exists there)."""
        raise NotImplementedError

    def withdraw(self, marker: str) -> None:
        """Un-commit, then delete: the commit marker ``root/marker`` first (from then on no reader
        sees a complete store), then everything under the location."""
        self.delete(self.root / marker)
        self.delete_tree(self.root)
        self.invalidate()

    def publish_current(self, name: str) -> str | None:
        """Make the child folder ``name`` the published one: locally the ``current`` symlink is
        swapped atomically; on object storage the ``CURRENT`` object is written (after the store's
        own manifest, so it never names an incomplete store). Returns ``"<from> -> <to>"`` when
        something that stood for ``current`` (not a publication: a folder a user put there) was
        moved aside to make the link, else None."""
        raise NotImplementedError

    def current(self) -> StoreLocation | None:
        """The published child folder (:meth:`publish_current`), or None when none is published."""
        raise NotImplementedError

    def withdraw_current(self, name: str) -> bool:
        """Withdraw the publication when it names the child folder ``name`` (a store about to be
        written there again): nothing is published until :meth:`publish_current` names a store
        that passed the gate. True when something was withdrawn."""
        raise NotImplementedError

    def current_problem(self) -> str | None:
        """Why what stands for ``current`` here publishes no store (a ``CURRENT`` object naming a
        folder without a manifest, or no folder of this location), in one line; None when nothing
        stands there or it names a store. Only object storage says more than :meth:`current`."""
        return None


__all__ = ["CURRENT_OBJECT", "StoreLocation", "check_stores_target", "is_url"]
