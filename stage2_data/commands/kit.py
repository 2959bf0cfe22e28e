"""verify: the kit's link check (and byte-level check) on data already on disk; no download, no Dagster."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ProfileError, Stage2Error
from ..fsutil import human_bytes
from .common import (
    EXIT_FAILED,
    KIT_ROOT_LEFT_OUT,
    add_profile,
    count_of,
    finish_command,
    print_json,
    require_folder_option,
)


def verify(
    profile_path: str | Path,
    data_root: str | Path,
    *,
    kit_root: str | Path | None = None,
    check_bytes: bool = False,
    workers: int | None = None,
) -> dict[str, Any]:
    """Run the link check (and, with ``check_bytes``, the byte check against SHA256SUMS) and return
    the report: ``ok``, ``totals`` and ``sidecars_by_source`` (name, found, expected, ok),
    ``problems`` (every one, naming file:line and id), ``link`` and ``bytes`` details."""
    from ..kit import LINK_TOTALS, link_check, verify_subset_bytes
    from ..profile import load_profile
    from ..steps.kit import byte_problems

    require_folder_option("--kit-root", kit_root, ProfileError, KIT_ROOT_LEFT_OUT)  # as `stage2 build` does
    profile = load_profile(profile_path, kit_root=kit_root)
    # a kit root holding none of the kit's files (a wrong --kit-root, or a profile away from its kit:
    # by default the kit root is the profile's own folder), or a kit file missing: refused as
    # `stage2 build` refuses it, not reported as every total mismatching
    profile.require_kit_found()
    root = Path(data_root).resolve()
    if not root.is_dir():
        raise Stage2Error(
            f"data root {root} does not exist or is not a folder.",
            fix="pass the --data-root that `stage2 build` filled (it holds processed_datasets/ and derived/)",
        )
    link = link_check(profile, root)
    e = profile.expected
    totals = [
        {
            "name": n,
            "found": getattr(link, n),
            "expected": getattr(e, n),
            "ok": getattr(link, n) == getattr(e, n),
        }
        for n in LINK_TOTALS
    ]
    by_source = []
    for source in sorted(set(e.sidecars_by_source) | set(link.sidecars_by_source)):
        found = link.sidecars_by_source.get(source, 0)
        want = e.sidecars_by_source.get(source, 0) if e.sidecars_by_source else None
        by_source.append(
            {"source": source, "found": found, "expected": want, "ok": want is None or want == found}
        )
    problems = list(link.problems)
    byte_part: dict[str, Any] | None = None
    if check_bytes:
        rep = verify_subset_bytes(profile, root, workers=workers)
        unlisted = [d for d in rep.details if "is used by a pair but not listed in" in d]
        # a damaged extracted file clears its extraction record (the next build extracts it again)
        problems += [p for p in byte_problems(profile, root, rep) + unlisted if p not in problems]
        byte_part = {
            "ok": rep.ok,
            "files": rep.files,
            "bytes": rep.bytes,
            "matched": rep.matched,
            "mismatched": len(rep.mismatched),
            "missing": len(rep.missing),
            "unlisted": len(rep.unlisted),
            "seconds": round(rep.seconds, 3),
            "mb_per_s": round(rep.bytes / 1e6 / rep.seconds, 1) if rep.seconds > 0 else None,
        }
    ok = (
        not problems
        and all(t["ok"] for t in totals)
        and all(s["ok"] for s in by_source)
        and (byte_part is None or byte_part["ok"])
    )
    return {
        "ok": ok,
        "profile": profile.name,
        "profile_path": str(profile.profile_path),
        "kit_root": str(profile.kit_root),
        "data_root": str(root),
        "totals": totals,
        "sidecars_by_source": by_source,
        "link": {
            "seconds": round(link.seconds, 3),
            "fs_seconds": round(link.fs_seconds, 3),
            "missing_frames": link.missing_frames,
            "missing_sidecars": link.missing_sidecars,
        },
        "bytes": byte_part,
        "problems": problems,
    }


def _table(header: tuple[str, str, str, str], rows: list[tuple[str, Any, Any, bool]]) -> list[str]:
    width = max(len(header[0]), *(len(r[0]) for r in rows)) if rows else len(header[0])
    out = [f"{header[0]:<{width}}  {header[1]:>8}  {header[2]:>8}  {header[3]}"]
    for name, found, want, ok in rows:
        exp = "-" if want is None else want
        out.append(f"{name:<{width}}  {found:>8}  {exp:>8}  {'ok' if ok else 'MISMATCH'}")
    return out


def print_report(r: dict[str, Any]) -> None:
    print(f"profile:    {r['profile']} ({r['profile_path']})")
    print(f"kit root:   {r['kit_root']}")
    print(f"data root:  {r['data_root']}")
    print()
    for line in _table(
        ("total", "found", "expected", "ok"),
        [(t["name"], t["found"], t["expected"], t["ok"]) for t in r["totals"]],
    ):
        print(line)
    if r["sidecars_by_source"]:
        print()
        for line in _table(
            ("sidecars by source", "found", "expected", "ok"),
            [(s["source"], s["found"], s["expected"], s["ok"]) for s in r["sidecars_by_source"]],
        ):
            print(line)
    lk = r["link"]
    print()
    print(
        f"link check: {lk['seconds']} s; {lk['missing_frames']} frames file(s) missing, "
        f"{lk['missing_sidecars']} sidecar(s) missing"
    )
    b = r["bytes"]
    if b is not None:
        print(
            f"byte check: {b['files']} files, {human_bytes(b['bytes'])}, {b['matched']} matched, {b['mismatched']} "
            f"mismatched, {b['missing']} missing, {b['unlisted']} unlisted; {b['seconds']} s ({b['mb_per_s']} MB/s)"
        )
    else:
        print("byte check: not run (add --bytes)")
    if r["problems"]:
        print(f"problems ({len(r['problems'])}):")
        for p in r["problems"]:
            print(f"  - {p}")
    print("VERIFIED" if r["ok"] else "FAILED")


def cmd_verify(args: argparse.Namespace) -> int:
    report = verify(
        args.profile, args.data_root, kit_root=args.kit_root, check_bytes=args.bytes, workers=args.workers
    )
    if args.json:
        print_json(report)
    else:
        print_report(report)
    return 0 if report["ok"] else EXIT_FAILED


def register(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check the kit against data already on disk: link check, and byte check with --bytes",
        description="Run the kit's link check on an existing data root (no download, no Dagster): every pair's "
        "frames file and every recovered row's sidecar must exist, the manifests must be well formed, and the "
        "four totals (pair rows, unique frame files, action-manifest rows, resolved sidecars) and the sidecars "
        "per source must equal the profile's [expected] table. With --bytes, every file of the kit's "
        "SHA256SUMS is also hashed (in parallel) and compared. Every problem is printed with its file, line "
        "and id. Exit 0 when everything matches, 1 on any mismatch or problem, 2 when the check cannot run.",
        epilog="Example: stage2 verify .demo/demo/kit/profile.toml --data-root .demo/data --bytes\n"
        "         stage2 verify manifests/stage2_core_v1.toml --kit-root /path/to/kit --data-root /data/stage2 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_profile(p)
    p.add_argument(
        "--data-root", required=True, help="the data root a build filled (processed_datasets/, derived/)"
    )
    p.add_argument("--kit-root", help="kit root (default: the folder holding the profile)")
    p.add_argument("--bytes", action="store_true", help="also hash every SHA256SUMS file and compare")
    p.add_argument(
        "--workers",
        type=count_of("a number of hashing threads"),
        default=None,
        help="hashing threads for --bytes (default: one per core)",
    )
    finish_command(p, cmd_verify, json_help="print one JSON object instead of the table")
