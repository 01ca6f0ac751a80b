"""Keeping a lake recorder's read caches true to other recorders' commits.

A file recorder's caches of what a read picks (`SnapshotChoices`) are dropped by its own applier, which makes
every change. In a lake, other recorders change runs too: a watcher thread looks at the lake's new snapshots
every `POLL_SECONDS` and drops the caches when one it did not write added or removed snapshots, so a read
here sees another recorder's acknowledged records within its linger plus one poll (about a second).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import duckdb

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.2


class LakeWatcher:
    def __init__(
        self, connection: duckdb.DuckDBPyConnection, lake_name: str, recorder_id: str,
        on_foreign_commit: Callable[[], None],
    ) -> None:  # fmt: skip
        self._connection = connection
        self._lake = lake_name
        self._recorder_id = recorder_id
        self._on_foreign_commit = on_foreign_commit
        self._stop = threading.Event()
        self._seen = self._latest()
        self._thread = threading.Thread(target=self._watch, name="steprec-lake-watcher", daemon=True)
        self._thread.start()

    def _latest(self) -> int:
        with self._connection.cursor() as cursor:
            return cursor.execute(
                "SELECT coalesce(max(snapshot_id), 0) FROM ducklake_snapshots(?)", [self._lake]
            ).fetchone()[0]

    def check(self) -> None:
        """Drop the caches if another recorder committed since the last check."""
        with self._connection.cursor() as cursor:
            rows = cursor.execute(
                "SELECT snapshot_id, author FROM ducklake_snapshots(?) WHERE snapshot_id > ?", [self._lake, self._seen]
            ).fetchall()
        if not rows:
            return
        self._seen = max(snapshot for snapshot, _ in rows)
        if any(author != self._recorder_id for _, author in rows):
            self._on_foreign_commit()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self.check()
            except duckdb.Error as error:  # the catalog is away for a moment: look again next time
                logger.warning("cannot read the lake's snapshots: %s", error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
