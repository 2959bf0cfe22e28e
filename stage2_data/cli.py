"""The ``stage2`` command. Expected failures print one line (what is wrong, and the fix) and exit non-zero.

The core's commands live in ``stage2_data/commands/``, one module per group, each with
``register(subparsers)``; they need only the core install. Commands that need an extra are plugins:
entry points of the ``stage2.commands`` group, one per command, each naming its
``register(subparsers)`` (``build`` and ``demo`` come from the Dagster layer,
``stage2_pipelines.commands``). A plugin whose extra is missing is still listed: running it prints
one line saying what to install, and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

from .commands import COMMAND_MODULES
from .commands.common import EXIT_ERROR, eprint
from .errors import Stage2Error

PLUGIN_GROUP = "stage2.commands"
PLUGIN_INSTALL = "pip install 'stage2-data[pipeline]'"  # the extra that provides the plugins


def _missing_extra(name: str, err: ModuleNotFoundError) -> Callable[[Any], None]:
    """A stand-in for plugin command ``name`` whose module did not import: it takes any arguments
    and says what to install."""

    def run(args: argparse.Namespace) -> int:
        eprint(f"stage2 {name}: not installed ({err}); install it with: {PLUGIN_INSTALL}")
        return EXIT_ERROR

    def register(sub: Any) -> None:
        p = sub.add_parser(
            name,
            help=f"(not installed: {PLUGIN_INSTALL})",
            epilog=f"Example: {PLUGIN_INSTALL} && stage2 {name} --help",
            add_help=False,
        )
        p.set_defaults(func=run, any_arguments=True)

    return register


def plugin_commands() -> list[Callable[[Any], None]]:
    """The ``register`` functions of the plugin commands, by name."""
    out = []
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            out.append(ep.load())
        except ModuleNotFoundError as err:
            out.append(_missing_extra(ep.name, err))
    return out


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stage2",
        description="Turn a pinned profile of a Hugging Face dataset into a verified, immutable Zarr v3 training store.",
        epilog="Example: stage2 build --profile manifests/stage2_core_v1.toml --data-root /data/stage2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in [*plugin_commands(), *(m.register for m in COMMAND_MODULES)]:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except Stage2Error as err:
        eprint(f"stage2 {args.command}: error: {err}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        eprint("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
