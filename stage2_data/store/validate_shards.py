"""Validation of the shard folders and the files: array metadata (shapes, dtypes, the store's
layout), the crc32c of every stored chunk (read, not decompressed), the small per-row arrays against
the sample index, optionally every sample decoded as the reader decodes it, and every listed file
(present, its size, its sha256 where hashed: the files read whole always, every file when deep;
no file anywhere in the store that the manifest does not list, but the manifest itself).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from ..errors import CODE_ERRORS, StoreError
from ..storage import StoreLocation
from .format import (
    BLOCK_ACTIONS,
    BLOCK_DTYPES,
    BLOCK_FRAMES,
    BLOCK_NUM_FRAMES,
    BLOCK_WIDTH,
    MANIFEST_NAME,
    PAIRS_NAME,
    SAMPLE_INDEX_NAME,
    SHARDS_DIR,
    SPLIT_FILES,
    SPLITS_DIR,
    frames_sha256,
)
from .manifest_shape import is_file_entry
from .reader import VinOfflineStoreReader
from .shard_io import corrupt_chunks, shard_layout


def validate_arrays(
    loc: StoreLocation,
    shards: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    problems: list[str],
    *,
    decode: bool = False,
    checksums: bool = True,
) -> None:
    root = loc.root
    reader: VinOfflineStoreReader | None = None
    chunk_jobs: list[tuple[Path, str, Any, int]] = []
    if decode:
        try:
            reader = VinOfflineStoreReader(loc)
        except StoreError as e:
            problems.append(f"cannot decode the samples: {e}")
    for sh in shards:
        sdir_p = root / sh["dir"]
        sdir = loc.display(sdir_p)
        if not loc.is_dir(sdir_p):
            continue  # reported by the shard-count check
        rr = int(sh["num_rows"])
        tmax, h, w, _ = sh["frame_shape"]
        wmax = int(sh["action_width_max"])
        expected: dict[str, tuple[int, ...]] = {
            BLOCK_FRAMES: (rr, tmax, h, w, 3),
            BLOCK_NUM_FRAMES: (rr,),
            BLOCK_WIDTH: (rr,),
        }
        if wmax > 0:
            expected[BLOCK_ACTIONS] = (rr, tmax, wmax)
        store = loc.zarr_store(sdir_p, read_only=True)
        arrays: dict[str, Any] = {}
        before = len(problems)
        for name, shape in expected.items():
            try:
                arr = zarr.open_array(store=store, path=name, mode="r", zarr_format=3)
            except CODE_ERRORS:
                raise
            except Exception as e:  # noqa: BLE001 - any failure to open is a problem to report
                problems.append(f"{sdir}/{name}: cannot open the array ({type(e).__name__}: {e})")
                continue
            if tuple(arr.shape) != shape:
                problems.append(f"{sdir}/{name}: shape {tuple(arr.shape)}; expected {shape}")
            if str(arr.dtype) != BLOCK_DTYPES[name]:
                problems.append(f"{sdir}/{name}: dtype {arr.dtype}; expected {BLOCK_DTYPES[name]}")
            else:
                arrays[name] = arr
            if checksums:
                chunk_jobs.append((sdir_p, name, arr, int(sh["row_start"])))
        if wmax == 0 and loc.exists(sdir_p / "actions" / "aligned"):
            problems.append(f"{sdir}/{BLOCK_ACTIONS}: present but the manifest says action_width_max 0")
        mine = rows[int(sh["row_start"]) : int(sh["row_start"]) + rr]
        for name, col in ((BLOCK_NUM_FRAMES, "num_frames"), (BLOCK_WIDTH, "action_width")):
            if name not in arrays or len(mine) != rr or tuple(arrays[name].shape) != (rr,):
                continue
            try:
                got = np.asarray(arrays[name][...])
            except CODE_ERRORS:
                raise
            except Exception as e:  # noqa: BLE001
                problems.append(f"{sdir}/{name}: cannot read ({type(e).__name__}: {e})")
                continue
            want = np.array([r[col] for r in mine])
            bad = np.nonzero(got != want)[0]
            if bad.size:
                problems.append(
                    f"{sdir}/{name}: {bad.size} rows disagree with sample_index.jsonl's {col} (first row {int(bad[0])})"
                )
        # decoded only when its arrays are what the manifest says: the reader trusts their metadata
        if reader is not None and len(mine) == rr and BLOCK_FRAMES in arrays and len(problems) == before:
            _validate_decoded(reader, int(sh["id"]), sdir, wmax, mine, problems)
    if chunk_jobs:  # reading and crc32c release the GIL: a few arrays at once
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            found = pool.map(lambda j: _check_chunks(loc, j[0], j[1], j[2], j[3], rows), chunk_jobs)
            problems.extend(p for ps in found for p in ps)


def _validate_decoded(
    reader: VinOfflineStoreReader,
    sid: int,
    sdir: str,
    wmax: int,
    mine: list[dict[str, Any]],
    problems: list[str],
) -> None:
    """Decode one shard's rows the way training reads them (the strict reader, one row at a time on
    a few threads) and check each against the sample index: frames_sha256 over its ``num_frames``
    frames, zeros past them, and actions NaN past the row's length and width."""
    names = [BLOCK_FRAMES, *([BLOCK_ACTIONS] if wmax > 0 else [])]
    try:
        for name in names:
            reader._direct(sid, name)  # the shard index, read once before the threads share it
    except CODE_ERRORS:
        raise
    except Exception as e:  # noqa: BLE001 - a shard that cannot be opened is a problem to report
        problems.append(f"{sdir}: cannot decode ({type(e).__name__}: {e})")
        return

    def check(r: dict[str, Any]) -> list[str]:
        row, n, w = int(r["row"]), int(r["num_frames"]), int(r["action_width"])
        bad = []
        try:
            frames = reader._padded_row(sid, BLOCK_FRAMES, row)
            actions = reader._padded_row(sid, BLOCK_ACTIONS, row) if wmax > 0 else None
            if frames_sha256(frames[:n]) != r["frames_sha256"]:
                bad.append("frames_sha256")
            if frames[n:].any():
                bad.append("padding")
            if actions is not None and not (np.isnan(actions[n:]).all() and np.isnan(actions[:n, w:]).all()):
                bad.append("actions")
            if actions is not None and not np.isfinite(actions[:n, :w]).all():
                bad.append("nonfinite")
        except CODE_ERRORS:
            raise
        except Exception as e:  # noqa: BLE001 - whatever the bytes, a row that does not decode is a finding
            return [*bad, f"cannot decode ({type(e).__name__}: {e})"]
        return bad

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        found = list(pool.map(check, mine))
    what = {
        "frames_sha256": f"{BLOCK_FRAMES}: decoded frames disagree with sample_index.jsonl's frames_sha256",
        "padding": f"{BLOCK_FRAMES}: non-zero frames past num_frames",
        "actions": f"{BLOCK_ACTIONS}: values where NaN padding belongs (past the row's length or width)",
        "nonfinite": f"{BLOCK_ACTIONS}: non-finite values (NaN or inf) inside the row's length and width",
    }
    for key in [*what, *sorted({k for ks in found for k in ks} - set(what))]:
        rows = [j for j, ks in enumerate(found) if key in ks]
        if rows:
            keys = ", ".join(str(mine[j]["sample_key"]) for j in rows[:3])
            said = f"{sdir}/{what[key]}" if key in what else f"{sdir}: {key}"  # an array's, or the row's
            problems.append(f"{said} in {len(rows)} row(s) (first rows {rows[:3]}: {keys})")


def _check_chunks(
    loc: StoreLocation, sdir_p: Path, name: str, arr: Any, row_start: int, rows: list[dict[str, Any]]
) -> list[str]:
    """Every inner chunk of one array's shard object against its crc32c (read, never decompressed);
    a bad chunk is reported with the samples it holds."""
    sdir = loc.display(sdir_p)
    layout = shard_layout(arr)
    if layout is None:
        return [
            f"{sdir}/{name}: not in the store's layout (one shard; codecs bytes, blosc, crc32c; "
            "index bytes, crc32c)"
        ]
    path = sdir_p / name / layout.key
    try:
        if loc.is_local:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                bad = corrupt_chunks(lambda off, n: os.pread(f.fileno(), n, off), size, layout.nchunks, path)
        else:
            blob = loc.read_bytes(path)
            bad = corrupt_chunks(lambda off, n: blob[off : off + n], len(blob), layout.nchunks, path)
    except FileNotFoundError:
        return []  # reported with the listed files
    except (OSError, StoreError) as e:
        return [f"{loc.display(path)}: {e}"]
    if not bad:
        return []
    step = layout.inner[0]
    first = [row_start + k * step for k in bad[:3]]
    keys = ", ".join(str(rows[i]["sample_key"]) for i in first if 0 <= i < len(rows))
    return [
        f"{loc.display(path)}: {len(bad)} chunk(s) fail their crc32c (corrupt bytes), holding "
        f"samples {first}{' ...' if len(bad) > 3 else ''} ({keys})"
    ]


def validate_files(
    loc: StoreLocation,
    m: dict[str, Any],
    shards: list[dict[str, Any]],
    hashes: dict[str, str],
    problems: list[str],
    *,
    every: bool,
) -> None:
    """Every listed file present with its size, no file the manifest does not list anywhere in the
    store (but ``manifest.json`` itself: at every level), and the sha256 of each listed
    file in ``hashes`` (sha256 by relative path: every file's when the validation is deep, else
    those of the files read whole). ``every``: ``hashes`` holds every file, so a listed file without
    one is a problem too."""
    root = loc.root
    disp = loc.display
    top = m.get("files")
    listed: list[dict[str, Any]] = [f for f in top if is_file_entry(f)] if isinstance(top, list) else []
    for sh in shards:
        listed += sh["files"]
    listed_paths = {f["path"] for f in listed}
    for name in (SAMPLE_INDEX_NAME, PAIRS_NAME, *[f"{SPLITS_DIR}/{s}.npy" for s in SPLIT_FILES]):
        if name not in listed_paths:
            problems.append(f"{disp(root / MANIFEST_NAME)}: file {name} is not listed with its sha256")
    present: list[dict[str, Any]] = []
    remote_sizes = None if loc.is_local else loc.file_sizes()  # one listing, not a HEAD per file
    for f in listed:
        p = root / f["path"]
        if remote_sizes is None:
            size = p.stat().st_size if p.is_file() else -1
        else:
            size = remote_sizes.get(f["path"], -1)
        if size < 0:
            if not f["path"].startswith(SPLITS_DIR + "/"):  # missing split files are reported once, above
                problems.append(f"{disp(p)}: listed in the manifest but missing")
            continue
        if size != f["bytes"]:
            problems.append(f"{disp(p)}: {size} bytes; the manifest says {f['bytes']}")
        present.append(f)
    expected_dirs = {Path(sh["dir"]).name for sh in shards}
    sroot = root / SHARDS_DIR
    if remote_sizes is None:
        on_disk = loc.listdir_names(sroot)
        every_file = loc.tree_files(root)
    else:
        every_file = sorted(remote_sizes)
        on_disk = {r.split("/")[1] for r in every_file if r.startswith(SHARDS_DIR + "/")}
    for d in sorted(expected_dirs - on_disk):
        problems.append(f"{disp(sroot / d)}: shard folder missing")
    for d in sorted(on_disk - expected_dirs):
        problems.append(
            f"{disp(sroot / d)}: unexpected shard folder (the manifest lists {len(shards)} shards)"
        )
    # a store is exactly its manifest and the files it lists: anything else anywhere in it (a
    # top-level file, an extra split, a file in a shard folder) is not the store that was written
    for rel in every_file:
        if rel != MANIFEST_NAME and rel not in listed_paths:
            problems.append(f"{disp(root / rel)}: file not listed in the manifest")
    for f in present:
        if f["path"] not in hashes and not every:
            continue
        got = hashes.get(f["path"], "(not hashed)")
        if got != f["sha256"]:
            problems.append(f"{disp(root / f['path'])}: sha256 {got}; the manifest says {f['sha256']}")
