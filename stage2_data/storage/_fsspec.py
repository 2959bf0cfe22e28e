"""A store location on object storage, through any fsspec filesystem (``s3://`` with s3fs, ...).

Object storage has no rename, so the commit protocol there is: data objects first, the commit
marker (``manifest.json``) LAST in one PUT (a prefix without it is never a store: readers and
validation refuse it), and the ``CURRENT`` object, naming the published store, after that.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import StoreError
from ._base import _CHUNK, CURRENT_OBJECT, StoreLocation, backend_error


@dataclass(frozen=True, eq=False)
class FsspecLocation(StoreLocation, backend="fsspec"):
    """An fsspec prefix; ``root`` is ``bucket/prefix`` (the fsspec path, without the scheme)."""

    @classmethod
    def from_target(cls, target: str, storage_options: dict[str, Any] | None = None) -> FsspecLocation:
        import fsspec

        protocol = target.split("://", 1)[0]
        opts = dict(storage_options or {})
        try:
            fs = fsspec.filesystem(protocol, **opts)
        except (ImportError, ValueError) as e:
            raise backend_error(target, e) from None
        key = fs._strip_protocol(target).rstrip("/")
        if not key or "/" not in key.strip("/"):
            raise StoreError(
                f"{target}: a store needs a prefix inside the bucket (e.g. s3://bucket/stores/name).",
                fix="add a prefix to the URL",
            )
        return cls(root=Path(key), url=f"{protocol}://{key}", protocol=protocol, storage_options=opts, fs=fs)

    def child(self, rel: str) -> StoreLocation:
        p = self.root / rel
        return FsspecLocation(
            root=p,
            url=f"{self.protocol}://{p.as_posix()}",
            protocol=self.protocol,
            storage_options=self.storage_options,
            fs=self.fs,
        )

    def display(self, p: Path | None = None) -> str:
        return self.url if p is None else f"{self.protocol}://{p.as_posix()}"

    # -- reads -------------------------------------------------------------------------------------
    def is_file(self, p: Path) -> bool:
        return bool(self.fs.isfile(self._k(p)))

    def is_dir(self, p: Path) -> bool:
        return bool(self.fs.isdir(self._k(p)))

    def exists(self, p: Path) -> bool:
        return bool(self.fs.exists(self._k(p)))

    def size(self, p: Path) -> int:
        return int(self.fs.size(self._k(p)))

    def read_bytes(self, p: Path) -> bytes:
        data: bytes = self.fs.cat_file(self._k(p))
        return data

    def read_range(self, p: Path, offset: int, length: int) -> bytes:
        data: bytes = self.fs.cat_file(self._k(p), start=offset, end=offset + length)
        return data

    def open_read(self, p: Path) -> IO[bytes]:
        f: IO[bytes] = self.fs.open(self._k(p), "rb", block_size=_CHUNK)
        return f

    def listdir_names(self, p: Path) -> set[str]:
        try:
            return {Path(e).name for e in self.fs.ls(self._k(p), detail=False) if Path(e).name}
        except FileNotFoundError:
            return set()

    def tree_files(self, sub: Path) -> list[str]:
        try:
            found = self.fs.find(self._k(sub))
        except FileNotFoundError:
            return []
        base = self._k(self.root).rstrip("/") + "/"
        return sorted(f[len(base) :] for f in found if f.startswith(base))

    def file_sizes(self) -> dict[str, int]:
        """One listing (a LIST per 1,000 keys) instead of a request per file."""
        try:
            found = self.fs.find(self._k(self.root), detail=True)
        except FileNotFoundError:
            return {}
        base = self._k(self.root).rstrip("/") + "/"
        return {
            k[len(base) :]: int(v.get("size") or 0)
            for k, v in found.items()
            if k.startswith(base) and v.get("type") != "directory"
        }

    def sha256_files(self, paths: Sequence[Path], workers: int = 8) -> dict[str, str]:
        def one(p: Path) -> tuple[str, str]:
            h = hashlib.sha256()
            with self.open_read(p) as f:
                while buf := f.read(_CHUNK):
                    h.update(buf)
            return str(p), h.hexdigest()

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return dict(pool.map(one, paths))

    def zarr_store(self, p: Path, read_only: bool = True) -> Any:
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(
            f"{self.protocol}://{self._k(p)}", storage_options=self.storage_options, read_only=read_only
        )

    # -- writes ------------------------------------------------------------------------------------
    def open_write(self, p: Path) -> IO[bytes]:
        f: IO[bytes] = self.fs.open(self._k(p), "wb")
        return f

    def write_bytes(self, p: Path, data: bytes) -> None:
        self.fs.pipe_file(self._k(p), data)

    def put_file(self, local: Path, p: Path) -> None:
        self.fs.put_file(str(local), self._k(p))

    def delete(self, p: Path) -> None:
        with contextlib.suppress(Exception):
            self.fs.rm_file(self._k(p))

    def delete_tree(self, p: Path | None = None) -> None:
        p = self.root if p is None else p
        with contextlib.suppress(Exception):
            self.fs.rm(self._k(p), recursive=True)
        self.invalidate()

    def invalidate(self) -> None:
        self.fs.invalidate_cache()

    # -- the commit protocol -------------------------------------------------------------------------
    def commit(self, p: Path, data: bytes) -> None:
        self.write_bytes(p, data)  # one PUT, LAST: the commit marker
        self.invalidate()

    def publish_current(self, name: str) -> None:
        self.write_bytes(self.root / CURRENT_OBJECT, (name + "\n").encode())

    def current(self) -> StoreLocation | None:
        marker = self.root / CURRENT_OBJECT
        if not self.is_file(marker):
            return None
        return self.child(self.read_bytes(marker).decode().strip())


__all__ = ["FsspecLocation"]
