"""The core's commands: one module per group, each with ``register(subparsers)``; add a module here
to add commands. They need only the core install (no Dagster).

Commands that need an extra (``build``, ``demo``: the Dagster layer) are plugins: each is an entry
point of the ``stage2.commands`` group (pyproject.toml) naming its ``register(subparsers)``; the
CLI (``stage2_data/cli.py``) loads them, or says what to install when their extra is missing.
"""

from __future__ import annotations

from types import ModuleType


def command_modules() -> list[ModuleType]:
    """The core's command modules, in the order they are listed. Imported when the parser is built,
    not with this package."""
    from . import acquire, hub, kit, preview, store

    return [hub, store, preview, kit, acquire]
