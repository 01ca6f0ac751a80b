"""Where a lake recorder's applier writes: the file target's rows, its position kept per recorder.

Many recorders commit to one lake, each applying its own write-ahead log. The position a recorder has applied
up to is a row it appends in each commit (`steprec_applied`), so commits of different recorders never touch the
same row; a commit that loses a race to another recorder's (DuckLake's conflict) is redone whole.
"""

from __future__ import annotations

import duckdb

from ..store.batch import Batch
from ..store.duckdb_target import DuckDBTarget
from .location import sql_name
from .retry import on_conflict


class LakeTarget(DuckDBTarget):
    def __init__(self, connection: duckdb.DuckDBPyConnection, lake_name: str, recorder_id: str) -> None:
        super().__init__(connection)
        self._lake = sql_name(lake_name)
        self.recorder_id = recorder_id

    def applied_sequence(self) -> int:
        with self._connection.cursor() as cursor:
            return cursor.execute(
                "SELECT coalesce(max(applied_seq), 0) FROM steprec_applied WHERE recorder_id = ?", [self.recorder_id]
            ).fetchone()[0]

    def write(self, entries: list[tuple[int, bytes | Batch]]) -> list[str]:
        return on_conflict(lambda: super(LakeTarget, self).write(entries))

    def skip(self, sequence: int) -> None:
        on_conflict(lambda: super(LakeTarget, self).skip(sequence))

    def _begin(self, cursor: duckdb.DuckDBPyConnection) -> None:
        """Sign the commit: the other recorders' watchers (`freshness.py`) tell their own commits from others'."""
        super()._begin(cursor)
        cursor.execute(f"CALL {self._lake}.set_commit_message(?, 'steprec apply')", [self.recorder_id])

    def _record_applied(self, cursor: duckdb.DuckDBPyConnection, sequence: int) -> None:
        cursor.execute("INSERT INTO steprec_applied VALUES (?, ?)", [self.recorder_id, sequence])
