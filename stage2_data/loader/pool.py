"""Batches loaded by worker processes without torch: :class:`PoolLoader`, a ``multiprocessing`` pool
that does what a DataLoader with ``num_workers`` does (for numpy, JAX, or a quick look).

Each worker gets the dataset once (inherited under fork, pickled under spawn or forkserver: the
reader re-pins the same store and takes its own lease there), then turns each batch of positions
into one collated batch. Batches come back in the batch sampler's order; at most
``workers * prefetch`` are loaded ahead of the consumer. The pool lives for one iteration (one
epoch) and is ended when the iteration ends or is abandoned.

A batch's big arrays do not travel through the pool's pipe (pickling a batch of frames costs more
than reading it from the store): the worker's :func:`~stage2_data.loader.collate` pads them straight
into files of a private folder in ``/dev/shm`` (a memory file system) and this process maps them, so
they arrive without a copy. A file whose arrays this process no longer holds (every view of them
garbage-collected) is handed back to a worker for a later batch, so its memory is not allocated
and zeroed again (which costs more than the copy). The folder is removed when the iteration ends;
arrays still held stay valid. Without a writable ``/dev/shm`` (or with ``shared_memory=False``)
batches are pickled.
"""

from __future__ import annotations

import collections
import mmap
import multiprocessing
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, NamedTuple

import numpy as np

from ..errors import LoaderError
from .collate import collate, set_allocator

Collate = Callable[[Sequence[dict[str, Any]]], Any]


def numpy_collate(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """:func:`~stage2_data.loader.collate` with numpy arrays, torch imported or not (the default of
    :class:`PoolLoader`: its batches come back through shared files as numpy arrays; a trainer turns
    them into tensors with ``torch.from_numpy``, without a copy)."""
    return collate(items, to_torch=False)


# the dataset and collate of this worker process (set once by the pool's initializer)
_WORKER: dict[str, Any] = {}


def _init_worker(dataset: Any, collate_fn: Collate) -> None:
    _WORKER["dataset"] = dataset
    _WORKER["collate"] = collate_fn


def _load_batch(positions: Sequence[int], folder: str | None, reuse: list[str]) -> tuple[Any, list[str]]:
    """One collated batch (its big arrays in files of ``folder``, reusing the files ``reuse`` first),
    and the files of ``reuse`` it did not use."""
    ds = _WORKER["dataset"]
    items = [ds[int(i)] for i in positions]
    if folder is None:
        return _WORKER["collate"](items), reuse
    allocate = _ShmAllocator(folder, reuse)
    set_allocator(allocate)
    try:
        batch = _WORKER["collate"](items)
    finally:
        set_allocator(None)
    sent: dict[str, _InShm] = {}
    if isinstance(batch, dict):
        for key, value in batch.items():
            for arr, path in allocate.made:
                if value is arr:
                    sent[key] = _InShm(path, arr.dtype.str, tuple(arr.shape))
    used = {v.path for v in sent.values()}
    unused = allocate.reuse + [path for _, path in allocate.made if path not in used]
    return (batch | sent if sent else batch), unused


class _InShm(NamedTuple):
    """An array of a batch, at the start of the file ``path``."""

    path: str
    dtype: str
    shape: tuple[int, ...]


class _ShmAllocator:
    """Arrays of a page (4 KiB) and more as files of ``folder`` (in /dev/shm), mapped: a file of
    ``reuse`` (one no batch maps any more: its pages are there already) or a new one; smaller
    arrays plain."""

    def __init__(self, folder: str, reuse: list[str]) -> None:
        self.folder = folder
        self.reuse = list(reuse)
        self.made: list[tuple[np.ndarray, str]] = []

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < 4096:
            return np.empty(shape, dtype=dtype)
        if self.reuse:
            path = self.reuse.pop()
            fd = os.open(path, os.O_RDWR)
        else:
            fd, path = tempfile.mkstemp(dir=self.folder, prefix=f"batch-{os.getpid()}-")
        try:
            if os.fstat(fd).st_size < nbytes:
                os.ftruncate(fd, nbytes)
            arr = _map(fd, nbytes, dtype).reshape(shape)
        finally:
            os.close(fd)
        self.made.append((arr, path))
        return arr


def _map(fd: int, nbytes: int, dtype: np.dtype[Any]) -> np.ndarray:
    """The first ``nbytes`` of the file ``fd`` mapped shared, as a flat array, its pages populated up
    front (one call, not a page fault per 4 KiB)."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    mm = mmap.mmap(fd, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return np.frombuffer(mm, dtype=dtype)


def _receive(batch: Any, free: list[str]) -> Any:
    """A batch from a worker, its arrays in files mapped here; a file goes back to ``free`` (for a
    worker to reuse) once nothing in this process maps it any more."""
    if not isinstance(batch, dict):
        return batch
    out = {}
    for key, value in batch.items():
        if isinstance(value, _InShm):
            dtype = np.dtype(value.dtype)
            nbytes = int(np.prod(value.shape, dtype=np.int64)) * dtype.itemsize
            fd = os.open(value.path, os.O_RDWR)
            try:
                flat = _map(fd, nbytes, dtype)
            finally:
                os.close(fd)
            weakref.finalize(flat, free.append, value.path)  # every view of it gone: reusable
            out[key] = flat.reshape(value.shape)
        else:
            out[key] = value
    return out


def _shm_folder() -> str | None:
    """A new private folder in ``/dev/shm``, or None where there is none to write to."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        return None
    try:
        return tempfile.mkdtemp(prefix=f"stage2-loader-{os.getpid()}-", dir="/dev/shm")
    except OSError:
        return None


class PoolLoader:
    """``for batch in PoolLoader(dataset, batch_sampler, workers=2)``: collated batches of
    ``dataset`` (e.g. a :class:`~stage2_data.loader.Selection`) for each list of positions
    ``batch_sampler`` yields (e.g. :class:`~stage2_data.loader.ResolutionBatches`), loaded by
    ``workers`` processes started with ``context`` (``"fork"``, ``"spawn"``, ``"forkserver"``;
    None: the platform's default). ``workers=0`` loads in this process. Batches are numpy
    (:func:`numpy_collate`, the default ``collate_fn``). ``shared_memory``: batches come back
    through ``/dev/shm`` files (see the module docstring) rather than pickled."""

    def __init__(
        self,
        dataset: Any,
        batch_sampler: Iterable[Sequence[int]],
        *,
        collate_fn: Collate = numpy_collate,
        workers: int = 2,
        context: str | None = None,
        prefetch: int = 2,
        shared_memory: bool = True,
    ) -> None:
        if workers < 0 or prefetch < 1:
            raise LoaderError(
                f"workers={workers}, prefetch={prefetch}.", fix="give workers >= 0 and prefetch >= 1"
            )
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn
        self.workers = workers
        self.context = context
        self.prefetch = prefetch
        self.shared_memory = shared_memory

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self.workers == 0:
            for positions in self.batch_sampler:
                yield self.collate_fn([self.dataset[int(i)] for i in positions])
            return
        ctx = multiprocessing.get_context(self.context)
        pool = ProcessPoolExecutor(
            self.workers, mp_context=ctx, initializer=_init_worker, initargs=(self.dataset, self.collate_fn)
        )
        pending: collections.deque[Future[Any]] = collections.deque()
        folder = _shm_folder() if self.shared_memory else None
        free: list[str] = []  # files of folder no batch maps any more

        def receive() -> Any:
            batch, unused = pending.popleft().result()
            free.extend(unused)
            return _receive(batch, free)

        try:
            for positions in self.batch_sampler:
                reuse = [free.pop() for _ in range(min(2, len(free)))]
                pending.append(pool.submit(_load_batch, list(positions), folder, reuse))
                if len(pending) >= self.workers * self.prefetch:
                    yield receive()
            while pending:
                yield receive()
        except BrokenProcessPool as e:
            raise LoaderError(
                f"a worker process of the PoolLoader ({ctx.get_start_method()}) died: {e}",
                fix="run with workers=0 to see the error in this process; under spawn or forkserver the "
                "main module must start the loader under `if __name__ == '__main__':`",
            ) from e
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
