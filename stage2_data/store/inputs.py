"""Inspection of a build's inputs: trajectory ``.npz`` (or decoded ``.npy``) frame files and action
sidecars, from their ``.npy`` headers and small keys only (the big arrays are never inflated here),
read with :mod:`stage2_data.formats.npz`.

Every check appends problems naming the file; the writer re-checks the same facts on the arrays it
loads (:func:`check_frames_meta`, :func:`check_actions_meta`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..formats import FormatError
from ..formats.npz import (
    member_array,
    member_header,
    npz_members,
    read_npy_file_header,
)
from .format import MAX_ACTION_WIDTH


def _reason(e: BaseException) -> object:
    """The reason alone (a FormatError's file/member prefix would repeat the file)."""
    return e.detail if isinstance(e, FormatError) else e


@dataclass(frozen=True)
class FramesInfo:
    num_frames: int
    height: int
    width: int


def inspect_frames_npz(path: Path, problems: list[str]) -> FramesInfo | None:
    """Check a trajectory npz from its headers and small keys; append problems naming the file."""
    n0 = len(problems)
    if Path(path).suffix == ".npy":  # already decoded frames (T, H, W, 3) uint8, e.g. a pre-decoded cache
        try:
            npy = read_npy_file_header(path)
        except FileNotFoundError:
            problems.append(f"{path}: frames file does not exist")
            return None
        except (OSError, ValueError, EOFError, SyntaxError) as e:
            problems.append(f"{path}: not a readable .npy ({_reason(e)})")
            return None
        shape = npy.shape
        return check_frames_meta(
            path,
            shape,
            npy.dtype,
            np.array(shape, dtype=np.int64),
            np.array(shape[0] if shape else 0, dtype=np.int64),
            problems,
        )
    try:
        with open(path, "rb") as fh:  # one read: these files are small (the frames are not inflated)
            data = fh.read()
        members = npz_members(data, file=str(path))
        for key in ("frames", "shape", "num_frames"):
            if key not in members:
                problems.append(
                    f"{path}: missing key {key!r} (a trajectory npz holds frames, shape, num_frames)"
                )
        if len(problems) > n0:
            return None
        hdr = member_header(data, members["frames"], file=str(path))
        shape_arr = member_array(data, members["shape"], file=str(path))
        nf_arr = member_array(data, members["num_frames"], file=str(path))
    except FileNotFoundError:
        problems.append(f"{path}: frames file does not exist")
        return None
    except OSError as e:
        problems.append(f"{path}: not a readable npz ({e})")
        return None
    except FormatError as e:  # FileTypeError too: the bytes are another format
        if "object" in e.detail:
            problems.append(f"{path}: refused ({_reason(e)}); object/pickled arrays are not allowed")
        else:
            problems.append(f"{path}: not a readable npz ({_reason(e)})")
        return None
    return check_frames_meta(path, hdr.shape, hdr.dtype, shape_arr, nf_arr, problems)


def check_frames_meta(
    path: Path,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    shape_arr: np.ndarray[Any, Any],
    nf_arr: np.ndarray[Any, Any],
    problems: list[str],
) -> FramesInfo | None:
    n0 = len(problems)
    if dtype.hasobject:
        problems.append(f"{path}: 'frames' holds objects; expected uint8")
    elif dtype != np.uint8:
        problems.append(f"{path}: 'frames' has dtype {dtype}; expected uint8")
    if len(shape) != 4 or shape[3] != 3:
        problems.append(f"{path}: 'frames' has shape {shape}; expected (T, H, W, 3)")
    elif min(shape) <= 0:
        problems.append(f"{path}: 'frames' has an empty shape {shape}")
    if shape_arr.dtype.kind not in "iu" or shape_arr.ndim != 1:
        problems.append(f"{path}: 'shape' is not a 1-D integer array")
    elif tuple(int(x) for x in shape_arr) != shape:
        problems.append(f"{path}: 'shape' says {tuple(int(x) for x in shape_arr)} but 'frames' is {shape}")
    if nf_arr.dtype.kind not in "iu" or nf_arr.size != 1:
        problems.append(f"{path}: 'num_frames' is not an integer scalar")
    elif len(shape) >= 1 and int(nf_arr.reshape(())) != shape[0]:
        problems.append(f"{path}: 'num_frames' says {int(nf_arr.reshape(()))} but 'frames' holds {shape[0]}")
    if len(problems) > n0:
        return None
    return FramesInfo(shape[0], shape[1], shape[2])


def inspect_sidecar_npz(path: Path, num_frames: int | None, problems: list[str]) -> int | None:
    """Width of a sidecar's ``aligned_actions`` (T, W), from its header; problems name the file."""
    try:
        with open(path, "rb") as fh:  # one read, as for the frames files (only a header is inflated)
            data = fh.read()
        members = npz_members(data, file=str(path))
        if "aligned_actions" not in members:
            problems.append(f"{path}: missing key 'aligned_actions'")
            return None
        hdr = member_header(data, members["aligned_actions"], file=str(path))
    except FileNotFoundError:
        problems.append(f"{path}: sidecar file does not exist")
        return None
    except (OSError, FormatError) as e:
        problems.append(f"{path}: not a readable npz ({_reason(e)})")
        return None
    return check_actions_meta(path, hdr.shape, hdr.dtype, num_frames, problems)


def check_actions_meta(
    path: Path, shape: tuple[int, ...], dtype: np.dtype[Any], num_frames: int | None, problems: list[str]
) -> int | None:
    n0 = len(problems)
    if dtype.kind != "f":
        problems.append(f"{path}: 'aligned_actions' has dtype {dtype}; expected a float array")
    if len(shape) != 2:
        problems.append(f"{path}: 'aligned_actions' has shape {shape}; expected (T, W)")
    else:
        if num_frames is not None and shape[0] != num_frames:
            problems.append(
                f"{path}: 'aligned_actions' has {shape[0]} rows but the trajectory has {num_frames} frames"
            )
        if not 1 <= shape[1] <= MAX_ACTION_WIDTH:
            problems.append(f"{path}: 'aligned_actions' width {shape[1]} is outside 1..{MAX_ACTION_WIDTH}")
    if len(problems) > n0:
        return None
    return shape[1]
