"""The core's commands: one module per group, each with ``register(subparsers)``; add a module here
to add commands. They need only the core install (no Dagster).

Commands that need an extra (``build``, ``demo``: the Dagster layer) are plugins: each is an entry
point of the ``stage2.commands`` group (pyproject.toml) naming its ``register(subparsers)``; the
CLI (``stage2_data/cli.py``) loads them, or says what to install when their extra is missing.
"""

from __future__ import annotations

from . import acquire, hub, kit, preview, store

COMMAND_MODULES = [hub, store, preview, kit, acquire]
