"""stage2-data: a pinned robot-learning data selection turned into a verified, immutable training store.

This package is the Dagster-free library. Training code imports the store reader from here
(``from stage2_data.store import VinOfflineDataset``) without importing Dagster.
"""

__version__ = "0.1.0"
