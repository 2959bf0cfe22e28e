"""validate, summary, merge, gc: read-only and derived operations on a VIN offline store, and retention.

Every command opens the store with the strict reader first: a store of another format/version is
refused in one line (found vs expected, and the command that rebuilds it), exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import EXIT_ERROR, EXIT_FAILED, count_of, eprint, finish_command, print_json, storage_options

STORE_EXAMPLE = ".demo/data/stores/stage2_core_v1_demo/current"


def _human(n: Any) -> str:
    """A size for people (``fsutil.human_bytes``, IEC units); ``-`` when there is none."""
    from ..fsutil import human_bytes

    return human_bytes(n) if isinstance(n, int | float) else "-"


def _table(header: list[str], rows: list[list[Any]], right: set[int] | None = None) -> list[str]:
    right = right if right is not None else set(range(1, len(header)))
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    return [fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]]


def _target(value: str) -> Path | str:
    """A store argument: a local folder, or an fsspec URL (``s3://bucket/prefix``) kept as text. A
    ``file://`` URL names a local folder, as ``stage2 build --store-url`` takes it (``file:///x``
    is ``/x``); made a Path whole, its ``//`` would be folded into ``file:/x``."""
    from ..storage import is_url, normal_url, unusable_store_url

    value = normal_url(value)
    if (unusable := unusable_store_url(value)) is not None:
        raise unusable
    if value.startswith("file://"):
        return Path(value[len("file://") :])
    return value if is_url(value) else Path(value)


@contextlib.contextmanager
def _bucket_named(target: Path | str, opts: dict[str, Any] | None) -> Iterator[None]:
    """A target on object storage whose store is not found (nothing there, no such folder) because
    its bucket does not exist is said as that (one request, only when it failed)."""
    from ..errors import StoreError
    from ..storage import FsspecLocation, StorageAccessError, StoreLocation

    try:
        yield
    except StoreError as err:
        if isinstance(target, str) and not isinstance(err, StorageAccessError):
            loc: StoreLocation | None = None
            with contextlib.suppress(StoreError):
                loc = StoreLocation.parse(target, opts)
            if isinstance(loc, FsspecLocation) and (missing := loc.missing_bucket()) is not None:
                raise missing from err
        raise


# ----- validate ------------------------------------------------------------------------------------
def _check_current(store: Path | str, opts: dict[str, Any] | None, command: str) -> None:
    """Refuse a target read through a ``CURRENT`` object that names no store (object storage: a
    name with no complete store under it, ``../x``, ``/etc``, empty) with that named error, before
    the reader would say only that nothing is at ``.../current``."""
    from ..storage import current_error

    if isinstance(store, str) and (err := current_error(store, opts, command=command)) is not None:
        raise err


def _resolved_note(given: Path | str, resolved: str, opts: dict[str, Any] | None) -> str:
    """`` (the store it names: <resolved>)`` when ``given`` (``.../current``, a link, a profile's
    folder on object storage) is not the store folder read; else ``""``."""
    from ..storage import StoreLocation

    return "" if StoreLocation.parse(given, opts).url == resolved else f" (the store it names: {resolved})"


def cmd_validate(args: argparse.Namespace) -> int:
    from ..errors import StoreError
    from ..store import VinOfflineStoreReader, validate_vin_offline_store

    store = _target(args.store)
    opts = storage_options(args, store)
    try:
        with _bucket_named(store, opts):
            _check_current(store, opts, "stage2 validate")
            # strict open: version / missing manifest refused with the fix. ``current`` (a link, or
            # the CURRENT object on object storage) is resolved here once, as every reader resolves
            # it, and the store it names is what is validated (held by the reader's lease meanwhile,
            # locally)
            reader = VinOfflineStoreReader(store, opts)
    except StoreError as err:
        if not args.json:
            raise  # the CLI prints "stage2 validate: error: <what> Fix: <command>" and exits 2
        eprint(f"stage2 validate: error: {err}")
        print_json(
            {
                "store": str(store),
                "deep": args.deep,
                "ok": False,
                "opened": False,
                "error": type(err).__name__,
                "message": err.message,
                "fix": err.fix,
                "problems": [str(err)],
            }
        )
        return EXIT_ERROR
    with reader:
        resolved = reader.location
        problems = validate_vin_offline_store(resolved, deep=args.deep, decode=args.decode)
        fix = _invalid_fix(resolved, reader.manifest) if problems else None
    named = f"{store}{_resolved_note(store, resolved.url, opts)}"
    if args.json:
        print_json(
            {
                "store": str(store),
                "resolved": resolved.url,
                "deep": args.deep,
                "decode": args.decode,
                "ok": not problems,
                "opened": True,
                "problems": problems,
                "fix": fix,
            }
        )
    elif problems:
        print(f"store {named} is INVALID: {len(problems)} problem(s)")
        for p in problems:
            print(f"  - {p}")
        print(f"Fix: {fix}")
    else:
        done = [
            *(["deep: every file re-hashed, fingerprint recomputed"] if args.deep else []),
            *(["decode: every sample decoded against its frames_sha256 and padding"] if args.decode else []),
        ]
        print(f"store {named} is valid" + (f" ({'; '.join(done)})" if done else ""))
    return 0 if not problems else EXIT_FAILED


def _invalid_fix(loc: Any, manifest: dict[str, Any]) -> str:
    """What to do about a store that does not validate: stores are immutable, never repaired in
    place; a build over its data root moves a damaged published store aside and writes it anew."""
    from ..store.manifest import rebuild_command

    return (
        "a store is never repaired in place: if it is a data root's published store, `"
        + rebuild_command(loc, manifest)
        + "` moves it aside (kept) and writes it anew; a copy or a merge's output: make it again from "
        "a store that `stage2 validate --deep` calls valid"
    )


# ----- summary -------------------------------------------------------------------------------------
BYTE_BLOCKS = ("frames", "num_frames", "actions/aligned", "actions/width")


def summary_document(store: Path | str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stats of :func:`collect_vin_offline_dataset_stats` plus a per-block bytes table
    (estimated uncompressed payload, stored uncompressed with padding, on disk)."""
    from ..store import collect_vin_offline_dataset_stats

    st = collect_vin_offline_dataset_stats(store, storage_options)
    b = st["bytes"]
    payload = b.get("payload_uncompressed") or {}
    stored = b.get("stored_uncompressed") or {}
    on_disk = b.get("on_disk") or {}
    per_block = {
        name: {
            "estimated_uncompressed": payload.get(name),
            "stored_uncompressed": stored.get(name),
            "on_disk": on_disk.get(name),
        }
        for name in BYTE_BLOCKS
    }
    per_block["metadata"] = {
        "estimated_uncompressed": None,
        "stored_uncompressed": None,
        "on_disk": int(on_disk.get("group_metadata", 0)) + int(on_disk.get("metadata_files", 0)),
    }
    per_block["total"] = {
        "estimated_uncompressed": payload.get("total"),
        "stored_uncompressed": stored.get("total"),
        "on_disk": on_disk.get("total"),
    }
    return {**st, "bytes_per_block": per_block}


def print_summary(doc: dict[str, Any]) -> None:
    prof = doc.get("profile") or {}
    print(f"store:        {doc['path']}")
    print(f"format:       {doc['format']} v{doc['version']}")
    print(f"profile:      {prof.get('name')} ({prof.get('repo_id')}@{str(prof.get('revision'))[:12]})")
    print(f"fingerprint:  {doc['fingerprint']}")
    fps = doc["frames_per_sample"]
    print(
        f"samples:      {doc['samples']} in {doc['shards']} shards; pairs: {doc['pairs']}; "
        f"with actions: {doc['with_actions']}"
    )
    print(f"frames/sample: min {fps['min']}  mean {fps['mean']:.1f}  max {fps['max']}")
    print(f"resolutions:  {', '.join(f'{k} ({v})' for k, v in doc['resolutions'].items())}")
    print()
    sources = sorted(doc["per_source"])
    splits = ["train", "val", "test"]
    pss = doc["per_split_source"]
    pps = doc.get("pairs_per_split") or {}
    rows = [
        [sp, *[pss.get(sp, {}).get(src, 0) for src in sources], doc["per_split"].get(sp, 0), pps.get(sp, 0)]
        for sp in splits
    ]
    rows.append(["total", *[doc["per_source"][src] for src in sources], doc["samples"], doc["pairs"]])
    for line in _table(["split", *sources, "samples", "pairs"], rows):
        print(line)
    print()
    brows = [
        [name, _human(v["estimated_uncompressed"]), _human(v["stored_uncompressed"]), _human(v["on_disk"])]
        for name, v in doc["bytes_per_block"].items()
    ]
    for line in _table(["block", "estimated (payload)", "stored (padded)", "on disk"], brows):
        print(line)


def cmd_summary(args: argparse.Namespace) -> int:
    from ..store import VinOfflineStoreReader

    store = _target(args.store)
    opts = storage_options(args, store)
    with _bucket_named(store, opts):
        _check_current(store, opts, "stage2 summary")
        VinOfflineStoreReader(store, opts)  # strict open
    doc = summary_document(store, opts)
    if args.json:
        print_json(doc)
    else:
        print_summary(doc)
    return 0


# ----- merge ---------------------------------------------------------------------------------------
def cmd_merge(args: argparse.Namespace) -> int:
    from ..errors import StoreError
    from ..fsutil import check_output_path
    from ..store import merge_vin_offline_stores

    out = _target(args.out)
    if isinstance(out, Path):  # never replace a link's target, a special file, or a store already there
        check_output_path(out, option="--out", kind="folder", error=StoreError)
    base, sidecar = _target(args.base), _target(args.sidecar)
    m = merge_vin_offline_stores(base, sidecar, out, storage_options(args, base, sidecar, out))
    st = m["stats"]
    doc = {
        "ok": True,
        "store": out if isinstance(out, str) else str(out.absolute()),
        "fingerprint": m["fingerprint"],
        "samples": st["samples"],
        "pairs": st["pairs"],
        "shards": st["shards"],
        "per_split": st["per_split"],
        "merged_from": m.get("merged_from"),
    }
    if args.json:
        print_json(doc)
    else:
        base_n, side_n = (x["samples"] for x in m["merged_from"])
        print(f"merged store: {doc['store']}")
        print(f"fingerprint:  {doc['fingerprint']}")
        print(f"samples:      {st['samples']} ({base_n} base + {side_n} sidecar) in {st['shards']} shards")
        print(f"pairs:        {st['pairs']}  per split: {st['per_split']}")
    return 0


# ----- gc ------------------------------------------------------------------------------------------
def _gc_data_root(target: Path) -> Path | None:
    """The data root ``target`` (``<root>/stores`` or ``<root>/stores/<profile>``) lies in, if any:
    judged on the folder it is, links followed (a link to a data root's ``stores`` under a name of
    its own took no lock: gc then removed stores while a build held the data root), else as named."""
    from .. import layout

    for p in (target.resolve(), target.absolute()):
        if p.name == layout.STORES_DIR:
            return p.parent
        if p.parent.name == layout.STORES_DIR:
            return p.parent.parent
    return None


@dataclass
class _RemoteQuarantine:
    """What ``stage2 gc URL --quarantine`` removed (or would): of the stores a build moved aside
    into ``<url>/<profile>/.quarantine/<UTC time>/<name>/`` (object storage has no data root),
    each one's own files, and what it kept (URL, why) as the local quarantine keeps it."""

    root: str
    dry_run: bool
    moved: list[dict[str, Any]]
    kept: list[tuple[str, str]]

    @property
    def files(self) -> int:
        return sum(int(m["files"]) for m in self.moved)

    @property
    def bytes(self) -> int:
        return sum(int(m["size"]) for m in self.moved)

    def lines(self) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        if not self.moved and not self.kept:
            return [f"quarantine {self.root}: empty, nothing {'to remove' if self.dry_run else 'removed'}"]
        out = [f"quarantine {self.root}:"]
        out += [
            f"  {verb}  {m['path']}/  folder of {m['files']} file(s), {_human(m['size'])}  {m['reason']}".rstrip()
            for m in self.moved
        ]
        out += [f"  kept ({why}): {url}" for url, why in self.kept]
        total = f"quarantine: {verb} {self.files} file(s), {_human(self.bytes)}"
        if self.kept:
            total += f"; kept {len(self.kept)} item(s) that are not what stage2 moved there (named above)"
        return [*out, total]

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "dry_run": self.dry_run,
            "moved": self.moved,
            "kept": [{"path": url, "why": why} for url, why in self.kept],
            "removed_files": 0 if self.dry_run else self.files,
            "bytes": self.bytes,
        }


def _remote_quarantine(target: str, opts: dict[str, Any] | None, roots: list[Any], *, dry_run: bool) -> Any:
    """Empty ``.quarantine/`` of each profile stores folder ``target`` names on object storage as
    the local quarantine is emptied: in each move's folder, each store its ``moved.json`` records
    (its ``manifest.json`` and the files that lists, the manifest last), then that ``moved.json``.
    Anything else is kept and named: an object the manifest does not list (a note put in the
    store), what no ``moved.json`` records, a store whose manifest cannot be read (whole, with its
    ``moved.json``). A dry run removes nothing."""
    import json

    from ..publish.quarantine import NOT_MOVED, manifest_listed_paths
    from ..storage import MOVED_FILE, QUARANTINE_DIR, StoreLocation
    from ..store.format import MANIFEST_NAME

    loc = StoreLocation.parse(target, opts)
    if not roots:  # a profile folder holding only what was moved aside, or a folder of such
        roots = [loc] if loc.is_dir(loc.root / QUARANTINE_DIR) else []
        roots += [
            loc.child(n)
            for n in sorted(loc.listdir_names(loc.root))
            if not n.startswith(".") and loc.is_dir(loc.root / n / QUARANTINE_DIR)
        ]
    moved: list[dict[str, Any]] = []
    kept: list[tuple[str, str]] = []
    for r in roots:
        q = r.child(QUARANTINE_DIR)
        for folder in sorted(q.listdir_names(q.root)):
            f = q.child(folder)
            sizes = f.file_sizes()
            try:
                record = json.loads(f.read_bytes(f.root / MOVED_FILE))
            except (OSError, ValueError):
                record = {}
            record = record if isinstance(record, dict) else {}
            moves: Any = record.get("files")
            moves = moves if isinstance(moves, list) else []
            units = {
                str(m.get("to", "")).rstrip("/").rsplit("/", 1)[-1] for m in moves if isinstance(m, dict)
            }
            remove: list[str] = []
            whole = False
            for name in sorted({k.split("/", 1)[0] for k in sizes} - {MOVED_FILE}):
                mine = {k: v for k, v in sizes.items() if k.startswith(name + "/")}
                if name not in units or not mine:
                    kept.append(
                        (f.display(f.root / name), f"{NOT_MOVED}: its {MOVED_FILE} does not record it")
                    )
                    continue
                try:
                    listed, why = manifest_listed_paths(
                        json.loads(f.read_bytes(f.root / name / MANIFEST_NAME))
                    )
                except (OSError, ValueError) as e:
                    listed, why = None, f"{type(e).__name__}: {e}"
                if listed is None:
                    whole = True
                    kept.append(
                        (
                            f.display(f.root / name),
                            f"a store moved aside whose manifest.json cannot be read ({why}): kept whole, "
                            "nothing in it is guessed to be the store's; remove it yourself if you no "
                            "longer need it",
                        )
                    )
                    continue
                ours = [k for k in sorted(mine) if k[len(name) + 1 :] in listed]
                ours.append(f"{name}/{MANIFEST_NAME}")  # last: a store without it is never complete
                kept += [
                    (f.display(f.root / k), "not the store's: its manifest.json does not list it")
                    for k in sorted(mine)
                    if k not in ours
                ]
                moved.append(
                    {
                        "path": f.display(f.root / name),
                        "folder": folder,
                        "reason": str(record.get("reason") or ""),
                        "files": len(ours),
                        "size": sum(mine[k] for k in ours),
                    }
                )
                remove += ours
            if not dry_run:
                for k in remove:
                    f.delete(f.root / k)
                if not whole and MOVED_FILE in sizes:  # a store kept whole keeps why it was moved
                    f.delete(f.root / MOVED_FILE)
                f.invalidate()
    return _RemoteQuarantine(loc.url, dry_run, moved, kept)


def cmd_gc(args: argparse.Namespace) -> int:
    import contextlib

    from ..errors import StoreError
    from ..publish import data_root_lock
    from ..storage import StorageAccessError
    from ..store.retention import KEEP_ENV, check_current, collect_stores, default_keep, profile_roots

    target = _target(args.stores)
    opts = storage_options(args, target)
    data_root = _gc_data_root(target) if isinstance(target, Path) else None
    aside = [flag for flag, on in (("--quarantine", args.quarantine), ("--unused", args.unused)) if on]
    remote = isinstance(target, str)  # object storage: --quarantine empties each <profile>/.quarantine/
    if remote and args.unused:
        raise StoreError(
            f"{args.stores}: --unused needs the local stores folder of a data root (<data_root>/stores): "
            "the folder it empties is <data_root>/unused, which is never on object storage.",
            fix="name <data_root>/stores, e.g. `stage2 gc /data/stage2/stores --unused --dry-run`",
        )
    if aside and data_root is None and not remote:
        raise StoreError(
            f"{args.stores}: {' and '.join(aside)} needs the local stores folder of a data root "
            "(<data_root>/stores or <data_root>/stores/<profile>): the folders it empties are "
            "<data_root>/quarantine and <data_root>/unused.",
            fix=f"name <data_root>/stores, e.g. `stage2 gc /data/stage2/stores {aside[0]} --dry-run`",
        )
    if aside and data_root is not None and not data_root.is_dir():  # a typo: never made, never "empty"
        raise StoreError(
            f"{args.stores}: no data root at {data_root} (no such folder), so there is no quarantine "
            "or unused folder to empty there.",
            fix="name the stores folder of the data root a build used (its --data-root), e.g. "
            f"`stage2 gc /data/stage2/stores {aside[0]} --dry-run`",
        )
    keep = args.keep if args.keep is not None else default_keep()
    if keep is None and not aside:
        msg = f"{KEEP_ENV}=all: every store is kept; nothing removed (pass --keep N to remove old stores)"
        if args.json:
            print_json({"ok": True, "keep": "all", "dry_run": args.dry_run, "roots": [], "freed_bytes": 0})
        else:
            print(msg)
        return 0
    roots = []
    if keep is not None:
        try:
            with _bucket_named(target, opts):
                roots = profile_roots(target, opts)
        except StoreError as err:
            if not aside or isinstance(err, StorageAccessError):
                raise
            # with --quarantine or --unused, a data root without stores yet (no build published) is fine
    # a build writes stores under its data root's lock: gc takes it too (not for a dry run), so it
    # never judges a store a running build has just written and not yet published.
    guard = (
        data_root_lock(data_root, command="gc")
        if data_root is not None and not args.dry_run
        else contextlib.nullcontext()
    )
    removal: Any = None
    unused = None
    with guard:
        for root in roots:  # every profile's `current` judged before any store of any profile goes
            check_current(root)
        reports = [collect_stores(r, keep, dry_run=args.dry_run) for r in roots] if keep is not None else []
        if args.quarantine and remote:
            removal = _remote_quarantine(str(target), opts, roots, dry_run=args.dry_run)
        elif args.quarantine:
            from ..publish.quarantine import remove_quarantine

            assert data_root is not None
            removal = remove_quarantine(data_root, dry_run=args.dry_run)
        if args.unused:
            from ..extract.inspect import remove_unused

            assert data_root is not None
            unused = remove_unused(data_root, dry_run=args.dry_run)
    freed = sum(r.freed_bytes for r in reports)
    if args.json:
        doc: dict[str, Any] = {
            "ok": True,
            "keep": keep if keep is not None else "all",
            "dry_run": args.dry_run,
            "roots": [r.to_dict() for r in reports],
            "freed_bytes": freed,
        }
        if removal is not None:
            doc["quarantine"] = removal.to_dict()
        if unused is not None:
            doc["unused"] = unused.to_dict()
        print_json(doc)
    else:
        if keep is None:
            print(f"{KEEP_ENV}=all: every store is kept (pass --keep N to remove old stores)")
        for r in reports:
            for line in r.lines():
                print(line)
        for extra in (removal, unused):
            for line in extra.lines() if extra is not None else []:
                print(line)
    return 0


STORE_ARG_HELP = "the store folder (or the stores/<profile>/current link), or an s3:// URL"


def register(sub: Any) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "validate",
        help="strict, read-only validation of a store",
        description="Open the store with the strict reader (another format/version is refused with the "
        "command that rebuilds it, exit 2), then check manifest, shards, arrays, splits, pairs, file sizes and every stored chunk's crc32c; "
        "every problem is listed (exit 1).",
        epilog=f"Example:\n  stage2 validate {STORE_EXAMPLE} --deep",
        formatter_class=raw,
    )
    p.add_argument("store", help=STORE_ARG_HELP)
    p.add_argument(
        "--deep", action="store_true", help="also re-hash every file and recompute the fingerprint"
    )
    p.add_argument(
        "--decode",
        action="store_true",
        help="also decode every sample as the reader does and check its frames against its "
        "frames_sha256, its actions finite, and the zero / NaN padding past its length and width",
    )
    finish_command(p, cmd_validate, json_help="print one JSON object (ok, problems)", storage_option=True)
    p = sub.add_parser(
        "summary",
        help="counts per split and source, pairs, frames per sample, bytes per block of a store",
        description="Counts per split and source, pairs, frames per sample, and bytes per block: "
        "estimated (uncompressed payload), stored (with padding) and on disk.",
        epilog=f"Example:\n  stage2 summary {STORE_EXAMPLE} --json",
        formatter_class=raw,
    )
    p.add_argument("store", help=STORE_ARG_HELP)
    finish_command(p, cmd_summary, storage_option=True)
    p = sub.add_parser(
        "merge",
        help="merge a sidecar store (new trajectories only) into a new store",
        description="Write BASE + SIDECAR into a new store at --out: base shards are linked, sidecar shards "
        "copied whole (bytes verified), a new manifest, sample index, pairs and splits are written, the result "
        "is validated like a fresh build and published atomically. Neither input is modified.",
        epilog="Example:\n  stage2 merge stores/core/current stores/core-sidecar --out stores/core-merged --json",
        formatter_class=raw,
    )
    p.add_argument("base", help="the existing store")
    p.add_argument("sidecar", help="a store of new trajectories only, built by the same writer")
    p.add_argument("--out", required=True, help="the new store's folder (not BASE or SIDECAR)")
    finish_command(p, cmd_merge, storage_option=True)
    p = sub.add_parser(
        "gc",
        help="remove old stores: keep current, the N previous ones and every store a reader holds",
        description="Apply the retention policy to a profile's stores folder (or to every profile of a "
        "stores folder): `current` is never removed, nor the N most recent previous stores (--keep, "
        "default STAGE2_KEEP_STORES or 1), nor a store a live reader holds (reported as kept: in use by "
        "pid X), nor anything that is not a complete store of this format; temps of dead writers are "
        "swept. One line per store (removed or kept, with its size). On object storage readers hold no "
        "lease: only --keep protects them. With --quarantine, the data root's quarantine folder (files "
        "moved aside, never deleted otherwise) is emptied too, one line per archive or store moved aside; with --unused, "
        "the cache directories a build moved to <data_root>/unused because the profile no longer lists them. "
        "Takes the data root's lock (refused while a build runs).",
        epilog="Example:\n  stage2 gc .demo/data/stores --dry-run\n"
        "  stage2 gc /data/stage2/stores/stage2_core_v1 --keep 2 --json\n"
        "  stage2 gc /data/stage2/stores --quarantine --dry-run\n"
        "  stage2 gc /data/stage2/stores --unused --dry-run",
        formatter_class=raw,
    )
    p.add_argument(
        "stores", help="STORES_DIR (<data_root>/stores) or one profile's (<data_root>/stores/<profile>)"
    )
    p.add_argument(
        "--keep",
        type=count_of("a number of stores", minimum=0),
        default=None,
        metavar="N",
        help="previous stores kept besides current (default: STAGE2_KEEP_STORES, else 1)",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    p.add_argument(
        "--quarantine",
        action="store_true",
        help="also remove every file moved aside into <data_root>/quarantine (archives that disagreed "
        "with their pin, stores that failed the publication gate; `stage2 list` shows them) or, on "
        "object storage, <url>/<profile>/.quarantine (stores that failed the publication gate); "
        "without it gc never touches those folders",
    )
    p.add_argument(
        "--unused",
        action="store_true",
        help="also remove the cache directories a build moved to <data_root>/unused because the "
        "profile no longer lists them (`stage2 list` shows them; a later build re-extracts one from "
        "its archives if the profile lists it again); without it gc never touches that folder",
    )
    finish_command(
        p,
        cmd_gc,
        json_help="print one JSON object (per profile: every store, its action)",
        storage_option=True,
    )
