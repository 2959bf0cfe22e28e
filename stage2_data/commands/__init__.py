"""One module per command group; each has ``register(subparsers)``. Add a module here to add commands."""

from __future__ import annotations

from . import acquire, build, kit, store

COMMAND_MODULES = [build, store, kit, acquire]
