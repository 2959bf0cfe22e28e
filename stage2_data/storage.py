"""Where a store lives: a local folder or an object-storage prefix (any fsspec URL, e.g. ``s3://``).

:class:`StoreLocation` gives the store module the few operations it needs, on both backends:

* paths are :class:`pathlib.Path` values in both cases: the absolute folder for a local store, and
  ``bucket/prefix`` (the fsspec path, without the scheme) for an object store, so ``root / rel``
  works the same way; :meth:`StoreLocation.display` names a file for messages (``s3://...``);
* read whole / read a byte range / size / exists / list / hash, write bytes (local: tmp + rename;
  object storage: one PUT, atomic per object), upload a local file, delete a tree;
* :meth:`StoreLocation.zarr_store`: zarr's ``LocalStore`` or ``FsspecStore`` over a folder.

Object storage has no rename, so the commit protocol there is: data objects first, ``manifest.json``
LAST (one PUT): a prefix without it is never a store (readers and validation refuse it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StoreError
from .hashing import sha256_files_parallel

_CHUNK = 8 << 20


def is_url(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is an fsspec URL (``scheme://...``) rather than a local path."""
    s = os.fspath(target)
    return "://" in s and not s.startswith("file://")


@dataclass(frozen=True, eq=False)
class StoreLocation:
    """A local folder (``fs is None``) or an fsspec prefix (``fs`` set, ``root`` = ``bucket/prefix``)."""

    root: Path
    url: str
    protocol: str = "file"
    storage_options: dict[str, Any] = field(default_factory=dict)
    fs: Any = None

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def parse(
        cls,
        target: str | os.PathLike[str] | StoreLocation,
        storage_options: dict[str, Any] | None = None,
    ) -> StoreLocation:
        if isinstance(target, StoreLocation):
            return target
        s = os.fspath(target)
        if s.startswith("file://"):
            s = s[len("file://") :]
        if not is_url(s):
            p = Path(s).absolute()
            return cls(root=p, url=str(p))
        import fsspec

        protocol = s.split("://", 1)[0]
        opts = dict(storage_options or {})
        try:
            fs = fsspec.filesystem(protocol, **opts)
        except (ImportError, ValueError) as e:
            raise StoreError(
                f"{s}: cannot open the storage ({e}).",
                fix="install the fsspec backend for this scheme (s3: `pip install s3fs`)",
            ) from None
        key = fs._strip_protocol(s).rstrip("/")
        if not key or "/" not in key.strip("/"):
            raise StoreError(
                f"{s}: a store needs a prefix inside the bucket (e.g. s3://bucket/stores/name).",
                fix="add a prefix to the URL",
            )
        return cls(root=Path(key), url=f"{protocol}://{key}", protocol=protocol, storage_options=opts, fs=fs)

    @property
    def is_local(self) -> bool:
        return self.fs is None

    def child(self, rel: str) -> StoreLocation:
        """The location of ``rel`` under this one (same backend)."""
        if self.fs is None:
            p = self.root / rel
            return StoreLocation(root=p, url=str(p))
        p = self.root / rel
        return StoreLocation(
            root=p,
            url=f"{self.protocol}://{p.as_posix()}",
            protocol=self.protocol,
            storage_options=self.storage_options,
            fs=self.fs,
        )

    def display(self, p: Path | None = None) -> str:
        """A path of this location (``root / rel``) as a user reads it (``s3://bucket/key`` remote)."""
        if p is None:
            return self.url
        if self.fs is None:
            return str(p)
        return f"{self.protocol}://{p.as_posix()}"

    def _k(self, p: Path) -> str:
        return p.as_posix()

    # -- reads -------------------------------------------------------------------------------------
    def is_file(self, p: Path) -> bool:
        if self.fs is None:
            return p.is_file()
        return bool(self.fs.isfile(self._k(p)))

    def is_dir(self, p: Path) -> bool:
        if self.fs is None:
            return p.is_dir()
        return bool(self.fs.isdir(self._k(p)))

    def exists(self, p: Path) -> bool:
        if self.fs is None:
            return p.exists()
        return bool(self.fs.exists(self._k(p)))

    def size(self, p: Path) -> int:
        if self.fs is None:
            return p.stat().st_size
        return int(self.fs.size(self._k(p)))

    def read_bytes(self, p: Path) -> bytes:
        if self.fs is None:
            return p.read_bytes()
        data: bytes = self.fs.cat_file(self._k(p))
        return data

    def read_range(self, p: Path, offset: int, length: int) -> bytes:
        if self.fs is None:
            with open(p, "rb", buffering=0) as f:
                f.seek(offset)
                return f.read(length)
        data: bytes = self.fs.cat_file(self._k(p), start=offset, end=offset + length)
        return data

    def listdir_names(self, p: Path) -> set[str]:
        """Names of the entries directly under folder ``p`` (empty when absent)."""
        if self.fs is None:
            return {c.name for c in p.iterdir()} if p.is_dir() else set()
        try:
            return {Path(e).name for e in self.fs.ls(self._k(p), detail=False) if Path(e).name}
        except FileNotFoundError:
            return set()

    def tree_files(self, sub: Path) -> list[str]:
        """Every file under ``sub``, as posix paths relative to ``root``, sorted."""
        if self.fs is None:
            out: list[str] = []
            for dirpath, dirnames, filenames in os.walk(sub):
                dirnames.sort()
                out += [Path(dirpath, n).relative_to(self.root).as_posix() for n in filenames]
            return sorted(out)
        try:
            found = self.fs.find(self._k(sub))
        except FileNotFoundError:
            return []
        base = self._k(self.root).rstrip("/") + "/"
        return sorted(f[len(base) :] for f in found if f.startswith(base))

    def file_sizes(self) -> dict[str, int]:
        """Every file under the location (relative posix path -> bytes): one listing on object
        storage (a LIST per 1,000 keys) instead of a request per file."""
        if self.fs is None:
            return {rel: (self.root / rel).stat().st_size for rel in self.tree_files(self.root)}
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
        """sha256 of each file, keyed by ``str(path)``."""
        if self.fs is None:
            return sha256_files_parallel(list(paths))

        def one(p: Path) -> tuple[str, str]:
            h = hashlib.sha256()
            with self.fs.open(self._k(p), "rb", block_size=_CHUNK) as f:
                while buf := f.read(_CHUNK):
                    h.update(buf)
            return str(p), h.hexdigest()

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return dict(pool.map(one, paths))

    def zarr_store(self, p: Path, read_only: bool = True) -> Any:
        """zarr's ``LocalStore`` (local) or ``FsspecStore`` (object storage) over folder ``p``."""
        from zarr.storage import FsspecStore, LocalStore

        if self.fs is None:
            return LocalStore(p, read_only=read_only)
        return FsspecStore.from_url(
            f"{self.protocol}://{self._k(p)}", storage_options=self.storage_options, read_only=read_only
        )

    # -- writes (object storage; the local store keeps its own atomic staging + rename) ------------
    def write_bytes(self, p: Path, data: bytes) -> None:
        """Write a whole object: one PUT on object storage (atomic per object); tmp + rename locally."""
        if self.fs is None:
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
            return
        self.fs.pipe_file(self._k(p), data)

    def put_file(self, local: Path, p: Path) -> None:
        """Upload a local file to ``p`` (copy when local)."""
        if self.fs is None:
            p.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, p)
            return
        self.fs.put_file(str(local), self._k(p))

    def put_files(self, pairs: Sequence[tuple[Path, Path]], workers: int = 8) -> None:
        """Upload many (local file, destination) pairs in parallel."""
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(lambda lp: self.put_file(*lp), pairs))

    def copy_verified(self, src: StoreLocation, sp: Path, dp: Path, expected_sha: str) -> None:
        """Copy ``src``'s file ``sp`` to ``dp`` here, streaming; refuse when its sha256 differs."""
        h = hashlib.sha256()
        fi = open(sp, "rb") if src.fs is None else src.fs.open(src._k(sp), "rb", block_size=_CHUNK)  # noqa: SIM115
        if self.fs is None:
            dp.parent.mkdir(parents=True, exist_ok=True)
        fo = open(dp, "wb") if self.fs is None else self.fs.open(self._k(dp), "wb")  # noqa: SIM115
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
        if self.fs is None:
            p.unlink(missing_ok=True)
            return
        with contextlib.suppress(Exception):
            self.fs.rm_file(self._k(p))

    def delete_tree(self, p: Path | None = None) -> None:
        """Delete everything under ``p`` (default: the whole location); missing is fine."""
        p = self.root if p is None else p
        if self.fs is None:
            shutil.rmtree(p, ignore_errors=True)
            return
        with contextlib.suppress(Exception):
            self.fs.rm(self._k(p), recursive=True)
        self.invalidate()

    def invalidate(self) -> None:
        if self.fs is not None:
            self.fs.invalidate_cache()


__all__ = ["StoreLocation", "is_url"]
