"""A store location on the local file system (``fs is None``)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .. import layout
from ..errors import StoreError
from ..hashing import sha256_files_parallel
from ..publish.atomic import UMASK_MODE, atomic_symlink, atomic_write_bytes, fsync_dir
from ..publish.readonly import make_writable, remove_tree
from ._base import StoreLocation


@dataclass(frozen=True, eq=False)
class LocalLocation(StoreLocation, backend="local"):
    """A local folder; ``root`` is its absolute path."""

    @classmethod
    def from_target(cls, target: str, storage_options: dict[str, Any] | None = None) -> LocalLocation:
        p = Path(target).absolute()
        return cls(root=p, url=str(p), given=target)

    def resolved(self) -> LocalLocation:
        """The folder this location names, links resolved (``stores/<profile>/current``: the store
        folder it points at), still named as the user gave it (:attr:`given`)."""
        p = Path(os.path.realpath(self.root))
        return LocalLocation(root=p, url=str(p), given=self.given)

    def child(self, rel: str) -> StoreLocation:
        p = self.root / rel
        return LocalLocation(root=p, url=str(p))

    def display(self, p: Path | None = None) -> str:
        return self.url if p is None else str(p)

    # -- reads -------------------------------------------------------------------------------------
    def is_file(self, p: Path) -> bool:
        return p.is_file()

    def is_dir(self, p: Path) -> bool:
        return p.is_dir()

    def exists(self, p: Path) -> bool:
        return p.exists()

    def size(self, p: Path) -> int:
        return p.stat().st_size

    def read_bytes(self, p: Path) -> bytes:
        return p.read_bytes()

    def read_range(self, p: Path, offset: int, length: int) -> bytes:
        with open(p, "rb", buffering=0) as f:
            f.seek(offset)
            return f.read(length)

    def open_read(self, p: Path) -> IO[bytes]:
        return open(p, "rb")  # noqa: SIM115 - the caller closes it

    def listdir_names(self, p: Path) -> set[str]:
        return {c.name for c in p.iterdir()} if p.is_dir() else set()

    def tree_files(self, sub: Path) -> list[str]:
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(sub):
            dirnames.sort()
            out += [Path(dirpath, n).relative_to(self.root).as_posix() for n in filenames]
        return sorted(out)

    def file_sizes(self) -> dict[str, int]:
        return {rel: (self.root / rel).stat().st_size for rel in self.tree_files(self.root)}

    def sha256_files(self, paths: Sequence[Path], workers: int = 8) -> dict[str, str]:
        return sha256_files_parallel(list(paths))

    def zarr_store(self, p: Path, read_only: bool = True) -> Any:
        from zarr.storage import LocalStore

        return LocalStore(p, read_only=read_only)

    # -- writes ------------------------------------------------------------------------------------
    def open_write(self, p: Path) -> IO[bytes]:
        p.parent.mkdir(parents=True, exist_ok=True)
        return open(p, "wb")  # noqa: SIM115 - the caller closes it

    def write_bytes(self, p: Path, data: bytes) -> None:
        atomic_write_bytes(p, data, mode=UMASK_MODE)

    def put_file(self, local: Path, p: Path) -> None:
        p.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, p)

    def delete(self, p: Path) -> None:
        p.unlink(missing_ok=True)

    def delete_tree(self, p: Path | None = None) -> None:
        remove_tree(self.root if p is None else p)

    # -- the commit protocol -------------------------------------------------------------------------
    def commit(self, p: Path, data: bytes) -> None:
        atomic_write_bytes(p, data, mode=UMASK_MODE)
        fsync_dir(p.parent)

    def publish_current(self, name: str) -> str | None:
        link = self.root / layout.CURRENT_LINK
        with contextlib.suppress(OSError):
            if os.readlink(link) == name:
                return None  # already current: the link (and its mtime) stays as it is
        moved = None
        if os.path.lexists(link) and not link.is_symlink():
            moved = f"{link} -> {self._move_current_aside(link)}"
        atomic_symlink(name, link)
        return moved

    def _move_current_aside(self, link: Path) -> Path:
        """``current`` is not a symbolic link (a folder a user copied there, a file): it is moved,
        never deleted, into the data root's quarantine folder
        (``quarantine/<UTC time>/stores/<profile>/current``, with its ``moved.json``: ``stage2 list``
        shows it, only ``stage2 gc --quarantine`` removes it), as a store that fails the
        publication gate is, so that the link can be made. Outside a data root's
        ``stores/<profile>/`` there is no quarantine folder: StoreError saying what ``current`` is
        and the command that moves it."""
        from ..formats.sha256sums import file_kind
        from ..publish.quarantine import quarantine_files

        kind = file_kind(os.lstat(link).st_mode)
        data_root = self.root.parent.parent
        if self.root.parent.name != layout.STORES_DIR:
            raise StoreError(
                f"{link} is {kind}, not a symbolic link: `current` must be a link to the published "
                "store's folder, and this is not a data root's stores folder to move it aside in.",
                fix=f"move it out of the way (mv {shlex.quote(str(link))} "
                f"{shlex.quote(str(link.with_name('current.moved')))}) and run the build again",
            )
        if kind == "a folder":
            make_writable(link)  # a folder moved to another parent needs its own write bit
        (dest,) = quarantine_files(
            data_root,
            [link],
            f"`current` was {kind}, not a symbolic link to a store: moved aside to publish the link",
            store=layout.CURRENT_LINK,
        )
        if kind == "a folder":
            make_writable(dest)  # `stage2 gc --quarantine` may remove its files
        return dest

    def withdraw_current(self, name: str) -> bool:
        link = self.root / layout.CURRENT_LINK
        try:
            if os.readlink(link) != name:
                return False
        except OSError:  # no link (or not a link: moved aside when a store is published)
            return False
        link.unlink()
        fsync_dir(self.root)
        return True

    def current(self) -> StoreLocation | None:
        """The store ``current`` links to; None when there is no link or it names nothing. A
        folder or file named ``current`` is not a publication (only a build's symbolic link is:
        :meth:`publish_current` moves such a thing aside), so it is never read as the published
        store."""
        link = self.root / layout.CURRENT_LINK
        if not link.is_symlink() or not link.exists():
            return None
        return LocalLocation.from_target(str(link.resolve()))


__all__ = ["LocalLocation"]
