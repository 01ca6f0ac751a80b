"""A recorder SIGKILLed under an agent in this process, and restarted: every record stored once.

Agents killed at every recorded boundary, and recorders killed under agent processes, are the fault
matrix: tests/test_faults.py (reliability/faults.py, with tests/crash_agent.py's kill points).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from .agents import echo_agent


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
        shutdown_pipelines()  # drains whatever was journaled while the recorder was down
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
