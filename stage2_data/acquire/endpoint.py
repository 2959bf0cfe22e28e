"""Which hub a build talks to and whether it may talk at all, as the environment says now: the
endpoint (``--endpoint``, else ``HF_ENDPOINT``, else the real hub) and offline mode
(``HF_HUB_OFFLINE``). No client import: a build with nothing to download (a no-op rebuild) asks
these and never imports ``huggingface_hub`` (a slow import, with its HTTP stack).
"""

from __future__ import annotations

import os
import sys

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "on", "yes", "true"}


def resolve_endpoint(explicit: str | None = None) -> str:
    """The endpoint to use: ``explicit`` (``--endpoint``), else ``HF_ENDPOINT`` (read now), else the
    real hub."""
    return (explicit or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set to a true value, now or when the client
    was imported (it reads the environment once, at its import; not imported yet: now is all)."""
    raw = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    constants = sys.modules.get("huggingface_hub.constants")
    return raw.strip().lower() in _TRUE or bool(getattr(constants, "HF_HUB_OFFLINE", False))
