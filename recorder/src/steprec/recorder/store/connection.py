"""Opening the DuckDB file the way a sidecar needs it, and reading from it without pinning old versions."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

import duckdb

BLOCK_SIZE = 16 * 1024
STORAGE_VERSION = "v1.5.0"
"""DuckDB storage format: new enough for ZSTD-compressed strings; readable by duckdb >= 1.5."""
DEFAULT_MEMORY_LIMIT_MIB = 1024
"""DuckDB's memory limit unless the recorder is told otherwise (`--duckdb-memory-mib`)."""


def open_database(path: Path, memory_limit_mib: int) -> duckdb.DuckDBPyConnection:
    """The recorder's DuckDB file (created owner-only), with small blocks and a bounded page cache."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    new = not path.exists()
    # 16 KiB blocks instead of DuckDB's 256 KiB: a recorder holds many small tables and indexes,
    # and a 200-step run then takes under 1 MB instead of 3.4 MB (measured; docs/storage.md).
    connection = duckdb.connect(
        str(path), config={"default_block_size": str(BLOCK_SIZE), "storage_compatibility_version": STORAGE_VERSION}
    )
    # DuckDB's own default is 80% of the machine's memory: a sidecar's page cache would grow
    # with the data until then (the soak in docs/reliability.md watched it grow).
    connection.execute(f"SET memory_limit = '{int(memory_limit_mib)}MiB'")
    if new:
        os.chmod(path, 0o600)
    return connection


def fetch_one(connection: duckdb.DuckDBPyConnection, query: str) -> object:
    """One value, read on a cursor that is closed at once.

    Never on the connection itself: a result left open there keeps its read transaction
    alive, and while it lives DuckDB can neither checkpoint (its own WAL grows without end)
    nor free the old row versions every later commit leaves behind (the recorder's memory
    grew by 0.7 MiB/s under load until this was found by the soak in docs/reliability.md).
    """
    with connection.cursor() as cursor:
        return cursor.execute(query).fetchone()[0]


class CursorOnDemand:
    """A DuckDB cursor opened on first use: most requests are checked against in-memory run state alone,
    and opening and closing a cursor cost about an eighth of such a request's ingest time (measured)."""

    def __init__(self, connection: duckdb.DuckDBPyConnection) -> None:
        self._connection = connection
        self._cursor: duckdb.DuckDBPyConnection | None = None

    def __getattr__(self, name: str):
        if self._cursor is None:
            self._cursor = self._connection.cursor()
        return getattr(self._cursor, name)

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()


def dicts(result: duckdb.DuckDBPyConnection) -> list[dict]:
    names = [d[0] for d in result.description]
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


class _MissingPandas(importlib.abc.MetaPathFinder):
    """Answers "no pandas" at once, without walking sys.path (see `skip_pandas_lookups`)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            raise ModuleNotFoundError("No module named 'pandas'", name="pandas")
        return None


def skip_pandas_lookups() -> None:
    """Make DuckDB's per-parameter `import pandas` free in a process that has no pandas.

    DuckDB's Python client tries `import pandas` for every parameter it binds; without pandas
    installed (the recorder never needs it) each try walks sys.path again, 0.3-1.3 ms per
    statement (measured, docs/benchmarks.md). The daemon calls this at start; it changes nothing
    where pandas is installed, and puts nothing in sys.modules that others might mistake for it.
    """
    if importlib.util.find_spec("pandas") is None and not any(isinstance(f, _MissingPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _MissingPandas())
