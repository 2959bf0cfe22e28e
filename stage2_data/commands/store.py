"""validate, summary, merge: read-only and derived operations on a VIN offline store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ._common import EXIT_FAILED, print_json


# ----- store commands ----------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from ..store import VinOfflineStoreReader, validate_vin_offline_store

    VinOfflineStoreReader(Path(args.store))  # strict open: version / missing manifest raise with the fix
    problems = validate_vin_offline_store(Path(args.store), deep=args.deep)
    if args.json:
        print_json({"store": args.store, "deep": args.deep, "ok": not problems, "problems": problems})
    elif problems:
        print(f"store {args.store} is INVALID: {len(problems)} problem(s)")
        for p in problems:
            print(f"  - {p}")
    else:
        print(f"store {args.store} is valid" + (" (deep: every file re-hashed)" if args.deep else ""))
    return 0 if not problems else EXIT_FAILED


def cmd_summary(args: argparse.Namespace) -> int:
    from ..store import VinOfflineStoreReader, collect_vin_offline_dataset_stats

    VinOfflineStoreReader(Path(args.store))
    stats = collect_vin_offline_dataset_stats(Path(args.store))
    if args.json:
        print_json(stats)
    else:
        for k, v in stats.items():
            print(f"{k}: {json.dumps(v, sort_keys=True, default=str) if isinstance(v, dict | list) else v}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "validate",
        help="strict, read-only validation of a store",
        description="Open the store with the strict reader and validate manifest, shards, splits, pairs.",
        epilog="Example: stage2 validate .demo/data/stores/stage2_core_v1_demo/current --deep",
    )
    p.add_argument("store")
    p.add_argument("--deep", action="store_true", help="re-hash every file against the manifest")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser(
        "summary",
        help="counts per split and source, pairs, bytes of a store",
        epilog="Example: stage2 summary .demo/data/stores/stage2_core_v1_demo/current --json",
    )
    p.add_argument("store")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_summary)
