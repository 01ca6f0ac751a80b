"""Real processes killed with SIGKILL: what the recorder holds afterwards, and resuming from it."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

from pydantic_ai.messages import ModelResponse, ToolReturnPart
from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderClient
from steprec.recorder.process import RecorderProcess

from .agents import echo_agent
from .crash_agent import spawn


async def test_killed_right_after_a_tool_returned(recorder: RecorderProcess, client: RecorderClient) -> None:
    crashed = spawn("after_tool_return", recorder.endpoint, "conv-kill-after")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    (run,) = await client.list_runs(conversation_id="conv-kill-after")
    assert run.outcome == "running"  # it never got to say otherwise
    snapshot = await client.latest_snapshot(run.run_id)
    returns = [p for m in snapshot.messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
    assert snapshot.state == "complete" and [p.tool_call_id for p in returns] == ["c0", "c1"]
    assert await client.list_unresolved_tool_effects(run.run_id) == []

    # A new process resumes from that point: no charge is repeated, one more is made.
    resumed = spawn("continue", recorder.endpoint, "conv-kill-after")
    assert resumed.returncode == 0 and "charged 3 times" in resumed.stdout, resumed.stderr
    runs = await client.list_runs(conversation_id="conv-kill-after")
    assert [r.outcome for r in runs] == ["running", "completed"]
    effects = await client.list_tool_effects(runs[1].run_id)
    assert [e.tool_call_id for e in effects] == ["c2"]


async def test_killed_inside_a_tool(recorder: RecorderProcess, client: RecorderClient) -> None:
    crashed = spawn("inside_tool", recorder.endpoint, "conv-kill-inside")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    (run,) = await client.list_runs(conversation_id="conv-kill-inside")
    events = await client.list_events(run.run_id)
    assert events[-1].kind == "tool_call_started" and events[-1].tool_call_id == "c1"
    (unresolved,) = await client.list_unresolved_tool_effects(run.run_id)
    assert (unresolved.tool_call_id, unresolved.tool_name, unresolved.status) == ("c1", "charge", "started")
    # capture_frontier saved the proposed call before it ran: an interrupted rescue point.
    frontier = await client.latest_snapshot(run.run_id, include_interrupted=True)
    assert frontier.state == "interrupted"
    last_response = [m for m in frontier.messages if isinstance(m, ModelResponse)][-1]
    assert last_response.parts[0].tool_call_id == "c1" and last_response.parts[0].args == {"cents": 200}
    settled = await client.latest_snapshot(run.run_id)
    assert settled.state == "complete" and len(settled.messages) < len(frontier.messages)


async def test_recorder_killed_and_restarted_during_a_run(tmp_path: Path) -> None:
    recorders = [RecorderProcess(tmp_path / "recorder").start()]
    endpoint = recorders[0].endpoint
    try:
        agent = echo_agent(endpoint, calls=40, padding=2000, delay=0.02)
        run_task = asyncio.create_task(agent.run("go", conversation_id="conv-recorder-crash"))
        for _ in range(2):
            await asyncio.sleep(0.15)
            assert not run_task.done(), "the run must still be going when the recorder dies"
            recorders[-1].kill()  # SIGKILL: no drain, no clean shutdown
            await asyncio.sleep(0.2)
            recorders.append(RecorderProcess(tmp_path / "recorder", listen=endpoint).start())
        result = await run_task
        assert result.output == "saw 40 returns"
        shutdown_pipelines()  # drains whatever was spooled while the recorder was down
        async with RecorderClient(endpoint) as client:
            (run,) = await client.list_runs(conversation_id="conv-recorder-crash")
            events = await client.list_events(run.run_id)
            kinds = Counter(e.kind for e in events)
            assert kinds == {
                "run_started": 1, "run_completed": 1, "model_request_started": 41, "model_request_completed": 41,
                "tool_call_started": 40, "tool_call_completed": 40,
            }  # fmt: skip
            assert len({e.idempotency_key for e in events}) == len(events)  # each stored exactly once
            effects = await client.list_tool_effects(run.run_id)
            assert len(effects) == 40 and {e.status for e in effects} == {"completed"}
            snapshot = await client.latest_snapshot(run.run_id)
            assert len(snapshot.messages) == len(result.all_messages())
    finally:
        for recorder in recorders:
            recorder.kill()
