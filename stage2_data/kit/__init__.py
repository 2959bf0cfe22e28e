"""The kit: sidecar unpacking, manifest parsing, the join by trajectory id, link check, byte check.

See docs/spec/kit-format.md. Everything here joins by trajectory id (``stage2_trajectory_id``),
never by row order. Validation gathers every problem (naming file, line and id) and returns them;
callers that want an exception use :func:`raise_for_problems`.

Modules: :mod:`.manifests` (the pair and action manifests: rows and their one rule set),
:mod:`.sidecars` (the sidecar tar, one sidecar npz), :mod:`.join` (the trajectory join table),
:mod:`.link` (the link check), :mod:`.subset_bytes` (the byte check).
"""

from __future__ import annotations

from .join import JOIN_SCHEMA, PROCESSED_COLUMNS, JoinResult, build_join_table, read_join_rows
from .link import LINK_TOTALS, LinkReport, link_check
from .manifests import (
    ACTION_FIELDS,
    ACTION_OPTIONAL,
    ACTION_REQUIRED,
    PAIR_FIELDS,
    RECOVERED,
    ActionRow,
    PairRow,
    load_action_manifests,
    load_pairs,
)
from .problems import raise_for_problems
from .sidecar_facts import SIDECAR_INDEX, SIDECAR_KEYS, SIDECAR_MARKER, recorded_sidecars
from .sidecars import SidecarUnpackResult, sidecars_status, unpack_sidecars
from .subset_bytes import ByteReport, verify_subset_bytes

__all__ = [
    "PAIR_FIELDS",
    "ACTION_FIELDS",
    "ACTION_REQUIRED",
    "ACTION_OPTIONAL",
    "RECOVERED",
    "SIDECAR_MARKER",
    "SIDECAR_INDEX",
    "SIDECAR_KEYS",
    "PROCESSED_COLUMNS",
    "PairRow",
    "ActionRow",
    "SidecarUnpackResult",
    "JoinResult",
    "LINK_TOTALS",
    "LinkReport",
    "ByteReport",
    "load_pairs",
    "load_action_manifests",
    "recorded_sidecars",
    "sidecars_status",
    "unpack_sidecars",
    "build_join_table",
    "read_join_rows",
    "link_check",
    "verify_subset_bytes",
    "raise_for_problems",
    "JOIN_SCHEMA",
]
