"""Conversation heads on a real recorder (issue 20): each rule of pydantic-ai-harness's SqliteConversationStore, kept
by `ConversationStore` over gRPC, and what steprec adds (shared messages, busy across processes and hosts)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import duckdb
import grpc
import pytest
from pydantic_ai import BinaryContent
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage
from steprec.proto.conversations.v1 import conversations_pb2 as pb
from steprec.proto.query.v1 import query_pb2
from steprec.query import (
    ConversationConflict,
    ConversationStore,
    ConversationSummary,
    GitCheckout,
    RecorderClient,
    continue_run,
)
from steprec.recorder.daemon.process import RecorderProcess

from .agents import echo_agent

STEPREC = str(Path(sys.executable).with_name("steprec"))


def turn(prompt: str, answer: str) -> list:
    return [ModelRequest(parts=[UserPromptPart(prompt)]), ModelResponse(parts=[TextPart(answer)])]


async def message_count(client: RecorderClient) -> int:
    return (await client.sql("SELECT count(*) AS n FROM messages")).column("n")[0].as_py()


@pytest.fixture
async def store(recorder: RecorderProcess):
    async with ConversationStore(recorder.endpoint) as conversations:
        yield conversations


async def test_save_commits_the_current_revision_and_refuses_a_stale_writer(store: ConversationStore) -> None:
    first = await store.save(summary=ConversationSummary(workspace="/w"), messages=turn("hi", "hello"))
    assert (first.revision, first.message_count) == (1, 2)
    second = await store.save(summary=first, messages=turn("hi", "hello") + turn("more", "sure"))
    assert second.revision == 2 and second.updated_at >= first.updated_at
    with pytest.raises(ConversationConflict):
        await store.save(summary=first, messages=turn("stale", "writer"))  # another writer moved it on
    with pytest.raises(ConversationConflict):
        await store.save(summary=replace(first, revision=0), messages=[])  # "new", but it exists
    assert (await store.get(conversation_id=first.id)).summary == second


async def test_a_save_to_a_deleted_conversation_is_a_conflict(store: ConversationStore) -> None:
    saved = await store.save(summary=ConversationSummary(workspace="/w"), messages=turn("a", "b"))
    await store.delete(source=saved)
    with pytest.raises(ConversationConflict):
        await store.save(summary=saved, messages=turn("a", "b"))
    with pytest.raises(LookupError):
        await store.get(conversation_id=saved.id)


async def test_get_restores_messages_byte_identical_media_included(store: ConversationStore) -> None:
    image = os.urandom(300_000)  # past the recorder's media threshold: a blob, restored on read
    messages = [
        ModelRequest(parts=[UserPromptPart(["look at this", BinaryContent(data=image, media_type="image/png")])]),
        ModelResponse(parts=[ThinkingPart("hmm"), TextPart("a picture")], usage=RequestUsage(input_tokens=7,
                                                                                              output_tokens=5)),
    ]  # fmt: skip
    checkout = GitCheckout(repository="/src/app/.git", name="app", root="/src/app", branch="main")
    saved = await store.save(summary=ConversationSummary(workspace="/src/app", checkout=checkout, model="test:m"),
                             messages=messages)  # fmt: skip
    assert saved.total_tokens == 12 and saved.checkout == checkout
    fresh = ConversationStore(store._client.endpoint)  # nothing cached: every message from the recorder
    loaded = await fresh.get(conversation_id=saved.id)
    await fresh.close()
    assert ModelMessagesTypeAdapter.dump_json(loaded.messages) == ModelMessagesTypeAdapter.dump_json(messages)
    assert loaded.messages[0].parts[0].content[1].data == image
    assert loaded.summary == saved


async def test_get_of_an_unknown_id_is_a_lookup_error_and_bad_ids_are_refused(store: ConversationStore) -> None:
    with pytest.raises(LookupError):
        await store.get(conversation_id="never-saved")
    with pytest.raises(ValueError, match="printable"):
        await store.get(conversation_id="bad\x00id")
    with pytest.raises(ValueError, match="schema_version"):
        await store.save(summary=replace(ConversationSummary(workspace="/w"), schema_version=2), messages=[])
    with pytest.raises(ValueError, match="title_source"):
        await store.save(summary=replace(ConversationSummary(workspace="/w"), title_source="robot"), messages=[])


async def test_an_unknown_metadata_schema_version_is_rejected_on_read(tmp_path) -> None:
    recorder = RecorderProcess(tmp_path / "recorder").start()
    try:
        async with ConversationStore(recorder.endpoint) as store:
            saved = await store.save(summary=ConversationSummary(workspace="/w"), messages=turn("a", "b"))
    finally:
        recorder.stop()
    with duckdb.connect(
        str(tmp_path / "recorder" / "steprec.duckdb")
    ) as connection:  # as a later steprec might have written it
        connection.execute("UPDATE conversations SET schema_version = 2")
    recorder = RecorderProcess(tmp_path / "recorder").start()
    try:
        async with ConversationStore(recorder.endpoint) as store:
            with pytest.raises(ValueError, match="schema version 2"):
                await store.get(conversation_id=saved.id)
            with pytest.raises(ValueError, match="schema version 2"):
                await store.listing()
    finally:
        recorder.stop()


async def test_listing_pages_searches_case_folded_and_leaves_archived_out(store: ConversationStore) -> None:
    multimodal = [ModelRequest(parts=[UserPromptPart(["ein Bild", BinaryContent(data=b"x", media_type="image/png"),
                                                      "die Straße hinunter"])])]  # fmt: skip
    tooly = [
        ModelRequest(parts=[UserPromptPart("plain question")]),
        ModelResponse(parts=[ToolCallPart("lookup", {"q": "x"}, tool_call_id="c1"), ThinkingPart("secretthought")]),
        ModelRequest(parts=[ToolReturnPart("lookup", "toolsecret", tool_call_id="c1")]),
        ModelResponse(parts=[TextPart("an answer")]),
    ]
    a = await store.save(summary=ConversationSummary(workspace="/w", title="Route"), messages=multimodal)
    b = await store.save(summary=ConversationSummary(workspace="/w", tags=("Billing",)), messages=tooly)
    c = await store.save(summary=ConversationSummary(workspace="/elsewhere"), messages=turn("hello", "world"))
    assert [s.id for s in await store.listing()] == [c.id, b.id, a.id]  # most recently active first
    assert [s.id for s in await store.listing(limit=1, offset=1)] == [b.id]
    assert [s.id for s in await store.listing(query="STRASSE")] == [a.id]  # Unicode case folding
    assert [s.id for s in await store.listing(query="route")] == [a.id]  # the title
    assert [s.id for s in await store.listing(query="billing")] == [b.id]  # a tag
    assert [s.id for s in await store.listing(query="elsewhere")] == [c.id]  # metadata
    assert [s.id for s in await store.listing(query="AN ANSWER")] == [b.id]  # assistant text
    assert await store.listing(query="toolsecret") == []  # tool output is not searched
    assert await store.listing(query="secretthought") == []  # nor reasoning
    await store.set_archived(conversation_id=b.id, archived=True)
    assert [s.id for s in await store.listing(archived=False)] == [c.id, a.id]
    assert [s.id for s in await store.listing(archived=True)] == [b.id]
    assert len(await store.listing()) == 3
    with pytest.raises(ValueError):
        await store.listing(limit=0)
    with pytest.raises(ValueError):
        await store.listing(offset=-1)


async def test_discarded_pre_compaction_history_is_not_searched(store: ConversationStore) -> None:
    saved = await store.save(summary=ConversationSummary(workspace="/w"), messages=turn("oldword", "oldanswer"))
    compacted = [ModelRequest(parts=[UserPromptPart("summary of before")]), *turn("next", "reply")]
    await store.save(summary=saved, messages=compacted)
    assert await store.listing(query="oldword") == []
    assert len(await store.listing(query="summary of before")) == 1


async def test_naming_never_overwrites_newer_content_a_newer_name_or_the_users_title(store: ConversationStore) -> None:
    saved = await store.save(summary=ConversationSummary(workspace="/w"), messages=turn("a", "b"))
    assert await store.name(source=saved, title="Generated", tokens=10)
    named = (await store.get(conversation_id=saved.id)).summary
    assert (named.title, named.title_source, named.naming_version, named.named_revision) == ("Generated", "generated",
                                                                                            1, 1)  # fmt: skip
    assert named.updated_at == saved.updated_at  # naming is not activity
    assert not await store.name(source=saved, title="Older naming", tokens=3)  # a newer name landed since
    newer = await store.save(summary=named, messages=turn("a", "b") + turn("c", "d"))
    assert newer.title == "Generated"  # a content save keeps the name
    assert not await store.name(source=named, title="For old content")  # a newer content revision
    assert await store.name(source=newer, title="Mine", manual=True)
    mine = (await store.get(conversation_id=saved.id)).summary
    assert not await store.name(source=mine, title="Generated again")  # the user's title stays
    final = (await store.get(conversation_id=saved.id)).summary
    assert (final.title, final.title_source, final.naming_tokens) == ("Mine", "user", 13)  # stale tokens count
    assert not await store.name(source=replace(saved, id="deleted-or-never"), title="x")  # never resurrects


async def test_an_archived_flag_survives_naming_and_a_content_save_clears_it(store: ConversationStore) -> None:
    saved = await store.save(summary=ConversationSummary(workspace="/w"), messages=turn("a", "b"))
    archived = await store.set_archived(conversation_id=saved.id, archived=True)
    assert archived.archived_at is not None and archived.revision == saved.revision
    again = await store.set_archived(conversation_id=saved.id, archived=True)
    assert again.archived_at == archived.archived_at  # the first time stays
    assert await store.name(source=archived, title="Named")
    assert (await store.get(conversation_id=saved.id)).summary.archived_at == archived.archived_at
    resaved = await store.save(summary=(await store.get(conversation_id=saved.id)).summary, messages=turn("a", "c"))
    assert resaved.archived_at is None and resaved.title == "Named"
    unarchived = await store.set_archived(conversation_id=saved.id, archived=False)
    assert unarchived.archived_at is None
    with pytest.raises(LookupError):
        await store.set_archived(conversation_id="never-saved", archived=True)


async def test_delete_checks_the_revision_removes_the_runs_and_keeps_shared_messages(
    recorder: RecorderProcess, store: ConversationStore, client: RecorderClient
) -> None:
    agent = echo_agent(recorder.endpoint, calls=1)
    gone = await agent.run("shared prompt", conversation_id="conv-delete")
    kept = await agent.run("shared prompt", conversation_id="conv-keep")  # the same first messages
    saved = await store.save(
        summary=ConversationSummary(id="conv-delete", workspace="/w"), messages=gone.all_messages()
    )
    other = await store.save(summary=ConversationSummary(workspace="/w"), messages=gone.all_messages()[:1])
    newer = await store.save(summary=saved, messages=gone.all_messages())
    with pytest.raises(ConversationConflict):
        await store.delete(source=saved)  # a revision behind
    assert await client.list_runs(conversation_id="conv-delete")
    await store.delete(source=newer)
    assert await client.list_runs(conversation_id="conv-delete") == []
    with pytest.raises(ConversationConflict):
        await store.delete(source=newer)  # already gone
    kept_run = (await client.list_runs(conversation_id="conv-keep"))[0]
    assert await continue_run(client, run_id=kept_run.run_id) == kept.all_messages()
    fresh = ConversationStore(recorder.endpoint)
    assert (await fresh.get(conversation_id=other.id)).messages == gone.all_messages()[:1]
    await fresh.close()


async def test_a_head_whose_messages_a_run_recorded_adds_no_message_rows(
    recorder: RecorderProcess, store: ConversationStore
) -> None:
    result = await echo_agent(recorder.endpoint, calls=3).run("go", conversation_id="conv-shared")
    before = await message_count(store._client)
    other = ConversationStore(recorder.endpoint)  # knows nothing: sends every body, the recorder keeps none
    await other.save(summary=ConversationSummary(id="conv-shared", workspace="/w"), messages=result.all_messages())
    await other.close()
    assert await message_count(store._client) == before


async def test_a_conversation_busy_in_a_live_process_is_refused_and_free_once_it_died(
    store: ConversationStore,
) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        saved = await store.save(summary=ConversationSummary(workspace="/w", outcome="running", owner_pid=owner.pid),
                                 messages=turn("a", "b"))  # fmt: skip
        assert saved.owner_host == socket.gethostname()
        with pytest.raises(ConversationConflict, match="busy"):
            await store.delete(source=saved)
        another_process = subprocess.run(
            [sys.executable, "-c", _DELETE_FROM_ANOTHER_PROCESS, store._client.endpoint, saved.id],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert another_process.stdout.strip() == "busy", another_process.stderr
    finally:
        owner.kill()
        owner.wait()
    await store.delete(source=saved)


_DELETE_FROM_ANOTHER_PROCESS = """
import asyncio, sys
from steprec.query import ConversationConflict, ConversationStore
store = ConversationStore(sys.argv[1])  # at module level, as the reference's examples make stores
async def main():
    summary = (await store.get(conversation_id=sys.argv[2])).summary
    try:
        await store.delete(source=summary)
    except ConversationConflict:
        print("busy")
asyncio.run(main())
"""


async def test_busy_on_another_host_is_decided_by_the_recorded_run(
    recorder: RecorderProcess, store: ConversationStore
) -> None:
    result = await echo_agent(recorder.endpoint, calls=1).run("go", conversation_id="conv-remote")
    run_id = (await store._client.list_runs(conversation_id="conv-remote"))[0].run_id
    remote = ConversationSummary(workspace="/w", outcome="running", owner_pid=1, owner_host="another-host")
    unknown_run = await store.save(summary=remote, messages=result.all_messages())
    with pytest.raises(ConversationConflict, match="another-host"):
        await store.delete(source=unknown_run)  # no run recorded: the recorder cannot tell it ended
    ended = await store.save(summary=replace(unknown_run, run_id=run_id), messages=result.all_messages())
    await store.delete(source=ended)  # its run has ended on the recorder


async def test_heads_survive_a_recorder_restart(tmp_path) -> None:
    recorder = RecorderProcess(tmp_path / "recorder").start()
    messages = turn("keep", "me")
    try:
        async with ConversationStore(recorder.endpoint) as store:
            saved = await store.save(summary=ConversationSummary(workspace="/w"), messages=messages)
    finally:
        recorder.stop()
    recorder = RecorderProcess(tmp_path / "recorder").start()
    try:
        async with ConversationStore(recorder.endpoint) as store:
            assert (await store.get(conversation_id=saved.id)).messages == messages
            assert await store.save(summary=saved, messages=messages)  # the revision is still current
    finally:
        recorder.stop()


def test_a_store_made_before_any_loop_serves_several_asyncio_runs(recorder: RecorderProcess) -> None:
    store = ConversationStore(recorder.endpoint)  # module level, as in the reference's examples
    saved = asyncio.run(store.save(summary=ConversationSummary(workspace="/w"), messages=turn("a", "b")))
    loaded = asyncio.run(store.get(conversation_id=saved.id))
    assert loaded.summary == saved
    asyncio.run(store.close())


async def test_a_store_shares_a_client_it_is_given_and_leaves_it_open(client: RecorderClient) -> None:
    store = ConversationStore(client)
    saved = await store.save(summary=ConversationSummary(workspace="/w"), messages=turn("a", "b"))
    await store.close()
    assert (await ConversationStore(client).get(conversation_id=saved.id)).summary == saved
    assert await client.list_runs() == []


CONVERSATIONS = "/steprec.conversations.v1.RecorderConversations/"


def _call(channel: grpc.Channel, method: str, payload: bytes | list[bytes]):
    """Raw bytes to a conversation method, the way its shape sends them; the gRPC status code, or OK."""
    try:
        if method == "SaveConversation":
            channel.stream_unary(CONVERSATIONS + method)(iter(payload), timeout=10)
        elif method == "GetConversation":
            list(channel.unary_stream(CONVERSATIONS + method)(payload, timeout=10))
        else:
            channel.unary_unary(CONVERSATIONS + method)(payload, timeout=10)
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def test_hostile_requests_are_refused_clearly_and_the_recorder_keeps_serving(recorder: RecorderProcess) -> None:
    good = pb.ConversationSummary(schema_version=1, id="hostile", workspace="/w", title_source="fallback",
                                  outcome="ready")  # fmt: skip
    body = b'{"parts":[{"content":"x","part_kind":"user-prompt"}],"kind":"request"}'
    digest = hashlib.sha256(body).digest()

    def save(*requests: pb.SaveConversationRequest) -> list[bytes]:
        return [request.SerializeToString() for request in requests]

    with grpc.insecure_channel(recorder.endpoint) as channel:
        for method in ("GetConversation", "ListConversations", "NameConversation", "SetConversationArchived",
                       "DeleteConversation"):  # fmt: skip
            assert _call(channel, method, b"\xff\xff\xff")[0] == grpc.StatusCode.INVALID_ARGUMENT, method
        assert _call(channel, "SaveConversation", [b"\xff\xff\xff"])[0] == grpc.StatusCode.INVALID_ARGUMENT
        refused = {
            "no summary": save(pb.SaveConversationRequest(message_digests=digest)),
            "two summaries": save(pb.SaveConversationRequest(summary=good), pb.SaveConversationRequest(summary=good)),
            "a torn digest": save(pb.SaveConversationRequest(summary=good, message_digests=digest[:31])),
            "not JSON": save(pb.SaveConversationRequest(summary=good, message_digests=hashlib.sha256(b"{").digest(),
                                                        messages=query_pb2.SnapshotChunk(messages_json=[b"{"]))),
            "a piece never ended": save(pb.SaveConversationRequest(
                summary=good, messages=query_pb2.SnapshotChunk(message_piece=b"{"))),
            "a control character in the id": save(pb.SaveConversationRequest(
                summary=pb.ConversationSummary(schema_version=1, id="a\nb", title_source="user", outcome="ready"))),
            "a negative revision": save(pb.SaveConversationRequest(
                summary=pb.ConversationSummary(schema_version=1, id="x", title_source="user", outcome="ready",
                                               revision=-1))),
        }  # fmt: skip
        for what, requests in refused.items():
            code, details = _call(channel, "SaveConversation", requests)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details, what
        unknown = _call(
            channel, "SaveConversation", save(pb.SaveConversationRequest(summary=good, message_digests=digest))
        )
        assert unknown[0] == grpc.StatusCode.NOT_FOUND and "unknown_message" in unknown[1]  # the client resends
        for limit in (0, 10_001):
            request = pb.ListConversationsRequest(limit=limit).SerializeToString()
            assert _call(channel, "ListConversations", request)[0] == grpc.StatusCode.INVALID_ARGUMENT
        ok = save(pb.SaveConversationRequest(summary=good, message_digests=digest,
                                             messages=query_pb2.SnapshotChunk(messages_json=[body])))  # fmt: skip
        assert _call(channel, "SaveConversation", ok)[0] == grpc.StatusCode.OK  # still serving, nothing lost
    assert recorder.process.poll() is None


async def test_a_recorder_with_a_token_refuses_conversation_calls_without_it(tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    recorder = RecorderProcess(tmp_path / "recorder", extra_args=("--token-file", str(token_file))).start()
    try:
        async with ConversationStore(recorder.endpoint) as anonymous:
            with pytest.raises(PermissionError):
                await anonymous.save(summary=ConversationSummary(workspace="/w"), messages=turn("a", "b"))
            with pytest.raises(PermissionError):
                await anonymous.listing()
        async with ConversationStore(recorder.endpoint, token="s3cret-token") as allowed:
            saved = await allowed.save(summary=ConversationSummary(workspace="/w"), messages=turn("a", "b"))
            assert [s.id for s in await allowed.listing()] == [saved.id]
    finally:
        recorder.stop()


async def test_cli_lists_searches_and_shows_heads_and_sql_has_the_view(
    recorder: RecorderProcess, store: ConversationStore, client: RecorderClient
) -> None:
    result = await echo_agent(recorder.endpoint, calls=1).run("Wie weit ist die Straße?", conversation_id="conv-cli")
    saved = await store.save(summary=ConversationSummary(id="conv-cli", workspace="/w", title="Route"),
                             messages=result.all_messages())  # fmt: skip
    other = await store.save(summary=ConversationSummary(workspace="/w", title="Old"), messages=turn("a", "b"))
    await store.set_archived(conversation_id=other.id, archived=True)
    endpoint = ("--endpoint", recorder.endpoint)

    def steprec(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([STEPREC, *args, *endpoint], capture_output=True, text=True, timeout=60)

    listed = steprec("conversations", "--json")
    assert [s["id"] for s in json.loads(listed.stdout)] == ["conv-cli"], listed.stderr
    assert [s["id"] for s in json.loads(steprec("conversations", "--archived", "--json").stdout)] == [other.id]
    assert len(json.loads(steprec("conversations", "--all", "--json").stdout)) == 2
    assert [s["id"] for s in json.loads(steprec("conversations", "--search", "STRASSE", "--json").stdout)] == [
        "conv-cli"
    ]
    table = steprec("conversations", "--search", "route")
    assert table.returncode == 0 and "conv-cli" in table.stdout
    shown = json.loads(steprec("conversation", "conv-cli", "--json").stdout)
    assert shown["summary"]["revision"] == saved.revision
    assert ModelMessagesTypeAdapter.validate_python(shown["messages"]) == result.all_messages()
    human = steprec("conversation", "conv-cli")
    assert human.returncode == 0 and "Route" in human.stdout
    missing = steprec("conversation", "nobody")
    assert missing.returncode == 3 and "nobody" in missing.stderr
    assert steprec("conversations", "--limit", "0").returncode == 2
    view = await client.sql("SELECT conversation_id, title, archived_at IS NOT NULL AS archived, message_count"
                            " FROM conversations ORDER BY conversation_id")  # fmt: skip
    assert view.to_pylist() == sorted([
        {"conversation_id": "conv-cli", "title": "Route", "archived": False, "message_count": saved.message_count},
        {"conversation_id": other.id, "title": "Old", "archived": True, "message_count": 2},
    ], key=lambda row: row["conversation_id"])  # fmt: skip
