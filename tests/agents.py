"""Small deterministic agents the tests record: FunctionModel, no network, no API key."""

from __future__ import annotations

import time

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


def echo_agent(endpoint: str, calls: int = 3, *, padding: int = 0, delay: float = 0, **recorder_options) -> Agent:
    """An agent whose `echo` tool returns its input, plus `padding` characters to make records big,
    after `delay` seconds of pretend work."""
    agent = Agent(
        calls_tool_then_answers(calls),
        name="echoer",
        capabilities=[StepRecorder(endpoint=endpoint, **recorder_options)],
    )

    @agent.tool_plain
    def echo(text: str) -> str:
        time.sleep(delay)
        return f"echo: {text}" + "." * padding

    return agent
