"""The runs the browser tests look at, recorded for real: the demo's agents (a delegate, a failed run, a fork),
an agent that is shown an image and whose tool returns hostile HTML, and a biller killed inside a tool (an
unresolved effect)."""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass

from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.query import ConversationStore, ConversationSummary, RecorderClient, continue_run, fork_run
from steprec.recorder.daemon.demo import record_demo_runs

from .agents import tool_returns
from .crash_agent import eventually, spawn

TOKEN = "ui-secret-token"
HOSTILE = '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'


def png(width: int = 96, height: int = 64) -> bytes:
    """A real PNG, red, made here (no file needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _looker(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not tool_returns(messages):
        return ModelResponse(parts=[ToolCallPart("fetch_page", {"url": "https://example.test/"})])
    return ModelResponse(parts=[TextPart("The page tried to run a script; it is shown as text.")])


@dataclass(frozen=True)
class Recorded:
    planner: str
    librarian: str
    booker: str
    fork: str
    looker: str
    crashed: str
    refork: str


async def record(endpoint: str) -> Recorded:
    await record_demo_runs(endpoint)
    looker = Agent(FunctionModel(_looker), name="looker", capabilities=[StepRecorder(endpoint=endpoint)])

    @looker.tool_plain
    def fetch_page(url: str) -> str:
        return HOSTILE

    await looker.run(["What is in this picture?", BinaryContent(png(), media_type="image/png")],
                     conversation_id="conv-image")  # fmt: skip
    shutdown_pipelines()
    crashed = await asyncio.to_thread(spawn, "inside_tool", endpoint, "conv-crash")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    async with RecorderClient(endpoint) as client:

        async def unresolved() -> str | None:
            runs = await client.list_runs(conversation_id="conv-crash")
            effects = await client.list_unresolved_tool_effects(runs[0].run_id) if runs else []
            return runs[0].run_id if effects else None

        crashed_run = await eventually(unresolved)
        assert crashed_run, "the killed biller's unresolved effect did not arrive"
        runs = await client.list_runs()
        by_agent = {}
        for run in runs:
            by_agent.setdefault(run.agent_name, []).append(run)
        planner = next(r for r in by_agent["planner"] if r.conversation_id == "demo-trip")
        fork = next(r for r in runs if r.forked_from_run_id)
        # A fork of the fork, so the booker's tree has a level below its first one.
        again = await fork_run(client, run_id=fork.run_id)
        answer = FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("Still booked.")]))
        agent = Agent(answer, name="booker", capabilities=[StepRecorder(endpoint=endpoint)])
        await agent.run("Check again", message_history=again, metadata=again.metadata, conversation_id="demo-fork")
        shutdown_pipelines()
        refork = next(r for r in await client.list_runs(forked_from_run_id=fork.run_id))
        latest = by_agent["planner"][-1]
        async with ConversationStore(client) as heads:  # the head a multi-turn application keeps
            summary = ConversationSummary(id="demo-trip", workspace="/demo", title="Weekend in Lisbon",
                                          title_source="user", run_id=latest.run_id, outcome="completed")  # fmt: skip
            await heads.save(summary=summary, messages=await continue_run(client, run_id=latest.run_id))
    return Recorded(
        planner=planner.run_id,
        librarian=by_agent["librarian"][0].run_id,
        booker=fork.forked_from_run_id,
        fork=fork.run_id,
        looker=by_agent["looker"][0].run_id,
        crashed=crashed_run,
        refork=refork.run_id,
    )


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self):
        return json.loads(self.body)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def fetch(url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None) -> Reply:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with _opener.open(request, timeout=30) as answer:
            return Reply(answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())
