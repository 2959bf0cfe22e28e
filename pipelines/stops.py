"""Clean stops for ``stage2 build`` and ``stage2 demo``: SIGTERM and SIGINT stop a build from any
stage within seconds, in the foreground or in the background, worker processes included.

Why a guard of its own: Dagster handles interrupts itself while a run executes
(its interrupt handling: SIGINT and SIGTERM raise ``DagsterExecutionInterruptedError`` in
the step's code) and, when a run ends, maps SIGTERM to whatever SIGINT's handler was before. A
background shell (cron, nohup, a pod's entrypoint) starts a process with SIGINT *ignored*, so after
the first run SIGTERM would be ignored too: the build would go on, exit 0 and publish a store. And
``materialize(raise_on_error=False)`` turns an interrupt into a failed run, after which the build
would go on with the next stage.

:func:`stop_guard` (a context manager around the whole build):

- installs one handler for SIGTERM and SIGINT (SIGINT's default restored even when it was inherited
  as ignored), so Dagster's "restore SIGINT's handler, map SIGTERM to it" lands on this handler;
- learns of every SIGTERM/SIGINT whatever Python handler is installed at that moment (this one or
  Dagster's), through ``signal.set_wakeup_fd`` read by a watcher thread, and records the first;
- interrupts the main thread: this handler raises ``KeyboardInterrupt``; inside a run Dagster's own
  handler raises its interrupt in the step; :meth:`Stop.on_run` raises ``KeyboardInterrupt`` after
  any run that finished once a stop was asked (the build does not go on to the next run or stage);
- stops this process's downloads at once (``stage2_data.acquire.cancel_downloads``: a read blocked
  on the network is woken; the partial files are kept) and its extractions
  (``stage2_data.extract.cancel_extractions``: checked between members and copy chunks; the staging
  folder is removed), the kit's sidecar unpack among them (checked between members): a run's
  partitions, and the kit stage beside the main line (``runner.walk_stages``), run in threads, which
  an interrupt of the main thread does not stop (``assets._common.run_partitions`` drops the queued ones and does not wait for the rest;
  a worker process's own extractions are cancelled there when its step is interrupted);
- terminates the worker processes (every descendant: Dagster's multiprocess children, a local Dask
  cluster, a process pool) with SIGTERM at once and SIGKILL after ``grace`` seconds; a second signal
  kills at once. The build's Dagster webserver, its code server and the runs it launched are
  spared for ``SPARE_S`` seconds (:func:`spare`): the build cancels those runs through the instance
  (``launch.terminate_runs``), which needs their code server, so that they end as canceled;
- after ``hard_deadline`` seconds the process exits whatever its main thread is doing, also after
  the guard, while the interpreter waits for its threads at exit (the last resort: a thread that
  does not stop); it prints a line starting with ``HARD_EXIT_MARK``.

Nothing is published by a stop: the store is written under a temp folder and published by an atomic
rename at the very end (``stage2_data.publish``), a download keeps its ``archives/.partial`` file
(the next build resumes it) and temp folders are swept by the next build under the data root lock.
The command then prints one line and exits 130 (SIGINT) or 143 (SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from stage2_data.acquire import cancel_downloads
from stage2_data.extract import cancel_extractions

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
GRACE = 3.0  # seconds between SIGTERM and SIGKILL for worker processes
HARD_DEADLINE = 15.0  # seconds after the first signal: the process exits whatever it is doing
HARD_EXIT_MARK = "stage2: hard exit:"  # starts the line the last resort prints (tests look for it)

_RESOURCE_TRACKER = "multiprocessing.resource_tracker"  # exits on its own when its parent does

#: how long a stop leaves a spared process (:func:`spare`) and its descendants to the build
SPARE_S = 10.0
_SPARED: set[int] = set()


def spare(pid: int) -> None:
    """Leave ``pid`` and its descendants alone for the first ``SPARE_S`` seconds of a stop (a
    second signal, or the last resort, ends them at once): the build's Dagster webserver, through
    whose code server the build cancels its launched runs, so that they end as canceled instead of
    failed for want of their server."""
    _SPARED.add(pid)


def unspare(pid: int) -> None:
    _SPARED.discard(pid)


def _signame(signum: int) -> str:
    return signal.Signals(signum).name


@dataclass
class Stop:
    """What a stop guard saw: the first signal (``signum``, None while none arrived)."""

    grace: float = GRACE
    hard_deadline: float = HARD_DEADLINE
    watch: Path | None = None  # the `current` link of the store: published during the stop?
    signum: int | None = None
    count: int = 0
    at: float | None = None
    _raised: bool = False
    _cancelled: bool = False
    _stderr_fd: int = 2
    # re-entrant: the signal handler takes it in the main thread, and a second signal can run the
    # handler again inside the first (a plain lock would then wait for itself)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _done: threading.Event = field(default_factory=threading.Event)
    _signalled: dict[int, float] = field(default_factory=dict)  # pid -> when it was sent SIGTERM
    _watch_before: str | None = None

    # ----- what the command says -----
    @property
    def stopped(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(signal.Signals(self.signum), 128 + int(self.signum)) if self.signum else 0

    def published(self) -> bool:
        """True when the watched ``current`` link changed since the guard started."""
        return self.watch is not None and _link_target(self.watch) != self._watch_before

    def message(self) -> str:
        name = _signame(self.signum) if self.signum else "a signal"
        if self.published() and self.watch is not None and _link_target(self.watch) is None:
            return (
                f"stopped by {name}: nothing is published now (`current` named {self._watch_before}, "
                "whose store failed the publication gate and was moved aside to be built again); rerun to "
                "build and publish it"
            )
        if self.published():
            return (
                f"stopped by {name} after the store was published ({_link_target(self.watch) if self.watch else ''});"
                " rerun to check it"
            )
        return f"stopped by {name}: nothing was published; rerun to resume (partial downloads kept)"

    # ----- the main thread -----
    def check(self) -> None:
        """Raise KeyboardInterrupt (once) when a stop was asked: call it between runs."""
        if (
            self.signum is not None
            and not self._raised
            and threading.current_thread() is threading.main_thread()
        ):
            self._raised = True
            raise KeyboardInterrupt(_signame(self.signum))

    def on_run(self, inner: Callable[[dict[str, Any]], None] | None) -> Callable[[dict[str, Any]], None]:
        """``inner`` (a build's per-run callback), then :meth:`check`: a run that ended because of a
        stop (Dagster reports an interrupted run as failed) ends the build instead of the next run
        or stage starting."""

        def call(run: dict[str, Any]) -> None:
            if inner is not None and self.signum is None:
                inner(run)
            self.check()

        return call

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self._note(signum)
        if not self._done.is_set():  # the guard is ending: it reports the stop, nothing to interrupt
            self.check()

    # ----- the watcher thread -----
    def _note(self, signum: int, *, counted: bool = False) -> None:
        with self._lock:
            if counted:
                self.count += 1
            if self.signum is None:
                self.signum = signum
                self.at = time.monotonic()

    def _watch(self, rfd: int) -> None:
        while not self._done.is_set():
            ready, _, _ = select.select([rfd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(rfd, 64)
                except (BlockingIOError, InterruptedError):
                    data = b""
                for b in data:
                    if b in (signal.SIGINT, signal.SIGTERM):
                        self._note(b, counted=True)
            if self.signum is None:
                continue
            if not self._cancelled:  # downloads (partials kept) and extractions in threads stop at once
                self._cancelled = True
                cancel_downloads()
                cancel_extractions()
            if self.count > 1:  # a second signal: no more waiting
                self.terminate_workers(kill=True)
            else:
                self.terminate_workers()
            if self.at is not None and time.monotonic() - self.at > self.hard_deadline:
                self._hard_exit()

    def _hard_exit(self, *, said: bool = False) -> None:
        """The last resort (``said``: the command printed its line already)."""
        with contextlib.suppress(Exception):
            self.terminate_workers(kill=True)
        with contextlib.suppress(Exception):
            # to the stderr the build started with: during a step Dagster points fd 2 at the step's
            # compute log (echoed by a `tail` that was just killed); no lock: the main thread may hold it
            lines = [] if said else [self.message()]
            # which threads were still running: where a stop that needed the last resort was stuck
            alive = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
            lines.append(
                f"{HARD_EXIT_MARK} a thread did not stop within {self.hard_deadline:g} s "
                f"(still running: {', '.join(alive[:8]) or 'none'})"
            )
            os.write(self._stderr_fd, "".join(f"{line}\n" for line in lines).encode())
        os._exit(self.exit_code or 1)

    def _exit_by_deadline(self) -> None:
        """After the guard (a stopping process): the interpreter's exit waits for non-daemon threads
        (a partition's thread that did not stop); exit at the hard deadline anyway."""
        fd = 2
        with contextlib.suppress(OSError):
            fd = os.dup(self._stderr_fd)  # the guard closes its own copy

        def wait() -> None:
            time.sleep(max(0.0, (self.at or time.monotonic()) + self.hard_deadline - time.monotonic()))
            self._stderr_fd = fd
            self._hard_exit(said=True)

        threading.Thread(target=wait, name="stage2-hard-exit", daemon=True).start()

    def terminate_workers(self, *, kill: bool = False) -> list[int]:
        """SIGTERM every descendant not yet sent one; SIGKILL those sent one ``grace`` seconds ago
        (all of them with ``kill``). Returns the descendants still alive."""
        now = time.monotonic()
        alive = []
        table = _proc_table()
        # a worker's own children stay ours to end when the worker dies first (then init adopts them)
        seen = [p for p in self._signalled if p in table and table[p][1] != "Z"]
        left: set[int] = set()
        if not kill and self.at is not None and now - self.at < SPARE_S:
            for pid in _SPARED:
                left |= {pid, *descendants(pid, table=table)}
        for pid in dict.fromkeys([*descendants(table=table), *seen]):
            if pid in left:
                alive.append(pid)
                continue
            sent = self._signalled.get(pid)
            try:
                if kill or (sent is not None and now - sent >= self.grace):
                    os.kill(pid, signal.SIGKILL)
                elif sent is None:
                    os.kill(pid, signal.SIGTERM)
                    self._signalled[pid] = now
            except OSError:
                continue
            alive.append(pid)
        return alive

    def reap(self) -> None:
        """Terminate the descendants, wait up to ``grace`` for them, kill the rest."""
        deadline = time.monotonic() + self.grace
        while self.terminate_workers() and time.monotonic() < deadline:
            time.sleep(0.05)
        deadline = time.monotonic() + self.grace
        while self.terminate_workers(kill=True) and time.monotonic() < deadline:
            time.sleep(0.05)


def _proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) of every process (Linux /proc; psutil elsewhere)."""
    out: dict[int, tuple[int, str, str]] = {}
    if not os.path.isdir("/proc/self"):
        import psutil  # not Linux: psutil (comes with the dask extra) or nothing

        for p in psutil.process_iter(["ppid", "status", "cmdline"]):
            st = "Z" if p.info["status"] == psutil.STATUS_ZOMBIE else "R"
            out[p.pid] = (p.info["ppid"] or 0, st, " ".join(p.info["cmdline"] or []))
        return out
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        out[int(name)] = (int(fields[1]), fields[0], cmd)
    return out


def descendants(pid: int | None = None, *, table: dict[int, tuple[int, str, str]] | None = None) -> list[int]:
    """The live (not zombie) descendants of ``pid`` (this process), but multiprocessing's resource
    tracker (it ends on its own when its parent does; killing it makes the parent warn)."""
    root = os.getpid() if pid is None else pid
    table = _proc_table() if table is None else table
    kids: dict[int, list[int]] = {}
    for p, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(p)
    out, todo = [], list(kids.get(root, []))
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, []))
        _, state, cmd = table[p]
        if state != "Z" and _RESOURCE_TRACKER not in cmd:
            out.append(p)
    return out


def _signal_group(p: subprocess.Popen[str] | subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process group led by ``p`` (started with start_new_session=True)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def _group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` is still running (a zombie, ended but not yet reaped by its
    parent, is not: it holds no port, file or lock)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after its ")"
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def stop_groups(procs: Sequence[subprocess.Popen[str] | subprocess.Popen[bytes]], grace: float) -> None:
    """End the process groups led by ``procs``, all at once: SIGTERM to every process of each group,
    SIGKILL to what is left after ``grace`` seconds; returns once every leader is reaped."""
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if all(p.poll() is not None and not _group_alive(p.pid) for p in procs):
            return
        time.sleep(0.1)
    for p in procs:
        _signal_group(p, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def _link_target(p: Path) -> str | None:
    try:
        return os.readlink(p)
    except OSError:
        return None


@contextlib.contextmanager
def stop_guard(
    *, watch: Path | None = None, grace: float = GRACE, hard_deadline: float = HARD_DEADLINE
) -> Iterator[Stop]:
    """Stop the enclosed build cleanly on SIGTERM or SIGINT (see the module doc). An exception raised
    in the block once a stop was asked (the interrupt itself, or a worker's death) is swallowed: the
    caller looks at ``stop.stopped`` and says ``stop.message()``. Outside the main thread: a no-op."""
    stop = Stop(grace=grace, hard_deadline=hard_deadline, watch=watch)
    if watch is not None:
        stop._watch_before = _link_target(watch)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with contextlib.suppress(OSError):
        stop._stderr_fd = os.dup(2)
    rsock, wsock = socket.socketpair()
    rsock.setblocking(False)
    wsock.setblocking(False)
    old_fd = signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
    for s in old:
        signal.signal(s, stop._handler)
    watcher = threading.Thread(target=stop._watch, args=(rsock.fileno(),), name="stage2-stops", daemon=True)
    watcher.start()
    try:
        yield stop
    except BaseException:
        if not stop.stopped:
            raise
    finally:
        if stop.stopped:
            stop.reap()
        stop._done.set()
        watcher.join(timeout=1.0)
        cancel_downloads(False)
        if stop.stopped:
            stop._exit_by_deadline()  # the extractions stay cancelled: this process is stopping
        else:
            cancel_extractions(False)
        signal.set_wakeup_fd(old_fd)
        for s, h in old.items():
            # a disposition set outside Python (None) cannot be restored: back to the default
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        rsock.close()
        wsock.close()
        if stop._stderr_fd != 2:
            os.close(stop._stderr_fd)
