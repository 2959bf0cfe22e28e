"""The ``stage2`` command. Expected failures print one line (what is wrong, and the fix) and exit non-zero.

Commands live in ``stage2_data/commands/``, one module per group, each with ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from .commands import COMMAND_MODULES
from .commands._common import EXIT_ERROR, eprint
from .errors import Stage2Error


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stage2",
        description="Turn a pinned profile of a Hugging Face dataset into a verified, immutable Zarr v3 training store.",
        epilog="Example: stage2 build --profile manifests/stage2_core_v1.toml --data-root /data/stage2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
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
