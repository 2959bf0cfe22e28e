"""One trajectory as a Rerun recording (`stage2 export-rrd`, stage2_data/preview/rrd.py): the .rrd is
read back with Rerun's own reader and every frame, action and text checked against the upstream
npz files the store was built from; refusals are one named line and write nothing."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_store import Upstream

from stage2_data.cli import main
from stage2_data.errors import PreviewError
from stage2_data.preview.rrd import export_rrd
from stage2_data.store import VinOfflineStoreReader

# the shared store (tests/fixtures/stores.py): 30 trajectories in shards of 4 rows
STORE_IDS = range(1, 31)
STORE_ROWS_PER_SHARD = 4

rerun_chunk = pytest.importorskip("rerun.chunk")


def _recording(path: Path) -> tuple[Any, dict[str, list[Any]]]:
    """The recording's store entry, and its chunks' record batches by entity path."""
    reader = rerun_chunk.RrdReader(path)
    (entry,) = reader.recordings()
    by_entity: dict[str, list[Any]] = {}
    for chunk in reader.stream(store=entry):
        by_entity.setdefault(chunk.entity_path, []).append(chunk.to_record_batch())
    return entry, by_entity


def _column(batches: list[Any], name: str) -> list[Any]:
    """One column over an entity's chunks, in ``frame`` order (static entries: as written)."""
    rows: list[tuple[int, Any]] = []
    for rb in batches:
        frames = rb.column("frame").to_pylist() if "frame" in rb.schema.names else [0] * rb.num_rows
        rows += list(zip(frames, rb.column(name).to_pylist(), strict=True))
    return [v for _, v in sorted(rows, key=lambda fv: fv[0])]


def test_a_trajectory_round_trips_through_rerun(
    store: Path, up: Upstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with VinOfflineStoreReader(store) as reader:
        i = next(k for k, r in enumerate(reader.sample_index) if int(r["action_width"]) > 0)
        meta = reader.sample_index[i]
    key = meta["sample_key"]
    out = tmp_path / "traj.rrd"
    assert main(["export-rrd", str(store), key, "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["out"] == str(out) and doc["bytes"] == out.stat().st_size and doc["sample_index"] == i
    assert not [p for p in tmp_path.iterdir() if p.name != "traj.rrd"]  # no temp file left

    entry, ents = _recording(out)
    assert entry.recording_id == key and entry.application_id == "stage2_data"
    want_frames, want_actions = up.frames[key], up.actions[key]
    assert want_actions is not None
    t, h, w, _ = want_frames.shape
    assert doc["num_frames"] == t and doc["action_width"] == want_actions.shape[1]
    images = _column(ents["/camera"], "Image:buffer")
    formats = _column(ents["/camera"], "Image:format")
    assert len(images) == t
    for k in range(t):
        (fmt,) = formats[k]
        assert (fmt["height"], fmt["width"]) == (h, w)
        (buf,) = images[k]
        assert np.array_equal(np.asarray(buf, dtype=np.uint8).reshape(h, w, 3), want_frames[k]), k
    for j in range(want_actions.shape[1]):
        series = [v[0] for v in _column(ents[f"/actions/{j}"], "Scalars:scalars")]
        assert np.array_equal(np.asarray(series, dtype=np.float32), want_actions[:t, j].astype(np.float32)), j
    (task,) = _column(ents["/task"], "TextDocument:text")
    assert task == [meta["task"]]
    (info,) = _column(ents["/info"], "TextDocument:text")
    assert f"sample_key: {key}" in info[0] and f"num_frames: {t}" in info[0]

    # by index, into a folder: the default name; a trajectory without actions has no action series
    with VinOfflineStoreReader(store) as reader:
        j = next(k for k, r in enumerate(reader.sample_index) if int(r["action_width"]) == 0)
        e = export_rrd(reader, j, tmp_path)
    assert e.out.parent == tmp_path and e.out.name.endswith(f"-{e.sample_key}.rrd") and e.action_width == 0
    assert not [p for p in _recording(e.out)[1] if p.startswith("/actions")]


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ("99", r"sample 99 is out of range for store .* \(30 samples\)\. Fix: give an index from 0 to 29"),
        (
            "no-such-key",
            r"no sample with key 'no-such-key' in store .*Fix: give a sample index or one of its keys",
        ),
    ],
)
def test_refusals_are_one_named_line_and_write_nothing(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sample: str, message: str
) -> None:
    assert main(["export-rrd", str(store), sample, "--out", str(tmp_path / "x.rrd")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert re.search("stage2 export-rrd: error: " + message, err), err
    assert list(tmp_path.iterdir()) == []


def test_without_rerun_the_error_says_what_to_install(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "rerun", None)  # what `import rerun` meets when it is not installed
    from stage2_data.cli import install_line

    with VinOfflineStoreReader(store) as reader, pytest.raises(PreviewError) as got:
        export_rrd(reader, 0, tmp_path / "x.rrd")
    assert install_line("rerun") in str(got.value) and "rerun-sdk" in str(got.value)
    assert list(tmp_path.iterdir()) == []
