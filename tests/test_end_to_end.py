"""One real path: an agent in this process, `steprec serve` in another, reads back over gRPC."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolReturnPart
from pydantic_ai.models.function import FunctionModel
from steprec.exporter import StepRecorder
from steprec.query import RecorderClient, continue_run, fork_run
from steprec.recorder.process import RecorderProcess

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
