"""build, demo, serve-hub: run the asset graph (these import Dagster, lazily)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_FAILED, eprint, print_json


# ----- build -------------------------------------------------------------------------------------
def _run_line(r: dict[str, Any]) -> None:
    what = ",".join(r["selection"]) + (f"[{r['partition']}]" if r["partition"] else "")
    status = "ok" if r["success"] else "FAILED"
    eprint(f"  run {r['run_id'][:8]} {what}: {status}")
    for c in r["checks"]:
        if not c["passed"]:
            eprint(f"    check {c['asset']}:{c['check']} failed: {c['description']}")
    for e in r["errors"]:
        eprint(f"    error in {e['step']}: {e['message'].splitlines()[0] if e['message'] else ''}")


def cmd_build(args: argparse.Namespace) -> int:
    from pipelines.config import BuildConfig
    from pipelines.runner import build_all

    from ..profile import load_profile

    load_profile(args.profile, kit_root=args.kit_root)  # fail fast, before any run, on a bad profile
    config = BuildConfig(
        profile_path=str(Path(args.profile).resolve()),
        data_root=str(Path(args.data_root).resolve()),
        endpoint=args.endpoint,
        kit_root=str(Path(args.kit_root).resolve()) if args.kit_root else None,
        hub_folder=str(Path(args.hub_folder).resolve()) if args.hub_folder else None,
        token_env_var=args.token_env,
        reverify=args.reverify,
    )
    summary = build_all(config, concurrency=args.concurrency, on_run=None if args.json else _run_line)
    if args.json:
        print_json(summary)
    else:
        print_build_summary(summary)
    return 0 if summary["ok"] else EXIT_FAILED


def print_build_summary(s: dict[str, Any]) -> None:
    checks = s["checks"]
    passed = sum(c["passed"] for c in checks)
    print(f"profile:      {s['profile']}")
    print(f"data root:    {s['data_root']}")
    print(f"runs:         {len(s['runs'])} (Dagster instance at {s['dagster_home']})")
    print(f"checks:       {passed}/{len(checks)} passed")
    if s["ok"]:
        print(f"store:        {s['store']}")
        print(f"fingerprint:  {s['fingerprint']}")
        _print_store_counts(s["store"])
    else:
        print("BUILD FAILED" + (f" (stopped after {s['stopped_after']})" if s.get("stopped_after") else ""))
        for c in checks:
            if not c["passed"]:
                part = f"[{c['partition']}]" if c.get("partition") else ""
                print(f"  failed check {c['asset']}{part}:{c['check']}: {c['description']}")
        for e in s["errors"]:
            part = f"[{e['partition']}]" if e.get("partition") else ""
            print(f"  error {e['step']}{part}: {e['message']}")
    print(f"UI:           DAGSTER_HOME={s['dagster_home']} make ui   (then open http://127.0.0.1:3000)")


def _print_store_counts(store: str | None) -> None:
    if not store:
        return
    try:
        from ..store import collect_vin_offline_dataset_stats

        st = collect_vin_offline_dataset_stats(Path(store))
    except Exception:  # summary is best effort; the checks already passed
        return
    print(f"samples:      {st.get('samples')}  pairs: {st.get('pairs')}  per split: {st.get('per_split')}")


# ----- demo and hub ------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.config import BuildConfig
    from pipelines.runner import build_all

    from ..demo import generate_demo
    from ..hubserver import HubServer

    out = Path(args.out).resolve()
    demo = generate_demo(out / "demo", full_cardinality=args.full_cardinality)
    eprint(f"demo generated at {demo.root} (profile {demo.profile})")
    data_root = Path(args.data_root).resolve() if args.data_root else out / "data"
    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as server:
        eprint(f"loopback hub serving {demo.upstream} at {server.url}")
        config = BuildConfig(profile_path=str(demo.profile), data_root=str(data_root), endpoint=server.url)
        summary = build_all(config, on_run=None if args.json else _run_line)
    if args.json:
        print_json(summary)
    else:
        print_build_summary(summary)
    return 0 if summary["ok"] else EXIT_FAILED


def cmd_serve_hub(args: argparse.Namespace) -> int:
    import signal
    import threading

    from ..hubserver import HubServer

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with HubServer(Path(args.folder), repo_id=args.repo_id, revision=args.revision, port=args.port) as server:
        print(server.url, flush=True)
        stop.wait()
    return 0


def _add_build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="profile .toml (see manifests/)")
    p.add_argument("--data-root", required=True, help="where archives, extracted data and the store go")
    p.add_argument("--kit-root", help="kit root (default: the folder holding the profile)")
    p.add_argument(
        "--endpoint", default="https://huggingface.co", help="hub endpoint (default: the real hub)"
    )
    p.add_argument(
        "--hub-folder", help="serve this local folder on loopback as the hub instead of --endpoint"
    )
    p.add_argument("--token-env", default="HF_TOKEN", help="environment variable holding the hub token")
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="archives downloaded at once (default: sized for the machine)",
    )
    p.add_argument("--reverify", action="store_true", help="re-hash archives already verified")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "build",
        help="materialize every asset and partition (download, extract, verify, join, store)",
        description="Materialize every asset and every partition through Dagster (runs recorded in DAGSTER_HOME, "
        "default <data-root>/.dagster). Exit 0 only when every asset materialized and every check passed.",
        epilog="Example: stage2 build --profile .demo/demo/kit/profile.toml --data-root .demo/data "
        "--endpoint http://127.0.0.1:8765 --json",
    )
    _add_build_args(p)
    p.set_defaults(func=cmd_build)
    p = sub.add_parser(
        "demo",
        help="generate the embedded demo, serve it on a loopback hub, and build it",
        epilog="Example: stage2 demo --out .demo",
    )
    p.add_argument("--out", default=".demo", help="folder for the demo and its data root (default .demo)")
    p.add_argument("--data-root", help="data root (default OUT/data)")
    p.add_argument(
        "--full-cardinality", action="store_true", help="the real profile's counts with tiny payloads"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser(
        "serve-hub",
        help="serve a folder as a dataset repo over the hub's HTTP protocol on 127.0.0.1",
        epilog="Example: stage2 serve-hub .demo/demo/upstream --repo-id robometer/processed_datasets --revision <40-hex>",
    )
    p.add_argument("folder")
    p.add_argument("--repo-id", required=True)
    p.add_argument("--revision", required=True)
    p.add_argument("--port", type=int, default=0)
    p.set_defaults(func=cmd_serve_hub)
