"""The steprec.conversations.v1 RecorderConversations service: conversation heads over gRPC.

Every request is input from a stranger: a summary is checked field by field before the store sees it,
and an upload is bounded (`MAX_HEAD_BYTES`). The store's answers map to status codes: a conflict is
ABORTED (reload, then write again), an unknown conversation NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import unicodedata

import grpc
from steprec.proto import wire
from steprec.proto.conversations.v1 import conversations_pb2 as pb
from steprec.proto.conversations.v1 import conversations_pb2_grpc
from steprec.proto.message_chunks import CHUNK_BYTES, MessageAssembly

from ..ingest.decode import Malformed
from ..store.applier import StoreUnavailable
from ..store.conversations import Conflict, NotStored
from ..store.duckdb_store import DuckDBStore

MAX_HEAD_BYTES = 256 << 20
"""The message JSON one save may upload (256 MiB); a head's messages a run recorded already cost nothing here."""
_DIGEST_CHUNK = CHUNK_BYTES // wire.DIGEST_SIZE * wire.DIGEST_SIZE
"""Digests per streamed answer: about 1 MiB (32,768 messages)."""
MAX_PAGE = 10_000
TITLE_SOURCES = ("fallback", "generated", "user")
OUTCOMES = ("ready", "running", "completed", "failed", "cancelled")
_CHECKOUT = ("repository", "name", "root", "branch")


class BadRequest(ValueError):
    """A request field that cannot be right; the message names it."""


def valid_id(conversation_id: str) -> str:
    if not 1 <= len(conversation_id) <= 200 or any(unicodedata.category(c).startswith("C") for c in conversation_id):
        raise BadRequest(f"conversation id {conversation_id[:80]!r} is not 1-200 printable characters")
    return conversation_id


def _summary_row(summary: pb.ConversationSummary) -> dict:
    """A checked summary as the store's row (docs/conversations.md lists the rules)."""
    if summary.schema_version != 1:
        raise BadRequest(f"schema_version {summary.schema_version} is not 1, the only one this recorder knows")
    if summary.title_source not in TITLE_SOURCES:
        raise BadRequest(f"title_source {summary.title_source[:40]!r} is not one of {', '.join(TITLE_SOURCES)}")
    if summary.outcome not in OUTCOMES:
        raise BadRequest(f"outcome {summary.outcome[:40]!r} is not one of {', '.join(OUTCOMES)}")
    counts = ("revision", "naming_version", "named_revision", "message_count", "total_tokens", "naming_tokens")
    if negative := [name for name in counts if getattr(summary, name) < 0]:
        raise BadRequest(f"{negative[0]} must not be negative")
    if summary.HasField("owner_pid") and summary.owner_pid <= 0:
        raise BadRequest(f"owner_pid {summary.owner_pid} is not a process id")
    checkout = summary.checkout if summary.HasField("checkout") else None
    return {
        "conversation_id": valid_id(summary.id),
        "schema_version": 1,
        "workspace": summary.workspace,
        **{f"checkout_{name}": getattr(checkout, name) if checkout else None for name in _CHECKOUT},
        "updated_at": summary.updated_at_unix_nano,
        "tags": list(summary.tags),
        **{
            name: getattr(summary, name)
            for name in (
                "revision",
                "title",
                "subtitle",
                "title_source",
                "naming_version",
                "named_revision",
                "outcome",
                "message_count",
                "total_tokens",
                "naming_tokens",
            )
        },  # fmt: skip
        **{
            name: getattr(summary, name) if summary.HasField(name) else None
            for name in ("model", "run_id", "owner_pid", "owner_host")
        },  # fmt: skip
        # DuckDB keeps microseconds: what a save answers is then what a read does.
        "archived_at": summary.archived_at_unix_nano // 1000 * 1000
        if summary.HasField("archived_at_unix_nano")
        else None,
    }


def summary_message(row: dict) -> pb.ConversationSummary:
    summary = pb.ConversationSummary(
        schema_version=row["schema_version"], id=row["conversation_id"], updated_at_unix_nano=row["updated_at"],
        **{name: row[name] for name in ("workspace", "revision", "title", "subtitle", "tags", "title_source",
                                         "naming_version", "named_revision", "outcome", "message_count",
                                         "total_tokens", "naming_tokens")},
    )  # fmt: skip
    for name in ("model", "run_id", "owner_pid", "owner_host"):
        if row[name] is not None:
            setattr(summary, name, row[name])
    if row["archived_at"] is not None:
        summary.archived_at_unix_nano = row["archived_at"]
    if row["checkout_repository"] is not None:
        summary.checkout.CopyFrom(pb.GitCheckout(**{name: row[f"checkout_{name}"] or "" for name in _CHECKOUT}))
    return summary


class RecorderConversations(conversations_pb2_grpc.RecorderConversationsServicer):
    def __init__(self, store: DuckDBStore) -> None:
        self._store = store

    async def SaveConversation(self, request_iterator, context) -> pb.ConversationSummary:  # noqa: N802
        summary, digests, text, assembly = None, bytearray(), [], MessageAssembly(MAX_HEAD_BYTES)
        try:
            async for request in request_iterator:
                if request.HasField("summary"):
                    if summary is not None:
                        raise BadRequest("only the first message of a save may carry the summary")
                    summary = _summary_row(request.summary)
                elif summary is None:
                    raise BadRequest("a save's first message must carry the summary")
                digests += request.message_digests
                text.append(request.search_text)
                if len(digests) > MAX_HEAD_BYTES:
                    raise BadRequest(f"the message digests are longer than {MAX_HEAD_BYTES} bytes")
                assembly.add(request.messages)
            if summary is None:
                raise BadRequest("a save must carry a summary")
            if len(digests) % wire.DIGEST_SIZE or not assembly.complete:
                raise BadRequest(f"message_digests must be {wire.DIGEST_SIZE}-byte SHA-256 digests, concatenated,"
                                 " and every large message must end with message_complete")  # fmt: skip
            bodies = [self._text(body) for body in assembly.messages]
        except ValueError as error:  # BadRequest, or MessageAssembly past its bound
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        saved = await self._write(
            context, self._store.conversations.save, summary, bytes(digests), bodies, "".join(text)
        )
        return summary_message(saved)

    @staticmethod
    def _text(body: bytes) -> str:
        try:
            return body.decode()
        except UnicodeDecodeError as error:
            raise BadRequest(f"a message is not UTF-8 JSON: {error}") from None

    async def GetConversation(self, request: pb.GetConversationRequest, context):  # noqa: N802
        conversation_id = await self._checked(context, valid_id, request.conversation_id)
        head = await asyncio.to_thread(self._store.get_conversation, conversation_id)
        if head is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no saved conversation {conversation_id!r}")
        row, refs = head
        yield pb.GetConversationResponse(summary=summary_message(row), message_digests=refs[:_DIGEST_CHUNK])
        for start in range(_DIGEST_CHUNK, len(refs), _DIGEST_CHUNK):
            yield pb.GetConversationResponse(message_digests=refs[start : start + _DIGEST_CHUNK])

    async def ListConversations(self, request: pb.ListConversationsRequest, context) -> pb.ListConversationsResponse:  # noqa: N802
        if not 1 <= request.limit <= MAX_PAGE or request.offset < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"limit must be 1 to {MAX_PAGE} and offset not negative")  # fmt: skip
        rows = await asyncio.to_thread(
            self._store.list_conversations, query=request.query, limit=request.limit, offset=request.offset,
            archived=request.archived if request.HasField("archived") else None,
        )  # fmt: skip
        return pb.ListConversationsResponse(conversations=[summary_message(row) for row in rows])

    async def NameConversation(self, request: pb.NameConversationRequest, context) -> pb.NameConversationResponse:  # noqa: N802
        source = await self._checked(context, _summary_row, request.source)
        if request.tokens < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tokens must not be negative")
        applied = await self._write(
            context, lambda: self._store.conversations.name(
                source, title=request.title, subtitle=request.subtitle, tags=list(request.tags),
                manual=request.manual, tokens=request.tokens,
            ),
        )  # fmt: skip
        return pb.NameConversationResponse(applied=applied)

    async def SetConversationArchived(self, request: pb.SetConversationArchivedRequest, context):  # noqa: N802
        conversation_id = await self._checked(context, valid_id, request.conversation_id)
        row = await self._write(context, self._store.conversations.set_archived, conversation_id, request.archived)
        return summary_message(row)

    async def DeleteConversation(self, request: pb.DeleteConversationRequest, context):  # noqa: N802
        conversation_id = await self._checked(context, valid_id, request.conversation_id)
        result = await self._write(context, self._store.delete_conversation, conversation_id, request.revision)
        return pb.DeleteConversationResponse(runs=result.runs, messages=result.messages)

    @staticmethod
    async def _checked(context, check, value):
        try:
            return check(value)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))

    @staticmethod
    async def _write(context, operation, *args):
        """Run a store operation in a worker thread (it waits for DuckDB), its errors as status codes."""
        try:
            return await asyncio.to_thread(operation, *args)
        except Conflict as error:
            await context.abort(grpc.StatusCode.ABORTED, str(error))
        except LookupError as error:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
        except Malformed as error:  # a message neither sent nor stored is NOT_FOUND: the client sends them all then
            status = grpc.StatusCode.NOT_FOUND if error.code == "unknown_message" else grpc.StatusCode.INVALID_ARGUMENT
            await context.abort(status, f"{error.code}: {error}")
        except StoreUnavailable as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{error}; nothing was written, retry later")
        except NotStored as error:
            await context.abort(grpc.StatusCode.INTERNAL, str(error))
