"""Pinned, verified, resumable downloads through the real ``huggingface_hub`` client.

Everything that talks to the hub goes through the client's own functions (``HfApi``,
``get_hf_file_metadata``, ``hf_hub_url``, ``http_get``); the endpoint is always passed explicitly,
so the same code talks to https://huggingface.co or to the loopback hub (``stage2_data.hubserver``)
by changing only ``HubSource.endpoint``.

A download goes to ``archives/.partial/<path>.part`` and is hashed while the bytes arrive (one
pass). A dropped connection, a timeout or a 5xx is retried with exponential backoff, each retry
resuming from the partial file with a ``Range`` request. Only a file whose sha256 equals its pin is
moved (``os.replace``) to ``archives/<path>``, next to a verification record
``archives/<path>.verified.json`` (path, size, mtime_ns, sha256, revision, verified_at). A later
call that finds a record matching the file's size, mtime and pinned sha256 makes no request at all.

The token is never logged, never put in an exception message, a repr or a record.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import inspect
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Literal, cast

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers

from . import layout
from .errors import (
    ChecksumMismatchError,
    DiskSpaceError,
    HubError,
    ProblemsError,
    ProfileError,
    Stage2Error,
)
from .fsutil import atomic_write_json, fsync_dir, human_bytes, require_free_space
from .hashing import SHA256_RE, HashingWriter, hasher_of_prefix, sha256_file
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

_HTTP_GET_PARAMS = set(inspect.signature(http_get).parameters)


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


def required_free_bytes(profile: Profile, data_root: Path) -> int:
    """Free disk the rest of the build needs: the archive bytes still to download, plus
    ``EXTRACTION_FACTOR`` x the archive bytes of every cache key not yet extracted.
    (An unpinned archive counts 0: pin first.)"""
    remaining = sum(_remaining_download_bytes(data_root, a) for a in profile.archives)
    extraction = 0
    for key, specs in profile.archives_by_cache_key().items():
        if not _is_extracted(data_root, key):
            extraction += int(sum(a.size or 0 for a in specs) * EXTRACTION_FACTOR)
    return remaining + extraction


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


class _Writer(HashingWriter):
    """HashingWriter that reports byte increments as they reach the file."""

    def __init__(self, f: BinaryIO, *, prefix_hasher: Any, on_bytes: Callable[[int], None]) -> None:
        super().__init__(f, prefix_hasher=prefix_hasher)
        self._on_bytes = on_bytes

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = super().write(data)
        self._on_bytes(len(data))
        return n

    def hasher_copy(self) -> Any:
        return self._h.copy()


class _Pipeline:
    """The file object handed to ``http_get``: each received chunk is passed to a background
    thread that writes it through the HashingWriter, so receiving overlaps with writing and
    hashing (file writes and sha256 both release the GIL). At most ``depth`` chunks wait
    (memory stays bounded: the client's chunks are 10 MiB). ``tell``/``seek``/``truncate``/``flush``
    first wait for every queued chunk; an error of the background thread is raised by the next call.
    """

    def __init__(self, inner: _Writer, *, cancel: threading.Event | None, depth: int = 4) -> None:
        self._inner = inner
        self._cancel = cancel
        self._q: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self._err: BaseException | None = None
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="download-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                if not self._failed:  # after a failure nothing more is written: the file stays a clean prefix
                    self._inner.write(item)
            except BaseException as e:  # handed to the receiving thread
                self._failed = True
                self._err = e
            finally:
                self._q.task_done()

    def _check(self) -> None:
        if self._err is not None:
            err, self._err = self._err, None
            raise err
        if self._failed:
            raise OSError("writing the partial file failed earlier")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._cancel is not None and self._cancel.is_set():
            raise _Cancelled()
        self._check()
        n = len(data)
        self._q.put(bytes(data))
        return n

    def drain(self) -> None:
        self._q.join()
        self._check()

    def tell(self) -> int:
        self.drain()
        return self._inner.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        self.drain()
        return self._inner.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        self.drain()
        return self._inner.truncate(size)

    def flush(self) -> None:
        self.drain()
        self._inner.flush()

    def close(self) -> None:
        """Stop the background thread (after the queued chunks are written)."""
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()

    @property
    def name(self) -> str:
        return self._inner.name


class _NoBar:
    """A do-nothing progress bar for the client (the CLI draws its own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.n = 0

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, n: float | None = 1) -> None:
        return None

    def close(self) -> None:
        return None


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
            digest = _attempt(source, spec, url, part, state, progress, cancel)
            break
        except Stage2Error:
            raise
        except _Cancelled:
            raise DownloadCancelled(
                f"download of {spec.path} cancelled; the partial file is kept.",
                fix="re-run the download: it resumes from the partial file",
            ) from None
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise DiskSpaceError(
                    f"disk full while writing {part} ({spec.path}, {human_bytes(spec.size)}).",
                    fix="free disk space (see `required_free_bytes`) and re-run; the download resumes",
                ) from e
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


def _attempt(
    source: HubSource,
    spec: ArchiveSpec,
    url: str,
    part: Path,
    state: _Progress,
    progress: Callable[[int], None] | None,
    cancel: threading.Event | None,
) -> str:
    """One GET (resuming from the partial file); returns the sha256 of the whole partial file."""
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

    def on_bytes(n: int) -> None:
        state.received += n
        if progress is not None:
            progress(n)

    headers = build_hf_headers(token=source.token)
    headers["Accept-Encoding"] = "identity"
    kwargs: dict[str, Any] = {}
    if "tqdm_class" in _HTTP_GET_PARAMS:
        kwargs["tqdm_class"] = _NoBar
    if "_nb_retries" in _HTTP_GET_PARAMS:
        kwargs["_nb_retries"] = 0  # retries are ours: backoff, and a fresh metadata check if needed
    if "displayed_filename" in _HTTP_GET_PARAMS:
        kwargs["displayed_filename"] = spec.path

    fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+b") as f:
        f.seek(resume)
        f.truncate()
        writer = _Writer(f, prefix_hasher=hasher, on_bytes=on_bytes)
        pipe = _Pipeline(writer, cancel=cancel)
        try:
            http_get(
                url,
                cast(BinaryIO, pipe),
                resume_size=resume,
                headers=headers,
                expected_size=spec.size,
                **kwargs,
            )
            pipe.drain()
        finally:
            pipe.close()
            with contextlib.suppress(Exception):
                f.flush()
                offset = f.tell()
                if state.resumed_from is None:
                    state.resumed_from = offset - writer.bytes_written
                state.carry = (offset, writer.hasher_copy())
        f.flush()
        os.fsync(f.fileno())
        return writer.hexdigest()


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
    """Download several archives concurrently (``workers`` threads, default ``min(4, n)``).

    Every archive is checked first (nothing is requested if one is unpinned, quarantined or
    unlisted), and the free disk for what remains to download. Failures are gathered: one
    DownloadsFailedError lists every failed file (the others are complete and verified).
    ``progress`` is called from the worker threads.
    """
    specs = list(specs)
    _raise_precheck(_precheck(source, specs, quarantined, listed))
    data_root = Path(data_root)
    if check_space and specs:
        needed = sum(_remaining_download_bytes(data_root, s) for s in specs)
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
            for s in specs
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
    require_free_space(
        Path(data_root),
        required_free_bytes(profile, Path(data_root)),
        f"profile {profile.name} (archives + extraction)",
    )
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
