"""Pinned, verified, resumable downloads through the real ``huggingface_hub`` client.

Everything that talks to the hub goes through the client's own functions (``HfApi``,
``get_hf_file_metadata``, ``hf_hub_url``, ``build_hf_headers``, ``http_stream_backoff``,
``hf_raise_for_status``); the endpoint is always passed explicitly, so the same code talks to
https://huggingface.co or to the loopback hub (``stage2_data.hubserver``) by changing only
``HubSource.endpoint``.

A download goes to ``archives/.partial/<path>.part`` and is hashed while the bytes arrive (one
pass): the GET is made by the client's own streaming call (its session: redirects, TLS, proxies,
auth headers, error classes); the body is then read into recycled 1 MiB buffers, straight from
the connection's socket when that is exactly equivalent (plain HTTP/1.1 with a Content-Length, TLS
on the socket itself; see ``_raw_socket``; on a plain socket one ``recv`` with ``MSG_WAITALL``
fills a whole buffer), else through the client's own body iterator. Each received buffer is
written and hashed at the same time by two threads (``_BlockSink``), so receiving, writing and
hashing run on separate cores. Aligned blocks are written with ``O_DIRECT`` (Linux, see
``DIRECT_IO``): straight from the receive buffer to the disk, no page-cache copy, no writeback left
for the fsync before publication, and 107 GiB of archives do not push everything else out of
memory; where ``O_DIRECT`` is refused, writeback is started as the file grows
(``sync_file_range``), so the fsync waits for little. Profiled on
loopback, the client's ``http_get`` (64 KiB reads parsed by h11, 10 MiB re-chunking, a copy per
chunk) cost ~5 s/GiB of CPU; this costs curl's receive + write plus the sha256 itself (which, at
~1.25 GB/s per core with SHA-NI, costs about twice curl's receive + write).
A connection that drops after bytes arrived is resumed at once; a timeout, a drop before any byte,
or a 5xx is retried with exponential backoff; each retry resumes from the partial file with a
``Range`` request. Only a file whose sha256 equals its pin is
moved (``os.replace``) to ``archives/<path>``, next to a verification record
``archives/<path>.verified.json`` (path, size, mtime_ns, sha256, revision, verified_at). A later
call that finds a record matching the file's size, mtime and pinned sha256 makes no request at all.

The token is never logged, never put in an exception message, a repr or a record.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import mmap
import os
import queue
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

from . import layout
from .errors import (
    ChecksumMismatchError,
    HubError,
    ProblemsError,
    ProfileError,
    Stage2Error,
)
from .fsutil import atomic_write_json, disk_full_as, fsync_dir, human_bytes, require_free_space
from .hashing import SHA256_RE, hasher_of_prefix, sha256_file
from .profile import ArchiveSpec, Profile

try:  # huggingface_hub >= 2 uses httpx2; 1.x uses httpx
    import httpx2 as _httpx
except ImportError:  # pragma: no cover - depends on the installed client
    import httpx as _httpx  # type: ignore[no-redef]

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_ATTEMPTS = 5
DEFAULT_BACKOFF = 1.0  # seconds before the first retry; doubled on each further retry
MAX_BACKOFF = 30.0
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
EXTRACTION_FACTOR = 1.15
"""Extracted bytes per archive byte (tars are uncompressed; file-system overhead for many small
files). With it, archives + extraction = 2.15 x archive bytes: 230 GiB for 107 GiB (kit-format §5)."""

PIN_FIX = "run `stage2 pin` to fill size and sha256 from the hub's listing at the pinned revision"
MISMATCH_FIX = (
    "re-run the build to download it again; if it persists, run `stage2 pin` and check the upstream file"
)

BLOCK_SIZE = 1024 * 1024
"""Bytes per receive buffer: one socket read loop, one file write and one hash update each."""
DEPTH = 6
"""Receive buffers per download (in flight between receiving, writing and hashing)."""
WRITEBACK_EVERY = 8 * 1024 * 1024
"""Bytes written between two ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` calls (Linux): disk writeback
starts while the download goes on, so the fsync before publication waits for little."""
USE_WAITALL = True
"""Fill a whole receive buffer per system call on a plain socket (``MSG_WAITALL``, see ``_waitall``)."""
DIRECT_IO = True
"""Write aligned blocks with ``O_DIRECT`` (Linux) where the file system accepts it: the bytes go from
the receive buffer to the disk without a copy into the page cache (no CPU spent copying, no 107 GiB
of archives pushing everything else out of memory, and the fsync before publication has only the
unaligned edges left to flush). Unaligned pieces (the first bytes after the headers, a tail, a
resume point) go through an ordinary buffered descriptor of the same file; a file system that
refuses ``O_DIRECT`` gets only buffered writes."""
ALIGN = 4096
"""File offset, length and address alignment of an ``O_DIRECT`` write (the largest logical block
size in common use; receive buffers are page-aligned ``mmap`` allocations)."""
RAW_SOCKET_READS = True
"""Read a plain HTTP/1.1 body straight from the client's connection socket (see ``_raw_socket``);
False: always through the client's own body iterator (64 KiB reads, ~3x the CPU per byte)."""


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_sync_file_range = _load_sync_file_range()


# ----- the source ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class HubSource:
    """A repository pinned at a revision, and where to reach it. ``repr`` never shows the token."""

    repo_id: str
    repo_type: str
    revision: str
    endpoint: str | None = None
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.repo_type not in ("dataset", "model", "space"):
            raise ProfileError(
                f"repo_type {self.repo_type!r} of {self.repo_id} is not dataset, model or space.",
                fix="set [source] repo_type to dataset, model or space",
            )

    @classmethod
    def from_profile(
        cls, profile: Profile, *, endpoint: str | None = None, token: str | None = None
    ) -> HubSource:
        s = profile.source
        return cls(
            repo_id=s.repo_id, repo_type=s.repo_type, revision=s.revision, endpoint=endpoint, token=token
        )

    @property
    def api_endpoint(self) -> str:
        """The endpoint actually used: the explicit one, else ``HF_ENDPOINT`` (read now), else the real hub."""
        return (self.endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")

    @property
    def label(self) -> str:
        return f"{self.repo_type} repo {self.repo_id}"

    def api(self) -> HfApi:
        return HfApi(endpoint=self.api_endpoint, token=self.token)

    def file_url(self, path: str) -> str:
        return hf_hub_url(
            self.repo_id, path, repo_type=self.repo_type, revision=self.revision, endpoint=self.api_endpoint
        )

    def redact(self, text: str) -> str:
        return text.replace(self.token, "***") if self.token else text


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # the LFS oid; None for a file stored in git (not LFS)


# ----- errors ---------------------------------------------------------------------------------------
class DownloadsFailedError(ProblemsError, HubError):
    """Several downloads failed; ``errors`` maps each failed path to its exception."""

    def __init__(
        self,
        title: str,
        problems: list[str],
        *,
        errors: dict[str, BaseException],
        results: list[DownloadResult],
        fix: str | None = None,
    ) -> None:
        self.errors = errors
        self.results = results
        super().__init__(title, problems, fix=fix)


class DownloadCancelled(HubError):
    """The download was cancelled (``cancel`` event set, e.g. on Ctrl-C); the partial file is kept."""


class PinError(ProblemsError, ProfileError):
    """``pin`` refused: the profile disagrees with the hub's listing."""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        return status in TRANSIENT_STATUS
    if isinstance(e, OfflineModeIsEnabled):
        return False
    if isinstance(e, _httpx.TimeoutException | _httpx.NetworkError | _httpx.RemoteProtocolError):
        return True
    # http_get's own length check ("Consistency check failed: file should be of size ...").
    return isinstance(e, OSError) and "Consistency check failed" in str(e)


def _is_client_error(e: BaseException) -> bool:
    return isinstance(e, HfHubHTTPError | OfflineModeIsEnabled | _httpx.HTTPError) or _is_transient(e)


def _hub_error(
    e: BaseException, source: HubSource, *, what: str, path: str | None = None, note: str = ""
) -> HubError:
    """A HubError naming the repo, revision, endpoint (and file) and the fix, for a client error."""
    ep = source.api_endpoint
    rev = source.revision
    if isinstance(e, GatedRepoError):
        msg = f"{what}: {source.label} at {ep} is gated and the token has no access to it."
        fix = "accept the repository's conditions on the hub, then pass a token that has access (HF_TOKEN)"
    elif isinstance(e, RepositoryNotFoundError):
        msg = (
            f"{what}: {source.label} not found at {ep} (or private and not accessible with the given token)."
        )
        fix = (
            "check [source] repo_id and repo_type in the profile; for a private repo pass a token (HF_TOKEN)"
        )
    elif isinstance(e, RevisionNotFoundError):
        msg = f"{what}: revision {rev} of {source.label} does not exist at {ep}."
        fix = (
            "set [source] revision to an existing full 40-hex commit of the repository, then run `stage2 pin`"
        )
    elif isinstance(e, RemoteEntryNotFoundError):
        msg = f"{what}: {path!r} does not exist in {source.label} at revision {rev} ({ep})."
        fix = "check the archive path in the profile; `stage2 pin` lists every archive missing upstream"
    elif isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            msg = f"{what}: the hub at {ep} rejected the token for {source.label} (HTTP 401)."
            fix = "pass a valid token (HF_TOKEN) or none for a public repository"
        elif status == 403:
            msg = f"{what}: the token may not read {source.label} at {ep} (HTTP 403)."
            fix = "use a token with read access to the repository"
        else:
            msg = f"{what}: the hub at {ep} answered HTTP {status} ({_first_line(str(e))})."
            fix = "retry later; if it persists, check the hub's status page"
    elif isinstance(e, OfflineModeIsEnabled):
        msg = f"{what}: huggingface_hub offline mode is on (HF_HUB_OFFLINE), {ep} was not contacted."
        fix = "unset HF_HUB_OFFLINE"
    elif isinstance(e, _httpx.HTTPError):
        msg = f"{what}: hub unreachable at {ep} ({type(e).__name__}: {_first_line(str(e)) or 'no detail'})."
        fix = (
            "check the network and the endpoint (--endpoint / HF_ENDPOINT); "
            "for the loopback hub, check that it is running"
        )
    else:
        msg = f"{what}: {type(e).__name__}: {_first_line(str(e))} ({ep})."
        fix = "retry; if it persists, check the hub and the network"
    return HubError(source.redact(msg + note), fix=fix)


# ----- listing and revision -------------------------------------------------------------------------
def check_revision(source: HubSource) -> str:
    """Resolve ``source.revision`` on the hub; return the commit. Raises HubError when it does not
    exist, or when the hub resolves it to another commit (a branch name or tag is never a pin)."""
    try:
        info = source.api().repo_info(source.repo_id, repo_type=source.repo_type, revision=source.revision)
    except Exception as e:
        if _is_client_error(e):
            raise _hub_error(e, source, what=f"resolving revision {source.revision}") from e
        raise
    sha = getattr(info, "sha", None)
    if not sha:
        raise HubError(
            f"the hub at {source.api_endpoint} gave no commit for revision {source.revision} of {source.label}.",
            fix="check the endpoint (--endpoint / HF_ENDPOINT)",
        )
    if sha != source.revision:
        raise HubError(
            f"revision {source.revision!r} of {source.label} resolves to commit {sha} at {source.api_endpoint}, "
            f"not to the pinned {source.revision!r}; a branch name, tag or short hash is never a pin.",
            fix=f"set [source] revision = {sha!r} in the profile (after checking that commit), then run `stage2 pin`",
        )
    return str(sha)


def list_remote_files(source: HubSource) -> dict[str, RemoteFile]:
    """Every file of the repository at the pinned revision: {path: RemoteFile(path, size, sha256)}."""
    check_revision(source)  # fails fast (no client retries) when the hub is unreachable
    try:
        entries = list(
            source.api().list_repo_tree(
                source.repo_id, recursive=True, revision=source.revision, repo_type=source.repo_type
            )
        )
    except Exception as e:
        if _is_client_error(e):
            raise _hub_error(e, source, what=f"listing {source.label} at {source.revision}") from e
        raise
    out: dict[str, RemoteFile] = {}
    for entry in entries:
        if not isinstance(entry, RepoFile):  # a folder
            continue
        lfs = entry.lfs
        if lfs is not None:
            out[entry.path] = RemoteFile(entry.path, int(lfs.size), str(lfs.sha256))
        else:
            out[entry.path] = RemoteFile(entry.path, int(entry.size), None)
    return dict(sorted(out.items()))


# ----- local state ----------------------------------------------------------------------------------
@dataclass
class ArchiveState:
    path: str
    state: Literal["missing", "partial", "verified", "unverified"]
    bytes_local: int
    size: int | None  # the pinned size
    sha256: str | None  # the verified sha256 (from the record) when verified, else None


def _read_record(record: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _record_matches(rec: dict[str, Any] | None, spec: ArchiveSpec, st: os.stat_result) -> bool:
    return (
        rec is not None
        and spec.pinned
        and rec.get("path") == spec.path
        and rec.get("size") == spec.size == st.st_size
        and rec.get("mtime_ns") == st.st_mtime_ns
        and rec.get("sha256") == spec.sha256
    )


def _write_record(data_root: Path, spec: ArchiveSpec, final: Path, sha256: str, revision: str) -> None:
    st = final.stat()
    atomic_write_json(
        layout.verified_record_path(data_root, spec.path),
        {
            "path": spec.path,
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": sha256,
            "revision": revision,
            "verified_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )


def archive_state(data_root: Path, spec: ArchiveSpec) -> ArchiveState:
    """Where an archive stands locally, without hashing: verified (a matching record), unverified
    (the final file without a matching record), partial (a download in progress) or missing."""
    final = layout.archive_path(data_root, spec.path)
    part = layout.partial_path(data_root, spec.path)
    try:
        st = final.stat()
    except FileNotFoundError:
        st = None
    if st is not None:
        rec = _read_record(layout.verified_record_path(data_root, spec.path))
        if _record_matches(rec, spec, st):
            return ArchiveState(spec.path, "verified", st.st_size, spec.size, spec.sha256)
        return ArchiveState(spec.path, "unverified", st.st_size, spec.size, None)
    try:
        return ArchiveState(spec.path, "partial", part.stat().st_size, spec.size, None)
    except FileNotFoundError:
        return ArchiveState(spec.path, "missing", 0, spec.size, None)


def _remaining_download_bytes(data_root: Path, spec: ArchiveSpec) -> int:
    st = archive_state(data_root, spec)
    size = spec.size or 0
    if st.state == "missing":
        return size
    if st.state == "partial":
        return max(0, size - st.bytes_local)
    return 0  # verified, or unverified (its bytes are already on disk)


def _is_extracted(data_root: Path, cache_key: str) -> bool:
    return (
        layout.extraction_record_path(data_root, cache_key).is_file()
        and layout.cache_dir(data_root, cache_key).is_dir()
    )


def required_free_parts(profile: Profile, data_root: Path) -> tuple[int, int]:
    """(archive bytes still to download, bytes the extraction of every cache key not yet extracted
    will write: ``EXTRACTION_FACTOR`` x its archive bytes). An unpinned archive counts 0: pin first."""
    remaining = sum(_remaining_download_bytes(data_root, a) for a in profile.archives)
    extraction = 0
    for key, specs in profile.archives_by_cache_key().items():
        if not _is_extracted(data_root, key):
            extraction += int(sum(a.size or 0 for a in specs) * EXTRACTION_FACTOR)
    return remaining, extraction


def required_free_bytes(profile: Profile, data_root: Path) -> int:
    """Free disk the rest of the build needs: the archive bytes still to download, plus
    ``EXTRACTION_FACTOR`` x the archive bytes of every cache key not yet extracted.
    (An unpinned archive counts 0: pin first.)"""
    return sum(required_free_parts(profile, data_root))


def require_build_space(profile: Profile, data_root: Path) -> int:
    """Refuse (DiskSpaceError naming the bytes needed, the bytes free and the data root) when the free
    disk at ``data_root`` is below what the rest of the build needs; returns the bytes needed."""
    data_root = Path(data_root)
    download, extraction = required_free_parts(profile, data_root)
    needed = download + extraction
    if needed:
        require_free_space(
            data_root,
            needed,
            f"the rest of the build of profile {profile.name} ({needed} bytes: {human_bytes(download)} of "
            f"archives to download + {human_bytes(extraction)} to extract)",
        )
    return needed


# ----- one download -----------------------------------------------------------------------------------
@dataclass
class DownloadResult:
    path: str
    local_path: Path
    size: int
    sha256: str
    seconds: float
    bytes_downloaded: int  # body bytes received by this call (all attempts)
    resumed_from: int  # bytes of an earlier partial this call started from (0: from scratch)
    skipped: bool  # True: already verified locally, nothing downloaded
    attempts: int = 0  # HTTP download attempts made by this call

    @property
    def mb_per_s(self) -> float:
        return self.bytes_downloaded / self.seconds / 1e6 if self.seconds > 0 else 0.0


class _Cancelled(Exception):
    """Raised from inside the writer when a batch is being interrupted."""


class _BlockSink:
    """Receive, then write and hash at the same time, over recycled buffers.

    The receiving thread fills a buffer (:meth:`take`) and hands it over (:meth:`commit`); one
    background thread writes it to the partial file while a second one feeds it to the sha256, and
    the buffer goes back to the free list when both are done with it. Writing and hashing release
    the GIL, so the three stages run on different cores, and no memory is allocated per block.
    Both stages see every committed block in order; after :meth:`close` without ``error``, the pair
    (``hashed``, ``hasher``) describes the partial file exactly (after a write error the digest
    may cover bytes that never reached the file: it must not be reused then).
    At most ``depth`` blocks are in flight (back-pressure: :meth:`take` waits for a free buffer).
    """

    def __init__(
        self,
        fd: int,
        offset: int,
        hasher: Any,
        *,
        direct_fd: int | None = None,
        block: int | None = None,
        depth: int | None = None,
    ) -> None:
        self._fd = fd
        self._dfd = direct_fd  # the same file opened with O_DIRECT (aligned blocks go there), or None
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        for _ in range(depth or DEPTH):
            # mmap: page-aligned memory, as O_DIRECT needs; recycled, never reallocated
            self._free.put(mmap.mmap(-1, block or BLOCK_SIZE))
        self._start(offset, hasher)

    def _start(self, offset: int, hasher: Any) -> None:
        self.hasher = hasher
        self.received = offset  # file offset once every committed block is written
        self.hashed = offset
        self._written = offset  # file offset of the writer
        self._flushed = offset  # writeback started up to here (see ``WRITEBACK_EVERY``)
        self.direct_bytes = 0  # bytes written with O_DIRECT (the rest went through the page cache)
        self.error: BaseException | None = None
        self._to_write: queue.SimpleQueue[tuple[mmap.mmap, int] | None] = queue.SimpleQueue()
        self._to_hash: queue.SimpleQueue[tuple[mmap.mmap, int] | None] = queue.SimpleQueue()
        self._users: dict[int, int] = {}  # id(buffer) -> stages (write, hash) not yet done with it
        self._lock = threading.Lock()
        self._cur: mmap.mmap | None = None  # the buffer :meth:`feed` is filling
        self._fill = 0
        self._closed = False
        self._threads = [
            threading.Thread(target=self._write_loop, name="download-write", daemon=True),
            threading.Thread(target=self._hash_loop, name="download-hash", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def restart(self) -> None:
        """Start the file over: empty it and reset the digest (the server ignored a Range)."""
        self.close()
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._start(0, hashlib.sha256())

    # ----- background stages -----
    def _release(self, buf: mmap.mmap) -> None:
        """One stage is done with ``buf``; the last one gives it back to the free list."""
        with self._lock:
            left = self._users.pop(id(buf)) - 1
            if left:
                self._users[id(buf)] = left
                return
        self._free.put(buf)

    @property
    def direct(self) -> bool:
        """True while aligned blocks are written with ``O_DIRECT``."""
        return self._dfd is not None

    def _write_block(self, view: memoryview) -> None:
        """Write ``view`` (the start of a buffer) at the writer's offset: its aligned part with
        ``O_DIRECT`` when available, the rest through the page cache."""
        pos, n = 0, len(view)
        while pos < n:
            at = self._written
            fd, end = self._fd, n
            if self._dfd is not None and at % ALIGN == 0 and pos % ALIGN == 0 and n - pos >= ALIGN:
                fd, end = self._dfd, pos + (n - pos) // ALIGN * ALIGN
            try:
                k = os.pwrite(fd, view[pos:end], at)
            except OSError as e:
                if fd == self._dfd and e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                    # The file system wants another alignment: buffered writes from here on.
                    log.debug("O_DIRECT write refused (%s); writing through the page cache", e)
                    self._dfd = None
                    continue
                raise
            pos += k
            self._written += k
            if fd != self._fd:
                self.direct_bytes += k
        if (
            self._dfd is None
            and _sync_file_range is not None
            and self._written - self._flushed >= WRITEBACK_EVERY
        ):
            # Start writing these pages to disk now, without waiting (the final fsync then has
            # little left to do): the disk works while the download goes on.
            _sync_file_range(self._fd, self._flushed, self._written - self._flushed, 2)
            self._flushed = self._written

    def _write_loop(self) -> None:
        while (item := self._to_write.get()) is not None:
            buf, n = item
            if self.error is None:  # after a failure nothing more is written: the file stays a prefix
                try:
                    self._write_block(memoryview(buf)[:n])
                except BaseException as e:
                    self.error = e
            self._release(buf)

    def _hash_loop(self) -> None:
        while (item := self._to_hash.get()) is not None:
            buf, n = item
            self.hasher.update(memoryview(buf)[:n])
            self.hashed += n
            self._release(buf)

    # ----- the receiving thread -----
    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def take(self) -> mmap.mmap:
        """A free buffer to fill (waits while ``depth`` blocks are in flight)."""
        buf = self._free.get()
        if self.error is not None:
            self._free.put(buf)
            self._check()
        return buf

    def commit(self, buf: mmap.mmap, n: int) -> None:
        """Hand over the first ``n`` bytes of ``buf`` (or give an empty buffer back)."""
        if n:
            self.received += n
            with self._lock:
                self._users[id(buf)] = 2
            self._to_write.put((buf, n))
            self._to_hash.put((buf, n))
        else:
            self._free.put(buf)

    def feed(self, data: bytes) -> int:
        """Copy bytes received elsewhere (the client's own chunks) into buffers; returns the bytes of
        the blocks committed by this call (0 while the current buffer is not full)."""
        committed = 0
        view = memoryview(data)
        while view:
            if self._cur is None:
                self._cur, self._fill = self.take(), 0
            k = min(len(view), len(self._cur) - self._fill)
            self._cur[self._fill : self._fill + k] = view[:k]
            self._fill += k
            view = view[k:]
            if self._fill == len(self._cur):
                committed += self._fill
                self.commit(self._cur, self._fill)
                self._cur = None
        return committed

    def flush(self) -> int:
        """Commit a partly filled :meth:`feed` buffer; returns its bytes."""
        n = 0
        if self._cur is not None:
            n = self._fill
            self.commit(self._cur, self._fill)
            self._cur = None
        return n

    def close(self, *, check: bool = True) -> None:
        """Write and hash every committed block, stop the threads; raise a write error if ``check``."""
        if not self._closed:
            self._closed = True
            self.flush()
            self._to_write.put(None)
            self._to_hash.put(None)
            for t in self._threads:
                t.join()
        if check:
            self._check()


def _precheck(
    source: HubSource,
    specs: Iterable[ArchiveSpec],
    quarantined: Collection[str],
    listed: Collection[str] | None,
) -> list[str]:
    """Every reason (no request made) why these archives must not be requested."""
    problems: list[str] = []
    if not layout.HEX40_RE.match(source.revision):
        problems.append(
            f"revision {source.revision!r} of {source.label} is not a full 40-hex commit; "
            "a branch name, tag or short hash is never a pin"
        )
    for spec in specs:
        if spec.path in quarantined or layout.split_base(spec.path) in quarantined:
            problems.append(f"{spec.path} is quarantined: it is never downloaded")
        elif listed is not None and spec.path not in listed:
            problems.append(f"{spec.path} is not listed under [[archives]] of the profile")
        elif not spec.pinned:
            problems.append(f"{spec.path} is not pinned (no size/sha256 in the profile); {PIN_FIX}")
    return problems


def _raise_precheck(problems: list[str]) -> None:
    if problems:
        raise ProfileError(
            "refusing to download: " + "; ".join(problems) + ".",
            fix="pin the archive (`stage2 pin`), or remove it from the request",
        )


def _verify_existing(
    source: HubSource, spec: ArchiveSpec, data_root: Path, final: Path, reverify: bool
) -> str | None:
    """The pinned sha256 if the final file is good (by its record, or re-hashed), else None
    (and the bad file and its record are removed)."""
    record = layout.verified_record_path(data_root, spec.path)
    st = final.stat()
    if not reverify and _record_matches(_read_record(record), spec, st):
        return spec.sha256
    if st.st_size == spec.size:
        digest = sha256_file(final)
        if digest == spec.sha256:
            _write_record(data_root, spec, final, digest, source.revision)
            return digest
        log.warning(
            "%s: local file has sha256 %s, pinned %s; downloading it again", spec.path, digest, spec.sha256
        )
    else:
        log.warning(
            "%s: local file has %d bytes, pinned %s; downloading it again", spec.path, st.st_size, spec.size
        )
    record.unlink(missing_ok=True)
    final.unlink(missing_ok=True)
    return None


def download_archive(
    source: HubSource,
    spec: ArchiveSpec,
    data_root: Path,
    *,
    reverify: bool = False,
    progress: Callable[[int], None] | None = None,
    quarantined: Collection[str] = frozenset(),
    listed: Collection[str] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: float = DEFAULT_BACKOFF,
    cancel: threading.Event | None = None,
) -> DownloadResult:
    """Download one pinned archive into ``archives/<path>`` and verify it against its pin.

    Refused before any request (ProfileError): an unpinned or quarantined archive, one not in
    ``listed`` (when given), a revision that is not a full commit. Skipped without any request: a
    final file whose verification record matches (size, mtime_ns, pinned sha256), unless
    ``reverify``. A final file without a matching record is re-hashed and kept if it matches.
    Transient failures are retried ``attempts`` times (backoff ``backoff`` x 2^n seconds), each
    retry resuming from the partial file. A sha256 mismatch deletes the partial and raises
    ChecksumMismatchError.
    """
    _raise_precheck(_precheck(source, [spec], quarantined, listed))
    assert spec.size is not None and spec.sha256 is not None
    data_root = Path(data_root)
    t0 = time.monotonic()
    final = layout.archive_path(data_root, spec.path)
    if final.is_file():
        digest = _verify_existing(source, spec, data_root, final, reverify)
        if digest is not None:
            return DownloadResult(
                spec.path, final, spec.size, digest, time.monotonic() - t0, 0, 0, skipped=True, attempts=0
            )
    return _download(source, spec, data_root, progress, max(1, attempts), backoff, cancel, t0)


@dataclass
class _Progress:
    received: int = 0
    resumed_from: int | None = None
    carry: tuple[int, Any] | None = None  # (offset, hasher) of the partial after the last attempt


def _download(
    source: HubSource,
    spec: ArchiveSpec,
    data_root: Path,
    progress: Callable[[int], None] | None,
    attempts: int,
    backoff: float,
    cancel: threading.Event | None,
    t0: float,
) -> DownloadResult:
    assert spec.size is not None and spec.sha256 is not None
    final = layout.archive_path(data_root, spec.path)
    part = layout.partial_path(data_root, spec.path)
    url = source.file_url(spec.path)
    what = f"downloading {spec.path}"
    state = _Progress()
    meta_checked = False
    made = 0
    digest: str | None = None
    last: BaseException | None = None
    for attempt in range(1, attempts + 1):
        made = attempt
        try:
            if not meta_checked:
                _check_metadata(source, spec, url)
                meta_checked = True
            with disk_full_as(
                f"disk full while writing {part} ({spec.path}, {human_bytes(spec.size)}).",
                fix="free disk space (see `stage2 list`) and re-run; the download resumes",
            ):
                digest = _attempt(source, spec, url, part, state, progress, cancel, backoff)
            break
        except Stage2Error:
            raise
        except _Cancelled:
            raise DownloadCancelled(
                f"download of {spec.path} cancelled; the partial file is kept.",
                fix="re-run the download: it resumes from the partial file",
            ) from None
        except OSError as e:
            if not _is_transient(e):
                if _is_client_error(e):
                    raise _hub_error(e, source, what=what, path=spec.path) from e
                raise
            last = e
        except Exception as e:
            if not _is_transient(e):
                if _is_client_error(e):
                    raise _hub_error(e, source, what=what, path=spec.path) from e
                raise
            last = e
        assert last is not None
        if attempt == attempts:
            note = ""
            with contextlib.suppress(OSError):
                note = f" The partial file ({human_bytes(part.stat().st_size)}) is kept: re-running resumes."
            raise _hub_error(
                last, source, what=f"{what} (gave up after {attempts} attempt(s))", path=spec.path, note=note
            ) from last
        wait = min(backoff * 2 ** (attempt - 1), MAX_BACKOFF)
        log.warning(
            "%s: attempt %d/%d failed (%s); retrying in %.1fs",
            spec.path,
            attempt,
            attempts,
            source.redact(_first_line(f"{type(last).__name__}: {last}")),
            wait,
        )
        time.sleep(wait)
    assert digest is not None  # the loop either broke with a digest or raised
    if cancel is not None and cancel.is_set():  # cancelled as the last bytes arrived: publish nothing
        raise DownloadCancelled(
            f"download of {spec.path} cancelled; the partial file is kept.",
            fix="re-run the download: it resumes from the partial file",
        )

    if digest != spec.sha256:
        part.unlink(missing_ok=True)
        raise ChecksumMismatchError(spec.path, spec.sha256, digest, fix=MISMATCH_FIX)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, final)
    fsync_dir(final.parent)
    _write_record(data_root, spec, final, digest, source.revision)
    return DownloadResult(
        spec.path,
        final,
        spec.size,
        digest,
        time.monotonic() - t0,
        state.received,
        state.resumed_from or 0,
        skipped=False,
        attempts=made,
    )


def _check_metadata(source: HubSource, spec: ArchiveSpec, url: str) -> None:
    meta = get_hf_file_metadata(url, token=source.token)
    if meta.commit_hash != source.revision:
        raise HubError(
            f"the hub at {source.api_endpoint} served {spec.path} from commit {meta.commit_hash}, "
            f"not from the pinned {source.revision}.",
            fix="check the endpoint and [source] revision of the profile",
        )
    if meta.size != spec.size:
        raise HubError(
            f"{spec.path} is {meta.size} bytes upstream at {source.revision}, the profile pins {spec.size}.",
            fix="run `stage2 pin` and check the profile's size for this archive against the upstream listing",
        )
    if meta.etag and SHA256_RE.match(meta.etag) and meta.etag != spec.sha256:
        raise HubError(
            f"{spec.path} has sha256 {meta.etag} upstream at {source.revision}, the profile pins {spec.sha256}.",
            fix="run `stage2 pin` and check the profile's sha256 for this archive against the upstream listing",
        )


def _raw_socket(response: Any) -> socket.socket | None:
    """The socket the client's connection reads this response from, when reading the rest of the body
    straight from it is exactly equivalent to the client's own reads: HTTP/1.1 with a Content-Length
    (no chunked transfer, no content encoding), and either no TLS or TLS terminated on that socket
    object itself (``ssl.SSLSocket``, which decrypts on ``recv_into``). Otherwise (TLS inside TLS
    through an HTTPS proxy, HTTP/2, a transport without a socket) None: the client's iterator is used.
    """
    if not RAW_SOCKET_READS:
        return None
    version = response.extensions.get("http_version")
    if version not in (b"HTTP/1.1", "HTTP/1.1"):
        return None
    h = response.headers
    if "content-length" not in h or "chunked" in h.get("transfer-encoding", "").lower():
        return None
    if h.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        return None
    stream = response.extensions.get("network_stream")
    if stream is None or not hasattr(stream, "get_extra_info"):
        return None
    try:
        sock = stream.get_extra_info("socket")
        ssl_object = stream.get_extra_info("ssl_object")
    except Exception:
        return None
    if not isinstance(sock, socket.socket):
        return None
    if isinstance(sock, ssl.SSLSocket):
        return sock
    return sock if ssl_object is None else None


def _recv_block(sock: socket.socket, buf: mmap.mmap, want: int, request: Any, flags: int = 0) -> int:
    """Fill ``buf[:want]`` from the socket; returns the bytes read (fewer only at end of stream).
    ``flags``: ``MSG_WAITALL`` on a blocking socket with ``SO_RCVTIMEO`` (see ``_waitall``): one
    system call per block. Socket errors are raised as the client's own exception classes (so
    retries treat them alike)."""
    view = memoryview(buf)
    fill = 0
    try:
        while fill < want:
            k = sock.recv_into(view[fill:want], 0, flags)
            if k == 0:
                break
            fill += k
    except (TimeoutError, BlockingIOError) as e:  # BlockingIOError: SO_RCVTIMEO expired, no byte
        raise _ReadFailed(fill, _httpx.ReadTimeout(f"read timed out: {e}", request=request)) from e
    except OSError as e:
        raise _ReadFailed(fill, _httpx.ReadError(f"{type(e).__name__}: {e}", request=request)) from e
    return fill


@contextlib.contextmanager
def _waitall(sock: socket.socket, timeout: float | None) -> Iterator[int]:
    """Yields the ``recv`` flags for :func:`_recv_block`: ``MSG_WAITALL`` on a plain (not TLS) socket
    switched to blocking mode with a kernel receive timeout (``SO_RCVTIMEO``), so that a whole block
    arrives in one system call (one GIL release) instead of one call per ~64 KiB; 0 (and Python's
    own timeout) where that is not available. The socket's timeout state is restored afterwards."""
    waitall = getattr(socket, "MSG_WAITALL", 0)
    if not USE_WAITALL or not waitall or timeout is None or isinstance(sock, ssl.SSLSocket):
        sock.settimeout(timeout)
        yield 0
        return
    previous = sock.gettimeout()
    sec = int(timeout)
    try:
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, int((timeout - sec) * 1e6))
        )
        sock.settimeout(None)
    except OSError:
        sock.settimeout(timeout)
        yield 0
        return
    try:
        yield waitall
    finally:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))
            sock.settimeout(previous)


class _ReadFailed(Exception):
    """A socket read failed after ``got`` bytes of the block were received."""

    def __init__(self, got: int, error: Exception) -> None:
        super().__init__(str(error))
        self.got = got
        self.error = error


def _get_into(
    source: HubSource,
    spec: ArchiveSpec,
    url: str,
    sink: _BlockSink,
    state: _Progress,
    report: Callable[..., None],
) -> None:
    """One GET from ``sink.received`` to the end of the file, the body streamed into ``sink``."""
    assert spec.size is not None
    start = sink.received
    headers = build_hf_headers(token=source.token)
    headers["Accept-Encoding"] = "identity"
    if start:
        headers["Range"] = f"bytes={start}-"
    with http_stream_backoff(
        "GET",
        url,
        headers=headers,
        timeout=hf_constants.HF_HUB_DOWNLOAD_TIMEOUT,
        max_retries=0,  # retries are ours: backoff, resume, and a fresh metadata check if needed
        retry_on_exceptions=(),
        retry_on_status_codes=(),
    ) as response:
        hf_raise_for_status(response)
        status = response.status_code
        if start and status == 200:
            log.warning("%s: the server ignored the Range request; starting over", spec.path)
            sink.restart()
            start = 0
        elif start and status == 206:
            crange = response.headers.get("content-range", "")
            if not crange.startswith(f"bytes {start}-"):
                raise HubError(
                    f"the hub at {source.api_endpoint} answered a request for {spec.path} from byte {start} "
                    f"with Content-Range {crange!r}.",
                    fix="retry later; if it persists, delete the partial file and re-run",
                )
        elif status != 200:
            raise HubError(
                f"the hub at {source.api_endpoint} answered HTTP {status} to the download of {spec.path}.",
                fix="retry later; if it persists, check the endpoint",
            )
        if state.resumed_from is None:
            state.resumed_from = start
        want = spec.size - start
        length_header = response.headers.get("content-length")
        if length_header is not None and length_header.isdigit() and int(length_header) != want:
            raise HubError(
                f"the hub at {source.api_endpoint} sends {length_header} bytes of {spec.path} from byte "
                f"{start}, the pinned size leaves {want}.",
                fix="run `stage2 pin` and check the profile's size for this archive against the upstream listing",
            )
        chunks = response.iter_raw()  # kept referenced: closing it would close the response
        sock = _raw_socket(response)
        got = 0
        if sock is None:  # the client's own body iterator
            try:
                for chunk in chunks:
                    if got + len(chunk) > want:
                        raise HubError(
                            f"the hub at {source.api_endpoint} sent more than the pinned {spec.size} bytes of {spec.path}.",
                            fix="run `stage2 pin` and check the profile's size for this archive",
                        )
                    got += len(chunk)
                    report(sink.feed(chunk))
            except BaseException:
                report(sink.flush(), quiet=True)  # what arrived before the failure is kept
                raise
        else:
            # What the client already read past the headers, then the rest straight from the socket
            # into our recycled buffers (no allocation, no copy in Python; the GIL is released).
            first = next(chunks, b"")
            got += len(first)
            report(sink.feed(first))
            report(sink.flush())
            with _waitall(sock, hf_constants.HF_HUB_DOWNLOAD_TIMEOUT) as flags:
                while got < want:
                    buf = sink.take()
                    ask = min(len(buf), want - got)
                    if sink.received % ALIGN:  # back to an aligned file offset (for O_DIRECT)
                        ask = min(ask, ALIGN - sink.received % ALIGN)
                    try:
                        n = _recv_block(sock, buf, ask, response.request, flags)
                    except _ReadFailed as e:
                        sink.commit(buf, e.got)
                        report(e.got, quiet=True)
                        raise e.error from None
                    sink.commit(buf, n)
                    got += n
                    report(n)
                    if n == 0:
                        break
        report(sink.flush())
        if got != want:
            raise _httpx.RemoteProtocolError(
                f"connection closed after {got} of {want} bytes of {spec.path}", request=response.request
            )


def _attempt(
    source: HubSource,
    spec: ArchiveSpec,
    url: str,
    part: Path,
    state: _Progress,
    progress: Callable[[int], None] | None,
    cancel: threading.Event | None,
    backoff: float,
) -> str:
    """One download attempt, resuming from the partial file; returns the sha256 of the whole file.

    A connection that drops after bytes arrived is resumed at once within the attempt (as the
    client's own ``http_get`` does); an error before any byte ends the attempt.
    """
    assert spec.size is not None
    part.parent.mkdir(parents=True, exist_ok=True)
    try:
        psize = part.stat().st_size
    except FileNotFoundError:
        psize = 0
    if psize > spec.size:
        log.warning("%s: partial file is longer than the pinned size; starting over", spec.path)
        part.unlink()
        psize = 0
    if psize == 0:
        hasher, resume = hashlib.sha256(), 0
    elif state.carry is not None and state.carry[0] == psize:
        hasher, resume = state.carry[1].copy(), psize  # this call wrote it: no need to hash it again
    else:
        hasher, resume = hasher_of_prefix(part)
    state.carry = None

    def report(n: int, *, quiet: bool = False) -> None:
        """Count ``n`` bytes handed to the sink; ``quiet``: while another error propagates (the
        progress callback's own errors are then ignored, and cancellation is not checked)."""
        if n:
            state.received += n
            if progress is not None:
                if quiet:
                    with contextlib.suppress(Exception):
                        progress(n)
                else:
                    progress(n)
        if not quiet and cancel is not None and cancel.is_set():
            raise _Cancelled()

    fd = os.open(part, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    dfd: int | None = None
    if DIRECT_IO and hasattr(os, "O_DIRECT"):
        try:
            dfd = os.open(part, os.O_WRONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
        except OSError:  # e.g. tmpfs: no O_DIRECT, buffered writes only
            dfd = None
    try:
        os.ftruncate(fd, resume)
        sink = _BlockSink(fd, resume, hasher, direct_fd=dfd)
        try:
            if resume == spec.size and state.resumed_from is None:
                state.resumed_from = resume
            while sink.received < spec.size:
                before = sink.received
                try:
                    _get_into(source, spec, url, sink, state, report)
                except (_httpx.TimeoutException, _httpx.NetworkError, _httpx.RemoteProtocolError) as e:
                    if sink.received == before:
                        raise
                    log.warning(
                        "%s: connection lost after %s (%s); resuming",
                        spec.path,
                        human_bytes(sink.received),
                        source.redact(_first_line(f"{type(e).__name__}: {e}")),
                    )
                    time.sleep(min(backoff, 1.0))
        except BaseException:
            sink.close(check=False)
            if sink.error is None:
                state.carry = (sink.hashed, sink.hasher.copy())
            raise
        sink.close()
        state.carry = (sink.hashed, sink.hasher.copy())
        os.fsync(fd)
        return str(sink.hasher.hexdigest())
    finally:
        if dfd is not None:
            os.close(dfd)
        os.close(fd)


# ----- many downloads -----------------------------------------------------------------------------------
def default_workers(n: int) -> int:
    return max(1, min(4, n))


def download_archives(
    source: HubSource,
    specs: Iterable[ArchiveSpec],
    data_root: Path,
    *,
    workers: int | None = None,
    reverify: bool = False,
    progress: Callable[[int], None] | None = None,
    quarantined: Collection[str] = frozenset(),
    listed: Collection[str] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: float = DEFAULT_BACKOFF,
    check_space: bool = True,
) -> list[DownloadResult]:
    """Download several archives concurrently (``workers`` threads, default ``min(4, n)``), the
    largest remainder first; results come back in the order of ``specs``.

    Every archive is checked first (nothing is requested if one is unpinned, quarantined or
    unlisted), and the free disk for what remains to download. Failures are gathered: one
    DownloadsFailedError lists every failed file (the others are complete and verified).
    ``progress`` is called from the worker threads.
    """
    specs = list(specs)
    _raise_precheck(_precheck(source, specs, quarantined, listed))
    data_root = Path(data_root)
    remaining = {s.path: _remaining_download_bytes(data_root, s) for s in specs}
    if check_space and specs:
        needed = sum(remaining.values())
        require_free_space(layout.archives_dir(data_root), needed, f"downloading {len(specs)} archive(s)")
    cancel = threading.Event()
    results: dict[str, DownloadResult] = {}
    errors: dict[str, BaseException] = {}
    pool = ThreadPoolExecutor(
        max_workers=workers or default_workers(len(specs)), thread_name_prefix="download"
    )
    try:
        futures: dict[Future[DownloadResult], ArchiveSpec] = {
            pool.submit(
                download_archive,
                source,
                s,
                data_root,
                reverify=reverify,
                progress=progress,
                quarantined=quarantined,
                listed=listed,
                attempts=attempts,
                backoff=backoff,
                cancel=cancel,
            ): s
            # largest remainder first: the last download ends soonest
            for s in sorted(specs, key=lambda s: -remaining[s.path])
        }
        for fut, s in futures.items():
            try:
                results[s.path] = fut.result()
            except Exception as e:
                errors[s.path] = e
    except BaseException:
        cancel.set()  # Ctrl-C: stop every download at its next chunk; partial files are kept
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    done = [results[s.path] for s in specs if s.path in results]
    if errors:
        errors = {s.path: errors[s.path] for s in specs if s.path in errors}  # in the order asked
        problems = [f"{p}: {source.redact(str(e))}" for p, e in errors.items()]
        raise DownloadsFailedError(
            f"{len(errors)} of {len(specs)} archive download(s) failed",
            problems,
            errors=errors,
            results=done,
            fix="fix the named problem(s) and re-run: verified archives are skipped, partial ones resume",
        )
    return done


# ----- pin -----------------------------------------------------------------------------------------------
def pin_profile(profile: Profile, source: HubSource) -> tuple[Profile, list[str]]:
    """Fill every missing size/sha256 from the hub's listing at the pinned revision.

    Refuses (PinError, a ProfileError listing every problem) when an archive is missing
    upstream, a pinned size or sha256 differs from the listing, an upstream file has no sha256
    (not an LFS file), a quarantined file is listed under [[archives]], or ``source`` names another
    repository or revision than the profile. A revision that is not a full commit, or that does not
    exist, is refused before or by the hub (ProfileError / HubError). Returns the new profile and
    one human-readable line per change.
    """
    problems: list[str] = []
    src = profile.source
    if (source.repo_id, source.repo_type, source.revision) != (src.repo_id, src.repo_type, src.revision):
        problems.append(
            f"the hub source {source.repo_type}:{source.repo_id}@{source.revision} is not the profile's "
            f"[source] {src.repo_type}:{src.repo_id}@{src.revision}"
        )
    if not layout.HEX40_RE.match(source.revision):
        raise ProfileError(
            f"revision {source.revision!r} is not a full 40-hex commit; a branch name, tag or short hash "
            "is never a pin.",
            fix="set [source] revision to the full commit you want to pin",
        )
    quarantined = profile.quarantined_paths()
    for i, a in enumerate(profile.archives):
        if a.path in quarantined or layout.split_base(a.path) in quarantined:
            problems.append(
                f"archives[{i}] {a.path}: quarantined, yet listed under [[archives]]; "
                "a quarantined file is never downloaded: remove one of the two entries"
            )
    if problems:
        raise PinError(
            f"cannot pin profile {profile.name}",
            problems,
            fix="correct the profile, then run `stage2 pin` again",
        )

    remote = list_remote_files(source)
    changes: list[str] = []
    new_archives: list[ArchiveSpec] = []
    for i, a in enumerate(profile.archives):
        r = remote.get(a.path)
        if r is None:
            problems.append(
                f"archives[{i}] {a.path}: not found upstream in {source.label} at revision {source.revision}"
            )
            new_archives.append(a)
            continue
        if r.sha256 is None:
            problems.append(
                f"archives[{i}] {a.path}: upstream lists no sha256 (not an LFS file); cannot pin it"
            )
            new_archives.append(a)
            continue
        if a.size is not None and a.size != r.size:
            problems.append(f"archives[{i}] {a.path}: size {a.size} in the profile, {r.size} upstream")
        if a.sha256 is not None and a.sha256 != r.sha256:
            problems.append(f"archives[{i}] {a.path}: sha256 {a.sha256} in the profile, {r.sha256} upstream")
        if a.size is None or a.sha256 is None:
            changes.append(f"pinned {a.path}: size={r.size} sha256={r.sha256}")
        new_archives.append(a.model_copy(update={"size": r.size, "sha256": r.sha256}))
    if problems:
        raise PinError(
            f"cannot pin profile {profile.name}: it disagrees with the hub's listing of {source.label} "
            f"at {source.revision}",
            problems,
            fix="correct the named [[archives]] entries (or the revision) so they match upstream, then pin again",
        )
    validated = [ArchiveSpec.model_validate(a.model_dump()) for a in new_archives]
    return profile.model_copy(update={"archives": validated}), changes


def download_profile(
    profile: Profile,
    source: HubSource,
    data_root: Path,
    *,
    workers: int | None = None,
    reverify: bool = False,
    progress: Callable[[int], None] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: float = DEFAULT_BACKOFF,
) -> list[DownloadResult]:
    """All archives of a profile: checks the source against the profile, the free disk for the
    downloads and the extraction that follows (``required_free_bytes``), then downloads."""
    src = profile.source
    if (source.repo_id, source.repo_type, source.revision) != (src.repo_id, src.repo_type, src.revision):
        raise ProfileError(
            f"the hub source {source.repo_type}:{source.repo_id}@{source.revision} is not the profile's "
            f"[source] {src.repo_type}:{src.repo_id}@{src.revision}.",
            fix="build the source from the profile (HubSource.from_profile)",
        )
    _raise_precheck(_precheck(source, profile.archives, profile.quarantined_paths(), profile.archive_paths()))
    require_build_space(profile, Path(data_root))
    return download_archives(
        source,
        profile.archives,
        data_root,
        workers=workers,
        reverify=reverify,
        progress=progress,
        quarantined=profile.quarantined_paths(),
        listed=profile.archive_paths(),
        attempts=attempts,
        backoff=backoff,
        check_space=False,
    )
