"""The data root's lock; it lives in :mod:`stage2_data.publish.lock` (re-exported here for today's callers).

``sweep_temp_dirs`` is :func:`stage2_data.publish.sweep.sweep_data_root`: it removes the temps of
dead owners (and the ownerless legacy ones) anywhere in the data root; call it while holding the lock.
"""

from __future__ import annotations

from .publish.lock import DataRootLockedError, data_root_lock, lock_path, read_holder
from .publish.sweep import sweep_data_root as sweep_temp_dirs

__all__ = ["DataRootLockedError", "data_root_lock", "lock_path", "read_holder", "sweep_temp_dirs"]
