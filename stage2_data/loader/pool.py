"""Batches loaded by worker processes without torch: :class:`PoolLoader`, a ``multiprocessing`` pool
that does what a DataLoader with ``num_workers`` does (for numpy, JAX, or a quick look).

Each worker gets the dataset once (inherited under fork, pickled under spawn or forkserver: the
reader re-pins the same store and takes its own lease there), then turns each batch of positions
into one collated batch. Batches come back in the batch sampler's order; at most
``workers * prefetch`` are loaded ahead of the consumer. The pool lives for one iteration (one
epoch) and is ended when the iteration ends or is abandoned; with ``persistent_workers=True`` it
lives until :meth:`PoolLoader.close`, serving every epoch.

A worker loading a :class:`~stage2_data.loader.Selection` with the default collate decodes each
sample's frames straight into its slot of the padded batch (``Selection.item(i,
defer_frames=True)``): the frames are read from the store's shard file (one ``preadv`` of the
chunk, never a mapping: :mod:`stage2_data.store.shard_files`), their crc32c checked, and decoded
into the shared batch.

A batch's big arrays do not travel through the pool's pipe (pickling a batch of frames costs more
than reading it from the store): the worker's :func:`~stage2_data.loader.collate` pads them straight
into files of a private folder in ``/dev/shm`` (a memory file system) and this process maps them, so
they arrive without a copy. A file whose arrays this process no longer holds (every view of them
garbage-collected) is handed back to a worker for a later batch, so its memory is not allocated
and zeroed again (which costs more than the copy). The folder is removed when the iteration ends;
arrays still held stay valid. Without a writable ``/dev/shm`` (or with ``shared_memory=False``)
batches are pickled.

A worker whose loader's process dies without ending it (``kill -TERM`` / ``-KILL`` by SLURM,
Kubernetes or a shell: Python's default SIGTERM ends the process without running finalizers, so no
``close`` runs) notices within :data:`PARENT_CHECK_SECONDS`: its parent process changed
(``os.getppid()``, as a torch DataLoader worker's watchdog checks). It then removes the loader's
``/dev/shm`` folder (renamed first, so no worker writes a new file into it meanwhile) and exits, so
no worker outlives its loader holding the store's files and its lease. The library installs no
signal handler: that is the application's to choose.

A folder nobody removed (its loader's process and workers killed together, e.g. ``kill -KILL`` of
a process group, or the OOM killer) is removed by the next PoolLoader that makes a folder: each
folder holds a file ``.alive`` that its loader's process keeps locked (``flock``, shared) while it
uses the folder (its fork workers too); the kernel drops the lock when that process dies, however
it dies, so a folder whose ``.alive`` nobody holds locked is an orphan. The pid in a folder's name
decides nothing, so a live loader of another PID namespace sharing ``/dev/shm`` (a container) is
never taken for an orphan.

Under spawn and forkserver the dataset and ``collate_fn`` reach the workers through a temporary
file (:class:`_Shipped`), never in the message that starts a worker: that message goes through a
pipe that the parent process fills before the worker reads it, and one larger than the pipe's
buffer (64 KiB; a Selection of a store of a few thousand samples pickles to more) would block the
loader for ever when a worker ends before reading it: a script that starts a PoolLoader at its top
level, not under ``if __name__ == "__main__":``, makes each worker import it again and end at
multiprocessing's own "bootstrapping phase" error. The loader then sees its pool broken and raises
a :class:`~stage2_data.errors.LoaderError` naming the guard and the script. What does not pickle (a
lambda or local function as the transform or ``collate_fn``, a dataset holding a lock) is a
:class:`~stage2_data.errors.LoaderError` naming it, raised while writing that file, before any
worker starts (:func:`_not_picklable`).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import mmap
import multiprocessing
import operator
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import reduction
from typing import Any, NamedTuple

import numpy as np

from ..errors import LoaderError
from .collate import collate, set_allocator
from .select import Selection

Collate = Callable[[Sequence[dict[str, Any]]], Any]


def numpy_collate(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """:func:`~stage2_data.loader.collate` with numpy arrays, torch imported or not (the default of
    :class:`PoolLoader`: its batches come back through shared files as numpy arrays; a trainer turns
    them into tensors with ``torch.from_numpy``, without a copy)."""
    return collate(items, to_torch=False)


# the dataset and collate of this worker process (set once by the pool's initializer)
_WORKER: dict[str, Any] = {}

#: how often a worker checks that the process of its loader still lives (seconds)
PARENT_CHECK_SECONDS = 0.25


class _Shipped:
    """The dataset and collate function of a pool's workers, pickled once into an unnamed temporary
    file (removed by the system when its last descriptor closes, however this process ends). A
    worker started by spawn or forkserver gets a descriptor of it (passed as a Connection's is) and
    reads them from it, so the message that starts the worker stays a few KiB (see the module
    docstring)."""

    def __init__(self, dataset: Any, collate_fn: Collate, start_method: str) -> None:
        self._file = tempfile.TemporaryFile(prefix="stage2-loader-dataset-")  # noqa: SIM115 (closed by close())
        try:
            pickle.dump((dataset, collate_fn), self._file, protocol=pickle.HIGHEST_PROTOCOL)
            self._file.flush()
        except _UNPICKLABLE as e:
            self._file.close()
            raise _not_picklable(dataset, collate_fn, start_method, e) from None
        except BaseException:
            self._file.close()
            raise
        self._size = self._file.tell()

    def __reduce__(self) -> tuple[Any, ...]:
        return _unship, (reduction.DupFd(self._file.fileno()), self._size)

    def close(self) -> None:
        self._file.close()


# what pickle raises for what it cannot pickle: PicklingError (a lambda; any local function from
# Python 3.14), AttributeError (a local function up to 3.13), TypeError (an open file, a lock, ...)
# what pickling a user's object raises: pickle's own error, and whatever its __reduce__ raises
_UNPICKLABLE = (Exception,)


def _not_picklable(dataset: Any, collate_fn: Collate, start_method: str, error: BaseException) -> LoaderError:
    """The error for a dataset and collate function that do not pickle (so cannot reach workers
    started by spawn or forkserver), naming what does not: the dataset's ``transform``,
    ``collate_fn`` or the dataset itself, the first of them that fails to pickle alone."""
    parts: list[tuple[str, Any]] = []
    transform = getattr(dataset, "transform", None)
    if transform is not None:
        parts.append(("transform", transform))
    parts += [("collate_fn", collate_fn), ("dataset", dataset)]
    what, obj = "dataset", dataset
    for part_name, part in parts:
        try:
            pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
        except _UNPICKLABLE as e:
            what, obj, error = part_name, part, e
            break
    shown = getattr(obj, "__qualname__", None) or type(obj).__name__
    if what == "dataset":
        whose = f"the dataset ({shown})"
        fix = "make the dataset picklable (no lambda, local function, open file or lock among its attributes)"
    else:
        whose = f"the {what} {shown}" + (f" of the {type(dataset).__name__}" if what == "transform" else "")
        name, arg = ("my_transform", "sample") if what == "transform" else ("my_collate", "items")
        fix = (
            f"define the {what} with `def` at the top level of a module (your script's top level will "
            f"do: `def {name}({arg}): ...`, then {what}={name}), not as a lambda or inside a function"
        )
    return LoaderError(
        f"PoolLoader: {whose} cannot be pickled ({error}), and workers started by {start_method} get "
        "the dataset and collate_fn pickled.",
        fix=f'{fix}; or start the workers by fork, which pickles nothing: PoolLoader(..., context="fork")',
    )


def _unship(dupfd: Any, size: int) -> tuple[Any, Collate]:
    """The dataset and collate function of :class:`_Shipped`, in a worker (its descriptor closed)."""
    fd = dupfd.detach()
    try:
        data = bytearray()
        while len(data) < size:  # (pread: the file's offset is shared with the loader and workers)
            chunk = os.pread(fd, size - len(data), len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    dataset, collate_fn = pickle.loads(data)
    return dataset, collate_fn


def _init_worker(work: tuple[Any, Collate], loader_pid: int, folder: str | None) -> None:
    """A worker's start: ``work`` is the dataset and collate function (inherited under fork, read
    from a :class:`_Shipped` file under spawn and forkserver)."""
    _WORKER["dataset"], _WORKER["collate"] = work
    watch = threading.Thread(
        target=_watch_parent,
        args=(os.getppid(), loader_pid, folder),
        name="stage2-loader-parent-watch",
        daemon=True,
    )
    watch.start()


def _parent_gone(parent: int, loader_pid: int) -> bool:
    """Whether the loader's process (``loader_pid``) is gone: this worker's parent (``parent`` at
    its start: the loader's process under fork and spawn, the server under forkserver, which ends
    with it) is no longer its parent (it died: the worker went to init or a subreaper). The
    worker's parent being another process from the start (forkserver, or the loader's process died
    before this worker started), the loader's process no longer existing counts too."""
    if os.getppid() != parent:
        return True
    if parent == loader_pid:
        return False
    try:
        os.kill(loader_pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _watch_parent(parent: int, loader_pid: int, folder: str | None) -> None:
    """A worker's watchdog thread: once the loader's process is gone (:func:`_parent_gone`), remove
    the loader's ``/dev/shm`` folder and end this process (its store files and lease with it)."""
    while not _parent_gone(parent, loader_pid):
        time.sleep(PARENT_CHECK_SECONDS)
    try:
        if folder is not None:
            _remove_orphaned(folder)
    finally:
        os._exit(1)


def _remove_orphaned(folder: str) -> None:
    """Remove the folder of a loader whose process died: renamed first (one worker wins the rename;
    a worker still loading a batch then finds no folder to write a new file in), then removed."""
    gone = f"{folder}-orphaned-{os.getpid()}"
    try:
        os.rename(folder, gone)
    except OSError:
        return  # another worker took it (or it is gone already)
    shutil.rmtree(gone, ignore_errors=True)


def _items(ds: Any, collate_fn: Collate, positions: Sequence[int]) -> list[Any]:
    """The items of a batch; for a Selection and our collate with their frames deferred, so collate
    decodes them straight into the batch (no array per sample in between)."""
    if collate_fn in (numpy_collate, collate) and isinstance(ds, Selection):
        return [ds.item(int(i), defer_frames=True) for i in positions]
    return [ds[int(i)] for i in positions]


def _load_batch(positions: Sequence[int], folder: str | None, reuse: list[str]) -> tuple[Any, list[str]]:
    """One collated batch (its big arrays in files of ``folder``, reusing the files ``reuse`` first),
    and the files of ``reuse`` it did not use."""
    items = _items(_WORKER["dataset"], _WORKER["collate"], positions)
    if folder is None:
        return _WORKER["collate"](items), reuse
    allocate = _ShmAllocator(folder, reuse, _WORKER.setdefault("maps", {}))
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
    ``reuse`` (one no batch maps any more: its pages are there already, and mapped already in this
    process if it served here before: ``maps``) or a new one; smaller arrays plain."""

    def __init__(self, folder: str, reuse: list[str], maps: dict[str, mmap.mmap]) -> None:
        self.folder = folder
        self.reuse = list(reuse)
        self.maps = maps
        self.made: list[tuple[np.ndarray, str]] = []

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < 4096:
            return np.empty(shape, dtype=dtype)
        if self.reuse:
            path = self.reuse.pop()
        else:
            fd, path = tempfile.mkstemp(dir=self.folder, prefix=f"batch-{os.getpid()}-")
            os.close(fd)
        mm = _mapped(path, nbytes, self.maps)
        arr = np.frombuffer(mm, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)
        self.made.append((arr, path))
        return arr


def _mapped(path: str, nbytes: int, maps: dict[str, mmap.mmap]) -> mmap.mmap:
    """The file ``path`` (grown to ``nbytes`` if shorter) mapped shared, once per process: ``maps``
    keeps each file's mapping (replaced when the file outgrew it), so a file reused for batch after
    batch costs no system call and no page fault; its pages are populated when first mapped (one
    call, not a fault per 4 KiB)."""
    mm = maps.get(path)
    if mm is not None and len(mm) >= nbytes:
        return mm
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size < nbytes:
            os.ftruncate(fd, nbytes)
            size = nbytes
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mm = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    maps[path] = mm  # (a smaller mapping it replaces lives on while an array of it does)
    return mm


def _receive(batch: Any, free: list[str], maps: dict[str, mmap.mmap]) -> Any:
    """A batch from a worker, its arrays in files mapped here (``maps``: each file once); a file
    goes back to ``free`` (for a worker to reuse) once no array of this process uses it any more."""
    if not isinstance(batch, dict):
        return batch
    out = {}
    for key, value in batch.items():
        if isinstance(value, _InShm):
            dtype = np.dtype(value.dtype)
            count = int(np.prod(value.shape, dtype=np.int64))
            flat = np.frombuffer(_mapped(value.path, count * dtype.itemsize, maps), dtype=dtype, count=count)
            weakref.finalize(flat, free.append, value.path)  # every view of it gone: reusable
            out[key] = flat.reshape(value.shape)
        else:
            out[key] = value
    return out


_ALIVE = ".alive"  # in a loader's /dev/shm folder: locked by the loader's process while it lives


def _shm_folder() -> tuple[str, int] | None:
    """A new private folder in ``/dev/shm`` and the descriptor of its ``.alive`` file, locked
    (shared) for as long as this process keeps it open; None where there is no folder to write to.
    Orphaned folders of earlier loaders are removed first (:func:`_sweep_orphaned`)."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        return None
    _sweep_orphaned("/dev/shm")
    try:
        folder = tempfile.mkdtemp(prefix=f"stage2-loader-{os.getpid()}-", dir="/dev/shm")
    except OSError:
        return None
    fd = -1
    try:
        fd, locking = tempfile.mkstemp(dir=folder, prefix=f"{_ALIVE}-")
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.rename(locking, os.path.join(folder, _ALIVE))  # named .alive only once locked
    except OSError:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return folder, fd


def _sweep_orphaned(root: str) -> None:
    """Remove the loader folders of ``root`` whose ``.alive`` no process holds locked (their
    loader's process died without removing them). A folder without one (being made right now, or
    another user's, which this process cannot open) is left alone."""
    try:
        names = [n for n in os.listdir(root) if n.startswith("stage2-loader-")]
    except OSError:
        return
    for name in names:
        folder = os.path.join(root, name)
        try:
            fd = os.open(os.path.join(folder, _ALIVE), os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live loader holds it
        try:
            _remove_orphaned(folder)
        finally:
            os.close(fd)


class PoolLoader:
    """``for batch in PoolLoader(dataset, batch_sampler, workers=2)``: collated batches of
    ``dataset`` (e.g. a :class:`~stage2_data.loader.Selection`) for each list of positions
    ``batch_sampler`` yields (e.g. :class:`~stage2_data.loader.ResolutionBatches`), loaded by
    ``workers`` processes started with ``context`` (``"fork"``, ``"spawn"``, ``"forkserver"``;
    None: the platform's default). ``workers=0`` loads in this process. Batches are numpy
    (:func:`numpy_collate`, the default ``collate_fn``). ``shared_memory``: batches come back
    through ``/dev/shm`` files (see the module docstring) rather than pickled.

    ``persistent_workers`` (as a DataLoader's): the workers, their ``/dev/shm`` folder and its
    files live from the first iteration until :meth:`close` (or the end of a ``with`` block, or
    the loader's garbage collection), so later epochs start no process, open no shard and find
    their batch files allocated already; the workers keep the dataset they were started with.

    The workers end by themselves, removing the ``/dev/shm`` folder, when this process dies without
    closing the loader (SIGTERM, SIGKILL; see the module docstring)."""

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
        persistent_workers: bool = False,
    ) -> None:
        def whole(v: object) -> bool:  # an int or a numpy integer, not a bool
            try:
                operator.index(v)  # type: ignore[arg-type]
            except TypeError:
                return False
            return not isinstance(v, bool)

        if not (whole(workers) and whole(prefetch)) or workers < 0 or prefetch < 1:
            raise LoaderError(
                f"workers={workers!r}, prefetch={prefetch!r}.",
                fix="give workers >= 0 and prefetch >= 1, as integers",
            )
        workers, prefetch = operator.index(workers), operator.index(prefetch)
        starts = multiprocessing.get_all_start_methods()
        if context is not None and context not in starts:
            raise LoaderError(
                f"context={context!r} is not a start method of this platform ({', '.join(starts)}).",
                fix=f"give context= one of {', '.join(map(repr, starts))}, or None (the platform's default)",
            )
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn
        self.workers = workers
        self.context = context
        self.prefetch = prefetch
        self.shared_memory = shared_memory
        self.persistent_workers = persistent_workers
        self._pool: ProcessPoolExecutor | None = None
        self._shipped: _Shipped | None = None  # the dataset's file for spawn / forkserver workers
        self._folder: str | None = None
        self._alive: int | None = None  # the folder's .alive, locked while this loader uses it
        self._free: list[str] = []  # files of the folder no batch maps any more
        self._maps: dict[str, mmap.mmap] = {}  # the folder's files, each mapped once here

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def close(self) -> None:
        """End the worker processes and remove their ``/dev/shm`` folder (batches still held stay
        valid); the next iteration starts new ones."""
        pool, self._pool = self._pool, None
        folder, self._folder = self._folder, None
        alive, self._alive = self._alive, None
        shipped, self._shipped = self._shipped, None
        self._free = []
        self._maps = {}  # (the mappings of batches still held live on with them)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if shipped is not None:
            shipped.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        if alive is not None:
            os.close(alive)

    def __enter__(self) -> PoolLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _start(self) -> tuple[ProcessPoolExecutor, str | None]:
        if self._pool is None:
            ctx = multiprocessing.get_context(self.context)
            work: Any = (self.dataset, self.collate_fn)  # (a _Shipped unpickles to this in a worker)
            if ctx.get_start_method() != "fork":
                work = self._shipped = _Shipped(self.dataset, self.collate_fn, ctx.get_start_method())
            made = _shm_folder() if self.shared_memory else None
            self._folder, self._alive = made if made is not None else (None, None)
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=ctx,
                initializer=_init_worker,
                initargs=(work, os.getpid(), self._folder),
            )
            self._free = []
            self._maps = {}
        return self._pool, self._folder

    def __iter__(self) -> Iterator[Any]:
        if self.workers == 0:
            for positions in self.batch_sampler:
                yield self.collate_fn(_items(self.dataset, self.collate_fn, positions))
            return
        pool, folder = self._start()
        pending: collections.deque[Future[Any]] = collections.deque()
        free, maps = self._free, self._maps

        def receive() -> Any:
            batch, unused = pending.popleft().result()
            free.extend(unused)
            return _receive(batch, free, maps)

        done = False
        try:
            for positions in self.batch_sampler:
                reuse = [free.pop() for _ in range(min(2, len(free)))]
                pending.append(pool.submit(_load_batch, list(positions), folder, reuse))
                if len(pending) >= self.workers * self.prefetch:
                    yield receive()
            while pending:
                yield receive()
            done = True
        except BrokenProcessPool as e:
            start = multiprocessing.get_context(self.context).get_start_method()
            main = getattr(sys.modules.get("__main__"), "__file__", None) or "the main module"
            raise LoaderError(
                f"a worker process of the PoolLoader ({start}) died: {e}",
                fix="the worker's own error above says why; under spawn or forkserver each worker "
                f"imports {main} again, so the code that starts the loader must be under "
                '`if __name__ == "__main__":` there, and the transform, collate_fn and dataset class '
                "defined at a module's top level, not inside that block (a worker cannot find them "
                'there); or pass context="fork"; workers=0 runs it all in this process',
            ) from None
        finally:
            if not (done and self.persistent_workers):
                self._end_iteration(pending)

    def _end_iteration(self, pending: collections.deque[Future[Any]]) -> None:
        """An iteration ended early (or the workers are not persistent): its batches still loading
        are dropped (their files reused when the workers persist), else the pool is ended."""
        for f in pending:
            f.cancel()
        if not self.persistent_workers or self._pool is None or getattr(self._pool, "_broken", False):
            self.close()
            return
        for f in pending:
            if f.cancelled():
                continue
            with contextlib.suppress(Exception):
                batch, unused = f.result()
                self._free.extend(unused)
                if isinstance(batch, dict):
                    self._free.extend(v.path for v in batch.values() if isinstance(v, _InShm))
