"""Dagster-free step functions: one per asset of the graph (``stage2_data.stages``).

Each step does the work through the domain packages and returns a :class:`StepResult`: the metadata
worth showing and the outcomes of the checks that guard it. The Dagster assets (``stage2_assets``)
call these and nothing else. One module per stage: ``profile``, ``acquire`` (archives, cache
directories, the extraction report), ``kit`` (sidecars, join, subset bytes), ``store``.
"""

from __future__ import annotations

from .acquire import step_download, step_download_cache_dir, step_extract, step_extraction_report
from .kit import link_totals_problems, step_join, step_sidecars, step_verify_bytes
from .profile import step_profile
from .result import StepResult
from .store import (
    CURRENT_OBJECT,
    current_store,
    step_store,
    store_checks,
    stores_location,
    verify_current_store,
)
from .store_inputs import kit_digest, kit_inputs, store_input_key

__all__ = [
    "CURRENT_OBJECT",
    "StepResult",
    "current_store",
    "kit_digest",
    "kit_inputs",
    "link_totals_problems",
    "step_download",
    "step_download_cache_dir",
    "step_extract",
    "step_extraction_report",
    "step_join",
    "step_profile",
    "step_sidecars",
    "step_store",
    "step_verify_bytes",
    "store_checks",
    "store_input_key",
    "stores_location",
    "verify_current_store",
]
