"""A FIFO (or another special file) where the data root keeps a record, a partial download or its
lock never blocks anything: a record that is not a regular file is an unreadable record (the step
does its work again and writes the record anew in its place), a partial download or a lock file that
is not one is a named error (the path, what it is, the fix), the FIFO left as it is.

Each check runs with a bound: were the FIFO opened for reading (or writing) it would block for ever,
so the call runs in a thread that, past the bound, is released by opening the FIFO's other end, and
the test fails saying it hung."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers import cli
from helpers.kit import build

from stage2_data import kit, layout
from stage2_data.acquire import (
    DownloadsFailedError,
    HubSource,
    archive_state,
    download_archive,
    download_profile,
)
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.errors import FileSystemError
from stage2_data.extract import (
    check_extraction,
    extract_cache_dir,
    invalidate_extraction,
    load_extraction_record,
)
from stage2_data.kit.sidecars import invalidate_sidecars
from stage2_data.profile import load_profile
from stage2_data.publish import data_root_lock, read_holder, run_step_lock
from stage2_data.publish.lock import LAUNCHING_BUILD_ENV, BuildGoneError, require_launching_build

T = TypeVar("T")
BOUND = 20.0  # seconds: each call below takes well under one


def bounded(fifo: Path, fn: Callable[[], T]) -> T:
    """``fn()``, which must return (or raise) within :data:`BOUND`; were it blocked on ``fifo``,
    the FIFO's other end is opened to release it and the test fails."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BOUND)
    if t.is_alive():
        fds = []
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            with contextlib.suppress(OSError):
                fds.append(os.open(fifo, flags))
        t.join(5)
        for fd in fds:
            os.close(fd)
        pytest.fail(f"blocked on the FIFO {fifo} for more than {BOUND:g}s")
    if "error" in out:
        raise out["error"]
    return out["value"]  # type: ignore[no-any-return]


def fifo_at(path: Path) -> Path:
    """Replace whatever is at ``path`` by a FIFO."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    return path


def is_fifo(path: Path) -> bool:
    return stat.S_ISFIFO(os.lstat(path).st_mode)


@pytest.fixture
def hub(demo: DemoPaths) -> Iterator[HubServer]:
    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as server:
        yield server


# ----- acquire/state.py: archives/<archive>.verified.json ------------------------------------------
def test_a_fifo_verification_record_is_no_record(demo: DemoPaths, hub: HubServer, tmp_path: Path) -> None:
    """``stage2 list`` (and the build's preflight, through ``archive_state``) sees the archive
    unverified; the next download hashes it again and writes the record anew."""
    data_root = tmp_path / "data"
    prof = load_profile(demo.profile)
    spec = min(prof.archives, key=lambda a: a.size or 0)
    source = HubSource.from_profile(prof, endpoint=hub.url)
    download_archive(source, spec, data_root)
    record = fifo_at(layout.verified_record_path(data_root, spec.path))

    assert bounded(record, lambda: archive_state(data_root, spec)).state == "unverified"
    r = bounded(
        record,
        lambda: cli.stage2("list", str(demo.profile), "--data-root", str(data_root), "--json", timeout=BOUND),
    )
    assert r.returncode == 0, r.tail()
    row = next(a for a in r.json()["archives"] if a["path"] == spec.path)
    assert row["state"] == "unverified"

    again = bounded(record, lambda: download_archive(source, spec, data_root))
    assert again.sha256 == spec.sha256
    assert not is_fifo(record) and json.loads(record.read_text())["sha256"] == spec.sha256
    assert archive_state(data_root, spec).state == "verified"


# ----- extract/extract.py: reports/extraction/<key>.json -------------------------------------------
def test_a_fifo_extraction_record_is_unreadable_and_extracted_again(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    prof = load_profile(demo_cache.profile)
    key, specs = next(iter(prof.archives_by_cache_key().items()))
    shas: dict[str, str | None] = {a.path: a.sha256 for a in specs}
    parts = [demo_cache.upstream / a.path for a in specs]
    extract_cache_dir(key, parts, tmp_path, archive_sha256=shas)
    record = fifo_at(layout.extraction_record_path(tmp_path, key))

    assert bounded(record, lambda: load_extraction_record(tmp_path, key)) is None
    rec, why = bounded(record, lambda: check_extraction(tmp_path, key, shas))
    assert rec is None and why == "its extraction record is unreadable"
    assert bounded(record, lambda: invalidate_extraction(tmp_path, key, "x")) is False
    bounded(record, lambda: extract_cache_dir(key, parts, tmp_path, archive_sha256=shas))
    assert not is_fifo(record)
    assert check_extraction(tmp_path, key, shas) == (load_extraction_record(tmp_path, key), None)


# ----- kit/sidecars.py: derived/.sidecars.json -----------------------------------------------------
def test_a_fifo_sidecars_record_means_unpack_again(tmp_path: Path) -> None:
    b = build(tmp_path)
    marker = fifo_at(layout.derived_root(b.data_root) / ".sidecars.json")

    why = bounded(marker, lambda: kit.sidecars_status(b.profile, b.data_root))
    assert why is not None and f"{marker} is unreadable" in why
    assert bounded(marker, lambda: invalidate_sidecars(b.data_root, "x")) is False
    redo = bounded(marker, lambda: kit.unpack_sidecars(b.profile, b.data_root))
    assert not redo.skipped and redo.files == 10
    assert not is_fifo(marker)
    assert kit.sidecars_status(b.profile, b.data_root) is None


def test_a_fifo_sidecars_index_or_marker_is_no_record_to_the_readers_of_it(tmp_path: Path) -> None:
    """What the join and the store read of the unpack's record (``recorded_sidecars``, the store's
    ``extracted_content``): a FIFO there is no record, never a read that blocks."""
    from stage2_data.kit.sidecar_facts import SIDECAR_INDEX, SIDECAR_MARKER, recorded_sidecars
    from stage2_data.steps.store_inputs import extracted_content

    b = build(tmp_path)
    derived = layout.derived_root(b.data_root)
    assert recorded_sidecars(derived)
    index = fifo_at(derived / SIDECAR_INDEX)
    assert bounded(index, lambda: recorded_sidecars(derived)) == {}
    marker = fifo_at(derived / SIDECAR_MARKER)
    assert bounded(marker, lambda: recorded_sidecars(derived)) == {}
    assert bounded(marker, lambda: extracted_content(b.profile, b.data_root))["sidecars"] == ""


# ----- acquire/state.py, hashing.py: archives/<archive> ---------------------------------------------
def test_a_fifo_in_place_of_an_archive_is_never_read(demo: DemoPaths, hub: HubServer, tmp_path: Path) -> None:
    """A FIFO where an archive is kept: hashing it is a named error (the path, what it is, the fix),
    never a read that blocks (every hash of a file goes through one non-blocking open, ``hashing``);
    a download does not read it and puts the verified archive in its place."""
    from stage2_data.hashing import sha256_file

    data_root = tmp_path / "data"
    prof = load_profile(demo.profile)
    spec = min(prof.archives, key=lambda a: a.size or 0)
    final = fifo_at(layout.archive_path(data_root, spec.path))
    with pytest.raises(FileSystemError) as ei:
        bounded(final, lambda: sha256_file(final))
    assert f"{final} is a FIFO" in str(ei.value) and "Fix: remove it" in str(ei.value), str(ei.value)
    source = HubSource.from_profile(prof, endpoint=hub.url)
    # a download never reads it: it is not a file of the archive's (no bytes, nothing to keep), and
    # the verified download takes its place
    bounded(final, lambda: download_profile(prof, source, data_root))
    assert not is_fifo(final) and archive_state(data_root, spec).state == "verified"


# ----- acquire/transport.py: archives/.partial/<archive>.part ----------------------------------------
def test_a_fifo_partial_download_is_named_and_left_in_place(
    demo: DemoPaths, hub: HubServer, tmp_path: Path
) -> None:
    data_root = tmp_path / "data"
    prof = load_profile(demo.profile)
    spec = min(prof.archives, key=lambda a: a.size or 0)
    source = HubSource.from_profile(prof, endpoint=hub.url)
    part = fifo_at(layout.partial_path(data_root, spec.path))

    with pytest.raises(FileSystemError) as e:
        bounded(part, lambda: download_archive(source, spec, data_root, attempts=1))
    assert f"{part} is a FIFO, not a regular file" in str(e.value)
    assert e.value.fix is not None and f"rm {part}" in e.value.fix
    assert is_fifo(part) and not layout.archive_path(data_root, spec.path).exists()
    # a whole profile's download names it among its problems, the other archives downloaded
    with pytest.raises(DownloadsFailedError) as failed:
        bounded(part, lambda: download_profile(prof, source, data_root, backoff=0.01))
    assert list(failed.value.errors) == [spec.path]
    part.unlink()  # the fix: the download then starts over
    assert download_archive(source, spec, data_root).sha256 == spec.sha256


# ----- publish/lock.py: <data root>/.stage2.lock ---------------------------------------------------
def test_a_fifo_lock_file_is_named_with_its_path_and_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_root = tmp_path / "data"
    lock = fifo_at(data_root / layout.LOCK_FILE)

    def take() -> None:
        with data_root_lock(data_root):
            pass

    with pytest.raises(FileSystemError) as e:
        bounded(lock, take)
    assert f"{lock} is a FIFO, not a regular file" in str(e.value)
    assert e.value.fix is not None and f"rm {lock}" in e.value.fix

    def shared() -> None:
        with run_step_lock(data_root, label="a step"):
            pass

    with pytest.raises(FileSystemError, match="FIFO"):
        bounded(lock, shared)
    assert bounded(lock, lambda: read_holder(data_root)) == {}
    monkeypatch.setenv(LAUNCHING_BUILD_ENV, str(os.getpid()))
    with pytest.raises(BuildGoneError):
        bounded(lock, lambda: require_launching_build(data_root))
    assert is_fifo(lock)


def test_stage2_gc_names_a_fifo_lock_file(tmp_path: Path) -> None:
    """Through the CLI (``stage2 gc`` takes the lock as a build does): one line naming the lock
    file, what it is and the fix."""
    data_root = tmp_path / "data"
    (data_root / "stores").mkdir(parents=True)
    lock = fifo_at(data_root / layout.LOCK_FILE)
    r = bounded(lock, lambda: cli.stage2("gc", str(data_root / "stores"), "--quarantine", timeout=BOUND))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.tail()
    assert f"{lock} is a FIFO, not a regular file" in lines[0], r.tail()
    assert f"Fix: remove it (rm {lock})" in lines[0], r.tail()
    assert is_fifo(lock)


def test_a_folder_at_the_lock_path_keeps_its_folder_fix(tmp_path: Path) -> None:
    """A folder is no FIFO: the lock names it as the file system's refusal does, with a fix that
    works for a folder (``rm`` does not)."""
    data_root = tmp_path / "data"
    (data_root / layout.LOCK_FILE).mkdir(parents=True)
    for take in (lambda: data_root_lock(data_root), lambda: run_step_lock(data_root)):
        with pytest.raises(FileSystemError) as e, take():
            pass
        assert e.value.fix is not None and "move or delete that folder" in e.value.fix
