"""The store step: build (or reuse) the immutable store of a profile's inputs, validate it, publish it;
and the published store's own check (re-read every byte, decode every sample). What a store is
built from, and the key naming it, are in :mod:`.store_inputs`."""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, ParamSpec, cast

from .. import checks as C
from .. import layout
from ..checks import CheckOutcome, compare_totals, outcome
from ..errors import CODE_ERRORS, FileSystemError, Stage2Error, StoreError, StoreNotFoundError
from ..kit import load_pairs, read_join_rows
from ..kit.sidecar_facts import recorded_sidecars
from ..oserrors import fs_error
from ..profile import Profile
from ..publish.ledger import published_fingerprint, record_published, unlike_published
from ..publish.lock import require_launching_build
from ..publish.quarantine import quarantine_files
from ..publish.readonly import make_writable
from ..publish.store_lock import stores_folder_lock
from ..storage import CURRENT_OBJECT, StoreLocation, check_stores_url, join_url, option_args
from ..store import (
    OFFLINE_DATASET_VERSION,
    PairSpec,
    SampleSpec,
    StoreInputError,
    VinOfflineStoreReader,
    collect_vin_offline_dataset_stats,
    validate_vin_offline_store,
)
from ..store.extend import write_or_extend
from ..store.gate import GateResult, publication_gate
from ..store.manifest import read_manifest
from ..store.retention import retention_after_publish
from ..store.target import nearest_existing, not_writable, unwritable_reason
from .result import StepResult, kv_table, rate
from .status import (
    clear_store_records,
    kit_held,
    recorded_sha256,
    require_inputs_as_recorded,
    write_gate_record,
)
from .store_inputs import checked_inputs, extracted_content, kit_inputs, require_checked, store_input_key

P = ParamSpec("P")


#: Samples a shard-writing worker process must have to pay for itself. A worker costs a process
#: start and its imports, and gains only on the per-sample Python work (parsing, hashing calls,
#: copies) that holds one GIL; the per-byte work (inflate, Blosc, sha256) runs on threads in parallel
#: anyway, so a store of few samples, however large, is written faster on threads
#: (docs/benchmarks.md, "Design measurements").
SAMPLES_PER_PROCESS = 1000


def store_processes(samples: int) -> int:
    """Worker processes that write a store of ``samples`` samples: one a core, at most 4, and one
    per :data:`SAMPLES_PER_PROCESS` samples (1: the shards are written in this process, on threads;
    the writer also keeps to two shards a process at least)."""
    return max(1, min(4, os.cpu_count() or 1, samples // SAMPLES_PER_PROCESS))


def _holding_stores_lock(step: Callable[P, StepResult]) -> Callable[P, StepResult]:
    """``step`` (``step(profile, data_root, ..., store_url=, storage_options=)``) run holding the
    writer lock of a local stores folder outside the data root (``store_url="file:///..."``, which
    two data roots' builds may share: ``publish.store_lock``); a data root's own stores are written
    under its lock alone."""

    @functools.wraps(step)
    def holding(*args: P.args, **kw: P.kwargs) -> StepResult:
        profile, data_root = cast(Profile, args[0]), Path(cast(Path, args[1]))
        held: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        url = cast("str | None", kw.get("store_url"))
        options = cast("dict[str, Any] | None", kw.get("storage_options"))
        root = stores_location(profile, data_root, store_url=url, storage_options=options)
        if root.is_local:
            require_writable_stores(root.root, url)  # before its lock or anything moved or written
            if url:
                held = stores_folder_lock(root.root, data_root)
        with held:
            return step(*args, **kw)

    return holding


def require_writable_stores(folder: Path, store_url: str | None = None) -> None:
    """Refuse the store step when the local stores folder ``folder`` (or the nearest folder above it,
    where it would be made) cannot be written: a read-only file system or mount, no write
    permission. A FileSystemError (the build exits 2) naming the folder, what is wrong and the fix,
    raised before anything there is moved aside, withdrawn or written: every store step writes
    there (its store, or the ``current`` link of the store it reuses)."""
    where = nearest_existing(folder)
    why = not_writable(where) if where.is_dir() else None
    if why is None:  # writable, or not a folder (the writer names what stands in the way)
        return
    what, make = unwritable_reason(why)
    other = (
        "choose another --store-url"
        if store_url
        else "pass --store-url file:///<a writable folder> to write the stores there instead"
    )
    at = str(where) if where == folder else f"{where} (where {folder} is made)"
    said = f"{at} is not writable ({what})"
    raise FileSystemError(
        f"cannot write a store in the stores folder {folder}: {said}; nothing in it was moved or written",
        fix=f"{make}, or {other}, then build again",
    )


@_holding_stores_lock
def step_store(
    profile: Profile,
    data_root: Path,
    *,
    rows_per_shard: int = 64,
    progress: Any = None,
    store_url: str | None = None,
    storage_options: dict[str, Any] | None = None,
    keep_stores: int | str | None = None,
    alongside: Callable[[str], dict[str, Any]] | None = None,
    reverify: bool = False,
) -> StepResult:
    """Build (or reuse, for an unchanged input set) the store ``v<VERSION>-<inputs16>`` under
    ``<data_root>/stores/<profile>/`` or, with ``store_url`` (``s3://bucket/prefix``), under
    ``<store_url>/<profile>/``; then point ``current`` at it (a symlink locally, a ``CURRENT`` object
    holding the folder name on object storage, written after the store's manifest).

    ``alongside(url)``: more metadata drawn from a new store while it is validated (the UI's
    preview: both only read it), on a thread of its own; added to the result once the store is
    published, thrown away otherwise. Not called for a reused store.

    ``reverify`` (``stage2 build --reverify``): a store of these inputs already there is reused only
    when a store written anew from the inputs (a witness, removed after) gives its fingerprint; one
    that gives another is moved aside and the store built again. Its manifest and the build's
    records are then trusted no more than a first build trusts them."""
    with kit_held(profile, "the store writer"):
        inputs = kit_inputs(profile)
        extracted = extracted_content(profile, data_root)
        require_checked(
            profile, data_root, checked_inputs(profile, data_root, kit=inputs, extracted=extracted)
        )
        # the pairs as hashed (the only kit file the writer reads: the join's table holds the rest)
        pairs_rows, _ = load_pairs(profile.kit_file("pair_manifest"))
    settings = {"rows_per_shard": rows_per_shard, "include_actions": True, "max_frames": profile.max_frames}
    key = store_input_key(profile, inputs, settings, extracted)
    name = f"v{OFFLINE_DATASET_VERSION}-{key[:16]}"
    root_loc = stores_location(profile, data_root, store_url=store_url, storage_options=storage_options)
    out = root_loc.child(name)
    t0 = time.perf_counter()
    rebuilt = True
    withdrawn = False  # `current` named this store's folder, written again: withdrawn meanwhile
    update = f"reused {name} (same inputs; passed the publication gate)"
    gate: GateResult | None = None
    set_aside = ""
    moved_aside: list[str] = []  # "<from> -> <to>": a store set aside, never deleted
    base: StoreLocation | None = None  # the published store a new one replaces
    damaged_base: list[str] = []  # its problems, when the writer found it damaged
    unlike = ""  # how it differs from the store this data root published under its name
    # what the manifest of this build's store records: a store under this name that records
    # anything else is not this build's, however well it validates
    expect = {"profile": profile.identity(), "inputs": inputs, "options": settings}
    if out.is_local and out.root.is_symlink():
        # a link where this store's folder goes: a build writes folders, never links, so what it
        # names is no store a build wrote here. The link is moved aside as a link; its target (a
        # user's folder, anywhere) is never read as a store, made read-only or published through it
        target = os.readlink(out.root)
        (dest,) = quarantine_files(
            data_root, [out.root], "a symbolic link where a store's folder goes", store=name, target=target
        )
        moved_aside.append(f"{out.root} -> {dest}")
        set_aside = f"a symbolic link stood where the store {name} goes (to {target}): moved to {dest}"
    if out.is_file(out.root / "manifest.json"):
        # a store of these inputs is already there (kept, current, or left by a stopped build):
        # it is reused only after the same full check a new store passes
        gate = publication_gate(out, expect)
        differs: tuple[str, str] | None = None
        checked = ""
        if gate.passed:
            differs, checked = _provenance(
                profile.name,
                data_root,
                out,
                reverify,
                functools.partial(
                    _differs_from_inputs, profile, data_root, root_loc, out, expect, settings, pairs_rows
                ),
            )
        if gate.passed and differs is None:
            rebuilt = False
            if checked:
                update = f"reused {name} ({checked})"
        elif differs is not None:
            moved, set_aside = move_store_aside(out, data_root, profile.name, [differs[0]], reason=differs[1])
            moved_aside.append(moved)
            gate = None
        else:
            moved, set_aside = move_store_aside(out, data_root, profile.name, gate.problems)
            moved_aside.append(moved)
    elif out.is_local and out.root.is_dir() and not out.root.is_symlink() and any(out.root.iterdir()):
        # a store folder of these inputs without its manifest (a damaged store; the writer's own
        # staging never has this name): not ours to delete, not a store to publish: moved aside
        moved, set_aside = move_store_aside(
            out, data_root, profile.name, [f"{out.root}/manifest.json: missing (not a complete store)"]
        )
        moved_aside.append(moved)
    if rebuilt:
        samples, pairs = writer_input(profile, data_root, pairs_rows)
        # a sidecar store of the new trajectories merged into the published store when the new
        # inputs only add trajectories (stage2_data/store/extend.py), else a full build; one line says which
        withdrawn = root_loc.withdraw_current(name)
        if withdrawn:  # the folder `current` names is written again: nothing half-written or
            # ungated is ever published through it (a stop before the gate leaves nothing current)
            said = f"`{layout.CURRENT_LINK}` named {name}: withdrawn until it passes the gate"
            set_aside = f"{set_aside}; {said}" if set_aside else said
        base = root_loc.current()
        # a store is extended only while it is the one this data root published: its shards go
        # into the new store as they are
        unlike, not_extendable = _unlike_published(data_root, profile.name, base)
        if unlike:
            damaged_base.append(unlike)
        update = _write_store(
            profile,
            data_root,
            out,
            base,
            samples,
            pairs,
            inputs,
            rows_per_shard,
            progress,
            damaged_base,
            not_extendable,
        )
        if set_aside:  # with no store left to extend, what was set aside is why it was rebuilt
            update = f"rebuilt: {set_aside}" if base is None else f"{update}; {set_aside}"
    seconds = time.perf_counter() - t0
    # A new store passes the publication gate (every file hashed, the content recomputed, every
    # sample decoded through zarr and compared with its frames_sha256) before it becomes current,
    # exactly as a reused one did above: a store that does not pass is never published.
    t1 = time.perf_counter()
    drawn: dict[str, Any] = {}
    if rebuilt:
        gate, drawn = gate_new_store(out, alongside, expect)
    assert gate is not None
    problems = list(gate.problems)
    validate_seconds = time.perf_counter() - t1 if rebuilt else gate.seconds
    # the counts are a blocking check too: a store whose samples or pairs differ from the profile's
    # totals is never made current (store_checks reports them below)
    counted = store_counts(profile, out) if not problems else None
    published = not problems and not (counted is not None and counted[1])
    if published:
        require_launching_build(data_root)  # a run of a killed build publishes nothing
        # the `current` symlink, or the CURRENT object after the manifest; a folder a user put at
        # `current` is moved aside first, and said
        if (moved := root_loc.publish_current(name)) is not None:
            moved_aside.append(moved)
        if rebuilt and damaged_base and base is not None and base.is_local and base.root.is_dir():
            # the store it replaced was found damaged: never kept as a previous store to return to
            moved, said = move_store_aside(
                base,
                data_root,
                profile.name,
                damaged_base,
                reason=(
                    "is not the store this data root published under its name"
                    if unlike
                    else "was published but does not validate"
                ),
                then="(a damaged store is never kept as a previous one)",
            )
            moved_aside.append(moved)
            update = f"{update}; {said}"
        # the ledger: what a later build's reuse of this folder must find in it
        record_published(data_root, profile.name, name, str(read_manifest(out).get("fingerprint")))
        if out.is_local:
            write_gate_record(data_root, profile.name, name, gate.stats)
    else:
        clear_store_records(data_root)  # a failed gate: no record lets a later build skip the check
        if rebuilt and problems:
            problems.append(
                f"{out.url} was removed, not published: "
                + (
                    f"nothing is published ({CURRENT_OBJECT.lower()} named this folder, whose earlier store was set aside)"
                    if withdrawn
                    else f"{CURRENT_OBJECT.lower()} still points at the previous store"
                )
            )
    result = store_checks(
        profile,
        out,
        rebuilt=rebuilt,
        seconds=seconds,
        reader_cls=VinOfflineStoreReader,
        problems=problems,
        validate_seconds=validate_seconds,
        counted=counted,
    )
    result.metadata["update"] = update
    if moved_aside:  # the build's `moved aside:` lines and its --json `moved_aside`
        result.metadata["moved_aside"] = "\n".join(moved_aside)
    if published:  # old stores go by the retention policy (``keep_stores``: None reads
        # STAGE2_KEEP_STORES, default 1; "all" keeps every one); never current, never a leased one
        kept = retention_after_publish(root_loc, keep_stores)
        result.metadata["retention"] = kept
        # what it removed, and why it did nothing, as text the build's summary prints
        if kept.get("removed"):
            result.metadata["removed_stores"] = "\n".join(kept["removed"])
        if kept.get("error"):
            result.metadata["retention_error"] = str(kept["error"])
        result.metadata.update(drawn)
    result.metadata["gate_seconds"] = round(gate.seconds, 3)
    if problems and rebuilt:  # never published: a new store that failed is ours alone, never verified
        out.delete_tree()
    return result


def writer_input(
    profile: Profile, data_root: Path, pairs_rows: Sequence[Any]
) -> tuple[list[SampleSpec], list[PairSpec]]:
    """The samples and pairs the writer reads: the join's rows of paired trajectories, each with
    the sha256 the build's records hold of its frames file (and sidecar); the records are checked
    against the files right before. Raises StoreInputError naming every file no record holds."""
    # what the writer reads is what the records its name digests say, checked right before
    records = require_inputs_as_recorded(profile, data_root, "the store writer")
    table = read_join_rows(data_root)  # the bytes the join wrote, checked as read
    derived = layout.derived_root(data_root)
    recorded = recorded_sha256(records)
    sidecar_sha256 = {rel: e.get("sha256") for rel, e in recorded_sidecars(derived).items()}
    samples = []
    unheld = []  # samples whose frames (or sidecar) no record of this build holds
    listed = set(profile.cache_keys())
    for r in table:
        if not r.get("in_pairs"):
            continue
        sample = f"sample {r['stage2_trajectory_id']}"
        if r["frames_path"] not in recorded:
            ck = r.get("cache_key")
            why = "not one the profile lists" if ck not in listed else "its record does not list the file"
            unheld.append(
                f"{data_root / r['frames_path']} ({sample}): no extraction record of profile "
                f"{profile.name} holds its sha256 (cache directory {ck!r}: {why})"
            )
            continue
        sidecar = None
        if r.get("sidecar_path") and r.get("sidecar_present"):
            sidecar = derived / r["sidecar_path"]
            if not sidecar_sha256.get(r["sidecar_path"]):
                unheld.append(f"{sidecar} ({sample}): the unpack's index holds no sha256 of it")
                continue
        samples.append(
            SampleSpec(
                sample_key=r["stage2_trajectory_id"],
                cache_key=r["cache_key"],
                source=r.get("source") or "",
                task=r.get("task") or "",
                quality_label=r.get("quality_label") or "",
                partial_success=r.get("partial_success"),
                is_robot=bool(r.get("is_robot")),
                split=r["split"],
                frames_path=data_root / r["frames_path"],
                sidecar_path=sidecar,
                action_status=r.get("action_status"),
                num_frames=r.get("num_frames"),  # the processed_dataset row's: must equal the file's
                frames_file_sha256=recorded[r["frames_path"]],
                sidecar_file_sha256=sidecar_sha256[r["sidecar_path"]] if sidecar else None,
            )
        )
    if unheld:
        raise StoreInputError(
            "the store writer: files no record of this build holds",
            unheld,
            fix="run `stage2 build`: its extract stage and the unpack record their files again, and "
            "its join names pair rows whose cache directory the profile does not list (add that "
            "archive to the profile, or remove the rows from the kit)",
        )
    pairs = [
        PairSpec(p.pair_id, p.split, p.task, p.chosen_trajectory_id, p.rejected_trajectory_id)
        for p in pairs_rows
    ]
    return samples, pairs


def _write_store(
    profile: Profile,
    data_root: Path,
    out: Any,
    base: Any,
    samples: Sequence[SampleSpec],
    pairs: Sequence[PairSpec],
    inputs: dict[str, str],
    rows_per_shard: int,
    progress: Any = None,
    damaged_base: list[str] | None = None,
    not_extendable: str | None = None,
) -> str:
    """:func:`write_or_extend` of the store at ``out`` with the settings every store of ``profile``
    is written with: the build's store and ``--reverify``'s witness are written alike, so that their
    fingerprints differ only where their inputs do."""
    return write_or_extend(
        out,
        base,
        samples,
        pairs,
        profile=profile.identity(),
        inputs=inputs,
        rows_per_shard=rows_per_shard,
        max_frames=profile.max_frames,
        progress=progress,
        profile_path=profile.profile_path,
        data_root=data_root,
        kit_root=profile.kit_root,
        actions_input=f"kit/{profile.kit.sidecar_archive}",
        processes=store_processes(len(samples)),
        damaged_base=damaged_base,
        not_extendable=not_extendable,
    )


def _unlike_published(data_root: Path, profile_name: str, base: Any) -> tuple[str, str | None]:
    """Whether the published store ``base`` may be extended: ("", None) when the ledger holds its
    fingerprint; else why not, as (a problem that has it moved aside once a new store is published,
    or "" to keep it; the reason the new store is written whole). A store the ledger names with
    another fingerprint is not the one published; one it does not name (published before the
    ledger was kept) is kept, and not extended."""
    if base is None or not base.is_local:
        return "", None
    try:
        have = str(read_manifest(base).get("fingerprint"))
    except Stage2Error:
        return "", None  # unreadable: the extension's own validation finds it damaged
    published = published_fingerprint(data_root, profile_name, base.root.name)
    if published is None:
        return (
            "",
            f"the published store {base.root.name} is not in this data root's ledger of published stores",
        )
    if published == have:
        return "", None
    unlike = unlike_published(data_root, base.root.name, have, published)
    return unlike, f"the published store {base.root.name} is not the one this data root published"


def _provenance(
    profile_name: str, data_root: Path, out: Any, reverify: bool, witness: Callable[[], str | None]
) -> tuple[tuple[str, str] | None, str]:
    """Whether the store at ``out`` (which passed the gate) is the one these inputs give: None, or
    (the difference, the reason to move it aside); and how that was checked, for the build's line
    ("" for the usual case: the ledger holds its fingerprint). The gate proves the store agrees with
    its own manifest; this ties the manifest to what was published, or to the inputs.

    * ``--reverify``: a store written anew from the inputs (``witness``: :func:`_differs_from_inputs`)
      must give its fingerprint; the build's own records, the ledger among them, are not trusted.
    * the ledger holds a fingerprint for this folder (it was published from this data root): the
      store's must be that one.
    * no entry (left by a stopped build, copied in, published before the ledger was kept): checked
      as ``--reverify`` checks it."""
    have = str(read_manifest(out).get("fingerprint"))
    published = None if reverify else published_fingerprint(data_root, profile_name, out.root.name)
    if published is not None:
        if published == have:
            return None, ""
        why = unlike_published(data_root, out.root.name, have, published)
        return (why, "is not the store this data root published under its name"), ""
    differs = witness()
    how = (
        "--reverify wrote it anew from its inputs: the same fingerprint"
        if reverify
        else "this data root has no record of publishing it: written anew from its inputs, the same fingerprint"
    )
    if differs is None:
        return None, how
    why = "checked by --reverify" if reverify else "it was never published from this data root"
    return (f"{differs} ({why})", "is not what its inputs give"), ""


def _differs_from_inputs(
    profile: Profile,
    data_root: Path,
    root_loc: Any,
    out: Any,
    expect: dict[str, Any],
    settings: dict[str, Any],
    pairs_rows: Sequence[Any],
) -> str | None:
    """How the store at ``out`` (which passed the gate) differs from a store written anew from the
    build's inputs, or None when both give one fingerprint. The new store (a witness under a
    dot-name that no listing counts) passes the same gate and is removed either way: it only says
    what the inputs give. A witness left by a stopped build is removed first (derived, never
    published)."""
    witness = root_loc.child(f".reverify-{out.root.name}")
    witness.delete_tree()
    samples, pairs = writer_input(profile, data_root, pairs_rows)
    try:
        _write_store(
            profile,
            data_root,
            witness,
            None,
            samples,
            pairs,
            expect["inputs"],
            int(settings["rows_per_shard"]),
        )
        gate = publication_gate(witness, expect)
        if not gate.passed:
            raise StoreError(
                f"--reverify: the store written anew from the inputs fails the publication gate: "
                f"{gate.problems[0]}",
                fix="run `stage2 build --reverify` again; if it fails the same way, report it as a bug",
            )
        want = str(read_manifest(witness).get("fingerprint"))
    finally:
        witness.delete_tree()
    have = str(read_manifest(out).get("fingerprint"))
    if want == have:
        return None
    return f"its content gives fingerprint {have}, its inputs give {want}"


def gate_new_store(
    out: Any, alongside: Callable[[str], dict[str, Any]] | None, expect: dict[str, Any] | None = None
) -> tuple[GateResult, dict[str, Any]]:
    """A new store through the publication gate (``expect``: what its manifest must record), and
    what ``alongside(out.url)`` drew meanwhile on another thread ({} without it, and for a store
    that failed: it is not published, and what failed is the gate's to say, whatever the drawing
    raised). Both only read the store."""
    if alongside is None:
        return publication_gate(out, expect), {}
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage2-alongside") as pool:
        drawn = pool.submit(alongside, out.url)
        gate = publication_gate(out, expect)
        if not gate.passed:
            wait([drawn])  # done with the store before the caller removes it
            return gate, {}
        return gate, drawn.result()


def move_store_aside(
    out: Any,
    data_root: Path,
    profile_name: str,
    problems: list[str],
    *,
    reason: str = "failed the publication gate",
    then: str = "and built again from the verified inputs",
) -> tuple[str, str]:
    """A store already there that failed the publication gate (``reason``) is moved, never deleted:
    a local one into the data root's quarantine folder (``quarantine/<UTC time>/stores/<profile>/<name>``,
    with its ``moved.json``: ``stage2 list`` shows it); one on object storage, which has no rename, is
    copied to ``<url>/<profile>/.quarantine/<UTC time>/<name>/`` (with its ``moved.json``), the copy
    checked, and only then withdrawn (its manifest first): :meth:`FsspecLocation.move_aside`. Only
    ``stage2 gc --quarantine`` removes either. Returns ``"<from> -> <to>"`` (the step's
    ``moved_aside``) and the line that says what happened and where (``then``: what the build did)."""
    first = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    if not out.is_local:
        moved = out.move_aside(reason, store=out.root.name, problems=problems[:20])
        return f"{out.url} -> {moved.url}", (
            f"the store already at {out.url} {reason} ({first}): moved to {moved.url} {then}"
        )
    try:
        make_writable(out.root)  # a folder moved to another parent needs its own write bit
        (dest,) = quarantine_files(data_root, [out.root], reason, store=out.root.name, problems=problems[:20])
    except OSError as e:  # FileSystemError too: an immutable store (chattr +i), another owner
        said = fs_error(e, "")
        raise FileSystemError(
            f"the store at {out.root} {reason} ({first}), and it cannot be moved aside: "
            f"{said.message}; nothing was built or published, and what `current` names is unchanged "
            "(a reader of this store fails on what the gate found)",
            fix="make the store writable by this user (`chattr -R -i` if it was made immutable; its "
            "owner or mode), then run the build again: it moves the store to quarantine and builds "
            "it anew",
        ) from None
    make_writable(dest)  # no longer a published store: `stage2 gc --quarantine` may remove its files
    return (
        f"{out.root} -> {dest}",
        f"the store already at {out.root} {reason} ({first}): moved to {dest} {then}",
    )


def stores_location(
    profile: Profile,
    data_root: Path,
    *,
    store_url: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """Where the stores of ``profile`` live, as a StoreLocation: ``<data_root>/stores/<profile>/``,
    or ``<store_url>/<profile>/`` on object storage."""
    if store_url:
        check_stores_url(store_url)
        return StoreLocation.parse(join_url(store_url, profile.name), storage_options)
    return StoreLocation.parse(layout.stores_root(data_root, profile.name))


def current_store(
    profile: Profile,
    data_root: Path,
    *,
    store_url: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """The published store of ``profile`` as a StoreLocation: ``stores/<profile>/current`` under the
    data root, or the folder named by ``<store_url>/<profile>/CURRENT`` on object storage.
    Raises StoreNotFoundError (with the command that builds it) when none is published."""
    root = stores_location(profile, data_root, store_url=store_url, storage_options=storage_options)
    current = root.current()
    if current is not None:
        return current
    fix = f"build it: stage2 build --profile {profile.profile_path} --data-root {data_root}"
    if not store_url:
        link = layout.current_store_path(data_root, profile.name)
        if os.path.lexists(link) and not link.is_symlink():
            raise StoreNotFoundError(
                f"no store is published at {link}: it is a folder or file, not the symbolic link a "
                "build publishes, so it is not read as the published store.",
                fix=f"{fix} (the build moves it aside into {layout.quarantine_root(Path(data_root))}/)",
            )
        raise StoreNotFoundError(f"no store is published at {link}.", fix=fix)
    fix += f" --store-url {store_url} {option_args(storage_options)}".rstrip()
    if (why := root.current_problem()) is not None:  # a CURRENT object naming no store
        raise StoreNotFoundError(
            f"{why}.", fix=f"{fix} (it publishes the store and rewrites {CURRENT_OBJECT})"
        )
    raise StoreNotFoundError(f"no store is published at {root.url} (no {CURRENT_OBJECT} object).", fix=fix)


def verify_current_store(
    profile: Profile,
    data_root: Path,
    *,
    store_url: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> CheckOutcome:
    """Re-read the published store: deep validation (every file's sha256, the fingerprint), every
    sample decoded against its frames_sha256, and its fingerprint the one the data root's ledger
    recorded when it published that store (when the ledger names it). Nothing is written."""
    t0 = time.perf_counter()
    try:
        loc = current_store(profile, data_root, store_url=store_url, storage_options=storage_options)
    except StoreError as e:
        return outcome(C.STORE_BYTES_MATCH_MANIFEST, [str(e)])
    problems = validate_vin_offline_store(loc, deep=True, decode=True)
    published = published_fingerprint(data_root, profile.name, loc.root.name)
    if not problems and published is not None:
        have = str(read_manifest(loc).get("fingerprint"))
        if have != published:
            problems.append(
                f"{loc.url}: {unlike_published(data_root, loc.root.name, have, published)}: the store "
                "was changed together with its manifest; `stage2 build` moves it aside and builds it again"
            )
    if problems:  # a failed check clears the success records of what it checked
        clear_store_records(data_root)
    return outcome(
        C.STORE_BYTES_MATCH_MANIFEST, problems, store=loc.url, seconds=round(time.perf_counter() - t0, 3)
    )


def store_counts(profile: Profile, path: Any) -> tuple[dict[str, Any], list[str]]:
    """The store's stats, and how its samples and pairs differ from the profile's expected totals
    (``store_counts_match_expected``'s problems: none when they match)."""
    stats = collect_vin_offline_dataset_stats(path)
    problems = compare_totals(
        {"samples": int(stats.get("samples", -1)), "pairs": int(stats.get("pairs", -1))},
        {"samples": profile.expected.unique_frame_files, "pairs": profile.expected.pair_rows},
        getattr(path, "url", str(path)),
        profile=profile,
        keys={"samples": "expected.unique_frame_files", "pairs": "expected.pair_rows"},
    )
    return stats, problems


def store_checks(
    profile: Profile,
    path: Any,
    *,
    rebuilt: bool,
    seconds: float,
    reader_cls: Any,
    problems: list[str] | None = None,
    validate_seconds: float | None = None,
    counted: tuple[dict[str, Any], list[str]] | None = None,
) -> StepResult:
    """Re-open ``path`` (a local path or a StoreLocation) with the strict reader and validate it
    (unless the validation's ``problems`` are given); its counts (:func:`store_counts`) unless
    ``counted`` gives them."""
    open_problems: list[str] = []
    manifest: dict[str, Any] = {}
    try:
        reader = reader_cls(path)
        manifest = reader.manifest
    except CODE_ERRORS:
        raise
    except Exception as exc:  # the strict reader's refusal is the check's finding
        open_problems.append(str(exc))
    if open_problems:
        problems = ["store did not open"]
    elif problems is None:
        problems = validate_vin_offline_store(path)
    count_problems: list[str] = []
    stats: dict[str, Any] = {}
    if manifest:
        stats, count_problems = counted if counted is not None else store_counts(profile, path)
    split_counts = stats.get("per_split", {}) if stats else {}
    md = {
        "store": getattr(path, "url", str(path)),
        "fingerprint": manifest.get("fingerprint"),
        "version": manifest.get("version"),
        "samples": stats.get("samples"),
        "pairs": stats.get("pairs"),
        "shards": len(manifest.get("shards", [])),
        "bytes_on_disk": ((stats.get("bytes") or {}).get("on_disk") or {}).get("total"),
        "bytes_on_disk_per_block": ((stats.get("bytes") or {}).get("on_disk") or None),
        "rebuilt": rebuilt,
        "decoded": True,  # every store is decoded sample by sample by the gate before it is published
        "seconds": round(seconds, 3),
        "validate_seconds": round(validate_seconds, 3) if validate_seconds is not None else None,
        "MB/s": rate(((stats.get("bytes") or {}).get("on_disk") or {}).get("total") or 0, seconds)
        if rebuilt
        else None,
        "per_split": {"__markdown__": kv_table("split", split_counts)},
        "per_source": {"__markdown__": kv_table("source", stats.get("per_source", {}) if stats else {})},
    }
    return StepResult(
        md,
        [
            outcome(C.STORE_OPENS_STRICT, open_problems),
            outcome(C.STORE_VALIDATES, problems),
            outcome(C.STORE_COUNTS_MATCH_EXPECTED, count_problems),
        ],
        path,
    )
