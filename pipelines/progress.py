"""Progress of ``stage2 build`` / ``stage2 demo`` at run granularity, drawn with rich: for each stage,
partitions done/total, bytes, rate, ETA and elapsed time.

A stage is one run over its partitions; progress advances as that run materializes each partition
(the runner's ``on_run`` callback, fed while the run goes on by ``watch.RunWatcher``, which reads the
run's events from the instance), and for the rest when the run ends. Bytes come from the profile's
pinned archive sizes, so rate and ETA are exact in bytes, not guesses: a finished
``archive_file[k]`` run has downloaded what the archives of cache key ``k`` still missed when the
build started (nothing, for archives already on disk: a stage where nothing downloads shows no
bytes and no ETA); a finished ``cache_dir[k]`` run has read the archives of ``k``. With
``data_root``, the download stage also counts the bytes of the downloads still going on, read from
their files (``archives/.partial/<path>.part``, then ``archives/<path>``) at most every
``LIVE_BYTES_EVERY`` seconds: a cache key of several GiB moves the line, its rate and its ETA while
it downloads, not only when its run reports it.

With ``data_root``, a stage is "up to date" when its runs succeeded and wrote nothing: the stats
(inode, size, mtime) of what it writes (archives and their ``.verified.json`` records, extraction
records and cache directories, the extraction report, the sidecars' record, the join table, the
stores' folder and the ``current`` link) are the same after it as when the build started. Its line then says so, in
place of partitions and bytes: ``up to date`` when the runner found nothing for it to do (no run),
``checked, nothing changed`` when its runs ran (``--reverify``, or after a stage that ran) and found
everything as it was. Off a terminal the runs of a stage expected to be up to date are held back
and the stage prints that one line instead (the held-back lines, if it wrote something). The
extract stage counts the archive bytes of the cache keys that are not up to date only.

On a terminal (and not CI, not ``TERM=dumb``), rich draws one live line per stage as the stage starts
(redrawn in place by rich's refresh thread, so elapsed time keeps moving) and prints failures above
them; otherwise only plain lines are written: one per finished run. Imported only when a build runs
(rich comes with the pipeline extra); the Dagster-free library has no progress display.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Column
from rich.text import Text

from stage2_data import layout
from stage2_data.acquire import archive_state, remaining_download_bytes, verified_sha256s
from stage2_data.extract import check_extraction
from stage2_data.fsutil import human_bytes
from stage2_data.kit.sidecar_facts import SIDECAR_MARKER
from stage2_data.kit.sidecars import sidecars_status
from stage2_data.profile import Profile
from stage2_data.stages import (
    ACQUIRE,
    EXTRACT,
    KIT,
    PROFILE,
    STAGES,
    STORE,
    STREAMED,
    Stage,
    needs,
    ready_stages,
    stage_of,
)

LIVE_BYTES_EVERY = 0.5  # seconds between two readings of the downloads' file sizes

# Width of the live lines when they go to something that is not a terminal (live=True on a
# StringIO): wide enough that no line is cut. On a terminal rich uses the terminal's width.
_OFF_TERMINAL_WIDTH = 160


def human_seconds(s: float) -> str:
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _isatty(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed
        return False


def interactive(stream: IO[str]) -> bool:
    """True when live lines make sense: a terminal that understands cursor movement, and not CI."""
    if os.environ.get("CI") or os.environ.get("TERM", "").lower() in ("dumb", "unknown"):
        return False
    return _isatty(stream)


def extracted_keys(profile: Profile, data_root: Path) -> set[str]:
    """The cache keys whose extraction is up to date (stats only: ``check_extraction``)."""
    return {
        k
        for k in profile.cache_keys()
        if check_extraction(data_root, k, verified_sha256s(profile, data_root, k))[1] is None
    }


def partition_bytes(
    profile: Profile, data_root: Path | None = None, up_to_date_keys: set[str] | None = None
) -> dict[str, dict[str, int]]:
    """The bytes a finished run of each partition (a cache key) has moved, by partitioned stage: for
    the acquire stage, its archives' bytes still to download (their pinned sizes when ``data_root``
    is None); for the extract stage, its archives' sizes (what its extraction reads; 0 for a key in
    ``up_to_date_keys``, default: those of :func:`extracted_keys` with ``data_root``, none
    without)."""
    if data_root is None:
        download = {a.path: int(a.size or 0) for a in profile.archives}
        done_keys = up_to_date_keys or set()
    else:
        download = {a.path: remaining_download_bytes(data_root, a) for a in profile.archives}
        done_keys = extracted_keys(profile, data_root) if up_to_date_keys is None else up_to_date_keys
    by_key = profile.archives_by_cache_key()
    return {
        ACQUIRE.name: {k: sum(download[a.path] for a in specs) for k, specs in by_key.items()},
        EXTRACT.name: {
            k: 0 if k in done_keys else sum(int(a.size or 0) for a in specs) for k, specs in by_key.items()
        },
    }


def _stat(p: Path) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(p)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def stage_outputs(profile: Profile, data_root: Path) -> dict[str, Any]:
    """Per stage, the stats of everything it writes under ``data_root`` (no file is read): equal
    before and after a stage when it wrote nothing. The profile stage writes nothing."""
    archives = [
        (_stat(layout.archive_path(data_root, a.path)), _stat(layout.verified_record_path(data_root, a.path)))
        for a in profile.archives
    ]
    keys = [
        (_stat(layout.extraction_record_path(data_root, k)), _stat(layout.cache_dir(data_root, k)))
        for k in profile.cache_keys()
    ]
    link = layout.current_store_path(data_root, profile.name)
    try:
        target: str | None = os.readlink(link)
    except OSError:
        target = None
    derived = layout.derived_root(data_root)
    kit = [_stat(derived / SIDECAR_MARKER), _stat(derived / layout.SIDECARS_DIR)]
    store = [
        _stat(layout.extraction_report_path(data_root)),
        _stat(layout.join_table_path(data_root)),
        _stat(link),
        target,
        _stat(layout.stores_root(data_root, profile.name)),  # a store added or removed
    ]
    return {PROFILE.name: (), ACQUIRE.name: archives, KIT.name: kit, EXTRACT.name: keys, STORE.name: store}


def expected_up_to_date(profile: Profile, data_root: Path, up_to_date_keys: set[str]) -> dict[str, bool]:
    """Which stages should have nothing to do (stats only), to hold back their run lines off a
    terminal: every archive verified; every cache key extracted; a store published (and the rest
    of the build up to date). Whether a stage was up to date is decided after it, by its outputs."""
    acquire = all(archive_state(data_root, a).state == "verified" for a in profile.archives)
    extract = set(profile.cache_keys()) <= up_to_date_keys
    store = (layout.current_store_path(data_root, profile.name) / "manifest.json").is_file() and all(
        p.is_file() for p in (layout.extraction_report_path(data_root), layout.join_table_path(data_root))
    )
    kit = sidecars_status(profile, data_root) is None
    return {
        PROFILE.name: acquire,
        ACQUIRE.name: acquire,
        KIT.name: kit,
        EXTRACT.name: extract,
        STORE.name: store,
    }


@dataclass
class _Stage:
    index: int
    stage: Stage
    total: int  # runs: partitions, or 1
    total_bytes: int
    done: int = 0
    failed: int = 0
    bytes_done: int = 0
    reported: set[str] = field(default_factory=set)  # partitions whose run has reported
    started: float | None = None
    finished: float | None = None
    task: TaskID | None = None
    up_to_date: bool = False  # finished, every run succeeded, and it wrote nothing
    ran: bool = False  # a run of it ran (not only the runner's "nothing to do")
    wrote: bool = False  # a run said it wrote (the store step's "update": a store on object storage
    # is not under the data root, whose stats judge the rest)
    expected: bool = False  # expected up to date: off a terminal its run lines wait for its end
    held: list[str] = field(default_factory=list)


class BuildProgress:
    """Feed it every finished run summary (``runner.build_all(on_run=progress.on_run)``), then ``close()``.

    ``live`` (default: :func:`interactive` of ``stream``) picks rich's live lines over plain lines;
    ``tick`` is the seconds between redraws; ``data_root`` (where the build downloads to) makes the
    download stage count only the bytes still to download, the extract stage only the archives of
    cache keys not up to date, and a stage that wrote nothing say "up to date"."""

    def __init__(
        self,
        profile: Profile,
        stream: IO[str] | None = None,
        *,
        live: bool | None = None,
        tick: float = 0.2,
        data_root: Path | None = None,
    ) -> None:
        self.stream: IO[str] = stream if stream is not None else sys.stderr
        self.live = interactive(self.stream) if live is None else live
        self._profile = profile
        self._data_root = Path(data_root) if data_root is not None else None
        done_keys = extracted_keys(profile, self._data_root) if self._data_root is not None else set()
        self._bytes = partition_bytes(profile, data_root, done_keys)
        # each archive's bytes on disk when the build started: what a download adds is counted live
        self._local0 = (
            {a.path: archive_state(self._data_root, a).bytes_local for a in profile.archives}
            if self._data_root is not None
            else {}
        )
        self._live: tuple[float, int] = (float("-inf"), 0)  # (when read, bytes)
        self._outputs = stage_outputs(profile, self._data_root) if self._data_root is not None else None
        expect = expected_up_to_date(profile, self._data_root, done_keys) if self._data_root else {}
        self.stages: dict[str, _Stage] = {}
        for i, s in enumerate(STAGES, 1):
            sizes = self._bytes.get(s.name, {})
            total = len(sizes) if s.partitioned_by else 1
            self.stages[s.name] = _Stage(i, s, total, sum(sizes.values()))
        if expect:  # the profile stage (it writes nothing) is up to date with the rest of the build
            expect[PROFILE.name] = all(expect.values())
            for name, st in self.stages.items():
                st.expected = expect.get(name, False)
        self._progress: Progress | None = None
        if self.live:
            console = Console(
                file=self.stream,
                force_terminal=True,
                width=None if _isatty(self.stream) else _OFF_TERMINAL_WIDTH,
                highlight=False,
                emoji=False,
                markup=False,
            )
            self._progress = Progress(
                _StateColumn(self),
                _BarColumn(self),
                _LineColumn(self),  # takes the rest of the width; cut at its end (elapsed, ETA) first
                console=console,
                expand=True,
                refresh_per_second=1 / tick,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._progress.start()
        self.t0 = time.monotonic()
        self.current = STAGES[0].name
        self._start(self.stages[self.current], self.t0)

    # -- input ------------------------------------------------------------------------------------
    def on_run(self, r: dict[str, Any]) -> None:
        stage = stage_of(r.get("selection") or [])
        st = self.stages[stage.name]
        st.expected = st.expected or bool(r.get("up_to_date"))  # not run: the runner found nothing to do
        st.ran = st.ran or not r.get("up_to_date")
        st.wrote = st.wrote or bool((r.get("store_metadata") or {}).get("rebuilt"))
        now = time.monotonic()
        for name in needs(stage):  # a stage runs: the stages it needs are over
            earlier = self.stages[name]
            if r.get("streamed") and earlier.stage in STREAMED:  # they go on side by side
                continue
            if earlier.started is not None and earlier.finished is None:
                self._finish(earlier, now)
        if st.started is None:
            self._start(st, now)
        # a run's entry per partition (the runner's partition_runs), or a run over several
        parts = [r["partition"]] if r.get("partition") else list(r.get("partitions") or [])
        if stage.partitioned_by and not parts:  # one run of the whole stage
            parts = list(self._bytes[stage.name])
        # a partition shown already (while its run went on) comes again only with its problems
        again = bool(stage.partitioned_by and parts and all(p in st.reported for p in parts))
        n = 0 if again else max(1, len(parts)) if stage.partitioned_by else 1
        st.done += n
        if not r.get("success"):
            st.failed += n
        if stage.partitioned_by:
            new = [p for p in parts if p not in st.reported]
            st.reported.update(new)
            st.bytes_done += sum(self._bytes[stage.name].get(p, 0) for p in new)
        self.current = stage.name
        self._update(st)
        if st.done >= st.total and st.finished is None:  # the stages that were waiting for it start now
            self._finish(st, now)
            over = [name for name, x in self.stages.items() if x.finished is not None]
            started = [name for name, x in self.stages.items() if x.started is not None]
            for nxt in ready_stages(over, started):
                self._start(self.stages[nxt.name], now)
                self.current = nxt.name
        self._emit_run(r, st, again=again)
        if self._progress is not None:
            self._progress.refresh()  # every run shows at once, not at the next tick

    def close(self) -> None:
        """Stop the live lines (they stay on screen; a stage that never ran is left out)."""
        if self._progress is None:
            return
        now = time.monotonic()
        for st in self._order():
            if st.task is not None and st.done == 0:
                self._progress.remove_task(st.task)
                st.task = None
            elif st.started is not None and st.finished is None:
                self._finish(st, now)
        self._progress.stop()
        self._progress = None
        self.stream.flush()

    # -- rendering --------------------------------------------------------------------------------
    def status_line(self, name: str | None = None) -> str:
        """The line of stage ``name`` (default: the current stage), as the live display shows it."""
        st = self.stages[name or self.current]
        return f"{self._label(st)}  {self.details(st)}"

    def shown_bytes(self, st: _Stage) -> int:
        """The bytes stage ``st`` has moved: its reported partitions', and for the download stage
        while it goes on, what the downloads of the partitions not reported yet have written."""
        if st.stage is not ACQUIRE or st.started is None or st.finished is not None or not self._local0:
            return st.bytes_done
        now = time.monotonic()
        when, live = self._live
        if now - when >= LIVE_BYTES_EVERY:
            with contextlib.suppress(OSError):  # unreadable for now: the last reading stands
                live = self._downloading_bytes(st.reported)
            self._live = (now, live)
        return min(st.total_bytes, st.bytes_done + live)

    def _downloading_bytes(self, reported: set[str]) -> int:
        """What the archives of cache keys not in ``reported`` have gained on disk since the build
        started (a stat each; never more than each was missing then)."""
        assert self._data_root is not None
        todo = self._bytes[ACQUIRE.name]
        got = 0
        for key, specs in self._profile.archives_by_cache_key().items():
            if key in reported or not todo.get(key):
                continue
            for a in specs:
                missing = max(0, int(a.size or 0) - self._local0[a.path])
                now = archive_state(self._data_root, a).bytes_local
                got += min(missing, max(0, now - self._local0[a.path]))
        return got

    def details(self, st: _Stage) -> str:
        """Partitions done/total, bytes done/total, rate, ETA (while running), elapsed."""
        now = time.monotonic()
        end = st.finished if st.finished is not None else now
        elapsed = end - (st.started if st.started is not None else end)
        if st.up_to_date:
            return f"{_unchanged(st)}  elapsed {human_seconds(elapsed)}"
        parts = []
        if st.total > 1:
            parts.append(f"{st.done}/{st.total} partitions" + (f" ({st.failed} failed)" if st.failed else ""))
        if st.total_bytes:
            moved = self.shown_bytes(st)
            parts.append(f"{human_bytes(moved)}/{human_bytes(st.total_bytes)}")
            if moved and elapsed > 0:
                rate = moved / elapsed
                parts.append(f"{human_bytes(rate)}/s")
                if st.finished is None:
                    parts.append(f"ETA {human_seconds((st.total_bytes - moved) / rate)}")
        parts.append(f"elapsed {human_seconds(elapsed)}")
        return "  ".join(parts)

    def _label(self, st: _Stage) -> str:
        return f"[{st.index}/{len(STAGES)}] {st.stage.label}"

    def _order(self) -> list[_Stage]:
        return [self.stages[s.name] for s in STAGES]

    def _start(self, st: _Stage, now: float) -> None:
        st.started = now
        if self._progress is not None and st.task is None:
            total = st.total_bytes or (st.total if st.stage.partitioned_by else None)
            st.task = self._progress.add_task(self._label(st), total=total, stage=st.stage.name)

    def _finish(self, st: _Stage, now: float) -> None:
        st.finished = now
        if self._outputs is not None and self._data_root is not None and st.done and not st.failed:
            after = stage_outputs(self._profile, self._data_root)[st.stage.name]
            st.up_to_date = after == self._outputs[st.stage.name] and not st.wrote
            if st.stage.name == PROFILE.name:
                st.up_to_date = st.expected
        self._update(st)
        if self._progress is not None and st.task is not None:
            self._progress.stop_task(st.task)
        if self._progress is None and (st.held or st.expected):
            lines = [f"{self._label(st)}: {_unchanged(st)}"] if st.up_to_date else st.held
            st.held = []
            for ln in lines:
                self.stream.write(ln + "\n")
            self.stream.flush()

    def _update(self, st: _Stage) -> None:
        if self._progress is None or st.task is None:
            return
        if st.total_bytes:
            self._progress.update(st.task, completed=st.bytes_done)
        elif st.stage.partitioned_by:
            self._progress.update(st.task, completed=st.done)
        elif st.done:
            self._progress.update(st.task, total=1, completed=1)

    def _emit_run(self, r: dict[str, Any], st: _Stage, *, again: bool = False) -> None:
        what = ",".join(r.get("selection") or []) + (f"[{r['partition']}]" if r.get("partition") else "")
        status = "ok" if r.get("success") else "FAILED"
        count = f" ({st.done}/{st.total})" if st.total > 1 else ""
        lines = []
        if self._progress is not None or again:
            if not r.get("success") or again:  # keep failures on screen; successes show in the stage's line
                lines.append(f"  {what}: {status}")
        else:
            # each line names its stage: stages beside each other (the kit's) finish out of order
            if r.get("up_to_date"):  # a stage with nothing to do: no run
                lines.append(f"{self._label(st)}: {_unchanged(st)}")
            else:
                lines.append(f"{self._label(st)}: run {str(r.get('run_id', ''))[:8]} {what}: {status}{count}")
        for c in r.get("checks", []):
            if not c.get("passed"):
                lines.append(f"    check {c['asset']}:{c['check']} failed: {_first(c.get('description'))}")
        failed = {(c.get("asset"), c.get("check")) for c in r.get("checks", []) if not c.get("passed")}
        for e in r.get("errors", []):
            msg = _first(e.get("message"))
            if e.get("check") and (e.get("asset"), e["check"]) in failed:
                continue  # the step failed because of that check: said above
            if not any(msg == _first(c.get("description")) for c in r.get("checks", [])):
                lines.append(f"    error in {e['step']}: {msg}")
        if self._progress is not None:
            for ln in lines:  # above the live lines
                self._progress.console.print(ln, soft_wrap=True)
        elif st.expected and r.get("success") and (st.finished is None or st.up_to_date):
            if st.finished is None:
                st.held += lines  # printed at the stage's end unless it was up to date
        else:
            for ln in st.held + lines:
                self.stream.write(ln + "\n")
            st.held = []
            self.stream.flush()


def _unchanged(st: _Stage) -> str:
    """What a stage that wrote nothing says: "up to date" when it did not run (nothing to do), else
    that its runs checked what is there (`--reverify`, or a stage run after one that ran). The
    profile stage, which never writes, says only "checked": "nothing changed" after an edit of the
    profile would read as if the edit had not been seen."""
    if not st.ran:
        return "up to date"
    return "checked" if st.stage.name == PROFILE.name else "checked, nothing changed"


class _StateColumn(ProgressColumn):
    """A spinner while the stage runs; then a tick, or a cross when a run of it failed."""

    def __init__(self, bar: BuildProgress) -> None:
        super().__init__(table_column=Column(no_wrap=True))
        self._bar = bar
        self._spinner = Spinner("dots")

    def render(self, task: Task) -> RenderableType:
        st = self._bar.stages[task.fields["stage"]]
        if st.finished is None:
            return self._spinner.render(task.get_time())
        return Text("✗", style="red") if st.failed else Text("✓", style="green")


class _BarColumn(BarColumn):
    """The stage's bar: its bytes as :meth:`BuildProgress.shown_bytes` counts them (downloads that
    are still going on included), else its partitions."""

    def __init__(self, bar: BuildProgress) -> None:
        super().__init__(bar_width=12, complete_style="cyan", finished_style="green", pulse_style="cyan")
        self._bar = bar

    def render(self, task: Task) -> ProgressBar:
        st = self._bar.stages[task.fields["stage"]]
        if st.total_bytes:
            task = replace(task, completed=self._bar.shown_bytes(st))
        return super().render(task)


class _LineColumn(ProgressColumn):
    """The stage's label (padded: the details of every stage line up), then ``BuildProgress.details``."""

    def __init__(self, bar: BuildProgress) -> None:
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1))
        self._bar = bar
        self._width = max(len(bar._label(st)) for st in bar.stages.values())

    def render(self, task: Task) -> Text:
        st = self._bar.stages[task.fields["stage"]]
        line = f"{self._bar._label(st):<{self._width}}  {self._bar.details(st)}"
        return Text(line, no_wrap=True, overflow="ellipsis")


def _first(text: Any) -> str:
    s = str(text or "").strip()
    return s.splitlines()[0] if s else ""
