"""The lake's tables: the file schema's, made once from the same migrations, without the file's indexes.

The file schema (`store/schema.py`) is the one definition: it is migrated in a scratch in-memory DuckDB and
each table is created in the lake as it ends up there. DuckLake has no indexes (its files' min/max statistics
do that work) and no constraints beyond NOT NULL, which the tables never relied on. `steprec_wal`, the file's
one-row applied position, becomes `steprec_applied`: a row per commit and recorder, since many recorders share
the lake and an update of a shared row would conflict with every other recorder's commit.
"""

from __future__ import annotations

import duckdb

from ..store.schema import SCHEMA_VERSION, migrate
from .retry import on_conflict

APPLIED_TABLE = "CREATE TABLE IF NOT EXISTS steprec_applied (recorder_id VARCHAR NOT NULL, applied_seq BIGINT NOT NULL)"


def _file_tables() -> list[tuple[str, str]]:
    scratch = duckdb.connect()
    try:
        migrate(scratch)
        rows = scratch.execute(
            "SELECT table_name, sql FROM duckdb_tables() WHERE table_name NOT IN ('steprec_wal', 'steprec_schema')"
            " ORDER BY table_name"
        ).fetchall()
    finally:
        scratch.close()
    return [(name, sql.replace(" USING COMPRESSION zstd", "")) for name, sql in rows]


def create_tables(connection: duckdb.DuckDBPyConnection) -> int:
    """Create whatever the lake lacks, in one commit (retried if another recorder is doing the same); refuse a
    lake written by a newer steprec."""

    def create() -> int:
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "CREATE TABLE IF NOT EXISTS steprec_schema (version INTEGER NOT NULL, applied_at TIMESTAMPTZ)"
            )
            current = cursor.execute("SELECT coalesce(max(version), 0) FROM steprec_schema").fetchone()[0]
            if current > SCHEMA_VERSION:
                cursor.execute("ROLLBACK")
                raise RuntimeError(f"the lake has schema version {current}, newer than this recorder's"
                                   f" {SCHEMA_VERSION}; upgrade steprec")  # fmt: skip
            if current and current < SCHEMA_VERSION:
                cursor.execute("ROLLBACK")
                raise RuntimeError(f"the lake has schema version {current}; this recorder ({SCHEMA_VERSION}) does"
                                   " not migrate lakes yet: use the steprec release that made it")  # fmt: skip
            if current == 0:
                for _, sql in _file_tables():
                    cursor.execute(sql.replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1))
                cursor.execute(APPLIED_TABLE)
                cursor.execute("INSERT INTO steprec_schema VALUES (?, now())", [SCHEMA_VERSION])
            cursor.execute("COMMIT")
            return SCHEMA_VERSION

    return on_conflict(create)
