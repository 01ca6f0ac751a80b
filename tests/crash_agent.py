"""An agent process for crash and fault tests: `python -m tests.crash_agent MODE ENDPOINT CONVERSATION [OPTIONS]`.

The biller charges a customer three times (tool `charge`, calls `c0`, `c1`, `c2`) and then
answers "charged 3 times". It records with `capture_frontier=True`, so accepted requests and
proposed tool calls are saved before they run. MODE is one of:

- a kill point (`KILL_POINTS`): the process SIGKILLs itself there, so no hook, finaliser or
  atexit handler runs. Each point says where it lands;
- `restart`: run the biller from its prompt again, as a new run of the same conversation (what
  is left when a crash left no snapshot to continue from);
- `continue` / `continue_interrupted`: `continue_run` (with `include_interrupted=True` for the
  latter) on the conversation's newest run, then run the biller on that history with no new prompt,
  which executes pending tool calls first;
- `echo`: a load worker for `reliability.faults`: `tests.agents.echo_agent` with OPTIONS (a JSON
  object of its keyword arguments, `calls`, `padding`, `delay`, `journal_max_bytes`, ...).

Every mode that survives prints one JSON line: the run id, the output, the number of messages in
the run, and the journal requests the process dropped.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, CallToolsNode, ModelRequestNode, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits
from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.exporter._pipeline import _pipelines  # the drop count is only kept on the pipeline
from steprec.query import RecorderClient, continue_run

from .agents import echo_agent, tool_returns

ROOT = Path(__file__).resolve().parent.parent
CHARGES = 3
"""Tool calls the biller makes before answering; kill points sit in the second one (`c1`)."""


@dataclass(frozen=True)
class KillPoint:
    """Where the biller dies: in `hook` of the `Killer` capability (or the tool body, `charge`).

    `after_recorder` puts the Killer's hook after StepRecorder's same hook. pydantic-ai runs
    `before_*` hooks in capability order and `after_*` hooks in reverse, so that decides the
    Killer's place in the list. `node` and `returns` pick the moment: the node an `after_node_run`
    is for, and how many tool returns the run holds then (counting the pending request a
    `CallToolsNode` hands on).
    """

    name: str
    hook: str
    after_recorder: bool = True
    node: type | None = None
    returns: int | None = None
    lands: str = ""


KILL_POINTS = {
    point.name: point
    for point in [
        KillPoint(
            "after_run_start",
            "before_run",
            lands="StepRecorder.before_run returned: `run_started` is acknowledged, no model request was made.",
        ),
        KillPoint(
            "before_model_request",
            "before_model_request",
            returns=1,
            lands="the second model request (c0 settled) is accepted: StepRecorder saved its frontier "
            "and emitted `model_request_started` without waiting; the model was not called.",
        ),
        KillPoint(
            "after_model_request",
            "after_node_run",
            node=ModelRequestNode,
            returns=1,
            lands="the second model response (proposing c1) arrived and StepRecorder saved it as an "
            "interrupted frontier; no tool ran.",
        ),
        KillPoint(
            "inside_tool",
            "charge",
            returns=1,
            lands="in the body of tool call c1, after its `started` effect and `tool_call_started` were acknowledged.",
        ),
        KillPoint(
            "after_tool_body",
            "after_tool_execute",
            after_recorder=False,
            returns=1,
            lands="tool call c1 returned its value, before StepRecorder's after_tool_execute records it completed.",
        ),
        KillPoint(
            "after_tool_return",
            "after_node_run",
            node=CallToolsNode,
            returns=2,
            lands="StepRecorder saved the settled cycle with c1's return folded in; the next request was not accepted.",
        ),
        KillPoint(
            "during_after_run",
            "after_run",
            after_recorder=False,
            lands="the final answer is produced and snapshotted; StepRecorder's after_run (`run_completed`) "
            "has not run.",
        ),
    ]
}


@dataclass
class Started:
    """An agent process `start` began; `finish` waits for it."""

    process: subprocess.Popen[str]
    log: Path | None = None

    def finish(self, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Its exit code, stdout and stderr; on timeout it is killed (SIGKILL) and `TimeoutExpired` raised."""
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        if self.log is not None:
            stderr = self.log.read_text(errors="replace")
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, stdout, stderr)

    def kill(self) -> None:
        """SIGKILL it if it still runs, and reap it (cleanup for a scenario that failed half-way)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


def start(
    mode: str,
    endpoint: str,
    conversation: str,
    options: dict[str, Any] | None = None,
    *,
    log: Path | None = None,
    journal: Path | None = None,
) -> Started:
    """Start this agent in a new Python process.

    `log` takes its stderr: a pipe nobody reads until the end fills up when the recorder is down
    for long (a warning per attempt) and would stall the agent. `journal` is its journal folder.
    """
    command = [sys.executable, "-m", "tests.crash_agent", mode, endpoint, conversation, json.dumps(options or {})]
    env = {**os.environ, "STEPREC_JOURNAL_DIR": str(journal)} if journal is not None else None
    if log is None:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
    else:
        with open(log, "w") as stderr:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    return Started(process, log)


ADOPTION_SECONDS = 2.0
"""How soon a recorder adopting a dead agent's journal holds what it journaled (docs/delivery.md)."""


async def eventually(check, seconds: float = ADOPTION_SECONDS):
    """`await check()` until it returns something truthy, for at most `seconds`; its last value.

    What a killed agent journaled reaches the recorder by adoption, within `ADOPTION_SECONDS`."""
    deadline = time.monotonic() + seconds
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


def spawn(mode: str, endpoint: str, conversation: str, **options: Any) -> subprocess.CompletedProcess[str]:
    """Run this agent in a new Python process and wait for it to finish or die."""
    return start(mode, endpoint, conversation, options).finish()


def report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON line a surviving agent printed; a RuntimeError with its stderr if it did not survive."""
    if done.returncode != 0:
        raise RuntimeError(f"agent exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Killer(AbstractCapability[Any]):
    """SIGKILLs the process at its kill point; does nothing anywhere else (or with no point)."""

    point: KillPoint | None = None

    def strike(self, hook: str, messages: list[ModelMessage], node: object = None) -> None:
        point = self.point
        if (
            point is not None
            and point.hook == hook
            and (point.node is None or isinstance(node, point.node))
            and (point.returns is None or len(tool_returns(messages)) == point.returns)
        ):
            os.kill(os.getpid(), signal.SIGKILL)

    async def before_run(self, ctx: RunContext[Any]) -> None:
        self.strike("before_run", ctx.messages)

    async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
        self.strike("before_model_request", ctx.messages)
        return request_context

    async def after_node_run(self, ctx: RunContext[Any], *, node: Any, result: Any) -> Any:
        pending = [result.request] if isinstance(result, ModelRequestNode) else []
        self.strike("after_node_run", [*ctx.messages, *pending], node)
        return result

    async def after_tool_execute(
        self, ctx: RunContext[Any], *, call: Any, tool_def: Any, args: Any, result: Any
    ) -> Any:
        self.strike("after_tool_execute", ctx.messages)
        return result

    async def after_run(self, ctx: RunContext[Any], *, result: Any) -> Any:
        self.strike("after_run", ctx.messages)
        return result


def biller(endpoint: str, point: KillPoint | None = None) -> Agent:
    """The biller recording to `endpoint`, its Killer placed so the hook runs on the chosen side of StepRecorder's."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = len(tool_returns(messages))
        if returned < CHARGES:
            return ModelResponse(
                parts=[ToolCallPart("charge", {"cents": 100 * (returned + 1)}, tool_call_id=f"c{returned}")]
            )
        return ModelResponse(parts=[TextPart(f"charged {returned} times")])

    killer = Killer(point)
    recorder = StepRecorder(endpoint=endpoint, capture_frontier=True)
    # Listed first, the Killer's before_* hooks run before StepRecorder's and its after_* hooks after them.
    killer_first = point is not None and point.after_recorder == point.hook.startswith("after_")
    agent = Agent(
        FunctionModel(model), name="biller", capabilities=[killer, recorder] if killer_first else [recorder, killer]
    )

    @agent.tool
    def charge(ctx: RunContext[Any], cents: int) -> str:
        killer.strike("charge", ctx.messages)
        return f"charged {cents} cents"

    return agent


MODES = {*KILL_POINTS, "restart", "continue", "continue_interrupted", "echo"}


async def main(mode: str, endpoint: str, conversation: str, options: str = "{}") -> None:
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}; one of {', '.join(sorted(MODES))}")
    history, prompt = None, "bill the customer"
    agent = echo_agent(endpoint, **json.loads(options)) if mode == "echo" else biller(endpoint, KILL_POINTS.get(mode))
    if mode.startswith("continue"):
        async with RecorderClient(endpoint) as client:
            run = (await client.list_runs(conversation_id=conversation))[-1]
            history = await continue_run(client, run_id=run.run_id, include_interrupted=mode == "continue_interrupted")
        prompt = None  # pending tool calls run first; a new prompt would be refused on top of them
    # No request limit: a load worker makes as many steps as the scenario needs.
    limits = UsageLimits(request_limit=None)
    result = await agent.run(prompt, message_history=history, conversation_id=conversation, usage_limits=limits)
    dropped = sum(pipeline.dropped_requests for pipeline in _pipelines.values())
    shutdown_pipelines()
    line = {
        "run_id": result.run_id,
        "output": result.output,
        "messages": len(result.all_messages()),
        "dropped": dropped,
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
