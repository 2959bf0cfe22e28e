"""serve-hub: serve a folder as a dataset repo over the hub's HTTP protocol on 127.0.0.1."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import count_of


def cmd_serve_hub(args: argparse.Namespace) -> int:
    from ..demo.hubserver import HubServer, served_as

    repo_id, revision = served_as(args.folder, repo_id=args.repo_id, revision=args.revision)
    HubServer(Path(args.folder), repo_id=repo_id, revision=revision, port=args.port).serve_until_signal()
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve-hub",
        help="serve a folder as a dataset repo over the hub's HTTP protocol on 127.0.0.1",
        description="Serve FOLDER as one Hugging Face dataset repository at one commit, over the hub's HTTP "
        "protocol on 127.0.0.1, until interrupted (Ctrl-C or SIGTERM); the URL to pass as --endpoint (to "
        "`stage2 build`, `pin`, `list`) is printed on one line.",
        epilog="Example: stage2 serve-hub .demo/demo/upstream (the demo's repository and commit, as its .stage2-hub.json declares; --repo-id and --revision serve a folder that declares none)",
    )
    p.add_argument("folder", help="the folder whose files are served as the repository's files")
    p.add_argument(
        "--repo-id",
        default=None,
        help="the repository it is served as (e.g. robometer/processed_datasets); default: the one the "
        "folder's .stage2-hub.json declares",
    )
    p.add_argument(
        "--revision",
        default=None,
        help="the full 40-hex commit it is served at (the profile's [source] revision); default: the one "
        "the folder's .stage2-hub.json declares, else a digest of its files",
    )
    p.add_argument(
        "--port",
        type=count_of("a TCP port", minimum=0, maximum=65535),
        default=0,
        help="the port to listen on on 127.0.0.1; 0 (default): any free port",
    )
    p.set_defaults(func=cmd_serve_hub)
