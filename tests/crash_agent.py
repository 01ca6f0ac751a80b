"""An agent process for crash tests: `python -m tests.crash_agent MODE ENDPOINT CONVERSATION`.

MODE says where the process kills itself with SIGKILL, so no hook, finaliser
or atexit handler runs:
- `after_tool_return`: when the model is asked for the step after a tool returned;
- `inside_tool`: in the middle of the tool body;
- `continue`: no crash; continue the conversation's last run from its complete snapshot.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.query import RecorderClient, continue_run

from .agents import tool_returns

ROOT = Path(__file__).resolve().parent.parent


def spawn(mode: str, endpoint: str, conversation: str) -> subprocess.CompletedProcess[str]:
    """Run this agent in a new Python process and wait for it to finish or die."""
    command = [sys.executable, "-m", "tests.crash_agent", mode, endpoint, conversation]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def build(mode: str, endpoint: str) -> Agent:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = len(tool_returns(messages))
        if mode == "after_tool_return" and returned == 2:
            _die()
        if returned < 2 or (mode == "continue" and returned < 3):
            return ModelResponse(
                parts=[ToolCallPart("charge", {"cents": 100 * (returned + 1)}, tool_call_id=f"c{returned}")]
            )
        return ModelResponse(parts=[TextPart(f"charged {returned} times")])

    agent = Agent(
        FunctionModel(model),
        name="biller",
        capabilities=[StepRecorder(endpoint=endpoint, capture_frontier=mode == "inside_tool")],
    )

    @agent.tool_plain
    def charge(cents: int) -> str:
        if mode == "inside_tool" and cents == 200:
            _die()
        return f"charged {cents} cents"

    return agent


async def main(mode: str, endpoint: str, conversation: str) -> None:
    agent = build(mode, endpoint)
    history = None
    if mode == "continue":
        async with RecorderClient(endpoint) as client:
            run = (await client.list_runs(conversation_id=conversation))[-1]
            history = await continue_run(client, run_id=run.run_id)
    result = await agent.run("bill the customer", message_history=history, conversation_id=conversation)
    print(result.output, flush=True)
    shutdown_pipelines()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
