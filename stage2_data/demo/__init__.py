"""The deterministic demo generator: a miniature of the real ``stage2_core_v1`` profile.

It writes, byte-identically on every run and every machine (same Python/zlib/pyarrow family):

- ``<root>/upstream/``: the folder the loopback hub serves as the dataset repository
  ``robometer/processed_datasets``: one uncompressed tar per cache key (RoboArena split into
  ``.tar.part-aa`` / ``.tar.part-ab``, cut inside a member's data), the quarantined LIBERO Goal
  failure tar, and files no profile names (``README.md``, ``some_other_dataset.tar``);
- ``<root>/kit/``: ``profile.toml``, the pair manifest, the subset ``SHA256SUMS``, the action
  manifests, the sidecar tar and its ``.sha256``, in the formats of docs/spec/kit-format.md.

Two modes:

- small (default): ~230 trajectories over 13 cache keys, 60 pairs over 100 unique frame files,
  two frame resolutions (32x32 and 48x64), 3..16 frames a trajectory; a few MB in all.
- full cardinality (``full_cardinality=True``): the exact totals of ``stage2_core_v1`` (13 cache
  dirs, 53,765 trajectories, 2,689 pairs over 4,323 unique frame files, 23,359 action-manifest
  rows, 20,620 sidecars: AutoEval 5,939, LIBERO success 1,709, RoboArena 12,379, RACER 593)
  with tiny payloads (1..3 frames of 4x4 or 4x6 pixels).

Cache keys. The spec names 8 real cache keys (AutoEval, RoboArena, RACER and the 5 LIBERO-256
success sets). The real profile has 13; the other 5 are INVENTED here, in the same style, for
sources without action recovery: ``jesbu1_toto_rfm_toto``, ``jesbu1_soar_rfm_soar``,
``jesbu1_utd_so100_clean_rfm_utd_so100_clean``, ``aliangdw_metaworld_rfm_metaworld_train`` and
``jesbu1_epic_rfm_epic``. Task strings, trajectory counts per cache key and the split of action
rows into recovered / not recovered are invented too (only the totals above are real facts).

Determinism: all randomness comes from ``random.Random(<str seed>)`` (sha512 seeding, stable
across Python versions) and ``hashlib.shake_128`` (pixel noise, action values). Tars are GNU
format with sorted members, fixed mtime, uid/gid 0, empty uname/gname and fixed modes. ``.npz``
files are written like ``numpy.savez_compressed`` but with a fixed zip timestamp
(1980-01-01 00:00:00) and a fixed ``create_system``. The deflate streams come from zlib; a
different zlib build (e.g. zlib-ng) could compress differently; all digests are computed from
what was written, so the demo stays self-consistent in any case.

Modules: ``spec`` (what the demo contains), ``plan`` (every trajectory, pair and action row),
``content`` (file bytes; ``.npz`` through ``stage2_data.formats.npz``), ``tars`` (deterministic
tars), ``archives`` (tar members), ``generator`` (the folder, the kit, the profile, the marker);
``hubserver`` is the loopback hub that serves ``upstream/`` (a test double, imported on its own).
"""

from __future__ import annotations

from .generator import DemoPaths, demo_hub_folder, generate_demo, main, repin_profile, write_sidecar_sha256
from .spec import (
    ACTION_SOURCES,
    CACHE_KEYS,
    GENERATOR_VERSION,
    MARKER_NAME,
    QUARANTINED_ARCHIVE,
    REPO_ID,
    SPLIT_CACHE_KEY,
    ActionSourceSpec,
    CacheKeySpec,
)

__all__ = [
    "DemoPaths",
    "demo_hub_folder",
    "generate_demo",
    "repin_profile",
    "write_sidecar_sha256",
    "main",
    "GENERATOR_VERSION",
    "MARKER_NAME",
    "REPO_ID",
    "CACHE_KEYS",
    "ACTION_SOURCES",
    "ActionSourceSpec",
    "CacheKeySpec",
    "QUARANTINED_ARCHIVE",
    "SPLIT_CACHE_KEY",
]
