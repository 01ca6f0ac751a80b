"""`steprec prune`: whole runs go, unreferenced messages go, everything else stays readable."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessagesTypeAdapter
from steprec.exporter import StepRecorder
from steprec.query import RecorderClient, continue_run
from steprec.recorder.daemon.process import RecorderProcess

from .agents import calls_tool_then_answers, echo_agent

STEPREC = str(Path(sys.executable).parent / "steprec")


def _prune(endpoint: str, *args: str) -> dict:
    result = subprocess.run([STEPREC, "prune", "--endpoint", endpoint, "--json", *args],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def test_prune_by_conversation_removes_runs_and_unreferenced_messages(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    await echo_agent(recorder.endpoint, calls=2, padding=500).run("old", conversation_id="conv-old")
    kept = await echo_agent(recorder.endpoint, calls=1).run("new", conversation_id="conv-new")

    preview = _prune(recorder.endpoint, "--conversation", "conv-old", "--dry-run")
    assert preview["runs"] == 1 and preview["snapshots"] >= 2 and preview["messages"] >= 4
    assert len(await client.list_runs(conversation_id="conv-old")) == 1  # a dry run removes nothing

    removed = _prune(recorder.endpoint, "--conversation", "conv-old")
    assert {k: removed[k] for k in ("runs", "events", "messages")} == {
        k: preview[k] for k in ("runs", "events", "messages")
    }
    assert await client.list_runs(conversation_id="conv-old") == []
    history = await continue_run(client, run_id=kept.run_id)
    assert ModelMessagesTypeAdapter.dump_json(history) == ModelMessagesTypeAdapter.dump_json(kept.all_messages())
    assert _prune(recorder.endpoint, "--older-than", "1d")["runs"] == 0


async def test_a_live_run_recovers_when_its_messages_were_pruned(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    pruned = threading.Event()
    agent = Agent(calls_tool_then_answers(6, tool="wait"), capabilities=[StepRecorder(endpoint=recorder.endpoint)])

    @agent.tool_plain
    def wait(text: str) -> str:
        if text == "call 3":  # halfway: hold the run here until the prune is done
            assert pruned.wait(timeout=30)
        return text

    running = asyncio.create_task(agent.run("go", conversation_id="conv-live"))
    await asyncio.sleep(0.3)
    await asyncio.to_thread(_prune, recorder.endpoint, "--conversation", "conv-live")
    pruned.set()
    result = await running
    # Its next snapshot referred to messages the store no longer had; it was refused, and the
    # exporter sent it whole instead, so the run still ends with a complete resume point.
    snapshot = await client.latest_snapshot(result.run_id)
    assert ModelMessagesTypeAdapter.dump_json(snapshot.messages) == ModelMessagesTypeAdapter.dump_json(
        result.all_messages()
    )


def test_prune_refuses_to_remove_everything(recorder: RecorderProcess) -> None:
    result = subprocess.run([STEPREC, "prune", "--endpoint", recorder.endpoint], capture_output=True, text=True)
    assert result.returncode == 2 and "--older-than and/or --conversation" in result.stderr
