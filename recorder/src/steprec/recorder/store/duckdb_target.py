"""Where the applier writes: one DuckDB file, one transaction per round of logged entries.

The applier knows entries, rounds and failures; this knows tables and SQL. A second target (the
lake) is a second class with the same three methods, not a branch in the applier.
"""

from __future__ import annotations

import contextlib

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from .batch import Batch, entry_parts, insert, to_arrow
from .connection import fetch_one
from .tree import link

REFUSED_FOR_GOOD = (
    duckdb.ConversionException, duckdb.ConstraintException, duckdb.InvalidInputException,
    duckdb.BinderException, duckdb.CatalogException, duckdb.TypeMismatchException,
    pa.ArrowException, ValueError, TypeError, KeyError, EOFError, OverflowError,
)  # fmt: skip
"""Errors of a logged request itself: applying it again can never succeed, so it is set aside.

Anything else (a full disk, an I/O error, DuckDB out of memory) is retried: setting aside an
acknowledged request on a passing failure would lose it.
"""


class DuckDBTarget:
    """Writes staged batches into the DuckDB file, and remembers there how far the log is applied.

    `LakeTarget` (lake/target.py) writes the same rows into a lake and keeps its position per recorder.
    """

    def __init__(self, connection: duckdb.DuckDBPyConnection) -> None:
        self._connection = connection

    def applied_sequence(self) -> int:
        """The last log entry the database holds."""
        return fetch_one(self._connection, "SELECT applied_seq FROM steprec_wal")

    def write(self, entries: list[tuple[int, bytes | Batch]]) -> list[str]:
        """Apply `entries` in one transaction; the runs whose snapshots it added or pruned."""
        tables = to_arrow([entry for _, entry in entries])
        assembled = [digest for _, entry in entries for digest in entry_parts(entry)[1]]
        pruned = [seq for _, entry in entries for seq in entry_parts(entry)[2]]
        cursor = self._connection.cursor()
        try:
            self._begin(cursor)
            insert(cursor, tables)
            if "runs" in tables:  # their places in the run forest, and their late children's
                link(cursor, tables["runs"])
            if assembled:  # the whole message is in `messages` now; its pieces are redundant
                cursor.execute("DELETE FROM message_fragments WHERE list_contains(?, digest)", [assembled])
            if pruned:
                cursor.execute(
                    "UPDATE snapshots SET pruned = true, refs = ''::BLOB WHERE list_contains(?, write_seq)", [pruned]
                )
            self._record_applied(cursor, entries[-1][0])
            cursor.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.TransactionException):  # a failed COMMIT already ended it
                cursor.execute("ROLLBACK")
            raise
        finally:
            cursor.close()
        # Retention prunes only runs with a snapshot in the same entry.
        return pc.unique(tables["snapshots"]["run_id"]).to_pylist() if "snapshots" in tables else []

    def skip(self, sequence: int) -> None:
        """Count an entry that is set aside as applied, writing nothing of it."""
        with self._connection.cursor() as cursor:
            self._record_applied(cursor, sequence)

    def _begin(self, cursor: duckdb.DuckDBPyConnection) -> None:
        cursor.execute("BEGIN")

    def _record_applied(self, cursor: duckdb.DuckDBPyConnection, sequence: int) -> None:
        """Remember, in the transaction that applies it, the last log entry applied."""
        cursor.execute("UPDATE steprec_wal SET applied_seq = ?", [sequence])
