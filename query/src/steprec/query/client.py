"""RecorderClient: the async reader of a steprec recorder's query API."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
from steprec.proto.admin.v1 import admin_pb2, admin_pb2_grpc
from steprec.proto.conversations.v1 import conversations_pb2_grpc
from steprec.proto.message_chunks import MessageAssembly
from steprec.proto.query.v1 import query_pb2 as pb
from steprec.proto.query.v1 import query_pb2_grpc
from steprec.proto.tls import ClientTLS

from .channels import LoopChannels
from .closing import AsyncClosing
from .conversation_types import ConversationConflict
from .history_cache import DEFAULT_CACHE_BYTES, HistoryCache
from .types import (
    RunOutcome,
    RunRecord,
    RunTree,
    Snapshot,
    SnapshotSummary,
    StepEvent,
    ToolEffectRecord,
    from_unix_nano,
    to_unix_nano,
)

DEFAULT_ENDPOINT = "127.0.0.1:4317"


class RecorderUnavailable(ConnectionError):
    """The recorder could not be reached or did not answer in time."""


class RecorderBusy(RuntimeError):
    """The recorder is running as many SQL queries as it allows; try again shortly."""


def _optional(message, name: str):
    return getattr(message, name) if message.HasField(name) else None


def _run(run: pb.Run) -> RunRecord:
    return RunRecord(
        run_id=run.run_id,
        conversation_id=_optional(run, "conversation_id"),
        parent_run_id=_optional(run, "parent_run_id"),
        agent_name=_optional(run, "agent_name"),
        metadata=dict(run.metadata),
        started_at=from_unix_nano(run.started_at_unix_nano),
        ended_at=from_unix_nano(run.ended_at_unix_nano) if run.HasField("ended_at_unix_nano") else None,
        outcome=run.outcome,
        registration_id=run.registration_id,
        forked_from_run_id=_optional(run, "forked_from_run_id"),
        forked_from_snapshot_index=_optional(run, "forked_from_snapshot_index"),
    )


def _event(event: pb.StepEvent) -> StepEvent:
    return StepEvent(
        run_id=event.run_id,
        kind=event.kind,
        step_index=event.step_index,
        timestamp=from_unix_nano(event.timestamp_unix_nano),
        metadata=dict(event.metadata),
        trace_id=event.trace_id or None,
        span_id=event.span_id or None,
        **{
            name: _optional(event, name)
            for name in (
                "conversation_id", "parent_run_id", "agent_name", "tool_call_id", "tool_name", "error",
                "idempotency_key",
            )
        },
    )  # fmt: skip


_SNAPSHOT_LINEAGE = ("conversation_id", "parent_run_id", "agent_name", "idempotency_key")


def _summary(info: pb.SnapshotInfo) -> SnapshotSummary:
    return SnapshotSummary(
        run_id=info.run_id,
        snapshot_index=info.snapshot_index,
        step_index=info.step_index,
        state=info.state,
        timestamp=from_unix_nano(info.timestamp_unix_nano),
        message_count=info.message_count,
        **{name: _optional(info, name) for name in _SNAPSHOT_LINEAGE},
    )


def _effect(effect: pb.ToolEffect) -> ToolEffectRecord:
    return ToolEffectRecord(
        run_id=effect.run_id,
        tool_call_id=effect.tool_call_id,
        tool_name=effect.tool_name,
        status=effect.status,
        started_at=from_unix_nano(effect.started_at_unix_nano),
        ended_at=from_unix_nano(effect.ended_at_unix_nano) if effect.HasField("ended_at_unix_nano") else None,
        idempotency_key=_optional(effect, "idempotency_key"),
        effect_summary=_optional(effect, "effect_summary"),
    )


class _Stubs:
    """The query, admin and conversations stubs of one channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.query = query_pb2_grpc.RecorderQueryStub(channel)
        self.admin = admin_pb2_grpc.RecorderAdminStub(channel)
        self.conversations = conversations_pb2_grpc.RecorderConversationsStub(channel)


class RecorderClient(AsyncClosing):
    """Async client of a recorder's query service; use as `async with RecorderClient(endpoint) as client`.

    Every call returns typed records (`RunRecord`, `StepEvent`, `Snapshot`,
    `ToolEffectRecord`) and raises `RecorderUnavailable` when the recorder
    cannot be reached, `ValueError` for an argument the recorder refused.
    Histories are read through a cache of validated messages bounded by `message_cache_bytes`
    (history_cache.py: what it shares between the histories it returns, and why).
    It may be created anywhere (at module level, before any event loop exists) and used in any
    number of loops, one after another or at once: each gets its own channel (channels.py).
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout_seconds: float = 10.0,
        token: str | None = None,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        message_cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.endpoint = endpoint or os.environ.get("STEPREC_ENDPOINT", DEFAULT_ENDPOINT)
        self.timeout = timeout_seconds
        token = token or os.environ.get("STEPREC_TOKEN") or None
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        tls = ClientTLS(tls_ca, tls_cert, tls_key)
        address = self.endpoint.removeprefix("http://").removeprefix("https://")
        if tls.configured or self.endpoint.startswith("https://"):
            connect = functools.partial(grpc.aio.secure_channel, address, tls.credentials())
        else:
            connect = functools.partial(grpc.aio.insecure_channel, address)
        self._channels = LoopChannels(connect, _Stubs)
        self._histories = HistoryCache(message_cache_bytes)

    @property
    def _stub(self) -> query_pb2_grpc.RecorderQueryStub:
        return self._channels.current().query

    @property
    def _admin(self) -> admin_pb2_grpc.RecorderAdminStub:
        return self._channels.current().admin

    @property
    def _conversations(self) -> conversations_pb2_grpc.RecorderConversationsStub:
        """For `ConversationStore`, which shares this client's channels and history cache."""
        return self._channels.current().conversations

    async def close(self) -> None:
        """Close the channel this loop used (one per event loop the client was used in: channels.py)."""
        await self._channels.close()

    async def _call(self, method, request):
        try:
            return await method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise _translate(error, self.endpoint) from None

    def _stream(self, method, request, *, timeout: float | None = -1.0) -> AsyncIterator[Any]:
        """The messages of a server-streaming call, begun now (its request leaves at the event loop's next
        turn), with errors translated like `_call`'s."""
        call = method(request, timeout=self.timeout if timeout == -1.0 else timeout, metadata=self._metadata)
        return self._messages(call)

    async def _messages(self, call) -> AsyncIterator[Any]:
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as error:
            raise _translate(error, self.endpoint) from None

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None when the recorder never saw it."""
        try:
            return _run(await self._call(self._stub.GetRun, pb.GetRunRequest(run_id=run_id)))
        except LookupError:
            return None

    async def list_runs(
        self,
        *,
        conversation_id: str | None = None,
        parent_run_id: str | None = None,
        agent_name: str | None = None,
        forked_from_run_id: str | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        outcome: RunOutcome | None = None,
    ) -> list[RunRecord]:
        """Runs matching every given filter, oldest start first (so `[-1]` is the newest).

        `started_after` is inclusive, `started_before` exclusive. Large results are fetched page by
        page; `iter_runs` yields them without holding them all.
        """
        filters = {"conversation_id": conversation_id, "parent_run_id": parent_run_id, "agent_name": agent_name,
                   "forked_from_run_id": forked_from_run_id, "started_after": started_after,
                   "started_before": started_before, "outcome": outcome}  # fmt: skip
        return [run async for run in self.iter_runs(**filters)]

    async def iter_runs(self, *, page_size: int = 1000, **filters: Any) -> AsyncIterator[RunRecord]:
        """The runs `list_runs` returns, one page of `page_size` at a time."""
        after, before = filters.pop("started_after", None), filters.pop("started_before", None)
        request = pb.ListRunsRequest(page_size=page_size, **{k: v for k, v in filters.items() if v is not None})
        if after is not None:
            request.started_at_or_after_unix_nano = to_unix_nano(after)
        if before is not None:
            request.started_before_unix_nano = to_unix_nano(before)
        while True:
            response = await self._call(self._stub.ListRuns, request)
            for run in response.runs:
                yield _run(run)
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    async def run_tree(self, run_id: str) -> RunTree | None:
        """The run with all its descendants and forks as a tree (children in start order), or None if unknown.

        A fork hangs under the run it was forked from (unless it also has a parent in the tree).
        """
        entries = await self._tree(pb.GetRunTreeRequest(run_id=run_id))
        if not entries:
            return None
        nodes = {entry.run.run_id: RunTree(run=_run(entry.run), children=[]) for entry in entries}
        for entry in entries[1:]:  # depth order: every parent comes before its children
            above = entry.run.parent_run_id if entry.run.parent_run_id in nodes else entry.run.forked_from_run_id
            nodes[above].children.append(nodes[entry.run.run_id])
        return nodes[run_id]

    async def descendants(self, run_id: str) -> pa.Table | None:
        """The run and every run below it (delegates, forks, recursively) as one pyarrow Table, or None.

        Columns: run_id, depth, parent_run_id, forked_from_run_id, forked_from_snapshot_index,
        conversation_id, agent_name, started_at, ended_at, outcome; ordered by depth, then start, then run id.
        The read for trees of many thousands of runs, where `run_tree`'s objects cost too much.
        """
        request = pb.GetDescendantsRequest(run_id=run_id)
        table = await _ArrowStream(self._stream(self._stub.GetDescendants, request)).table()
        if not table.num_rows or table["run_id"][0].as_py() != run_id:
            return None  # the run itself was never recorded
        outcome = table.schema.get_field_index("outcome")  # sent dictionary-encoded (one byte a run)
        return table.set_column(outcome, "outcome", table["outcome"].cast(pa.string())).replace_schema_metadata(None)

    async def ancestors(self, run_id: str) -> list[RunRecord]:
        """The runs above this one, its parent first and the root last (empty for a root)."""
        return [
            _run(entry.run) for entry in (await self._tree(pb.GetRunTreeRequest(run_id=run_id, ancestors=True)))[1:]
        ]

    async def _tree(self, request: pb.GetRunTreeRequest) -> list[pb.TreeRun]:
        try:
            return [entry async for page in self._stream(self._stub.GetRunTree, request) for entry in page.runs]
        except LookupError:
            return []

    async def list_events(self, run_id: str) -> list[StepEvent]:
        """A run's step events in write order."""
        response = await self._call(self._stub.ListEvents, pb.ListEventsRequest(run_id=run_id))
        return [_event(event) for event in response.events]

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> Snapshot | None:
        """The newest `complete` snapshot (newest of either state with `include_interrupted`), or None."""
        return await self._read_snapshot(pb.ReadSnapshotRequest(run_id=run_id, include_interrupted=include_interrupted))

    async def get_snapshot(self, run_id: str, snapshot_index: int) -> Snapshot | None:
        """A given retained snapshot, whatever its state (time travel), or None."""
        return await self._read_snapshot(pb.ReadSnapshotRequest(run_id=run_id, snapshot_index=snapshot_index))

    async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[SnapshotSummary]:
        """The run's retained snapshots in write order, without messages (fetch one with `get_snapshot`)."""
        request = pb.ListSnapshotsRequest(run_id=run_id, include_interrupted=include_interrupted)
        return [_summary(info) for info in (await self._call(self._stub.ListSnapshots, request)).snapshots]

    async def _read_snapshot(self, request: pb.ReadSnapshotRequest) -> Snapshot | None:
        """The snapshot's digests first, then only the messages `_histories` does not hold (`_read_messages`).

        While the recorder answers, copies of what the same read handed out last are lent (`spare`): the answer
        is most often the same history, and copying it costs as much as the call (docs/benchmarks.md).
        """
        request.digests_only = True
        index = request.snapshot_index if request.HasField("snapshot_index") else None
        read = (request.run_id, request.include_interrupted, index)
        answer = self._stream(self._stub.ReadSnapshot, request)
        await asyncio.sleep(0)  # the request leaves
        spare = self._histories.spare(read)
        info, digests = None, bytearray()
        try:
            async for chunk in answer:
                if chunk.HasField("info"):
                    info = chunk.info
                digests += chunk.message_digests
            if info is None:
                return None
            messages = await self._histories.history(bytes(digests), self._read_messages, read=read, spare=spare)
        except LookupError:  # no such snapshot, or pruned between the two calls
            return None
        return Snapshot(
            run_id=info.run_id,
            snapshot_index=info.snapshot_index,
            step_index=info.step_index,
            state=info.state,
            timestamp=from_unix_nano(info.timestamp_unix_nano),
            messages=messages,
            **{name: _optional(info, name) for name in _SNAPSHOT_LINEAGE},
        )

    async def _read_messages(self, digests: list[bytes]) -> list[bytes]:
        assembly = MessageAssembly()
        async for chunk in self._stream(self._stub.ReadMessages, pb.ReadMessagesRequest(digests=b"".join(digests))):
            assembly.add(chunk)
        return assembly.messages

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        """The tool-effect ledger of a run, one record per tool call, latest status."""
        response = await self._call(self._stub.ListToolEffects, pb.ListToolEffectsRequest(run_id=run_id))
        return [_effect(effect) for effect in response.effects]

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        """One tool call's effect record, or None when the recorder never saw it."""
        request = pb.GetToolEffectRequest(run_id=run_id, tool_call_id=tool_call_id)
        try:
            return _effect(await self._call(self._stub.GetToolEffect, request))
        except LookupError:
            return None

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        """Tool calls that started and never finished: their side effect may or may not have happened."""
        request = pb.ListToolEffectsRequest(run_id=run_id, unresolved_only=True)
        return [_effect(effect) for effect in (await self._call(self._stub.ListToolEffects, request)).effects]

    async def iter_media(self, uri: str) -> AsyncIterator[bytes]:
        """A media blob (`media+sha256://...`, as stored messages refer to it) in chunks of about 1 MiB.

        Raises LookupError when no stored message refers to it, ValueError for a malformed URI.
        """
        async for chunk in self._stream(self._stub.FetchMedia, pb.FetchMediaRequest(uri=uri), timeout=None):
            yield chunk.data

    async def fetch_media(self, uri: str) -> bytes:
        """A whole media blob; see `iter_media` to stream a large one."""
        return b"".join([chunk async for chunk in self.iter_media(uri)])

    async def sql(self, query: str, *, max_rows: int = 0, timeout_seconds: float = 0.0) -> pa.Table:
        """One read-only SELECT over the recorder's views (docs/sql.md), as a pyarrow Table.

        `max_rows` and `timeout_seconds` of 0 take the recorder's defaults (10,000 rows, 10 s).
        When more rows matched than the limit allowed, the table holds the first ones and
        `truncated(table)` is true. Raises ValueError with the recorder's reason for a refused or
        failing query, TimeoutError when it ran past its time limit.
        """
        request = pb.SqlRequest(query=query, max_rows=max_rows, timeout_seconds=timeout_seconds)
        deadline = (timeout_seconds or 300.0) + self.timeout
        return await _ArrowStream(self._stream(self._stub.Sql, request, timeout=deadline)).table()

    async def iter_view(self, view: str) -> AsyncIterator[pa.RecordBatch]:
        """Every row of one exportable view (runs, events, ... see docs/sql.md), batch by batch, no limit."""
        request = pb.ExportViewRequest(view=view)
        async for batch in _ArrowStream(self._stream(self._stub.ExportView, request, timeout=None)):
            yield batch

    async def prune(
        self, *, started_before: datetime | None = None, conversation_id: str | None = None, dry_run: bool = False
    ) -> dict[str, int]:
        """Remove whole runs by start time and/or conversation, then messages and media nothing refers to.

        Returns what was (or, with `dry_run`, would be) removed, by kind. Give the client a
        `timeout_seconds` long enough for the store it prunes.
        """
        request = admin_pb2.PruneRequest(dry_run=dry_run)
        if started_before is not None:
            request.started_before_unix_nano = to_unix_nano(started_before)
        if conversation_id is not None:
            request.conversation_id = conversation_id
        result = await self._call(self._admin.Prune, request)
        return {field.name: getattr(result, field.name) for field in result.DESCRIPTOR.fields}


TRUNCATED = b"steprec.truncated"


def truncated(table: pa.Table) -> bool:
    """Whether `RecorderClient.sql` cut this result off at its row limit."""
    return (table.schema.metadata or {}).get(TRUNCATED) == b"true"


class _ArrowStream:
    """Decodes an ArrowChunk stream into record batches; remembers the schema and the truncation flag."""

    def __init__(self, chunks: AsyncIterator[pb.ArrowChunk]) -> None:
        self._chunks = chunks
        self.schema: pa.Schema | None = None
        self.truncated = False

    async def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        pieces: list[bytes] = []
        async for chunk in self._chunks:
            pieces.append(chunk.arrow_ipc)
            self.truncated = chunk.truncated
            if chunk.batch_end:  # the pieces so far are one whole IPC stream (joined once: it may be megabytes)
                reader = pa.ipc.open_stream(pieces[0] if len(pieces) == 1 else b"".join(pieces))
                pieces.clear()
                self.schema = reader.schema
                for batch in reader:
                    yield batch

    async def table(self) -> pa.Table:
        table = pa.Table.from_batches([batch async for batch in self], schema=self.schema)
        flag = b"true" if self.truncated else b"false"
        return table.replace_schema_metadata({**(table.schema.metadata or {}), TRUNCATED: flag})


def _translate(error: grpc.aio.AioRpcError, endpoint: str) -> Exception:
    code = error.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and "time limit" in (error.details() or ""):
        return TimeoutError(error.details())  # the recorder stopped a SQL query, it is not unreachable
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return RecorderUnavailable(f"recorder at {endpoint} is not reachable: {error.details()}")
    if code == grpc.StatusCode.NOT_FOUND:
        return LookupError(error.details())
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(error.details())
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RecorderBusy(error.details())
    if code == grpc.StatusCode.ABORTED:
        return ConversationConflict(error.details())
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return PermissionError(f"recorder at {endpoint} refused the call: {error.details()}")
    return RuntimeError(f"recorder at {endpoint} answered {code.name}: {error.details()}")
