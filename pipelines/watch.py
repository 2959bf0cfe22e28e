"""Progress inside a stage's one run: the partitions it has finished, read from the instance while the
run goes on.

A stage is one run over all its partitions (a single-run backfill), so the runner's summary of the
run comes only when the whole stage is over: at real scale, an hour of downloads with a still
progress line. :class:`RunWatcher` polls the instance (SQLite or PostgreSQL, whichever executor
runs the steps: every executor records its events there) for the run's asset materializations and
reports each partition once every asset of the selection has materialized for it. The runner then
reports, at the run's end, only the partitions not reported yet (and every failure).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Collection
from typing import Any

import dagster as dg

CALL_TAG = "stage2/call"  # one value per run the runner launches: how the watcher finds its run


class RunWatcher:
    """Watch the run tagged ``CALL_TAG=<call>`` (see :attr:`tags`) in a thread, every ``interval``
    seconds, and call ``on_partition(run id, partition, materialized assets)`` once per partition whose
    ``selection`` has all materialized, and ``on_first()`` once the first asset of ``selection`` has
    materialized for every partition of ``partitions`` (a streamed run's downloads are over). Use as
    a context manager around the run's execution."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        selection: list[str],
        on_partition: Callable[[str, str, list[str]], None] | None = None,
        *,
        on_first: Callable[[], None] | None = None,
        partitions: Collection[str] = (),
        interval: float = 0.5,
    ) -> None:
        self.tags = {CALL_TAG: uuid.uuid4().hex}
        self.reported: set[str] = set()
        self._instance = instance
        self._selection = set(selection)
        self._on_partition = on_partition
        self._first = selection[0] if selection else None
        self._on_first = on_first
        self._first_pending = set(partitions)
        self._interval = interval
        self._run_id: str | None = None
        self._cursor: str | None = None
        self._done: dict[str, set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stage2-run-watcher", daemon=True)

    def __enter__(self) -> RunWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception:  # progress is best effort: the run's own summary follows at its end
                continue

    def poll(self) -> None:
        """Report the partitions finished since the last poll."""
        if self._run_id is None:
            runs = self._instance.get_runs(filters=dg.RunsFilter(tags=self.tags), limit=1)
            if not runs:
                return
            self._run_id = runs[0].run_id
        while True:
            page = self._instance.get_records_for_run(
                self._run_id,
                cursor=self._cursor,
                of_type=dg.DagsterEventType.ASSET_MATERIALIZATION,
                limit=1000,
            )
            self._cursor = page.cursor
            for record in page.records:
                self._note(record.event_log_entry.dagster_event)
            if not page.has_more:
                break

    def _note(self, event: Any) -> None:
        if event is None or event.partition is None or event.asset_key is None:
            return
        asset = event.asset_key.to_user_string()
        done = self._done.setdefault(event.partition, set())
        done.add(asset)
        if self._on_first is not None and asset == self._first:
            self._first_pending.discard(event.partition)
            if not self._first_pending:
                on_first, self._on_first = self._on_first, None
                on_first()
        if self._on_partition is None:
            return
        if event.partition not in self.reported and self._selection <= done:
            self.reported.add(event.partition)
            assert self._run_id is not None
            self._on_partition(self._run_id, event.partition, sorted(done))
