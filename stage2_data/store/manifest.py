"""``manifest.json``: the one loader, the strict format/version check, the fingerprint, the rebuild command.

Every code path that looks at a store's manifest (the reader, validation, the fingerprint, the
writer's check of what it would replace) reads it through :func:`load_manifest`; the reader adds
:func:`check_format_version` (strict: no legacy versions, no silent upgrade).

Machine-dependent facts (the profile path and the data root, used by :func:`rebuild_command`) live
under ``manifest["local"]``, which the fingerprint excludes together with ``created_at`` and
``fingerprint``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FileSystemError, StoreError, StoreNotFoundError, StoreValidationError, StoreVersionError
from ..formats.sha256sums import read_regular_bytes
from ..fsutil import canonical_json
from ..storage import StoreLocation, is_url
from .format import (
    FINGERPRINT_EXCLUDED,
    MANIFEST_NAME,
    OFFLINE_DATASET_VERSION,
    PAIRS_NAME,
    SAMPLE_INDEX_NAME,
    SHARDS_DIR,
    SPLITS_DIR,
    STORE_FORMAT,
)
from .manifest_shape import manifest_shape_problems, version_words


@dataclass(frozen=True)
class ManifestFile:
    """What reading ``manifest.json`` gave: the manifest, or why there is none (``problem``: the short
    form validation reports after the manifest's path; ``error``: what a reader raises, None for a
    missing manifest: :func:`read_manifest` then looks at what is at the path, and only then, since
    many callers merely probe whether a folder is a store)."""

    manifest: dict[str, Any] | None
    problem: str = ""
    error: StoreError | None = None


# ----- loading -------------------------------------------------------------------------------------
#: what a store's writer puts in its folder besides the manifest (written last): a folder holding one
#: of them and no manifest is an incomplete store
_STORE_PARTS = frozenset({SAMPLE_INDEX_NAME, PAIRS_NAME, SPLITS_DIR, SHARDS_DIR})


#: the data root of :func:`rebuild_command` for a store path whose data root does not exist
_UNKNOWN_DATA_ROOT = "<the data root stage2 build filled>"

#: the fix when the path given holds something else than a store
_PASS_A_STORE = (
    "pass the store's folder (the one holding manifest.json), e.g. <data root>/stores/<profile>/current"
)


def _no_store(loc: StoreLocation) -> StoreNotFoundError:
    """Why ``loc`` holds no complete store, in the words that fit what is there: nothing; a file; a
    profile's stores folder (the store is its ``current``); a data root; a folder of other files; or
    a folder without a manifest (an incomplete store, or an empty folder). A local path the user gave
    relative (:attr:`StoreLocation.given`) with nothing there is said to be taken relative to the
    working folder (``stage2 summary .demo/...`` run from another folder)."""
    path = loc.url
    what = f"{MANIFEST_NAME} is missing (incomplete or not a store)"
    build = rebuild_command(path, None)
    fix = f"build it: {build}"
    if not loc.exists(loc.root):
        what = "nothing is there"
        fix = f"check the path (a store folder, or <data root>/stores/<profile>/current), or {fix}"
        given = loc.given
        if loc.is_local and given and not os.path.isabs(given) and not os.path.lexists(given):
            what = (
                f"nothing is there (the relative path {given} was taken relative to the working folder "
                f"{os.getcwd()})"
            )
            fix = (
                f"run the command from the folder {given} is relative to, or pass its absolute path; "
                f"if the store was never built, build it: {build}"
            )
    elif loc.is_file(loc.root):
        what = "it is a file, not a store folder"
        fix = _PASS_A_STORE
    elif loc.is_file(loc.root / "current" / MANIFEST_NAME):
        what = "it is a profile's stores folder"
        fix = f"pass its current store: {loc.display(loc.root / 'current')}"
    elif loc.is_dir(loc.root / "stores") and (
        stores := [
            loc.display(loc.root / "stores" / name / "current")
            for name in sorted(loc.listdir_names(loc.root / "stores"))
            if loc.is_file(loc.root / "stores" / name / "current" / MANIFEST_NAME)
        ]
    ):
        what = "it is a data root"
        fix = f"pass one of its stores: {', '.join(stores)}"
    elif (names := set(loc.listdir_names(loc.root))) and not names & _STORE_PARTS:
        what = f"it is a folder of other files (no {MANIFEST_NAME}, no {SHARDS_DIR}/)"
        fix = _PASS_A_STORE
    return StoreNotFoundError(f"no complete VIN offline store at {path}: {what}.", fix=fix)


def load_manifest(loc: StoreLocation) -> ManifestFile:
    """The ONE reader of a store's ``manifest.json`` (any format or version); never raises for a
    missing, unreadable or non-object manifest (see :func:`read_manifest`)."""
    path = loc.url
    mfile = loc.root / MANIFEST_NAME
    mpath = loc.display(mfile)
    if not loc.is_file(mfile) and not (loc.is_local and os.path.exists(mfile)):
        return ManifestFile(None, "missing (incomplete or not a store)")
    try:
        # on a local disk only a regular file is read, and a FIFO is never waited on
        data = read_regular_bytes(mfile) if loc.is_local else loc.read_bytes(mfile)
        manifest = json.loads(data.decode("utf-8"))
    except FileSystemError as err:  # a FIFO, device, socket or folder: never opened
        problem = f"{err.message.rstrip('.')} (a store holds only regular files and folders)"
        return ManifestFile(
            None,
            problem.removeprefix(f"{mfile} is "),
            StoreError(f"{problem}.", fix=f"rebuild: {rebuild_command(path, None)}"),
        )
    except (OSError, ValueError, RecursionError) as err:
        # (RecursionError: JSON nested deeper than Python's parser goes, no manifest a writer wrote)
        e = "JSON nested too deeply" if isinstance(err, RecursionError) else err
        return ManifestFile(
            None,
            f"unreadable ({e})",
            StoreError(f"{mpath}: unreadable manifest ({e}).", fix=f"rebuild: {rebuild_command(path, None)}"),
        )
    if not isinstance(manifest, dict):
        return ManifestFile(
            None,
            "not a JSON object",
            StoreError(
                f"{mpath}: the manifest is not a JSON object.", fix=f"rebuild: {rebuild_command(path, None)}"
            ),
        )
    return ManifestFile(manifest)


def read_manifest(loc: StoreLocation) -> dict[str, Any]:
    """The manifest of the store at ``loc`` (any format or version). Raises StoreNotFoundError when
    there is none, StoreError when it is unreadable or not a JSON object."""
    got = load_manifest(loc)
    if got.manifest is None:
        raise (got.error or _no_store(loc)) from None
    return got.manifest


def check_format_version(loc: StoreLocation, manifest: dict[str, Any]) -> None:
    """Refuse (StoreVersionError: found vs expected, and the command that rebuilds the store) a
    manifest of another format, or of any version but this writer's."""
    path = loc.url
    fmt = manifest.get("format")
    if fmt != STORE_FORMAT:
        raise StoreVersionError(
            f"Unsupported VIN offline store format: {fmt!r}. Expected {STORE_FORMAT!r}.",
            fix=f"rebuild the store with the current writer: {rebuild_command(path, manifest)}",
        )
    version = manifest.get("version")
    if type(version) is int and version > OFFLINE_DATASET_VERSION:
        # a newer stage2-data wrote it: rebuilding it with this one would go back a version
        writer = manifest.get("writer")
        by = (
            f" (written by {writer.get('package', 'stage2-data')} {writer.get('version', '')})".replace(
                " )", ")"
            )
            if isinstance(writer, dict)
            else ""
        )
        raise StoreVersionError(
            f"VIN offline store version {version} at {path}{by} is newer than this stage2-data reads "
            f"(version {OFFLINE_DATASET_VERSION}).",
            fix="upgrade stage2-data where you read it (`pip install -U stage2-data`, or the version "
            "that wrote the store), then open it again",
        )
    if type(version) is not int or version != OFFLINE_DATASET_VERSION:
        raise StoreVersionError(
            f"Unsupported VIN offline store version: {version_words(version)}. Expected {OFFLINE_DATASET_VERSION}.",
            fix=f"rebuild the store with the current writer: {rebuild_command(path, manifest)}",
        )


def load_manifest_strict(loc: StoreLocation) -> dict[str, Any]:
    """:func:`read_manifest`, then :func:`check_format_version`, then the manifest's shape
    (:mod:`.manifest_shape`; StoreValidationError naming each problem): what a reader accepts."""
    manifest = read_manifest(loc)
    check_format_version(loc, manifest)
    problems, _ = manifest_shape_problems(manifest, loc.display(loc.root / MANIFEST_NAME))
    if problems:
        raise StoreValidationError(
            f"VIN offline store {loc.url} has a damaged manifest",
            problems,
            fix=f"rebuild it: {rebuild_command(loc.url, manifest)}",
        )
    return manifest


def rebuild_command(path: str | os.PathLike[str] | StoreLocation, manifest: dict[str, Any] | None) -> str:
    """The command that rebuilds the store at ``path`` (a location: its URL on object storage)
    with the current writer.

    The data root is the one the store lives in when ``path`` follows the layout
    ``<DATA_ROOT>/stores/<profile>/<id>`` (so a moved or copied data root rebuilds itself, not the
    place it was built in); otherwise the one recorded in ``manifest["local"]``. Without a manifest
    (no store at ``path``: the command builds one) the layout's data root is named only when that
    folder exists: a path that leads nowhere names no data root to build into, and the command says
    to pass the one ``stage2 build`` filled. The profile path (and the kit root when it was not the
    profile's folder) come from ``manifest["local"]``; without them a ``PROFILE.toml`` placeholder
    is printed. No ``--endpoint``: archives already verified in the
    data root are never requested again, so the command runs offline; missing ones come from the
    real hub (add ``--endpoint URL`` for a mirror).
    """
    if isinstance(path, StoreLocation):  # a location's root has no scheme: its URL says where it is
        path = path.root if path.is_local else path.url
    local = manifest.get("local") if isinstance(manifest, dict) else None
    profile_path = local.get("profile_path") if isinstance(local, dict) else None
    data_root = local.get("data_root") if isinstance(local, dict) else None
    kit_root = local.get("kit_root") if isinstance(local, dict) else None
    p = Path(path).absolute()
    # (object storage: the data root recorded by the writer, if any)
    if not is_url(os.fspath(path)) and len(p.parents) >= 3 and p.parent.parent.name == "stores":
        data_root = str(p.parents[2])
        if manifest is None and not p.parents[2].is_dir():
            data_root = _UNKNOWN_DATA_ROOT
    if not isinstance(data_root, str) or not data_root:
        data_root = "DATA_ROOT"
    if not isinstance(profile_path, str) or not profile_path:
        profile_path = "PROFILE.toml"
    cmd = ["stage2", "build", "--profile", profile_path, "--data-root", data_root]
    if isinstance(kit_root, str) and kit_root and Path(kit_root) != Path(profile_path).parent:
        cmd += ["--kit-root", kit_root]
    remote = is_url(os.fspath(path))
    if remote:  # <stores url>/<profile>/<store>: built again under the same stores URL
        cmd += ["--store-url", os.fspath(path).rstrip("/").rsplit("/", 2)[0]]
    line = " ".join(w if w == _UNKNOWN_DATA_ROOT else shlex.quote(w) for w in cmd)
    # the storage options are not known here (and may hold credentials): a shell comment says so
    return f"{line}  # with a --storage-option KEY=VALUE for each option you read it with" if remote else line


# ----- fingerprint ---------------------------------------------------------------------------------
def fingerprint_of(manifest: dict[str, Any], files: Sequence[tuple[str, str]]) -> str:
    """sha256 over the sorted (relative path, sha256) of every data file and the canonical JSON of the
    manifest without :data:`.format.FINGERPRINT_EXCLUDED` (time, the fingerprint, this machine's paths)."""
    body = {k: v for k, v in manifest.items() if k not in FINGERPRINT_EXCLUDED}
    doc = {"files": sorted([list(f) for f in files]), "manifest": body}
    return hashlib.sha256(canonical_json(doc).encode("utf-8")).hexdigest()


def manifest_data_files(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """(relative path, sha256) of every data file the manifest lists (metadata files and shards)."""
    out = [(f["path"], f["sha256"]) for f in manifest.get("files", [])]
    for sh in manifest.get("shards", []):
        out += [(f["path"], f["sha256"]) for f in sh.get("files", [])]
    return out


def store_fingerprint(
    path: str | os.PathLike[str] | StoreLocation, storage_options: dict[str, Any] | None = None
) -> str:
    """Recompute the fingerprint from the files on disk (hashes every data file) and the manifest.

    sha256 over the sorted (relative path, sha256) of every data file (shards, sample_index.jsonl,
    pairs.jsonl, splits) and the canonical JSON of the manifest without ``created_at``,
    ``fingerprint`` and ``local`` (this machine's paths). The writer stores the same value in
    ``manifest["fingerprint"]``.
    """
    loc = StoreLocation.parse(path, storage_options)
    root = loc.root
    manifest = read_manifest(loc)
    rels = [r for r in loc.tree_files(root) if r != MANIFEST_NAME]
    hashes = loc.sha256_files([root / r for r in rels])
    return fingerprint_of(manifest, [(r, hashes[str(root / r)]) for r in rels])
