"""Where a store lives: a local folder or an object-storage prefix (any fsspec URL, e.g. ``s3://``).

:class:`StoreLocation` gives the store module the few operations it needs, on both backends, as a
class hierarchy (``StoreLocation.parse`` picks the backend):

* :class:`LocalLocation` (``_local.py``): ``root`` is the absolute folder;
* :class:`FsspecLocation` (``_fsspec.py``): ``root`` is ``bucket/prefix`` (the fsspec path, without
  the scheme), so ``root / rel`` works the same way; :meth:`StoreLocation.display` names a file for
  messages (``s3://...``).

Operations: read whole / a byte range / size / exists / list / hash, write bytes (local: temp +
rename; object storage: one PUT, atomic per object), upload a local file, copy verified, delete a
tree, :meth:`StoreLocation.zarr_store` (zarr's ``LocalStore`` or ``FsspecStore`` over a folder), and
the commit protocol: :meth:`~StoreLocation.commit` (the manifest, LAST),
:meth:`~StoreLocation.withdraw` (un-commit, then delete), :meth:`~StoreLocation.publish_current` /
:meth:`~StoreLocation.current` (the ``current`` symlink locally, the ``CURRENT`` object remotely).
"""

from __future__ import annotations

from ._base import (
    CURRENT_OBJECT,
    MANIFEST_NAME,
    MOVED_FILE,
    QUARANTINE_DIR,
    StoreLocation,
    check_stores_target,
    check_stores_url,
    is_url,
    join_url,
    normal_url,
    unusable_store_url,
)
from ._fsspec import (
    FsspecLocation,
    StorageAccessError,
    access_error,
    current_candidates,
    current_error,
    option_args,
)
from ._local import LocalLocation

__all__ = [
    "CURRENT_OBJECT",
    "MANIFEST_NAME",
    "MOVED_FILE",
    "QUARANTINE_DIR",
    "FsspecLocation",
    "LocalLocation",
    "StorageAccessError",
    "StoreLocation",
    "access_error",
    "check_stores_target",
    "check_stores_url",
    "normal_url",
    "unusable_store_url",
    "current_candidates",
    "current_error",
    "is_url",
    "join_url",
    "option_args",
]
