"""`steprec demo`: agent -> recorder -> query client -> resumed agent, with nothing running beforehand."""

from __future__ import annotations

import asyncio
import signal
import tempfile
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.query import RecorderClient, RunRecord, continue_run, fork_run

from .process import RecorderProcess

CONVERSATION = "demo-trip"


def _tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]


def _planner_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Plans a trip: weather, then a currency conversion, then asks the librarian, then answers."""
    done = len(_tool_returns(messages))
    plan = [
        ToolCallPart("weather", {"city": "Lisbon"}),
        ToolCallPart("convert", {"amount": 120, "currency": "EUR"}),
        ToolCallPart("ask_librarian", {"question": "best museum in Lisbon?"}),
    ]
    if done < len(plan):
        return ModelResponse(parts=[plan[done]])
    if isinstance(messages[-1], ModelRequest) and any(isinstance(p, UserPromptPart) for p in messages[-1].parts):
        return ModelResponse(parts=[TextPart("Pack sunglasses and comfortable shoes: it will be 21°C and sunny.")])
    facts = "; ".join(str(p.content) for p in _tool_returns(messages))
    return ModelResponse(parts=[TextPart(f"Trip plan: {facts}")])


def _librarian_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not _tool_returns(messages):
        return ModelResponse(parts=[ToolCallPart("search_catalogue", {"topic": "Lisbon museums"})])
    return ModelResponse(parts=[TextPart("The Gulbenkian Museum.")])


def _flaky_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Books a hotel, then the provider 'goes down' on the next request."""
    if not _tool_returns(messages):
        return ModelResponse(parts=[ToolCallPart("book_hotel", {"city": "Lisbon", "nights": 3})])
    raise ConnectionError("model provider unavailable (simulated)")


def _build_agents(endpoint: str) -> tuple[Agent, Agent, Agent]:
    librarian = Agent(FunctionModel(_librarian_model), name="librarian", capabilities=[StepRecorder(endpoint=endpoint)])

    @librarian.tool_plain
    def search_catalogue(topic: str) -> str:
        return f"3 catalogue entries about {topic}"

    planner = Agent(
        FunctionModel(_planner_model),
        name="planner",
        capabilities=[StepRecorder(endpoint=endpoint, agent_name="planner", metadata={"demo": "trip"})],
    )

    @planner.tool_plain
    def weather(city: str) -> str:
        return f"{city}: 21°C, sunny"

    @planner.tool_plain
    def convert(amount: float, currency: str) -> str:
        return f"{amount} {currency} = {amount * 1.08:.2f} USD"

    @planner.tool_plain
    async def ask_librarian(question: str) -> str:
        # A delegate run inside a tool: its parent_run_id is inferred as the planner's run.
        return (await librarian.run(question)).output

    booker = Agent(FunctionModel(_flaky_model), name="booker", capabilities=[StepRecorder(endpoint=endpoint)])

    @booker.tool_plain
    def book_hotel(city: str, nights: int) -> str:
        return f"booked {nights} nights in {city}, confirmation H-4711"

    return planner, librarian, booker


async def _print_forest(client: RecorderClient) -> list[RunRecord]:
    """Every run tree the recorder holds (delegates and forks under their origin); returns all runs."""
    runs = await client.list_runs()
    for root in (r for r in runs if r.parent_run_id is None and r.forked_from_run_id is None):
        tree = await client.run_tree(root.run_id)
        for depth, run in tree.walk():
            fork = f"  (fork of its snapshot {run.forked_from_snapshot_index})" if run.forked_from_run_id else ""
            print(f"{'    ' * depth}{'└── ' if depth else ''}{run.agent_name}  {run.run_id}  [{run.outcome}]{fork}")
    return runs


async def _summary(client: RecorderClient, run: RunRecord) -> str:
    events = await client.list_events(run.run_id)
    effects = await client.list_tool_effects(run.run_id)
    snapshot = await client.latest_snapshot(run.run_id, include_interrupted=True)
    tools = ", ".join(f"{e.tool_name}={e.status}" for e in effects) or "none"
    duration = (run.ended_at - run.started_at).total_seconds() * 1000 if run.ended_at else float("nan")
    snap = f"{snapshot.state} snapshot of {len(snapshot.messages)} messages" if snapshot else "no snapshot"
    error = next((e.error for e in events if e.kind == "run_failed"), None)
    line = (
        f"  {run.agent_name:<10} {run.outcome:<9} {duration:7.1f} ms  {len(events):2d} events  tools: {tools}  {snap}"
    )
    return line + (f"\n             error: {error}" if error else "")


async def run_demo(data_dir: Path | None, *, keep_serving: bool = False) -> int:
    """Record and read back the demo agents; with `keep_serving`, leave the recorder and its browser up on the
    demo's data until Ctrl-C (or SIGTERM)."""
    with tempfile.TemporaryDirectory(prefix="steprec-demo-") as scratch:
        folder = data_dir or Path(scratch)
        with RecorderProcess(folder, ui_listen=DEMO_UI_LISTEN if keep_serving else "off") as recorder:
            print(f"recorder: steprec serve on {recorder.endpoint}, DuckDB file in {folder}")
            await record_demo_runs(recorder.endpoint)
            shutdown_pipelines()
            if keep_serving:
                await _serve_until_stopped(recorder)
        print("recorder stopped cleanly; done.")
    return 0


DEMO_UI_LISTEN = "127.0.0.1:0"
"""A free port: the demo must start even where a recorder already holds the default one."""


async def _serve_until_stopped(recorder: RecorderProcess) -> None:
    print(f"\nbrowse the demo's runs at {recorder.ui_url}")
    print(f"or query them: steprec runs --endpoint {recorder.endpoint}")
    print("(Ctrl-C stops the recorder)", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()


async def record_demo_runs(endpoint: str) -> None:
    planner, _, booker = _build_agents(endpoint)

    print("\n1. recording: planner (3 tool calls, one delegating to the librarian sub-agent)")
    result = await planner.run("Plan a weekend in Lisbon", conversation_id=CONVERSATION)
    print(f"   planner said: {result.output}")
    print("2. recording: booker, whose model provider fails after one tool call")
    try:
        await booker.run("Book a hotel in Lisbon", conversation_id="demo-booking")
    except ConnectionError as error:
        print(f"   booker failed as planned: {error}")

    async with RecorderClient(endpoint) as client:
        print("\n3. read back over gRPC - run trees:")
        runs = await _print_forest(client)
        print("\n   per run:")
        for run in runs:
            print(await _summary(client, run))

        planner_run = (await client.list_runs(conversation_id=CONVERSATION))[-1]
        history = await continue_run(client, run_id=planner_run.run_id)
        print(f"\n4. continue_run({planner_run.run_id}) -> {len(history)} messages; asking a follow-up")
        follow_up = await planner.run("And what should I pack?", message_history=history, conversation_id=CONVERSATION)
        print(f"   planner (continued) said: {follow_up.output}")

        booker_run = (await client.list_runs(conversation_id="demo-booking"))[-1]
        unresolved = await client.list_unresolved_tool_effects(booker_run.run_id)
        forked = await fork_run(client, run_id=booker_run.run_id)
        print(
            f"5. fork_run({booker_run.run_id}) -> {len(forked)} messages "
            f"(the settled point after book_hotel; unresolved effects: {len(unresolved)})"
        )
        fork_agent = Agent(
            FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("Hotel H-4711 is booked; nothing to redo.")])),
            name="booker",
            capabilities=[StepRecorder(endpoint=endpoint)],
        )
        forked_result = await fork_agent.run(
            "Confirm the booking", message_history=forked, metadata=forked.metadata, conversation_id="demo-fork"
        )
        print(f"   forked booker said: {forked_result.output}")

        print("\n6. the recorder now holds these runs:")
        await _print_forest(client)
