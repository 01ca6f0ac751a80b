"""What each page shows, read from the store and put together once, for the HTML pages and the JSON API alike.

Each function takes the store and already checked parameters (`params.py`) and returns plain data: the pages
render it with templates, `/api/` sends it as JSON. The store's reads block, so they run in worker threads; a
page that needs several reads makes them in one thread, one after the other, on one snapshot of the data.
"""

from __future__ import annotations

import asyncio
import io
import json
import shlex
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from steprec.proto import wire

from ..querier.sql import QueryLimits, QuerySlots, check_query
from ..store.duckdb_store import DuckDBStore
from . import transcript
from .params import NotFound, page_token

RUNS_PER_PAGE = 50
BELOW_PER_PAGE = 100
MESSAGES_PER_PAGE = 50
SQL_ROWS_SHOWN = 500


@dataclass(frozen=True)
class RunFilters:
    agent_name: str | None = None
    conversation_id: str | None = None
    outcome: str | None = None
    started_at_or_after_ns: int | None = None
    started_before_ns: int | None = None


async def runs_page(store: DuckDBStore, filters: RunFilters, before: tuple[int, int] | None) -> dict[str, Any]:
    rows = await asyncio.to_thread(store.newest_runs, limit=RUNS_PER_PAGE + 1, before=before, **asdict(filters))
    return _paged(rows, RUNS_PER_PAGE)


async def recovery_page(store: DuckDBStore, before: tuple[int, int] | None) -> dict[str, Any]:
    rows = await asyncio.to_thread(store.recovery_runs, limit=RUNS_PER_PAGE + 1, before=before)
    return _paged(rows, RUNS_PER_PAGE)


def _paged(rows: list[dict], size: int) -> dict[str, Any]:
    return {"runs": rows[:size], "next": page_token(rows[size - 1]) if len(rows) > size else None}


async def run_page(store: DuckDBStore, run_id: str, snapshot_index: int | None, page: int | None) -> dict[str, Any]:
    """A run with its lineage, events, snapshots, the chosen snapshot's transcript page, ledger and commands."""
    return await asyncio.to_thread(_run_page, store, run_id, snapshot_index, page)


def _run_page(store: DuckDBStore, run_id: str, snapshot_index: int | None, page: int | None) -> dict[str, Any]:
    run = store.get_run(run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r} was recorded")
    below = store.runs_below(run_id, limit=BELOW_PER_PAGE + 1, offset=0)
    parent = store.get_run(run["parent_run_id"]) if run["parent_run_id"] else None
    origin = store.get_run(run["forked_from_run_id"]) if run["forked_from_run_id"] else None
    snapshots = store.list_snapshots(run_id, include_interrupted=True)
    continued = store.read_snapshot(run_id, include_interrupted=False, digests_only=True)
    continue_index = continued[0]["snapshot_index"] if continued else None
    chosen = snapshot = None
    if snapshots:
        wanted = snapshot_index if snapshot_index is not None else snapshots[-1]["snapshot_index"]
        found = store.read_snapshot(run_id, include_interrupted=True, snapshot_index=wanted, digests_only=True)
        if found is None:
            raise NotFound(f"run {run_id!r} has no retained snapshot {wanted}")
        chosen, refs = found
        snapshot = _transcript_page(store, wire.split_digests(refs), page)
    elif snapshot_index is not None:
        raise NotFound(f"run {run_id!r} has no retained snapshot {snapshot_index}")
    effects = store.list_tool_effects(run_id, unresolved_only=False)
    return {
        "run": run,
        "parent": parent,
        "fork_origin": origin,
        "delegates": [r for r in below[:BELOW_PER_PAGE] if r["parent_run_id"] == run_id],
        "forks": [r for r in below[:BELOW_PER_PAGE] if r["forked_from_run_id"] == run_id],
        "more_below": len(below) > BELOW_PER_PAGE,
        "events": _timeline(store.list_events(run_id), run["started_at_ns"]),
        "snapshots": snapshots,
        "snapshot": chosen,
        "continue_index": continue_index,
        "transcript": snapshot,
        "effects": effects,
        "unresolved": sum(effect["status"] == "started" for effect in effects),
    }


def _transcript_page(store: DuckDBStore, digests: tuple[bytes, ...], page: int | None) -> dict[str, Any]:
    """One page of a snapshot's messages (the last page unless asked), only its bodies read."""
    pages = max(1, -(-len(digests) // MESSAGES_PER_PAGE))
    page = pages if page is None else page
    if not 1 <= page <= pages:
        raise NotFound(f"the snapshot has {pages} page(s) of messages, not a page {page}")
    first = (page - 1) * MESSAGES_PER_PAGE
    messages = store.stored_messages(digests[first : first + MESSAGES_PER_PAGE])
    entries = transcript.entries(messages, first_index=first)
    return {"page": page, "pages": pages, "messages": len(digests), "first": first, "last": first + len(messages),
            "entries": [asdict(entry) for entry in entries]}  # fmt: skip


def _timeline(events: list[dict], started_at_ns: int) -> list[dict]:
    """Events with their offset from the run's start and the time until the next one (the step's duration for
    the first event of a step), in milliseconds."""
    timeline = []
    for position, event in enumerate(events):
        following = events[position + 1]["at_ns"] if position + 1 < len(events) else None
        timeline.append({
            **event,
            "offset_ms": (event["at_ns"] - started_at_ns) / 1e6,
            "took_ms": (following - event["at_ns"]) / 1e6 if following is not None else None,
        })  # fmt: skip
    return timeline


def commands(run: dict, snapshot: dict | None, continue_index: int | None, endpoint: str) -> dict[str, str]:
    """The Python and `steprec` lines that continue or fork the run from the chosen snapshot."""
    if snapshot is None:
        return {}
    run_id, index = run["run_id"], snapshot["snapshot_index"]
    connect = f"client = RecorderClient({endpoint!r})"
    shown = {
        "fork_python": (
            f"from steprec.query import RecorderClient, fork_run\n{connect}\n"
            f"history = await fork_run(client, run_id={run_id!r}, at={index})\n"
            "result = await agent.run(prompt, message_history=history, metadata=history.metadata)"
        ),
        "fork_cli": f"steprec fork {shlex.quote(run_id)} --at {index} --endpoint {shlex.quote(endpoint)}",
    }
    if continue_index == index:
        shown["continue_python"] = (
            f"from steprec.query import RecorderClient, continue_run\n{connect}\n"
            f"history = await continue_run(client, run_id={run_id!r})\n"
            "result = await agent.run(prompt, message_history=history)"
        )
        shown["continue_cli"] = f"steprec continue {shlex.quote(run_id)} --endpoint {shlex.quote(endpoint)}"
    return shown


async def tree_level(store: DuckDBStore, run_id: str, offset: int) -> dict[str, Any]:
    """A run's delegates and forks, a page of them, each with how many runs sit directly below it."""

    def read() -> dict[str, Any]:
        if store.get_run(run_id) is None:
            raise NotFound(f"no run {run_id!r} was recorded")
        rows = store.runs_below(run_id, limit=BELOW_PER_PAGE + 1, offset=offset)
        shown = rows[:BELOW_PER_PAGE]
        counts = store.below_counts([row["run_id"] for row in shown])
        return {
            "run_id": run_id,
            "runs": [{**row, "below": counts.get(row["run_id"], 0)} for row in shown],
            "next_offset": offset + BELOW_PER_PAGE if len(rows) > BELOW_PER_PAGE else None,
        }

    return await asyncio.to_thread(read)


async def tree_root(store: DuckDBStore, run_id: str) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        run = store.get_run(run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r} was recorded")
        return {**run, "below": store.below_counts([run_id]).get(run_id, 0)}

    return {"root": await asyncio.to_thread(read), **await tree_level(store, run_id, 0)}


async def conversations_page(store: DuckDBStore, offset: int) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        rows = store.conversation_ids(limit=RUNS_PER_PAGE + 1, offset=offset)
        heads = store.list_conversations(query="", limit=RUNS_PER_PAGE, offset=0, archived=None) if not offset else []
        return {
            "conversations": rows[:RUNS_PER_PAGE],
            "heads": heads,
            "next_offset": offset + RUNS_PER_PAGE if len(rows) > RUNS_PER_PAGE else None,
        }

    return await asyncio.to_thread(read)


async def conversation_page(store: DuckDBStore, conversation_id: str, page: int | None) -> dict[str, Any]:
    """The conversation's runs in start order, and its head (summary and transcript) when one is kept."""

    def read() -> dict[str, Any]:
        runs = store.list_runs(conversation_id=conversation_id)
        head = store.get_conversation(conversation_id)
        if not runs and head is None:
            raise NotFound(f"no run or conversation head names the conversation {conversation_id!r}")
        summary, head_transcript = None, None
        if head is not None:
            summary, refs = head
            head_transcript = _transcript_page(store, wire.split_digests(refs), page)
        return {"conversation_id": conversation_id, "runs": runs, "head": summary, "transcript": head_transcript}

    return await asyncio.to_thread(read)


@dataclass(frozen=True)
class SqlResult:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool


async def sql_table(store: DuckDBStore, slots: QuerySlots, query: str) -> tuple[pa.Table, bool]:
    """The query's result under `steprec sql`'s guards (one SELECT over the views, its default row and time
    limits, a slot among the queries running at once); raises `SqlRefused` or `SqlTimeout` with the reason."""
    checked = check_query(query)
    limits = QueryLimits.requested(0, 0)

    def run() -> tuple[pa.Table, bool]:
        result = store.query(checked, limits)
        try:
            tables = [pa.ipc.open_stream(stream).read_all() for stream in result]
        finally:
            result.close()
        return (pa.concat_tables(tables) if tables else pa.table({})), result.truncated

    async with slots.taken():
        return await asyncio.to_thread(run)


def shown_rows(table: pa.Table, truncated: bool) -> SqlResult:
    """The first `SQL_ROWS_SHOWN` rows as a page shows them; `truncated` when rows were left out."""
    shown = table.slice(0, SQL_ROWS_SHOWN)
    rows = [[_cell(value) for value in row.values()] for row in shown.to_pylist()]
    return SqlResult(table.column_names, rows, truncated or table.num_rows > SQL_ROWS_SHOWN)


def _cell(value: Any) -> Any:
    """A value as JSON can carry it: bytes as hex, lists and maps kept, anything else (times, decimals) as text."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_cell(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _cell(item) for key, item in value.items()}
    return value if isinstance(value, (int, float, bool, str)) or value is None else str(value)


def as_csv(table: pa.Table) -> bytes:
    """The table as CSV; nested and binary columns (metadata maps, digests), which CSV has no form for, as JSON
    text and hex."""
    flat = {
        name: pa.array([json.dumps(_cell(value), default=str) for value in column.to_pylist()], pa.string())
        if pa.types.is_nested(column.type) or pa.types.is_binary(column.type) else column
        for name, column in zip(table.column_names, table.columns, strict=True)
    }  # fmt: skip
    sink = io.BytesIO()
    pa_csv.write_csv(pa.table(flat), sink)
    return sink.getvalue()


def as_parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()
