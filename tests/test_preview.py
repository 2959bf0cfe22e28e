"""Seeing a store's frames: the contact sheets, the length histogram, `stage2 preview` (the PNG it
writes opened and checked pixel by pixel against the stored frames), its named errors, and the
vin_store asset's metadata people read (images, tables, sizes, how to open the store)."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.cli import python, stage2
from PIL import Image
from test_store import PROFILE, frames_npz

from stage2_data.cli import main
from stage2_data.errors import PreviewError, StoreNotFoundError
from stage2_data.preview import (
    contact_sheet,
    frame_indices,
    length_bins,
    pick_samples,
    png_bytes,
    preview_metadata,
    store_preview,
)
from stage2_data.store import PairSpec, SampleSpec, VinOfflineStoreReader, VinOfflineWriter

# source -> (frame height, width): every height divides the sheet's 96 px rows, so a frame is enlarged
# by a whole factor and every stored pixel can be found on the sheet; "wide" is reduced (factor 1/2)
SOURCES = {"alpha": (12, 16), "beta": (24, 32), "gamma": (32, 24), "wide": (192, 256)}
PER_SOURCE = {"alpha": 7, "beta": 5, "gamma": 2, "wide": 3}


def _frames(seed: int, t: int, h: int, w: int) -> np.ndarray:
    """Frames whose top differs from their bottom (so a flip shows), different per sample and per frame."""
    rng = np.random.default_rng(seed)
    fr = rng.integers(0, 256, size=(t, h, w, 3), dtype=np.uint8)
    fr[:, : h // 4] = (np.array([250, 30, 30]) * ((seed % 5 + 1) / 5)).astype(np.uint8)  # a red top band
    return fr


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small store of four sources, published as ``stores/<profile>/current`` like a build's."""
    root = tmp_path_factory.mktemp("preview")
    samples, frames = [], {}
    i = 0
    for source, (h, w) in SOURCES.items():
        for k in range(PER_SOURCE[source]):
            i += 1
            key = f"{i:08x}-0000-4000-8000-{i:012x}"
            t = 1 + (i * 5) % 9 if source != "wide" else 3
            fr = _frames(i, t, h, w)
            path = root / "up" / source / f"trajectory_{key}.npz"
            path.parent.mkdir(parents=True, exist_ok=True)
            frames_npz(path, fr)
            frames[key] = fr
            samples.append(
                SampleSpec(
                    sample_key=key,
                    cache_key=f"cache_{source}",
                    source=source,
                    task=f"put the {source} block number {k} on the plate and then close the drawer",
                    quality_label=("successful", "suboptimal", "failure")[k % 3],
                    partial_success=None if k % 2 else 0.5,
                    is_robot=True,
                    split=("train", "val", "test")[k % 3],
                    frames_path=path,
                    sidecar_path=None,
                    action_status="source_has_no_actions",
                )
            )
    pairs = [PairSpec("p1", "train", "t", samples[0].sample_key, samples[3].sample_key)]
    stores = root / "stores" / PROFILE["name"]
    out = stores / "v1-0123456789abcdef"
    VinOfflineWriter(
        out, profile=PROFILE, inputs={"x": "1" * 64}, profile_path=root / "p.toml", data_root=root
    ).write(samples, pairs)
    (stores / "current").symlink_to(out.name)
    return {"path": out, "current": stores / "current", "frames": frames}


def _pixels(png: bytes | Path) -> np.ndarray:
    data = png.read_bytes() if isinstance(png, Path) else png
    with Image.open(io.BytesIO(data)) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        return np.asarray(im)


# ----- the library -----------------------------------------------------------------------------------
def test_contact_sheet_shows_each_frame_as_stored_never_flipped(store: dict[str, Any]) -> None:
    with VinOfflineStoreReader(store["path"]) as reader:
        for source, (h, _w) in SOURCES.items():
            sheet = contact_sheet(reader, source, 3)
            px = np.asarray(sheet.image)
            assert sheet.total == PER_SOURCE[source] and len(sheet.samples) == min(3, PER_SOURCE[source])
            assert {c.sample_index for c in sheet.cells} == {int(r["sample_index"]) for r in sheet.samples}
            for c in sheet.cells:
                row = reader.sample_index[c.sample_index]
                assert row["source"] == source
                frame = store["frames"][row["sample_key"]][c.frame]
                x0, y0, x1, y1 = c.box
                cell = px[y0:y1, x0:x1].astype(int)
                if h <= 96:  # enlarged by a whole factor: every stored pixel is there, row 0 on top
                    f = 96 // h
                    assert cell.shape == (h * f, frame.shape[1] * f, 3)
                    assert np.array_equal(cell[::f, ::f], frame)
                else:  # reduced by 2: each pixel the mean of a 2x2 block
                    blocks = frame.reshape(h // 2, 2, frame.shape[1] // 2, 2, 3).astype(int).mean(axis=(1, 3))
                    assert cell.shape == blocks.shape and np.abs(cell - blocks).max() <= 1
            # first, middle and last frame of each sample shown
            for r in sheet.samples:
                shown = [c.frame for c in sheet.cells if c.sample_index == int(r["sample_index"])]
                assert shown == frame_indices(int(r["num_frames"])) and shown[-1] == r["num_frames"] - 1


def test_only_the_samples_shown_are_decoded(store: dict[str, Any]) -> None:
    class Counting(VinOfflineStoreReader):
        read: list[int] = []

        def read_frames(self, i: int) -> np.ndarray:
            self.read.append(i)
            return super().read_frames(i)

    with Counting(store["path"]) as reader:
        p = store_preview(reader, n=2)
        assert sorted(reader.read) == sorted(int(r["sample_index"]) for s in p.sheets for r in s.samples)
        assert len(reader.read) == sum(min(2, n) for n in PER_SOURCE.values()) < reader.num_samples
        # spread over the source, in store order: the first, then every len/n-th
        alpha = [r for r in reader.sample_index if r["source"] == "alpha"]
        assert pick_samples(reader.sample_index, "alpha", 2) == [alpha[0], alpha[3]]
        assert pick_samples(reader.sample_index, "gamma", 5) == [
            r for r in reader.sample_index if r["source"] == "gamma"
        ]


def test_same_store_same_png_bytes(store: dict[str, Any]) -> None:
    with VinOfflineStoreReader(store["path"]) as a, VinOfflineStoreReader(store["current"]) as b:
        assert store_preview(a).png() == store_preview(b).png()
        assert png_bytes(contact_sheet(a, "beta", 2).image) == png_bytes(contact_sheet(b, "beta", 2).image)


def test_length_histogram_bins() -> None:
    b = length_bins([3, 3, 4, 9])
    assert (b.starts, b.width, b.counts) == ([3, 4, 5, 6, 7, 8, 9], 1, [2, 1, 0, 0, 0, 0, 1])
    wide = length_bins(list(range(1, 1001)))
    assert len(wide.counts) <= 40 and sum(wide.counts) == 1000 and wide.starts[0] == 1
    assert length_bins([]).counts == []


def test_library_errors_are_named(store: dict[str, Any]) -> None:
    with VinOfflineStoreReader(store["path"]) as reader:
        with pytest.raises(PreviewError, match="its sources are: alpha, beta, gamma, wide"):
            store_preview(reader, source="delta")
        with pytest.raises(PreviewError, match="at least 1"):
            store_preview(reader, n=0)


# ----- stage2 preview ---------------------------------------------------------------------------------
def test_cli_writes_the_png_people_look_at(
    store: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sheet.png"
    assert main(["preview", str(store["current"]), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["out"] == str(out) and doc["bytes"] == out.stat().st_size and doc["size"].endswith("KiB")
    assert sorted(doc["sources"]) == sorted(SOURCES)
    assert {s: d["samples"] for s, d in doc["sources"].items()} == PER_SOURCE
    px = _pixels(out)
    assert px.shape == (doc["height"], doc["width"], 3)
    assert px.std() > 20  # not blank
    with VinOfflineStoreReader(store["current"]) as reader:
        p = store_preview(reader)
        assert p.png() == out.read_bytes()  # the file is the library's page, byte for byte
        cells = p.cells()
    # distinct trajectories look different on the page; each cell is the stored frame (enlarged)
    firsts = [c for c in cells if c.frame == 0]
    crops = {c.sample_index: px[c.box[1] : c.box[3], c.box[0] : c.box[2]] for c in firsts}
    assert len(crops) == sum(min(3, n) for n in PER_SOURCE.values())
    assert all(crop.std() > 20 for crop in crops.values())
    same_shape = [k for k in crops if crops[k].shape == crops[firsts[0].sample_index].shape]
    assert len(same_shape) >= 2
    assert not np.array_equal(crops[same_shape[0]], crops[same_shape[1]])

    # one source, fewer trajectories: a smaller page; the text output names the file
    out2 = tmp_path / "beta.png"
    assert main(["preview", str(store["current"]), "--source", "beta", "--n", "1", "--out", str(out2)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith(f"wrote {out2} (") and "beta" in text and "alpha" not in text
    small = _pixels(out2)
    assert small.shape[0] < px.shape[0] and small.std() > 20


def test_cli_starts_without_pillow_and_spells_the_librarys_defaults() -> None:
    from stage2_data import preview
    from stage2_data.commands import preview as command

    assert (command.DEFAULT_N, command.MAX_N) == (preview.DEFAULT_N, preview.MAX_N)
    r = python("import sys, stage2_data.cli as c; c.make_parser(); print('PIL' in sys.modules)")
    assert r.returncode == 0 and r.stdout.strip() == "False", r.tail()


def test_cli_default_out_is_printed(store: dict[str, Any], tmp_path: Path) -> None:
    r = stage2("preview", str(store["current"]), "--source", "alpha", cwd=tmp_path)
    assert r.returncode == 0, r.tail()
    want = tmp_path / f"stage2-preview-{store['path'].name}-alpha.png"
    assert r.stdout.splitlines()[0].startswith(f"wrote {want} (")
    assert _pixels(want).std() > 20
    # a folder as --out: the default name inside it
    sub = tmp_path / "sheets"
    sub.mkdir()
    assert main(["preview", str(store["path"]), "--out", str(sub)]) == 0
    assert (sub / f"stage2-preview-{store['path'].name}.png").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--source", "delta"],
            "--source 'delta': store .* has no sample of that source; its sources are: "
            "alpha, beta, gamma, wide. Fix: pass one of them",
        ),
        (["--n", "0"], "--n 0: the number of trajectories per source must be at least 1. Fix: pass --n 1"),
        (["--n", "-3"], "--n -3: the number of trajectories"),
        (
            ["--out", "{file}/sheet.png"],
            "--out .*/a-file/sheet.png: cannot write there: .*/a-file is not a folder",
        ),
        (
            ["--out", "{tmp}/no/such/folder/s.png"],
            "--out .*/s.png: cannot write there: .*/no/such/folder does not exist",
        ),
        (
            ["--out", "{tmp}/sheet.jpg"],
            r"--out .*/sheet.jpg: this writes a PNG file, and the name says .jpg. "
            r"Fix: name it with .png \(e.g. --out .*/sheet.png\)",
        ),
    ],
    ids=["unknown-source", "n-zero", "n-negative", "out-under-a-file", "out-folder-missing", "out-not-png"],
)
def test_cli_refusals_name_the_culprit_and_write_nothing(
    store: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "a-file").write_text("x")
    args = [a.format(file=tmp_path / "a-file", tmp=tmp_path) for a in args]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["preview", str(store["current"]), *args]) == 2
    err = capsys.readouterr().err
    assert re.search("stage2 preview: error: " + message, err), err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_cli_refuses_a_missing_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preview", str(tmp_path / "no-store")]) == 2
    err = capsys.readouterr().err
    assert "stage2 preview: error: no complete VIN offline store at" in err and "Fix:" in err
    with pytest.raises(StoreNotFoundError):
        VinOfflineStoreReader(tmp_path / "no-store")


def test_cli_unwritable_folder(
    store: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder the user may not write to: a read-only folder, or (root writes anywhere else) sysfs,
    where the kernel refuses to create a file even for root."""
    import os

    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o500)
        want = "is not writable"
    else:
        folder = Path("/sys")
        want = "cannot write it: Permission denied. Fix: choose another --out"
        assert folder.is_dir(), "sysfs is not mounted at /sys"
    assert main(["preview", str(store["path"]), "--out", str(folder / "s.png")]) == 2
    err = capsys.readouterr().err
    assert want in err and len(err.strip().splitlines()) == 1, err
    assert not (folder / "s.png").exists()


# ----- the vin_store asset's metadata -----------------------------------------------------------------
def test_preview_metadata_images_and_the_open_snippet_runs(store: dict[str, Any], tmp_path: Path) -> None:
    from stage2_data.preview import open_markdown

    with VinOfflineStoreReader(store["current"]) as reader:
        md = preview_metadata(reader)
    sheets = md["contact_sheets"]["__markdown__"]
    images = re.findall(r"!\[contact sheet of (\w+)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", sheets)
    assert [s for s, _ in images] == sorted(SOURCES)
    for _, b64 in images:
        assert _pixels(base64.b64decode(b64)).std() > 20
    (hist,) = re.findall(
        r"!\[frames per sample\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)",
        md["length_histogram"]["__markdown__"],
    )
    assert _pixels(base64.b64decode(hist)).std() > 5
    # bounded: past the budget the sources left out are named (the first sheet is always shown)
    with VinOfflineStoreReader(store["current"]) as reader:
        small = preview_metadata(reader, max_chars=1)["contact_sheets"]["__markdown__"]
    assert small.count("data:image/png") == 1
    assert small.endswith(
        "…and 3 more source(s) (beta, gamma, wide): see them with `stage2 preview STORE --source S`"
    )
    text = open_markdown(str(store["current"]), str(store["path"]))
    assert len(text) < 1000  # the UI shows it inline (it folds Markdown of 1000 characters or more)
    assert f"`{store['current']}`" in text and f"stage2 preview {store['current']}" in text
    (snippet,) = re.findall(r"```python\n(.*?)\n```", text, re.S)
    assert len(snippet.splitlines()) == 3
    r = python(snippet + "\nprint(sample['source'], sample['frames'].shape, ds.fingerprint)", cwd=tmp_path)
    assert r.returncode == 0, r.tail()
    with VinOfflineStoreReader(store["current"]) as reader:
        assert r.stdout.split()[-1] == reader.fingerprint


def test_preview_metadata_is_the_same_drawn_on_one_thread_or_several(
    store: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sheets are drawn on a few threads and taken in source order: byte for byte what one thread
    draws, within the budget and past it."""
    import stage2_data.preview.report as report

    got = []
    for threads in (1, 4):
        monkeypatch.setattr(report, "PREVIEW_THREADS", threads)
        with VinOfflineStoreReader(store["current"]) as reader:
            got.append((preview_metadata(reader), preview_metadata(reader, max_chars=30_000)))
    assert got[0] == got[1]
    assert got[0][0] != got[0][1]  # the budget cut the second one


def test_asset_metadata_is_tables_and_sizes_not_json(store: dict[str, Any]) -> None:
    import dagster as dg

    from stage2_assets._common import to_metadata
    from stage2_assets.store import with_preview
    from stage2_data.checks import CheckOutcome
    from stage2_data.steps import StepResult

    md = to_metadata(
        {
            "bytes": 3 * 1024 * 1024,
            "bytes_on_disk": 1536,
            "archive_bytes": 10,
            "bytes_on_disk_per_block": {"frames": 2048, "total": 4096},
            "retention": {"keep": 1, "removed": [], "kept": ["v1-a (current)"], "freed_bytes": 0},
            "archives": ["a.tar.part-00", "a.tar.part-01"],
            "failed_partitions": [],
        }
    )
    assert md["bytes"] == 3 * 1024 * 1024 and md["size"] == dg.MetadataValue.text("3.0 MiB")
    assert md["size_on_disk"] == dg.MetadataValue.text("1.5 KiB") and md["archive_size"].text == "10 B"
    assert not any(isinstance(v, dg.JsonMetadataValue) for v in md.values())
    assert md["bytes_on_disk_per_block"].md_str.splitlines() == [
        "| bytes_on_disk_per_block | value |",
        "|---|---|",
        "| frames | 2.0 KiB (2,048 B) |",
        "| total | 4.0 KiB (4,096 B) |",
    ]
    assert "| kept | v1-a (current) |" in md["retention"].md_str
    assert "| freed_bytes | 0 B (0 B) |" in md["retention"].md_str
    assert md["archives"].md_str.splitlines()[2:] == ["| a.tar.part-00 |", "| a.tar.part-01 |"]
    assert md["failed_partitions"] == dg.MetadataValue.text("none")

    # the store step's result gains the published path, the snippet and the images; a failed one nothing
    ok = with_preview(
        StepResult({"store": str(store["path"])}, [CheckOutcome("c", True, "ok", {})]),
        str(store["current"]),
        None,
    )
    shown = to_metadata(ok.metadata)
    assert {"open", "length_histogram", "contact_sheets"} <= set(shown)
    assert all(
        isinstance(shown[k], dg.MarkdownMetadataValue) for k in ("open", "length_histogram", "contact_sheets")
    )
    bad = with_preview(
        StepResult({"store": str(store["path"])}, [CheckOutcome("c", False, "bad", {})]),
        str(store["current"]),
        None,
    )
    assert set(bad.metadata) == {"store"}


def test_cli_out_ending_in_a_slash_is_a_folder_made_when_new(store: dict[str, Any], tmp_path: Path) -> None:
    """`--out DIR/` (a trailing slash) is a folder, as the help says: made when it does not exist,
    with the default name inside; never a file named DIR."""
    new = tmp_path / "new" / "sheets"
    p = stage2("preview", str(store["current"]), "--out", f"{new}/", "--json", timeout=120)
    assert p.returncode == 0, p.tail()
    out = Path(p.json()["out"])
    assert new.is_dir() and out.parent == new and out.name.startswith("stage2-preview-"), out
    assert _pixels(out).std() > 20
    # a file in the way of DIR/ is named, and left alone
    (tmp_path / "afile").write_bytes(b"x")
    f = stage2("preview", str(store["current"]), "--out", f"{tmp_path / 'afile'}/", timeout=120)
    assert f.returncode == 2 and "is not a folder" in f.stderr, f.tail()
    assert (tmp_path / "afile").read_bytes() == b"x"
    # the same rule for export-rrd
    r = stage2(
        "export-rrd", str(store["current"]), "0", "--out", f"{tmp_path / 'rrds'}/", "--json", timeout=120
    )
    assert r.returncode == 0, r.tail()
    assert Path(r.json()["out"]).parent == tmp_path / "rrds"
