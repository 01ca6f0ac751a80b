"""ConversationStore against pydantic-ai-harness 0.62.0's SqliteConversationStore: one scenario, written against the
harness's API with the harness's own ConversationSummary, driven through both stores; what each answers must agree.

This is the promise of issue 20: code written against `SqliteConversationStore` works by changing the constructor.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai_harness.step_persistence.conversations import ConversationConflict as HarnessConflict
from pydantic_ai_harness.step_persistence.conversations import ConversationSummary as HarnessSummary
from pydantic_ai_harness.step_persistence.conversations import SqliteConversationStore
from steprec.query import ConversationConflict, ConversationStore
from steprec.recorder.daemon.process import RecorderProcess

_FIELDS = ("id", "workspace", "revision", "title", "subtitle", "tags", "title_source", "naming_version",
           "named_revision", "model", "outcome", "message_count", "total_tokens", "naming_tokens")  # fmt: skip


def _turn(prompt: str, answer: str) -> list:
    return [ModelRequest(parts=[UserPromptPart(prompt)]), ModelResponse(parts=[TextPart(answer)])]


async def _scenario(store) -> list:
    """What an application does with a conversation store; the trace of what the store answered."""
    trace: list = []

    def note(summary) -> None:
        trace.append(tuple(getattr(summary, name) for name in _FIELDS) + (summary.archived_at is not None,))

    history = _turn("Wie weit ist die Straße?", "zwei Kilometer")
    first = await store.save(summary=HarnessSummary(id="conv-a", workspace="/src/app", model="test"), messages=history)
    note(first)
    history = history + _turn("und zurück?", "auch zwei")
    second = await store.save(summary=first, messages=history)
    note(second)
    for stale in (first, replace(first, revision=0)):
        try:
            await store.save(summary=stale, messages=history)
            trace.append("saved")
        except (ConversationConflict, HarnessConflict):
            trace.append("conflict")
    loaded = await store.get(conversation_id="conv-a")
    note(loaded.summary)
    trace.append(ModelMessagesTypeAdapter.dump_json(loaded.messages) == ModelMessagesTypeAdapter.dump_json(history))
    trace.append(await store.name(source=second, title="Route", tokens=4))
    trace.append(await store.name(source=second, title="Stale", tokens=2))
    named = (await store.get(conversation_id="conv-a")).summary
    note(named)
    trace.append(await store.name(source=named, title="Mine", manual=True))
    mine = (await store.get(conversation_id="conv-a")).summary
    trace.append(await store.name(source=mine, title="Generated"))
    note(await store.set_archived(conversation_id="conv-a", archived=True))
    other = await store.save(summary=HarnessSummary(id="conv-b", workspace="/w", tags=("Billing",)),
                             messages=_turn("hello", "world"))  # fmt: skip
    for query, archived in (("", None), ("", False), ("", True), ("STRASSE", None), ("billing", None), ("nix", None)):
        trace.append([s.id for s in await store.listing(query=query, archived=archived)])
    resaved = await store.save(summary=(await store.get(conversation_id="conv-a")).summary, messages=history)
    note(resaved)
    try:
        await store.delete(source=mine)
        trace.append("deleted")
    except (ConversationConflict, HarnessConflict):
        trace.append("conflict")
    await store.delete(source=resaved)
    try:
        await store.get(conversation_id="conv-a")
    except LookupError:
        trace.append("gone")
    try:
        await store.save(summary=resaved, messages=history)
    except (ConversationConflict, HarnessConflict):
        trace.append("conflict")
    trace.append(await store.name(source=resaved, title="Back?"))
    trace.append([s.id for s in await store.listing()] == [other.id])
    return trace


async def test_the_same_calls_get_the_same_answers_as_from_sqlite_conversation_store(
    recorder: RecorderProcess, tmp_path: Path
) -> None:
    expected = await _scenario(SqliteConversationStore(database=tmp_path / "conversations.sqlite"))
    async with ConversationStore(recorder.endpoint) as store:
        assert await _scenario(store) == expected
