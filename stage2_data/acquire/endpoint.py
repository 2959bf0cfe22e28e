"""Which hub a build talks to and whether it may talk at all, as the environment says now: the
endpoint (``--endpoint``, else ``HF_ENDPOINT``, else the real hub) and offline mode
(``HF_HUB_OFFLINE``). No client import: a build with nothing to download (a no-op rebuild) asks
these and never imports ``huggingface_hub`` (a slow import, with its HTTP stack).
"""

from __future__ import annotations

import os
import shlex
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


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def pin_check_command(where: str, endpoint: str, hub_folder: str | None = None) -> str:
    """The ``stage2 pin <where> ... --check`` that asks the hub at ``endpoint``, in backquotes, as
    pasted in a shell (every path quoted). The real hub: no ``--endpoint``; another (lasting)
    endpoint: with it. A loopback hub is served for a build's runs only (``--hub-folder``; its port
    is gone once the build ends): ``--hub-folder`` with the folder it served (``hub_folder``, the
    source's), else with ``DIR`` and what it stands for."""
    from urllib.parse import urlsplit

    profile = where if where == "<profile>" else shlex.quote(where)
    if urlsplit(endpoint).hostname in _LOOPBACK:
        if hub_folder:
            return f"`stage2 pin {profile} --hub-folder {shlex.quote(hub_folder)} --check`"
        return (
            f"`stage2 pin {profile} --hub-folder DIR --check`, DIR being the folder served as the hub "
            f"at {endpoint} (the build's --hub-folder)"
        )
    option = "" if endpoint == DEFAULT_ENDPOINT else f" --endpoint {shlex.quote(endpoint)}"
    return f"`stage2 pin {profile}{option} --check`"
