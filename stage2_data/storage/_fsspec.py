"""A store location on object storage, through any fsspec filesystem (``s3://`` with s3fs, ...).

Object storage has no rename, so the commit protocol there is: data objects first, the commit
marker (``manifest.json``) LAST in one PUT (a prefix without it is never a store: readers and
validation refuse it), and the ``CURRENT`` object, naming the published store, after that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import shlex
import socket
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TypeVar

from ..errors import StoreError, StoreNotFoundError
from ._base import (
    _CHUNK,
    CURRENT_OBJECT,
    MANIFEST_NAME,
    MOVED_FILE,
    QUARANTINE_DIR,
    StoreLocation,
    backend_error,
)

#: a store folder's name as ``CURRENT`` may hold it: one path component, not hidden (``.quarantine``)
_PLAIN_NAME = re.compile(r"[^./\\\x00-\x1f][^/\\\x00-\x1f]{0,254}")


class StorageAccessError(StoreError):
    """Object storage cannot be used with what was given: no credentials, credentials it refuses,
    access denied, no such bucket, or an endpoint that does not answer. A fault of the setup, not
    of a store: the message names the URL and what failed, the fix what to set."""

    could_not_run = True


#: exceptions (botocore's, by name: no import of an optional package) saying no credentials were found
_NO_CREDENTIALS = frozenset(
    {
        "NoCredentialsError",
        "PartialCredentialsError",
        "CredentialRetrievalError",
        "NoAuthTokenError",
        "TokenRetrievalError",
        "UnauthorizedSSOTokenError",
        "SSOTokenLoadError",
        "ProfileNotFound",
    }
)
#: S3 error codes of credentials the storage does not accept
_REFUSED_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired"}
)
#: S3 error codes of a request these credentials may not make
_DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "AccountProblem", "InvalidSecurity"})
#: exceptions (by name) of an endpoint that does not answer: botocore's, aiohttp's
_UNREACHABLE = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ConnectionClosedError",
        "ProxyConnectionError",
        "ReadTimeoutError",
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
    }
)


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or while handling (a few levels)."""
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(out) < 6 and not any(cur is x for x in out):
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _error_code(e: BaseException) -> str | None:
    """The S3 error code of a botocore ``ClientError`` (``AccessDenied``, ``NoSuchBucket``)."""
    response = getattr(e, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    code = error.get("Code") if isinstance(error, dict) else None
    return str(code) if code else None


def _endpoint(protocol: str, storage_options: dict[str, Any] | None) -> str:
    """The endpoint a location's requests go to, as the options or the environment name it."""
    opts = storage_options or {}
    client = opts.get("client_kwargs")
    client = client if isinstance(client, dict) else {}
    given = opts.get("endpoint_url") or client.get("endpoint_url")
    if not given and protocol in ("s3", "s3a"):
        given = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return f"the storage endpoint {given}" if given else f"the default {protocol}:// endpoint (none is set)"


def _no_bucket(url: str, bucket: str, endpoint: str, said: str | None = None) -> StorageAccessError:
    return StorageAccessError(
        f"{url}: the bucket {bucket!r} does not exist at {endpoint}" + (f" ({said})." if said else "."),
        fix=f"correct the bucket in the URL (or endpoint_url), or create the bucket {bucket!r}",
    )


def access_error(
    url: str, e: BaseException, storage_options: dict[str, Any] | None = None
) -> StorageAccessError | None:
    """The named error for ``e``, raised by object storage while using ``url``, when it says the
    storage cannot be used as set up (no credentials, credentials refused, access denied, no such
    bucket, an endpoint that does not answer or is not a URL); None for anything else."""
    if isinstance(e, StoreError):
        return None
    protocol = url.split("://", 1)[0].lower()
    s3 = protocol in ("s3", "s3a")
    chain = _chain(e)
    names = {c.__name__ for x in chain for c in type(x).__mro__}
    codes = {c for x in chain if (c := _error_code(x))}
    said = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    endpoint = _endpoint(protocol, storage_options)
    bucket = url.split("://", 1)[-1].split("/", 1)[0]
    if names & _NO_CREDENTIALS:
        return StorageAccessError(
            f"{url}: no credentials for the object storage were found ({said}).",
            fix="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, or "
            "pass --storage-option key=ACCESS_KEY_ID --storage-option secret=SECRET_ACCESS_KEY (in "
            "Python: storage_options={'key': ..., 'secret': ...}); for a public bucket: anon=true"
            if s3
            else "give the credentials this storage takes (the environment, or --storage-option)",
        )
    if codes & _REFUSED_CODES:
        return StorageAccessError(
            f"{url}: {endpoint} refused the credentials ({said}).",
            fix="check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the key= and secret= storage "
            "options): they must be a valid key pair of that storage, and endpoint_url the storage "
            "they belong to",
        )
    if "NoSuchBucket" in codes:
        return _no_bucket(url, bucket, endpoint, said)
    if codes & _DENIED_CODES or any(isinstance(x, PermissionError) for x in chain):
        return StorageAccessError(
            f"{url}: access denied ({said}).",
            fix=(
                "check that the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the key= "
                "and secret= storage options) "
                if s3
                else "check that the credentials "
            )
            + "are valid for that storage and may list, read and write that bucket and prefix (a "
            "build writes and deletes objects there; validate, summary and gc list and read them), "
            "and that the URL names the bucket and prefix meant",
        )
    if names & _UNREACHABLE or any(
        isinstance(x, ConnectionError | socket.gaierror | TimeoutError) for x in chain
    ):
        return StorageAccessError(
            f"{url}: cannot reach {endpoint} ({said}).",
            fix="check endpoint_url (--storage-option endpoint_url=http://HOST:PORT), that the "
            "storage server runs there, and the network",
        )
    if isinstance(e, ValueError) and str(e).startswith("Invalid endpoint"):
        return StorageAccessError(
            f"{url}: {endpoint} is not a URL ({said}).",
            fix="give it as a URL: --storage-option endpoint_url=http://HOST:PORT",
        )
    return None


_F = TypeVar("_F", bound=Callable[..., Any])


def _named(method: _F) -> _F:
    """``method`` of a location whose storage errors of access (:func:`access_error`) are raised as
    :class:`StorageAccessError`; any other error as it was."""

    @functools.wraps(method)
    def wrapper(self: FsspecLocation, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            if (err := access_error(self.url, e, self.storage_options)) is None:
                raise
            raise err from e

    return wrapper  # type: ignore[return-value]


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
        return self._at(self.root / rel)

    def display(self, p: Path | None = None) -> str:
        return self.url if p is None else f"{self.protocol}://{p.as_posix()}"

    # -- access --------------------------------------------------------------------------------------
    def access_error(self, e: BaseException) -> StorageAccessError | None:
        """:func:`access_error` for this location."""
        return access_error(self.url, e, self.storage_options)

    def check_writable(self) -> None:
        """Refuse, in a request or two, a prefix a build could not write its store under: a small
        object is written there (``.stage2-write-probe-<random>``, hidden: nothing lists it as a
        store) and deleted. No credentials, credentials refused, access denied, no such bucket, an
        endpoint that does not answer: :class:`StorageAccessError` naming it and the fix."""
        probe = self.root / f".stage2-write-probe-{uuid.uuid4().hex[:12]}"
        try:
            self.fs.pipe_file(self._k(probe), b"")
        except Exception as e:
            if (err := self.access_error(e)) is not None:
                raise err from e
            raise StorageAccessError(
                f"{self.url}: cannot write under this prefix ({' '.join(f'{type(e).__name__}: {e}'.split())[:300]}).",
                fix="check the URL, the credentials and the storage options (--storage-option) a "
                "build writes the store with",
            ) from e
        with contextlib.suppress(Exception):
            self.fs.rm_file(self._k(probe))
        self.invalidate()

    def missing_bucket(self) -> StorageAccessError | None:
        """The error saying this location's bucket does not exist, when the storage says so (S3:
        one HEAD of the bucket); None when it exists, or it cannot be told (another storage, or
        credentials allowed to read objects but not to look at the bucket)."""
        call = getattr(self.fs, "call_s3", None)
        if call is None:
            return None
        bucket = self.root.parts[0]
        try:
            call("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            return _no_bucket(self.url, bucket, _endpoint(self.protocol, self.storage_options))
        except Exception as e:
            if (err := self.access_error(e)) is not None and not isinstance(e, PermissionError):
                return err
        return None

    # -- reads -------------------------------------------------------------------------------------
    @_named
    def is_file(self, p: Path) -> bool:
        # fsspec's isfile says False for any error: no credentials or an endpoint that does not
        # answer would read as "no such file"; they are named instead
        try:
            return bool(self.fs.info(self._k(p))["type"] == "file")
        except Exception as e:
            if self.access_error(e) is not None:
                raise
            return False

    @_named
    def is_dir(self, p: Path) -> bool:
        return bool(self.fs.isdir(self._k(p)))

    @_named
    def exists(self, p: Path) -> bool:
        return bool(self.fs.exists(self._k(p)))

    @_named
    def size(self, p: Path) -> int:
        return int(self.fs.size(self._k(p)))

    @_named
    def read_bytes(self, p: Path) -> bytes:
        data: bytes = self.fs.cat_file(self._k(p))
        return data

    @_named
    def read_range(self, p: Path, offset: int, length: int) -> bytes:
        data: bytes = self.fs.cat_file(self._k(p), start=offset, end=offset + length)
        return data

    @_named
    def open_read(self, p: Path) -> IO[bytes]:
        f: IO[bytes] = self.fs.open(self._k(p), "rb", block_size=_CHUNK)
        return f

    @_named
    def listdir_names(self, p: Path) -> set[str]:
        try:
            return {Path(e).name for e in self.fs.ls(self._k(p), detail=False) if Path(e).name}
        except FileNotFoundError:
            return set()

    @_named
    def tree_files(self, sub: Path) -> list[str]:
        try:
            found = self.fs.find(self._k(sub))
        except FileNotFoundError:
            return []
        base = self._k(self.root).rstrip("/") + "/"
        return sorted(f[len(base) :] for f in found if f.startswith(base))

    @_named
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

    @_named
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
    @_named
    def open_write(self, p: Path) -> IO[bytes]:
        f: IO[bytes] = self.fs.open(self._k(p), "wb")
        return f

    @_named
    def write_bytes(self, p: Path, data: bytes) -> None:
        self.fs.pipe_file(self._k(p), data)

    @_named
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

    # -- moving aside ------------------------------------------------------------------------------
    def move_aside(self, reason: str, **details: Any) -> FsspecLocation:
        """Move this store folder (``<prefix>/<profile>/<name>``) aside, never deleting it: every
        object copied (server side; the manifest last, as a store is written) to
        ``<prefix>/<profile>/.quarantine/<UTC time>/<name>/``, the copy's sizes checked against the
        original's, that folder's ``moved.json`` written (why, from where to where, ``details``),
        and only then the original withdrawn (its manifest first). Object storage has no rename:
        a failure before the withdrawal leaves the original whole (StoreError saying so).
        Returns the copy's location (``stage2 gc --quarantine`` removes it, nothing else does)."""
        parent = self.root.parent
        folder = parent / QUARANTINE_DIR / self._new_quarantine_name(parent / QUARANTINE_DIR)
        dest = self._at(folder / self.root.name)
        sizes = self.file_sizes()
        try:
            rels = sorted(r for r in sizes if r != MANIFEST_NAME)
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(lambda r: self.fs.copy(self._k(self.root / r), self._k(dest.root / r)), rels))
            if MANIFEST_NAME in sizes:
                self.fs.copy(self._k(self.root / MANIFEST_NAME), self._k(dest.root / MANIFEST_NAME))
            self.invalidate()
            copied = dest.file_sizes()
            if copied != sizes:
                differ = sorted(r for r in set(sizes) | set(copied) if sizes.get(r) != copied.get(r))
                raise OSError(f"the copy differs from the original in {len(differ)} file(s): {differ[:5]}")
            record = {
                "moved_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "reason": reason,
                "files": [{"from": self.url, "to": dest.url}],
                **details,
            }
            self.write_bytes(folder / MOVED_FILE, (json.dumps(record, indent=2) + "\n").encode())
        except Exception as e:
            raise StoreError(
                f"{self.url}: could not move it aside to {dest.url} ({type(e).__name__}: {e}); the "
                "store is still where it was, whole.",
                fix="check that the storage accepts writes under that prefix, then run the build again",
            ) from e
        self.withdraw(MANIFEST_NAME)
        return dest

    def _at(self, p: Path) -> FsspecLocation:
        return FsspecLocation(
            root=p,
            url=f"{self.protocol}://{p.as_posix()}",
            protocol=self.protocol,
            storage_options=self.storage_options,
            fs=self.fs,
        )

    def _new_quarantine_name(self, root: Path) -> str:
        """A quarantine folder's name under ``root``: the UTC time, ``-1``, ``-2`` ... added when a
        folder of that name is there (as :func:`stage2_data.publish.quarantine.new_quarantine_folder`)."""
        taken = self.listdir_names(root)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        n = 0
        while (name := stamp if n == 0 else f"{stamp}-{n}") in taken:
            n += 1
        return name

    # -- the commit protocol -------------------------------------------------------------------------
    def commit(self, p: Path, data: bytes) -> None:
        self.write_bytes(p, data)  # one PUT, LAST: the commit marker
        self.invalidate()

    def publish_current(self, name: str) -> str | None:
        self.write_bytes(self.root / CURRENT_OBJECT, (name + "\n").encode())
        return None  # an object is overwritten: nothing stands there that is not a publication

    @_named
    def withdraw_current(self, name: str) -> bool:
        marker = self.root / CURRENT_OBJECT
        if not self.is_file(marker) or self._current_name()[0] != name:
            return False
        self.delete(marker)
        return True

    @_named
    def current_problem(self) -> str | None:
        """Why the ``CURRENT`` object here names no store, in one line (None when there is no
        ``CURRENT`` object, or it names a complete store): a name that is not a plain folder name
        of this prefix (empty, ``../x``, ``/etc``, ``a/b``), or a folder without ``manifest.json``."""
        marker = self.root / CURRENT_OBJECT
        if not self.is_file(marker):
            return None
        name, why = self._current_name()
        if why is None and not self.is_file(self.root / name / MANIFEST_NAME):
            why = f"no {MANIFEST_NAME} under {self.display(self.root / name)}: nothing complete is there"
        if why is None:
            return None
        return f"the {CURRENT_OBJECT} object at {self.display(marker)} names {name!r}, which is not a store ({why})"

    def _current_name(self) -> tuple[str, str | None]:
        """The name the ``CURRENT`` object holds, and why it is not a store folder's name (None when
        it is one: a single path component, not hidden, as :meth:`publish_current` writes)."""
        raw = self.read_bytes(self.root / CURRENT_OBJECT)
        try:
            name = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            return raw[:40].decode("utf-8", "replace"), "it is not text"
        if not name:
            return name, "it is empty"
        if not _PLAIN_NAME.fullmatch(name):
            return name, f"not the name of a folder directly under {self.url}"
        return name, None

    @_named
    def current(self) -> StoreLocation | None:
        """The store folder the ``CURRENT`` object names; None when there is no ``CURRENT`` object,
        or it names no complete store (:meth:`current_problem` says why): such an object is not a
        publication, so nothing reads it as the published store and retention judges nothing by it."""
        marker = self.root / CURRENT_OBJECT
        if not self.is_file(marker):
            return None
        name, why = self._current_name()
        if why is not None or not self.is_file(self.root / name / MANIFEST_NAME):
            return None
        return self.child(name)


#: storage options never repeated in a fix a user pastes (they stay where the user keeps them)
_SECRET_OPTIONS = ("secret", "token", "password", "key")


def option_args(storage_options: dict[str, Any] | None) -> str:
    """``storage_options`` as the ``--storage-option KEY=VALUE`` arguments of a command to paste
    (JSON for what is not text); credentials are left out (said so): they stay in the environment
    or the command the user ran."""
    parts, left_out = [], []
    for k, v in (storage_options or {}).items():
        if any(s in k.lower() for s in _SECRET_OPTIONS):
            left_out.append(k)
            continue
        value = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        parts.append(f"--storage-option {shlex.quote(f'{k}={value}')}")
    if left_out:
        parts.append(f"(and your {', '.join(left_out)} options)")
    return " ".join(parts)


def current_candidates(loc: StoreLocation) -> list[StoreLocation]:
    """The folders whose ``CURRENT`` object a target on object storage is resolved through, in
    order: ``<profile>`` for ``<profile>/current`` (``layout.CURRENT_LINK``), then the target."""
    if loc.root.name != "current":
        return [loc]
    parent = loc.root.parent
    return [dataclasses.replace(loc, root=parent, url=f"{loc.protocol}://{parent.as_posix()}"), loc]


def current_error(
    target: str | StoreLocation, storage_options: dict[str, Any] | None = None, *, command: str = ""
) -> StoreNotFoundError | None:
    """The error for a target on object storage that a reader resolves through a ``CURRENT`` object
    (``<profile>/current`` or ``<profile>``, with no manifest of its own) when that object names no
    store (:meth:`FsspecLocation.current_problem`); None for any other target. ``command`` (e.g.
    ``stage2 validate``): the fix names it with a complete store of that folder, ready to paste."""
    loc = StoreLocation.parse(target, storage_options)
    if loc.is_local or loc.is_file(loc.root / MANIFEST_NAME):
        return None
    for c in current_candidates(loc):
        if not isinstance(c, FsspecLocation) or (why := c.current_problem()) is None:
            continue
        stores = sorted(
            n
            for n in c.listdir_names(c.root)
            if _PLAIN_NAME.fullmatch(n) and c.is_file(c.root / n / MANIFEST_NAME)
        )
        build = (
            f"a build of this profile with --store-url {c.display(c.root.parent)} publishes its store "
            f"again and rewrites {CURRENT_OBJECT}"
        )
        if stores and command:
            which = "it" if len(stores) == 1 else f"one of {', '.join(stores)}"
            fix = (
                f"{build}; to read a complete store of that folder meanwhile, name {which}: "
                f"{command} {c.display(c.root / stores[0])} {option_args(c.storage_options)}".rstrip()
            )
        else:
            fix = build + (f" (no complete store is under {c.url})" if not stores else "")
        return StoreNotFoundError(f"{why}.", fix=fix)
    return None


__all__ = [
    "FsspecLocation",
    "StorageAccessError",
    "access_error",
    "current_candidates",
    "current_error",
    "option_args",
]
