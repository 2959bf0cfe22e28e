"""The build instance's event log storage (pipelines/eventlog.py) on a real SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stage2_pipelines.eventlog import FastSqliteEventLogStorage


def test_has_table_remembers_only_tables_that_exist(tmp_path: Path) -> None:
    storage = FastSqliteEventLogStorage(str(tmp_path))
    try:
        assert storage.has_table("event_logs")
        assert storage.has_table("event_logs")  # remembered: the answer does not change
        assert not storage.has_table("later_table")
        # a table created afterwards (as a migration would): a no was not remembered
        with sqlite3.connect(storage.get_db_path()) as conn:
            conn.execute("CREATE TABLE later_table (id INTEGER)")
        assert storage.has_table("later_table")
    finally:
        storage.dispose()
