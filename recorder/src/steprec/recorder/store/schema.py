"""The DuckDB schema, versioned, with migrations applied on open (docs/storage.md explains each table).

Tables are append-mostly (docs/storage.md names the few updates and deletes) and carry no PRIMARY KEY or
UNIQUE constraint: uniqueness is enforced by the ingest path, so the same tables can later live in a
DuckLake lake, which has no constraints. Indexes exist only for speed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import duckdb

from . import tree

SCHEMA_VERSION = 8


def _place_runs(connection: duckdb.DuckDBPyConnection) -> None:
    """Schema v5: each run's place in the run forest (tree.py), computed for the runs already stored, and
    each run ending's `run_seq`."""
    with _indexes_dropped(connection, "run_endings"):
        connection.execute("ALTER TABLE run_endings ADD COLUMN run_seq BIGINT")
        connection.execute("UPDATE run_endings e SET run_seq = r.write_seq FROM runs r WHERE r.run_id = e.run_id")
    connection.execute("DROP TABLE IF EXISTS run_ancestry")
    connection.execute(tree.TABLE)
    runs = connection.execute("SELECT run_id, parent_run_id, forked_from_run_id, write_seq FROM runs")
    tree.link(connection, runs.to_arrow_table())


ZSTD_COLUMNS = {"messages": "body", "message_fragments": "data", "snapshots": "refs"}
"""The columns stored with ZSTD: message text, and snapshot reference lists (a full list repeats the digests of
earlier ones). DuckDB's own choice for message text flipped between FSST and none from one checkpoint to the
next; everything else keeps DuckDB's choice (dictionary, FSST, bit-packing), which reads faster and, for run
metadata, takes a third of the space ZSTD did (docs/storage.md)."""


def _compress_text_with_zstd(connection: duckdb.DuckDBPyConnection) -> None:
    """Schema v6: rebuild the tables of ZSTD_COLUMNS with that column marked `USING COMPRESSION zstd` (DuckDB
    cannot change a column's compression in place); their rows, defaults and indexes stay as they were."""
    for table, zstd_column in ZSTD_COLUMNS.items():
        _rebuild(connection, table, _definitions(connection, table, zstd_column), f"SELECT * FROM {table}")


def _end_runs(connection: duckdb.DuckDBPyConnection) -> None:
    """Schema v7: each run's ending in its own row as well (`ended_at`, `end_kind`, copied from `run_endings` by
    the applier, batch._end_runs), so a tree read joins one table to the ancestry instead of two.

    A rebuild, not ALTER TABLE: DuckDB 1.5.5 aborts the process committing a transaction that drops an index,
    adds a column and makes the index again, which ALTER on an indexed table needs.
    """
    definitions = [*_definitions(connection, "runs"), "ended_at TIMESTAMPTZ", "end_kind VARCHAR"]
    rows = """
        SELECT r.*, x.ended_at, x.kind FROM runs r LEFT JOIN (
            SELECT run_seq, arg_max(ended_at, write_seq) AS ended_at, arg_max(kind, write_seq) AS kind
            FROM run_endings WHERE run_seq IS NOT NULL GROUP BY run_seq
        ) x ON x.run_seq = r.write_seq
        ORDER BY r.write_seq
    """
    _rebuild(connection, "runs", definitions, rows)


def _definitions(connection: duckdb.DuckDBPyConnection, table: str, zstd_column: str | None = None) -> list[str]:
    """`table`'s column definitions as they stand (type, NOT NULL, default), `zstd_column` marked for ZSTD."""
    columns = connection.execute(
        "SELECT column_name, data_type, is_nullable, column_default FROM duckdb_columns()"
        " WHERE database_name = current_database() AND schema_name = 'main' AND table_name = ?"
        " ORDER BY column_index",
        [table],
    ).fetchall()
    return [
        f"{name} {data_type}"
        + (" USING COMPRESSION zstd" if name == zstd_column else "")
        + ("" if nullable else " NOT NULL")
        + ("" if default is None else f" DEFAULT {default}")
        for name, data_type, nullable, default in columns
    ]


def _rebuild(connection: duckdb.DuckDBPyConnection, table: str, definitions: list[str], rows: str) -> None:
    """Replace `table` by one with `definitions` holding `rows` (a query over the old one); its indexes stay."""
    with _indexes_dropped(connection, table):
        connection.execute(f"CREATE TABLE {table}_rebuilt ({', '.join(definitions)})")
        connection.execute(f"INSERT INTO {table}_rebuilt {rows}")
        connection.execute(f"DROP TABLE {table}")
        connection.execute(f"ALTER TABLE {table}_rebuilt RENAME TO {table}")


@contextlib.contextmanager
def _indexes_dropped(connection: duckdb.DuckDBPyConnection, table: str) -> Iterator[None]:
    """`table`'s indexes dropped for the block and made again after it: DuckDB alters no table with an index."""
    indexes = connection.execute(
        "SELECT index_name, sql FROM duckdb_indexes() WHERE database_name = current_database() AND table_name = ?",
        [table],
    ).fetchall()
    for name, _ in indexes:
        connection.execute(f"DROP INDEX {name}")
    yield
    for _, sql in indexes:
        connection.execute(sql)


_MIGRATIONS: dict[int, str | Callable[[duckdb.DuckDBPyConnection], None]] = {
    1: """
    CREATE TABLE runs (
        write_seq BIGINT NOT NULL,
        run_id VARCHAR NOT NULL,
        registration_id VARCHAR NOT NULL,
        conversation_id VARCHAR,
        parent_run_id VARCHAR,
        agent_name VARCHAR,
        metadata MAP(VARCHAR, VARCHAR),
        started_at TIMESTAMPTZ NOT NULL,
        max_snapshots INTEGER,
        forked_from_run_id VARCHAR,
        forked_from_snapshot_index INTEGER,
        trace_id VARCHAR,
        span_id VARCHAR
    );
    CREATE TABLE events (
        write_seq BIGINT NOT NULL,
        run_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,
        step_index INTEGER NOT NULL,
        recorded_at TIMESTAMPTZ NOT NULL,
        conversation_id VARCHAR,
        parent_run_id VARCHAR,
        agent_name VARCHAR,
        tool_call_id VARCHAR,
        tool_name VARCHAR,
        error VARCHAR,
        metadata MAP(VARCHAR, VARCHAR),
        idempotency_key VARCHAR,
        trace_id VARCHAR,
        span_id VARCHAR
    );
    CREATE TABLE messages (
        digest BLOB NOT NULL,
        body VARCHAR NOT NULL,
        size_bytes INTEGER NOT NULL
    );
    CREATE TABLE media_refs (
        digest BLOB NOT NULL,
        uri VARCHAR NOT NULL,
        size_bytes BIGINT NOT NULL
    );
    CREATE TABLE message_fragments (
        digest BLOB NOT NULL,
        fragment_index INTEGER NOT NULL,
        fragment_count INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    CREATE TABLE snapshots (
        write_seq BIGINT NOT NULL,
        run_id VARCHAR NOT NULL,
        snapshot_index INTEGER NOT NULL,
        step_index INTEGER NOT NULL,
        state VARCHAR NOT NULL,
        recorded_at TIMESTAMPTZ NOT NULL,
        conversation_id VARCHAR,
        parent_run_id VARCHAR,
        agent_name VARCHAR,
        idempotency_key VARCHAR,
        base_index INTEGER,
        keep INTEGER NOT NULL,
        refs BLOB NOT NULL,
        message_count INTEGER NOT NULL,
        trace_id VARCHAR,
        span_id VARCHAR,
        pruned BOOLEAN NOT NULL DEFAULT false
    );
    CREATE TABLE tool_effects (
        write_seq BIGINT NOT NULL,
        run_id VARCHAR NOT NULL,
        tool_call_id VARCHAR NOT NULL,
        tool_name VARCHAR NOT NULL,
        status VARCHAR NOT NULL,
        recorded_at TIMESTAMPTZ NOT NULL,
        step_index INTEGER NOT NULL,
        error VARCHAR,
        idempotency_key VARCHAR,
        effect_summary VARCHAR,
        record_key VARCHAR,
        trace_id VARCHAR,
        span_id VARCHAR
    );
    CREATE TABLE steprec_wal (applied_seq BIGINT NOT NULL);
    INSERT INTO steprec_wal VALUES (0);
    CREATE INDEX runs_run_id ON runs (run_id);
    CREATE INDEX events_run_id ON events (run_id);
    CREATE INDEX snapshots_run_id ON snapshots (run_id);
    CREATE INDEX tool_effects_run_id ON tool_effects (run_id);
    """,
    # How each run ended, one small row per ending event: a run's outcome then costs a lookup in a
    # table of runs, not a scan of every event (list_runs by conversation, run trees).
    2: """
    CREATE TABLE run_endings (
        write_seq BIGINT NOT NULL,
        run_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,
        ended_at TIMESTAMPTZ NOT NULL
    );
    INSERT INTO run_endings
        SELECT write_seq, run_id, kind, recorded_at FROM events WHERE kind IN ('run_completed', 'run_failed');
    CREATE INDEX run_endings_run_id ON run_endings (run_id);
    """,
    # Where each run stands in the run forest, kept at ingest: reading a tree is then a filter, not a walk.
    # Now made by version 5 (the same table with each run's `write_seq`), which replaces it.
    3: "SELECT 1",
    # One ending per run, the latest, as the applier now keeps it (batch.supersede_endings): outcomes are a join.
    4: """
    DELETE FROM run_endings WHERE write_seq IN (
        SELECT write_seq FROM run_endings QUALIFY write_seq < max(write_seq) OVER (PARTITION BY run_id)
    );
    """,
    # run_ancestry and run_endings with `run_seq`, the write_seq of the run's `runs` row: reading a tree joins on
    # an integer, and a small tree's reads skip most of the tables by their zone maps (runs come in write order).
    5: _place_runs,
    # ZSTD for message text and reference lists only, instead of for every column (store.py set it for all).
    6: _compress_text_with_zstd,
    # Each run's ending in its `runs` row too: a tree read joins the runs to their ancestry and nothing else.
    7: _end_runs,
    # Conversation heads (docs/conversations.md): one row per conversation in each, the applier deletes older ones.
    8: """
    CREATE TABLE conversations (
        write_seq BIGINT NOT NULL,
        conversation_id VARCHAR NOT NULL,
        schema_version INTEGER NOT NULL,
        workspace VARCHAR NOT NULL,
        checkout_repository VARCHAR,
        checkout_name VARCHAR,
        checkout_root VARCHAR,
        checkout_branch VARCHAR,
        updated_at TIMESTAMPTZ NOT NULL,
        revision BIGINT NOT NULL,
        title VARCHAR NOT NULL,
        subtitle VARCHAR NOT NULL,
        tags VARCHAR[] NOT NULL,
        title_source VARCHAR NOT NULL,
        naming_version BIGINT NOT NULL,
        named_revision BIGINT NOT NULL,
        model VARCHAR,
        outcome VARCHAR NOT NULL,
        run_id VARCHAR,
        owner_pid BIGINT,
        owner_host VARCHAR,
        message_count BIGINT NOT NULL,
        total_tokens BIGINT NOT NULL,
        naming_tokens BIGINT NOT NULL,
        archived_at TIMESTAMPTZ,
        metadata_folded VARCHAR NOT NULL
    );
    CREATE TABLE conversation_heads (
        write_seq BIGINT NOT NULL,
        conversation_id VARCHAR NOT NULL,
        revision BIGINT NOT NULL,
        refs BLOB USING COMPRESSION zstd NOT NULL,
        text_folded VARCHAR USING COMPRESSION zstd NOT NULL
    );
    CREATE INDEX conversations_id ON conversations (conversation_id);
    CREATE INDEX conversation_heads_id ON conversation_heads (conversation_id);
    """,
}


def migrate(connection: duckdb.DuckDBPyConnection) -> int:
    """Bring the database to SCHEMA_VERSION; refuse a file written by a newer steprec."""
    connection.execute("CREATE TABLE IF NOT EXISTS steprec_schema (version INTEGER NOT NULL, applied_at TIMESTAMPTZ)")
    current = connection.execute("SELECT coalesce(max(version), 0) FROM steprec_schema").fetchone()[0]
    if current > SCHEMA_VERSION:
        raise RuntimeError(
            f"the database has schema version {current}, newer than this recorder's {SCHEMA_VERSION}; upgrade steprec"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        connection.execute("BEGIN")
        migration = _MIGRATIONS[version]
        if callable(migration):
            migration(connection)
        else:
            connection.execute(migration)
        connection.execute("INSERT INTO steprec_schema VALUES (?, now())", [version])
        connection.execute("COMMIT")
    return SCHEMA_VERSION
