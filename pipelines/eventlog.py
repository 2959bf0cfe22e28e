"""The event log of `stage2 build`'s local instance: Dagster's consolidated SQLite event log (one
database file, WAL), written through one pooled engine per process with ``synchronous=NORMAL``.

Dagster's ``ConsolidatedSqliteEventLogStorage`` creates an engine without a pool for every event it
stores: each event opens the database, commits with SQLite's default ``synchronous=FULL`` (an
fsync of the WAL) and closes the connection, and closing the last connection to a WAL database
checkpoints it (more fsyncs). Dagster's public configuration (``storage: sqlite:``) is slower
still: a database per run, created and opened again for every event. A build stores hundreds of
events (materializations, check results, logs); this storage is kept on the one private module
below for that cost, measured in docs/architecture.md ("Kept on Dagster's internals"). In WAL mode
``NORMAL`` is what SQLite documents as safe from corruption: a power cut may lose the last events,
never the database. Production instances use PostgreSQL (deploy/dagster.yaml) and are not affected.

The web UI follows a live run by watching the database file for modifications; with pooled
connections the file itself changes only at SQLite's automatic checkpoints, so every connection
touches it when it is done (a ``utime``, no fsync) and the UI's live views update as they do with
Dagster's own storage.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as db

# Dagster's consolidated SQLite event log has no public import path (docs/architecture.md names this
# module and its measured reason).
from dagster._core.storage.event_log import ConsolidatedSqliteEventLogStorage

BUSY_TIMEOUT_S = 30  # Dagster's own busy timeout for its SQLite storages (seconds)


class FastSqliteEventLogStorage(ConsolidatedSqliteEventLogStorage):
    """``ConsolidatedSqliteEventLogStorage`` with one pooled engine per process and
    ``synchronous=NORMAL``."""

    _engine: Any = None
    _engine_pid: int | None = None

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> FastSqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    def _pooled_engine(self) -> Any:
        if self._engine is None or self._engine_pid != os.getpid():  # never a parent process's pool
            engine = db.create_engine(self._conn_string, connect_args={"timeout": BUSY_TIMEOUT_S})

            @db.event.listens_for(engine, "connect")
            def _pragmas(dbapi_connection: Any, _record: Any) -> None:
                cursor = dbapi_connection.cursor()
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.close()

            self._engine, self._engine_pid = engine, os.getpid()
        return self._engine

    @contextmanager
    def _connect(self) -> Iterator[Any]:
        try:
            with self._pooled_engine().connect() as conn, conn.begin():
                yield conn
        finally:
            with contextlib.suppress(OSError):  # the web UI's watchdog: "the event log changed"
                os.utime(self.get_db_path())

    def has_table(self, table_name: str) -> bool:
        """Dagster asks whether a table exists before most writes (asset event tags, check
        executions), each time through a new engine and a reflection query; a table once there
        stays (migrations only add tables), so a yes is remembered for this storage's life."""
        known: set[str] = self.__dict__.setdefault("_tables_known", set())
        if table_name in known:
            return True
        found = bool(super().has_table(table_name))
        if found:
            known.add(table_name)
        return found

    def dispose(self) -> None:
        if self._engine is not None and self._engine_pid == os.getpid():
            self._engine.dispose()
        self._engine = None
        super().dispose()
