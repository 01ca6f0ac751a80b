"""The steprec.query.v1 RecorderQuery service: store reads as protobuf."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterator
from functools import partial

import grpc
import pyarrow as pa
from google.protobuf.message import Message
from steprec.proto import wire
from steprec.proto.message_chunks import CHUNK_BYTES, message_chunks
from steprec.proto.query.v1 import query_pb2 as pb
from steprec.proto.query.v1 import query_pb2_grpc

from ..store.duckdb_store import DuckDBStore
from ..store.media import MediaCorrupt, is_media_uri
from .sql import (
    EXPORTS,
    TREE_TIMEOUT_SECONDS,
    UNLIMITED,
    QueryLimits,
    QueryRun,
    QuerySlots,
    SqlRefused,
    SqlTimeout,
    check_query,
)  # fmt: skip

_OUTCOMES = ("running", "completed", "failed")
_MAX_PAGE = 10_000
_PAGE_TOKEN = re.compile(r"(-?\d{1,20}):(\d{1,20})")
_RUN_FILTERS = {
    "conversation_id": "conversation_id",
    "parent_run_id": "parent_run_id",
    "agent_name": "agent_name",
    "forked_from_run_id": "forked_from_run_id",
    "started_at_or_after_unix_nano": "started_at_or_after_ns",
    "started_before_unix_nano": "started_before_ns",
    "outcome": "outcome",
}
_TREE_PAGE = 2000


async def _valid_run_id(run_id: str, context: grpc.aio.ServicerContext) -> str:
    if not wire.is_run_id(run_id):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"run_id {run_id[:80]!r} is not {wire.RUN_ID_RULE}")
    return run_id


def _optional(message, **values) -> None:
    for name, value in values.items():
        if value is not None:
            setattr(message, name, value)


def _run(row: dict) -> pb.Run:
    run = pb.Run(
        run_id=row["run_id"],
        registration_id=row["registration_id"],
        started_at_unix_nano=row["started_at_ns"],
        outcome=row["outcome"],
        metadata=row["metadata"] or {},
    )
    _optional(
        run,
        conversation_id=row["conversation_id"],
        parent_run_id=row["parent_run_id"],
        agent_name=row["agent_name"],
        ended_at_unix_nano=row["ended_at_ns"],
        forked_from_run_id=row["forked_from_run_id"],
        forked_from_snapshot_index=row["forked_from_snapshot_index"],
    )
    return run


def _event(row: dict) -> pb.StepEvent:
    event = pb.StepEvent(
        run_id=row["run_id"],
        kind=row["kind"],
        step_index=row["step_index"],
        timestamp_unix_nano=row["at_ns"],
        metadata=row["metadata"] or {},
        trace_id=row["trace_id"] or "",
        span_id=row["span_id"] or "",
    )
    _optional(
        event,
        **{k: row[k] for k in ("conversation_id", "parent_run_id", "agent_name", "tool_call_id", "tool_name", "error")},
        idempotency_key=row["idempotency_key"],
    )
    return event


def _effect(row: dict) -> pb.ToolEffect:
    effect = pb.ToolEffect(
        run_id=row["run_id"],
        tool_call_id=row["tool_call_id"],
        tool_name=row["tool_name"],
        status=row["status"],
        started_at_unix_nano=row["started_at_ns"],
    )
    _optional(
        effect,
        ended_at_unix_nano=row["ended_at_ns"],
        idempotency_key=row["idempotency_key"],
        effect_summary=row["effect_summary"],
    )
    return effect


def _snapshot_info(row: dict) -> pb.SnapshotInfo:
    info = pb.SnapshotInfo(
        run_id=row["run_id"],
        snapshot_index=row["snapshot_index"],
        step_index=row["step_index"],
        state=row["state"],
        timestamp_unix_nano=row["at_ns"],
        message_count=row["message_count"],
    )
    _optional(info, **{k: row[k] for k in ("conversation_id", "parent_run_id", "agent_name", "idempotency_key")})
    return info


class RecorderQuery(query_pb2_grpc.RecorderQueryServicer):
    def __init__(self, store: DuckDBStore, queries: QuerySlots | None = None) -> None:
        """`queries` are the SQL slots this service shares (with the browser, in `steprec serve`)."""
        self._store = store
        self._queries = queries or QuerySlots()

    def handler(self) -> grpc.GenericRpcHandler:
        """Every method of the service, as the generated registration makes them, except that replies may also be
        bytes already encoded (`encoded_arrow_chunks`)."""
        service = pb.DESCRIPTOR.services_by_name["RecorderQuery"]
        streamed, unary = grpc.unary_stream_rpc_method_handler, grpc.unary_unary_rpc_method_handler
        methods = {  # each method takes one request message
            method.name: (streamed if method.server_streaming else unary)(
                getattr(self, method.name),
                request_deserializer=getattr(pb, method.input_type.name).FromString,
                response_serializer=_serialized,
            )
            for method in service.methods
        }
        return grpc.method_handlers_generic_handler(service.full_name, methods)

    async def GetRun(self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext) -> pb.Run:  # noqa: N802
        run_id = await _valid_run_id(request.run_id, context)
        row = await asyncio.to_thread(self._store.get_run, run_id)
        if row is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no run {run_id!r} was recorded")
        return _run(row)

    async def ListRuns(self, request: pb.ListRunsRequest, context) -> pb.ListRunsResponse:  # noqa: N802
        for name in ("parent_run_id", "forked_from_run_id"):
            if request.HasField(name):
                await _valid_run_id(getattr(request, name), context)
        if request.HasField("outcome") and request.outcome not in _OUTCOMES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"outcome must be one of {', '.join(_OUTCOMES)}")
        if not 0 <= request.page_size <= _MAX_PAGE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"page_size must be 0 (all) to {_MAX_PAGE}")
        after = None
        if request.page_token:
            if not (match := _PAGE_TOKEN.fullmatch(request.page_token)):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_token is not one this recorder issued")
            after = (int(match[1]), int(match[2]))
        optional = {
            keyword: getattr(request, field) if request.HasField(field) else None
            for field, keyword in _RUN_FILTERS.items()
        }
        rows = await asyncio.to_thread(
            self._store.list_runs, **optional, after=after, limit=request.page_size + 1 if request.page_size else None
        )
        response = pb.ListRunsResponse()
        if request.page_size and len(rows) > request.page_size:
            rows = rows[: request.page_size]
            response.next_page_token = f"{rows[-1]['started_at_ns']}:{rows[-1]['write_seq']}"
        response.runs.extend(_run(row) for row in rows)
        return response

    async def GetRunTree(self, request: pb.GetRunTreeRequest, context):  # noqa: N802
        run_id = await _valid_run_id(request.run_id, context)
        try:
            rows = await asyncio.to_thread(
                self._store.run_tree, run_id, ancestors=request.ancestors, timeout_seconds=TREE_TIMEOUT_SECONDS
            )
        except SqlTimeout as error:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(error))
        if not rows or rows[0]["run_id"] != run_id:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no run {run_id!r} was recorded")
        for start in range(0, len(rows), _TREE_PAGE):
            page = rows[start : start + _TREE_PAGE]
            yield pb.GetRunTreeResponse(runs=[pb.TreeRun(run=_run(row), depth=row["depth"]) for row in page])

    async def GetDescendants(self, request: pb.GetDescendantsRequest, context):  # noqa: N802
        run_id = await _valid_run_id(request.run_id, context)
        limits = QueryLimits(max_rows=None, timeout_seconds=TREE_TIMEOUT_SECONDS)
        async for chunk in self._arrow(context, partial(self._store.descendants, run_id, limits), counted=False):
            yield chunk

    async def ListEvents(self, request: pb.ListEventsRequest, context) -> pb.ListEventsResponse:  # noqa: N802
        run_id = await _valid_run_id(request.run_id, context)
        rows = await asyncio.to_thread(self._store.list_events, run_id)
        return pb.ListEventsResponse(events=[_event(row) for row in rows])

    async def ReadSnapshot(self, request: pb.ReadSnapshotRequest, context):  # noqa: N802
        run_id = await _valid_run_id(request.run_id, context)
        index = request.snapshot_index if request.HasField("snapshot_index") else None
        which = {"include_interrupted": request.include_interrupted, "snapshot_index": index}
        # A run read again is answered here, without a worker thread, when the store keeps the answer.
        found = self._store.kept_snapshot(run_id, **which) if request.digests_only else None
        if found is None:
            found = await asyncio.to_thread(
                self._store.read_snapshot, run_id, **which, digests_only=request.digests_only
            )
        if found is None:
            missing = f"retained snapshot {index}" if index is not None else (
                "snapshot" if request.include_interrupted else "complete snapshot"
            )  # fmt: skip
            await context.abort(grpc.StatusCode.NOT_FOUND, f"run {run_id!r} has no {missing}")
        info_row, messages = found
        if request.digests_only:  # 32,768 digests a chunk (1 MiB is a multiple of 32)
            for start in range(0, max(len(messages), 1), CHUNK_BYTES):
                chunk = pb.SnapshotChunk(message_digests=messages[start : start + CHUNK_BYTES])
                if not start:
                    chunk.info.CopyFrom(_snapshot_info(info_row))
                yield chunk
            return
        for chunk in message_chunks(pb.SnapshotChunk(info=_snapshot_info(info_row)), _encoded(messages)):
            yield chunk

    async def ReadMessages(self, request: pb.ReadMessagesRequest, context):  # noqa: N802
        digests = wire.split_digests(request.digests)
        if len(request.digests) % wire.DIGEST_SIZE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"digests must be {wire.DIGEST_SIZE}-byte SHA-256 digests, concatenated;"
                f" got {len(request.digests)} bytes",
            )
        if len(set(digests)) != len(digests):  # each body is sent once: a repeated big one must not multiply
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "each digest may be asked for once")
        try:
            messages = await asyncio.to_thread(self._store.read_messages, digests)
        except LookupError as error:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
        for chunk in message_chunks(pb.SnapshotChunk(), _encoded(messages)):
            yield chunk

    async def ListToolEffects(self, request: pb.ListToolEffectsRequest, context) -> pb.ListToolEffectsResponse:  # noqa: N802
        run_id = await _valid_run_id(request.run_id, context)
        rows = await asyncio.to_thread(self._store.list_tool_effects, run_id, unresolved_only=request.unresolved_only)
        return pb.ListToolEffectsResponse(effects=[_effect(row) for row in rows])

    async def ListSnapshots(self, request: pb.ListSnapshotsRequest, context) -> pb.ListSnapshotsResponse:  # noqa: N802
        run_id = await _valid_run_id(request.run_id, context)
        rows = await asyncio.to_thread(
            self._store.list_snapshots, run_id, include_interrupted=request.include_interrupted
        )
        return pb.ListSnapshotsResponse(snapshots=[_snapshot_info(row) for row in rows])

    async def GetToolEffect(self, request: pb.GetToolEffectRequest, context) -> pb.ToolEffect:  # noqa: N802
        run_id = await _valid_run_id(request.run_id, context)
        rows = await asyncio.to_thread(
            self._store.list_tool_effects, run_id, unresolved_only=False, tool_call_id=request.tool_call_id
        )
        if not rows:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"run {run_id!r} has no tool call {request.tool_call_id!r}")
        return _effect(rows[0])

    async def FetchMedia(self, request: pb.FetchMediaRequest, context):  # noqa: N802
        if not is_media_uri(request.uri):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{request.uri[:100]!r} is not media+sha256://<64 lowercase hex>"
            )
        try:
            data = await asyncio.to_thread(self._store.read_media, request.uri)
        except (OSError, MediaCorrupt) as error:
            await context.abort(grpc.StatusCode.DATA_LOSS, f"{request.uri} cannot be read: {error}")
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no stored message refers to {request.uri}")
        for start in range(0, max(len(data), 1), CHUNK_BYTES):
            yield pb.MediaChunk(data=data[start : start + CHUNK_BYTES], size_bytes=len(data) if not start else 0)

    async def Sql(self, request: pb.SqlRequest, context):  # noqa: N802
        try:
            query = check_query(request.query)
            limits = QueryLimits.requested(request.max_rows, request.timeout_seconds)
        except SqlRefused as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        async for chunk in self._arrow(context, partial(self._store.query, query, limits)):
            yield chunk

    async def ExportView(self, request: pb.ExportViewRequest, context):  # noqa: N802
        if request.view not in EXPORTS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{request.view[:80]!r} is not one of {', '.join(EXPORTS)}"
            )
        async for chunk in self._arrow(context, partial(self._store.query, EXPORTS[request.view][0], UNLIMITED)):
            yield chunk

    async def _arrow(self, context, start: Callable[[], QueryRun], *, counted: bool = True):
        """Run the query `start` begins in worker threads, one batch at a time, as ArrowChunks; errors become statuses.

        `counted` queries (SQL, exports) share the concurrency limit; the recorder's own reads do not.
        When the caller goes away mid-stream the query is interrupted, and its cursor closed only
        after the worker step in flight has returned.
        """
        if counted and self._queries.busy:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._queries.busy_reason)
        async with self._queries.taken() if counted else contextlib.nullcontext():
            run = await asyncio.to_thread(start)
            batches, step = iter(run), None
            try:
                while True:
                    step = asyncio.ensure_future(asyncio.to_thread(next, batches, None))
                    unit = await asyncio.shield(step)  # a cancelled caller must not orphan the worker
                    if unit is None:
                        break
                    for chunk in encoded_arrow_chunks(unit):
                        yield chunk
                yield pb.ArrowChunk(truncated=run.truncated)
            except SqlRefused as error:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the query failed: {error}")
            except SqlTimeout as error:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(error))
            finally:
                if step is not None and not step.done():
                    run.cancel()
                    await asyncio.gather(step, return_exceptions=True)
                run.close()


def encoded_arrow_chunks(stream: pa.Buffer) -> Iterator[bytes]:
    """One Arrow IPC stream as the ArrowChunk messages carrying it, already encoded, the last with `batch_end`.

    Each piece is copied once, into its message; an `ArrowChunk` built from it copied it three times (out of
    the Arrow buffer, into the message, out of the message), about 26 MB for a 100,000-run tree. The bytes
    are those protobuf writes for `ArrowChunk(arrow_ipc=piece, batch_end=...)` (tested), and pass grpc's
    serializer unchanged (`RecorderQuery.handler`).
    """
    view = memoryview(stream)
    for start in range(0, len(view), CHUNK_BYTES):
        piece = view[start : start + CHUNK_BYTES]
        end = _BATCH_END if start + CHUNK_BYTES >= len(view) else b""
        yield b"".join((_ARROW_IPC_TAG, _varint(len(piece)), piece, end))


_ARROW_IPC_TAG = bytes([1 << 3 | 2])
"""ArrowChunk field 1 (`arrow_ipc`), length-delimited: its tag, then the length as a varint, then the bytes."""
_BATCH_END = pb.ArrowChunk(batch_end=True).SerializeToString()
"""Appended to a message, sets `batch_end` (protobuf merges concatenated messages)."""


def _varint(value: int) -> bytes:
    """`value` as a protobuf base-128 varint: seven bits a byte, low bits first, the high bit meaning "more"."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _serialized(message: Message | bytes) -> bytes:
    """A reply as grpc sends it: a message serialized, or the bytes `encoded_arrow_chunks` wrote."""
    return message if type(message) is bytes else message.SerializeToString()


def _encoded(messages: list[str]) -> Iterator[bytes]:
    return (message.encode() for message in messages)
