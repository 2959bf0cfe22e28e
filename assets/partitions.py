"""Partitions come from the profile: one per archive file, one per cache key."""

from __future__ import annotations

import dagster as dg

from stage2_data.profile import Profile


def archive_partitions(profile: Profile) -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition(profile.archive_paths())


def cache_key_partitions(profile: Profile) -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition(profile.cache_keys())


def archive_to_cache_key(profile: Profile) -> dg.StaticPartitionMapping:
    """Split parts of one tar map to the one cache key they feed."""
    return dg.StaticPartitionMapping({a.path: a.cache_key for a in profile.archives})
