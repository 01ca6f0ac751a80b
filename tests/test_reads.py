"""The reference's remaining reads: list_snapshots, a snapshot by index, get_tool_effect, inspect_recovery, sync."""

from __future__ import annotations

import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter
from steprec.query import RecorderClient, SyncRecorderClient, inspect_recovery
from steprec.recorder.daemon.process import RecorderProcess

from .agents import echo_agent


async def test_snapshots_can_be_listed_and_each_read_back(recorder: RecorderProcess, client: RecorderClient) -> None:
    result = await echo_agent(recorder.endpoint, calls=3).run("go", conversation_id="conv-list")
    summaries = await client.list_snapshots(result.run_id)
    assert [s.snapshot_index for s in summaries] == [0, 1, 2, 3]
    assert [s.message_count for s in summaries] == [3, 5, 7, 8]
    # Time travel: the second snapshot is the history after the first two tool cycles.
    second = await client.get_snapshot(result.run_id, 1)
    expected = result.all_messages()[:5]
    assert (
        ModelMessagesTypeAdapter.dump_json(second.messages)[:100] == ModelMessagesTypeAdapter.dump_json(expected)[:100]
    )
    assert len(second.messages) == 5 and second.step_index == summaries[1].step_index
    assert await client.get_snapshot(result.run_id, 99) is None


async def test_get_tool_effect_and_inspect_recovery(recorder: RecorderProcess, client: RecorderClient) -> None:
    result = await echo_agent(recorder.endpoint, calls=2).run("go", conversation_id="conv-inspect")
    effect = await client.get_tool_effect(result.run_id, "call-1")
    assert effect is not None and (effect.tool_name, effect.status) == ("echo", "completed")
    assert await client.get_tool_effect(result.run_id, "no-such-call") is None
    report = await inspect_recovery(client, run_id=result.run_id)
    assert report.newest_snapshot.snapshot_index == report.newest_complete_snapshot.snapshot_index == 2
    assert report.unresolved_effects == [] and report.completed_tools == ["echo", "echo"]
    assert report.failed_tools == []


async def test_the_sync_client_answers_inside_a_running_loop(recorder: RecorderProcess) -> None:
    result = await echo_agent(recorder.endpoint, calls=1).run("go", conversation_id="conv-sync")
    # A notebook has a loop running already; the sync client must not need asyncio.run.
    with SyncRecorderClient(recorder.endpoint) as client:
        (run,) = client.list_runs(conversation_id="conv-sync")
        assert run.run_id == result.run_id
        assert len(client.continue_run(run.run_id)) == len(result.all_messages())
        assert client.inspect_recovery(run.run_id).completed_tools == ["echo"]
        assert [r.run_id for r in client.iter_runs(conversation_id="conv-sync")] == [run.run_id]  # async generator
        descendants = client.descendants(run.run_id)
        assert descendants["run_id"].to_pylist() == [run.run_id] and descendants["outcome"].to_pylist() == ["completed"]
        assert descendants.schema.field("outcome").type == "string"  # sent as a dictionary, handed out as text
        with pytest.raises(LookupError):
            client.continue_run("never-recorded")


async def test_runs_filter_by_time_and_outcome_and_come_in_pages(recorder: RecorderProcess, client) -> None:
    from datetime import timedelta

    import grpc
    from steprec.proto.query.v1 import query_pb2, query_pb2_grpc

    agent = echo_agent(recorder.endpoint, calls=0)
    first = await agent.run("a", conversation_id="conv-page")
    await agent.run("b", conversation_id="conv-page")
    await agent.run("c", conversation_id="conv-page")
    runs = await client.list_runs(conversation_id="conv-page")
    assert len(runs) == 3 and runs[0].run_id == first.run_id
    assert [r.run_id async for r in client.iter_runs(conversation_id="conv-page", page_size=2)] == [
        r.run_id for r in runs
    ]
    later = await client.list_runs(conversation_id="conv-page", started_after=runs[1].started_at)
    assert [r.run_id for r in later] == [r.run_id for r in runs[1:]]
    earlier = await client.list_runs(conversation_id="conv-page", started_before=runs[1].started_at)
    assert [r.run_id for r in earlier] == [runs[0].run_id]
    assert await client.list_runs(conversation_id="conv-page", outcome="failed") == []
    assert len(await client.list_runs(conversation_id="conv-page", outcome="completed")) == 3
    assert await client.list_runs(started_after=runs[-1].started_at + timedelta(days=1)) == []
    with pytest.raises(ValueError, match="outcome"):
        await client.list_runs(outcome="exploded")
    async with grpc.aio.insecure_channel(recorder.endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await query_pb2_grpc.RecorderQueryStub(channel).ListRuns(query_pb2.ListRunsRequest(page_token="forged"))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_run_trees_and_ancestors(recorder: RecorderProcess, client) -> None:
    from pydantic_ai import Agent
    from steprec.exporter import StepRecorder

    from .agents import calls_tool_then_answers

    def recorded(model, name: str) -> Agent:
        return Agent(model, name=name, capabilities=[StepRecorder(endpoint=recorder.endpoint)])

    leaf = echo_agent(recorder.endpoint, calls=0)
    middle = recorded(calls_tool_then_answers(1, tool="call_leaf"), "middle")
    root = recorded(calls_tool_then_answers(2, tool="call_middle"), "root")

    @middle.tool_plain
    async def call_leaf(text: str) -> str:
        return (await leaf.run(text)).output

    @root.tool_plain
    async def call_middle(text: str) -> str:
        return (await middle.run(text)).output

    result = await root.run("go", conversation_id="conv-tree")
    tree = await client.run_tree(result.run_id)
    shape = [(depth, run.agent_name) for depth, run in tree.walk()]
    assert shape == [(0, "root"), (1, "middle"), (2, "echoer"), (1, "middle"), (2, "echoer")]
    leaf_run = tree.children[1].children[0].run
    assert [r.agent_name for r in await client.ancestors(leaf_run.run_id)] == ["middle", "root"]
    assert await client.ancestors(result.run_id) == []
    assert await client.run_tree("never-recorded") is None


async def test_a_fork_from_an_earlier_snapshot_is_recorded_with_its_origin(recorder: RecorderProcess, client) -> None:
    from steprec.query import fork_run

    agent = echo_agent(recorder.endpoint, calls=3)
    origin = await agent.run("go", conversation_id="conv-origin")
    fork = await fork_run(client, run_id=origin.run_id, at=1)
    assert (fork.origin_run_id, fork.origin_snapshot_index, len(fork)) == (origin.run_id, 1, 5)
    forked = await agent.run(message_history=fork, metadata=fork.metadata, conversation_id="conv-fork")
    # The new run starts from the fork's history (pydantic-ai stamps its last, pending request).
    assert forked.all_messages()[:4] == list(fork)[:4] and forked.all_messages()[4].parts == fork[4].parts

    (recorded,) = await client.list_runs(forked_from_run_id=origin.run_id)
    assert recorded.run_id == forked.run_id and recorded.forked_from_snapshot_index == 1
    tree = await client.run_tree(origin.run_id)
    assert [child.run.run_id for child in tree.children] == [forked.run_id]
    with pytest.raises(LookupError, match="retained snapshot 42"):
        await fork_run(client, run_id=origin.run_id, at=42)


async def test_a_malformed_fork_origin_is_refused_before_anything_is_recorded(
    recorder: RecorderProcess, client
) -> None:
    from steprec.proto import wire

    agent = echo_agent(recorder.endpoint, calls=0)
    with pytest.raises(ValueError, match="snapshot_index"):
        await agent.run("go", metadata={wire.FORKED_FROM_RUN_ID: "origin", wire.FORKED_FROM_SNAPSHOT: "one"},
                        conversation_id="conv-bad-fork")  # fmt: skip
    assert await client.list_runs(conversation_id="conv-bad-fork") == []


async def test_histories_are_validated_once_per_client_and_never_share_what_a_run_changes(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    from pydantic_ai.messages import ModelRequest, UserPromptPart
    from steprec.query import continue_run, fork_run

    agent = echo_agent(recorder.endpoint, calls=3)
    origin = await agent.run("go", conversation_id="conv-cached")
    fetched: list[int] = []  # how many messages each ReadMessages call asked for
    read_messages = client._read_messages

    async def counted(digests: list[bytes]) -> list[bytes]:
        fetched.append(len(digests))
        return await read_messages(digests)

    client._read_messages = counted  # type: ignore[method-assign]
    first = await fork_run(client, run_id=origin.run_id, at=1)
    second = await fork_run(client, run_id=origin.run_id, at=1)
    assert fetched == [5]  # the second read is answered from the client's cache
    assert isinstance(first[-1], ModelRequest) and len(first) == len(second) == 5
    assert all(a is not b for a, b in zip(first, second, strict=True))  # what they hold is shared
    recorded = ModelMessagesTypeAdapter.dump_json(second)

    # Changing a returned history the ways pydantic-ai supports (reassigning fields of a message, its parts
    # list among them) changes that history only.
    first[-1].run_id, first[0].metadata = "edited", {"edited": True}
    first[-1].parts = [*first[-1].parts, UserPromptPart("and more")]
    await agent.run(message_history=first, metadata=first.metadata, conversation_id="conv-cached-fork")
    assert ModelMessagesTypeAdapter.dump_json(await fork_run(client, run_id=origin.run_id, at=1)) == recorded
    async with RecorderClient(recorder.endpoint, message_cache_bytes=0) as uncached:
        assert ModelMessagesTypeAdapter.dump_json(await fork_run(uncached, run_id=origin.run_id, at=1)) == recorded
        assert ModelMessagesTypeAdapter.dump_json(await fork_run(uncached, run_id=origin.run_id, at=1)) == recorded

    # A history a run changed and then dropped is lent again only as it was recorded.
    del first, second
    changed = await fork_run(client, run_id=origin.run_id, at=1)
    changed[-1].parts = [*changed[-1].parts, UserPromptPart("and more")]
    await agent.run(message_history=changed, metadata=changed.metadata, conversation_id="conv-cached-fork")
    del changed
    assert ModelMessagesTypeAdapter.dump_json(await fork_run(client, run_id=origin.run_id, at=1)) == recorded

    # A later snapshot of the run needs only the messages it added or changed: the three after snapshot 1,
    # and its last request, which pydantic-ai stamped with the run's ids when it sent it.
    latest = await continue_run(client, run_id=origin.run_id)
    assert len(latest) == 8 and fetched == [5, 4]
    assert ModelMessagesTypeAdapter.dump_json(latest) == ModelMessagesTypeAdapter.dump_json(origin.all_messages())
