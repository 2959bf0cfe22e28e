"""The bytes of one archive into its partial file: GET, resume, retries with backoff.

The GET is made by the client's own streaming call (its session: redirects, TLS, proxies, auth
headers, error classes) and the body read through its public streaming API (``iter_raw``); each
chunk is copied into recycled 1 MiB buffers that are written and hashed at once (``sink._BlockSink``).

A connection that drops after bytes arrived is resumed at once; a timeout, a drop before any byte,
a 429 or a 5xx is retried by the one retry policy (``retry.py``: exponential backoff, or the hub's
``Retry-After``, bounded); each retry resumes from the partial file with a ``Range`` request.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from huggingface_hub import constants as hf_constants
from huggingface_hub import get_hf_file_metadata
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

from ..errors import DiskSpaceError, HubError, Stage2Error
from ..fsutil import DISK_FULL_ERRNOS, free_bytes, human_bytes, open_regular
from ..hashing import SHA256_RE, hasher_of_prefix
from ..profile import ArchiveSpec
from .cancel import cancelled as _cancelled
from .cancel import live_socket as _live_socket
from .endpoint import pin_check_command
from .hub import HubSource, PinDisagreesError, _first_line, _httpx
from .retry import RetryPolicy, with_retries
from .sink import _BlockSink

log = logging.getLogger(__name__)


class DownloadCancelled(HubError):
    """The download was cancelled (``cancel`` event set, e.g. on Ctrl-C); the partial file is kept."""

    could_not_run = False  # a stop, said as such


class _Cancelled(Exception):
    """Raised from inside the writer when a batch is being interrupted."""


def _cancelled_error(spec: ArchiveSpec) -> DownloadCancelled:
    return DownloadCancelled(
        f"download of {spec.path} cancelled; the partial file is kept.",
        fix="re-run the download: it resumes from the partial file",
    )


@dataclass
class _Progress:
    received: int = 0
    resumed_from: int | None = None
    carry: tuple[int, Any] | None = None  # (offset, hasher) of the partial after the last attempt


@dataclass(frozen=True)
class Fetched:
    """A partial file holding every pinned byte, as :func:`fetch_partial` left it."""

    sha256: str  # of the whole partial file
    received: int  # body bytes received (all attempts)
    resumed_from: int  # bytes of an earlier partial the first attempt started from (0: from scratch)
    attempts: int  # HTTP download attempts made


def fetch_partial(
    source: HubSource,
    spec: ArchiveSpec,
    part: Path,
    *,
    progress: Callable[[int], None] | None,
    attempts: int,
    backoff: float,
    cancel: threading.Event | None,
    policy: RetryPolicy | None = None,
) -> Fetched:
    """Bring ``part`` to the pinned size of ``spec`` (resuming from what it holds) and hash it.

    The hub's metadata for the file is checked once (commit, size, sha256) before the first GET.
    Transient failures are retried by the one retry policy (``retry.py``: ``attempts`` in all,
    backoff ``backoff`` x 2^n seconds, or the hub's ``Retry-After``, bounded), each retry resuming
    from the partial file. Raises DownloadCancelled when ``cancel`` is set (the partial file is
    kept), a HubError naming the failure otherwise.
    """
    assert spec.size is not None and spec.sha256 is not None
    url = source.file_url(spec.path)
    state = _Progress()
    meta_checked = False
    if policy is None:
        policy = RetryPolicy(attempts=attempts, backoff=backoff)

    def one_attempt(attempt: int) -> str:
        nonlocal meta_checked
        if _cancelled(cancel):
            raise _Cancelled()
        if not meta_checked:
            _check_metadata(source, spec, url)
            meta_checked = True
        try:
            return _attempt(source, spec, url, part, state, progress, cancel, policy.backoff)
        except OSError as e:
            if isinstance(e, Stage2Error) or e.errno not in DISK_FULL_ERRNOS:
                raise
            raise _disk_full(spec, part) from e

    def kept() -> str:
        with contextlib.suppress(OSError):
            return f" The partial file ({human_bytes(part.stat().st_size)}) is kept: re-running resumes."
        return ""

    try:
        digest, made = with_retries(
            one_attempt,
            source,
            what=f"downloading {spec.path}",
            path=spec.path,
            policy=policy,
            cancelled=lambda: _cancelled_error(spec),
            give_up_note=kept,
        )
    except _Cancelled:
        raise _cancelled_error(spec) from None
    if _cancelled(cancel):  # cancelled as the last bytes arrived: publish nothing
        raise _cancelled_error(spec)
    return Fetched(digest, state.received, state.resumed_from or 0, made)


def _disk_full(spec: ArchiveSpec, part: Path) -> DiskSpaceError:
    """The disk (or quota) ran out while writing ``part``: the path, what it holds, the free space."""
    assert spec.size is not None
    try:
        have = part.stat().st_size
    except OSError:
        have = 0
    try:
        free = human_bytes(free_bytes(part.parent))
    except OSError:
        free = "unknown"
    return DiskSpaceError(
        f"disk full while writing {part} ({spec.path}): {human_bytes(have)} of {human_bytes(spec.size)} "
        f"written, {human_bytes(spec.size - have)} still to come, {free} free there.",
        fix=f"free disk space there (at least {human_bytes(spec.size - have)}; `stage2 list` shows what the "
        "rest of the build needs), or choose another --data-root, and re-run: the download resumes",
    )


def confirm_at_source(source: HubSource, spec: ArchiveSpec, *, attempts: int, backoff: float) -> None:
    """The hub's answer to the HEAD of ``spec`` at the pinned revision (its commit, size and
    sha256), checked as a download checks it before its first byte, without downloading: for a
    verified file whose record names another source than the profile's. A HubError names what
    disagrees (a revision or repo that does not exist, a file the hub holds with other bytes)."""
    url = source.file_url(spec.path)
    with_retries(
        lambda _attempt: _check_metadata(source, spec, url),
        source,
        what=f"checking {spec.path} at {source.label}@{source.revision}",
        path=spec.path,
        policy=RetryPolicy(attempts=attempts, backoff=backoff),
    )


def _check_metadata(source: HubSource, spec: ArchiveSpec, url: str) -> None:
    meta = get_hf_file_metadata(url, token=source.token)
    if meta.commit_hash is None:
        raise HubError(
            f"the answer of {source.api_endpoint} to the HEAD of {spec.path} carries none of the hub's headers "
            "(no X-Repo-Commit): it does not come from a hub, but from a proxy, a login or error page, or an "
            "endpoint that is not the hub's API.",
            fix="check --endpoint / HF_ENDPOINT (the hub itself, e.g. https://huggingface.co), the token "
            "(HF_TOKEN) and any proxy in between (HTTPS_PROXY / NO_PROXY), then re-run",
        )
    if meta.commit_hash != source.revision:
        raise HubError(
            f"the hub at {source.api_endpoint} served {spec.path} from commit {meta.commit_hash}, "
            f"not from the pinned {source.revision}.",
            fix="check the endpoint and [source] revision of the profile",
        )
    if meta.size != spec.size:
        raise _answer_disagrees(
            source, spec, f"the hub at {source.api_endpoint} says {spec.path} is {meta.size} bytes (HEAD)"
        )
    if meta.etag and SHA256_RE.match(meta.etag) and meta.etag != spec.sha256:
        raise _answer_disagrees(
            source, spec, f"the hub at {source.api_endpoint} says {spec.path} has sha256 {meta.etag} (HEAD)"
        )


def _answer_disagrees(source: HubSource, spec: ArchiveSpec, said: str) -> Stage2Error:
    """A download answer disagrees with the pin (``said``: what it said). The hub's listing at the
    pinned revision (the source ``stage2 pin`` reads) tells which side is wrong: a listing that
    agrees with the pin means the answer is wrong (a proxy, a CDN, the wrong endpoint), not the
    pin, so ``stage2 pin`` would change nothing (a HubError); a listing that lists the file with
    other values means the pin is wrong: PinDisagreesError (a bad profile, as for a verified file
    on disk; ``download_archive`` names the pin by its key in the profile)."""
    from .listing import list_remote_files  # the error path only

    pinned = f"the profile pins {spec.size} bytes, sha256 {spec.sha256}"
    try:
        listed = list_remote_files(source).get(spec.path)
    except HubError as e:
        return HubError(
            f"{said}; {pinned}, and the hub's listing could not be read to tell which is right "
            f"({e.message.splitlines()[0]}).",
            fix="check the endpoint (--endpoint / HF_ENDPOINT) and any proxy (HTTPS_PROXY), then re-run; "
            f"{pin_check_command('<profile>', source.api_endpoint, source.hub_folder)} compares the pins with the listing",
        )
    if listed is not None and (listed.size, listed.sha256) == (spec.size, spec.sha256):
        return HubError(
            f"{said}; {pinned}, and the hub's own listing of {source.label} at {source.revision} agrees "
            "with the pin: the download answer is wrong, not the pin (a proxy, a CDN or cache in between, "
            "or an endpoint that is not the hub's).",
            fix="check the endpoint (--endpoint / HF_ENDPOINT) and any proxy between (HTTPS_PROXY / NO_PROXY); "
            "retry later: the partial file is kept and resumes",
        )
    if listed is None or listed.sha256 is None:  # not listed, or not as an LFS file: no upstream pin
        upstream = (
            "does not list it"
            if listed is None
            else f"lists it with {listed.size} bytes and no sha256 (not an LFS file)"
        )
        return HubError(
            f"{said}; {pinned}, and the hub's listing at {source.revision} {upstream}: the pin "
            "disagrees with upstream.",
            fix="check the archive's path and the [source] revision in the profile "
            f"({pin_check_command('<profile>', source.api_endpoint, source.hub_folder)} names the entry)",
        )
    return PinDisagreesError(
        f"{said}; {pinned}, and the hub's listing at {source.revision} says {listed.size} bytes, sha256 "
        f"{listed.sha256}: the pin disagrees with upstream.",
        fix="correct this archive's size and sha256 in the profile to the listing's "
        f"({pin_check_command('<profile>', source.api_endpoint, source.hub_folder)} names the entry and both values)",
        path=spec.path,
        keys=[
            k
            for k, a, b in (("size", spec.size, listed.size), ("sha256", spec.sha256, listed.sha256))
            if a != b
        ],
        upstream=(listed.size, listed.sha256),
        said=said,
    )


def _html_page(source: HubSource, spec: ArchiveSpec, response: Any) -> HubError | None:
    """A HubError when the answer to an archive's GET is an HTML page (a login, consent or error
    page of the hub, a proxy or a captive portal) instead of the archive's bytes; else None."""
    ctype = response.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() not in ("text/html", "application/xhtml+xml"):
        return None
    origin = urlsplit(str(response.url))
    served = f"{origin.scheme}://{origin.netloc.rsplit('@', 1)[-1]}"
    by = (
        ""
        if served == _origin_of(source.api_endpoint)
        else f" (served by {served}, where the hub redirected it)"
    )
    return HubError(
        f"the hub at {source.api_endpoint} answered the download of {spec.path} with an HTML page{by} "
        f"(Content-Type {ctype.strip()}, Content-Length {response.headers.get('content-length', 'none')}), "
        "not the archive's bytes: a login, consent or error page.",
        fix=f"check that the token (HF_TOKEN, or the variable named by --token-env) may read {source.label}, "
        "that --endpoint / HF_ENDPOINT is the hub itself, and any proxy or captive portal in between "
        "(HTTPS_PROXY); then re-run: the partial file is kept",
    )


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


def _connection_socket(response: Any) -> socket.socket | None:
    """The socket of the connection ``response`` is read from (the client's ``network_stream``
    extension), or None: registered for :func:`~.cancel.cancel_downloads`, which shuts it down so
    that a read blocked on a stalled connection ends at once."""
    stream = response.extensions.get("network_stream")
    try:
        sock = stream.get_extra_info("socket") if stream is not None else None
    except Exception:  # a transport without a socket: a stop waits for the read timeout
        return None
    return sock if isinstance(sock, socket.socket) else None


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
        html = _html_page(source, spec, response)
        if html is not None:
            raise html
        if state.resumed_from is None:
            state.resumed_from = start
        want = spec.size - start
        length_header = response.headers.get("content-length")
        if length_header is not None and length_header.isdigit() and int(length_header) != want:
            raise _answer_disagrees(
                source,
                spec,
                f"the hub at {source.api_endpoint} sent Content-Length {length_header} for {spec.path} from "
                f"byte {start}, where the pinned size leaves {want} bytes",
            )
        got = 0
        sock = _connection_socket(response)
        with _live_socket(sock) if sock is not None else contextlib.nullcontext():
            try:
                for chunk in response.iter_raw():
                    if got + len(chunk) > want:
                        raise _answer_disagrees(
                            source,
                            spec,
                            f"the hub at {source.api_endpoint} sent more than the pinned {spec.size} bytes "
                            f"of {spec.path}",
                        )
                    first = got == 0
                    got += len(chunk)
                    report(sink.feed(chunk))
                    if first:  # the body's first bytes go to the partial file at once: it shows the start
                        report(sink.flush())
            except BaseException:
                report(sink.flush(), quiet=True)  # what arrived before the failure is kept
                raise
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
        if not quiet and _cancelled(cancel):
            raise _Cancelled()

    # opened first, never blocking: a FIFO or a device at the partial's path is named, left as it is
    fd = open_regular(
        part,
        os.O_WRONLY | os.O_CREAT,
        fix=f"remove it (rm {shlex.quote(str(part))}) and re-run: the download of {spec.path} starts over",
    )
    try:
        psize = os.fstat(fd).st_size
        if psize > spec.size:
            log.warning("%s: partial file is longer than the pinned size; starting over", spec.path)
            psize = 0  # the ftruncate below empties it
        if psize == 0:
            hasher, resume = hashlib.sha256(), 0
        elif state.carry is not None and state.carry[0] == psize:
            hasher, resume = state.carry[1].copy(), psize  # this call wrote it: no need to hash it again
        else:
            hasher, resume = hasher_of_prefix(part)
        state.carry = None
        os.ftruncate(fd, resume)
        sink = _BlockSink(fd, resume, hasher)
        try:
            if resume == spec.size and state.resumed_from is None:
                state.resumed_from = resume
            while sink.received < spec.size:
                if _cancelled(cancel):
                    raise _Cancelled()
                before = sink.received
                try:
                    _get_into(source, spec, url, sink, state, report)
                except (_httpx.TimeoutException, _httpx.NetworkError, _httpx.RemoteProtocolError) as e:
                    if _cancelled(cancel):  # the stop shut the connection down: not a loss to resume
                        raise _Cancelled() from e
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
        os.close(fd)
