"""One real path: an agent in this process, `steprec serve` in another, reads back over gRPC."""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolReturnPart
from pydantic_ai.models.function import FunctionModel
from steprec.exporter import StepRecorder
from steprec.query import RecorderClient, continue_run, fork_run
from steprec.recorder.daemon.process import RecorderProcess

from . import resume_agent
from .agents import calls_tool_then_answers, echo_agent, tool_returns


async def test_recorded_run_reads_back_and_continues(recorder: RecorderProcess, client: RecorderClient) -> None:
    agent = echo_agent(recorder.endpoint, calls=3)
    result = await agent.run("go", conversation_id="conv-e2e")

    runs = await client.list_runs(conversation_id="conv-e2e")
    assert [r.run_id for r in runs] == [result.run_id]
    run = await client.get_run(result.run_id)
    assert run is not None and run.outcome == "completed" and run.agent_name == "echoer"
    assert run.conversation_id == "conv-e2e" and run.ended_at >= run.started_at

    kinds = [e.kind for e in await client.list_events(result.run_id)]
    assert kinds[0] == "run_started" and kinds[-1] == "run_completed"
    assert kinds.count("tool_call_started") == kinds.count("tool_call_completed") == 3
    assert kinds.count("model_request_started") == kinds.count("model_request_completed") == 4

    snapshot = await client.latest_snapshot(result.run_id)
    assert snapshot is not None and snapshot.state == "complete"
    # Byte-identical round trip of the whole history through delta encoding and DuckDB.
    assert ModelMessagesTypeAdapter.dump_json(snapshot.messages) == ModelMessagesTypeAdapter.dump_json(
        result.all_messages()
    )
    assert await client.list_unresolved_tool_effects(result.run_id) == []
    effects = await client.list_tool_effects(result.run_id)
    assert [e.status for e in effects] == ["completed"] * 3

    history = await continue_run(client, run_id=result.run_id)
    follow_up = await agent.run("once more", message_history=history, conversation_id="conv-e2e")
    assert follow_up.all_messages()[: len(history)] == history
    assert len(await client.list_runs(conversation_id="conv-e2e")) == 2


async def test_delegate_run_points_at_its_orchestrator(recorder: RecorderProcess, client: RecorderClient) -> None:
    delegate_agent = echo_agent(recorder.endpoint, calls=1)
    orchestrator = Agent(
        calls_tool_then_answers(1, tool="delegate"),
        name="orchestrator",
        capabilities=[StepRecorder(endpoint=recorder.endpoint, agent_name="orchestrator")],
    )

    @orchestrator.tool_plain
    async def delegate(text: str) -> str:
        return (await delegate_agent.run(text)).output

    await orchestrator.run("start", conversation_id="conv-tree")
    (parent,) = await client.list_runs(conversation_id="conv-tree")
    assert parent.run_id.startswith("sp-")
    (child,) = await client.list_runs(parent_run_id=parent.run_id)
    assert child.agent_name == "echoer" and child.outcome == "completed"


async def test_failed_run_keeps_its_settled_history(recorder: RecorderProcess, client: RecorderClient) -> None:
    def fail_after_one_tool(messages, info):
        if tool_returns(messages):
            raise ConnectionError("provider down")
        return calls_tool_then_answers(1).function(messages, info)

    agent = Agent(FunctionModel(fail_after_one_tool), capabilities=[StepRecorder(endpoint=recorder.endpoint)])

    @agent.tool_plain
    def echo(text: str) -> str:
        return text

    with pytest.raises(ConnectionError):
        await agent.run("go", conversation_id="conv-fail")
    (run,) = await client.list_runs(conversation_id="conv-fail")
    assert run.outcome == "failed"
    events = await client.list_events(run.run_id)
    assert events[-1].kind == "run_failed" and "provider down" in events[-1].error
    history = await fork_run(client, run_id=run.run_id)
    assert any(isinstance(p, ToolReturnPart) for m in history for p in getattr(m, "parts", []))


async def test_reading_an_unknown_run(client: RecorderClient) -> None:
    assert await client.get_run("never-recorded") is None
    assert await client.latest_snapshot("never-recorded") is None
    with pytest.raises(LookupError):
        await continue_run(client, run_id="never-recorded")
    with pytest.raises(ValueError, match="run_id"):
        await client.list_events("../etc/passwd")


async def test_a_new_process_continues_one_run_and_forks_another_from_an_earlier_snapshot(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    first = await echo_agent(recorder.endpoint, calls=3).run("go", conversation_id="conv-resume")
    second = await echo_agent(recorder.endpoint, calls=2).run("go", conversation_id="conv-other")
    continued, forked = await asyncio.gather(
        asyncio.to_thread(resume_agent.spawn, "continue", recorder.endpoint, first.run_id),
        asyncio.to_thread(resume_agent.spawn, "fork", recorder.endpoint, second.run_id, 1),
    )
    # Continuing picks up the whole history: three answered calls, then one more.
    assert continued["history"] == len(first.all_messages()) and continued["output"] == "saw 4 returns"
    # The fork starts from snapshot 1 (after two tool cycles: five messages), not the newest one.
    assert forked["history"] == 5 and forked["output"] == "saw 3 returns"

    resumed = await client.get_run(continued["run_id"])
    assert resumed.conversation_id == "conv-resume" and resumed.forked_from_run_id is None
    assert resumed.outcome == "completed"
    branch = await client.get_run(forked["run_id"])
    assert (branch.forked_from_run_id, branch.forked_from_snapshot_index) == (second.run_id, 1)
    assert branch.outcome == "completed"
    tree = await client.run_tree(second.run_id)
    assert [child.run.run_id for child in tree.children] == [forked["run_id"]]
    assert [run.run_id for run in await client.list_runs(forked_from_run_id=second.run_id)] == [forked["run_id"]]
    # The continued run's snapshots extend the recorded history message for message.
    newest = await client.latest_snapshot(continued["run_id"])
    assert len(newest.messages) > len(first.all_messages())
    assert [m.kind for m in newest.messages[: len(first.all_messages())]] == [m.kind for m in first.all_messages()]


@runtime_checkable
class TranscriptHandleProvider(Protocol):
    """pydantic-ai-harness's compaction protocol (compaction/_receipts.py), which StepRecorder meets structurally."""

    def compaction_transcript_handle(self) -> str | None: ...


async def test_the_compaction_handle_is_the_run_id_the_recorder_stores(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    recorder_capability = StepRecorder(endpoint=recorder.endpoint, agent_name="compactor")
    assert isinstance(recorder_capability, TranscriptHandleProvider)
    assert recorder_capability.compaction_transcript_handle() is None  # not materialised by for_run yet
    agent = Agent(calls_tool_then_answers(1, tool="receipt"), capabilities=[recorder_capability])
    handles: list[str | None] = []

    @agent.tool
    def receipt(ctx: RunContext[None], text: str) -> str:
        # What a compaction strategy does: ask the run's capabilities for a handle.
        handles.extend(c.compaction_transcript_handle() for c in ctx.capabilities.values()
                       if isinstance(c, TranscriptHandleProvider))  # fmt: skip
        return text

    await agent.run("go", conversation_id="conv-handle")
    (run,) = await client.list_runs(conversation_id="conv-handle")
    assert handles == [run.run_id] and run.run_id.startswith("sp-")
    assert await client.list_snapshots(handles[0])
