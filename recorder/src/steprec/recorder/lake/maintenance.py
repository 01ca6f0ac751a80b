"""DuckLake's upkeep for a lake that recorders append to all day: small files merged, old snapshots expired.

Every applier commit adds a file per table it writes (or rows inlined in the catalog, for small ones), and
every snapshot keeps its files alive. `maintain` flushes inlined rows to Parquet, rewrites files with many
deleted rows, merges adjacent small files, expires snapshots older than `keep` (no steprec read uses time
travel; `keep` covers reads still running on an old one) and deletes the files nothing refers to any more.
Recorders run it on a schedule (`--lake-maintain-seconds`, `LakeMaintainer`); `steprec lake maintain` runs
it once. Two recorders maintaining at once is harmless: the one that loses a commit race tries again.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass

import duckdb

from ..daemon.settings import LAKE_KEEP_SECONDS
from .location import sql_name
from .retry import on_conflict

logger = logging.getLogger(__name__)

REWRITE_DELETED_SHARE = 0.1


@dataclass(frozen=True)
class MaintenanceResult:
    files_before: int
    files_after: int
    snapshots_expired: int
    files_deleted: int


def live_files(connection: duckdb.DuckDBPyConnection, lake_name: str) -> int:
    """Data files the lake's current snapshot reads (its small-file count)."""
    with connection.cursor() as cursor:
        catalog = sql_name(f"__ducklake_metadata_{lake_name}")
        return cursor.execute(
            f"SELECT count(*) FROM {catalog}.ducklake_data_file WHERE end_snapshot IS NULL"
        ).fetchone()[0]


def maintain(connection: duckdb.DuckDBPyConnection, lake_name: str, *, keep_seconds: int = LAKE_KEEP_SECONDS):
    before = live_files(connection, lake_name)

    def call(function: str, *arguments: str) -> int:
        """One DuckLake maintenance function; how many rows it answered. All of them are fetched (as Arrow:
        Python datetimes would need pytz): `count(*)` over it was seen to skip the work."""
        extra = "".join(f", {argument}" for argument in arguments)
        with connection.cursor() as cursor:
            query = f"SELECT * FROM {function}(?{extra})"
            return on_conflict(lambda: cursor.execute(query, [lake_name]).to_arrow_table().num_rows)

    call("ducklake_flush_inlined_data")
    # Files with deleted rows (runs whose ending was copied into their row, replaced heads) are not merged:
    # rewritten first once a tenth of their rows is gone.
    call("ducklake_rewrite_data_files", f"delete_threshold => {REWRITE_DELETED_SHARE}")
    call("ducklake_merge_adjacent_files")
    older = f"older_than => now() - INTERVAL {int(keep_seconds)} SECOND"
    expired = call("ducklake_expire_snapshots", older)
    deleted = call("ducklake_cleanup_old_files", older)
    return MaintenanceResult(before, live_files(connection, lake_name), expired, deleted)


class LakeMaintainer:
    """`maintain` every `every_seconds` (with some jitter, so a fleet started together does not all do it at once)."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, lake_name: str, every_seconds: float) -> None:
        self._connection, self._lake, self._every = connection, lake_name, every_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steprec-lake-maintainer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every * random.uniform(0.8, 1.2)):
            try:
                result = maintain(self._connection, self._lake)
                logger.info("lake maintained: %s", result)
            except duckdb.Error as error:  # the catalog or the store is away for a moment: next round
                logger.warning("lake maintenance failed: %s", error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
