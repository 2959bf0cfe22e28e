"""One trajectory of a store as a Rerun recording (``.rrd``): what LeRobot's dataset visualizer and
most robotics teams open to look at episodes (``rerun traj.rrd``).

The recording holds, on a ``frame`` timeline (the frame's index in the trajectory):

* ``camera``: each frame as stored (``rr.Image``, RGB, never flipped or resized);
* ``actions/<j>``: the trajectory's aligned actions, one scalar series per action dimension, on
  the same frames (none when the trajectory has no actions);

and, as static entries, ``task`` (the task text) and ``info`` (sample key, source, split, quality
label, length, resolution, the store's folder and fingerprint). Its recording id is the sample key,
so a second export of the same sample is the same recording to the viewer.

Rerun is an optional dependency (the ``rerun`` extra, or ``pip install rerun-sdk``); without it the export is a
named error that says so, and nothing else in the package needs it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PreviewError
from .page import _safe, out_path

#: the Rerun application id of every recording this module writes
APP_ID = "stage2_data"


@dataclass(frozen=True)
class RrdExport:
    """What :func:`export_rrd` wrote."""

    out: Path
    sample_index: int
    sample_key: str
    num_frames: int
    action_width: int
    bytes: int


def _rerun() -> Any:
    try:
        import rerun
    except ImportError:
        from ..cli import install_line  # from the checkout or wheel installed (on no package index)

        raise PreviewError(
            "exporting to a Rerun recording needs the rerun-sdk package, which is not installed.",
            fix=f"{install_line('rerun')} (or pip install rerun-sdk)",
        ) from None
    return rerun


def find_sample(reader: Any, sample: str | int) -> int:
    """The index of ``sample`` in the store: an index (``12``) or a sample key. PreviewError names the
    store's range and, for an unknown key, a few keys it holds."""
    rows = reader.sample_index
    where = f"store {reader.resolved} ({len(rows)} samples)"
    text = str(sample).strip()
    if text.lstrip("-").isdigit():
        i = int(text)
        if not 0 <= i < len(rows):
            raise PreviewError(
                f"sample {i} is out of range for {where}.", fix=f"give an index from 0 to {len(rows) - 1}"
            )
        return i
    for i, r in enumerate(rows):
        if r["sample_key"] == text:
            return i
    some = ", ".join(r["sample_key"] for r in rows[:3])
    raise PreviewError(
        f"no sample with key {text!r} in {where}.",
        fix=f"give a sample index or one of its keys (e.g. {some}; the store's sample_index.jsonl lists them all)",
    )


def default_rrd_out(reader: Any, sample_key: str) -> Path:
    """``stage2-<store>-<sample key>.rrd`` in the working directory (never inside the store)."""
    name = Path(str(reader.resolved).rstrip("/")).name or "store"
    return Path(f"stage2-{_safe(name)}-{_safe(sample_key)}.rrd")


def export_rrd(reader: Any, sample: str | int, out: str | os.PathLike[str] | None = None) -> RrdExport:
    """Write sample ``sample`` (an index or a sample key) of an open store reader as a Rerun
    recording at ``out`` (default :func:`default_rrd_out`; a folder: that name inside it), atomically:
    a temp file next to it, renamed when complete. Frames and actions are read (and checksummed) by
    the strict reader. Raises PreviewError (rerun missing, unknown sample, unwritable ``out``) and
    StoreError (a damaged store)."""
    rr = _rerun()
    i = find_sample(reader, sample)
    meta = reader.sample_index[i]
    key = str(meta["sample_key"])
    path = out_path(out, default_rrd_out(reader, key), "trajectory.rrd")
    parent = path.parent if str(path.parent) else Path(".")
    frames = reader.read_frames(i)  # every read checks its chunk's crc32c
    actions = reader.read_actions(i)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        rec = rr.RecordingStream(APP_ID, recording_id=key)
        rec.save(str(tmp))
        info = {
            "sample_index": i,
            "sample_key": key,
            "source": meta.get("source"),
            "split": meta.get("split"),
            "quality_label": meta.get("quality_label"),
            "num_frames": int(meta["num_frames"]),
            "resolution": f"{frames.shape[1]}x{frames.shape[2]}",
            "store": str(reader.resolved),
            "fingerprint": reader.fingerprint,
        }
        rec.log("task", rr.TextDocument(str(meta.get("task") or "")), static=True)
        text = "\n".join(f"{k}: {v}" for k, v in info.items())
        rec.log("info", rr.TextDocument(text), static=True)
        for t in range(frames.shape[0]):
            rec.set_time("frame", sequence=t)
            rec.log("camera", rr.Image(np.ascontiguousarray(frames[t])))
            if actions is not None:
                for j in range(actions.shape[1]):
                    rec.log(f"actions/{j}", rr.Scalars(float(actions[t, j])))
        rec.flush()
        rec.disconnect()
        size = tmp.stat().st_size
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise PreviewError(f"--out {path}: cannot write it: {reason}.", fix="choose another --out") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return RrdExport(
        out=path,
        sample_index=i,
        sample_key=key,
        num_frames=int(frames.shape[0]),
        action_width=0 if actions is None else int(actions.shape[1]),
        bytes=size,
    )
