"""preview: see a store's frames from the terminal: one PNG with the length histogram and a contact
sheet per source (first / middle / last frame of a few trajectories, task text, quality label)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import finish_command, print_json, storage_options
from .store import STORE_ARG_HELP, STORE_EXAMPLE, _target


def _n(value: str) -> int:
    """``--n`` as an int; its range is checked by the library (PreviewError names the fix)."""
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a number of trajectories (an integer >= 1)"
        ) from None


def preview_document(p: Any, out: Any, data: bytes, reader: Any) -> dict[str, Any]:
    from ..fsutil import human_bytes
    from ..preview import frame_indices

    rows = reader.sample_index
    return {
        "ok": True,
        "out": str(out.absolute()),
        "store": reader.resolved,
        "fingerprint": reader.fingerprint,
        "width": p.image.width,
        "height": p.image.height,
        "bytes": len(data),
        "size": human_bytes(len(data)),
        "samples": len(rows),
        "sources": {
            s.source: {
                "samples": s.total,
                "shown": [
                    {
                        "sample_index": r["sample_index"],
                        "sample_key": r["sample_key"],
                        "task": r.get("task"),
                        "quality_label": r.get("quality_label"),
                        "num_frames": r["num_frames"],
                        "frames": frame_indices(int(r["num_frames"])),
                    }
                    for r in s.samples
                ],
            }
            for s in p.sheets
        },
    }


def cmd_preview(args: argparse.Namespace) -> int:
    from ..preview import resolve_out, store_preview, write_png
    from ..preview.sheet import check_n, check_source
    from ..store import VinOfflineStoreReader

    store = _target(args.store)
    reader = VinOfflineStoreReader(store, storage_options(args, store))
    with reader:
        # every argument is checked before a frame is read or a byte written
        check_n(args.n)
        if args.source is not None:
            check_source(reader.sample_index, args.source, where=f"store {reader.resolved}")
        out = resolve_out(args.out, reader, args.source)
        p = store_preview(reader, args.source, args.n)
        data = p.png()
        write_png(out, data)
        doc = preview_document(p, out, data, reader)
    if args.json:
        print_json(doc)
        return 0
    print(f"wrote {doc['out']} ({doc['width']}x{doc['height']} px, {doc['size']})")
    print(f"store: {doc['store']} ({doc['samples']} samples)")
    width = max([len("source"), *(len(s) for s in doc["sources"])])
    print(f"{'source'.ljust(width)}  shown  samples shown (#index: frames)")
    for src, d in doc["sources"].items():
        shown = ", ".join(f"#{r['sample_index']}: {r['num_frames']}" for r in d["shown"])
        print(f"{src.ljust(width)}  {len(d['shown']):>2}/{d['samples']:<3} {shown}")
    return 0


def cmd_export_rrd(args: argparse.Namespace) -> int:
    from ..preview.rrd import export_rrd
    from ..store import VinOfflineStoreReader

    store = _target(args.store)
    reader = VinOfflineStoreReader(store, storage_options(args, store))
    with reader:
        e = export_rrd(reader, args.sample, args.out)
        store = reader.resolved
    doc = {
        "ok": True,
        "out": str(e.out.absolute()),
        "store": store,
        "sample_index": e.sample_index,
        "sample_key": e.sample_key,
        "num_frames": e.num_frames,
        "action_width": e.action_width,
        "bytes": e.bytes,
    }
    if args.json:
        print_json(doc)
        return 0
    acts = f"{e.action_width} action dimensions" if e.action_width else "no actions"
    print(f"wrote {doc['out']} (sample #{e.sample_index} {e.sample_key}: {e.num_frames} frames, {acts})")
    print(f"open it with: rerun {doc['out']}")
    return 0


# stage2_data.preview's DEFAULT_N and MAX_N, spelled here so that `stage2` starts without importing
# Pillow (tests/test_preview.py checks they agree)
DEFAULT_N = 3
MAX_N = 64


def _out_arg(p: argparse.ArgumentParser, metavar: str, what: str, default: str) -> None:
    p.add_argument(
        "--out",
        default=None,
        metavar=metavar,
        help=f"{what} (an existing folder, or a path ending in / (made if new): the default name inside it); "
        f"default {default}",
    )


def register(sub: Any) -> None:
    p = sub.add_parser(
        "preview",
        help="draw a store's frames: length histogram and a contact sheet per source, as one PNG",
        description="Write one PNG showing the store: the histogram of frames per sample, then for each "
        f"source (or only --source) {DEFAULT_N} of its trajectories (--n, spread evenly over the source; at "
        f"most {MAX_N}), each as its first, middle and last frame, as stored (never flipped), beside its task "
        "text, quality label, length and resolution. Only the trajectories shown are decoded. The same "
        "store always gives the same PNG bytes. Without --out the file is "
        "./stage2-preview-<store>[-<source>].png; its path is printed.",
        epilog=f"Example:\n  stage2 preview {STORE_EXAMPLE}\n"
        f"  stage2 preview {STORE_EXAMPLE} --source racer --n 6 --out racer.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", help=STORE_ARG_HELP)
    p.add_argument(
        "--source", default=None, help="only this source (an unknown one is refused, naming them all)"
    )
    p.add_argument(
        "--n", type=_n, default=DEFAULT_N, metavar="N", help=f"trajectories per source (default {DEFAULT_N})"
    )
    _out_arg(p, "FILE.png", "the PNG to write", "./stage2-preview-<store>[-<source>].png")
    finish_command(
        p, cmd_preview, json_help="print one JSON object (out, size, the samples shown)", storage_option=True
    )

    e = sub.add_parser(
        "export-rrd",
        help="write one trajectory (frames and actions) as a Rerun recording (.rrd)",
        description="Write one sample of the store as a Rerun recording: its frames as stored on a `frame` "
        "timeline, its aligned actions as one scalar series per dimension, its task text and metadata; open "
        "it with `rerun FILE.rrd` (the viewer LeRobot's dataset visualizer uses). Needs the rerun-sdk "
        "package (the 'rerun' extra of stage2-data, or pip install rerun-sdk). Without --out the file is "
        "./stage2-<store>-<sample key>.rrd; its path is printed.",
        epilog=f"Example:\n  stage2 export-rrd {STORE_EXAMPLE} 0\n"
        f"  stage2 export-rrd {STORE_EXAMPLE} <sample key> --out traj.rrd",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument("store", help=STORE_ARG_HELP)
    e.add_argument("sample", help="the sample: its index in the store (0, 1, ...) or its sample key")
    _out_arg(e, "FILE.rrd", "the recording to write", "./stage2-<store>-<sample key>.rrd")
    finish_command(
        e, cmd_export_rrd, json_help="print one JSON object (out, sample, frames, bytes)", storage_option=True
    )
