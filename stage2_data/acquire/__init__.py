"""Pinned, verified, resumable downloads through the real ``huggingface_hub`` client.

- :mod:`.hub`: the pinned source (``HubSource``), the environment (``HF_ENDPOINT``,
  ``HF_HUB_OFFLINE``), client errors mapped to a ``HubError`` that names the repo, revision,
  endpoint and fix;
- :mod:`.retry`: the one retry policy of every request (backoff, ``Retry-After`` bounded);
- :mod:`.listing`: the hub's listing at the pinned revision and the revision check;
- :mod:`.transport`: one archive's bytes into ``archives/.partial/<path>.part`` (GET, resume with
  ``Range``, retries with backoff, the client's streaming reads);
- :mod:`.sink`: the received buffers written and hashed at once;
- :mod:`.state`: where an archive stands locally (its ``.verified.json`` record) and the free disk
  the rest of the build needs;
- :mod:`.download`: verify and publish one archive, several at once, or a whole profile;
- :mod:`.pin`: fill a profile's sizes and sha256 from the hub's listing.

The token is never logged, never put in an exception message, a repr or a record.
"""

from __future__ import annotations

from .cancel import cancel_downloads
from .download import (
    DownloadResult,
    DownloadsFailedError,
    default_workers,
    download_archive,
    download_archives,
    download_profile,
    offline_error,
)
from .endpoint import DEFAULT_ENDPOINT, hub_offline, resolve_endpoint
from .hub import HubOfflineError, HubSource, RemoteFile
from .listing import check_revision, closest_files, list_remote_files
from .pin import PinError, pin_profile
from .retry import (
    DEFAULT_ATTEMPTS,
    DEFAULT_BACKOFF,
    MAX_RETRY_AFTER,
    RetryAfterTooLongError,
    RetryPolicy,
    parse_retry_after,
    with_retries,
)
from .state import (
    EXTRACTION_FACTOR,
    ArchiveState,
    archive_state,
    hashed_by_this_build,
    record_origin,
    remaining_download_bytes,
    require_build_space,
    required_free_bytes,
    required_free_parts,
    source_origin,
    verified_sha256s,
)
from .transport import DownloadCancelled

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_BACKOFF",
    "DEFAULT_ENDPOINT",
    "EXTRACTION_FACTOR",
    "MAX_RETRY_AFTER",
    "HubOfflineError",
    "RetryAfterTooLongError",
    "RetryPolicy",
    "closest_files",
    "hashed_by_this_build",
    "hub_offline",
    "offline_error",
    "parse_retry_after",
    "resolve_endpoint",
    "with_retries",
    "ArchiveState",
    "DownloadCancelled",
    "cancel_downloads",
    "DownloadResult",
    "DownloadsFailedError",
    "HubSource",
    "PinError",
    "RemoteFile",
    "archive_state",
    "record_origin",
    "source_origin",
    "check_revision",
    "default_workers",
    "download_archive",
    "download_archives",
    "download_profile",
    "list_remote_files",
    "pin_profile",
    "remaining_download_bytes",
    "require_build_space",
    "required_free_bytes",
    "required_free_parts",
    "verified_sha256s",
]
