"""Profiles for hand-made kits, shared by the benchmarks and the tests.

The tests import it as they import ``bench.run`` (tests/test_readme.py); nothing in ``bench``
imports the tests. ``profile_data`` returns the plain mapping that ``parse_profile`` reads (see
docs/spec/profile.md), so a test can still edit it before parsing.
"""

from __future__ import annotations

from typing import Any

from stage2_data.profile import EXPECTED_TOTALS

KIT_PATHS = {
    "pair_manifest": "manifests/pairs.jsonl",
    "subset_checksums": "manifests/SHA256SUMS",
    "action_manifest_dir": "derived/action_manifests",
    "sidecar_archive": "derived/sidecars.tar",
    "sidecar_archive_sha256": "derived/sidecars.tar.sha256",
}
"""Where a hand-made kit keeps its files (the profile's ``[kit]`` table)."""


def profile_data(
    name: str,
    source: dict[str, Any],
    archives: list[dict[str, Any]],
    *,
    kit: dict[str, str] | None = None,
    expected: dict[str, Any] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """A profile mapping: ``kit`` defaults to :data:`KIT_PATHS`; ``expected`` names the totals that
    are not 0 (and any optional key such as ``sidecars_by_source``); ``more`` adds top-level keys
    (``quarantined``)."""
    return {
        "name": name,
        "source": source,
        "kit": dict(KIT_PATHS if kit is None else kit),
        "archives": archives,
        "expected": {**dict.fromkeys(EXPECTED_TOTALS, 0), **(expected or {})},
        **more,
    }
