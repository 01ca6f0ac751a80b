"""Small deterministic agents the tests record: FunctionModel, no network, no API key."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from steprec.exporter import StepRecorder


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]


def calls_tool_then_answers(calls: int, tool: str = "echo") -> FunctionModel:
    """A model that calls `tool` `calls` times (one per step), then answers with the returns it saw."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = len(tool_returns(messages))
        if done < calls:
            return ModelResponse(parts=[ToolCallPart(tool, {"text": f"call {done}"}, tool_call_id=f"call-{done}")])
        return ModelResponse(parts=[TextPart(f"saw {done} returns")])

    return FunctionModel(model)


def calls_tool_until(stop: Path, at_least: int, tool: str = "echo") -> FunctionModel:
    """A model that calls `tool` (one call per step) until the file `stop` exists, and at least
    `at_least` times: a run whose length a test decides from outside, while it watches it."""
    enough = calls_tool_then_answers(at_least, tool).function

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not stop.exists():
            done = len(tool_returns(messages))
            return ModelResponse(parts=[ToolCallPart(tool, {"text": f"call {done}"}, tool_call_id=f"call-{done}")])
        return enough(messages, info)

    return FunctionModel(model)


def echo_agent(
    endpoint: str, calls: int = 3, *, padding: int = 0, delay: float = 0, until: str | None = None, **recorder_options
) -> Agent:
    """An agent whose `echo` tool returns its input, plus `padding` characters to make records big,
    after `delay` seconds of pretend work. With `until` (a file path) it keeps calling until that file exists."""
    agent = Agent(
        calls_tool_until(Path(until), calls) if until else calls_tool_then_answers(calls),
        name="echoer",
        capabilities=[StepRecorder(endpoint=endpoint, **recorder_options)],
    )

    @agent.tool_plain
    def echo(text: str) -> str:
        time.sleep(delay)
        return f"echo: {text}" + "." * padding

    return agent
