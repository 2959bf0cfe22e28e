"""Partitions come from the profile: one per cache key (a cache directory: its archive parts, its
extraction). ``archive_file`` and ``cache_dir`` share them, so a partition's whole chain can run in
one run, and the store can be built per cache directory and merged (docs/spec/vin-store.md)."""

from __future__ import annotations

import dagster as dg

from stage2_data.profile import Profile


def cache_key_partitions(profile: Profile) -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition(profile.cache_keys())
