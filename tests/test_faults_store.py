"""The fault matrix, store rows: a frames file over the profile's frame bound is refused before the
store; a flipped byte in a published store is named at read time and by plain `stage2 validate`, and
the next build replaces the store; a rare long trajectory is not allowed to pad its shard.

The matrix: tests/faults_table.py (rows), tests/helpers/faults.py (what every row asserts).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import stage2
from helpers.faults import (
    Prepared,
    converge,
    copy_root,
    final_refused,
    no_store,
    restore,
    run_cfg,
    said,
    save,
)
from helpers.final import FINAL_STAGE

from stage2_data import checks as C
from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.extract import load_extraction_record
from stage2_data.store import (
    PairSpec,
    SampleSpec,
    StoreChecksumError,
    VinOfflineStoreReader,
    VinOfflineWriter,
)
from stage2_pipelines.runs import run_selection

# the rows that run the final stage use the matrix's instance; store_rare_long is a library test
dagster_rows = pytest.mark.usefixtures("fault_instance")


@dagster_rows
def test_fault_store_max_frames(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """The profile's frame bound below the demo's lengths: the store step refuses, naming each frames
    file and trajectory over it; nothing is published. The bound back: the clean fingerprint."""
    saved = save(demo.profile)
    text = demo.profile.read_text()
    assert "max_frames" not in text  # the default, 32
    demo.profile.write_text(text.replace("\n[source]", "max_frames = 3\n\n[source]", 1))
    r, root = final_refused(
        prepared, demo, tmp_path, "frames, more than max_frames 3", "trajectory ", check=C.STORE_OPENS_STRICT
    )
    assert "raise max_frames in the profile" in said(r)
    restore(saved)
    converge(prepared, run_cfg(demo, root), root, [])


@dagster_rows
def test_fault_store_input_edited(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """An extracted file edited after the extract stage checked it (size and mtime kept, as an edit
    in place can keep them): the store's job run on its own read it and published the edited text
    under the name the clean record's digest gives, and every later build reused that store. The
    join and the store writer check what they read against its record right before reading:
    refused, naming the cache directory and the file; nothing is published. Extracted again (the
    edited file moved aside), the store is the clean build's."""
    root = copy_root(prepared, tmp_path / "root")
    processed = root / layout.PROCESSED_DIR
    arrow = next(
        p for p in sorted(processed.glob("*/processed_dataset/*.arrow")) if b" the " in p.read_bytes()
    )
    key = arrow.relative_to(processed).parts[0]
    st = arrow.stat()
    data = arrow.read_bytes()
    with open(arrow, "r+b") as f:  # in place: same inode, same size
        f.write(data.replace(b" the ", b" THE ", 1))
    os.utime(arrow, ns=(st.st_atime_ns, st.st_mtime_ns))
    cfg = run_cfg(demo, root)
    r = run_selection(cfg, FINAL_STAGE)
    text = said(r)
    assert not r["success"] and "vin_store" not in r["materialized"], text
    for part in (f"cache_dir[{key}]", "changed since it was checked", "run `stage2 build` again"):
        assert part in text, (part, text)
    no_store(root)
    converge(prepared, cfg, root, [("cache_dir", key)])
    assert arrow.read_bytes() == data  # extracted again; the edited file was moved aside


@dagster_rows
def test_fault_store_join_edited(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """The join's table replaced after the join wrote it (a task's text edited, its mtime set back),
    then the store's job run on its own, as the UI's Materialize of vin_store runs it: the writer
    read the table as it found it, and the store's name digests the records and the kit, not the
    table, so the edited text would be published under the clean inputs' name. The writer reads the
    table's bytes only when they have the sha256 the join wrote: refused, naming the table; nothing
    is published. Joined again, the store is the clean build's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = copy_root(prepared, tmp_path / "root")
    cfg = run_cfg(demo, root)
    r = run_selection(cfg, [a for a in FINAL_STAGE if a != "vin_store"])
    assert r["success"], said(r)
    table = layout.join_table_path(root)
    st = table.stat()
    clean = pq.read_table(table)
    tasks = clean.column("task").to_pylist()
    tasks[0] = f"EDITED {tasks[0]}"
    pq.write_table(clean.set_column(clean.schema.get_field_index("task"), "task", pa.array(tasks)), table)
    os.utime(table, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = run_selection(cfg, ["vin_store"])
    text = said(r)
    assert not r["success"] and "vin_store" not in r["materialized"], text
    for part in (
        "the trajectory join table changed since the join wrote it",
        f"{table}: sha256 ",
        "run `stage2 build` again",
    ):
        assert part in text, (part, text)
    no_store(root)
    converge(prepared, cfg, root, [])


@dagster_rows
def test_fault_store_flipped_byte(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """One byte of a published shard flipped (bit rot: same size, same mtime class): every read of
    the sample raises StoreChecksumError naming the store, shard and sample; plain `stage2 validate`
    exits 1 naming the file and the sample; the next build replaces the store (the clean one)."""
    root = copy_root(prepared, tmp_path / "root")
    cfg = run_cfg(demo, root)
    r = run_selection(cfg, FINAL_STAGE)
    assert r["success"], said(r)
    current = layout.current_store_path(root, prepared.profile_name).resolve()
    manifest = json.loads((current / "manifest.json").read_text())
    assert manifest["fingerprint"] == prepared.fingerprint
    sh = manifest["shards"][-1]
    frames = next(f["path"] for f in sh["files"] if f["path"].startswith(f"{sh['dir']}/frames/c/"))
    data = bytearray((current / frames).read_bytes())
    data[20] ^= 0x01  # inside the shard's first row's chunk
    (current / frames).write_bytes(bytes(data))
    first = int(sh["row_start"])
    with VinOfflineStoreReader(layout.current_store_path(root, prepared.profile_name)) as reader:
        key = reader.sample_index[first]["sample_key"]
        with pytest.raises(StoreChecksumError) as ei:
            reader.sample(first)
    msg = str(ei.value)
    for part in (str(current), sh["dir"], f"sample {first} ({key})", "crc32c", "rebuild it: stage2 build"):
        assert part in msg, (part, msg)
    v = stage2("validate", str(layout.current_store_path(root, prepared.profile_name)))
    assert v.returncode == 1, v.tail()
    assert (
        "INVALID" in v.stdout and frames in v.stdout and "fail their crc32c" in v.stdout and key in v.stdout
    )
    assert "Traceback" not in v.stdout + v.stderr
    converge(prepared, cfg, root, [])  # the damaged store is rebuilt: the clean fingerprint


def test_fault_store_rare_long(tmp_path: Path) -> None:
    """A rare long trajectory among short ones (within the frame bound): it gets a shard of its own,
    so the short ones keep their own Tmax (their reads decode no padding up to it)."""
    samples = []
    for i, t in enumerate([3, 4, 3, 5, 4, 3, 32, 4, 5, 3]):
        key = f"{i:08x}-0000-4000-8000-{i:012x}"
        f = tmp_path / "up" / f"trajectory_{key}.npz"
        f.parent.mkdir(parents=True, exist_ok=True)
        fr = np.full((t, 6, 8, 3), i, dtype=np.uint8)
        np.savez_compressed(f, frames=fr, shape=np.array(fr.shape), num_frames=np.int64(t))
        samples.append(SampleSpec(key, "c", "s", "t", "successful", None, True, "train", f, None, None))
    pairs = [
        PairSpec(f"p{i}", "train", "t", a.sample_key, b.sample_key)
        for i, (a, b) in enumerate(zip(samples, samples[1:], strict=False))
    ]
    m = VinOfflineWriter(
        tmp_path / "store",
        profile={"name": "p", "repo_id": "o/r", "revision": "a" * 40},
        inputs={"k": "1" * 64},
        rows_per_shard=64,
    ).write(samples, pairs)
    assert [(sh["num_rows"], sh["frame_shape"][0]) for sh in m["shards"]] == [(9, 5), (1, 32)]
    with VinOfflineStoreReader(tmp_path / "store") as reader:
        short = next(i for i, r in enumerate(reader.sample_index) if r["num_frames"] == 3)
        assert reader._padded_row(0, "frames", reader.sample_index[short]["row"]).shape[0] == 5


@pytest.mark.parametrize("what", ["frames", "sidecar"])
def test_a_file_changed_after_its_check_is_refused_by_the_writer(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """A frames file or an action sidecar replaced after the writer's inputs were checked against
    their records (the check passes here, as it does when the edit lands right after it): the writer
    hashes the bytes it decodes against the record (the extraction's, the unpack's) and refuses
    other bytes, naming the file; nothing is published. (A valid npz of other frames or actions of
    the same shape: nothing else in the file would tell.)"""
    import shutil

    from stage2_data import steps
    from stage2_data.kit import read_join_rows
    from stage2_data.profile import load_profile
    from stage2_data.store import StoreInputError

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(demo_cache.profile)
    current = layout.current_store_path(root, prof.name).resolve()
    row = next(r for r in read_join_rows(root) if r.get("in_pairs") and r.get("sidecar_present"))
    if what == "frames":
        path, key = root / row["frames_path"], "frames"
    else:
        path, key = layout.derived_root(root) / row["sidecar_path"], "aligned_actions"
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays[key] = arrays[key] ^ np.uint8(1) if what == "frames" else arrays[key] + 1  # the same shape
    np.savez_compressed(path, **arrays)
    # the edit made after the pre-read check: that check passes, handing the writer the records
    records = {k: load_extraction_record(root, k) for k in prof.cache_keys()}
    monkeypatch.setattr(steps.store, "require_inputs_as_recorded", lambda *a, **k: records)
    with pytest.raises(StoreInputError) as ei:
        steps.step_store(prof, root, rows_per_shard=5)  # other settings: a new store is written
    said = str(ei.value)
    assert str(path) in said and "not the" in said and "its record holds" in said, said
    assert layout.current_store_path(root, prof.name).resolve() == current


def test_an_arrow_file_changed_after_its_check_is_refused_by_the_join(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A processed_dataset Arrow file replaced (a valid file, one row's task text changed) after the
    join's inputs were checked against their extraction records (the check passes here, as it does
    when the edit lands right after it): the join hashes the bytes it parses against the record and
    refuses other bytes, naming the file; the join table and its sha256 stay as they were."""
    import shutil

    import pyarrow as pa
    import pyarrow.ipc as pa_ipc

    from stage2_data import steps
    from stage2_data.errors import InputsChangedError
    from stage2_data.formats import arrow as farrow
    from stage2_data.profile import load_profile

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(demo_cache.profile)
    shard = farrow.list_shards(layout.cache_dir(root, prof.cache_keys()[0]))[0]
    table = farrow.read_shard(shard, data=shard.read_bytes())  # not mapped: the file is rewritten below
    tasks = table.column("task").to_pylist()
    tasks[0] = "an edited task"
    table = table.set_column(table.column_names.index("task"), "task", pa.array(tasks))
    with pa_ipc.new_stream(str(shard), table.schema) as out:
        out.write_table(table)
    joined = layout.join_table_path(root).read_bytes()
    # the edit made after the pre-read check: that check passes, handing the join the records
    records = {k: load_extraction_record(root, k) for k in prof.cache_keys()}
    monkeypatch.setattr(steps.kit, "require_inputs_as_recorded", lambda *a, **k: records)
    with pytest.raises(InputsChangedError) as ei:
        steps.step_join(prof, root)
    said = str(ei.value)
    assert str(shard) in said and "its extraction record holds" in said and "stage2 build" in said, said
    assert layout.join_table_path(root).read_bytes() == joined


def test_pairs_in_a_cache_directory_the_profile_does_not_list_never_reach_a_store(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile without one cache directory's archive, over a data root where that directory is
    still extracted and a kit whose pairs still use it (the store job run on its own from the UI,
    before a build moves the directory to ``unused/``): its frames are pinned, extracted and byte
    checked by nothing this profile builds, and used to be published in the store all the same.
    The join names each such pair's trajectory and the fix; the writer refuses any sample whose
    frames no extraction record of the profile holds, naming the file; nothing is published."""
    import shutil

    from stage2_data import steps
    from stage2_data.profile import load_profile
    from stage2_data.store import StoreInputError

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(demo_cache.profile)
    current = layout.current_store_path(root, prof.name).resolve()
    drop = "jesbu1_racer_rfm_racer_train"
    small = prof.model_copy(update={"archives": [a for a in prof.archives if a.cache_key != drop]})
    joined = {c.name: c for c in steps.step_join(small, root).checks}
    said = joined[C.JOIN_HAS_NO_PROBLEMS].description
    assert not joined[C.JOIN_HAS_NO_PROBLEMS].passed
    assert f"is in cache directory {drop!r}, which the profile" in said and "[[archives]]" in said, said
    with pytest.raises(StoreInputError) as ei:  # the join's check failed for these inputs
        steps.step_store(small, root)
    assert "trajectory_join's checks failed for these inputs" in str(ei.value), str(ei.value)
    # and were that requirement passed, the writer holds every sample to a record of this build
    monkeypatch.setattr(steps.store, "require_checked", lambda *a, **k: None)
    with pytest.raises(StoreInputError) as ei:
        steps.step_store(small, root)
    said = str(ei.value)
    assert f"processed_datasets/{drop}/frames/trajectory_" in said and "no extraction record" in said, said
    assert layout.current_store_path(root, prof.name).resolve() == current


@pytest.mark.parametrize("kit_edit", ["pair_added", "join_failed"])
def test_the_store_job_alone_publishes_only_what_the_join_and_byte_check_passed(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path, kit_edit: str
) -> None:
    """The store job run on its own (the UI's Materialize of vin_store, `dagster asset materialize`):
    after a pair row was added to the kit (the join never read it), or after the join's check failed
    for these inputs, the store step publishes nothing; it used to publish a store a full build
    refuses (QA), and with the added row its count check failed only after `current` had moved.
    It names what has not passed and the fix; `current` stays where it was."""
    import shutil

    from helpers.faults import copy_kit
    from helpers.ui_run import materialize

    from stage2_data import steps
    from stage2_data.profile import load_profile

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    profile = copy_kit(demo_cache, tmp_path / "kit")
    prof = load_profile(profile)
    current = layout.current_store_path(root, prof.name).resolve()
    if kit_edit == "pair_added":
        pm = prof.kit_file("pair_manifest")
        row = json.loads(pm.read_text().splitlines()[1])
        row["pair_id"] = "p999999"
        with pm.open("a") as f:
            f.write(json.dumps(row) + "\n")
    else:
        am = sorted(prof.kit_file("action_manifest_dir").glob("*.jsonl"))
        lines = next(p for p in am if '"sidecar_sha256": "' in p.read_text())
        text = lines.read_text()
        at = text.index('"sidecar_sha256": "') + len('"sidecar_sha256": "')
        lines.write_text(text[:at] + "0" * 64 + text[at + 64 :])
        joined = {c.name: c.passed for c in steps.step_join(prof, root).checks}
        assert joined[C.JOIN_HAS_NO_PROBLEMS] is False
    r = materialize(profile, root, "http://127.0.0.1:9", "vin_store", None)
    assert not r.success
    said = "\n".join(
        str(getattr(getattr(e.event_specific_data, "user_failure_data", None), "description", ""))
        for e in r.all_events
        if e.event_type_value == "STEP_FAILURE"
    )
    why = "ran for other inputs" if kit_edit == "pair_added" else "failed for these inputs"
    assert "has not passed its checks" in said and why in said and "stage2 build" in said, said
    assert layout.current_store_path(root, prof.name).resolve() == current


def test_a_store_built_again_under_currents_name_is_not_current_before_its_gate(
    built: dict, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """The published store damaged (a byte of a chunk flipped): the build moves it aside and writes
    the same inputs' store again under the same name, the one `current` names, so the writer's
    final rename used to publish it before the gate ran (a stop then left an ungated, writable store
    readable through `current`, with "nothing was published"). `current` is withdrawn while that
    store is written and gated, and made again only once it passed."""
    import shutil

    from stage2_data import steps
    from stage2_data.profile import load_profile

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(demo_cache.profile)
    link = layout.current_store_path(root, prof.name)
    name = os.readlink(link)
    chunk = next(p for p in sorted((link.resolve() / "shards").rglob("c/*/*/*/*/*")) if p.is_file())
    chunk.chmod(0o644)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    seen: list[bool] = []

    def during_gate(url: str) -> dict:
        seen.append(os.path.lexists(link))  # the new store is complete and being gated
        return {}

    res = steps.step_store(prof, root, alongside=during_gate)
    assert seen == [False], "current stood while the store it names was written and gated"
    assert all(c.passed for c in res.checks), [c.description for c in res.checks if not c.passed]
    assert os.readlink(link) == name
    assert f"`current` named {name}: withdrawn until it passes the gate" in res.metadata["update"]
    assert "moved_aside" in res.metadata


def test_a_link_where_a_stores_folder_goes_is_moved_aside_and_its_target_untouched(
    built: dict, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """A symbolic link placed where the build's store folder goes, naming a copy of that store in a
    user's folder outside the data root: the build reused the store through the link (it passes the
    gate), published it there and made the user's folder read-only. A build writes folders, never
    links: the link is moved aside as a link, said, and a store is built in the data root; the
    user's folder keeps every mode and byte."""
    import shutil

    from stage2_data import steps
    from stage2_data.profile import load_profile
    from stage2_data.publish.readonly import make_writable

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(demo_cache.profile)
    store = layout.current_store_path(root, prof.name).resolve()
    user = tmp_path / "user" / "my-store-copy"
    shutil.copytree(store, user)
    make_writable(user)  # the user's own folder: writable
    before = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else b"") for p in [user, *user.rglob("*")]}
    make_writable(store)
    store.rename(tmp_path / "published-before")  # the store folder's name now holds a link
    store.symlink_to(user)
    res = steps.step_store(prof, root)
    assert all(c.passed for c in res.checks), [c.description for c in res.checks if not c.passed]
    published = layout.current_store_path(root, prof.name)
    assert published.resolve() == store and store.is_dir() and not store.is_symlink()
    moved = str(res.metadata.get("moved_aside", ""))
    assert (
        moved.startswith(f"{store} -> ") and "a symbolic link stood where the store" in res.metadata["update"]
    )
    aside = Path(moved.split(" -> ", 1)[1])
    assert aside.is_symlink() and aside.resolve() == user
    after = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else b"") for p in [user, *user.rglob("*")]}
    assert after == before


@pytest.mark.parametrize("reader", ["join", "byte_check", "store_writer"])
def test_a_kit_file_edited_and_undone_while_a_step_reads_it_is_refused(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    """A kit file edited while a step reads it and put back before the step ends (size and mtime
    kept, then its bytes too): the step hashed one version and parsed another. The join and the
    byte check used to record a pass for the hashed bytes (the store step then trusted a table made
    from the other), and the store writer to write the other version's pairs under the hashed one's
    name. Each now refuses, naming the file; no pass is recorded and nothing is published."""
    import shutil

    from helpers.faults import copy_kit

    from stage2_data import steps
    from stage2_data.errors import InputsChangedError
    from stage2_data.profile import load_profile
    from stage2_data.stages import SUBSET_CHECKSUMS, TRAJECTORY_JOIN

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(copy_kit(demo_cache, tmp_path / "kit"))
    current = layout.current_store_path(root, prof.name).resolve()
    assert all(c.passed for c in steps.step_join(prof, root).checks)  # the copied kit's records
    assert all(c.passed for c in steps.step_verify_bytes(prof, root).checks)
    key = "subset_checksums" if reader == "byte_check" else "pair_manifest"
    path = prof.kit_file(key)
    text = path.read_bytes()
    # a valid file of the same size: a task text changed (pairs), or two hex digits swapped (sums)
    if key == "pair_manifest":
        at = text.index(b'"task": "') + len(b'"task": "')
        edited = text[:at] + (b"Y" if text[at : at + 1] != b"Y" else b"Z") + text[at + 1 :]
    else:
        at = text.index(b"  ") - 2
        edited = text[:at] + text[at + 1 : at + 2] + text[at : at + 1] + text[at + 2 :]
    assert edited != text and len(edited) == len(text)
    st = path.stat()

    def write(data: bytes) -> None:
        path.write_bytes(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    module, name = {
        "join": (steps.kit, "build_join_table"),
        "byte_check": (steps.kit, "verify_subset_bytes"),
        "store_writer": (steps.store, "load_pairs"),
    }[reader]
    real = getattr(module, name)

    def read_while_edited(*a: object, **k: object) -> object:
        write(edited)
        try:
            return real(*a, **k)
        finally:
            write(text)

    monkeypatch.setattr(module, name, read_while_edited)
    run = {
        "join": lambda: steps.step_join(prof, root),
        "byte_check": lambda: steps.step_verify_bytes(prof, root),
        "store_writer": lambda: steps.step_store(prof, root, rows_per_shard=5),  # a new store's name
    }[reader]
    with pytest.raises(InputsChangedError) as ei:
        run()
    said = str(ei.value)
    assert f"{path}: changed while the" in said and "stage2 build" in said, said
    assert path.read_bytes() == text
    if reader != "store_writer":
        asset = TRAJECTORY_JOIN if reader == "join" else SUBSET_CHECKSUMS
        assert not layout.checked_record_path(root, asset).exists()
    assert layout.current_store_path(root, prof.name).resolve() == current


def test_a_file_that_is_not_the_kits_added_beside_the_manifests_is_not_an_edit(
    built: dict, demo_cache: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A README (or an editor's swap file) created in the action manifest folder while the join
    reads the kit is no kit file: the join passes and records its pass (it refused the build, QA)."""
    import shutil

    from helpers.faults import copy_kit

    from stage2_data import steps
    from stage2_data.profile import load_profile
    from stage2_data.stages import TRAJECTORY_JOIN

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(copy_kit(demo_cache, tmp_path / "kit"))
    readme = prof.kit_file("action_manifest_dir") / "README.txt"
    real = steps.kit.build_join_table

    def join_while_a_readme_appears(*a: object, **k: object) -> object:
        readme.write_text("notes")
        return real(*a, **k)

    monkeypatch.setattr(steps.kit, "build_join_table", join_while_a_readme_appears)
    assert all(c.passed for c in steps.step_join(prof, root).checks)
    assert readme.exists() and layout.checked_record_path(root, TRAJECTORY_JOIN).is_file()


@contextlib.contextmanager
def _read_only_in_place(folder: Path) -> Iterator[None]:
    """``folder`` made read-only where it is (a read-only bind mount over itself, which stops root
    too), the rest of its file system writable; skips the test where mounting is not permitted."""
    bind = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"a bind mount is not permitted here: {bind.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True, capture_output=True)


def _listing(folder: Path) -> dict[str, str]:
    """Every path under ``folder``: a link's target, else its size (a folder's: empty)."""
    return {
        str(p.relative_to(folder)): os.readlink(p)
        if p.is_symlink()
        else ("" if p.is_dir() else str(p.stat().st_size))
        for p in sorted(folder.rglob("*"))
    }


def test_a_read_only_stores_folder_is_refused_before_the_store_step_moves_or_writes_anything(
    built: dict, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """The data root's ``stores/`` on a read-only mount, the rest writable (QA): the store step
    (here as `--reverify` runs it, which writes a witness store there) failed with the writer's
    StoreInputError "... is not writable", fixed by "a writer argument's value", and the build
    reported it as the failed check store_opens_with_strict_reader (exit 1). It is a FileSystemError
    now (the build exits 2, no check failed), raised before anything there is moved aside or
    written, naming the stores folder, the read-only file system, and a fix a build takes (remount
    it, or --store-url). The writer's own problem line says why too."""
    import shutil

    from stage2_data import steps
    from stage2_data.errors import FileSystemError
    from stage2_data.profile import load_profile
    from stage2_data.store import StoreInputError

    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster"))
    prof = load_profile(demo_cache.profile)
    stores = root / layout.STORES_DIR
    before = _listing(stores)
    quarantine = (
        sorted((root / layout.QUARANTINE_DIR).rglob("*")) if (root / layout.QUARANTINE_DIR).exists() else []
    )
    with _read_only_in_place(stores):
        with pytest.raises(FileSystemError) as ei:
            steps.step_store(prof, root, reverify=True)
        with pytest.raises(StoreInputError) as wi:
            VinOfflineWriter(
                stores / prof.name / "new",
                profile={"name": "p", "repo_id": "o/r", "revision": "a" * 40},
                inputs={"k": "1" * 64},
            )
    said = str(ei.value)
    assert str(stores / prof.name) in said and "read-only file system" in said, said
    assert "Fix: remount it read-write, or pass --store-url " in said, said
    assert "writer argument" not in said and "nothing in it was moved or written" in said, said
    writer = str(wi.value)
    assert f"{stores / prof.name} is not writable (a read-only file system: remount it read-write)" in writer
    assert _listing(stores) == before  # nothing moved aside, withdrawn or left half-written
    now = sorted((root / layout.QUARANTINE_DIR).rglob("*")) if (root / layout.QUARANTINE_DIR).exists() else []
    assert now == quarantine
