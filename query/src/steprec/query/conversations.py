"""ConversationStore: conversation heads kept by the recorder, with pydantic-ai-harness's `SqliteConversationStore` API.

A multi-turn application keeps the authoritative head of each conversation (accepted prompts, and
edits between runs such as compaction) apart from its runs' snapshots. Each method is one call to the
recorder's RecorderConversations service; the rules it keeps are in docs/conversations.md. A head's
messages are the recorder's content-addressed messages: this store sends only those it does not know
the recorder holds (it saved or read them itself), and the recorder stores only those it lacks.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessage, ModelResponse
from steprec.proto.conversations.v1 import conversations_pb2 as pb
from steprec.proto.message_chunks import message_chunks
from steprec.proto.query.v1 import query_pb2
from steprec.proto.wire import split_digests

from .client import RecorderClient
from .closing import AsyncClosing
from .conversation_types import (
    ConversationConflict,
    ConversationSummary,
    GitCheckout,
    SavedConversation,
    conversation_text,
)
from .types import from_unix_nano, to_unix_nano

_MESSAGE = TypeAdapter(ModelMessage)
"""The exporter's serialisation (exporter/_snapshots.py): a head's message a run recorded has the same digest."""
KNOWN_DIGESTS = 1 << 20
"""Digests of messages this store knows the recorder holds, at most (32 MiB of them)."""
_DIGESTS_PER_REQUEST = 1 << 15
_OPTIONAL = ("model", "run_id", "owner_pid", "owner_host")


def _summary_message(summary: Any, *, message_count: int = 0, total_tokens: int = 0) -> pb.ConversationSummary:
    """Any object with a ConversationSummary's fields (this one, or pydantic-ai-harness's) as the wire's summary."""
    message = pb.ConversationSummary(
        schema_version=summary.schema_version, id=summary.id, workspace=summary.workspace,
        updated_at_unix_nano=to_unix_nano(summary.updated_at), message_count=message_count, total_tokens=total_tokens,
        **{name: getattr(summary, name) for name in ("revision", "title", "subtitle", "tags", "title_source",
                                                      "naming_version", "named_revision", "outcome", "naming_tokens")},
    )  # fmt: skip
    for name in _OPTIONAL:
        if (value := getattr(summary, name, None)) is not None:
            setattr(message, name, value)
    if summary.archived_at is not None:
        message.archived_at_unix_nano = to_unix_nano(summary.archived_at)
    if (checkout := summary.checkout) is not None:
        message.checkout.CopyFrom(pb.GitCheckout(repository=checkout.repository, name=checkout.name,
                                                 root=checkout.root, branch=checkout.branch))  # fmt: skip
    return message


def _summary(message: pb.ConversationSummary) -> ConversationSummary:
    """The recorder's summary, refused unless it is of the one metadata schema version this client knows."""
    if message.schema_version != 1:
        raise ValueError(f"conversation {message.id!r} has metadata schema version {message.schema_version};"
                         " this steprec knows version 1 only")  # fmt: skip
    checkout = message.checkout if message.HasField("checkout") else None
    return ConversationSummary(
        id=message.id, workspace=message.workspace, updated_at=from_unix_nano(message.updated_at_unix_nano),
        checkout=GitCheckout(repository=checkout.repository, name=checkout.name, root=checkout.root,
                             branch=checkout.branch) if checkout else None,
        tags=tuple(message.tags),
        archived_at=(
            from_unix_nano(message.archived_at_unix_nano) if message.HasField("archived_at_unix_nano") else None
        ),
        **{name: getattr(message, name) for name in ("revision", "title", "subtitle", "title_source", "naming_version",
                                                      "named_revision", "outcome", "message_count", "total_tokens",
                                                      "naming_tokens")},
        **{name: getattr(message, name) if message.HasField(name) else None for name in _OPTIONAL},
    )  # fmt: skip


class ConversationStore(AsyncClosing):
    """Conversation heads on a recorder: `ConversationStore(endpoint or client)`, then `save`, `get`, `listing`,
    `name`, `set_archived` and `delete`, as pydantic-ai-harness's `SqliteConversationStore` has them.

    Given an endpoint (or nothing: `STEPREC_ENDPOINT`, else 127.0.0.1:4317) it makes its own
    `RecorderClient` with `options` and closes it in `close`; given a client it shares that client's
    channels and history cache and leaves it open. Like the client, it may be created anywhere and
    used in any number of event loops (channels.py).
    """

    def __init__(self, endpoint: str | RecorderClient | None = None, **options: Any) -> None:
        self._owns_client = not isinstance(endpoint, RecorderClient)
        self._client = RecorderClient(endpoint, **options) if self._owns_client else endpoint
        self._known: OrderedDict[bytes, None] = OrderedDict()

    async def close(self) -> None:
        """Close the client this store made (a client it was given stays open)."""
        if self._owns_client:
            await self._client.close()

    async def save(self, *, summary: ConversationSummary, messages: Sequence[ModelMessage]) -> ConversationSummary:
        """Commit content only if `summary.revision` is still the stored one; return the committed summary.

        Raises ConversationConflict when another writer saved since (a stale revision) or the
        conversation was deleted. `owner_host` is filled in with this host when `owner_pid` is set.
        """
        if summary.owner_pid is not None and getattr(summary, "owner_host", None) is None:
            summary = replace(_as_own(summary), owner_host=socket.gethostname())
        texts = [_MESSAGE.dump_json(message) for message in messages]
        digests = [hashlib.sha256(text).digest() for text in texts]
        head = _summary_message(
            summary, message_count=len(messages),
            total_tokens=sum(m.usage.total_tokens for m in messages if isinstance(m, ModelResponse)),
        )  # fmt: skip
        search_text = conversation_text(messages)
        unknown = [text for digest, text in zip(digests, texts, strict=True) if digest not in self._known]
        try:
            saved = await self._save(head, digests, unknown, search_text)
        except LookupError:  # a message this store took for held was pruned since: send them all
            saved = await self._save(head, digests, texts, search_text)
        self._remember(digests)
        return _summary(saved)

    async def _save(
        self, head: pb.ConversationSummary, digests: list[bytes], texts: list[bytes], search_text: str
    ) -> pb.ConversationSummary:
        joined = b"".join(digests)

        def requests() -> Iterator[pb.SaveConversationRequest]:
            step = _DIGESTS_PER_REQUEST * 32
            yield pb.SaveConversationRequest(summary=head, message_digests=joined[:step], search_text=search_text)
            for start in range(step, len(joined), step):
                yield pb.SaveConversationRequest(message_digests=joined[start : start + step])
            for chunk in message_chunks(query_pb2.SnapshotChunk(), texts):
                if chunk.ListFields():
                    yield pb.SaveConversationRequest(messages=chunk)

        return await self._client._call(self._client._conversations.SaveConversation, requests())

    async def get(self, *, conversation_id: str) -> SavedConversation:
        """The head's summary and messages, restored byte-identical (media included).

        Raises LookupError for an unknown id, ValueError for metadata of a schema version this client does not know.
        """
        summary, digests = None, bytearray()
        request = pb.GetConversationRequest(conversation_id=conversation_id)
        async for answer in self._client._stream(self._client._conversations.GetConversation, request):
            if answer.HasField("summary"):
                summary = answer.summary
            digests += answer.message_digests
        if summary is None:
            raise LookupError(f"no saved conversation {conversation_id!r}")
        checked = _summary(summary)
        messages = await self._client._histories.history(bytes(digests), self._client._read_messages) if digests else []
        self._remember(split_digests(bytes(digests)))
        return SavedConversation(summary=checked, messages=messages)

    async def listing(
        self, *, query: str = "", limit: int = 200, offset: int = 0, archived: bool | None = None
    ) -> list[ConversationSummary]:
        """Summaries, most recently active first, without their messages. `query` matches, Unicode case-folded,
        the saved user and assistant text, the title, subtitle and tags, and the other metadata.

        `archived=False` leaves archived conversations out, `True` lists only those, and `None` lists both.
        """
        if limit < 1 or offset < 0:
            raise ValueError("limit must be positive and offset nonnegative")
        request = pb.ListConversationsRequest(query=query, limit=limit, offset=offset)
        if archived is not None:
            request.archived = archived
        answer = await self._client._call(self._client._conversations.ListConversations, request)
        return [_summary(summary) for summary in answer.conversations]

    async def name(
        self,
        *,
        source: ConversationSummary,
        title: str,
        subtitle: str = "",
        tags: tuple[str, ...] = (),
        manual: bool = False,
        tokens: int = 0,
    ) -> bool:
        """Apply a name only to the revision and naming version `source` has; never over a title the user set
        (unless `manual`), never to a deleted conversation. `tokens` count either way. True if applied."""
        request = pb.NameConversationRequest(source=_summary_message(source), title=title, subtitle=subtitle,
                                             tags=list(tags), manual=manual, tokens=tokens)  # fmt: skip
        return (await self._client._call(self._client._conversations.NameConversation, request)).applied

    async def set_archived(self, *, conversation_id: str, archived: bool) -> ConversationSummary:
        """Archive or unarchive, keeping the messages, revision and activity time; return the summary.

        Archiving one already archived keeps the first time. Raises LookupError for an unknown id.
        """
        request = pb.SetConversationArchivedRequest(conversation_id=conversation_id, archived=archived)
        return _summary(await self._client._call(self._client._conversations.SetConversationArchived, request))

    async def delete(self, *, source: ConversationSummary) -> None:
        """Delete the conversation at `source.revision` and its runs, in one transaction on the recorder.

        Raises ConversationConflict when another writer changed or deleted it meanwhile, or when its
        run is still busy (`ensure_inactive`). Messages and media other runs or heads use stay.
        """
        await ensure_inactive(source, self._client)
        request = pb.DeleteConversationRequest(conversation_id=source.id, revision=source.revision)
        await self._client._call(self._client._conversations.DeleteConversation, request)

    def _remember(self, digests: Iterable[bytes]) -> None:
        for digest in digests:
            self._known[digest] = None
            self._known.move_to_end(digest)
        while len(self._known) > KNOWN_DIGESTS:
            self._known.popitem(last=False)


def _as_own(summary: Any) -> ConversationSummary:
    """pydantic-ai-harness's summary (no `owner_host`) as steprec's, so `replace` can set it."""
    if isinstance(summary, ConversationSummary):
        return summary
    return _summary(_summary_message(summary, message_count=summary.message_count, total_tokens=summary.total_tokens))


async def ensure_inactive(summary: ConversationSummary, client: RecorderClient) -> None:
    """Refuse (ConversationConflict) a conversation whose run is still in progress in a live process.

    On the summary's own host (`owner_host`, or none recorded) that is a process-existence probe, as the
    reference makes it: PID reuse is taken as busy. On another host this process cannot probe, so the
    recorder's record of the run decides: busy until the run `run_id` has ended there (a run id not
    recorded, or none given, stays busy). docs/conversations.md says what that means across hosts.
    """
    if summary.outcome != "running" or summary.owner_pid is None:
        return
    host = getattr(summary, "owner_host", None)
    if host is None or host == socket.gethostname():
        try:
            os.kill(summary.owner_pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass  # it exists, as another user's process
        raise ConversationConflict(f"the conversation is busy in process {summary.owner_pid}")
    run = await client.get_run(summary.run_id) if summary.run_id else None
    if run is None or run.ended_at is None:
        raise ConversationConflict(
            f"the conversation is busy in process {summary.owner_pid} on {host}: its run"
            f" {summary.run_id or '(none recorded)'} has not ended"
        )
