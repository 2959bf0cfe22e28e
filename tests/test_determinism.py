"""A store's bytes, and so its fingerprint, are a function of its declared inputs only: the process
state a build inherits (settings other libraries or tests change, the environment, the working
folder, the umask, the time zone, the writer's thread count) never enters them (issue 14, item 6).

Each case builds the same small store twice in this process, once as it is and once with one piece
of process state changed, and compares the fingerprints and every file's bytes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from test_store import INPUTS, PROFILE, Upstream, build, make_upstream

from stage2_data.store import VinOfflineWriter, store_fingerprint
from stage2_data.store.determinism import default_blosc_split_mode


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"), range(1, 9))


def _files(store: Path) -> dict[str, str]:
    """sha256 of every file of a store but its manifest (which holds the time and local paths)."""
    return {
        str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


@contextlib.contextmanager
def _zarr_json_indent() -> Iterator[None]:
    # zarr formats zarr.json by this process-wide setting (also ZARR_JSON_INDENT, a zarr config file)
    with zarr.config.set({"json_indent": None}):
        yield


@contextlib.contextmanager
def _umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


@contextlib.contextmanager
def _cwd(tmp: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(tmp)
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _time_zone() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Pacific/Kiritimati"  # UTC+14: another calendar day than UTC for 14 hours
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


@contextlib.contextmanager
def _blosc_split_mode() -> Iterator[None]:
    # another library compresses through Blosc's global context with BLOSC_SPLITMODE set: Blosc's
    # process-wide split mode is now "never" (for every later compression, on any thread)
    import numcodecs
    import numcodecs.blosc

    saved = numcodecs.blosc.use_threads
    os.environ["BLOSC_SPLITMODE"] = "NEVER"
    try:
        numcodecs.blosc.use_threads = True
        numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE).encode(np.zeros(1 << 16, dtype=np.float32))
        numcodecs.blosc.use_threads = saved
        yield
    finally:
        numcodecs.blosc.use_threads = saved
        os.environ.pop("BLOSC_SPLITMODE", None)
        default_blosc_split_mode()  # (what the writer does: later tests compress as by default)


CASES: dict[str, Callable[[Path], contextlib.AbstractContextManager[None]]] = {
    "zarr_json_indent": lambda tmp: _zarr_json_indent(),
    "blosc_split_mode": lambda tmp: _blosc_split_mode(),
    "umask": lambda tmp: _umask(),
    "cwd": _cwd,
    "time_zone": lambda tmp: _time_zone(),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_process_state_never_enters_the_store(up: Upstream, tmp_path: Path, case: str) -> None:
    plain = build(tmp_path / "plain" / "store", up)
    with CASES[case](tmp_path):
        changed = build(tmp_path / "changed" / "store", up)
    assert _files(tmp_path / "changed" / "store") == _files(tmp_path / "plain" / "store")
    assert changed["fingerprint"] == plain["fingerprint"]
    assert store_fingerprint(tmp_path / "changed" / "store") == plain["fingerprint"]


@pytest.mark.parametrize("workers", [1, 3])
def test_the_writer_thread_count_never_enters_the_store(up: Upstream, tmp_path: Path, workers: int) -> None:
    plain = build(tmp_path / "plain" / "store", up)
    other = build(tmp_path / "other" / "store", up, workers=workers)
    assert _files(tmp_path / "other" / "store") == _files(tmp_path / "plain" / "store")
    assert other["fingerprint"] == plain["fingerprint"]


def test_worker_processes_never_enter_the_store(up: Upstream, tmp_path: Path) -> None:
    """Shards written by 2 worker processes (the build's default on a multi-core machine) are byte
    for byte the shards written in this process."""
    plain = build(tmp_path / "plain" / "store", up, rows_per_shard=1)
    procs = build(tmp_path / "procs" / "store", up, rows_per_shard=1, processes=2)
    assert len(plain["shards"]) >= 4  # enough for the writer to use its 2 processes
    assert _files(tmp_path / "procs" / "store") == _files(tmp_path / "plain" / "store")
    assert procs["fingerprint"] == plain["fingerprint"]


def test_the_build_starts_worker_processes_only_for_many_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker process pays for itself only on many samples (its start costs ~0.5 s): a store of a
    few hundred big samples is written on threads, a full-cardinality one in a process a core."""
    import os

    from stage2_data.steps.store import SAMPLES_PER_PROCESS, store_processes

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert store_processes(0) == store_processes(100) == store_processes(SAMPLES_PER_PROCESS - 1) == 1
    assert store_processes(4323) == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert store_processes(4323) == 4  # one per 1,000 samples, at most 4
    assert store_processes(2 * SAMPLES_PER_PROCESS) == 2


def test_a_bad_input_in_a_worker_process_is_a_named_problem(up: Upstream, tmp_path: Path) -> None:
    """A frames file that fails in a worker process: the same named error as in-process (it crosses
    the process boundary intact), and nothing is published."""
    import zipfile
    from dataclasses import replace

    from stage2_data.store import StoreInputError

    src = up.samples[-1].frames_path  # its deflate data corrupt behind an intact directory and header:
    bad = tmp_path / "corrupt.npz"  # the plan's inspection passes, the worker's load fails
    data = bytearray(Path(src).read_bytes())
    with zipfile.ZipFile(src) as z:
        info = z.getinfo("frames.npy")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for i in range(start + info.compress_size // 2, start + info.compress_size - 8):
        data[i] ^= 0x5A
    bad.write_bytes(bytes(data))
    samples = [*up.samples[:-1], replace(up.samples[-1], frames_path=bad)]
    with pytest.raises(StoreInputError) as ei:
        VinOfflineWriter(
            tmp_path / "out", profile=PROFILE, inputs=INPUTS, rows_per_shard=1, processes=2
        ).write(samples, up.pairs)
    assert f"{bad}: unreadable frames npz (" in str(ei.value), str(ei.value)
    assert not (tmp_path / "out").exists()


def _build_in_daemon(out: str, up: Upstream, q: object) -> None:
    try:
        result = build(Path(out), up, rows_per_shard=1, processes=2)["fingerprint"]
    except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
        result = f"raised {type(e).__name__}: {e}"
    q.put(result)  # type: ignore[attr-defined]


def test_a_daemonic_process_writes_its_shards_itself(up: Upstream, tmp_path: Path) -> None:
    """A daemonic process (a dask worker's, say) may not have children: the writer asked for worker
    processes writes the shards itself there, and the store is the same."""
    import multiprocessing

    plain = build(tmp_path / "plain" / "store", up, rows_per_shard=1)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_build_in_daemon, args=(str(tmp_path / "d" / "store"), up, q), daemon=True)
    proc.start()
    fingerprint = q.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert fingerprint == plain["fingerprint"]
    assert _files(tmp_path / "d" / "store") == _files(tmp_path / "plain" / "store")
