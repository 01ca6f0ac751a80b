"""Read-only SQL for anyone with the query port: the documented views, and the guards around a query.

The views (schema `recorded`, docs/sql.md) are the stable surface; the tables under them may
change shape between releases. A query runs under five guards, each enough on its own for
what it covers: it must parse as exactly one SELECT; it runs in a READ ONLY transaction;
the database has external access disabled and its configuration locked (no files, no
ATTACH, no COPY, no extensions, no network, no SET); and it has a row limit and a time
limit, enforced by cutting the result and by interrupting DuckDB. Before it runs, a fifth
(sql_sizes.py) bounds the size of every value it could build, since one function call that
builds a huge value ignores both the interrupt and DuckDB's memory limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from ..store.tree import LINKS, MAX_TREE_DEPTH
from .sql_sizes import SizeCheck, SizeRefused

OUTCOME = "CASE {kind} WHEN 'run_completed' THEN 'completed' WHEN 'run_failed' THEN 'failed' ELSE 'running' END"
"""A run's outcome from the kind of its last run-ending event (NULL while it runs), the one `run_endings` row
the applier keeps per ended run (batch.supersede_endings)."""

TOOL_LEDGER = """
    SELECT run_id, tool_call_id,
        arg_max(tool_name, write_seq) AS tool_name,
        arg_max(status, write_seq) FILTER (WHERE status <> 'annotated') AS status,
        min(recorded_at) AS started_at,
        max(recorded_at) FILTER (WHERE status IN ('completed', 'failed')) AS ended_at,
        arg_max(idempotency_key, write_seq) FILTER (WHERE idempotency_key IS NOT NULL) AS idempotency_key,
        coalesce(
            arg_max(effect_summary, write_seq) FILTER (WHERE effect_summary IS NOT NULL),
            arg_max(error, write_seq) FILTER (WHERE status = 'failed')
        ) AS effect_summary,
        min(write_seq) AS seq
    FROM main.tool_effects GROUP BY run_id, tool_call_id
"""
"""The tool-effect ledger: per call the latest status wins, and annotations survive later records."""

RUN_EDGES = LINKS.format(runs="main.runs")
"""Every link of the run forest: a delegate under the run whose tool started it, a fork under its origin."""

ANCESTORS = (
    "WITH RECURSIVE tree(run_id, depth) USING KEY (run_id) AS (SELECT ?::VARCHAR, 0 UNION"
    " SELECT p.parent_run_id, t.depth + 1 FROM tree t JOIN main.runs p ON p.run_id = t.run_id"
    f" WHERE p.parent_run_id IS NOT NULL AND t.depth < {MAX_TREE_DEPTH}"
    " AND p.parent_run_id NOT IN (SELECT run_id FROM recurring.tree)),"
    " depths AS (SELECT run_id, depth FROM tree)"
)
"""`depths`: one run (the `?` parameter) and the runs above it by parent links, each at its least depth. A
walk that steps only onto runs it has not reached (`recurring.tree`), so it ends even when parent links form
a cycle, which a stranger can send."""

DESCENDANT_DEPTHS = (
    "WITH depths AS (SELECT (SELECT min(write_seq) FROM main.runs WHERE run_id = ?) AS run_seq, 0 AS depth"
    " UNION ALL SELECT run_seq, depth FROM main.run_ancestry WHERE ancestor_run_id = ?"
    " UNION ALL SELECT run_seq, depth FROM deeper)"
)
"""`depths`: one run (both `?` parameters) and every run below it, each at its least depth, by the `write_seq` of
its `runs` row: a filter on the ancestry kept at ingest (tree.py), plus `deeper`, the Arrow table of
`tree.deeper_descendants` the caller registers (descendants more than tree.HOP_LIMIT links down, usually none)."""

DESCENDANTS = f"""
    {DESCENDANT_DEPTHS}
    SELECT r.run_id, d.depth, r.parent_run_id, r.forked_from_run_id, r.forked_from_snapshot_index,
           r.conversation_id, r.agent_name, r.started_at, r.ended_at,
           CAST({OUTCOME.format(kind="r.end_kind")} AS ENUM('running', 'completed', 'failed')) AS outcome
    FROM main.runs r JOIN depths d ON r.write_seq = d.run_seq
"""
"""A run and everything below it, as columns: the read a very large tree needs (no object per run). Outcomes come
from the ending the applier copies into each `runs` row (batch._end_runs): joining `run_endings` as well took
more than half of DuckDB's time for 100,000 runs (29 -> 13 ms, measured). `outcome` is an ENUM, so it leaves as
an Arrow dictionary (one byte a run; as text it was a fifth of the conversion to Arrow). Sorted after DuckDB by
DESCENDANTS_ORDER (QueryRun `sort_by`)."""
DESCENDANTS_ORDER = [("depth", "ascending"), ("started_at", "ascending"), ("run_id", "ascending")]

VIEWS: dict[str, str] = {
    "runs": f"""
        SELECT r.run_id, r.conversation_id, r.parent_run_id, r.agent_name, r.metadata, r.started_at,
               x.ended_at, {OUTCOME.format(kind="x.kind")} AS outcome, r.registration_id,
               r.forked_from_run_id, r.forked_from_snapshot_index, r.max_snapshots AS max_snapshots_per_run,
               r.trace_id, r.span_id
        FROM main.runs r LEFT JOIN main.run_endings x ON x.run_id = r.run_id
    """,
    "events": """
        SELECT run_id, write_seq AS seq, kind, step_index, recorded_at, conversation_id, parent_run_id,
               agent_name, tool_call_id, tool_name, error, metadata, idempotency_key, trace_id, span_id
        FROM main.events
    """,
    "snapshots": """
        SELECT run_id, snapshot_index, step_index, state, recorded_at, conversation_id, parent_run_id,
               agent_name, idempotency_key, message_count, trace_id, span_id
        FROM main.snapshots WHERE NOT pruned
    """,
    "messages": """
        SELECT lower(hex(digest)) AS digest, any_value(body) AS message, any_value(size_bytes) AS size_bytes
        FROM main.messages GROUP BY digest
    """,
    # A snapshot stores the digests it adds to its base's first `keep`; the recursion rebuilds each
    # retained snapshot's whole list from the newest full one below it. A snapshot's base is the latest
    # one of the base index written before it (ASOF): so each snapshot is rebuilt once, and the walk
    # ends, even when a stranger sent many snapshots of one index (joining on the index alone made
    # one chain per combination: 30 copies of five indexes were 25 million rows) or bases in a cycle.
    "snapshot_messages": """
        WITH RECURSIVE own AS (
            SELECT run_id, snapshot_index, write_seq, base_index, keep,
                   list_transform(range(0, octet_length(refs) // 32), i -> lower(substr(hex(refs), i * 64 + 1, 64)))
                       AS digests
            FROM main.snapshots WHERE NOT pruned
        ), based AS (
            SELECT o.*, b.write_seq AS base_seq FROM own o ASOF LEFT JOIN own b
            ON o.run_id = b.run_id AND o.base_index = b.snapshot_index AND o.write_seq > b.write_seq
        ), chain(run_id, snapshot_index, write_seq, digests) AS (
            SELECT run_id, snapshot_index, write_seq, digests FROM based WHERE base_index IS NULL
            UNION ALL
            SELECT o.run_id, o.snapshot_index, o.write_seq, list_concat(c.digests[1:o.keep], o.digests)
            FROM based o JOIN chain c ON o.base_seq = c.write_seq
        ), positions AS (
            SELECT run_id, snapshot_index, unnest(range(0, len(digests))) AS position, unnest(digests) AS digest
            FROM chain
        )
        SELECT p.run_id, p.snapshot_index, p.position, p.digest, m.message
        FROM positions p LEFT JOIN recorded.messages m ON m.digest = p.digest
    """,
    "tool_effects": f"""
        SELECT run_id, tool_call_id, tool_name, status, started_at,
               CASE WHEN status = 'started' THEN NULL ELSE ended_at END AS ended_at,
               idempotency_key, effect_summary, seq
        FROM ({TOOL_LEDGER}) WHERE status IS NOT NULL
    """,
    "tool_effect_records": """
        SELECT run_id, write_seq AS seq, tool_call_id, tool_name, status, recorded_at, step_index, error,
               idempotency_key, effect_summary, trace_id, span_id
        FROM main.tool_effects
    """,
    # Every run paired with itself and each of its descendants; the path stops a parent cycle. Each step
    # keeps one path per (root, run) (DISTINCT ON), and each pair its least depth: a stranger's runs whose
    # parent and fork links both reach the run before (40 of them) otherwise made a path per Fibonacci
    # number, 13 GB in 20 s.
    "run_tree": f"""
        WITH RECURSIVE edges AS ({RUN_EDGES}),
        tree(root_run_id, run_id, depth, relation, path) AS (
            SELECT run_id, run_id, 0, 'self', [run_id] FROM main.runs
            UNION ALL
            SELECT DISTINCT ON (t.root_run_id, e.run_id) t.root_run_id, e.run_id, t.depth + 1, e.relation,
                   list_append(t.path, e.run_id)
            FROM tree t JOIN edges e ON e.from_run_id = t.run_id
            WHERE NOT list_contains(t.path, e.run_id) AND t.depth < {MAX_TREE_DEPTH}
        )
        SELECT root_run_id, run_id, min(depth) AS depth, arg_min(relation, depth) AS relation FROM tree GROUP BY ALL
    """,
    "conversations": """
        SELECT conversation_id, schema_version, workspace, checkout_repository, checkout_name, checkout_root,
               checkout_branch, updated_at, revision, title, subtitle, tags, title_source, naming_version,
               named_revision, model, outcome, run_id, owner_pid, owner_host, message_count, total_tokens,
               naming_tokens, archived_at
        FROM main.conversations
    """,
}

EXPORTS: dict[str, tuple[str, str | None]] = {
    "runs": ("SELECT * FROM recorded.runs", "started_at"),
    "events": ("SELECT * FROM recorded.events", "recorded_at"),
    "snapshots": ("SELECT * FROM recorded.snapshots", "recorded_at"),
    "snapshot_messages": (
        "SELECT m.run_id, m.snapshot_index, m.position, m.digest, s.recorded_at"
        " FROM recorded.snapshot_messages m JOIN recorded.snapshots s USING (run_id, snapshot_index)",
        "recorded_at",
    ),
    "messages": ("SELECT * FROM recorded.messages", None),
    "tool_effects": ("SELECT * FROM recorded.tool_effects", "started_at"),
    "tool_effect_records": ("SELECT * FROM recorded.tool_effect_records", "recorded_at"),
    "conversations": ("SELECT * FROM recorded.conversations", "updated_at"),
}
"""What `steprec export` writes: per table its query and the timestamp column its day partition comes from.

snapshot_messages leaves the message text to `messages` (joined by digest), so an export
holds each distinct message once, as the store does.
"""

DEFAULT_MAX_ROWS = 10_000
MAX_ROWS = 1_000_000
DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_TIMEOUT_SECONDS = 300.0
TREE_TIMEOUT_SECONDS = 30.0
"""A run-tree read (GetDescendants, GetRunTree) is interrupted after this; the caller gets DEADLINE_EXCEEDED."""
MAX_QUERY_CHARS = 100_000
BATCH_ROWS = 4096
SORTED_BATCH_ROWS = 65_536
"""A sorted result is in memory already: larger batches, fewer IPC streams and worker-thread hops."""


class SqlRefused(ValueError):
    """A query the SQL path will not run, or one DuckDB rejected: the message says which and why."""


class SqlTimeout(TimeoutError):
    """A query interrupted at its time limit."""


class SqlBusy(SqlRefused):
    """Every query slot is taken; try again shortly."""


class QuerySlots:
    """SQL queries and exports running at once, shared by the query service and the browser: more are refused
    (`SqlBusy`), so analytics cannot starve the readers."""

    def __init__(self, slots: int = 4) -> None:
        self.busy_reason = f"{slots} SQL queries are running; try again shortly"
        self._free = asyncio.Semaphore(slots)

    @property
    def busy(self) -> bool:
        return self._free.locked()

    @contextlib.asynccontextmanager
    async def taken(self) -> AsyncIterator[None]:
        if self.busy:
            raise SqlBusy(self.busy_reason)
        async with self._free:
            yield


_TABLES = re.compile(r"\bmain\.")
"""Where the views name the tables they read."""


def install_views(connection: duckdb.DuckDBPyConnection, *, lake: str | None = None) -> None:
    """(Re)create the views on open, so they always match this release's tables.

    A file keeps them in its schema `recorded`. A lake's tables are shared by recorders of several releases,
    so each recorder keeps its own views in an in-memory catalog named `recorded` over `<lake>.main`: queries
    name them `recorded.runs` in both modes.
    """
    if lake is None:
        connection.execute("CREATE SCHEMA IF NOT EXISTS recorded")
        place, tables = "recorded", "main."
    else:
        connection.execute("ATTACH IF NOT EXISTS ':memory:' AS recorded")
        place, tables = "recorded.main", f"{lake}.main."
    for name, body in VIEWS.items():
        connection.execute(f"CREATE OR REPLACE VIEW {place}.{name} AS {_TABLES.sub(tables, body)}")


def lock_down(connection: duckdb.DuckDBPyConnection, *, allowed_directories: list[str] = ()) -> None:
    """No file, network or extension access for any SQL from now on, and no way to turn it back on.

    The recorder itself never needs DuckDB to touch a file other than its database: the
    write-ahead log, media blobs and exports are written in Python. A lake's data folder or S3
    prefix (`allowed_directories`) stays readable and writable: its Parquet files are the tables.
    """
    if allowed_directories:
        connection.execute("SET allowed_directories = ?", [list(allowed_directories)])
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")


@dataclass(frozen=True)
class QueryLimits:
    max_rows: int | None
    timeout_seconds: float | None

    @classmethod
    def requested(cls, max_rows: int, timeout_seconds: float) -> QueryLimits:
        """The limits a caller asked for (0 meaning the default), refused when past the caps."""
        if not 0 <= max_rows <= MAX_ROWS:
            raise SqlRefused(f"max_rows must be 0 (the default, {DEFAULT_MAX_ROWS:,}) to {MAX_ROWS:,}")
        if not 0 <= timeout_seconds <= MAX_TIMEOUT_SECONDS:  # also refuses NaN
            raise SqlRefused(
                f"timeout_seconds must be 0 (the default, {DEFAULT_TIMEOUT_SECONDS:g}) to {MAX_TIMEOUT_SECONDS:g}"
            )
        return cls(max_rows or DEFAULT_MAX_ROWS, timeout_seconds or DEFAULT_TIMEOUT_SECONDS)


UNLIMITED = QueryLimits(None, None)


def check_query(query: str) -> str:
    """The query if it is exactly one SELECT statement; SqlRefused with the reason otherwise."""
    if not query.strip():
        raise SqlRefused("the query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise SqlRefused(f"the query is {len(query):,} characters; the limit is {MAX_QUERY_CHARS:,}")
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as error:
        raise SqlRefused(f"the query does not parse: {_first_line(error)}") from None
    if len(statements) != 1:
        raise SqlRefused(f"send exactly one statement, not {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise SqlRefused(f"only SELECT queries are allowed (read-only SQL), not {kind.name}")
    try:
        _size_check().check(query)
    except SizeRefused as error:
        raise SqlRefused(str(error)) from None
    return query


@functools.cache
def _size_check() -> SizeCheck:
    return SizeCheck()


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0][:500]


def _ipc(batch: pa.RecordBatch | None, schema: pa.Schema) -> pa.Buffer:
    """One whole Arrow IPC stream: the schema and (unless None) one batch.

    Written once into a buffer of its exact size, which a dry run into a `MockOutputStream` counts: a
    growing `BufferOutputStream` copied it again at every doubling (1.2 ms instead of 2.4 for the 8.6 MB of
    a 100,000-run tree, measured). A buffer rather than bytes: the servicer copies it once, piece by piece,
    into its messages.
    """

    def write(sink: pa.NativeFile) -> None:
        with pa.ipc.new_stream(sink, schema) as writer:
            if batch is not None:
                writer.write_batch(batch)

    size = pa.MockOutputStream()
    write(size)
    stream = pa.allocate_buffer(size.size())
    write(pa.FixedSizeBufferWriter(stream))
    return stream


class Deadline:
    """A time limit on a cursor: from `seconds` on, its statements are interrupted until `close`.

    Interrupted again every 50 ms: an interrupt that lands before a query starts executing is
    lost, and a limit of a few microseconds made exactly that happen, so the query then ran
    without any limit (found by reliability/fuzz.py: a recursive CTE that never ends).
    """

    def __init__(self, cursor: duckdb.DuckDBPyConnection, seconds: float | None) -> None:
        self.seconds = seconds
        self._cursor = cursor
        self.expired = threading.Event()
        self._closed = threading.Event()
        self._timer = None
        if seconds is not None:
            self._timer = threading.Timer(seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        self.expired.set()
        while True:
            with contextlib.suppress(duckdb.Error):  # closing under us: nothing left to stop
                self._cursor.interrupt()
            if self._closed.wait(0.05):
                return

    def close(self) -> None:
        self._closed.set()
        if self._timer is not None:
            self._timer.cancel()


class QueryRun:
    """One query over a read cursor: Arrow IPC streams batch by batch, then whether rows were cut off.

    Iterate it from one thread at a time (the servicer steps it from worker threads);
    `cancel` may be called from any thread, and `close` ends it whatever state it is in.
    `prepare`, if given, runs on the cursor inside the query's read transaction and time limit
    first (it registers what the query reads besides the database). With `sort_by` (Arrow sort keys)
    the whole result is fetched and sorted before the first batch is sent.
    """

    def __init__(
        self,
        cursor: duckdb.DuckDBPyConnection,
        query: str,
        limits: QueryLimits,
        params: tuple = (),
        prepare: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
        sort_by: list[tuple[str, str]] | None = None,
    ) -> None:
        self._cursor = cursor
        self._sort_by = sort_by
        self._params = list(params)
        self._limits = limits
        self._prepare = prepare
        self.truncated = False
        self._deadline = Deadline(cursor, limits.timeout_seconds)
        self._query = query

    def cancel(self) -> None:
        self._cursor.interrupt()

    def close(self) -> None:
        self._deadline.close()
        self._cursor.close()

    def __iter__(self) -> Iterator[pa.Buffer]:
        """The result's IPC streams; SqlTimeout past the time limit, SqlRefused for any other failure.

        A failure while batches stream comes through Arrow's reader, as an OSError or ArrowException
        rather than a duckdb.Error (an interrupt is then "OSError: INTERRUPT Error"), so all three
        are the query's own.
        """
        try:
            yield from self._batches()
        except (duckdb.Error, pa.ArrowException, OSError) as error:
            if self._deadline.expired.is_set():
                raise SqlTimeout(f"the query ran past its {self._limits.timeout_seconds:g} s time limit") from None
            raise SqlRefused(_first_line(error)) from None

    def _batches(self) -> Iterator[pa.Buffer]:
        self._cursor.execute("SET search_path = 'recorded'")
        self._cursor.execute("BEGIN TRANSACTION READ ONLY")
        if self._prepare is not None:
            self._prepare(self._cursor)
        result = self._cursor.execute(self._query, self._params or None)
        if self._sort_by:  # DuckDB's ORDER BY moves whole rows; Arrow sorts the keys and takes (faster, measured)
            reader = result.to_arrow_table().sort_by(self._sort_by).to_reader(SORTED_BATCH_ROWS)
        else:
            reader = result.to_arrow_reader(BATCH_ROWS)
        remaining, sent = self._limits.max_rows, False
        for batch in reader:
            if remaining is not None and batch.num_rows > remaining:
                self.truncated = True
                batch = batch.slice(0, remaining)
            if batch.num_rows or not sent:
                yield _ipc(batch, reader.schema)
                sent = True
            if remaining is not None:
                remaining -= batch.num_rows
                if self.truncated or (remaining == 0 and self._more_rows(reader)):
                    self.truncated = True
                    break
        if not sent:
            yield _ipc(None, reader.schema)

    @staticmethod
    def _more_rows(reader: pa.RecordBatchReader) -> bool:
        return any(batch.num_rows for batch in reader)
