"""The one crash-safety protocol: temp names with their owner, sweeping, atomic publication, the lock.

* :mod:`.names` -- the temp-name format ``.<final>.<kind>-<pid>-<start>-<host>-<rand>``, its parser
  and the owner-liveness test (pid + start time + host);
* :mod:`.sweep` -- remove the temps of dead owners (one folder, or the whole data root);
* :mod:`.atomic` -- staging folders, ``publish_dir`` (``renameat2`` exchange, with a fallback),
  ``atomic_symlink``, ``atomic_write_bytes/text/json``;
* :mod:`.lock` -- the data root's lock (a build exclusively, or the steps of other runs shared).

Object storage has no rename: its manifest-last protocol is on
:class:`stage2_data.storage.StoreLocation` (``commit`` / ``withdraw`` / ``publish_current``).
"""

from __future__ import annotations

from .atomic import (
    UMASK_MODE,
    atomic_symlink,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    current_umask,
    fsync_dir,
    make_staging_dir,
    publish_dir,
    remove_path,
    rename_exchange,
    staging,
)
from .lock import (
    DataRootInUseError,
    DataRootLockedError,
    data_root_lock,
    holds_data_root_lock,
    lock_path,
    read_holder,
    read_shared_holders,
    run_step_lock,
)
from .names import (
    TempName,
    host_tag,
    is_temp_name,
    owned_name,
    owner_alive,
    parse_temp_name,
    proc_start_time,
    temp_path,
)
from .sweep import data_root_temp_folders, remove_stale, stale_temps, sweep_data_root

__all__ = [
    "UMASK_MODE",
    "DataRootInUseError",
    "DataRootLockedError",
    "TempName",
    "atomic_symlink",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "current_umask",
    "data_root_lock",
    "data_root_temp_folders",
    "fsync_dir",
    "holds_data_root_lock",
    "host_tag",
    "is_temp_name",
    "lock_path",
    "make_staging_dir",
    "owned_name",
    "owner_alive",
    "parse_temp_name",
    "proc_start_time",
    "publish_dir",
    "read_holder",
    "read_shared_holders",
    "remove_path",
    "rename_exchange",
    "remove_stale",
    "run_step_lock",
    "stale_temps",
    "staging",
    "sweep_data_root",
    "temp_path",
]
