"""`steprec sql` and `steprec export parquet`: the recorder's views for analysts and other engines.

`sql` prints one read-only query's result as a table (rich), CSV or JSON, or writes it
as Parquet; `export parquet` writes every exportable view as Parquet files partitioned
by day, streamed batch by batch so an export of any size runs in bounded memory.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from .client import RecorderClient, truncated
from .commands import add_client_command

EXPORT_TABLES = (
    "runs",
    "events",
    "snapshots",
    "snapshot_messages",
    "messages",
    "tool_effects",
    "tool_effect_records",
    "conversations",
)
"""What `steprec export` writes; the recorder's ExportView serves exactly these (docs/sql.md)."""

_CELL_CHARS = 120


def _jsonable(value: Any) -> Any:
    """Arrow's Python values as JSON: timestamps as ISO 8601, maps (lists of pairs) as objects, bytes as hex."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        if value and all(isinstance(item, tuple) and len(item) == 2 for item in value):
            return {str(key): _jsonable(item) for key, item in value}
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    return value


def _text(value: Any) -> str:
    """One cell for a person or a CSV file: nested values as compact JSON."""
    if value is None:
        return ""
    plain = _jsonable(value)
    return plain if isinstance(plain, str) else json.dumps(plain, ensure_ascii=False, separators=(",", ":"))


def _print_rows(table: pa.Table, form: str, output: Path | None) -> None:
    rows = table.to_pylist()
    if form == "parquet":
        pq.write_table(table.replace_schema_metadata(None), output)
        return
    stream = output.open("w", newline="") if output else sys.stdout
    try:
        if form == "json":
            json.dump([_jsonable(row) for row in rows], stream, ensure_ascii=False, indent=2)
            stream.write("\n")
        elif form == "csv":
            writer = csv.writer(stream)
            writer.writerow(table.column_names)
            writer.writerows([_text(value) for value in row.values()] for row in rows)
        else:
            shown = Table(title=f"{table.num_rows} rows")
            for name in table.column_names:
                shown.add_column(name, overflow="fold")
            for row in rows:
                shown.add_row(*(_clip(_text(value)) for value in row.values()))
            Console(file=stream).print(shown)
    finally:
        if output:
            stream.close()


def _clip(text: str) -> str:
    return text if len(text) <= _CELL_CHARS else text[: _CELL_CHARS - 1] + "…"


async def _sql(client: RecorderClient, options: argparse.Namespace) -> int:
    form = "json" if options.json else options.format
    if form == "parquet" and options.output is None:
        raise ValueError("--format parquet needs --output FILE")
    table = await client.sql(options.query, max_rows=options.max_rows, timeout_seconds=options.timeout)
    _print_rows(table, form, options.output)
    if truncated(table):
        print(f"steprec sql: the result was cut off after {table.num_rows:,} rows; raise --max-rows to see more",
              file=sys.stderr)  # fmt: skip
    return 0


def _day_column(schema: pa.Schema) -> str | None:
    """The column a table is partitioned by: its first timestamp (runs.started_at, events.recorded_at ...)."""
    return next((field.name for field in schema if pa.types.is_timestamp(field.type)), None)


class _DayPartitionedWriter:
    """Parquet files under `folder/day=YYYY-MM-DD/` (UTC days), one writer per day kept open until `close`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rows = 0
        self._writers: dict[str, pq.ParquetWriter] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        column = _day_column(batch.schema)
        if column is None:
            self._writer("", batch.schema).write_batch(batch)
        else:
            utc = batch.column(column).cast(pa.timestamp("us", tz="UTC"))
            days = pc.fill_null(pc.strftime(utc, format="%Y-%m-%d"), "unknown")
            for day in pc.unique(days).to_pylist():
                self._writer(f"day={day}", batch.schema).write_batch(batch.filter(pc.equal(days, day)))
        self.rows += batch.num_rows

    def _writer(self, partition: str, schema: pa.Schema) -> pq.ParquetWriter:
        if partition not in self._writers:
            folder = self.folder / partition if partition else self.folder
            folder.mkdir(parents=True, exist_ok=True)
            self._writers[partition] = pq.ParquetWriter(folder / "part-0.parquet", schema)
        return self._writers[partition]

    def close(self) -> int:
        for writer in self._writers.values():
            writer.close()
        return len(self._writers)


async def _export(client: RecorderClient, options: argparse.Namespace) -> int:
    tables = options.table or list(EXPORT_TABLES)
    for name in tables:
        folder = options.directory / name
        if folder.exists() and any(folder.iterdir()) and not options.overwrite:
            raise ValueError(f"{folder} is not empty; pass --overwrite to replace it")
    summary = {}
    for name in tables:
        folder = options.directory / name
        if folder.exists():
            for old in sorted(folder.rglob("*.parquet")):
                old.unlink()
        writer = _DayPartitionedWriter(folder)
        try:
            async for batch in client.iter_view(name):
                writer.write(batch)
        finally:
            files = writer.close()
        summary[name] = {"rows": writer.rows, "files": files}
        if not options.json:
            print(f"{name}: {writer.rows:,} rows in {files} file(s) under {folder}")
    if options.json:
        print(json.dumps(summary))
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    sql = add_client_command(commands, "sql", "run one read-only SQL query over the recorder's views", _sql)
    sql.add_argument("query", metavar="QUERY", help="one SELECT over runs, events, snapshots, ... (docs/sql.md)")
    sql.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    sql.add_argument("--output", type=Path, metavar="FILE", help="write there instead of printing (parquet needs it)")
    sql.add_argument("--max-rows", type=int, default=0, metavar="N", help="at most N rows (default 10,000)")
    sql.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS", help="time limit (default 10 s)")

    export = add_client_command(
        commands, "export", "write the recorder's tables as Parquet, partitioned by day", _export, timeout_seconds=30
    )
    export.add_argument("format", choices=["parquet"], help="the file format (Parquet)")
    export.add_argument("directory", type=Path, metavar="DIR", help="one folder per table is written here")
    export.add_argument("--table", action="append", choices=EXPORT_TABLES, help="only this table (repeatable)")
    export.add_argument("--overwrite", action="store_true", help="replace what an earlier export left in DIR")
